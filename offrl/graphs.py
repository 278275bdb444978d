"""A training step replayed as a CUDA graph (`--run.cuda-graph`, on by default on CUDA).

An offline update of 256-wide MLPs at batch 256 is a few hundred small kernels; on a GPU eager PyTorch
spends its time launching them, not running them. `GraphedStep(fn)` records `fn` once and from then on
replays the recording: one launch per step. It is the same arithmetic on the same tensors, so the
numbers are those of the eager step (up to the order of floating-point reductions some kernels choose).

What `fn` must be, so that a replay does what a call would:
- a function of tensors (a pytree: tuples, NamedTuples such as `Batch`, dicts) returning a pytree of
  tensors. Each call's inputs are copied into the recorded input tensors and the returned tensors are
  the recorded outputs, overwritten by the next replay (read or clone them before the next call);
- device work only: no host sync (`.item()`, printing a tensor, data-dependent shapes) and no Python
  state that changes from call to call. Learning-rate schedules step outside, on tensor learning
  rates (`GraphedStep(..., optimizers=...)` makes them tensors, `offrl.optim.graph_safe`); a step whose shape alternates (TD3's delayed
  actor) records one graph per variant (`key`);
- random numbers from torch's default CUDA generator are drawn afresh at every replay; a generator of
  one's own (the replay buffer's, TD3+BC's noise) is drawn outside, and its draws passed in.

The first `warmup` calls of each variant run eagerly on a side stream (lazy state such as Adam's moments,
cuBLAS handles and torch.compile's kernels come to exist there, as capture requires); the next call
records and then replays, so every call is exactly one real step. Parameters and optimizer states must keep their storage after
that (restoring a checkpoint copies into them; `Run.steps` restores before the first step).
On the CPU, or with `enabled=False`, a call is a plain call of `fn`.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import torch
from torch.utils import _pytree as pytree

from offrl.optim import graph_safe


class GraphedStep:
    def __init__(self, fn: Callable[..., Any], device: torch.device, enabled: bool = True, warmup: int = 3,
                 optimizers: Sequence[torch.optim.Optimizer] = ()):
        """`optimizers`: those `fn` steps; their learning rates become tensors before the first recording
        (offrl.optim.graph_safe), so that schedules stepped outside the graph reach it."""
        self.fn = fn
        self.enabled = enabled and device.type == "cuda"
        self.warmup = warmup
        self.optimizers = list(optimizers)
        self.device = device
        self._graphs: dict[Hashable, _Recording] = {}

    def __call__(self, *inputs: Any, key: Hashable = None) -> Any:
        if not self.enabled:
            return self.fn(*inputs)
        recording = self._graphs.get(key)
        if recording is None:
            graph_safe(*self.optimizers)
            recording = self._graphs[key] = _Recording(self.fn, self.warmup)
        with torch.cuda.device(self.device):  # streams and capture on the run's GPU (--device cuda:1)
            return recording(inputs)

    @property
    def recorded(self) -> int:
        """How many variants have been recorded (for tests and logs)."""
        return sum(r.graph is not None for r in self._graphs.values())


class _Recording:
    def __init__(self, fn: Callable[..., Any], warmup: int):
        self.fn, self.warmup, self.calls = fn, warmup, 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list | None = None
        self.static_output: Any = None

    def __call__(self, inputs: tuple) -> Any:
        # The warm-up calls run on the very input tensors the graph records: a torch.compile'd `fn` then
        # meets in capture the layouts its guards were built for, and does not recompile there (which a
        # capture cannot hold).
        leaves, spec = pytree.tree_flatten(inputs)
        if self.static_inputs is None:
            self.static_inputs = [leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        for static, leaf in zip(self.static_inputs, leaves):
            if isinstance(static, torch.Tensor):
                static.copy_(leaf)
        static_inputs = pytree.tree_unflatten(self.static_inputs, spec)
        if self.calls < self.warmup:
            self.calls += 1
            return _on_side_stream(self.fn, *static_inputs)
        if self.graph is None:
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_output = self.fn(*static_inputs)
        self.graph.replay()
        return self.static_output


def _on_side_stream(fn: Callable[..., Any], *inputs: Any) -> Any:
    """Warm-up calls run on a side stream, as CUDA graph capture asks (torch.cuda.graph's docs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    return out
