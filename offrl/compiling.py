"""`--run.compile`: torch.compile for the training steps, with a fix for saved masks on the CPU.

Where a loss flows through a network whose weights need no gradient (an actor's loss through frozen critics:
TD3+BC, CQL, WSRL's SAC step), the backward needs each ReLU's mask but not the activation itself, and
AOTAutograd's partitioner saves the mask as a bool tensor, 1 byte a value. Inductor's CPU kernels (torch
2.13) store and load bool tensors through a scalar loop over 64 lanes in memory, ~10 ns a value: a 256x256
mask took ~670 us to store where the eager comparison takes ~35 us (one thread of a 2-core Xeon with AMX), and
the compiled step ran slower than eager: WSRL's bf16 update 130.6 ms compiled against 114.7 eager
(results/speed-bf16.md), TD3+BC's actor step ~4.3 ms against ~2.5 (a timing script). `compiled` and
`compile_module` register a joint-graph pass with Inductor that marks every comparison with a bool CPU result
`MUST_RECOMPUTE`: the partitioner then recomputes each mask in the backward from the activation it saves
instead (the same comparison, so the same gradients). With it, the same machine: WSRL's update 55.9 ms
compiled against 103.9 eager (results/speed-bf16.md), TD3+BC's actor step ~2.2 ms. Other devices' graphs are
left as they are.
"""

from __future__ import annotations

import torch
from torch import nn


def _comparisons() -> set:
    ops = set()
    for name in ("le", "lt", "ge", "gt", "eq", "ne"):
        packet = getattr(torch.ops.aten, name)
        ops.update(getattr(packet, overload) for overload in ("Scalar", "Tensor"))
    return ops


def _mask_pass():
    # torch._inductor is a ~2 s import: loaded when something is compiled, not with offrl
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
    from torch.utils.checkpoint import CheckpointPolicy

    class RecomputeCpuMasks(CustomGraphPass):
        """Mark bool CPU comparisons in a joint forward-backward graph for recomputation in the backward."""

        comparisons = _comparisons()

        def __call__(self, graph: torch.fx.Graph) -> None:
            for node in graph.nodes:
                value = node.meta.get("val")
                if (node.op == "call_function" and node.target in self.comparisons and isinstance(value, torch.Tensor)
                        and value.dtype == torch.bool and value.device.type == "cpu" and "recompute" not in node.meta):
                    node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE

        def uuid(self) -> bytes:  # Inductor's cache key: this file's contents
            return get_hash_for_files((__file__,))

    return RecomputeCpuMasks()


_PASS = None


def install_cpu_mask_pass() -> None:
    """Register the mask pass with Inductor's joint-graph passes (once; beside any pass already there)."""
    global _PASS
    import torch._inductor.config as inductor_config

    if _PASS is None:
        _PASS = _mask_pass()
    current = inductor_config.joint_custom_post_pass
    passes = list(current) if isinstance(current, (list, tuple)) else ([] if current is None else [current])
    if _PASS not in passes:
        inductor_config.joint_custom_post_pass = _PASS if not passes else (*passes, _PASS)


def compiled(fn, enabled: bool = True, **options):
    """torch.compile(fn, **options), with the CPU mask pass registered; `fn` itself when not `enabled`
    (`--run.compile` off)."""
    if not enabled:
        return fn
    install_cpu_mask_pass()
    return torch.compile(fn, **options)


def compile_module(module: nn.Module) -> None:
    """module.compile() (its calls compiled, state_dict keys unchanged), with the CPU mask pass registered."""
    install_cpu_mask_pass()
    module.compile()
