"""Update speed on a GPU: eager against CUDA-graphed steps (`--run.cuda-graph`), bf16 and torch.compile, and
many seeds as one batched model (`--seeds`).

    python -m benchmarks.speed_gpu --markdown results/speed-gpu.md

Part 1, per algorithm (default config, Hopper-sized synthetic data as in benchmarks.speed): median ms per
update (sample + step) for
  eager          --run.no-cuda-graph
  graph          the default on CUDA: the step replayed as a CUDA graph after 3 eager warm-up steps
  graph bf16     --run.precision bf16
  compile        --run.compile --run.no-cuda-graph (the losses compiled, the step not graphed)
  graph compile  --run.compile (the losses compiled by torch.compile, then recorded in the graph)
with 'warm-up s' the measurement's wall time less its timed blocks and FLOP-counting steps (an estimate: it
holds building the agent and its synthetic data and the warm-up steps; for the compiled rows mostly
torch.compile's compile time), GFLOP per update (FlopCounterMode), and the ratio of the
update's GFLOP/s to a 4096^3 matmul's in the same precision (fp32 matmuls without TF32, torch's default).

Part 2, `--seeds`: S seeds of IQL and TD3+BC as one batched model (the algorithms' `Seeds` class, what
`--seeds 0 1 ...` trains), ms per step of all S seeds and seed-steps per second, eager and graphed; the
S = 1 row is the single-seed speed to compare with.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.sections import check_section, write_section
from benchmarks.speed import matmul_gflops, synthetic_data, time_algorithm, time_blocks
from benchmarks.speed_vs_corl import cpu_model

VARIANTS = {"eager": dict(cuda_graph=False), "graph": dict(cuda_graph=True),
            "graph bf16": dict(cuda_graph=True, precision="bf16"), "compile": dict(cuda_graph=False, compile=True),
            "graph compile": dict(cuda_graph=True, compile=True)}


def time_variant(algo: str, variant: str, device: torch.device, args) -> dict:
    options = VARIANTS[variant]
    module = importlib.import_module(f"algos.{algo}")
    cfg = module.Config()
    cfg.run.cuda_graph = options["cuda_graph"]
    cfg.run.compile = options.get("compile", False)
    precision = options.get("precision", "fp32")
    start = time.perf_counter()
    result = time_algorithm(algo, device, args.warmup, args.blocks, args.per_block, precision=precision, cfg=cfg)
    timed_s = args.blocks * args.per_block * result["median_ms"] / 1000
    # FlopCounterMode's two counted steps and the timed blocks are not warm-up
    result["warmup_s"] = (time.perf_counter() - start - timed_s * (1 + 2 / (args.blocks * args.per_block))
                          - result["eager_flop_count_s"])
    result.update(variant=variant, precision=precision)
    return result


def has_seeds(algo: str) -> bool:
    """Whether algos.<algo> has a batched-seeds trainer (`Seeds`), what part 2 times."""
    try:
        return hasattr(importlib.import_module(f"algos.{algo}"), "Seeds")
    except ModuleNotFoundError:
        return False


def time_variant_in_child(algo: str, variant: str, args) -> dict:
    """Each variant in its own process: a failed CUDA-graph capture leaves the process's CUDA state unusable."""
    command = [sys.executable, "-m", "benchmarks.speed_gpu", "--child", algo, variant, "--warmup", str(args.warmup),
               "--blocks", str(args.blocks), "--per-block", str(args.per_block)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_seeds(algo: str, seeds: int, cuda_graph: bool, device: torch.device, args) -> dict:
    from offrl.multiseed import seed_configs

    module = importlib.import_module(f"algos.{algo}")
    cfg = module.Config(seeds=list(range(seeds)))
    cfg.run.cuda_graph = cuda_graph
    data = synthetic_data()
    trainer = module.Seeds(seed_configs(cfg), data, device)
    for _ in range(args.warmup):
        trainer.update()
    ms = statistics.median(time_blocks(trainer.update, device, args.blocks, args.per_block))
    return {"algo": algo, "seeds": seeds, "cuda_graph": cuda_graph, "median_ms": ms, "seed_steps_per_s": seeds * 1000 / ms}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["bc", "td3_bc", "iql", "cql"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 16, 64], help="seed counts of part 2")
    parser.add_argument("--seed-algos", nargs="+", default=["iql", "td3_bc"])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per-block", type=int, default=50)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("ALGO", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    no_seeds = [algo for algo in args.seed_algos if not has_seeds(algo)]
    if no_seeds:  # checked before part 1's minutes, not after them
        with_seeds = [p.stem for p in sorted((Path(__file__).parents[1] / "algos").glob("*.py")) if has_seeds(p.stem)]
        parser.error(f"--seed-algos {' '.join(no_seeds)}: no batched-seeds trainer (algorithms with one: "
                     f"{' '.join(with_seeds)})")
    if args.markdown:
        check_section(args.markdown, "gpu")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.speed_gpu needs a CUDA device")
    device = torch.device("cuda")
    if args.child:
        print(json.dumps(time_variant(*args.child, device, args)))
        return ""
    name = torch.cuda.get_device_name(device)
    roof = {p: matmul_gflops(device, 4096, precision=p) for p in ("fp32", "bf16")}
    rows = []
    for algo in args.algos:
        for variant in args.variants:
            try:
                r = time_variant_in_child(algo, variant, args)
            except RuntimeError as error:
                print(f"{algo} {variant} failed: {error}", flush=True)
                rows.append({"algo": algo, "variant": variant, "failed": str(error)})
                continue
            r["update_gflops"] = r["gflop_per_update"] / (r["median_ms"] / 1000)
            r["of_matmul"] = r["update_gflops"] / roof[r["precision"]]
            rows.append(r)
            print(f"{algo:8s} {variant:14s} {r['median_ms']:8.3f} ms  warm-up {r['warmup_s']:6.1f} s  "
                  f"{r['update_gflops']:8.0f} GFLOP/s  {100 * r['of_matmul']:5.2f}% of matmul", flush=True)
    seed_rows = []
    for algo in args.seed_algos:
        for seeds in args.seeds:
            for graph in (False, True):
                r = time_seeds(algo, seeds, graph, device, args)
                seed_rows.append(r)
                print(f"{algo:8s} seeds {seeds:3d} graph {graph!s:5s} {r['median_ms']:8.3f} ms/step "
                      f"{r['seed_steps_per_s']:9.0f} seed-steps/s", flush=True)
    command = "python -m benchmarks.speed_gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"## Update speed on {name} (torch {torch.__version__}, CPU {cpu_model()})", "",
             f"Generated by `{command.strip()}` on {time.strftime('%Y-%m-%d')}. Default configs, Hopper-sized "
             f"synthetic data (obs 11, act 3); median ms per update (sample + step) over {args.blocks} blocks of "
             f"{args.per_block} after {args.warmup} warm-up steps. Matmul reference (4096^3): fp32 "
             f"{roof['fp32'] / 1000:.1f} TFLOP/s (no TF32), bf16 {roof['bf16'] / 1000:.1f} TFLOP/s. 'warm-up s': "
             "the measurement's time less its timed blocks and FLOP-counting steps, an estimate (building the agent and its "
             "synthetic data, the warm-up steps; with --run.compile mostly the compile time).", "",
             "| algo | variant | ms/update | speed-up over eager | warm-up s | GFLOP/update | GFLOP/s | of matmul |",
             "|---|---|---|---|---|---|---|---|"]
    eager = {r["algo"]: r["median_ms"] for r in rows if r["variant"] == "eager"}
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['algo']} | {r['variant']} | failed: {r['failed'][:120]} | | | | | |")
            continue
        speedup = f"{eager[r['algo']] / r['median_ms']:.1f}x" if r["algo"] in eager else "-"
        lines.append(f"| {r['algo']} | {r['variant']} | {r['median_ms']:.3f} | {speedup} | {r['warmup_s']:.1f} | "
                     f"{r['gflop_per_update']:.3f} | {r['update_gflops']:.0f} | {100 * r['of_matmul']:.2f}% |")
    lines += ["", f"S seeds as one batched model (`--seeds`, {args.blocks} blocks of {args.per_block} steps after "
              f"{args.warmup}): ms per step of all S seeds, and seed-steps per second.", "",
              "| algo | seeds | eager ms/step | graph ms/step | eager seed-steps/s | graph seed-steps/s |", "|---|---|---|---|---|---|"]
    by = {(r["algo"], r["seeds"], r["cuda_graph"]): r for r in seed_rows}
    for algo in args.seed_algos:
        for seeds in args.seeds:
            e, g = by[(algo, seeds, False)], by[(algo, seeds, True)]
            lines.append(f"| {algo} | {seeds} | {e['median_ms']:.3f} | {g['median_ms']:.3f} | "
                         f"{e['seed_steps_per_s']:.0f} | {g['seed_steps_per_s']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        write_section(args.markdown, "gpu", text)
    return text


if __name__ == "__main__":
    main()
