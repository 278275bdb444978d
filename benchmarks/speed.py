"""Speed of one training update per algorithm, as a fraction of the machine's matmul throughput.

For each algorithm: build its agent with the default config on synthetic Hopper-sized data
(obs 11, act 3, 100k rows), warm up, then time blocks of (sample + update) and report the median
ms per update, the update's FLOPs (counted by torch's FlopCounterMode: matmuls forward and
backward), its GFLOP/s, and the ratio to the float32 matmul GFLOP/s measured in the same run
(2048 x 2048 x 2048, before and after the algorithms). `--precision bf16` times the updates under
bfloat16 autocast (`--run.precision bf16`) against a bfloat16 matmul.

    python -m benchmarks.speed --algos bc td3_bc
    python -m benchmarks.speed --algos td3_bc --threads 1 --json
    python -m benchmarks.speed --algos cql dt --threads 1 --precision bf16

Each algorithm module exposes `Config` and `Agent(cfg, data, device)` with `update(batch)`, or a
`benchmark_step(cfg, data, device)` that returns one training step as its `train` runs it.

End to end (`--end-to-end STEPS`, its own part `end-to-end` of the --markdown file): per algorithm a real
run of about STEPS steps on --dataset (default offrl/hopper/medium-replay-v0), `python -m algos.<algo>`
in a subprocess as `benchmarks.sweep` starts it, under `benchmarks.run_probe` (which times the loop, each
evaluation and each checkpoint), then the update timing above for the same config (`--run-args`) on the
same data. The rule that turns a short run into a full run's cost per step:

- the run is started with `--eval.every 0 --run.checkpoint-every 0`: it evaluates and checkpoints once,
  at its last step;
- loop ms/step = the wall time of its steps after a warm-up of one period of the loop's periodic work
  (lcm of --log.every, MOPO/MOBILE/RAVL's --rollout-every, RCSL's --holdout-every; STEPS is rounded up to
  whole periods), less that last evaluation and checkpoint;
- end to end ms/step = loop + (n_eval * t_eval + n_ckpt * t_ckpt) / S, where S, --eval.every and
  --run.checkpoint-every are those of a full run at the algorithm's defaults (or as --run-args set them),
  n = ceil(S / every) (1 for every = 0), t_ckpt the measured checkpoint and t_eval the measured evaluation
  with its stepping scaled to episodes that all reach the env's time limit (an upper bound: a short run's
  policy falls early, a trained one runs to the limit);
- rollouts ms/step = MOPO/MOBILE/RAVL's model rollout rounds inside that timed loop (run_probe times each
  round), over its steps: the algorithm's own work, which the update timing leaves out (0 for the others);
- ratio = end to end / (update + rollouts) ms; the goal is <= 1.10.

Beside it: steps / final.json's wall_seconds, the process's wall time, its peak RSS (os.wait4's
ru_maxrss) and peak CUDA memory. MOPO/MOBILE/RAVL are skipped unless their dynamics model is cached
(OFFRL_MODELS) or `--model-path` is in --run-args (`--train-models` lets them train one).

    python -m benchmarks.speed --end-to-end 3000 --algos bc td3_bc iql cql riql dt rcsl --threads 1 \\
        --markdown results/speed.md
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.sections import check_section, write_section
from offrl.data import ReplayBuffer, TrainingData
from offrl.data.dataset import Dataset
from offrl.data.preprocess import Preprocessing
from offrl.nets import PRECISIONS, gradient_step, precision_dtype, retain_freed_memory

DEFAULT_ALGOS = ("bc", "td3_bc", "iql", "cql", "riql", "dt", "rcsl", "sac", "wsrl", "mopo", "mobile", "ravl", "dynamics",
                 "rollout")
"""Every algorithm with one update to time (MBRCSL has none: its run trains a behaviour policy, a dynamics model
and an RCSL policy in turn; its dynamics and RCSL steps are `dynamics` and `rcsl`), and the world model's steps."""
UNTIMED = {"mbrcsl": "its run trains a behaviour policy, a dynamics model and an RCSL policy in turn, with no one "
                     "update to time: time its phases with --algos dynamics rcsl"}


def synthetic_data(obs_dim: int = 11, act_dim: int = 3, rows: int = 100_000, seed: int = 0) -> TrainingData:
    rng = np.random.default_rng(seed)
    terminals = (rng.random(rows) < 0.001).astype(np.float32)
    terminals[-1] = 0
    timeouts = np.zeros(rows, np.float32)
    timeouts[-1] = 1
    ends = np.flatnonzero(terminals)
    dataset = Dataset(
        observations=rng.normal(size=(rows, obs_dim)).astype(np.float32),
        actions=rng.uniform(-1, 1, (rows, act_dim)).astype(np.float32),
        rewards=rng.normal(size=rows).astype(np.float32),
        next_observations=rng.normal(size=(rows, obs_dim)).astype(np.float32),
        terminals=terminals, timeouts=timeouts,
        episode_starts=np.concatenate([[0], ends[ends < rows - 1] + 1]).astype(np.int64),
        metadata={"name": "synthetic", "env_id": "Hopper-v5"},
    ).validate()
    pre = Preprocessing(obs_mean=np.zeros(obs_dim, np.float32), obs_std=np.ones(obs_dim, np.float32))
    return TrainingData(dataset, pre, obs_dim, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device, n: int = 2048, repeats: int = 10, precision: str = "fp32") -> float:
    dtype = precision_dtype(precision)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def dynamics_step(data: TrainingData, device: torch.device, batch_size: int | None = None, compile: bool = False,
                  precision: str = "fp32"):
    """One gradient step of the dynamics ensemble as `world_models.train` takes it (`EnsembleTrainer.gradient_step`,
    default config, `precision` and `compile` as --model.precision and --model.compile set them): every member on
    its own `batch_size` transitions (default 256)."""
    from world_models.ensemble import DynamicsEnsemble, EnsembleConfig, EnsembleTrainer, transitions_to_training

    cfg = EnsembleConfig(compile=compile, precision=precision, batch_size=batch_size or EnsembleConfig.batch_size)
    ds = data.dataset
    model = DynamicsEnsemble(data.obs_dim, data.act_dim, cfg).to(device)
    if compile:
        torch._dynamo.reset()  # a fresh compile (the recompile limit, as for the algorithms in time_algorithm)
    trainer = EnsembleTrainer(model, *transitions_to_training(ds.observations, ds.actions, ds.rewards,
                                                              ds.next_observations), seed=0)
    generator = torch.Generator(device=device).manual_seed(0)

    def update():
        index = torch.randint(len(trainer.inputs), (cfg.members, cfg.batch_size), device=device, generator=generator)
        return {"nll": trainer.gradient_step(index).sum()}
    return cfg.batch_size, update


def rollout_step(data: TrainingData, device: torch.device, batch_size: int | None = None, compile: bool = False,
                 precision: str = "fp32"):
    """One step of a rollout round: `batch_size` rows (default 50,000, MOPO's rollout batch) through the
    policy and every member of the dynamics ensemble, a random elite's sample and MOPO's penalty (eager: no
    option compiles rollouts, so `compile` changes nothing; `precision` is the timing's autocast around it)."""
    from offrl.nets import TanhGaussianActor
    from world_models.ensemble import DynamicsEnsemble
    from world_models.rollout import aleatoric_penalty, model_step
    from world_models.termination import never

    rows = batch_size or 50_000
    model = DynamicsEnsemble(data.obs_dim, data.act_dim).to(device)
    actor = TanhGaussianActor(data.obs_dim, data.act_dim, data.action_low, data.action_high).to(device)
    obs = torch.as_tensor(np.resize(data.dataset.observations, (rows, data.obs_dim)), device=device)

    @torch.no_grad()
    def update():
        step = model_step(model, obs, actor(obs)[0], never)
        return {"reward": step.rewards.mean(), "penalty": aleatoric_penalty(step.std).mean()}
    return rows, update


WORLD_MODEL_STEPS = {"dynamics": dynamics_step, "rollout": rollout_step}
"""Steps of the world models' own work, timed beside the algorithms' updates."""


def time_blocks(step: Callable[[], dict[str, torch.Tensor]], device: torch.device, blocks: int,
                per_block: int) -> list[float]:
    """ms per step of `blocks` blocks of `per_block` consecutive steps (device synced around each block);
    the last step's metrics must be finite."""
    block_ms = []
    for _ in range(blocks):
        sync(device)
        start = time.perf_counter()
        for _ in range(per_block):
            metrics = step()
        sync(device)
        block_ms.append(1000 * (time.perf_counter() - start) / per_block)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    return block_ms


def configured(algo: str, run_args: str, compile: bool = False):
    """`algo`'s Config parsed from `run_args` (its command-line options), with --run.compile where `compile`;
    None without options (time_algorithm then takes the defaults)."""
    if not run_args:
        return None
    if algo in WORLD_MODEL_STEPS:
        raise SystemExit(f"--run-args: {algo} is a world-model step with no options")
    from offrl.errors import OffrlError
    from offrl.run import parse_config

    try:
        cfg = parse_config(importlib.import_module(f"algos.{algo}").Config, shlex.split(run_args))
    except OffrlError as exc:  # --config's
        raise SystemExit(f"--run-args: {exc}") from None
    cfg.run.compile = cfg.run.compile or compile
    return cfg


def time_algorithm(algo: str, device: torch.device, warmup: int, blocks: int, per_block: int,
                   batch_size: int | None = None, compile: bool = False, precision: str = "fp32",
                   cfg=None, data: TrainingData | None = None) -> dict:
    """Median ms per update of `algo`: with its default config on synthetic Hopper-sized data, or with
    `cfg` (a parsed `Config`) on `data` (e.g. the run's own, `load_for_training`)."""
    data = data if data is not None else synthetic_data()
    torch.manual_seed(0)
    if algo in WORLD_MODEL_STEPS:
        cfg = argparse.Namespace()
        cfg.batch_size, update = WORLD_MODEL_STEPS[algo](data, device, batch_size, compile, precision)
        module = None
    else:
        module = importlib.import_module(f"algos.{algo}")
        if cfg is None:
            cfg = module.Config()
            cfg.run.compile = compile
        if batch_size:
            cfg.batch_size = batch_size
    if getattr(getattr(cfg, "run", None), "compile", False):
        # a fresh compile for this agent: compiled code is cached per code object with guards on the module
        # instance, so rounds and algorithms timed before in this process used up the recompile limit, after which
        # the modules ran uncompiled (WSRL's pre-training critics: 97 ms a step alone, 125 ms as a 3-round median)
        torch._dynamo.reset()
    if module is None:
        pass
    elif hasattr(module, "benchmark_step"):  # algorithms whose step is more than sample + update (DT, RCSL, model-based)
        update = module.benchmark_step(cfg, data, device)
    else:
        agent = module.Agent(cfg, data, device)
        buffer = ReplayBuffer.from_dataset(data.dataset, device, seed=0)

        def update():
            return agent.update(buffer.sample(cfg.batch_size))

    flush = bool(getattr(getattr(cfg, "run", None), "flush_denormal", True))

    def step():  # as the algorithms' train loops run it: inside Run.precision()
        with gradient_step(device, precision, flush):
            return update()

    start = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(device)
    warmup_s = time.perf_counter() - start  # with --run.compile, mostly compiling
    block_ms = time_blocks(step, device, blocks, per_block)
    median_ms = statistics.median(block_ms)
    # FLOPs counted after the timing: a compiled module run under FlopCounterMode stayed slower afterwards (WSRL's
    # compiled pre-training critics 99-102 -> 128-129 ms a step), so counting first understated --compile.
    # Over an even number of updates: some algorithms update the actor every 2nd step.
    try:
        with FlopCounterMode(display=False) as counter:
            step()
            step()
        flops = counter.get_total_flops() / 2
    except RuntimeError:  # FlopCounterMode cannot follow torch.autograd.grad inside a step (RAVL's EDAC term)
        flops = float("nan")
    eager_count_s = 0.0
    if flops == 0 and device.type == "cuda" and getattr(getattr(cfg, "run", None), "cuda_graph", False):
        # FlopCounterMode sees no kernels inside a CUDA graph's replay: count the same update run eagerly
        start = time.perf_counter()
        eager = copy.deepcopy(cfg)
        eager.run.cuda_graph = False
        eager.run.compile = False  # the same arithmetic; compiled kernels would hide from the counter as well
        flops = 1e9 * time_algorithm(algo, device, 2, 1, 2, cfg=eager, data=data, precision=precision)["gflop_per_update"]
        eager_count_s = time.perf_counter() - start
    return {"algo": algo, "batch_size": cfg.batch_size, "median_ms": median_ms,
            "min_ms": min(block_ms), "max_ms": max(block_ms), "warmup_s": warmup_s, "gflop_per_update": flops / 1e9,
            "update_gflops": flops / 1e9 / (median_ms / 1000), "eager_flop_count_s": eager_count_s}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=None,
                        help=f"default: {' '.join(DEFAULT_ALGOS)}; with --end-to-end {' '.join(E2E_ALGOS)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="torch CPU thread counts to measure in turn (default: torch's choice; with --end-to-end, 1)")
    parser.add_argument("--batch-size", type=int, default=None, help="override every algorithm's default batch")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--per-block", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions; medians are reported")
    parser.add_argument("--compile", action="store_true", help="time the torch.compile path")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                        help="time updates under --run.precision bf16 (bfloat16 autocast); the matmul reference "
                             "is then a bfloat16 matmul")
    parser.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n x n reference matmul")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this file (results/)")
    parser.add_argument("--section", default=None,
                        help="the part of the --markdown file this table replaces (<!-- name --> ... <!-- /name -->); "
                             "other parts are kept, so tables measured with different settings can share a file "
                             "(default: updates; with --end-to-end: end-to-end)")
    parser.add_argument("--title", default=None, help="the table's heading (default: 'Update speed', with --end-to-end "
                                                      "'End-to-end training speed')")
    e2e = parser.add_argument_group("end to end (--end-to-end STEPS): real short training runs beside the update timing")
    e2e.add_argument("--end-to-end", type=int, default=None, metavar="STEPS",
                     help="per algorithm, train STEPS steps for real (python -m algos.<algo> in a subprocess, as "
                          "benchmarks.sweep starts it) and report its ms/step with evaluations and checkpoints charged "
                          "at a full run's default frequency, its peak RSS and CUDA memory, and the ratio to the "
                          "update-only ms/step timed here for the same config and data (rule: module docstring)")
    e2e.add_argument("--dataset", default="offrl/hopper/medium-replay-v0", help="dataset of the end-to-end runs")
    e2e.add_argument("--run-args", default="",
                     help="options for the runs and the update timing alike, e.g. '--hidden 64 64'; --steps here is "
                          "the full run's budget over which evaluations and checkpoints are charged (default: the "
                          "algorithm's), --eval.every and --run.checkpoint-every their frequencies. Without "
                          "--end-to-end, the algorithms' options for the update timing (e.g. WSRL's pre-training: "
                          "--algos cql --run-args '--hidden 256 256 --num-critics 10 --critic-subsample 2 --layer-norm "
                          "--actor-layer-norm --max-target-backup'); --compile and --batch-size apply on top")
    e2e.add_argument("--e2e-warmup", type=int, default=None, metavar="STEPS",
                     help="first steps of a run left out of its loop time (default: one period of its periodic work, "
                          "the lcm of --log.every, MOPO/MOBILE/RAVL's --rollout-every and RCSL's --holdout-every)")
    e2e.add_argument("--train-models", action="store_true",
                     help="let MOPO/MOBILE/RAVL train a dynamics model that is not cached (default: skip them; a "
                          "cached model is reused, or pass --model-path in --run-args)")
    e2e.add_argument("--runs-dir", type=Path, default=None,
                     help="keep the run folders and logs here (default: a temporary folder, removed afterwards)")
    args = parser.parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    if args.markdown:  # before minutes of measuring, not after
        check_section(args.markdown, args.section or ("end-to-end" if args.end_to_end is not None else "updates"))
    retain_freed_memory()  # the updates timed here keep freed memory as runs do (--run.retain-freed-memory)
    if args.end_to_end is not None:
        if args.precision != "fp32" or args.batch_size or args.compile:
            parser.error("with --end-to-end, set the runs' options in --run-args (e.g. '--run.precision bf16 "
                         "--batch-size 512 --run.compile'): they apply to the runs and the update timing alike")
        return end_to_end(args, argv)
    args.algos = args.algos or list(DEFAULT_ALGOS)
    for algo in args.algos:
        if algo in UNTIMED:
            parser.error(f"--algos {algo}: {UNTIMED[algo]}")
        if algo not in DEFAULT_ALGOS:
            parser.error(f"--algos {algo}: unknown (known: {' '.join(DEFAULT_ALGOS)})")
    args.section, args.title = args.section or "updates", args.title or "Update speed"
    from offrl.config import resolve_device

    device = resolve_device(args.device)
    report = {"device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
              "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
              "compile": args.compile, "precision": args.precision, "matmul_size": args.matmul_size, "runs": []}
    for threads in args.threads or [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        # Rounds interleave the algorithms and the matmul reference, so drifts in the machine's speed
        # (2-thread runs here vary by up to 20%) hit all of them alike; medians over rounds are reported.
        matmul, per_algo = [], {a: [] for a in args.algos}
        for _ in range(args.rounds):
            matmul.append(matmul_gflops(device, args.matmul_size, precision=args.precision))
            for algo in args.algos:
                per_algo[algo].append(time_algorithm(algo, device, args.warmup, args.blocks, args.per_block,
                                                     args.batch_size, args.compile, args.precision,
                                                     cfg=configured(algo, args.run_args, args.compile)))
        matmul.append(matmul_gflops(device, args.matmul_size, precision=args.precision))
        peak = statistics.median(matmul)
        results = []
        for algo, rounds in per_algo.items():
            r = dict(rounds[0])
            r["median_ms"] = statistics.median(x["median_ms"] for x in rounds)
            r["round_ms"] = [x["median_ms"] for x in rounds]
            r["update_gflops"] = r["gflop_per_update"] / (r["median_ms"] / 1000)
            r["matmul_gflops"] = peak
            r["fraction_of_matmul"] = r["update_gflops"] / peak
            results.append(r)
        report["runs"].append({"threads": threads, "rounds": args.rounds, "matmul_gflops_before": matmul[0],
                               "matmul_gflops_after": matmul[-1], "matmul_gflops_median": peak, "results": results})
        if not args.json:
            print(format_run(report, report["runs"][-1]), flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    if args.markdown:
        write_markdown(report, args.markdown, argv, args.section, args.title)
    return report


_MATMUL = {"fp32": "float32", "bf16": "bfloat16 (updates under bf16 autocast)"}


def format_run(report: dict, run: dict) -> str:
    lines = [f"device {report['device']}, {run['threads']} threads, torch {report['torch']}"
             f"{', compiled' if report['compile'] else ''}, {run['rounds']} round(s); "
             f"{_MATMUL[report.get('precision', 'fp32')]} matmul median "
             f"{run['matmul_gflops_median']:.0f} GFLOP/s (first {run['matmul_gflops_before']:.0f}, last "
             f"{run['matmul_gflops_after']:.0f})",
             f"{'algo':10s} {'batch':>6s} {'ms/update':>10s} {'GFLOP/upd':>10s} {'GFLOP/s':>8s} {'of matmul':>10s}"]
    for r in run["results"]:
        lines.append(f"{r['algo']:10s} {r['batch_size']:6d} {r['median_ms']:10.3f} {r['gflop_per_update']:10.4f} "
                     f"{r['update_gflops']:8.1f} {100 * r['fraction_of_matmul']:9.1f}%")
    return "\n".join(lines)


def write_markdown(report: dict, path: Path, argv: list[str], section: str = "updates",
                   title: str = "Update speed") -> None:
    heading = "#" if section == "updates" else "##"
    lines = [f"{heading} {title} ({report['device']}, {report['processor']}, torch {report['torch']})", ""]
    algos = {r["algo"] for run in report["runs"] for r in run["results"]}
    if algos & {"dynamics", "rollout"}:
        lines += ["Rows `dynamics` and `rollout` time the world models' own work: one gradient step of the 7-member "
                  "dynamics ensemble (batch = transitions per member) and one step of a rollout round (batch = rows "
                  "stepped through the policy and every member).", ""]
    if any(r["gflop_per_update"] != r["gflop_per_update"] for run in report["runs"] for r in run["results"]):
        lines += ["nan: FLOPs not countable (torch's FlopCounterMode cannot follow the autograd.grad in RAVL's "
                  "EDAC term).", ""]
    lines += [f"Generated by `python -m benchmarks.speed {shlex.join(argv)}` on {time.strftime('%Y-%m-%d')}. "
               "Median ms per update (sample + gradient step) at each algorithm's default batch (or the command's --batch-size; "
               "--run-args change the config) on Hopper-sized "
               "synthetic data (obs 11, act 3), after warm-up; GFLOP counted by torch's FlopCounterMode (matmuls, "
               f"forward and backward); 'of matmul' = update GFLOP/s over the {_MATMUL[report.get('precision', 'fp32')]} "
               f"matmul GFLOP/s ({report['matmul_size']}^3) measured "
               "in the same run at the same thread count. With several rounds, algorithms and the matmul reference "
               "are measured interleaved and medians over rounds are reported (single 2-thread measurements on this "
               "machine vary by up to 20%).", "",
               "| threads | algo | batch | ms/update (median) | ms per round | GFLOP/update | GFLOP/s | matmul GFLOP/s | of matmul |",
               "|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        for r in run["results"]:
            rounds = ", ".join(f"{ms:.2f}" for ms in r["round_ms"])
            lines.append(f"| {run['threads']} | {r['algo']} | {r['batch_size']} | {r['median_ms']:.2f} | {rounds} | "
                         f"{r['gflop_per_update']:.3f} | {r['update_gflops']:.0f} | {r['matmul_gflops']:.0f} | "
                         f"{100 * r['fraction_of_matmul']:.1f}% |")
    write_section(path, section, "\n".join(lines))


# ------------------------------------------------------------------------------------- end to end

E2E_ALGOS = ("bc", "td3_bc", "iql", "cql", "riql", "dt", "rcsl", "mopo", "mobile", "ravl")
"""The algorithms whose runs train on a dataset (SAC and WSRL train online; MBRCSL's run has no one update to time,
UNTIMED; `dynamics` and `rollout` are no runs)."""

ROOT = Path(__file__).resolve().parent.parent


def run_config(algo: str, dataset: str, device: str, threads: int, run_args: list[str]):
    """The `Config` a run of `algo` with these options has, as its command line parses it."""
    from offrl.errors import OffrlError
    from offrl.run import parse_config

    module = importlib.import_module(f"algos.{algo}")
    try:
        return parse_config(module.Config, ["--dataset", dataset, "--device", device, "--run.threads", str(threads),
                                            *run_args])
    except OffrlError as exc:  # --config's
        raise SystemExit(f"--run-args: {exc}") from None


def periodic_work(cfg) -> int:
    """Steps after which a run's periodic work inside its loop repeats: the lcm of its logging, MOPO/MOBILE/RAVL's
    rollout rounds and RCSL's hold-out checks (each with a checkpoint)."""
    periods = (cfg.log.every, getattr(cfg, "rollout_every", 0), getattr(cfg, "holdout_every", 0))
    return math.lcm(*(p for p in periods if p and p > 0))


def events_per_run(steps: int, every: int) -> int:
    """Evaluations (or checkpoints) a run of `steps` steps makes at `every` (offrl.run.Run._due): one at each
    multiple of `every` and one at the last step; only the last when every = 0."""
    return 1 if every <= 0 else steps // every + (steps % every != 0)


def charged_evaluation_s(evaluation: dict) -> float:
    """An evaluation's time with its stepping scaled to episodes that all reach the env's time limit: the vector
    env steps until its longest episode ends, so the stepping time grows with that episode's length."""
    total = evaluation["end"] - evaluation["start"]
    stepping, steps, limit = evaluation.get("stepping_s"), evaluation.get("vector_steps"), evaluation.get("limit")
    if stepping is None or not steps or not limit or steps >= limit:
        return total
    return total - stepping + stepping * limit / steps


def wait_for(proc: subprocess.Popen) -> tuple[int, object]:
    """Wait for a child (os.wait4) and return its exit code and resource usage (ru_maxrss: its peak RSS)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # Ctrl-C: a run stopped by SIGTERM checkpoints and exits
        proc.terminate()
        proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage


def measure_run(algo: str, args, threads: int, runs_dir: Path) -> dict:
    """One algorithm end to end: a real run in a subprocess under benchmarks.run_probe, and the update timing of
    the same config on the same data in this process, half its rounds before the run and half after (at least
    one each), so a drift of the machine's speed over the run weighs on both sides; the row of the table (or why
    it has none)."""
    from benchmarks import run_probe
    from benchmarks.sweep import Job

    row = {"algo": algo, "threads": threads}
    if algo not in E2E_ALGOS:
        why = UNTIMED.get(algo, "not an offline run")
        return {**row, "skipped": f"{why} (end to end covers {', '.join(E2E_ALGOS)})"}
    run_args = shlex.split(args.run_args)
    cfg = run_config(algo, args.dataset, args.device, threads, run_args)
    period = periodic_work(cfg)
    warmup = period if args.e2e_warmup is None else args.e2e_warmup
    steps = warmup + max(1, math.ceil((args.end_to_end - warmup) / period)) * period  # whole periods measured
    row |= {"steps": steps, "warmup": warmup, "period": period, "full_steps": cfg.steps, "eval_every": cfg.eval.every,
            "eval_episodes": cfg.eval.episodes, "checkpoint_every": cfg.run.checkpoint_every,
            "log_every": cfg.log.every, "precision": cfg.run.precision, "batch_size": getattr(cfg, "batch_size", None)}
    # the run as benchmarks.sweep starts it (wandb disabled, no progress line), evaluating and checkpointing only
    # at its last step; a new run folder each time (no --resume auto)
    job = Job("speed", algo, [*run_args, "--steps", str(steps), "--eval.every", "0", "--run.checkpoint-every", "0"],
              args.dataset, 0, steps, runs_dir / f"{threads}-threads")
    command = job.command(["--device", args.device], threads)
    del command[command.index("--resume"):command.index("--resume") + 2]
    command[1:3] = ["-m", "benchmarks.run_probe", f"algos.{algo}"]
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    probe_path, log_path = job.run_dir.parent / f"{algo}-probe.json", job.run_dir.parent / f"{algo}.log"
    probe_path.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OFFRL_PROBE": str(probe_path), "OFFRL_PROBE_WARMUP": str(warmup),
           "OFFRL_PROBE_NO_MODEL_TRAINING": "0" if args.train_models else "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    from offrl.config import resolve_device
    from offrl.data import load_for_training

    data = None

    def time_updates(rounds: int) -> list[float]:
        nonlocal data
        torch.set_num_threads(threads)
        data = data or load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
        return [time_algorithm(algo, resolve_device(cfg.device), args.warmup, args.blocks, args.per_block,
                               cfg=copy.deepcopy(cfg), data=data, precision=cfg.run.precision)["median_ms"]
                for _ in range(rounds)]

    rounds_before = max(1, args.rounds // 2)
    update_ms = time_updates(rounds_before)
    print(f"end to end: {algo}, {steps} steps at {threads} thread(s), log {log_path}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    code, usage = wait_for(proc)
    row["process_wall_s"] = time.perf_counter() - start
    row["peak_rss_mib"] = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else {}
    if code == run_probe.NO_MODEL_EXIT and probe.get("skipped"):
        return {**row, "skipped": probe["skipped"]}
    if code != 0 or not probe.get("loop", {}).get("t_warm"):
        tail = " | ".join(log_path.read_text().strip().splitlines()[-5:]) if log_path.exists() else ""
        return {**row, "error": f"exit {code} (log {log_path}): {tail}"}

    loop = probe["loop"]
    last = loop["last_step"]
    evaluations = [e for e in probe["evaluations"] if e["step"] == last]
    # the last step's checkpoint that --run.checkpoint-every 0 asked for; forced ones (RCSL's at each hold-out
    # check) are the loop's periodic work and stay in it
    checkpoints = [c for c in probe["checkpoints"] if c["step"] == last and not c["force"]]
    inside = seconds_in_loop(evaluations + checkpoints, loop)
    measured = last - loop["start_step"] - warmup
    row["loop_ms"] = 1000 * (loop["t_end"] - loop["t_warm"] - inside) / measured
    row["rollout_ms"] = 1000 * seconds_in_loop(probe.get("rollouts", []), loop) / measured
    row["evaluation_s"] = sum(e["end"] - e["start"] for e in evaluations)
    row["evaluation_charged_s"] = sum(map(charged_evaluation_s, evaluations))
    row["evaluation_episode_steps"] = [e.get("vector_steps") for e in evaluations]
    row["evaluation_limit"] = next((e["limit"] for e in evaluations if e.get("limit")), None)
    row["checkpoint_s"] = sum(c["end"] - c["start"] for c in checkpoints)
    row["evaluations"] = events_per_run(cfg.steps, cfg.eval.every) if evaluations else 0
    row["checkpoints"] = events_per_run(cfg.steps, cfg.run.checkpoint_every) if checkpoints else 0
    row["end_to_end_ms"] = row["loop_ms"] + 1000 * (row["evaluations"] * row["evaluation_charged_s"]
                                                    + row["checkpoints"] * row["checkpoint_s"]) / cfg.steps
    final = json.loads((Path(loop["run_dir"]) / "final.json").read_text())
    row["run_wall_s"] = final["wall_seconds"]
    row["run_steps_per_s"] = (last - loop["start_step"]) / final["wall_seconds"]
    row["peak_cuda_mib"] = probe["cuda"]["peak_allocated"] / 2**20 if probe.get("cuda") else None

    update_ms += time_updates(max(1, args.rounds - rounds_before))
    row["update_ms"] = statistics.median(update_ms)
    row["update_round_ms"] = update_ms
    row["ratio"] = row["end_to_end_ms"] / (row["update_ms"] + row["rollout_ms"])
    return row


def seconds_in_loop(windows: list[dict], loop: dict) -> float:
    """Wall time of the probe's windows (start, end) that lie inside the loop's timed part (after its warm-up)."""
    return sum(w["end"] - w["start"] for w in windows if loop["t_warm"] <= w["start"] and w["end"] <= loop["t_end"])


def end_to_end(args, argv: list[str]) -> dict:
    algos = args.algos or list(E2E_ALGOS)
    for algo in algos:
        if algo not in DEFAULT_ALGOS and algo not in UNTIMED:
            raise SystemExit(f"error: --algos {algo}: unknown (known: {' '.join(DEFAULT_ALGOS)})")
    report = {"device": args.device, "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
              "dataset": args.dataset, "run_args": args.run_args, "end_to_end_steps": args.end_to_end, "rows": []}
    if args.device != "cpu":
        from offrl.config import resolve_device

        device = resolve_device(args.device)
        report["device"] = str(device) if device.type == "cpu" else torch.cuda.get_device_name(device)
    threads_before = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        temporary = None if args.runs_dir else stack.enter_context(tempfile.TemporaryDirectory(prefix="offrl-speed-"))
        runs_dir = Path(args.runs_dir or temporary).resolve()
        try:
            for threads in args.threads or [1]:  # a run's default: one thread
                for algo in algos:
                    report["rows"].append(measure_run(algo, args, threads, runs_dir))
                    if not args.json:
                        print(format_end_to_end_row(report["rows"][-1]), flush=True)
        finally:
            torch.set_num_threads(threads_before)
    if args.json:
        print(json.dumps(report, indent=2))
    if args.markdown:
        write_end_to_end_markdown(report, args.markdown, argv, args.section or "end-to-end",
                                  args.title or "End-to-end training speed")
    return report


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _evaluation_cell(r: dict) -> str:
    if not r["evaluations"]:
        return "-"
    lengths = ", ".join(str(n) for n in r["evaluation_episode_steps"])
    return (f"{r['evaluations']} × {r['evaluation_charged_s']:.2f} ({r['evaluation_s']:.2f} measured, "
            f"{lengths} of {r['evaluation_limit'] or '?'} steps)")


def format_end_to_end_row(r: dict) -> str:
    if "skipped" in r or "error" in r:
        why = f"skipped: {r['skipped']}" if "skipped" in r else f"FAILED: {r['error']}"
        return f"{r['algo']:8s} {r['threads']} thread(s): {why}"
    return (f"{r['algo']:8s} {r['threads']} thread(s): update {r['update_ms']:.2f} ms, rollouts {r['rollout_ms']:.2f} "
            f"ms/step, loop {r['loop_ms']:.2f} ms/step, "
            f"end to end {r['end_to_end_ms']:.2f} ms/step (x{r['ratio']:.3f}); evaluations {_evaluation_cell(r)} s, "
            f"checkpoints {r['checkpoints']} × {r['checkpoint_s']:.2f} s over {r['full_steps']} steps; "
            f"run {r['run_steps_per_s']:.1f} steps/s, process {r['process_wall_s']:.1f} s, "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB, peak CUDA {_mib(r['peak_cuda_mib'])} MiB")


def write_end_to_end_markdown(report: dict, path: Path, argv: list[str], section: str = "end-to-end",
                              title: str = "End-to-end training speed") -> None:
    heading = "#" if section == "updates" else "##"
    run_args = f", run options `{report['run_args']}`" if report["run_args"].strip() else ""
    lines = [f"{heading} {title} ({report['device']}, {report['processor']}, torch {report['torch']})", "",
             f"Generated by `python -m benchmarks.speed {shlex.join(argv)}` on {time.strftime('%Y-%m-%d')}. "
             f"Each algorithm trains for real on {report['dataset']}: `python -m algos.<algo>` as `benchmarks.sweep` "
             f"starts it (seed 0, `--run.threads` as the table says, wandb disabled, no progress line{run_args}), in a "
             "subprocess through `benchmarks.run_probe`, which runs the module unchanged and reads a clock around the "
             "loop and each evaluation and checkpoint. **Rule.** The run is started with `--eval.every 0 --run.checkpoint-every 0`, so "
             "it evaluates and checkpoints once, at its last step. *Loop ms/step*: the wall time of its steps after a "
             "warm-up of one period of the loop's periodic work (logging every `--log.every`, MOPO/MOBILE/RAVL's "
             "rollout rounds, RCSL's hold-out checks with their checkpoints; the steps run are rounded up to whole "
             "periods), less that final evaluation and checkpoint: sampling, the update, logging and the periodic "
             "work. *End to end* = loop + (n_eval × t_eval + n_ckpt × t_ckpt) / S, with S, `--eval.every` and "
             "`--run.checkpoint-every` the algorithm's defaults (column 'full run'), n = ceil(S / every) (1 when "
             "every = 0: only at the end), t_ckpt the final checkpoint's time and t_eval the final evaluation's, its "
             "stepping scaled to episodes that all run to the env's time limit (the vector env steps until its "
             "longest episode ends; a short run's policy falls early, a trained one runs to the limit), so an upper "
             "bound on what a full run's evaluations cost. *Update*: this benchmark's update timing (sample + "
             "gradient step after warm-up, median of blocks, as in 'Update speed') in the same invocation, for the "
             "same config on the same data, the median of rounds timed before and after the run (at least one each); "
             "it runs in this process, not the run's, so a ratio a little below 1 is measurement noise (the loop "
             "holds the update). *Rollouts ms/step*: MOPO/MOBILE/RAVL's model rollout rounds inside the "
             "timed loop (`benchmarks.run_probe` times each), over its steps; the algorithm's own work, not overhead. "
             "Ratio = end to end / (update + rollouts); the goal is ≤ 1.10. Run steps/s = steps / "
             "final.json's wall_seconds (the run's own clock, after its setup, with its one evaluation and checkpoint "
             "uncharged); process wall: the subprocess from start to exit (imports, dataset and model loading); peak "
             "RSS: the child's ru_maxrss (os.wait4); peak CUDA: torch.cuda.max_memory_allocated in the child. "
             "MOPO, MOBILE and RAVL run only with their dynamics model cached (OFFRL_MODELS; `python -m "
             "world_models.train`) or given (`--model-path` in `--run-args`).", "",
             "| threads | algo | steps (warm-up) | update ms | rollouts ms/step | loop ms/step | full run: steps, eval "
             "every, checkpoint every | evaluations × s charged (measured, episode steps of limit) | checkpoints × s "
             "| end to end ms/step | end to end / (update + rollouts) | run steps/s (final.json) | process wall s "
             "| peak RSS MiB | peak CUDA MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in report["rows"]:
        if "skipped" in r or "error" in r:
            notes.append(f"- {r['algo']} ({r['threads']} thread(s)): "
                         + (f"skipped, {r['skipped']}" if "skipped" in r else f"failed, {r['error']}"))
            continue
        lines.append(f"| {r['threads']} | {r['algo']} | {r['steps']} ({r['warmup']}) | {r['update_ms']:.2f} | "
                     f"{r['rollout_ms']:.2f} | {r['loop_ms']:.2f} | {r['full_steps']}, {r['eval_every']}, {r['checkpoint_every']} | "
                     f"{_evaluation_cell(r)} | {r['checkpoints']} × {r['checkpoint_s']:.2f} | "
                     f"{r['end_to_end_ms']:.2f} | "
                     f"{r['ratio']:.3f} | {r['run_steps_per_s']:.1f} | {r['process_wall_s']:.1f} | "
                     f"{r['peak_rss_mib']:.0f} | {_mib(r['peak_cuda_mib'])} |")
    if notes:
        lines += ["", "Not measured:", "", *notes]
    write_section(path, section, "\n".join(lines))


if __name__ == "__main__":
    main()
