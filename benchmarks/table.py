"""Result tables from run folders: one row per (variant, dataset), over seeds, as markdown and JSON.

    python -m benchmarks.table runs-bench/hopper-mr --out results/hopper-mr.md --title "..." \\
        --command "python -m benchmarks.sweep ..." --json results/hopper-mr.json --plots results/hopper-mr

For every run folder with a final.json: the last evaluation's normalized score (final) and the best
one over training (best, from metrics.jsonl). Per group: mean ± std over seeds of last and best, and
the IQM of the seeds' last scores with a 95% confidence interval. Below it, per variant over all its
datasets: IQM, mean and optimality gap with stratified-bootstrap 95% CIs. A run folder that a NaN/inf
stopped (diverged.json, no final.json) has no score: the table lists it in a section of its own and its
row's seeds cell counts it ("2 (+1 diverged)"), and a run whose final.json records a failure (MBRCSL without
a kept rollout: its behaviour policy's scores, no RCSL score) is named on stderr for each metric it lacks, so a
missing seed is never silent. The statistics come from
rliable (benchmarks/stats.py: the optional extra `.[stats]`) with a fixed number of bootstrap
replicates (--reps) and a fixed seed (--bootstrap-seed), so the same run folders give the same table,
byte for byte. The caption states seeds, steps, evaluation episodes, hardware and package versions,
read from the runs themselves, and the date the last run finished (not the date of rendering).

--json writes the same numbers (plus per-seed scores, learning curves and performance profiles) as
JSON; --plots DIR draws learning curves, aggregate intervals and performance profiles as PNGs into DIR
(benchmarks/plots.py) and links them from the table.

With --reevaluate N the final column is instead each run's final checkpoint evaluated again with N
episodes from reset seed --reeval-seed (`offrl eval`; cached in the run folder as
reeval-<N>ep-seed<S>.json), for a more precise final score than training's few evaluation episodes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import stats
from offrl.checkpoint import DIVERGED_FILE, diverged, run_checkpoint
from offrl.logging import read_metrics


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


def no_finished_runs(metrics: list[str] | None, roots: list[Path], filtered: bool = False) -> SystemExit:
    """The error for sweep folders with nothing to tabulate (or a mistyped --metric)."""
    return SystemExit(f"error: no finished run with {', '.join(metrics or ['eval/normalized_score'])} under "
                      f"{', '.join(map(str, roots))}{' (after --variants/--datasets)' if filtered else ''}")


def damaged_records(run_dir: Path, error: Exception) -> SystemExit:
    """The one error line for a run folder whose records cannot be read (benchmarks.table, rollout_counts)."""
    return SystemExit(f"error: run folder {run_dir}: cannot read its records ({type(error).__name__}: {error}); "
                      "mend or move the folder aside")


def read_records(run_dir: Path) -> tuple[dict, list[dict], dict, dict, dict | None]:
    """(final.json, metrics rows, config.json, environment.json, dataset.json or None) of a finished run; a
    damaged or missing record stops with its folder named."""
    try:
        data_record = run_dir / "dataset.json"  # the checksum of the data the run trained on (offrl.run)
        final, config = (json.loads((run_dir / name).read_text()) for name in ("final.json", "config.json"))
        records = (final, read_metrics(run_dir / "metrics.jsonl"), config,
                   json.loads((run_dir / "environment.json").read_text()),
                   json.loads(data_record.read_text()) if data_record.exists() else None)
        missing = [key for key in ("seed", "steps", "algo", "dataset") if key not in final]
        if missing:
            raise KeyError(f"final.json lacks {missing}")
        for section, key in (("eval", "episodes"), ("run", None)):
            if not isinstance(config.get(section), dict) or (key is not None and key not in config[section]):
                raise KeyError(f"config.json lacks {section}{'.' + key if key else ''}")
        scores = [(row.get("step"), name, value) for row in records[1] for name, value in row.items()
                  if "/" in name and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)))]
        if scores:  # a hand-edited or damaged record would otherwise stop max() or the statistics with a traceback
            step, name, value = scores[0]
            raise TypeError(f"metrics.jsonl has {name} = {value!r} at step {step}, not a number")
        return records
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise damaged_records(run_dir, e) from None


def read_run(run_dir: Path, metric: str = "eval/normalized_score", reevaluate: tuple[int, int] | None = None) -> dict | None:
    """One finished run's numbers (None when it has no final.json)."""
    if not (run_dir / "final.json").exists():
        return None
    final, rows, config, env, data = read_records(run_dir)
    evals = [r[metric] for r in rows if metric in r]
    curve = {r["step"]: r[metric] for r in rows if metric in r and "step" in r}  # a redone step keeps its last value
    times = [r["time"] for r in rows if "time" in r]
    data_checksum = data.get("checksum") if data is not None else None
    ref_scores = (data.get("ref_min_score"), data.get("ref_max_score")) if data is not None else None
    final_score, episodes = final.get(metric), config["eval"]["episodes"]
    wall = final.get("wall_seconds")
    if "resumes" not in final and env.get("resumes"):
        wall = None  # written before offrl kept the wall time over resumes: only the last process's time
    if reevaluate is not None and final_score is not None:
        episodes = reevaluate[0]
        prefix, key = metric.split("/", 1)
        final_score = reevaluated(run_dir, *reevaluate)["results"][prefix][key]
    return {"final": final_score, "best": max(evals, default=final.get(metric)), "metric": metric,
            "seed": final["seed"], "steps": final["steps"], "stopped_at": final.get("stopped_at_step"),
            "episodes": episodes, "train_episodes": config["eval"]["episodes"],
            "precision": config["run"].get("precision", "fp32"), "threads": config["run"].get("threads"),
            "algo": final["algo"], "dataset": final["dataset"], "env": env, "wall": wall, "run_dir": str(run_dir),
            "curve": sorted(curve.items()), "finished": max(times, default=None), "data_checksum": data_checksum,
            "ref_scores": ref_scores,
            "failed": final.get("failed"), "dynamics_model": final.get("dynamics_model"),
            "model_based": "model_file" in final}


def collect(roots: Path | list[Path], metrics: list[str] | None = None,
            reevaluate: tuple[int, int] | None = None, variants: list[str] | None = None,
            datasets: list[str] | None = None) -> dict[tuple[str, str], list[dict]]:
    """{(row label, dataset): [run, ...]} for run folders <root>/<label>/<algo>/<dataset>/<run>/ of one or
    more sweep folders; with several metrics (e.g. RCSL's per-target scores) each gets its own row,
    labelled 'variant [metric]'. `variants` / `datasets` keep only runs of those variant labels / dataset
    ids (e.g. a few of a large sweep's rows beside a small study's)."""
    metrics = metrics or ["eval/normalized_score"]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    seen: dict[tuple[str, str, str, int], Path] = {}  # (label, metric, dataset, seed) -> its run folder
    for label, final in finished_runs(roots, variants, datasets):
        for metric in metrics:
            run = read_run(final.parent, metric, reevaluate)
            # no score, but not silently left out: a failed run, or one that logged the metric and has none at the
            # end (not a variant that never logs it, e.g. BC beside DT's per-target metrics)
            if run is not None and run["final"] is None and (run["failed"] or run["best"] is not None):
                why = f"failed ({run['failed']})" if run["failed"] else "finished"
                print(f"note: {final.parent} {why}: no {metric} in its final.json, not in that row", file=sys.stderr)
            if run is not None and run["final"] is not None:
                key = (label, metric, run["dataset"], run["seed"])
                if key in seen:  # a seed run twice (e.g. again by hand into a second folder) would count twice
                    raise SystemExit(f"error: seed {run['seed']} of {label} on {run['dataset']} has two run folders, "
                                     f"{seen[key]} and {final.parent}: keep one")
                seen[key] = final.parent
                row = label if len(metrics) == 1 else f"{label} [{metric.removesuffix('/normalized_score')}]"
                groups[(row, run["dataset"])].append({**run, "variant": label})
    return groups


def finished_runs(roots: Path | list[Path], variants: list[str] | None = None, datasets: list[str] | None = None):
    """(variant label, final.json) of the finished runs under sweep folders <root>/<label>/<algo>/<dataset>/<run>/,
    of those labels / dataset ids (all when None), in path order; a folder reached through two roots counts once."""
    roots = [roots] if isinstance(roots, Path) else roots
    finals = sorted({final.resolve(): (root, final) for root in roots
                     for final in root.glob("*/*/*/*/final.json")}.values(), key=lambda rf: str(rf[1]))
    for root, final in finals:
        label = final.parent.relative_to(root).parts[0]
        if variants is not None and label not in variants:
            continue
        if datasets is not None:
            try:
                dataset = json.loads(final.read_text())["dataset"]
            except (OSError, ValueError, KeyError, TypeError) as e:  # as read_records says it
                raise damaged_records(final.parent, e) from None
            if dataset not in datasets:
                continue
        yield label, final


def collect_diverged(roots: Path | list[Path], variants: list[str] | None = None,
                     datasets: list[str] | None = None) -> list[dict]:
    """The run folders a NaN/inf stopped (a diverged.json and no final.json), in the layout `collect` reads:
    they have no score, so a table lists them rather than counting fewer seeds without saying why."""
    from benchmarks.sweep import UNSTARTED

    roots = [roots] if isinstance(roots, Path) else roots
    markers = sorted({m.resolve(): (root, m) for root in roots for m in root.glob(f"*/*/*/*/{DIVERGED_FILE}")}.values(),
                     key=lambda rm: str(rm[1]))
    out = []
    for root, marker in markers:
        run_dir = marker.parent
        if (run_dir / "final.json").exists():
            continue  # finished after a retry that kept an old marker: its score counts
        if UNSTARTED in run_dir.name:  # set aside by a sweep's --retry-diverged, which ran the seed again
            continue
        label = run_dir.relative_to(root).parts[0]
        try:
            config = json.loads((run_dir / "config.json").read_text())
            run_label = config.get("dataset") or config.get("env_id", "run")  # as final.json's (RunConfigBase.run_label)
            seed, steps = config["seed"], config["steps"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise damaged_records(run_dir, e) from None
        if (variants is not None and label not in variants) or (datasets is not None and run_label not in datasets):
            continue
        stop = diverged(run_dir) or {}
        out.append({"variant": label, "dataset": run_label, "seed": seed, "steps": steps,
                    "step": stop.get("step"), "metrics": stop.get("metrics", []), "value": stop.get("value"),
                    "last_checkpoint_step": stop.get("last_checkpoint_step"), "run_dir": str(run_dir)})
    return out


def machine_of(env: dict, cpu_model: bool = False) -> str:
    """Where a run ran, from its environment.json: processor (with `cpu_model`, its model name and whether it
    multiplies bfloat16 natively), cores, device (and GPU), package versions."""
    device = env.get("device")
    if env.get("cuda_device"):
        device = f"{device} ({env['cuda_device']})"
    processor = env.get("processor")
    if cpu_model:
        processor = f"{env['cpu_model']} ({processor}{', native bfloat16' if env.get('cpu_native_bf16') else ''})"
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if k in ("torch", "gymnasium", "mujoco", "minari"))
    return f"{processor}, {env.get('cpu_count')} cores, device {device}; {packages}"


def _number(x: float | None) -> float | None:
    """JSON has no NaN: a missing value is null."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _by_seed(runs: list[dict]) -> list[dict]:
    """A group's runs in a fixed order (seed, folder), whatever order the roots were given in: the bootstrap
    resamples positions, so its CI must not depend on the order the runs were found."""
    return sorted(runs, key=lambda r: (r["seed"], r["run_dir"]))


def _is_normalized(runs: list[dict]) -> bool:
    return all(r.get("metric", "eval/normalized_score").endswith("normalized_score") for r in runs)


def curve_of(runs: list[dict], reps: int, seed: int) -> dict:
    """A row's learning curve over training's evaluations: per gradient step the mean over the seeds
    evaluated there and a bootstrap 95% CI of that mean (stats.mean_band)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for step, value in run.get("curve", []):
            if value is not None:
                by_step[int(step)].append(float(value))
    steps = sorted(by_step)
    mean, low, high = stats.mean_band([np.array(by_step[s]) for s in steps], reps, seed)
    return {"steps": steps, "n": [len(by_step[s]) for s in steps], "mean": [_number(x) for x in mean],
            "ci": [[_number(a), _number(b)] for a, b in zip(low, high)]}


def aggregate_scores(groups: dict) -> dict[str, dict]:
    """Per row label, its final scores as a (runs, datasets) array for rliable: each dataset's runs in seed
    order, cut to the smallest seed count among its datasets (a stratified bootstrap needs as many runs in
    every column)."""
    by_label: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for (label, dataset), runs in groups.items():
        by_label[label][dataset] = _by_seed(runs)
    out = {}
    for label in sorted(by_label):
        datasets = sorted(by_label[label])
        counts = [len(by_label[label][d]) for d in datasets]
        n = min(counts)
        scores = np.array([[r["final"] for r in by_label[label][d][:n]] for d in datasets], dtype=np.float64).T
        out[label] = {"datasets": datasets, "runs_per_dataset": n, "runs_found": counts, "scores": scores,
                      "normalized": all(_is_normalized(by_label[label][d]) for d in datasets)}
    return out


def differing_data(groups: dict) -> dict[str, dict]:
    """{dataset id: {"reference": checksum or None, "checksums": {checksum: [row labels]}}} for the dataset ids
    whose runs trained on data of more than one checksum (e.g. a suite dataset that a CPU did not regenerate
    bit for bit); the reference is offrl's committed checksum of a suite dataset."""
    from offrl.data.suite import reference_checksums

    # suite ids only: a D4RL file's checksum is of the rows as loaded, which DT's trajectories and the
    # Q-learners' transitions make differently from one file; a run that recorded none is left out
    references = reference_checksums()
    by_dataset: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for (label, dataset), rs in groups.items():
        for r in rs:
            if dataset in references and r.get("data_checksum"):
                by_dataset[dataset][r["data_checksum"]].add(label)
    return {dataset: {"reference": references.get(dataset),
                      "checksums": {c: sorted(labels) for c, labels in sorted(sums.items())}}
            for dataset, sums in sorted(by_dataset.items()) if len(sums) > 1}


def differing_reference_scores(groups: dict) -> dict[str, list[dict]]:
    """{dataset id: [{"ref_min_score", "ref_max_score", "rows"}, ...]} for the dataset ids whose runs normalized
    their scores with more than one pair of reference returns (their dataset.json's; a dataset made again on another
    machine measures its random and expert returns again): such rows' normalized scores are on different scales."""
    by_dataset: dict[str, dict[tuple, set[str]]] = defaultdict(lambda: defaultdict(set))
    for (label, dataset), rs in groups.items():
        for r in rs:
            if r.get("ref_scores") is not None:
                by_dataset[dataset][r["ref_scores"]].add(label)
    return {dataset: [{"ref_min_score": low, "ref_max_score": high, "rows": sorted(labels)}
                      for (low, high), labels in sorted(pairs.items(), key=lambda kv: str(kv[0]))]
            for dataset, pairs in sorted(by_dataset.items()) if len(pairs) > 1}


def dynamics_models(groups: dict, machine_keys: dict[str, str] | None = None) -> dict:
    """The dynamics models the model-based rows rolled out, from their runs' final.json records
    (world_models.train.model_record): one entry per dataset and model file hash, with the rows that used it,
    and per dataset the runs that recorded no model (made before offrl recorded it). Empty without such runs.
    With `machine_keys` (the table's machines, description -> key, as hardware_of describes them), a model
    trained on one of them gets its key ('machine_key'; None for another machine)."""
    names_cpu = names_cpu_models([r for rs in groups.values() for r in rs])
    models: dict[tuple[str, str], dict] = {}
    unrecorded: dict[str, int] = defaultdict(int)
    for (label, dataset), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for r in _by_seed(rs):
            record = r.get("dynamics_model")
            if record is None:
                unrecorded[dataset] += bool(r.get("model_based"))
                continue
            # a model whose file was not read (replaced since, missing, not offrl's): known by its hold-out errors
            key = (dataset, record.get("sha256") or tuple(record["holdout_mse"]))
            if key not in models:
                training = record.get("training") or {}
                elites = [record["holdout_mse"][i] for i in record["elites"]]
                models[key] = {"dataset": dataset, "sha256": record.get("sha256"), "epochs": record.get("epochs"),
                               "elite_holdout_mse": _number(float(np.mean(elites))), "elites": record["elites"],
                               "cpu_hours": training.get("cpu_seconds", 0) / 3600 if training else None,
                               "wall_hours": training.get("wall_seconds", 0) / 3600 if training else None,
                               "timed_from_epoch": training.get("timed_from_epoch"),
                               "machine": machine_of(training["environment"], bool(training["environment"].get("cpu_model")))
                               if training.get("environment") else None, "rows": {}}
                if machine_keys:  # the table's description of that machine, as its runs' CPU names allow
                    models[key]["machine_key"] = machine_keys.get(machine_of(training["environment"], names_cpu)) \
                        if training.get("environment") else None
            models[key]["rows"][label] = models[key]["rows"].get(label, 0) + 1
    if not models:
        return {}
    return {"models": list(models.values()), "unrecorded_runs": {d: n for d, n in unrecorded.items() if n}}


def dynamics_models_section(entry: dict) -> list[str]:
    """Markdown lines on the dynamics models of the model-based rows (none without recorded models); a model
    trained on one of the table's machines names its key."""
    if not entry:
        return []
    lines = ["", "## Dynamics models", "",
             "The ensembles the model-based rows rolled out (`python -m world_models.train`; cached per dataset, "
             "config and seed, so a dataset's rows share one), as their runs recorded them: the model file's "
             "SHA-256 (first 16 digits), its training epochs (early stopping or the cap), the mean hold-out MSE of "
             "its elites (mean over the hold-out rows and the predicted [Δs, r] dimensions), and its training "
             "time over every process that trained it: CPU hours (all threads; pauses not counted) and wall hours "
             "(pauses, e.g. while a test suite ran, counted), timed from the epoch given (a training begun before "
             "offrl timed it is timed from where it continued).", "",
             "| dataset | model | epochs | elite hold-out MSE | CPU hours | wall hours | timed from epoch | trained on | rows (runs) |",
             "|---|---|---|---|---|---|---|---|---|"]
    hours = lambda h: "n/a" if h is None else f"{h:.2f}"  # noqa: E731
    for m in entry["models"]:
        model = f"`{m['sha256']}`" if m["sha256"] else "file not read (replaced since the run, or missing)"
        mse = "n/a" if m["elite_holdout_mse"] is None else f"{m['elite_holdout_mse']:.4g}"
        rows = ", ".join(f"{label} ({n})" for label, n in m["rows"].items())
        lines.append(f"| {m['dataset']} | {model} | {m['epochs'] if m['epochs'] is not None else 'n/a'} | {mse} | "
                     f"{hours(m['cpu_hours'])} | {hours(m['wall_hours'])} | "
                     f"{'n/a' if m['timed_from_epoch'] is None else m['timed_from_epoch']} | {m.get('machine_key') or m['machine'] or 'n/a'} | {rows} |")
    if entry["unrecorded_runs"]:
        lines += ["", "Model-based runs that recorded no model (finished before offrl recorded it): "
                  + ", ".join(f"{d}: {n}" for d, n in entry["unrecorded_runs"].items()) + "."]
    return lines


def names_cpu_models(runs: list[dict]) -> bool:
    """Whether a table names CPU models: only when every run recorded one (runs from before offrl recorded it
    would otherwise read as another machine)."""
    return all(r["env"].get("cpu_model") for r in runs)


def hardware_of(groups: dict, runs: list[dict]) -> tuple[str, dict[str, str], dict[tuple, list[str]]]:
    """Where the runs ran: the caption's hardware phrase, and where they ran on more than one machine, the
    machines keyed M1, M2, ... (in table order: the first row's is M1) with each row's keys; else {} and {}."""
    cpu_model = names_cpu_models(runs)
    keys: dict[str, str] = {}  # machine description -> key
    row_machines: dict[tuple, list[str]] = {}
    for group, rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):  # the table's row order
        descriptions = list(dict.fromkeys(machine_of(r["env"], cpu_model) for r in _by_seed(rs)))
        for description in descriptions:
            keys.setdefault(description, f"M{len(keys) + 1}")
        row_machines[group] = sorted((keys[d] for d in descriptions), key=lambda key: int(key[1:]))
    threads = sorted({r["threads"] for r in runs}, key=str)
    if threads == [1]:
        clause = "one thread per run"
    else:  # config.json holds the last process's setting; a resume may change it (sweep --spread-threads)
        counts = ", ".join(f"{sum(r['threads'] == t for r in runs)} at {t or 'torch default'}" for t in threads)
        clause = (f"threads per run as last resumed: {counts} (a resume may add threads; that changes float "
                  "reductions, not the algorithm)")
    if len(keys) == 1:
        return f"{next(iter(keys))}, {clause}", {}, {}
    # the clause counts every row's runs, so it follows the machine list rather than any one machine
    return (f"each row's machine column, the machines listed below the caption; all rows: {clause}",
            {key: description for description, key in keys.items()}, row_machines)


def steps_cell(row: dict) -> str:
    """The budget, and where early stopping ended the runs that stopped before it: '100000 (stopped at
    38000-50000)', or '100000 (1 of 3 stopped at 40000)' when the others ran the whole budget."""
    budget = "/".join(map(str, row["steps"]))
    stopped = [k for k in row.get("stopped_at", []) if k is not None]
    if not stopped:
        return budget
    low, high = min(stopped), max(stopped)
    which = "" if len(stopped) == row["n"] else f"{len(stopped)} of {row['n']} "
    return f"{budget} ({which}stopped at {low if low == high else f'{low}-{high}'})"


def summarize(groups: dict, title: str, command: str | None, reeval_seed: int | None = None,
              reps: int = stats.REPS, seed: int = stats.SEED, profiles: bool = False, curves: bool = False,
              diverged: list[dict] | None = None) -> dict:
    """Everything a table says, as plain data (the --json output): caption facts, one entry per row with
    per-seed scores and rliable's IQM / mean / optimality gap with CIs, and per variant the aggregate over
    its datasets; with `profiles` performance profiles, with `curves` each row's learning curve. `diverged`
    (collect_diverged) are listed, and counted in their rows' seeds, but enter no statistic."""
    runs = list({r["run_dir"]: r for rs in groups.values() for r in rs}.values())  # a run has a row per metric
    diverged = sorted(diverged or [], key=lambda d: (d["dataset"], d["variant"], d["seed"], d["run_dir"]))
    finished_at = {(r.get("variant", label), dataset, r["seed"]): r["run_dir"]
                   for (label, dataset), rs in groups.items() for r in rs}
    for d in diverged:
        if (d["variant"], d["dataset"], d["seed"]) in finished_at:
            raise SystemExit(f"error: seed {d['seed']} of {d['variant']} on {d['dataset']} has a finished run folder "
                             f"{finished_at[(d['variant'], d['dataset'], d['seed'])]} and a diverged one "
                             f"{d['run_dir']}: keep one")
    finished = [r["finished"] for r in runs if r.get("finished") is not None]
    hardware = hardware_of(groups, runs) if runs else ("", {}, {})
    out = {"title": title, "command": command, "generated_by": "python -m benchmarks.table", "runs": len(runs),
           "last_finished": time.strftime("%Y-%m-%d", time.gmtime(max(finished))) if finished else None,
           "seeds": sorted({r["seed"] for r in runs}), "steps": sorted({r["steps"] for r in runs}),
           "step_unit": step_unit(r["algo"] for r in runs if r.get("algo")),
           "episodes": sorted({r["episodes"] for r in runs}), "train_episodes": sorted({r["train_episodes"] for r in runs}),
           "reeval_seed": reeval_seed, "hardware": hardware[0] if runs else None,
           "statistics": {"implementation": stats.implementation(), "method": "stratified bootstrap, percentile",
                          "reps": reps, "seed": seed, "confidence": stats.CONFIDENCE,
                          "optimality_gap_threshold": stats.GAMMA},
           "rows": [], "aggregates": []}
    if diverged:  # the key only where there are some: tables made before it regenerate byte for byte
        out["diverged"] = diverged
    if hardware[1]:  # likewise: only tables whose runs ran on more than one machine
        out["machines"] = hardware[1]
    differing = differing_data(groups)
    if differing:  # the key only where needed: tables made before it regenerate byte for byte
        out["differing_data"] = differing
    references = differing_reference_scores(groups)
    if references:  # likewise
        out["differing_reference_scores"] = references
    models = dynamics_models(groups, {description: key for key, description in hardware[1].items()})
    if models:  # likewise: only tables with runs that recorded their dynamics model
        out["dynamics_models"] = models
    for (label, dataset), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rs = _by_seed(rs)
        final = np.array([r["final"] for r in rs], dtype=np.float64)
        best = np.array([r["best"] for r in rs], dtype=np.float64)
        walls = [r["wall"] for r in rs if r["wall"] is not None]
        row = {"variant": label, "dataset": dataset, "metric": rs[0].get("metric", "eval/normalized_score"),
               "n": len(rs), "seeds": [r["seed"] for r in rs], "steps": sorted({r["steps"] for r in rs}),
               "precision": sorted({r["precision"] for r in rs}),
               "final": {"values": final.tolist(), "mean": float(final.mean()), "std": float(final.std())},
               "best": {"values": best.tolist(), "mean": float(best.mean()), "std": float(best.std())},
               **stats.summary(final[:, None], reps, seed, optimality_gap=_is_normalized(rs)),
               "hours_per_run": float(np.mean(walls) / 3600) if walls else None, "runs_with_wall_time": len(walls),
               "run_dirs": [r["run_dir"] for r in rs]}
        if hardware[2]:
            row["machines"] = hardware[2][(label, dataset)]
        if dataset in differing:
            row["data_checksums"] = sorted({r["data_checksum"] for r in rs if r.get("data_checksum")})
        diverged_seeds = [d["seed"] for d in diverged
                          if d["variant"] == rs[0].get("variant", label) and d["dataset"] == dataset]
        if diverged_seeds:
            row["diverged_seeds"] = diverged_seeds
        # early stopping (RCSL's hold-out loss): the steps trained, per seed, where fewer than the budget
        stopped = [r["stopped_at"] if (r.get("stopped_at") or r["steps"]) < r["steps"] else None for r in rs]
        if any(k is not None for k in stopped):
            row["stopped_at"] = stopped
        if curves:
            row["curve"] = curve_of(rs, reps, seed)
        out["rows"].append(row)
    scored = aggregate_scores(groups)
    for label, entry in scored.items():
        out["aggregates"].append({"variant": label, "datasets": entry["datasets"],
                                  "runs_per_dataset": entry["runs_per_dataset"], "runs_found": entry["runs_found"],
                                  **stats.summary(entry["scores"], reps, seed, optimality_gap=entry["normalized"])})
    # one unit on a profile's axis: the normalized-score variants when there are any (a table of several
    # metrics, e.g. returns beside scores, would otherwise put returns and scores on one threshold grid)
    profiled = {label: e for label, e in scored.items() if e["normalized"]} or scored
    if profiles and profiled:
        taus = stats.tau_grid([e["scores"] for e in profiled.values()])
        out["performance_profiles"] = {"taus": taus.tolist(), "variants": {}}
        for label, entry in profiled.items():
            profile, ci = stats.performance_profile(entry["scores"], taus, reps, seed)
            out["performance_profiles"]["variants"][label] = {"fraction_above": profile.tolist(),
                                                              "ci": ci.T.tolist()}
    return out


def _interval(entry: dict | None) -> str:
    if entry is None:
        return "n/a"
    low, high = entry["ci"]
    return f"{entry['point']:.1f} [{low:.1f}, {high:.1f}]"


def step_unit(algos) -> str:
    """What the runs' --steps count: gradient steps, or env steps for online algorithms (their module's
    STEP_UNIT, e.g. algos/wsrl.py); mixed, which algorithms count env steps."""
    import importlib

    def unit(algo: str) -> str:
        try:
            return getattr(importlib.import_module(f"algos.{algo}"), "STEP_UNIT", "gradient steps")
        except ImportError:
            return "gradient steps"

    units = {algo: unit(algo) for algo in sorted(set(algos))}
    if len(set(units.values())) <= 1:
        return next(iter(units.values()), "gradient steps")
    online = [algo for algo, u in units.items() if u != "gradient steps"]
    return f"steps (env steps for {', '.join(online)}; gradient steps for the others)"


def markdown(summary: dict, plots: list[tuple[str, str]] | None = None) -> str:
    """The table as markdown; `plots` = [(caption, link)] appended as images."""
    title, command = summary["title"], summary["command"]
    if not summary["runs"]:
        lines = [f"# {title}", "", "(no finished runs)", *diverged_section(summary.get("diverged", []))]
        return "\n".join(lines) + "\n"
    st = summary["statistics"]
    if summary["reeval_seed"] is None:
        evaluation = f"each evaluation {', '.join(map(str, summary['episodes']))} episodes (deterministic policy). "
        final_is = "Final = the last evaluation; "
    else:
        evaluation = (f"training's evaluations {', '.join(map(str, summary['train_episodes']))} episodes "
                      "(deterministic policy). ")
        final_is = (f"Final = the final checkpoint evaluated again by `offrl eval` with "
                    f"{', '.join(map(str, summary['episodes']))} episodes from reset seed {summary['reeval_seed']} "
                    "(other episodes than training's); ")
    stopped = (f"and {len(summary['diverged'])} stopped by a NaN/inf, listed below"
               if summary.get("diverged") else "")
    finished = f"the last finished on {summary['last_finished']}, UTC" if summary["last_finished"] else ""
    finished = f" ({'; '.join(x for x in (stopped, finished) if x)})" if stopped or finished else ""
    lines = [f"# {title}", "",
             f"Generated by `{summary['generated_by']}` from {summary['runs']} runs{finished}. "
             f"Seeds {summary['seeds']}; {', '.join(map(str, summary['steps']))} {summary.get('step_unit', 'gradient steps')}; "
             f"{evaluation}"
             f"Hardware: {summary['hardware']}. "
             f"{final_is}best = the best evaluation during training (optimistic, as CORL's 'best'; the final one "
             "for runs that evaluate only at their end); std = the "
             "population std over seeds (ddof 0). "
             "IQM = interquartile mean over seeds' final scores (rliable's 25% trimmed mean: it drops int(n/4) "
             "scores at each end, so with fewer than 4 seeds it is the mean) with a 95% CI; CIs from "
             f"{st['implementation']} (stratified bootstrap over seeds, percentile method, {st['reps']} replicates, "
             f"numpy seed {st['seed']}), so the table regenerates byte-for-byte from the same run folders; with 3 "
             "seeds a row's percentile interval is the range of its seeds (each extreme is drawn for all 3 in more "
             "than 2.5% of resamples). "
             "Precision: the runs' `--run.precision` (bf16 = gradient steps under bfloat16 autocast). Hours per run: "
             "wall time over all of a run's processes (n/a for runs resumed before offrl recorded it), which depends "
             "on what else ran on the machine.",
             ""]
    if any("stopped_at" in row for row in summary["rows"]):
        lines[-2] += (" Steps: the budget, and in brackets where early stopping (RCSL's hold-out loss) ended the "
                      "runs of a row (the policy of the best hold-out loss is the one evaluated).")
    machines = summary.get("machines", {})
    if machines:
        lines += ["Machines:", "", *(f"- {key}: {description}" for key, description in machines.items()), ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    machine_header = " machine |" if machines else ""
    lines += ["| variant | dataset | seeds | steps | precision |" + machine_header
              + " final (mean ± std) | best (mean ± std) | IQM final [95% CI] | hours per run |",
              "|---|---|---|---|---|" + ("---|" if machines else "") + "---|---|---|---|"]
    for row in summary["rows"]:
        final, best = row["final"], row["best"]
        hours = "n/a" if row["hours_per_run"] is None else f"{row['hours_per_run']:.2f}" + (
            "" if row["runs_with_wall_time"] == row["n"] else f" ({row['runs_with_wall_time']} of {row['n']} runs)")
        seeds = f"{row['n']}" + (f" (+{len(row['diverged_seeds'])} diverged)" if row.get("diverged_seeds") else "")
        dataset = row["dataset"] + (f" (data {', '.join(c[:8] for c in row['data_checksums'])})"
                                    if "data_checksums" in row else "")
        machine = f" {', '.join(row['machines'])} |" if machines else ""
        lines.append(f"| {row['variant']} | {dataset} | {seeds} | {steps_cell(row)} | "
                     f"{'/'.join(row['precision'])} |{machine} {final['mean']:.1f} ± {final['std']:.1f} | "
                     f"{best['mean']:.1f} ± {best['std']:.1f} | {_interval(row['iqm'])} | {hours} |")
    lines += differing_data_section(summary.get("differing_data", {}))
    lines += differing_reference_scores_section(summary.get("differing_reference_scores", {}))
    lines += diverged_section(summary.get("diverged", []))
    lines += dynamics_models_section(summary.get("dynamics_models", {}))
    lines += ["", "## Aggregate over datasets", "",
              "Per variant, its final scores as a runs × datasets array: IQM (25% trimmed mean over all runs and "
              "datasets), mean (of the per-dataset means) and optimality gap (100 minus the mean of min(score, 100): "
              "the shortfall from an expert's normalized score; n/a for other metrics), each with a 95% CI from "
              f"{st['implementation']} (stratified bootstrap: seeds resampled within each dataset, {st['reps']} "
              f"replicates, numpy seed {st['seed']}). A variant with more seeds on some datasets than on others uses "
              "its first n seeds of each.", "",
              "| variant | datasets | runs per dataset | IQM [95% CI] | mean [95% CI] | optimality gap [95% CI] |",
              "|---|---|---|---|---|---|"]
    for agg in summary["aggregates"]:
        n = str(agg["runs_per_dataset"])
        if len(set(agg["runs_found"])) > 1:
            n += f" (of {min(agg['runs_found'])}-{max(agg['runs_found'])})"
        lines.append(f"| {agg['variant']} | {len(agg['datasets'])} | {n} | {_interval(agg['iqm'])} | "
                     f"{_interval(agg['mean'])} | {_interval(agg.get('optimality_gap'))} |")
    if len({tuple(agg["datasets"]) for agg in summary["aggregates"]}) > 1:
        lines += ["", "The variants cover different datasets, so their aggregates are not comparable with each other: "
                      + coverage(summary["aggregates"]) + "."]
    if plots:
        lines += ["", "## Plots", ""]
        for caption, link in plots:
            lines += [f"![{caption}]({link})", ""]
        lines.pop()
    return "\n".join(lines) + "\n"


def coverage(aggregates: list[dict]) -> str:
    """Which datasets each variant's aggregate covers, of all the table's: those that cover all are named once,
    each other one by the shorter of what it has and what it lacks."""
    every = sorted({d for agg in aggregates for d in agg["datasets"]})
    complete = [agg["variant"] for agg in aggregates if len(agg["datasets"]) == len(every)]
    parts = [f"{', '.join(complete)}: all {len(every)}"] if complete else []
    for agg in aggregates:
        has = agg["datasets"]
        if len(has) == len(every):
            continue
        lacks = [d for d in every if d not in has]
        parts.append(f"{agg['variant']}: {len(has)}, all but {', '.join(lacks)}" if len(lacks) < len(has)
                     else f"{agg['variant']}: {len(has)}, {', '.join(has)}")
    return "; ".join(parts)


def differing_data_section(differing: dict[str, dict]) -> list[str]:
    """Markdown lines naming, per dataset id whose runs trained on different data, which rows used which."""
    if not differing:
        return []
    lines = ["", "## Rows on different data of one dataset id", "",
             "These dataset ids were made on more than one machine with different bytes (the suite's generation is "
             "not bit-exact on every CPU: README, \"The offrl dataset suite\"); the same recipe and policies, "
             "another draw of its episodes, so rows on them compare only as runs on two samples of one dataset "
             "do. Their dataset cells above name the first 8 digits of the checksum each row trained on.", ""]
    for dataset, entry in differing.items():
        parts = []
        for checksum, labels in entry["checksums"].items():
            note = " (the committed reference)" if checksum == entry["reference"] else ""
            parts.append(f"`{checksum}`{note}: {', '.join(labels)}")
        lines.append(f"- {dataset}: " + "; ".join(parts) + ".")
    return lines


def differing_reference_scores_section(references: dict[str, list[dict]]) -> list[str]:
    """Markdown lines naming, per dataset id normalized with more than one pair of reference returns, which rows
    used which."""
    if not references:
        return []
    lines = ["", "## Rows normalized with different reference returns", "",
             "The runs of these dataset ids recorded different random and expert returns (dataset.json's "
             "ref_min_score and ref_max_score): their normalized scores, 100 · (return − min) / (max − min), are on "
             "different scales, so compare those rows by their returns (`--metric eval/return_mean`).", ""]
    for dataset, pairs in references.items():
        lines.append(f"- {dataset}: " + "; ".join(f"{p['ref_min_score']} to {p['ref_max_score']}: "
                                                  f"{', '.join(p['rows'])}" for p in pairs) + ".")
    return lines


def diverged_section(diverged: list[dict]) -> list[str]:
    """The runs a NaN/inf stopped, as markdown lines (none when there are none)."""
    if not diverged:
        return []
    lines = ["", "## Runs stopped by a NaN/inf", "",
             "These runs have no score and enter no statistic of this table; a row's seeds cell counts them as "
             "'+k diverged'. `benchmarks.sweep` does not resume them (a resume replays the same steps from the "
             "same RNG state into the same NaN; `--retry-diverged` runs them again).", "",
             "| variant | dataset | seed | stopped at step | of steps | not finite | last checkpoint at step |",
             "|---|---|---|---|---|---|---|"]
    for d in diverged:
        what = ", ".join(d["metrics"]) + (f" ({d['value']})" if d.get("value") is not None else "")
        checkpoint = "none" if d.get("last_checkpoint_step") is None else d["last_checkpoint_step"]
        step = d["step"] if d["step"] is not None else "?"
        lines.append(f"| {d['variant']} | {d['dataset']} | {d['seed']} | {step} | "
                     f"{d['steps']} | {what or '?'} | {checkpoint} |")
    return lines


def render(groups: dict, title: str, command: str | None, reeval_seed: int | None = None,
           reps: int = stats.REPS, seed: int = stats.SEED) -> str:
    return markdown(summarize(groups, title, command, reeval_seed, reps, seed))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", type=Path, nargs="+", help="sweep folders: <out-dir>/<name>")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the numbers as JSON (per-seed scores, CIs, learning curves, performance profiles)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="draw learning curves, aggregate intervals and performance profiles as PNGs into DIR "
                             "and link them from the table")
    parser.add_argument("--title", default="Results")
    parser.add_argument("--command", default=None, help="the sweep command, quoted in the caption")
    parser.add_argument("--metric", action="append", default=None,
                        help="final.json key to report (repeatable; default eval/normalized_score)")
    parser.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                        help="only the runs of these variant labels (the folder under a root; default all)")
    parser.add_argument("--datasets", nargs="+", default=None, metavar="ID",
                        help="only the runs on these dataset ids (default all)")
    parser.add_argument("--reevaluate", type=int, metavar="EPISODES",
                        help="final = each run's final checkpoint evaluated again with this many episodes")
    parser.add_argument("--reeval-seed", type=int, default=10_000, help="reset seed of the first re-evaluation episode")
    parser.add_argument("--reps", type=int, default=stats.REPS, help="bootstrap replicates of every CI")
    parser.add_argument("--bootstrap-seed", type=int, default=stats.SEED, help="numpy seed of every bootstrap")
    args = parser.parse_args(argv)
    missing = [str(root) for root in args.roots if not root.is_dir()]
    if len(missing) == len(args.roots):  # before --out is written: a mistyped folder would empty the table
        parser.error(f"no such sweep folder: {', '.join(missing)}")
    for root in missing:  # e.g. a grid class not started yet
        print(f"note: no sweep folder {root} (no runs there yet?)", file=sys.stderr)
    if args.reps < 1 or (args.reevaluate is not None and args.reevaluate < 1):
        parser.error("--reps and --reevaluate take a positive number")
    for option, path in (("--out", args.out), ("--json", args.json)):  # checked before any output is written
        if path is not None and (path.is_dir() or any(parent.exists() and not parent.is_dir() for parent in path.parents)):
            parser.error(f"{option} {path}: a folder, or under a file: give a file path")
    reevaluate = (args.reevaluate, args.reeval_seed) if args.reevaluate else None
    if not stats.implementation().startswith("rliable"):
        print(f"note: rliable did not import ({stats.IMPORT_ERROR}); the same statistics come from "
              "benchmarks/stats.py's copy of its bootstrap. pip install -e '.[stats]'", file=sys.stderr)
    extras = args.json is not None or args.plots is not None
    groups = collect(args.roots, args.metric, reevaluate, args.variants, args.datasets)
    diverged = collect_diverged(args.roots, args.variants, args.datasets)
    finished = any(finished_runs(args.roots, args.variants, args.datasets))
    if not groups and (finished or not diverged):  # nothing to tabulate (or a mistyped --metric): keep --out as it is
        raise no_finished_runs(args.metric, args.roots, filtered=bool(args.variants or args.datasets))
    summary = summarize(groups, args.title, args.command,
                        args.reeval_seed if reevaluate else None, args.reps, args.bootstrap_seed,
                        profiles=extras, curves=extras, diverged=diverged)
    links = None
    if args.plots is not None:
        from benchmarks import plots

        written = plots.write_plots(summary, args.plots)
        base = args.out.parent if args.out else Path.cwd()
        links = [(caption, Path(os.path.relpath(path, base)).as_posix()) for caption, path in written]
        summary["plots"] = [{"caption": caption, "path": link} for caption, link in links]
    text = markdown(summary, links)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
