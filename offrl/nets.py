"""Network building blocks.

Actors work in a normalized action space [-1, 1] internally and map to the env's bounds with
`action_scale` / `action_bias` buffers, so asymmetric Box bounds work too. Critic ensembles are one
`EnsembleLinear` stack (a [E, in, out] weight and one `baddbmm`; a 1-unit output layer on the CPU is a
multiply-and-sum), never a Python loop over members, with two exceptions on the CPU: an ensemble LayerNorm
makes one fused normalize-and-affine call per member (`EnsembleLayerNorm`), and a 1-unit output layer over
many member-rows one matrix-vector product per member (`_MemberColumn`).

On the CPU, products whose result is narrow ([M, n], n small) run far below the BLAS's peak, so the layers
keep such products out of the update: `Linear` stores an input layer's weight column-major, `EnsembleLinear`
computes a 1-unit output without a batched product, and hidden ReLUs run in place. `Linear` is
`nn.Linear` in values and checkpoints.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from functools import partial
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Sequential):
    """`nn.Sequential` whose last `head_layers` modules (the output layer and its activation) run in
    float32 when autocast is on (`--run.precision bf16`).

    The hidden layers then compute in bfloat16, where the time goes, while the outputs the losses read
    (Q-values, log-stds, action means, logits) keep float32 precision: a bfloat16 Q-value of 300 is only
    resolved to 2, coarser than a TD error. State-dict keys are those of `nn.Sequential`.

    On the CPU a batch of more rows than a block goes through the network in row blocks: the same matmuls,
    but each block's activations stay in cache for the elementwise work (bias, LayerNorm, activations, their
    gradients), which on large batches is memory-bound. A block holds the largest power of two of rows with
    at most `CPU_MEMBER_ROWS_PER_PASS` member-rows (members x rows; a plain MLP has one member), and at least
    `CPU_MIN_ROWS_PER_PASS` rows: 2048 rows for an actor, 1024 for twin critics, 256 for a 7-member dynamics
    ensemble and for 10 critics. Measured at one thread: on a 2-core Xeon a CQL update 8-10% faster than one
    pass and WSRL's update ~199 -> ~163 ms (then in 128-row blocks); on a 2-core AMD EPYC the 7-member
    ensemble's pass over 50k rows (a rollout step) 2.30 -> 1.20 s and a policy's 142 -> 82 ms, and 256-row
    rather than 128-row blocks for 10 critics, whose 256-row batches then pass whole, WSRL's update (bf16,
    compiled) 102.9 -> 99.4 ms and RAVL's 128.6 -> 122.4 ms (medians of 3 interleaved rounds). Rows are
    independent, so the outputs are those of one pass (weight gradients sum over the blocks: float
    rounding)."""

    CPU_MEMBER_ROWS_PER_PASS = 2048
    CPU_MIN_ROWS_PER_PASS = 256

    def __init__(self, *layers: nn.Module, head_layers: int = 1):
        super().__init__(*layers)
        self.head_start = len(layers) - head_layers
        sizes = [layer.ensemble_size for layer in layers if isinstance(layer, EnsembleLinear)]
        self.members = sizes[0] if sizes else 1

    @classmethod
    def rows_per_pass(cls, members: int) -> int:
        """Rows of a CPU block for `members` members evaluated together (never fewer than CPU_MIN_ROWS_PER_PASS)."""
        return max(cls.CPU_MIN_ROWS_PER_PASS, 1 << max(0, (cls.CPU_MEMBER_ROWS_PER_PASS // members).bit_length() - 1))

    def forward(self, x: torch.Tensor, members: slice | torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, in], or an ensemble's [E, B, in]. `members` (ensembles only): run only these members of
        every ensemble layer."""
        if members is None:
            count = self.members
        else:
            count = members.numel() if isinstance(members, torch.Tensor) else len(range(self.members)[members])
        rows = self.rows_per_pass(count)
        if x.device.type == "cpu" and x.dim() == 2 and x.shape[0] > rows:
            # the members' weights are gathered once for all blocks: gathered per block, every block's backward
            # scattered its gradient into a new zero tensor of the whole ensemble's weights
            layers = self.layers_for(members)
            return torch.cat([self.one_pass(block, members, layers) for block in x.split(rows)], dim=-2)
        return self.one_pass(x, members)

    def layers_for(self, members: slice | torch.Tensor | None) -> list:
        """The layers as callables on x, the ensemble layers restricted to `members`."""
        layers = list(self._modules.values())
        if members is None:
            return layers
        return [partial(layer, params=layer.member_params(members))
                if isinstance(layer, (EnsembleLinear, EnsembleLayerNorm)) else layer for layer in layers]

    def one_pass(self, x: torch.Tensor, members: slice | torch.Tensor | None = None,
                 layers: list | None = None) -> torch.Tensor:
        """The network on all of x at once (`layers`: `layers_for(members)`, when already made)."""
        layers = self.layers_for(members) if layers is None else layers
        for layer in layers[:self.head_start]:
            x = layer(x)
        if not torch.is_autocast_enabled(x.device.type):
            for layer in layers[self.head_start:]:
                x = layer(x)
            return x
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()
            for layer in layers[self.head_start:]:
                x = layer(x)
        return x


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""`--run.precision` names and the matmul dtype each stands for."""


def precision_dtype(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, not {precision!r}")
    return PRECISIONS[precision]


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo; None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(field)), None)
    except OSError:
        return None
    return line.split(":", 1)[1].strip() if line else None


def cpu_has_native_bf16() -> bool | None:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), from /proc/cpuinfo; None
    where that cannot be read. Without it, bf16 matmuls are emulated and far slower than float32 (a
    2048^3 matmul took 100 s against 0.5 s at one thread on an AVX2-only EPYC)."""
    flags = _cpuinfo("flags")
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16")) if flags else None


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo ('AMD EPYC 9R14 ...'); None where it cannot be read."""
    return _cpuinfo("model name")


@contextmanager
def seeded_cpu_init(seed: int):
    """Draw from the CPU generator seeded with `seed` (networks are initialized on the CPU, then moved), and leave
    every generator as it was. Not `torch.manual_seed`: it also reseeds CUDA's generators (lazily, if CUDA is not
    started yet), which `torch.random.fork_rng(devices=[])` does not restore, so a run on CUDA that built a network
    this way went on with CUDA draws seeded by `seed` (a dynamics model's, shared by every seed's run)."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))  # as torch.manual_seed, numpy integers too
        yield


def warn_if_emulated_bf16(precision: str, device: torch.device, option: str) -> None:
    """Print a warning when `option` asks for bf16 on a CPU that would emulate it (far slower than fp32)."""
    if precision == "bf16" and device.type == "cpu" and cpu_has_native_bf16() is False:
        print(f"warning: {option} bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX): "
              "bf16 matmuls are emulated and far slower than fp32 here", file=sys.stderr)


GLIBC_KEPT_BLOCK = 32 << 20
"""Freed blocks up to this size stay in the heap for reuse (glibc's M_MMAP_THRESHOLD; 32 MiB is the most its
own adaptive threshold reaches)."""
GLIBC_KEPT_TOP = 256 << 20
"""Free memory at the heap's top kept up to this size before it goes back to the OS (glibc's M_TRIM_THRESHOLD)."""


def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse rather than give it back to the OS: blocks up to
    `GLIBC_KEPT_BLOCK` come from the heap, and up to `GLIBC_KEPT_TOP` of free heap top is kept. Process-wide (a
    process's allocations after the call); True where it applied, False off glibc (macOS, musl: nothing changes).

    By default glibc maps a large block with mmap and unmaps it when freed, and trims the heap's free top above
    128 KiB (raising both limits only as blocks come and go). A CPU forward pass whose activations are freed
    every call then gets fresh pages every call, and the kernel faults in and zeroes each 4 KiB page: DT's
    evaluation step over 100 envs (12 MiB activations; eval mode frees them layer by layer) took 4,400-18,400
    minor page faults a step and 101-127 ms of CPU time, and 0-150 faults and 88-92 ms with this call
    (three interleaved rounds of 20 steps, one thread of a 2-core Xeon with AVX-512, the machine's other runs
    paused). Training steps, whose activations autograd keeps to the backward, faulted little either way. The
    cost: a process keeps up to GLIBC_KEPT_TOP of freed memory it would have returned. Arithmetic is unchanged."""
    import ctypes
    import platform

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    applied = [libc.mallopt(m_mmap_threshold, GLIBC_KEPT_BLOCK), libc.mallopt(m_trim_threshold, GLIBC_KEPT_TOP)]
    return all(applied)  # mallopt returns 1 on success


_flushing_subnormals = False  # torch offers no getter: the mode `subnormals` last set in this thread


@contextmanager
def subnormals(flush: bool):
    """Inside, this thread's CPU math treats subnormal floats (below float32's 1.2e-38, float64's 2.2e-308)
    as zero (`torch.set_flush_denormal`: x86's FTZ/DAZ modes), or computes them as IEEE 754 says; the mode
    before is restored after. Worker threads keep the mode they were started in (torch's intra-op pool starts
    with the first parallel operation), so with more than one thread the flushing is partial."""
    global _flushing_subnormals
    was = _flushing_subnormals
    if flush != was:
        torch.set_flush_denormal(flush)
        _flushing_subnormals = flush
    try:
        yield
    finally:
        if flush != was:
            torch.set_flush_denormal(was)
            _flushing_subnormals = was


def autocast(device: torch.device, precision: str):
    """The context `--run.precision` asks for: bfloat16 autocast (matmuls in bf16 with float32
    accumulation, float32 weights and optimizer state) or nothing ('fp32').

    Autocast's cast-weight cache is off on every device. It keeps a parameter's bf16 copy for the whole
    context, and one update's context holds several optimizer steps: a later forward pass read a network
    that requires gradients as it was before an earlier step (WSRL's UTD critic steps 2-4 the critics before
    step 1, IQL's actor and Q step V before its step, MOBILE's actor step the critics, RAVL's critic step the
    actor). WSRL's eager bf16 fine-tuning collapsed on it where fp32 held (tests/test_nets.py). A CUDA graph
    (offrl.graphs) cannot record a step that keeps casts across it either. Re-casting costs a pass over the
    weights per use, small beside the matmuls: with the cache and without, back to back at one thread of a
    2-core Xeon with AMX (benchmarks.speed, 2 rounds), IQL 8.57 and 8.61 ms an update, SAC 9.19 and 8.95, WSRL
    125.5 and 127.7."""
    dtype = precision_dtype(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32, cache_enabled=False)


@contextmanager
def gradient_step(device: torch.device, precision: str, flush_denormal: bool = True):
    """Context for one gradient step as runs take it (`Run.precision`, and benchmarks.speed's timings):
    `autocast` for `precision`, and subnormal floats flushed to zero unless `flush_denormal` is False."""
    with autocast(device, precision), subnormals(flush_denormal):
        yield


@torch.library.custom_op("offrl::random_words", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def _random_words(like: torch.Tensor, count: int) -> torch.Tensor:
    """`count` uniformly random int64 words on `like`'s device. On the CPU they come from numpy's PCG64 seeded with
    one draw of torch's generator, so torch's generator (which seeds a run and is saved in its checkpoints) still
    decides them and a resumed run draws the same words: torch's own `random_` runs its Mersenne Twister one word at
    a time, 3.7-3.8 ms for the 245,760 words of one of DT's dropout layers against 0.9 ms (one thread of a 2-core
    Xeon with AVX-512), and a DT update draws ten masks, seven of that size: its update took 294-305 ms eager and
    249-257 compiled, against 325-413 and 327-344 with torch's words (two interleaved rounds there, a drifting
    machine). Elsewhere torch's `random_`.

    An op of its own so that torch.compile keeps it whole: Dynamo cannot trace `random_` (DT's graph broke at each
    of its 10 dropouts), and Inductor's CPU random numbers (torch's dropout, in one graph) were slower. A compiled
    DT update, bf16, one thread of a 2-core Xeon with AMX (`python -m benchmarks.speed --algos dt --precision bf16
    --threads 1 --compile`, single runs, when Dropout drew 16 bits per element and the words came from torch's
    `random_`): 118.4 ms with Inductor's, 97.9-101.1 with this op (eager 110-121); fp32 169.3 (eager 198.2).
    `like` is the tensor the words will mask, whose values are not read: a graph's common-subexpression pass
    merged two calls of the same count into one (both layers then dropped the same units), which the argument
    keeps apart."""
    if like.device.type == "cpu":
        seed = int(torch.randint(2**62, (), dtype=torch.int64))
        return torch.from_numpy(np.random.PCG64(seed).random_raw(count).view(np.int64))
    return torch.empty(count, dtype=torch.int64, device=like.device).random_(-2**63, 2**63 - 1)


@_random_words.register_fake
def _(like: torch.Tensor, count: int) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64, device=like.device)


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper mask on the CPU.

    On the CPU, torch draws one random number per element for the mask (`bernoulli_`, the largest cost
    after the matmuls in a CPU profile of a DT update). Here each random 64-bit word gives two 32-bit
    draws: an element is dropped when its draw falls below round(p * 2^32), so the drop rate is p to within
    2^-33, and kept elements are scaled by 1 / (1 - that rate), which keeps the layer unbiased. (32-bit, not
    16-bit, draws: Inductor's CPU kernels compare int16 values in a scalar loop, and the LayerNorm-and-dropout
    kernels of a compiled bf16 DT update took 1.4-2.4 ms each with 16-bit draws, 0.8-0.9 ms with 32-bit ones in
    a kernel profile taken beside two other runs; with nothing else running, the whole update took 87.7-88.3 ms
    against 73.6-77.0 on one thread of a 2-core Xeon with AMX, results/speed-bf16.md part
    dt-xeon-32bit-dropout-compiled.)
    Other devices use torch's own dropout. (algos/dt.py writes its CPU attention out to use it on the attention
    weights, where scaled_dot_product_attention would draw torch's.)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or self.p >= 1 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        drops = round(self.p * 2**32)  # out of 2^32
        if drops == 2**32:  # p within 2^-33 of 1: everything dropped
            return super().forward(x)
        draws = _random_words(x.detach(), (x.numel() + 1) // 2)  # detached: no autograd wrapper around the op
        kept = draws.view(torch.int32)[:x.numel()].view(x.shape) >= drops - 2**31
        # mask, then scale: a bf16 mask * scale would round 1/0.9 to 1.109
        return (x * kept.to(x.dtype)) * (2**32 / (2**32 - drops))


NARROW = 16
"""`Linear` stores the weight of a layer with at most this many inputs column-major."""


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, shapes and state-dict keys) whose weight is stored column-major when
    the layer has at most `NARROW` inputs (an MLP's input layer).

    The CPU BLAS torch calls is slow on products whose result has few columns, and autograd computes a
    row-major weight's gradient as the [out, in] product g^T x: for an input layer with 11 inputs that
    took ~190 us where the same product laid out as [in, out] (x^T g) took ~36 us (one thread, 2-core
    Xeon, batch 256). A column-major weight gets its gradient in that layout. Values, initialization and
    checkpoints are those of nn.Linear; only the strides differ."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        if in_features <= NARROW < out_features:
            self.weight = nn.Parameter(self.weight.detach().t().contiguous().t())


def _activation(activation: type[nn.Module]) -> nn.Module:
    """A hidden layer's activation; ReLU in place, on the fresh output of the layer before it (whose
    backward does not read it), saving an activation-sized allocation and pass per layer."""
    return nn.ReLU(inplace=True) if activation is nn.ReLU else activation()


def mlp(in_dim: int, out_dim: int, hidden: Sequence[int] = (256, 256), activation: type[nn.Module] = nn.ReLU,
        layer_norm: bool = False, dropout: float = 0.0, output_activation: type[nn.Module] | None = None) -> MLP:
    layers: list[nn.Module] = []
    for width in hidden:
        layers.append(Linear(in_dim, width))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(_activation(activation))
        if dropout > 0:
            layers.append(Dropout(dropout))
        in_dim = width
    layers.append(Linear(in_dim, out_dim))
    if output_activation is not None:
        layers.append(output_activation())
    return MLP(*layers, head_layers=2 if output_activation is not None else 1)


class _MemberParams:
    weight: torch.Tensor
    bias: torch.Tensor

    def member_params(self, members: slice | torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of `members` (all of them for None), leading dim e."""
        return (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])


class _MemberColumn(torch.autograd.Function):
    """x [E, B, in] @ weight [E, in, 1] + bias [E, 1, 1] -> [E, B, 1] (an ensemble's one-column output layer)
    as one matrix-vector product per member, forward and for the weight's gradient; the input's gradient is
    an outer product. On one thread of a 2-core Xeon, [2, 1024, 256] rows: forward 60 us against 211 us for
    the multiply-and-sum, the weight's gradient 53 us against 211 us. The backward is made of differentiable
    ops (double backward works), and vmap (offrl.multiseed) uses the generated rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.mv(x[e], weight[e, :, 0]) for e in range(x.shape[0])]).unsqueeze(-1) + bias

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # a sum's gradient arrives expanded (stride 0), which BLAS cannot read
        grad_x = grad * weight.mT if ctx.needs_input_grad[0] else None
        grad_weight = (torch.stack([torch.mv(x[e].mT, grad[e, :, 0]) for e in range(x.shape[0])]).unsqueeze(-1)
                       if ctx.needs_input_grad[1] else None)
        grad_bias = grad.sum(1, keepdim=True) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class EnsembleLinear(_MemberParams, nn.Module):
    """E independent linear layers as one [E, in, out] weight: x [E, B, in] (or [B, in], shared) -> [E, B, out].
    `members` (a slice of the E, or an index tensor, repeats allowed) runs only those members: x [e, B, in] or
    [B, in] -> [e, B, out].

    Each member is initialized like `nn.Linear` (uniform in +-1/sqrt(in))."""

    CPU_MV_ABOVE_MEMBER_ROWS = 1024
    """A one-column layer on the CPU takes a matrix-vector product per member above this many member-rows
    (members x rows; _MemberColumn). One thread of a 2-core Xeon, forward and backward: 2 x 512 and 4 x 256
    even (~530 us), 7 x 256 1053 -> 702 us, 2 x 1024 1850 -> 858 us; 2 x 256 267 -> 370 us."""

    def __init__(self, ensemble_size: int, in_dim: int, out_dim: int):
        super().__init__()
        self.ensemble_size, self.in_dim, self.out_dim = ensemble_size, in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(ensemble_size, 1, out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, members: slice | torch.Tensor | None = None,
                params: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`params`: the members' (weight, bias) when already gathered (`member_params`)."""
        weight, bias = self.member_params(members) if params is None else params
        if self.out_dim == 1 and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            # A critic's output unit. On the CPU a batched product with a one-column result, and the two
            # in its backward, run far below the BLAS's peak (a [2, 256, 256] x [2, 256, 1] baddbmm took
            # ~160 us, a multiply-and-sum ~35 us); over more member-rows one matrix-vector product per member
            # is faster (_MemberColumn), below them its fixed cost is not repaid.
            if (x.dim() == 3 and x.shape[0] == weight.shape[0] and x.dtype == weight.dtype
                    and x.shape[0] * x.shape[1] > self.CPU_MV_ABOVE_MEMBER_ROWS and not torch.compiler.is_compiling()):
                return _MemberColumn.apply(x, weight, bias)
            return (x * weight.mT).sum(-1, keepdim=True) + bias  # Inductor fuses it into one reduction
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(weight.shape[0], -1, -1)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}, in_dim={self.in_dim}, out_dim={self.out_dim}"


class EnsembleLayerNorm(_MemberParams, nn.Module):
    """LayerNorm over the last dim with a separate affine transform per member."""

    CPU_MAX_MEMBER_CALLS = 16

    def __init__(self, ensemble_size: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ensemble_size, 1, dim))
        self.bias = nn.Parameter(torch.zeros(ensemble_size, 1, dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, members: slice | torch.Tensor | None = None,
                params: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """LayerNorm of x [e, B, D] (or [B, D], shared) with the members' affine weight and bias [e, 1, D]
        (`params`: those already gathered, `member_params`).

        On the CPU each member is one `F.layer_norm` call with its own affine, which the kernel applies in the
        same pass (and whose backward gives the affine's gradients in the same pass): the separate multiply
        and add, and the three passes of their backward, were memory-bound passes over the activations. It runs
        in float32 (under bf16 autocast the matmul's bf16 output is widened first: the kernel's bf16-input path
        sums the affine's gradients in bf16) and returns float32 as the formula did; the next layer casts. Other
        devices, and ensembles of more than `CPU_MAX_MEMBER_CALLS` members, keep one normalization for all
        members."""
        weight, bias = self.member_params(members) if params is None else params
        if x.device.type != "cpu" or len(weight) > self.CPU_MAX_MEMBER_CALLS:
            return F.layer_norm(x, x.shape[-1:], eps=self.eps) * weight + bias
        if not torch.compiler.is_compiling():  # compiled, the kernel is Inductor's, which computes in float32
            x = x.float()  # the eager kernel's bf16-input path sums the affine's gradients in bf16 (2-3% off)
        inputs = x.unbind(0) if x.dim() == 3 else [x] * len(weight)
        return torch.stack([F.layer_norm(member_x, member_x.shape[-1:], member_w[0], member_b[0], self.eps)
                            for member_x, member_w, member_b in zip(inputs, weight, bias, strict=True)])


class EnsembleMLP(nn.Module):
    """E MLPs evaluated together: [B, in] or [E, B, in] -> [E, B, out]. With `shared_output` the members share
    one output layer (WSRL's JAX code: its `ensemblize` wraps only the hidden layers)."""

    def __init__(self, ensemble_size: int, in_dim: int, out_dim: int, hidden: Sequence[int] = (256, 256),
                 activation: type[nn.Module] = nn.ReLU, layer_norm: bool = False, shared_output: bool = False):
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers.append(EnsembleLinear(ensemble_size, in_dim, width))
            if layer_norm:
                layers.append(EnsembleLayerNorm(ensemble_size, width))
            layers.append(_activation(activation))
            in_dim = width
        layers.append(Linear(in_dim, out_dim) if shared_output else EnsembleLinear(ensemble_size, in_dim, out_dim))
        self.net = MLP(*layers)
        self.ensemble_size = ensemble_size

    def forward(self, x: torch.Tensor, members: slice | torch.Tensor | None = None) -> torch.Tensor:
        return self.net(x, members)


def edac_critic_init(critic: nn.Module) -> None:
    """EDAC's critic initialization, which RIQL and RAVL keep (CORL's EDAC and both official codes): hidden
    biases 0.1, the output layer's weights and bias uniform in +-3e-3, and every hidden weight uniform in
    +-1/sqrt(out). The last is a quirk worth keeping: their `kaiming_uniform_(a=sqrt(5))` runs on each member's
    [in, out] weight slice, whose fan-in torch reads as `out`; for the first layer that is 1/16 where
    `nn.Linear`'s rule gives 1/sqrt(obs + act), 3-4x wider on the MuJoCo tasks."""
    layers = [m for m in critic.modules() if isinstance(m, EnsembleLinear)]
    if not isinstance([m for m in critic.modules() if isinstance(m, (EnsembleLinear, nn.Linear))][-1], EnsembleLinear):
        raise ValueError("edac_critic_init: this critic's members share their output layer; EDAC's init is for "
                         "separate heads")
    rlkit_layer_init(layers, 3e-3)


def rlkit_layer_init(layers: list[nn.Module], output_bound: float) -> None:
    """rlkit's initialization of an MLP's linear layers (`nn.Linear` or `EnsembleLinear`, in order), which the
    official CQL and EDAC codes use: hidden weights uniform in +-1/sqrt(out) (rlkit's `fanin_init` reads the
    fan-in from a weight's first dimension, an nn.Linear's output width), hidden biases 0.1, the output layer's
    weight and bias uniform in +-output_bound."""
    with torch.no_grad():
        for layer in layers[:-1]:
            bound = 1.0 / math.sqrt(layer.out_dim if isinstance(layer, EnsembleLinear) else layer.out_features)
            layer.weight.uniform_(-bound, bound)
            layer.bias.fill_(0.1)
        layers[-1].weight.uniform_(-output_bound, output_bound)
        layers[-1].bias.uniform_(-output_bound, output_bound)


class EnsembleCritic(nn.Module):
    """Q_1..Q_E(s, a) -> [E, B] (or [E, B, out_dim] for out_dim > 1, e.g. HL-Gauss logits);
    E = 2 gives TD3/SAC's twin critics in one batched module.

    On the CPU a batch of more rows than a block (CQL's 31 x 256 state-action pairs) goes through the network in
    row blocks sized to the ensemble (`MLP`)."""

    def __init__(self, obs_dim: int, act_dim: int, ensemble_size: int = 2, hidden: Sequence[int] = (256, 256),
                 layer_norm: bool = False, out_dim: int = 1, shared_output: bool = False):
        super().__init__()
        self.net = EnsembleMLP(ensemble_size, obs_dim + act_dim, out_dim, hidden, layer_norm=layer_norm,
                               shared_output=shared_output)
        self.ensemble_size, self.out_dim = ensemble_size, out_dim

    def forward(self, obs: torch.Tensor, action: torch.Tensor,
                members: slice | torch.Tensor | None = None) -> torch.Tensor:
        """`members`: evaluate only these members, [e, B] (TD3's actor loss reads Q_1 alone; a REDQ-style target
        the min of a random subset, offrl.losses.subsampled_critic_min)."""
        out = self.net(torch.cat([obs, action], dim=-1), members)
        return out.squeeze(-1) if self.out_dim == 1 else out


class ValueNetwork(nn.Module):
    """V(s) -> [B] (or [B, out_dim] for out_dim > 1)."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (256, 256), layer_norm: bool = False, out_dim: int = 1):
        super().__init__()
        self.net = mlp(obs_dim, out_dim, hidden, layer_norm=layer_norm)
        self.out_dim = out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(obs)
        return out.squeeze(-1) if self.out_dim == 1 else out


class _ActionScaling(nn.Module):
    def __init__(self, action_low: np.ndarray | Sequence[float], action_high: np.ndarray | Sequence[float]):
        super().__init__()
        low = torch.as_tensor(np.asarray(action_low, dtype=np.float32))
        high = torch.as_tensor(np.asarray(action_high, dtype=np.float32))
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError("actors need finite action bounds")
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def to_env(self, unit_action: torch.Tensor) -> torch.Tensor:
        return unit_action * self.action_scale + self.action_bias

    def to_unit(self, env_action: torch.Tensor) -> torch.Tensor:
        return (env_action - self.action_bias) / self.action_scale


class DeterministicActor(_ActionScaling):
    """a = scale * tanh(f(s)) + bias (TD3, TD3+BC, BC)."""

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden: Sequence[int] = (256, 256),
                 layer_norm: bool = False, dropout: float = 0.0):
        super().__init__(action_low, action_high)
        self.net = mlp(obs_dim, act_dim, hidden, layer_norm=layer_norm, dropout=dropout, output_activation=nn.Tanh)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.to_env(self.net(obs))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


class TanhGaussianActor(_ActionScaling):
    """SAC/CQL's policy: u ~ N(mu(s), sigma(s)), a = scale * tanh(u) + bias, with the tanh (and scale)
    change-of-variables in the log-probability. log sigma is clamped to [log_std_min, log_std_max]."""

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden: Sequence[int] = (256, 256),
                 layer_norm: bool = False, log_std_min: float = -5.0, log_std_max: float = 2.0):
        super().__init__(action_low, action_high)
        self.trunk = mlp(obs_dim, 2 * act_dim, hidden, layer_norm=layer_norm)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.trunk(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(self.log_std_min, self.log_std_max)

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized sample (or the mode) and its log-probability, shape [..., act_dim] and [...].
        `repeat`: `repeat` samples per state, rows [B * repeat] as `obs.repeat_interleave(repeat, 0)` would give
        them (CQL's sampled actions), from one pass of the network over the B states."""
        mean, log_std = self.distribution(obs)
        if repeat > 1:
            mean, log_std = mean.repeat_interleave(repeat, dim=0), log_std.repeat_interleave(repeat, dim=0)
        std = log_std.exp()
        u = mean if deterministic else mean + std * torch.randn_like(mean)
        log_prob = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|: CORL's CQL
        # (torch's TanhTransform) computes this too. rlkit (the official CQL), cleanrl, CORL's SAC-N/EDAC,
        # OfflineRL-Kit, MOBILE and RAVL use log(1 - tanh(u)^2 + 1e-6): the same to ~1e-3 per dimension for
        # |u| < 5, but capped at log(1e-6) = -13.8 beyond |u| ~ 7, where its gradient vanishes; the exact form keeps
        # pulling a saturated action back (a deviation from those only once actions saturate).
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        log_prob = log_prob - torch.log(self.action_scale).sum()
        return self.to_env(torch.tanh(u)), log_prob

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(a|s) of given env actions (clipped just inside the bounds)."""
        mean, log_std = self.distribution(obs)
        y = self.to_unit(action).clamp(-1.0 + eps, 1.0 - eps)
        u = torch.atanh(y)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return log_prob - torch.log(self.action_scale).sum()

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        mean, _ = self.distribution(obs)
        return self.to_env(torch.tanh(mean))


class GaussianActor(_ActionScaling):
    """IQL's policy: N(tanh(f(s)), exp(log_std)) in the unit action space, with a state-independent
    log-std clipped to [log_std_min, log_std_max]; not tanh-squashed. The mode is the action."""

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden: Sequence[int] = (256, 256),
                 dropout: float = 0.0, log_std_min: float = -5.0, log_std_max: float = 2.0):
        super().__init__(action_low, action_high)
        self.net = mlp(obs_dim, act_dim, hidden, dropout=dropout, output_activation=nn.Tanh)
        self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        mean = self.net(obs)
        log_std = self.log_std.clamp(self.log_std_min, self.log_std_max)
        u = self.to_unit(action)
        return (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.to_env(self.net(obs))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)


@contextmanager
def frozen(*modules: nn.Module):
    """The modules' parameters stop requiring gradients inside the block, so a loss that flows through them
    (an actor's loss through the critics) records no gradient for their weights. Eager autograd already skips
    those with `backward(inputs=...)`, but a torch.compile'd module's backward graph computes every gradient
    its forward was compiled for: WSRL's actor step spent about 40% of its time on the 10 critics' unused
    weight gradients (bf16, --run.compile, one CPU thread)."""
    params = [p for module in modules for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, as one fused op over all parameters."""
    with torch.no_grad():
        target_params = list(target.parameters())
        torch._foreach_lerp_(target_params, list(source.parameters()), tau)
