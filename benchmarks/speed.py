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
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.sections import write_section
from offrl.data import ReplayBuffer, TrainingData
from offrl.data.dataset import Dataset
from offrl.data.preprocess import Preprocessing
from offrl.nets import PRECISIONS, autocast, precision_dtype

DEFAULT_ALGOS = ("bc", "td3_bc", "iql", "cql", "riql", "dt", "rcsl", "sac", "mopo", "mobile", "ravl", "dynamics", "rollout")


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


def dynamics_step(data: TrainingData, device: torch.device, batch_size: int | None = None):
    """One gradient step of the dynamics ensemble (world_models.ensemble, default config): every member
    on its own `batch_size` transitions (default 256)."""
    from world_models.ensemble import DynamicsEnsemble, EnsembleConfig, transitions_to_training

    cfg = EnsembleConfig()
    batch_size = batch_size or cfg.batch_size
    ds = data.dataset
    model = DynamicsEnsemble(data.obs_dim, data.act_dim, cfg).to(device)
    inputs, targets = (torch.as_tensor(x, device=device) for x in
                       transitions_to_training(ds.observations, ds.actions, ds.rewards, ds.next_observations))
    model.set_input_statistics(inputs)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    generator = torch.Generator(device=device).manual_seed(0)

    def update():
        index = torch.randint(len(inputs), (cfg.members, batch_size), device=device, generator=generator)
        loss, _ = model.loss(model.standardize(inputs[index]), targets[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}
    return batch_size, update


def rollout_step(data: TrainingData, device: torch.device, batch_size: int | None = None):
    """One step of a rollout round: `batch_size` rows (default 50,000, MOPO's rollout batch) through the
    policy and every member of the dynamics ensemble, a random elite's sample and MOPO's penalty."""
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


def time_algorithm(algo: str, device: torch.device, warmup: int, blocks: int, per_block: int,
                   batch_size: int | None = None, compile: bool = False, precision: str = "fp32") -> dict:
    data = synthetic_data()
    torch.manual_seed(0)
    if algo in WORLD_MODEL_STEPS:
        cfg = argparse.Namespace()
        cfg.batch_size, update = WORLD_MODEL_STEPS[algo](data, device, batch_size)
        module = None
    else:
        module = importlib.import_module(f"algos.{algo}")
        cfg = module.Config()
        cfg.run.compile = compile
        if batch_size:
            cfg.batch_size = batch_size
    if module is None:
        pass
    elif hasattr(module, "benchmark_step"):  # algorithms whose step is more than sample + update (DT, RCSL, model-based)
        update = module.benchmark_step(cfg, data, device)
    else:
        agent = module.Agent(cfg, data, device)
        buffer = ReplayBuffer.from_dataset(data.dataset, device, seed=0)

        def update():
            return agent.update(buffer.sample(cfg.batch_size))

    def step():  # as the algorithms' train loops run it: inside Run.precision()
        with autocast(device, precision):
            return update()

    for _ in range(warmup):
        step()
    # Count FLOPs over an even number of updates: some algorithms update the actor every 2nd step.
    try:
        with FlopCounterMode(display=False) as counter:
            step()
            step()
        flops = counter.get_total_flops() / 2
    except RuntimeError:  # FlopCounterMode cannot follow torch.autograd.grad inside a step (RAVL's EDAC term)
        step()
        step()
        flops = float("nan")
    block_ms = []
    for _ in range(blocks):
        sync(device)
        start = time.perf_counter()
        for _ in range(per_block):
            metrics = step()
        sync(device)
        block_ms.append(1000 * (time.perf_counter() - start) / per_block)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    median_ms = statistics.median(block_ms)
    return {"algo": algo, "batch_size": cfg.batch_size, "median_ms": median_ms,
            "min_ms": min(block_ms), "max_ms": max(block_ms), "gflop_per_update": flops / 1e9,
            "update_gflops": flops / 1e9 / (median_ms / 1000)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(DEFAULT_ALGOS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="torch CPU thread counts to measure in turn (default: torch's choice)")
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
    parser.add_argument("--section", default="updates",
                        help="the part of the --markdown file this table replaces (<!-- name --> ... <!-- /name -->); "
                             "other parts are kept, so tables measured with different settings can share a file")
    parser.add_argument("--title", default="Update speed", help="the table's heading")
    args = parser.parse_args(argv)
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
                                                     args.batch_size, args.compile, args.precision))
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
        write_markdown(report, args.markdown, argv if argv is not None else sys.argv[1:], args.section, args.title)
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
    lines += [f"Generated by `python -m benchmarks.speed {' '.join(argv)}` on {time.strftime('%Y-%m-%d')}. "
               "Median ms per update (sample + gradient step) at each algorithm's default batch on Hopper-sized "
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


if __name__ == "__main__":
    main()
