"""Config parts every algorithm shares. Each algorithm's `Config` subclasses `TrainConfig` and
adds its own hyperparameters; tyro turns the field docstrings into `--help`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

import torch


@dataclass
class DataConfig:
    """Where the dataset's evaluation env comes from and how the data is preprocessed."""

    env_id: Optional[str] = None
    """Evaluation env id (e.g. Hopper-v5); default: the one the dataset records. An env registered by another
    package is named 'module:EnvId' (e.g. gymnasium_robotics:AdroitHandDoor-v1): the module is imported first."""
    ref_min_score: Optional[float] = None
    """Reference return of a random policy (normalized score 0); overrides the dataset's. Needed for normalized
    scores on data that records none."""
    ref_max_score: Optional[float] = None
    """Reference return of an expert (normalized score 100); overrides the dataset's. Also DT's default target
    (given here, it wins over the DT paper's targets for D4RL-named files)."""
    d4rl_trajectories: bool = False
    """D4RL .hdf5 files: keep every row as recorded, episodes ending at terminals and timeouts (as the DT and RvS
    references read them), instead of qlearning_dataset's transitions, which drop each episode's final row.
    DT and RCSL turn it on."""
    download: bool = False
    """Fetch a Minari dataset that is not local (needs network and `minari[hf]`)."""
    make_if_missing: bool = True
    """Generate an offrl suite dataset (offrl/...) that is not on disk yet."""
    normalize_states: bool = False
    """Standardize observations with dataset mean/std (+ eps); the same transform is applied at evaluation."""
    state_norm_eps: float = 1e-3
    """Added to the std when normalizing states."""
    state_stats_with_next: bool = False
    """Compute the normalization statistics over observations and next_observations together (RIQL)."""
    normalize_reward: bool = False
    """IQL's return-range scaling: r <- r * 1000 / (max episode return - min episode return), over the episodes
    that ended (terminated or at the env's step limit), not pieces the data cut short (as CORL, whose
    "episodes" are 1000-row chunks of qlearning_dataset's rows: offrl.data.preprocess.return_range_factor)."""
    reward_scale: float = 1.0
    """Multiply rewards by this (after return-range scaling)."""
    reward_bias: float = 0.0
    """Add this to rewards (after scaling)."""
    clip_actions: bool = False
    """Clip dataset actions into the env's bounds, each side moved in by 1e-5 of the half-range (+-(1 - 1e-5)
    on a [-1, 1] box, as the official IQL; keeps atanh/log-probs finite)."""
    sampling: Literal["uniform", "return-weighted"] = "uniform"
    """Batch sampling: uniform over transitions, or return-weighted (Hong et al. 2023, 'Harnessing Mixed
    Offline RL Datasets via Trajectory Weighting'): P(transition) ~ exp(G_hat / temperature), G_hat its
    episode's return min-max scaled to [0, 1] by the episodes that ended (a piece the data cut short may fall
    below 0). It weights the dataset's transition buffer (`TrainingData.buffer`): every batch of BC, TD3+BC,
    IQL, RIQL, CQL and WSRL's retained rows, and the dataset rows of MOPO/MOBILE/RAVL's mixed batches (not their
    rollout starts); DT, RCSL and MBRCSL draw otherwise and refuse it."""
    return_temperature: float = 0.1
    """Temperature of return-weighted sampling (larger = closer to uniform)."""
    corrupt: Optional[Literal["observations", "actions", "rewards", "next_observations"]] = None
    """Corrupt this field of a fraction of the transitions (RIQL's protocol; see offrl/data/corruption.py)."""
    corruption_mode: Literal["random", "adversarial"] = "random"
    """Random noise, or a perturbation that minimizes a trained critic's Q (--data.attack-critic)."""
    corruption_rate: float = 0.3
    """Fraction c of transitions corrupted (each independently)."""
    corruption_range: float = 1.0
    """Scale epsilon of the corruption (in dataset stds for obs/actions/next obs)."""
    corruption_seed: Optional[int] = None
    """Seed that picks the corrupted rows and the noise (default: the run's seed)."""
    attack_critic: Optional[str] = None
    """Adversarial corruption: an offrl training checkpoint (iql, riql, cql, td3_bc, sac, mopo, mobile, ravl, wsrl)
    trained on the clean data."""
    attack_device: str = "cpu"
    """Where the adversarial attack's critic runs: 'cpu', 'cuda', 'cuda:1', 'auto' (cuda when available). The
    attack is float work, so another device can give other bytes: the run records the corrupted data's checksum
    and refuses a resume whose data differ. The default keeps the attack on the CPU whatever --device is, so a
    run can move between CPU and GPU; a run resumes with the attack device it started with."""


@dataclass
class EvalConfig:
    """When and how the policy is evaluated in the dataset's env (deterministic actions, normalized scores)."""

    every: int = 5000
    """Evaluate every this many steps (gradient steps; env steps for online algorithms) and always at the
    end; 0 = only at the end."""
    episodes: int = 10
    """Episodes per evaluation, run in parallel in one vector env."""
    seed_offset: int = 100
    """Evaluation episode i resets with seed + seed_offset + i (the offset 100 is TD3+BC's official code's, which
    seeds its eval env once with seed + 100 and resets it 10 times in turn). Every evaluation of a run uses the
    same start states, and neighbouring training seeds share all but one of them (seed 0: 100-109, seed 1:
    101-110): seeds' scores are not independent draws of start states, so a spread over seeds understates
    the start-state part of the variance."""


@dataclass
class LogConfig:
    """Where and how often metrics are written: the run folder's metrics.jsonl and wandb."""

    every: int = 1000
    """Gather and write training metrics every this many steps."""
    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode; offline runs sync later with `wandb sync`."""
    project: str = "offrl"
    """wandb project."""
    group: Optional[str] = None
    """wandb group (default: '<algo>-<dataset>')."""
    name: Optional[str] = None
    """Run name (default: '<seed>-<time>'); also the run folder's name."""
    progress: bool = True
    """Show a progress line with steps/s and the last evaluation score."""


@dataclass
class RunConfig:
    """The run folder, checkpoints and how the update runs (threads, device work, precision, compiling)."""

    out_dir: str = "runs"
    """Runs go to <out_dir>/<algo>/<dataset>/<name>/."""
    checkpoint_every: int = 50_000
    """Write checkpoints/last.pt every this many steps (and at the end)."""
    threads: int = 1
    """torch CPU threads; 0 = torch's default (one per core). One thread by default: on 2 cores, two torch
    processes with a thread per core each ran 3.1x slower each (39 steps/s together against 61 for one alone),
    two 1-thread ones 1.07x slower each (97.5 together; results/speed.md, "Runs sharing the CPU"). Use all
    cores by running seeds in parallel (`python -m benchmarks.sweep --jobs N`), or give a lone run
    `--run.threads N`."""
    compile: bool = False
    """Wrap the loss computation in torch.compile, in BC, TD3+BC, IQL, RIQL, CQL, DT and WSRL (the others
    warn and ignore it; compiling took 8-20 s on an H100's host, 15-37 s on a 2-core CPU; offrl/compiling.py).
    Pays on a GPU inside the CUDA graph and for LayerNorm-heavy critics (WSRL, CQL-10: WSRL compiles its critic
    modules, and CQL does on the CPU, rather than the loss): on one thread of a 2-core Xeon with AMX, bf16,
    WSRL's update 103.9 -> 55.9 ms (results/speed-bf16.md). Of the small fp32 MLP updates there, IQL's and
    TD3+BC's gained ~10% and CQL's a few percent (results/speed-vs-corl.md)."""
    cuda_graph: bool = True
    """On CUDA, replay the training step of BC, TD3+BC, IQL and CQL (and the --seeds paths of BC, TD3+BC and
    IQL), and the critic and actor steps of the soft actor-critic that SAC, WSRL and MOPO share (offrl/sac.py),
    as CUDA graphs after 3 eager warm-up steps (offrl/graphs.py): one launch per step instead of hundreds, the
    same arithmetic (results/speed-gpu.md). No effect on the CPU."""
    flush_denormal: bool = True
    """Inside each gradient step on the CPU, flush subnormal floats (|x| < 1.2e-38 in float32) to zero
    (`torch.set_flush_denormal`: x86's FTZ/DAZ modes, in the training thread; evaluation, data and world-model
    training outside the step compute as IEEE 754 says). Adam's moments of weights whose gradient stays zero
    (dead ReLU units) decay geometrically into the subnormal range after a few hundred steps, and x86 cores
    compute on subnormals through slow microcode: on a 2-core Xeon with AMX, RCSL's training loop (1024x1024
    MLP) took 18.1 ms a step without it and 13.2 ms with it, against 12-13 ms for its update timed over its
    first steps (results/speed.md, parts "end-to-end-xeon-amx*"; results/README.md says how TD3+BC's and IQL's
    updates behaved). It changes only values below the normal range inside the step (float rounding, as the thread
    count does), so a resume may change it; runs made before the option existed trained without it."""
    retain_freed_memory: bool = True
    """Keep freed memory in the process for reuse (glibc's malloc, `offrl.nets.retain_freed_memory`: blocks up to
    32 MiB, up to 256 MiB of free heap top) instead of returning it to the OS, which hands it back as fresh pages
    that fault in one 4 KiB page at a time. DT's evaluation over 100 envs: a step 101-127 ms of CPU time and
    4,400-18,400 page faults without it, 88-92 ms and at most 150 faults with it (one thread of a 2-core Xeon with
    AVX-512). Process-wide and from the run's start on (an earlier run in the same process may have set it);
    no effect off glibc; arithmetic unchanged, so a resume may change it."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Gradient steps in float32, or under bfloat16 autocast: hidden-layer matmuls in bf16, output layers,
    weights and optimizer state in float32 (CQL and DT updates 2.3-2.8x faster on this project's AVX512-BF16
    CPU, results/speed-bf16.md; on an H100 only CQL gains, results/speed-gpu.md). Only the gradient step:
    MOPO/MOBILE/RAVL's model rollouts stay fp32 and the dynamics model trains as --model.precision says,
    while the model passes of MOBILE's Bellman penalty, inside its update, run under it (the model's error
    against the simulator moves by at most 1% for observations and 5.3% for rewards:
    results/model-error-hopper-mr-grid-*). Not bit-compatible
    with fp32, so a run cannot be resumed with the other precision."""


@dataclass
class RunConfigBase:
    """What every run has, offline or online."""

    steps: int = 1_000_000
    """Gradient steps (env steps for online algorithms)."""
    seed: int = 0
    """Seed for torch, sampling and evaluation."""
    device: str = "auto"
    """'auto' (cuda when available), 'cpu', 'cuda', 'cuda:1', ..."""
    resume: Optional[str] = None
    """Continue a run: its folder, a checkpoint file in it, 'latest' (newest run of this algo/dataset/seed; with
    --log.name, of that name), or 'auto' (latest if any, else start one)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def run_label(self) -> str:
        """What the run is trained on: the dataset, or the env for online algorithms."""
        return getattr(self, "dataset", None) or getattr(self, "env_id", "run")


@dataclass
class TrainConfig(RunConfigBase):
    """An offline run: a dataset and its preprocessing."""

    dataset: str = "offrl/tiny-v0"
    """Minari dataset id (e.g. offrl/hopper/medium-v0), D4RL .hdf5 file, or offrl .npz file."""
    seeds: Optional[tuple[int, ...]] = None
    """Train these seeds in one process as one batched model, each in its own run folder (offrl/multiseed.py;
    BC, TD3+BC and IQL so far); --seed beside it is refused (a saved run's seed under --config is left unused)."""
    data: DataConfig = field(default_factory=DataConfig)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(low: int):
    return lambda x: isinstance(x, int) and x >= low


# Ranges of algorithm options, by field name wherever a config has one (nested sections too: --rcsl.*,
# --behaviour.*, --model.*); None means "the default" or "off" and is not checked. Each of these values was
# accepted and then crashed mid-run (a division by zero, a shape error) or trained into nothing meaningful without
# a word (a negative learning rate is gradient ascent, tau 0 a target that never moves, a negative penalty a bonus).
OPTION_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "gamma": (lambda x: _finite(x) and 0 <= x <= 1, "a discount in [0, 1]"),
    "tau": (lambda x: _finite(x) and 0 < x <= 1, "a Polyak rate in (0, 1]"),
    "expectile": (lambda x: _finite(x) and 0 < x < 1, "in (0, 1)"),
    "quantile": (lambda x: _finite(x) and 0 <= x <= 1, "in [0, 1]"),
    "dropout": (lambda x: _finite(x) and 0 <= x < 1, "a probability in [0, 1)"),
    "actor_dropout": (lambda x: _finite(x) and 0 <= x < 1, "a probability in [0, 1)"),
    "holdout_ratio": (lambda x: _finite(x) and 0 < x < 1, "a fraction in (0, 1)"),
    "hidden": (lambda x: all(_count(1)(w) for w in x), "every width at least 1"),
    "widths": (lambda x: all(_count(1)(w) for w in x), "every width at least 1"),
    "time_dim": (lambda x: _count(4)(x) and x % 2 == 0, "even and at least 4 (a sinusoidal embedding)"),
    "hl_bins": (_count(2), "at least 2"),
    "num_samples": (_count(2), "at least 2 (a standard deviation over samples)"),
    "batch_size": (_count(1), "a batch holds at least one row"),
    **{name: (_count(1), "at least 1") for name in (
        "num_critics", "critic_subsample", "n_actions", "policy_freq", "buffer_size", "utd", "embed_dim",
        "max_timestep", "holdout_every", "patience", "rollout_every", "rollout_length", "retain_epochs",
        "rollout_batch", "horizon", "num_trajectories", "max_rollout_epochs", "diffusion_steps", "components")},
    **{name: (_count(0), "0 or more") for name in ("warmup_steps", "learning_starts", "actor_every", "bc_steps")},
    **{name: (lambda x: _finite(x) and x > 0, "must be > 0") for name in (
        "init_alpha", "temperature", "sigma", "rtg_scale", "hl_sigma_ratio", "exp_adv_max", "grad_clip")},
    **{name: (lambda x: _finite(x) and x >= 0, "finite and not negative") for name in (
        "alpha", "beta", "cql_alpha", "eta", "penalty_coef", "policy_noise", "noise_clip", "weight_decay")},
    "target_clip": (lambda x: len(x) == 2 and all(map(_finite, x)) and x[0] < x[1], "a low and a higher high"),
}
"""Field name -> (whether a value is in range, what the range is); names ending in `lr` are learning rates (> 0)."""


def option_range_problems(cfg, prefix: str = "") -> list[str]:
    """'--option value: range' for each algorithm option of `cfg` (a Config dataclass, walked into its sections
    but for data, eval, log and run, which `offrl.run.check_run_options` and the data loader check) that is out of
    its range in OPTION_RANGES."""
    problems = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            if not (prefix == "" and f.name in ("data", "eval", "log", "run")):
                problems += option_range_problems(value, f"{prefix}{f.name}.")
            continue
        learning_rate = (f.name == "lr" or f.name.endswith("_lr")) and not isinstance(value, bool)  # not --cosine-actor-lr
        rule = OPTION_RANGES.get(f.name) or ((lambda x: _finite(x) and x > 0, "a positive learning rate")
                                            if learning_rate else None)
        if rule is None or value is None or (isinstance(value, tuple) and f.name == "weight_decay"):
            continue  # --model.weight-decay (one per layer) is world_models.ensemble.check_config's
        try:
            ok = rule[0](value)
        except TypeError:  # a value of another type than the rule reads (e.g. a tuple where a number goes)
            ok = False
        if not ok:
            shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
            problems.append(f"--{prefix}{f.name.replace('_', '-')} {shown}: {rule[1]}")
    if prefix == "" and hasattr(cfg, "option_problems"):  # an algorithm's own rules across options
        problems += cfg.option_problems()
    return problems


def refuse_unused_options(unused: list[tuple[str, str]], remedy: str = "add the switch or drop the option") -> None:
    """Options given that change nothing in this run, each with why (e.g. ("--lagrange-init", "acts only with
    --lagrange")): refused before a run folder is made, as the run's record would list them as applied."""
    if unused:
        from offrl.errors import OffrlError

        raise OffrlError("; ".join(f"{option} {why}" for option, why in unused) + f": {remedy}")


def resolve_device(name: str) -> torch.device:
    from offrl.errors import OffrlError

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise OffrlError(f"--device {name}: not a device torch knows (auto, cpu, cuda, cuda:1, ...): {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise OffrlError(f"--device {name}: CUDA is not available on this machine")
    return device


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, values: dict, where: str = "config"):
    """The inverse of `to_dict` for a config that config.json or a checkpoint stored: nested configs
    are rebuilt, JSON lists become tuples, missing fields keep their defaults, and an unknown field
    is an error (the run was saved by a version of offrl whose config differs)."""
    from offrl.errors import OffrlError

    defaults = cls()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise OffrlError(f"{where}: unknown field(s) {', '.join(unknown)} for {cls.__module__}.{cls.__qualname__} "
                         f"(saved by another version of offrl?)")
    kwargs = {}
    annotations = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    for name, value in values.items():
        default = getattr(defaults, name)
        if not _fits(default, value, annotations[name]):  # e.g. {"steps": "abc"}: a traceback later, or none at all
            raise OffrlError(f"{where}.{name}: {value!r} is not a value of this option (its default: {default!r})")
        if dataclasses.is_dataclass(default):
            value = from_dict(type(default), value, f"{where}.{name}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def _fits(default, value, annotation: str) -> bool:
    """Whether a JSON value can stand for a field with this default and type annotation (a string, as the
    configs' `from __future__ import annotations` leaves it): a section is an object, a number a number (an int
    field an int), a string a string, a tuple a list; None only where the annotation allows it. A field whose
    default is None has no type to compare with here and takes any value."""
    if value is None:
        return default is None or "None" in annotation or "Optional" in annotation
    if default is None:
        return True
    if dataclasses.is_dataclass(default):
        return isinstance(value, dict)
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool) or ("float" in annotation and isinstance(value, float))
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, tuple):
        return isinstance(value, (list, tuple))
    return True
