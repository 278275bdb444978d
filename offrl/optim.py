"""Optimizer helpers shared by the algorithms."""

from __future__ import annotations

import math

import torch
import torch.optim.optimizer as _optimizer_module


def cosine_decay(total_steps: int):
    """lr multiplier 0.5 * (1 + cos(pi * step / total)): CosineAnnealingLR to 0, in closed form, so one
    optimizer can decay one parameter group (the actor) and keep the others constant."""
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


def constant(step: int) -> float:
    return 1.0


class Adam(torch.optim.Adam):
    """`torch.optim.Adam` whose fused `step()` skips torch's per-call bookkeeping once its state exists.

    torch's `step()` re-collects each group's parameters, gradients and states, checks them and groups them
    by device and dtype on every call, inside a profiler range and hook loop: together ~85 us of Python
    per step for IQL's two groups of 12 tensors on one CPU thread, around ~155 us of kernels (2-core Xeon).
    Here each group's parameters and state dicts are listed once, after the step that creates the state,
    and a step is the two calls torch's fused path makes: `_foreach_add_` on the step counts and
    `_fused_adam_` (`_fused_adamw_` with decoupled weight decay) with the group's current hyperparameters
    (an LR scheduler's changes are read at each step). The result is torch's fused step exactly.
    Anything outside that path goes through torch's own `step()`: not fused, a closure, amsgrad, maximize,
    tensor betas, a missing gradient, a sparse one when the states are listed, a grad scaler (`grad_scale` or `found_inf` set), parameters
    of mixed device or dtype, step hooks, a running profiler (so its trace keeps the `Optimizer.step`
    range), tracing by torch.compile. On CUDA and XPU torch's check that a graph capture only records
    `capturable` groups still runs. Same constructor, state dict and checkpoints as torch.optim.Adam."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._plan = None

    def __setstate__(self, state: dict) -> None:
        # load_state_dict, copy.deepcopy and unpickling all come through here: the listed states are stale
        super().__setstate__(state)
        self._plan = None

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._plan = None

    def _make_plan(self):
        plan, accelerator = [], False
        for group in self.param_groups:
            params = group["params"]
            if (not group.get("fused") or any(isinstance(beta, torch.Tensor) for beta in group["betas"])
                    or any(not self.state.get(p) or p.is_sparse or p.grad is None or p.grad.is_sparse for p in params)
                    or len({(p.device, p.dtype) for p in params}) > 1):
                return None
            accelerator = accelerator or any(p.device.type in ("cuda", "xpu") for p in params)
            plan.append((group, params, [self.state[p] for p in params]))
        return plan, self.state, accelerator

    def _torch_step_and_plan(self, closure=None):
        torch_step = torch.optim.Adam.step
        if getattr(torch_step, "hooked", False):  # torch wrapped it when a torch.optim.Adam was made
            torch_step = torch_step.__wrapped__
        loss = torch_step(self, closure)
        if not torch.compiler.is_compiling():
            self._plan = self._make_plan()
        return loss

    # torch's wrapper (profiler range, step hooks) around its own step; the fast path below has neither
    _torch_step = torch.optim.Optimizer.profile_hook_step(_torch_step_and_plan)

    def step(self, closure=None):
        plan = self._plan
        if (closure is not None or plan is None or plan[1] is not self.state
                or getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None
                or self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                or _optimizer_module._global_optimizer_pre_hooks or _optimizer_module._global_optimizer_post_hooks
                or torch.autograd.profiler._is_profiler_enabled or torch.compiler.is_compiling()):
            return self._torch_step(closure)
        groups, _, accelerator = plan
        grads = []
        for group, params, _ in groups:
            group_grads = [p.grad for p in params]
            if (any(g is None for g in group_grads) or not group["fused"] or group["amsgrad"] or group["maximize"]
                    or group["differentiable"]):
                return self._torch_step()  # torch skips parameters without a gradient, and handles the rest
            grads.append(group_grads)
        if accelerator:
            self._accelerator_graph_capture_health_check()
        with torch.no_grad():
            for (group, params, states), group_grads in zip(groups, grads):
                if not params:
                    continue
                steps = [s["step"] for s in states]
                torch._foreach_add_(steps, 1)
                fused = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
                beta1, beta2 = group["betas"]
                fused(params, group_grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
                      steps, lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                      eps=group["eps"], amsgrad=False, maximize=False)
        return None

    step.hooked = True  # tells torch.optim.Optimizer not to wrap `step` in `profile_hook_step`


class AdamW(Adam):
    """`Adam` with decoupled weight decay, as `torch.optim.AdamW` (torch's AdamW is this subclass of its Adam):
    on a state dict without the flag (saved by a torch.optim.AdamW from before torch made it an Adam
    subclass) the decay stays decoupled, as torch's AdamW keeps it; and a group loaded unfused (saved by an
    optimizer made without `fused`) steps fused again when this one was made fused."""

    def __init__(self, *args, **kwargs):
        kwargs["decoupled_weight_decay"] = True
        super().__init__(*args, **kwargs)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
            if group.get("fused") is None and getattr(self, "defaults", {}).get("fused"):
                group["fused"] = True


def adam(groups: list[dict], device: torch.device) -> torch.optim.Adam:
    """Adam over parameter groups, fused where the device supports it (CPU's default path is slowest)."""
    return Adam(groups, fused=device.type in ("cpu", "cuda"))


def graph_safe(*optimizers: torch.optim.Optimizer) -> None:
    """Make optimizers recordable in a CUDA graph (offrl.graphs), in place: every group's learning rate
    a 0-dim tensor on its parameters' device, and CUDA groups `capturable`.

    A graph records a float learning rate as a constant; a tensor it reads at every replay, and LR
    schedulers fill tensor rates in place. Fused Adam reads either, and keeps its step count on the
    device either way; `capturable` is the flag torch checks before it lets a graph record `step()`."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            device = group["params"][0].device
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
            if device.type == "cuda":
                group["capturable"] = True
