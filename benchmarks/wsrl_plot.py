"""Learning curves of WSRL and its baselines, from run folders, as one PNG.

    python -m benchmarks.wsrl_plot runs-wsrl --out results/wsrl-hopper-mr.png --title "..."
    python -m benchmarks.wsrl_plot "WSRL=runs/a" "retain 0.5=runs/b" --out curves.png

Each argument is a run folder or a folder searched (at any depth) for run folders of algos/wsrl.py (a
config.json and a metrics.jsonl), optionally prefixed with `LABEL=` to name every run under it. Without a
label a run is named by its config: "WSRL" (a pre-trained checkpoint, warm-up, no offline data), "retain
offline data <r>" (--offline-ratio r), "no warm-up" (--warmup-steps 0), "SAC from scratch" (--checkpoint
none), joined when several apply. One panel per dataset; per variant and evaluation step the mean over
seeds of the normalized score (the return where a run has no reference scores), shaded by +- one std, the
number of seeds in the legend. The curves are also written as JSON beside the PNG.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def variant(config: dict) -> str:
    """A run's name from its wsrl config."""
    checkpoint = config.get("checkpoint")
    parts = ["SAC from scratch"] if checkpoint is None or str(checkpoint).lower() == "none" else []
    if config.get("offline_ratio", 0.0) > 0:
        parts.append(f"retain offline data {config['offline_ratio']:g}")
    if config.get("warmup_steps", 0) == 0:
        parts.append("no warm-up")
    return ", ".join(parts) or "WSRL"


def is_wsrl_run(path: Path) -> bool:
    config, metrics = path / "config.json", path / "metrics.jsonl"
    return config.exists() and metrics.exists() and "warmup_steps" in json.loads(config.read_text())


def find_runs(path: Path) -> list[Path]:
    """`path` if it is a wsrl run folder, else the wsrl run folders under it (other algorithms' are skipped)."""
    if is_wsrl_run(path):
        return [path]
    return sorted(p.parent for p in path.rglob("metrics.jsonl") if is_wsrl_run(p.parent))


def eval_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray, bool]:
    """(env steps, scores, normalized?) of a run's evaluations, in step order (the last row of a step counts)."""
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed process
            continue
        if "eval/return_mean" in row:
            by_step[int(row["step"])] = row
    steps = sorted(by_step)
    normalized = bool(steps) and all("eval/normalized_score" in by_step[s] for s in steps)
    key = "eval/normalized_score" if normalized else "eval/return_mean"
    return np.array(steps, dtype=np.int64), np.array([by_step[s][key] for s in steps], dtype=np.float64), normalized


def collect(sources: list[str]) -> dict[str, dict[str, list[Path]]]:
    """{dataset: {label: [run folders]}} from `[LABEL=]PATH` arguments."""
    groups: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for source in sources:
        label, _, path = source.partition("=") if "=" in source else ("", "", source)
        runs = find_runs(Path(path))
        if not runs:
            raise SystemExit(f"error: {path}: no wsrl run folders (config.json + metrics.jsonl) found")
        for run_dir in runs:
            config = json.loads((run_dir / "config.json").read_text())
            groups[config.get("dataset", "?")][label or variant(config)].append(run_dir)
    return groups


def curves(groups: dict[str, dict[str, list[Path]]]) -> dict[str, dict[str, dict]]:
    """Per dataset and label: steps, mean, std and seed count at each evaluated step."""
    out: dict[str, dict[str, dict]] = {}
    for dataset, labels in groups.items():
        out[dataset] = {}
        for label, runs in labels.items():
            per_step: dict[int, list[float]] = defaultdict(list)
            normalized = True
            for run_dir in runs:
                steps, scores, norm = eval_curve(run_dir)
                normalized &= norm
                for step, score in zip(steps.tolist(), scores.tolist()):
                    per_step[step].append(score)
            steps = sorted(per_step)
            out[dataset][label] = {"steps": steps, "mean": [float(np.mean(per_step[s])) for s in steps],
                                   "std": [float(np.std(per_step[s])) for s in steps],
                                   "seeds": [len(per_step[s]) for s in steps], "runs": [str(r) for r in runs],
                                   "metric": "normalized score" if normalized else "return"}
    return out


def plot(data: dict[str, dict[str, dict]], out: Path, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4.2), squeeze=False)
    for ax, (dataset, labels) in zip(axes[0], sorted(data.items())):
        for label, curve in sorted(labels.items()):
            steps, mean, std = (np.asarray(curve[k], dtype=np.float64) for k in ("steps", "mean", "std"))
            line, = ax.plot(steps, mean, label=f"{label} ({max(curve['seeds'], default=0)} seeds)")
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        metric = {c["metric"] for c in labels.values()}
        ax.set(title=dataset, xlabel="online env steps", ylabel=" / ".join(sorted(metric)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2))
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wsrl_plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders or folders of them, each optionally LABEL=PATH")
    parser.add_argument("--out", default="wsrl-curves.png", help="the PNG (its curves also go to <out>.json)")
    parser.add_argument("--title", help="figure title")
    args = parser.parse_args(argv)
    data = curves(collect(args.runs))
    plot(data, Path(args.out), args.title)
    for dataset, labels in sorted(data.items()):
        for label, curve in sorted(labels.items()):
            last = (f"{curve['mean'][-1]:.1f} ± {curve['std'][-1]:.1f} at step {curve['steps'][-1]}"
                    if curve["steps"] else "-")
            print(f"{dataset}  {label}: {len(curve['runs'])} runs, last {curve['metric']} {last}")
    print(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
