"""Result tables from run folders: one row per (variant, dataset), over seeds.

    python -m benchmarks.table runs-bench/hopper-mr --out results/hopper-mr.md --title "..." \\
        --command "python -m benchmarks.sweep ..."

For every run folder with a final.json: the last evaluation's normalized score (final) and the best
one over training (best, from metrics.jsonl). Per group: mean ± std over seeds of last and best, and
the IQM (mean of the middle 50% of seeds' last scores) with a 95% bootstrap confidence interval
(resampling seeds, 2000 draws, fixed seed). The caption states seeds, steps, evaluation episodes,
hardware and package versions, read from the runs themselves.

With --reevaluate N the final column is instead each run's final checkpoint evaluated again with N
episodes from reset seed --reeval-seed (`offrl eval`; cached next to the run as
reeval-<N>ep-seed<S>.json), for a more precise final score than training's few evaluation episodes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from offrl.checkpoint import run_checkpoint


def iqm(values: np.ndarray) -> float:
    """Interquartile mean: the mean of the values left after dropping the lowest and highest 25%
    (fractional weights at the cut points, as scipy.stats.trim_mean would with interpolation)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    lo, hi = 0.25 * n, 0.75 * n
    weights = np.clip(np.minimum(np.arange(1, n + 1), hi) - np.maximum(np.arange(n), lo), 0, None)
    return float((weights * x).sum() / weights.sum())


def bootstrap_ci(values: np.ndarray, statistic=iqm, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=np.float64)
    stats = [statistic(rng.choice(values, size=len(values), replace=True)) for _ in range(draws)]
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def reevaluated(run_dir: Path, episodes: int, seed: int) -> dict:
    """`offrl eval` of the run's final checkpoint, computed once and cached in the run folder (again
    when the checkpoint is newer than the cache: the run was continued)."""
    cache = run_dir / f"reeval-{episodes}ep-seed{seed}.json"
    if cache.exists() and cache.stat().st_mtime >= run_checkpoint(run_dir).stat().st_mtime:
        return json.loads(cache.read_text())
    from offrl.eval_run import evaluate_saved_run

    report = evaluate_saved_run(run_dir, episodes=episodes, seed=seed, device="cpu")
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(cache)
    return report


def read_run(run_dir: Path, metric: str = "eval/normalized_score", reevaluate: tuple[int, int] | None = None) -> dict | None:
    final_path = run_dir / "final.json"
    if not final_path.exists():
        return None
    final = json.loads(final_path.read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r[metric] for r in rows if metric in r]
    config = json.loads((run_dir / "config.json").read_text())
    env = json.loads((run_dir / "environment.json").read_text())
    final_score, episodes = final.get(metric), config["eval"]["episodes"]
    wall = final.get("wall_seconds")
    if "resumes" not in final and env.get("resumes"):
        wall = None  # written before offrl kept the wall time over resumes: only the last process's time
    if reevaluate is not None and final_score is not None:
        episodes = reevaluate[0]
        prefix, key = metric.split("/", 1)
        final_score = reevaluated(run_dir, *reevaluate)["results"][prefix][key]
    return {"final": final_score, "best": max(evals, default=final.get(metric)), "metric": metric,
            "seed": final["seed"], "steps": final["steps"], "episodes": episodes, "train_episodes": config["eval"]["episodes"],
            "precision": config["run"].get("precision", "fp32"), "threads": config["run"].get("threads"),
            "algo": final["algo"], "dataset": final["dataset"], "env": env, "wall": wall, "run_dir": str(run_dir)}


def collect(roots: Path | list[Path], metrics: list[str] | None = None,
            reevaluate: tuple[int, int] | None = None) -> dict[tuple[str, str], list[dict]]:
    """{(row label, dataset): [run, ...]} for run folders <root>/<label>/<algo>/<dataset>/<run>/ of one or
    more sweep folders; with several metrics (e.g. RCSL's per-target scores) each gets its own row,
    labelled 'variant [metric]'."""
    metrics = metrics or ["eval/normalized_score"]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    roots = [roots] if isinstance(roots, Path) else roots
    for root, final in ((root, final) for root in roots for final in sorted(root.glob("*/*/*/*/final.json"))):
        label = final.parent.relative_to(root).parts[0]
        for metric in metrics:
            run = read_run(final.parent, metric, reevaluate)
            if run is not None and run["final"] is not None:
                row = label if len(metrics) == 1 else f"{label} [{metric.removesuffix('/normalized_score')}]"
                groups[(row, run["dataset"])].append(run)
    return groups


def machine_of(env: dict) -> str:
    """Where a run ran, from its environment.json: processor, cores, device (and GPU), package versions."""
    device = env.get("device")
    if env.get("cuda_device"):
        device = f"{device} ({env['cuda_device']})"
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if k in ("torch", "gymnasium", "mujoco", "minari"))
    return f"{env.get('processor')}, {env.get('cpu_count')} cores, device {device}; {packages}"


def render(groups: dict, title: str, command: str | None, reeval_seed: int | None = None) -> str:
    runs = list({r["run_dir"]: r for rs in groups.values() for r in rs}.values())  # a run has a row per metric
    if not runs:
        return f"# {title}\n\n(no finished runs)\n"
    seeds = sorted({r["seed"] for r in runs})
    steps = sorted({r["steps"] for r in runs})
    episodes = sorted({r["episodes"] for r in runs})
    train_episodes = sorted({r["train_episodes"] for r in runs})
    if reeval_seed is None:
        evaluation = (f"each evaluation {', '.join(map(str, episodes))} episodes (deterministic policy). ")
        final_is = "Final = the last evaluation; "
    else:
        evaluation = (f"training's evaluations {', '.join(map(str, train_episodes))} episodes (deterministic policy). ")
        final_is = (f"Final = the final checkpoint evaluated again by `offrl eval` with {', '.join(map(str, episodes))} "
                    f"episodes from reset seed {reeval_seed} (other episodes than training's); ")
    machines: dict[str, list[str]] = defaultdict(list)  # machine description -> the rows that ran there
    for (row, _), rs in groups.items():
        for description in dict.fromkeys(machine_of(r["env"]) for r in rs):
            if row not in machines[description]:
                machines[description].append(row)
    if len(machines) == 1:
        hardware = next(iter(machines))
    else:
        hardware = "by row: " + "; ".join(f"{', '.join(rows)}: {description}" for description, rows in machines.items())
    threads = sorted({r["threads"] for r in runs}, key=str)
    if threads == [1]:
        hardware += ", one thread per run"
    else:  # config.json holds the last process's setting; a resume may change it (sweep --spread-threads)
        counts = ", ".join(f"{sum(r['threads'] == t for r in runs)} at {t or 'torch default'}" for t in threads)
        hardware += (f", threads per run as last resumed: {counts} (a resume may add threads; that changes float "
                     "reductions, not the algorithm)")
    lines = [f"# {title}", "",
             f"Generated by `python -m benchmarks.table` on {time.strftime('%Y-%m-%d')} from {len(runs)} runs. "
             f"Seeds {seeds}; {', '.join(map(str, steps))} gradient steps; {evaluation}"
             f"Hardware: {hardware}. "
             f"{final_is}best = the best evaluation during training (optimistic, as CORL's 'best'). "
             "IQM over seeds' final scores with a 95% bootstrap CI (resampling seeds). Precision: the runs' "
             "`--run.precision` (bf16 = gradient steps under bfloat16 autocast). Hours per run: wall time over all of "
             "a run's processes (n/a for runs resumed before offrl recorded it), which depends on what else ran "
             "on the machine.",
             ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["| variant | dataset | seeds | steps | precision | final (mean ± std) | best (mean ± std) | IQM final [95% CI] | hours per run |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (label, dataset), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        final = np.array([r["final"] for r in rs])
        best = np.array([r["best"] for r in rs])
        low, high = bootstrap_ci(final)
        walls = [r["wall"] for r in rs if r["wall"] is not None]
        hours = "n/a" if not walls else f"{np.mean(walls) / 3600:.2f}" + ("" if len(walls) == len(rs) else f" ({len(walls)} of {len(rs)} runs)")
        row_steps = "/".join(str(s) for s in sorted({r["steps"] for r in rs}))
        precision = "/".join(sorted({r["precision"] for r in rs}))
        lines.append(f"| {label} | {dataset} | {len(rs)} | {row_steps} | {precision} | {final.mean():.1f} ± {final.std():.1f} | "
                     f"{best.mean():.1f} ± {best.std():.1f} | {iqm(final):.1f} [{low:.1f}, {high:.1f}] | {hours} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", type=Path, nargs="+", help="sweep folders: <out-dir>/<name>")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--title", default="Results")
    parser.add_argument("--command", default=None, help="the sweep command, quoted in the caption")
    parser.add_argument("--metric", action="append", default=None,
                        help="final.json key to report (repeatable; default eval/normalized_score)")
    parser.add_argument("--reevaluate", type=int, metavar="EPISODES",
                        help="final = each run's final checkpoint evaluated again with this many episodes")
    parser.add_argument("--reeval-seed", type=int, default=10_000, help="reset seed of the first re-evaluation episode")
    args = parser.parse_args(argv)
    reevaluate = (args.reevaluate, args.reeval_seed) if args.reevaluate else None
    text = render(collect(args.roots, args.metric, reevaluate), args.title, args.command,
                  args.reeval_seed if reevaluate else None)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
