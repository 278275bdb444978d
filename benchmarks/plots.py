"""Plots of a result table as PNGs: learning curves, aggregate intervals, performance profiles.

    python -m benchmarks.plots runs-bench/hopper-mr --out-dir results/hopper-mr
    python -m benchmarks.table runs-bench/hopper-mr --out results/hopper-mr.md --plots results/hopper-mr  # same, linked

Written into --out-dir:
- curves-<dataset>.png: per dataset, one line per variant: the mean over seeds of training's evaluations
  (metrics.jsonl) against the runs' steps (gradient steps; env steps for online algorithms), with a bootstrap
  95% percentile band of that mean (seeds resampled; with 3 seeds or fewer it is the seeds' range);
- aggregates.png: per variant, IQM, mean and optimality gap of the final scores over all its datasets, with
  rliable's stratified-bootstrap 95% CIs (the numbers of the table's aggregate section);
- profiles.png: performance profiles (rliable's score distributions): the fraction of runs whose final
  score exceeds tau, with 95% CI bands.
All numbers come from benchmarks.table.summarize (fixed bootstrap seed), so a rerun draws the same plots.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from offrl.data.sources import sanitize

METRIC_TITLES = {"iqm": "IQM", "mean": "Mean", "optimality_gap": "Optimality gap"}


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit("plots need matplotlib: pip install -e '.[plots]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Software": None})  # no version stamp: reproducible bytes
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _colors(labels: list[str]) -> dict[str, tuple]:
    """A distinct colour per label: tab10 up to 10 labels, tab20 up to 20 (the grid has 11 variants, and tab10
    wrapped its 11th onto the first's blue), then evenly spaced samples of a continuous map."""
    plt = _pyplot()
    if len(labels) <= 20:
        cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
        return {label: cmap(i) for i, label in enumerate(labels)}
    cmap = plt.get_cmap("turbo")
    return {label: cmap(i / (len(labels) - 1)) for i, label in enumerate(labels)}


def _variants(summary: dict) -> list[str]:
    return sorted({row["variant"] for row in summary["rows"]})


def _metric_name(summary: dict) -> str:
    metrics = sorted({row["metric"] for row in summary["rows"]})
    return metrics[0] if len(metrics) == 1 else "score"


def learning_curves(summary: dict, out_dir: Path) -> list[tuple[str, Path]]:
    """One PNG per dataset: mean over seeds and bootstrap CI band per variant, x = the runs' steps (gradient
    steps; env steps for online algorithms: the table's step_unit)."""
    plt = _pyplot()
    colors = _colors(_variants(summary))
    written = []
    for dataset in sorted({row["dataset"] for row in summary["rows"]}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for row in (r for r in summary["rows"] if r["dataset"] == dataset):
            curve = row.get("curve")
            if not curve or not curve["steps"]:
                continue
            # only the steps every seed of the row evaluated: elsewhere the "mean over seeds" would be some
            # seeds' (runs stopped early evaluate at their own steps, e.g. RCSL once, at its stop)
            full = np.array(curve.get("n", [row["n"]] * len(curve["steps"]))) == row["n"]
            if not full.any():
                continue
            steps = np.array(curve["steps"])[full]
            mean = np.array(curve["mean"], dtype=np.float64)[full]
            low = np.array([np.nan if c[0] is None else c[0] for c in curve["ci"]], dtype=np.float64)[full]
            high = np.array([np.nan if c[1] is None else c[1] for c in curve["ci"]], dtype=np.float64)[full]
            color = colors[row["variant"]]
            ax.plot(steps, mean, color=color, marker="o" if len(steps) < 30 else None, markersize=3,
                    label=f"{row['variant']} ({row['n']} seeds)")
            ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(summary.get("step_unit", "gradient steps"))
        ax.set_ylabel(_metric_name(summary))
        # with 3 seeds a percentile bootstrap's 95% interval is the seeds' range (each extreme is drawn for all
        # three in 3.7% of resamples): the title says so rather than calling it a confidence interval
        ax.set_title(f"{dataset}: mean over seeds at the steps all evaluated;\nband: bootstrap 95% interval "
                     "(the seeds' range at 3 seeds or fewer)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append((f"learning curves on {dataset}", _save(fig, out_dir / f"curves-{sanitize(dataset)}.png")))
    return written


def aggregate_intervals(summary: dict, out_dir: Path) -> tuple[str, Path] | None:
    """IQM, mean and optimality gap per variant with their CIs, one panel per statistic (as rliable's
    plot_interval_estimates)."""
    aggregates = summary["aggregates"]
    if not aggregates:
        return None
    plt = _pyplot()
    metrics = [m for m in METRIC_TITLES if any(m in a for a in aggregates)]
    colors = _colors([a["variant"] for a in aggregates])
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 1.6 + 0.45 * len(aggregates)),
                             squeeze=False, constrained_layout=True)
    for ax, metric in zip(axes[0], metrics):
        for y, agg in enumerate(aggregates):
            if metric not in agg:
                continue
            low, high = agg[metric]["ci"]
            ax.barh(y, high - low, left=low, height=0.6, color=colors[agg["variant"]], alpha=0.75)
            ax.vlines(agg[metric]["point"], y - 0.3, y + 0.3, color="black", linewidth=1.5)
        ax.set_yticks(range(len(aggregates)))
        ax.set_yticklabels([f"{a['variant']} ({len(a['datasets'])} datasets)" for a in aggregates]
                           if ax is axes[0][0] else [])
        ax.set_ylim(-0.6, len(aggregates) - 0.4)
        ax.invert_yaxis()
        ax.set_title(METRIC_TITLES[metric], fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    st = summary["statistics"]
    title = f"final scores over datasets; 95% CIs ({st['reps']} stratified bootstrap replicates)"
    if len({tuple(a["datasets"]) for a in aggregates}) > 1:  # as the table says below its aggregates
        title += "\nthe variants cover different datasets: their aggregates do not compare"
    fig.suptitle(title, fontsize=9)
    fig.supxlabel(_metric_name(summary), fontsize=9)
    return "aggregate IQM, mean and optimality gap with 95% CIs", _save(fig, out_dir / "aggregates.png")


def performance_profiles(summary: dict, out_dir: Path) -> tuple[str, Path] | None:
    profiles = summary.get("performance_profiles")
    if not profiles or not profiles["variants"]:
        return None
    plt = _pyplot()
    taus = np.array(profiles["taus"])
    colors = _colors(list(profiles["variants"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, entry in profiles["variants"].items():
        values = np.array(entry["fraction_above"])
        ci = np.array(entry["ci"])
        ax.plot(taus, values, color=colors[label], label=label)
        ax.fill_between(taus, ci[:, 0], ci[:, 1], color=colors[label], alpha=0.2, linewidth=0)
    ax.set_xlabel(f"{_metric_name(summary)} (tau)")
    ax.set_ylabel("fraction of runs with final score > tau")
    ax.set_ylim(-0.02, 1.02)
    datasets = {tuple(a["datasets"]) for a in summary.get("aggregates", []) if a["variant"] in profiles["variants"]}
    ax.set_title("performance profiles, 95% CI bands" + ("\n(the variants cover different datasets: their runs do not "
                 "compare)" if len(datasets) > 1 else ""), fontsize=9 if len(datasets) > 1 else 10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return "performance profiles", _save(fig, out_dir / "profiles.png")


def write_plots(summary: dict, out_dir: Path) -> list[tuple[str, Path]]:
    """All plots of a table summary (benchmarks.table.summarize with curves and profiles) into out_dir;
    returns [(caption, path)]."""
    out_dir = Path(out_dir)
    written = learning_curves(summary, out_dir)
    written += [p for p in (aggregate_intervals(summary, out_dir), performance_profiles(summary, out_dir)) if p]
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    from benchmarks import stats, table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", type=Path, nargs="+", help="sweep folders: <out-dir>/<name>")
    parser.add_argument("--out-dir", type=Path, required=True, help="folder for the PNGs")
    parser.add_argument("--metric", action="append", default=None,
                        help="final.json / metrics.jsonl key (repeatable; default eval/normalized_score)")
    parser.add_argument("--reps", type=int, default=stats.REPS, help="bootstrap replicates of every CI")
    parser.add_argument("--bootstrap-seed", type=int, default=stats.SEED)
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")
    for root in args.roots:
        if not root.is_dir():
            print(f"note: {root} is not a folder: left out", file=sys.stderr)
    groups = table.collect([root for root in args.roots if root.is_dir()], args.metric)
    if not groups:
        raise table.no_finished_runs(args.metric, args.roots)
    summary = table.summarize(groups, "plots", None, reps=args.reps, seed=args.bootstrap_seed, profiles=True,
                              curves=True)
    written = write_plots(summary, args.out_dir)
    for _, path in written:
        print(path)
    return [path for _, path in written]


if __name__ == "__main__":
    main()
