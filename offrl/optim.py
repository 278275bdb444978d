"""Optimizer helpers shared by the algorithms."""

from __future__ import annotations

import math

import torch


def cosine_decay(total_steps: int):
    """lr multiplier 0.5 * (1 + cos(pi * step / total)): CosineAnnealingLR to 0, in closed form, so one
    optimizer can decay one parameter group (the actor) and keep the others constant."""
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


def constant(step: int) -> float:
    return 1.0


def adam(groups: list[dict], device: torch.device) -> torch.optim.Adam:
    """Adam over parameter groups, fused where the device supports it (CPU's default path is slowest)."""
    return torch.optim.Adam(groups, fused=device.type in ("cpu", "cuda"))


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
