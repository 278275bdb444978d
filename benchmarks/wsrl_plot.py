"""Learning curves of WSRL and its baselines, from run folders, as one PNG.

    python -m benchmarks.wsrl_plot runs-wsrl --out results/wsrl-hopper-mr.png --title "..."
    python -m benchmarks.wsrl_plot "WSRL=runs/a" "retain 0.5=runs/b" --out curves.png

Each argument is a run folder or a folder searched (at any depth) for run folders of algos/wsrl.py (a
config.json and a metrics.jsonl), optionally prefixed with `LABEL=` to name every run under it. Without a
label a run is named by its config: "WSRL" (a pre-trained checkpoint, warm-up, no offline data), "retain
offline data <r>" (--offline-ratio r), "no warm-up" (--warmup-steps 0), "SAC from scratch" (--checkpoint
none), joined when several apply. One panel per dataset; per variant the mean over seeds of the normalized
score (the return where a run has no reference scores) at each step every seed evaluated, shaded by +- one
std, the number of seeds in the legend. The curves are also written as JSON beside the PNG.

`--markdown PATH` writes, per dataset and variant, what the WSRL paper's claims are checked on: the score at
env step 0 (the pre-trained policy, before any online step), the lowest score in the first `--dip-window` env
steps after the run's updates begin (the dip that fine-tuning without retained data suffers at its start) and
the start minus it, and the last score, as mean ± std over seeds. Below the table, the checks: WSRL's last
score against its start and against SAC from scratch's last (both runs' last evaluations at one env step), and WSRL's
dip against the dip without warm-up. A check is made only on runs that reached their budget (for the dip: ran
past its window) and, between two variants, on the same seeds; else it says what is missing. Each says in how
many seeds it holds; the dip's is met only when it holds for the mean and for every seed. Beside them, as context and not as a claim, the pre-training's level: the
mean of the pre-training run's last 10 evaluations up to the checkpoint fine-tuned (read from the folder the
run's --checkpoint names), for a policy whose evaluations swing from one to the next, so that the start, one
evaluation, is a single draw from that swing.

`--last-evals K` makes "last" (in the table and the checks on it) the mean of each run's last K evaluations,
with the final evaluation alone in a column beside it: a fine-tuned policy's deterministic evaluations swing
from one to the next, so one is a single draw (default 1: the last evaluation, as the committed tables made
before the option). `--context-dip-window W` adds, below the dip check and as context only, the dips within W
env steps after the updates begin, once every seed's run got past them (else it names the seeds short of them).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from offrl.logging import read_metrics


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
    if not (config.exists() and metrics.exists()):
        return False
    try:
        return "warmup_steps" in json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: run folder {path}: cannot read its config.json ({type(e).__name__}: {e}); mend or "
                         "move the folder aside") from None


def find_runs(path: Path) -> list[Path]:
    """`path` if it is a wsrl run folder, else the wsrl run folders under it (other algorithms' are skipped, and
    the folders a sweep set aside as `<run>.unstarted-<k>`: a run stopped before its first checkpoint, started
    again in its own folder)."""
    from benchmarks.sweep import UNSTARTED

    if is_wsrl_run(path):
        return [path]
    return sorted(p.parent for p in path.rglob("metrics.jsonl")
                  if is_wsrl_run(p.parent) and UNSTARTED not in p.parent.name)


def eval_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray, bool]:
    """(env steps, scores, normalized?) of a run's evaluations, in step order (the last row of a step counts). A last
    line cut off by a killed process is left out; a damaged line before it stops with the line named."""
    try:
        rows = read_metrics(run_dir / "metrics.jsonl")
    except ValueError as e:
        raise SystemExit(f"error: {e}; mend or move the run folder aside") from None
    by_step: dict[int, dict] = {}
    for row in rows:
        if "eval/return_mean" in row:
            by_step[int(row["step"])] = row
    steps = sorted(by_step)
    normalized = bool(steps) and all("eval/normalized_score" in by_step[s] for s in steps)
    key = "eval/normalized_score" if normalized else "eval/return_mean"
    return np.array(steps, dtype=np.int64), np.array([by_step[s][key] for s in steps], dtype=np.float64), normalized


def learning_start(config: dict) -> int:
    """The env step a wsrl run's updates begin at (algos/wsrl.py's rule, from its saved config)."""
    from algos import wsrl

    names = ("warmup_steps", "batch_size", "utd", "offline_ratio")
    return wsrl.learning_starts(wsrl.Config(**{k: config[k] for k in names if k in config}))


PRETRAINING_EVALUATIONS = 10
"""How many of the pre-training's last evaluations its level averages."""


def pretraining_level(run_dir: Path, config: dict) -> float | None:
    """The mean of the pre-training run's last PRETRAINING_EVALUATIONS evaluations at or before the step of the
    checkpoint this run fine-tuned (as its final.json records it; for a run not yet finished, the pre-training's
    last evaluations whatever their step); None for a run from scratch or when that run folder or its metrics
    are not found (e.g. a relative --checkpoint from another working directory)."""
    checkpoint = config.get("checkpoint")
    if checkpoint is None or str(checkpoint).lower() == "none":
        return None
    from algos import wsrl

    folder = Path(wsrl.pretrained_path(str(checkpoint), config.get("seed", 0)))
    if folder.is_file():  # <run folder>/checkpoints/<file>
        folder = folder.parent.parent
    if not (folder / "metrics.jsonl").exists():
        return None
    steps, scores, _ = eval_curve(folder)
    final = run_dir / "final.json"
    step = json.loads(final.read_text()).get("pretrained", {}).get("step") if final.exists() else None
    if step is not None:
        scores = scores[steps <= step]
    return float(scores[-PRETRAINING_EVALUATIONS:].mean()) if len(scores) else None


def run_summary(run_dir: Path, dip_window: int, last_evals: int = 1, context_window: int | None = None) -> dict | None:
    """Start (step 0), lowest in the dip window after updates begin, dip, last, and the pre-training's level;
    whether the run reached its budget (`finished`) and ran past its dip window (`window_done`); None without a
    step-0 score. The window is the evaluations after the step updates begin at (that step's evaluation is
    still the frozen policy's: the first update comes with the next env step)."""
    steps, scores, _ = eval_curve(run_dir)
    if len(steps) == 0 or steps[0] != 0:
        return None
    config = json.loads((run_dir / "config.json").read_text())
    begin = learning_start(config)
    window = scores[(steps > begin) & (steps <= begin + dip_window)]
    lowest = float(window.min()) if len(window) else float("nan")
    wide = scores[(steps > begin) & (steps <= begin + (context_window or dip_window))]
    budget = config.get("steps")
    # "last": the mean of the last `last_evals` evaluations (1: the last one alone); a fine-tuned policy's
    # deterministic evaluations swing from one to the next, so a single one is one draw from that swing
    return {"seed": int(config.get("seed", 0)), "start": float(scores[0]), "lowest": lowest,
            "dip": float(scores[0]) - lowest, "last": float(scores[-last_evals:].mean()),
            "final": float(scores[-1]), "last_step": int(steps[-1]),
            "context_dip": float(scores[0]) - float(wide.min()) if len(wide) else float("nan"),
            "updates_begin": begin, "finished": budget is None or int(steps[-1]) >= int(budget),
            "window_done": int(steps[-1]) >= begin + dip_window and len(window) > 0,
            "window_empty": int(steps[-1]) >= begin + dip_window and not len(window),
            "context_done": int(steps[-1]) >= begin + (context_window or dip_window),
            "pretraining": pretraining_level(run_dir, config)}


def summaries(groups: dict[str, dict[str, list[Path]]], dip_window: int, last_evals: int = 1,
              context_window: int | None = None) -> dict[str, dict[str, dict]]:
    """Per dataset and label: each quantity of `run_summary` as mean, std and n over the runs that have it."""
    out: dict[str, dict[str, dict]] = {}
    for dataset, labels in groups.items():
        out[dataset] = {}
        for label, runs in labels.items():
            rows = [r for r in (run_summary(run, dip_window, last_evals, context_window) for run in runs)
                    if r is not None]
            stats: dict = {k: {"mean": float(np.mean([r[k] for r in rows])), "std": float(np.std([r[k] for r in rows])),
                               "n": len(rows)} for k in ("start", "lowest", "dip", "last", "final", "context_dip")
                           } if rows else {}
            levels = [r["pretraining"] for r in rows if r["pretraining"] is not None]
            if levels:
                stats["pretraining"] = {"mean": float(np.mean(levels)), "std": float(np.std(levels)), "n": len(levels)}
            stats["last_steps"] = sorted({r["last_step"] for r in rows})
            stats["updates_begin"] = sorted({r["updates_begin"] for r in rows})
            stats["runs"] = rows
            out[dataset][label] = stats
    return out


def checks(labels: dict[str, dict], last_evals: int = 1, context_window: int | None = None) -> list[str]:
    """The paper's claims on one dataset's summaries, as sentences with their numbers (where the variants ran):
    on finished runs (for the dip: runs past their window) and, between variants, on the same seeds. "Last" is
    the mean of the last `last_evals` evaluations; `context_window` adds the dips within that many env steps
    as context, not a claim."""
    last_is = "last score" if last_evals == 1 else f"last-{last_evals} mean"
    runs = {label: {r["seed"]: r for r in stats.get("runs", [])} for label, stats in labels.items()}

    def missing(label, done="finished"):
        if done == "window_done" and (empty := sorted(seed for seed, r in runs[label].items() if r["window_empty"])):
            return (f"{label}'s seeds {empty} have no evaluation in the dip window (--dip-window shorter than the "
                    "runs' evaluation period)")
        short = sorted(seed for seed, r in runs[label].items() if not r[done])
        what = "short of their budget" if done == "finished" else "not past the dip window"
        return f"{label}'s seeds {short} are {what}" if short else None

    def paired(a, b, done="finished"):
        """The reason the check cannot be made, or None."""
        reasons = [m for m in (missing(a, done), missing(b, done)) if m]
        if set(runs[a]) != set(runs[b]):
            reasons.append(f"the seeds differ ({a}: {sorted(runs[a])}, {b}: {sorted(runs[b])})")
        elif done == "finished" and (steps := {r["last_step"] for label in (a, b) for r in runs[label].values()}) \
                and len(steps) > 1:  # "at the same env steps": the last evaluations must be at one step
            reasons.append(f"their last evaluations are at different env steps ({sorted(steps)})")
        return "; ".join(reasons) or None

    def mean(label, key):
        return float(np.mean([r[key] for r in runs[label].values()]))

    def verdict(ok):
        return "met" if ok else "NOT met"

    lines = []
    if not runs.get("WSRL"):
        return lines
    n = len(runs["WSRL"])
    if (reason := missing("WSRL")) is not None:
        lines.append(f"last >= start: not assessed ({reason})")
    else:
        last, start = mean("WSRL", "last"), mean("WSRL", "start")
        held = sum(r["last"] >= r["start"] for r in runs["WSRL"].values())
        lines.append(f"WSRL's {last_is} {last:.1f} vs its start {start:.1f}: {verdict(last >= start)} (last >= start; "
                     f"in {held} of {n} seeds)")
    if runs.get("SAC from scratch"):
        if (reason := paired("WSRL", "SAC from scratch")) is not None:
            lines.append(f"WSRL >= scratch: not assessed ({reason})")
        else:
            last, scratch = mean("WSRL", "last"), mean("SAC from scratch", "last")
            held = sum(runs["WSRL"][seed]["last"] >= r["last"] for seed, r in runs["SAC from scratch"].items())
            lines.append(f"WSRL's {last_is} {last:.1f} vs SAC from scratch's {scratch:.1f}: {verdict(last >= scratch)} "
                         f"(WSRL >= scratch; in {held} of {n} seeds)")
    if runs.get("no warm-up"):
        if (reason := paired("WSRL", "no warm-up", "window_done")) is not None:
            lines.append(f"dip with warm-up < without: not assessed ({reason})")
        else:
            dip, without = mean("WSRL", "dip"), mean("no warm-up", "dip")
            held = sum(runs["WSRL"][seed]["dip"] < r["dip"] for seed, r in runs["no warm-up"].items())
            lines.append(f"dip with warm-up {dip:.1f} vs without {without:.1f}: {verdict(dip < without and held == n)} "
                         f"(with < without, for the mean and in every seed: in {held} of {n})")
            short = [seed for label in ("WSRL", "no warm-up") for seed, r in runs[label].items() if not r["context_done"]]
            if context_window and short:  # a dip over part of the window would read as one over all of it
                lines.append(f"context, not a claim: the {context_window}-step context window is not past in "
                             f"seeds {sorted(set(short))}")
            elif context_window:
                wide, wide_without = mean("WSRL", "context_dip"), mean("no warm-up", "context_dip")
                lines.append(f"context, not a claim: within {context_window} env steps after the updates begin, the "
                             f"dip with warm-up {wide:.1f} vs without {wide_without:.1f}")
    level = labels["WSRL"].get("pretraining", {}).get("mean")
    if level is not None:
        lines.append(f"context, not a claim: WSRL's {last_is} {mean('WSRL', 'last'):.1f} vs the pre-training's level "
                     f"{level:.1f} (the mean of its last {PRETRAINING_EVALUATIONS} evaluations up to the checkpoint; the "
                     "start is the checkpoint's one evaluation)")
    return lines


def markdown(data: dict[str, dict[str, dict]], dip_window: int, title: str | None, command: str | None,
             last_evals: int = 1, context_window: int | None = None) -> str:
    def cell(stats, key):
        return f"{stats[key]['mean']:.1f} ± {stats[key]['std']:.1f}" if key in stats else "-"

    out = [f"# {title}" if title else "# Online fine-tuning: start, dip and last score", ""]
    if command:
        out += ["Made by:", "", "```", command, "```", ""]
    last_is = ("the last evaluation" if last_evals == 1 else
               f"the mean of the last {last_evals} evaluations, which the checks below use (final = the last one "
               "alone: a fine-tuned policy's evaluations swing from one to the next)")
    out += [f"Per run: start = the score at env step 0 (before any online step); lowest = the lowest evaluation "
            f"in the {dip_window} env steps after the run's updates begin; dip = start - lowest; last = {last_is}; "
            f"pre-training level = the mean of the pre-training run's last {PRETRAINING_EVALUATIONS} "
            "evaluations up to the checkpoint fine-tuned (context, not a claim). Mean ± std over seeds (n).", ""]
    for dataset, labels in sorted(data.items()):
        last_head = "last" if last_evals == 1 else f"last {last_evals} (mean) | final"
        out += [f"## {dataset}", "",
                f"| variant | n | updates begin (env step) | start | lowest | dip | {last_head} | last at env step "
                "| pre-training level |",
                "|---|---|---|---|---|---|---|---|---|" + ("---|" if last_evals > 1 else "")]
        for label, stats in sorted(labels.items()):
            n = stats.get("start", {}).get("n", 0)
            last = cell(stats, "last") + ("" if last_evals == 1 else f" | {cell(stats, 'final')}")
            out.append(f"| {label} | {n} | {', '.join(map(str, stats['updates_begin']))} | {cell(stats, 'start')} "
                       f"| {cell(stats, 'lowest')} | {cell(stats, 'dip')} | {last} "
                       f"| {', '.join(map(str, stats['last_steps']))} | {cell(stats, 'pretraining')} |")
        out += ["", *(f"- {line}" for line in checks(labels, last_evals, context_window)), ""]
    return "\n".join(out)


def collect(sources: list[str]) -> dict[str, dict[str, list[Path]]]:
    """{dataset: {label: [run folders]}} from `[LABEL=]PATH` arguments."""
    groups: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    seen: dict[tuple[str, str, int], Path] = {}  # a seed in two folders would count twice in n, means and checks
    for source in sources:
        label, _, path = source.partition("=") if "=" in source else ("", "", source)
        runs = find_runs(Path(path))
        if not runs:
            raise SystemExit(f"error: {path}: no wsrl run folders (config.json + metrics.jsonl) found")
        for run_dir in runs:
            config = json.loads((run_dir / "config.json").read_text())
            dataset, row = config.get("dataset", "?"), label or variant(config)
            key = (dataset, row, int(config.get("seed", 0)))
            if key in seen:
                raise SystemExit(f"error: seed {key[2]} of {row} on {dataset} has two run folders, {seen[key]} and "
                                 f"{run_dir}: keep one")
            seen[key] = run_dir
            groups[dataset][row].append(run_dir)
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
            # only the steps every run evaluated: a mean over fewer seeds where one run is short would be another
            # curve under the same label
            steps = sorted(step for step, scores in per_step.items() if len(scores) == len(runs))
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
        fig.suptitle(title, fontsize=10 if len(data) == 1 else 12, wrap=True)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2))
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wsrl_plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders or folders of them, each optionally LABEL=PATH")
    parser.add_argument("--out", default="wsrl-curves.png", help="the PNG (its curves also go to the same name with .json)")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--markdown", help="also write the start / dip / last table and the checks here")
    parser.add_argument("--dip-window", type=int, default=5000,
                        help="env steps after a run's updates begin in which its dip is looked for")
    parser.add_argument("--last-evals", type=int, default=1,
                        help="'last' = the mean of a run's last this many evaluations (1: the last one alone)")
    parser.add_argument("--context-dip-window", type=int, default=None,
                        help="also give, as context, the dips within this many env steps after the updates begin")
    parser.add_argument("--command", help="the command that made the runs, for the markdown's caption")
    args = parser.parse_args(argv)
    if args.last_evals < 1:
        parser.error("--last-evals must be at least 1")
    if args.dip_window < 1 or (args.context_dip_window is not None and args.context_dip_window < 1):
        parser.error("--dip-window and --context-dip-window must be at least 1 env step")
    if args.markdown:  # before the plot is written: one output, not half of them
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    groups = collect(args.runs)
    data = curves(groups)
    plot(data, Path(args.out), args.title)
    if args.markdown:
        summary = summaries(groups, args.dip_window, args.last_evals, args.context_dip_window)
        Path(args.markdown).write_text(markdown(summary, args.dip_window, args.title, args.command, args.last_evals,
                                                args.context_dip_window))
        print(f"wrote {args.markdown}")
    for dataset, labels in sorted(data.items()):
        for label, curve in sorted(labels.items()):
            last = (f"{curve['mean'][-1]:.1f} ± {curve['std'][-1]:.1f} at step {curve['steps'][-1]}"
                    if curve["steps"] else "-")
            print(f"{dataset}  {label}: {len(curve['runs'])} runs, last {curve['metric']} {last}")
    print(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
