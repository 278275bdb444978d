"""Sweep and table tooling: rliable statistics, two tiny resumable sweeps (local and Ray) rendered as a
reproducible table with plots."""

import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import stats, sweep, table
from offrl.optim import cosine_decay

from conftest import PYTHON, ROOT, run_cli


def importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:  # noqa: BLE001 - rliable's dependencies may raise other errors at import (arch vs pandas 3)
        return False
    return True


HAS_RAY = importable("ray")


def test_iqm_and_optimality_gap_by_hand():
    column = lambda *x: np.array(x, dtype=np.float64)[:, None]  # noqa: E731 - runs x 1 task
    assert stats.aggregate_iqm(column(4.0, 1.0, 3.0, 2.0)) == pytest.approx(2.5)  # mean of the middle two
    assert stats.aggregate_iqm(column(1.0, 2.0, 10.0)) == pytest.approx(13 / 3)  # int(3 / 4) = 0 cut: the mean
    assert stats.aggregate_iqm(column(*range(8), 100.0)) == pytest.approx(4.0)  # 2 cut at each end of 9
    assert stats.aggregate_optimality_gap(column(50.0, 120.0)) == pytest.approx(100 - (50 + 100) / 2)
    scores = np.array([[1.0, 10.0], [3.0, 30.0]])  # runs x tasks: the mean of the task means
    assert stats.aggregate_mean(scores) == pytest.approx(11.0)
    (low_iqm, low_mean, _), (high_iqm, high_mean, _) = stats.interval_estimates(column(1.0, 2.0, 3.0, 4.0, 5.0))[1]
    assert low_iqm <= 3.0 <= high_iqm and low_mean <= 3.0 <= high_mean


@pytest.mark.skipif(not importable("rliable"), reason="rliable is not installed (pip install -e '.[stats]')")
def test_rliable_and_the_fallback_give_the_same_numbers(monkeypatch):
    scores = np.random.default_rng(0).normal(50, 20, (5, 3))
    taus = stats.tau_grid([scores])
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    with_rliable = stats.interval_estimates(scores, reps=300), stats.performance_profile(scores, taus, reps=300)
    assert (np.random.get_state()[1] == before).all()  # the caller's global RNG is left as it was
    assert stats.implementation().startswith("rliable ")
    with stats._seeded(0):  # rliable's own bootstrap of the aggregates, a replicate at a time
        points, intervals = stats._RLIABLE[0].get_interval_estimates(
            {"x": scores}, stats.aggregates, method="percentile", reps=300, confidence_interval_size=stats.CONFIDENCE)
    np.testing.assert_array_equal(with_rliable[0][0], points["x"])
    np.testing.assert_array_equal(with_rliable[0][1], intervals["x"])
    monkeypatch.setattr(stats, "_RLIABLE", None)
    with stats._seeded(0):  # the copy of rliable's loop, for functions the batched path does not cover
        np.testing.assert_array_equal(stats._bootstrap(scores, stats.aggregates, 300, stats.CONFIDENCE)[1], intervals["x"])
    fallback = stats.interval_estimates(scores, reps=300), stats.performance_profile(scores, taus, reps=300)
    for (point_a, ci_a), (point_b, ci_b) in zip(with_rliable, fallback):
        np.testing.assert_array_equal(point_a, point_b)
        np.testing.assert_array_equal(ci_a, ci_b)
    assert stats.interval_estimates(scores, reps=300, seed=1)[1][0, 0] != fallback[0][1][0, 0]  # the seed matters


@pytest.mark.skipif(not importable("rliable"), reason="rliable is not installed (pip install -e '.[stats]')")
def test_the_batched_bootstrap_of_the_aggregates_equals_rliables_bit_for_bit(monkeypatch):
    """interval_estimates draws every replicate's runs at once and computes the aggregates of all replicates in one
    pass: the same points and bounds as rliable's get_interval_estimates, float for float, over shapes from one run
    or task to more runs than numpy's pairwise summation block, with ties; scores with nan take rliable's path."""
    rng = np.random.default_rng(0)
    with stats._seeded(0):
        stats._lib()
    library = stats._RLIABLE[0]
    for i in range(120):
        runs, tasks = int(rng.integers(1, 13 if i % 4 else 25)), int(rng.integers(1, 12 if i % 4 else 30))
        scores = rng.normal(50, 40, (runs, tasks))
        if i % 3 == 0:
            scores = np.round(scores / 10) * 10  # ties, and scores above the optimality gap's 100
        reps = int(rng.integers(20, 120))
        batched = stats.interval_estimates(scores, reps=reps, seed=i)
        with stats._seeded(i):
            points, intervals = library.get_interval_estimates(
                {"x": scores}, stats.aggregates, method="percentile", reps=reps, confidence_interval_size=stats.CONFIDENCE)
        np.testing.assert_array_equal(batched[0], points["x"])
        np.testing.assert_array_equal(batched[1], intervals["x"])

    def refuse(*args, **kwargs):
        raise AssertionError("rliable's per-replicate loop was used")

    monkeypatch.setattr(library, "get_interval_estimates", refuse)
    stats.interval_estimates(rng.normal(size=(3, 4)))  # the batched path
    with pytest.raises(AssertionError, match="per-replicate loop"):
        stats.interval_estimates(np.array([[1.0, np.nan], [2.0, 3.0]]))


@pytest.mark.skipif(not importable("rliable"), reason="rliable is not installed (pip install -e '.[stats]')")
def test_the_fast_per_replicate_functions_equal_rliables_bit_for_bit():
    """A bootstrap replicate's IQM skips scipy's argument wrapper and its score distribution is one array
    comparison: both must give exactly rliable's floats (ties, shapes, integer-valued scores), nan stays nan."""
    from rliable import library, metrics

    rng = np.random.default_rng(0)
    for i in range(2000):
        scores = rng.normal(50, 30, (int(rng.integers(1, 7)), int(rng.integers(1, 10))))
        if i % 3 == 0:
            scores = np.round(scores / 10) * 10  # ties
        assert stats.aggregate_iqm(scores) == metrics.aggregate_iqm(scores)
        taus = stats.tau_grid([scores], points=int(rng.integers(2, 40)))
        np.testing.assert_array_equal(stats._score_distribution(scores, taus), library.score_distributions(scores, taus))
    assert stats._UNWRAPPED_TRIM_MEAN is not None  # else the fast path was never taken
    assert np.isnan(stats.aggregate_iqm(np.array([[1.0, np.nan], [2.0, 3.0]])))


@pytest.mark.skipif(not importable("rliable"), reason="rliable is not installed (pip install -e '.[stats]')")
def test_a_table_without_rliable_has_the_same_numbers(monkeypatch):
    run = {"final": 50.0, "best": 60.0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "env": {"processor": "x86_64", "cpu_count": 2, "device": "cpu"}, "wall": None, "threads": 1}
    groups = {(label, dataset): [{**run, "seed": s, "final": 10.0 * s + len(label) + len(dataset),
                                  "run_dir": f"{label}{dataset}{s}"} for s in range(5)]
              for label in ("bc", "iql") for dataset in ("d1", "d22")}
    with_rliable, name = table.render(groups, "t", None, reps=200), stats.implementation()
    assert name != stats.FALLBACK  # else the comparison below would be the fallback against itself
    monkeypatch.setattr(stats, "_RLIABLE", None)
    fallback = table.render(groups, "t", None, reps=200)
    assert fallback.count(stats.FALLBACK) == 2 and "| iql | 2 | 5 |" in fallback
    assert fallback.replace(stats.FALLBACK, name) == with_rliable  # the same numbers, digit for digit


def test_a_ray_task_asks_for_its_threads_and_a_gpu_for_cuda_runs():
    job = sweep.Job("bc", "bc", ["--hidden", "16"], "d", 0, 10, sweep.Path("runs"))
    assert sweep.ray_resources(job, [], 1) == {"num_cpus": 1, "num_gpus": 0}
    assert sweep.ray_resources(job, ["--eval.every", "5", "--device", "cuda"], 2) == {"num_cpus": 2, "num_gpus": 1}
    assert sweep.ray_resources(job, ["--device=cuda:1"], 1)["num_gpus"] == 1
    assert sweep.ray_resources(job, ["--device", "cpu"], 1)["num_gpus"] == 0
    # the --device the run takes is the last one: a variant's after --common's
    on_cpu = sweep.Job("bc", "bc", ["--device", "cpu"], "d", 0, 10, sweep.Path("runs"))
    assert sweep.ray_resources(on_cpu, ["--device", "cuda"], 1)["num_gpus"] == 0
    on_gpu = sweep.Job("bc", "bc", ["--device=cuda"], "d", 0, 10, sweep.Path("runs"))
    assert sweep.ray_resources(on_gpu, ["--device", "cpu"], 1)["num_gpus"] == 1
    # Ray hides the GPUs from tasks that ask for none: on a cluster with GPUs, the sweep says that such runs use the CPU
    assert "--device cuda in --common" in sweep.hidden_gpus_warning(4, 2)
    assert sweep.hidden_gpus_warning(0, 2) is None and sweep.hidden_gpus_warning(4, 0) is None


def test_a_cut_off_final_json_is_not_a_finished_run_and_the_lock_holder_is_looked_at_again(tmp_path):
    """An empty final.json (a crash just after its write) makes the run unfinished, not a sweep's traceback; a
    run that another process finished after the sweep looked is found finished once its lock is held."""
    job = sweep.Job("bc", "bc", [], "d", 0, 10, tmp_path)
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "final.json").write_text("")
    assert not job.done() and sweep.status([job])
    (job.run_dir / "final.json").write_text(json.dumps({"steps": 10}))
    assert job.done() and sweep.launch(job, [], 1) == sweep.FINISHED


def test_options_the_sweep_sets_are_refused_in_common_and_variants(tmp_path, capsys):
    """Given again, the run would take them (the last value counts) and train elsewhere or to another budget."""
    base = ["--name", "s", "--out-dir", str(tmp_path), "--datasets", "d", "--seeds", "0", "--steps", "10"]
    for extra in (["--variant", "a=bc", "--common", "--steps 20"], ["--variant", "a=bc --run.threads=2"],
                  ["--variant", "a=bc --hidden 16 --seed 3"]):
        with pytest.raises(SystemExit) as stopped:
            sweep.main([*base, *extra])
        assert stopped.value.code == 2 and "is the sweep's to set" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_run_folder_without_a_checkpoint_is_set_aside_before_a_start(tmp_path):
    """Else `--resume auto` would start the run again in `<seed>-sweep-1`, where the sweep does not look."""
    unstarted, resumable, finished = tmp_path / "0-sweep", tmp_path / "1-sweep", tmp_path / "2-sweep"
    for folder in (unstarted, resumable, finished):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    (resumable / "checkpoints").mkdir()
    (resumable / "checkpoints" / "previous.pt").write_text("")
    (finished / "final.json").write_text("{}")
    assert sweep.set_aside_unstarted(unstarted) == tmp_path / "0-sweep.unstarted-1"
    assert (tmp_path / "0-sweep.unstarted-1" / "config.json").exists() and not unstarted.exists()
    assert sweep.set_aside_unstarted(resumable) is None and sweep.set_aside_unstarted(finished) is None
    assert sweep.set_aside_unstarted(tmp_path / "3-sweep") is None  # nothing there yet
    unstarted.mkdir()
    assert sweep.set_aside_unstarted(unstarted) == tmp_path / "0-sweep.unstarted-2"


def test_cosine_decay_matches_cosine_annealing():
    import torch

    param = torch.nn.Parameter(torch.zeros(1))
    reference = torch.optim.SGD([param], lr=1.0)
    annealing = torch.optim.lr_scheduler.CosineAnnealingLR(reference, T_max=10)
    decay = cosine_decay(10)
    for step in range(11):  # up to T_max; past it CosineAnnealingLR rises again, ours stays at 0
        assert decay(step) == pytest.approx(reference.param_groups[0]["lr"], abs=1e-9)
        reference.step()
        annealing.step()


def sweep_args(out_dir, name, variant, dataset):
    return ["--name", name, "--out-dir", str(out_dir), "--variant", variant, "--datasets", dataset, "--seeds", "0", "1",
            "--steps", "60", "--common", "--eval.every 30 --eval.episodes 2"]


def final_of(run_dir):
    return json.loads((run_dir / "final.json").read_text())


@pytest.fixture(scope="module")
def sweeps(tiny, tmp_path_factory):
    """Two tiny 2-run sweeps shared by the tests below: BC through the local backend (`python -m
    benchmarks.sweep`, run twice), TD3+BC through the Ray backend on a local Ray instance started here (run
    again after removing one run's final.json, as if interrupted) -- or locally where Ray is not installed."""
    root = tmp_path_factory.mktemp("sweeps")
    out = {"root": root}
    start = time.time()
    out["local"] = run_cli(PYTHON, "-m", "benchmarks.sweep", *sweep_args(root, "local", "bc=bc --hidden 16", tiny)).stdout
    out["local_again"] = run_cli(PYTHON, "-m", "benchmarks.sweep", *sweep_args(root, "local", "bc=bc --hidden 16", tiny)).stdout
    out["local_seconds"] = time.time() - start
    ray_args = sweep_args(root, "ray", "td3=td3_bc --hidden 16", tiny)
    if not HAS_RAY:
        out["ray"] = run_cli(PYTHON, "-m", "benchmarks.sweep", *ray_args).stdout
        return out
    import ray

    start = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for key in ("ray", "ray_again", "ray_resumed"):
            if key == "ray_resumed":  # an interrupted run: checkpoint, no final.json
                run_dir = root / "ray" / "td3" / "td3_bc" / "offrl-tiny-v0" / "1-sweep"
                out["uninterrupted_final"] = final_of(run_dir)
                (run_dir / "final.json").unlink()
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                sweep.main([*ray_args, "--backend", "ray"])
            out[key] = printed.getvalue()
    finally:
        ray.shutdown()
    out["ray_seconds"] = time.time() - start
    return out


def test_a_run_that_outlived_its_sweep_is_never_run_twice(tiny, tmp_path):
    """The sweep alone is killed while its run goes on (its process holds the run's lock): a new sweep
    waits for that process instead of starting a second one in the same folder, then counts the run
    as finished by it."""
    import fcntl
    import os
    import signal
    import subprocess

    args = [PYTHON, "-m", "benchmarks.sweep", "--name", "lock", "--out-dir", str(tmp_path), "--variant",
            "bc=bc --hidden 16", "--datasets", tiny, "--seeds", "0", "--steps", "200", "--jobs", "1",
            "--common", "--eval.every 0 --eval.episodes 2 --run.checkpoint-every 100"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = ""
    while not line.startswith("start bc"):
        line = first.stdout.readline()
        assert line or first.poll() is None, "the first sweep ended without starting its run"
    orphan = int(line.rsplit("(pid ", 1)[1].rstrip(")\n"))
    os.kill(orphan, signal.SIGSTOP)  # held mid-run until the second sweep has had its look
    try:
        first.kill()
        first.wait()
        job = sweep.Job("bc", "bc", [], tiny, 0, 200, tmp_path / "lock")
        with open(job.lock_path, "a") as lock, pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the run's process inherited the lock
        log = tmp_path / "second.log"
        with open(log, "w") as out:
            second = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        deadline = time.time() + 120
        while "waiting: bc" not in log.read_text():
            assert second.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        os.kill(orphan, signal.SIGCONT)
    assert second.wait(timeout=300) == 0, log.read_text()
    text = log.read_text()
    assert "start bc" not in text and f"done bc {tiny} seed 0 (by another process)" in text, text
    assert final_of(job.run_dir)["steps"] == 200 and final_of(job.run_dir)["resumes"] == 0
    assert sorted(p.name for p in job.run_dir.parent.iterdir()) == ["0-sweep", "0-sweep.lock", "0-sweep.log"]


def test_local_sweep_runs_and_skips_finished_runs(sweeps):
    assert "0 of 2 runs already finished" in sweeps["local"] and sweeps["local"].count("done ") == 2
    assert "2 of 2 runs already finished; 0 to go" in sweeps["local_again"]
    runs = sorted((sweeps["root"] / "local" / "bc" / "bc").glob("*/*-sweep/final.json"))
    assert [json.loads(r.read_text())["steps"] for r in runs] == [60, 60]


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -e '.[ray]')")
def test_ray_sweep_runs_skips_finished_runs_and_resumes_interrupted_ones(sweeps):
    print(f"Ray sweeps (start, 2 runs, rerun, resume, shutdown): {sweeps['ray_seconds']:.1f} s; "
          f"local sweep and rerun: {sweeps['local_seconds']:.1f} s")
    first = sweeps["ray"]
    assert "0 of 2 runs already finished" in first and first.count("(1 CPU, 0 GPU)") == 2 and first.count("done ") == 2
    assert "2 of 2 runs already finished; 0 to go" in sweeps["ray_again"]
    resumed = sweeps["ray_resumed"]
    assert "1 of 2 runs already finished; 1 to go" in resumed and "done td3 offrl/tiny-v0 seed 1" in resumed
    run_dir = sweeps["root"] / "ray" / "td3" / "td3_bc" / "offrl-tiny-v0" / "1-sweep"
    final, before = final_of(run_dir), sweeps["uninterrupted_final"]
    assert final["resumes"] == before["resumes"] + 1 and final["steps"] == 60  # resumed, not started afresh
    assert final["eval/normalized_score"] == before["eval/normalized_score"]
    assert "resumed" in (run_dir.parent / "1-sweep.log").read_text()


def test_table_from_both_sweeps_regenerates_byte_for_byte_with_plots(sweeps, tmp_path):
    roots = [str(sweeps["root"] / "local"), str(sweeps["root"] / "ray")]
    options = ["--title", "tiny", "--command", "python -m benchmarks.sweep ...", "--reps", "500"]
    md, js, plots = tmp_path / "tiny.md", tmp_path / "tiny.json", tmp_path / "tiny"
    text = run_cli(PYTHON, "-m", "benchmarks.table", *roots, *options, "--out", str(md), "--json", str(js),
                   "--plots", str(plots)).stdout
    rows = [line for line in text.splitlines() if line.startswith("| bc |") or line.startswith("| td3 |")]
    assert len(rows) == 4 and all("| 2 |" in r for r in rows[:2])  # two table rows, two aggregate rows
    assert "Seeds [0, 1]; 60 gradient steps; each evaluation 2 episodes" in text and "one thread per run" in text
    assert "CIs from rliable " in text or "CIs from offrl's copy of rliable" in text
    assert "500 replicates, numpy seed 0), so the table regenerates byte-for-byte" in text
    assert md.read_text().strip() == text.strip()
    summary = json.loads(js.read_text())
    bc = next(r for r in summary["rows"] if r["variant"] == "bc")
    assert bc["n"] == 2 and bc["seeds"] == [0, 1] and bc["iqm"]["ci"][0] <= bc["iqm"]["point"] <= bc["iqm"]["ci"][1]
    assert bc["final"]["values"] == [final_of(sweeps["root"] / "local" / "bc" / "bc" / "offrl-tiny-v0" / f"{s}-sweep")
                                     ["eval/normalized_score"] for s in (0, 1)]
    assert bc["curve"]["steps"] == [30, 60] and bc["curve"]["n"] == [2, 2]
    assert {a["variant"] for a in summary["aggregates"]} == {"bc", "td3"}
    assert all("optimality_gap" in a for a in summary["aggregates"])
    assert len(summary["performance_profiles"]["taus"]) == 101
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert pngs == ["aggregates.png", "curves-offrl-tiny-v0.png", "profiles.png"]
    assert all((plots / name).stat().st_size > 1000 for name in pngs)
    assert "![learning curves on offrl/tiny-v0](tiny/curves-offrl-tiny-v0.png)" in text  # relative to the table
    # the same run folders, given in the other order, render the same bytes (table, JSON and plots)
    files = [md, js, *(plots / name for name in pngs)]
    first = [f.read_bytes() for f in files]
    table.main([*roots[::-1], *options, "--out", str(md), "--json", str(js), "--plots", str(plots)])
    assert [f.read_bytes() for f in files] == first


def test_table_reports_several_metrics_and_reevaluated_final_scores(sweeps):
    root = sweeps["root"] / "local"
    two = table.main([str(root), "--metric", "eval/normalized_score", "--metric", "eval/return_mean", "--reps", "200"])
    assert sum(line.startswith("| bc [eval] |") or line.startswith("| bc [eval/return_mean] |")
               for line in two.splitlines()) == 4  # table and aggregate rows
    (returns,) = [line for line in two.splitlines() if line.startswith("| bc [eval/return_mean] | 1 | 2 |")]
    assert returns.endswith("| n/a |")  # an aggregate row: no optimality gap for returns
    summary = table.summarize(table.collect([root], ["eval/normalized_score", "eval/return_mean"]), "t", None, reps=200,
                              profiles=True)
    assert list(summary["performance_profiles"]["variants"]) == ["bc [eval]"]  # scores only, not returns on one axis
    # final = the final checkpoints evaluated again (offrl eval), cached beside each run
    redone = table.main([str(root), "--reevaluate", "3", "--reeval-seed", "5", "--reps", "200"])
    assert "evaluated again by `offrl eval` with 3 episodes from reset seed 5" in redone
    caches = sorted(root.glob("bc/*/*/*/reeval-3ep-seed5.json"))
    assert len(caches) == 2
    reports = [json.loads(c.read_text()) for c in caches]
    assert all(r["episodes"] == 3 and r["seed"] == 5 for r in reports)
    mean = np.mean([r["results"]["eval"]["normalized_score"] for r in reports])
    (bc_row,) = [line for line in redone.splitlines() if line.startswith("| bc | offrl")]
    assert f"| {mean:.1f} ± " in bc_row


def test_table_keeps_only_the_variants_and_datasets_asked_for(sweeps):
    roots = [sweeps["root"] / "local", sweeps["root"] / "ray"]
    both = table.collect(roots)
    assert sorted(both) == [("bc", "offrl/tiny-v0"), ("td3", "offrl/tiny-v0")]
    assert sorted(table.collect(roots, variants=["td3"])) == [("td3", "offrl/tiny-v0")]
    assert table.collect(roots, variants=["td3"])[("td3", "offrl/tiny-v0")] == both[("td3", "offrl/tiny-v0")]
    assert table.collect(roots, datasets=["offrl/other-v0"]) == {}
    assert sorted(table.collect(roots, variants=["bc", "td3"], datasets=["offrl/tiny-v0"])) == sorted(both)


def test_a_seed_in_two_run_folders_is_refused_and_a_root_given_twice_counts_once(sweeps, tmp_path):
    import shutil

    root = sweeps["root"] / "local"
    once = table.collect([root])
    assert table.collect([root, root]) == once and all(len(runs) == 2 for runs in once.values())
    copy = tmp_path / "local"
    shutil.copytree(root, copy)
    run = next(p for p in copy.glob("bc/*/*/0-*") if p.is_dir())
    shutil.copytree(run, run.parent / "0-again")  # seed 0 run a second time into another folder
    with pytest.raises(SystemExit, match="seed 0 of bc on offrl/tiny-v0 has two run folders"):
        table.collect([copy])


def test_a_diverged_run_is_listed_and_counted_beside_its_row_not_scored(sweeps, tmp_path, capsys):
    import shutil

    copy = tmp_path / "local"
    shutil.copytree(sweeps["root"] / "local", copy)
    run = copy / "bc" / "bc" / "offrl-tiny-v0" / "1-sweep"
    (run / "final.json").unlink()  # seed 1 stopped on a NaN, as offrl.run leaves such a folder
    (run / "diverged.json").write_text(json.dumps({"step": 40, "metrics": ["train/actor_loss"], "value": "nan",
                                                   "last_checkpoint_step": 30}))
    text = table.main([str(copy), "--reps", "200"])
    assert "| bc | offrl/tiny-v0 | 1 (+1 diverged) |" in text
    assert "## Runs stopped by a NaN/inf" in text
    assert "| bc | offrl/tiny-v0 | 1 | 40 | 60 | train/actor_loss (nan) | 30 |" in text
    assert "from 1 runs (and 1 stopped by a NaN/inf, listed below; the last finished" in text
    summary = table.summarize(table.collect([copy]), "t", None, reps=200, diverged=table.collect_diverged([copy]))
    bc = next(r for r in summary["rows"] if r["variant"] == "bc")
    assert bc["n"] == 1 and bc["seeds"] == [0] and bc["diverged_seeds"] == [1]
    assert [d["seed"] for d in summary["diverged"]] == [1]
    assert table.collect_diverged([copy], variants=["td3"]) == []
    # a diverged folder that --retry-diverged set aside (the seed ran again beside it) is not listed
    aside = run.with_name(f"1-sweep{sweep.UNSTARTED}1")
    shutil.copytree(run, aside)
    assert [d["run_dir"] for d in table.collect_diverged([copy])] == [str(run)]
    shutil.rmtree(aside)
    # every seed diverged: no row, but the table still says so
    only = tmp_path / "only"
    shutil.copytree(run, only / "bc" / "bc" / "offrl-tiny-v0" / "1-sweep")
    assert "(no finished runs)" in (empty := table.main([str(only)])) and "| bc | offrl/tiny-v0 | 1 | 40 |" in empty
    # nothing to tabulate at all (a mistyped folder or metric): an error, and --out keeps what it held
    (tmp_path / "kept.md").write_text("the table")
    for args, why in (([str(tmp_path / "mistyped")], "no such sweep folder"),
                      ([str(copy), "--metric", "eval/no-such-metric"], "no finished run with eval/no-such-metric")):
        with pytest.raises(SystemExit) as stopped:
            table.main([*args, "--out", str(tmp_path / "kept.md")])
        assert why in str(stopped.value) + capsys.readouterr().err
        assert (tmp_path / "kept.md").read_text() == "the table"
    # a metrics.jsonl cut off mid-line (a run killed while logging) still reads; a damaged finished run is named
    metrics = run.parent / "0-sweep" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 61, "eval/norm')
    assert "| bc | offrl/tiny-v0 | 1 (+1 diverged) |" in table.main([str(copy), "--reps", "200"])
    metrics.write_text('{"step": 1, "eval/norm\n' + metrics.read_text())
    with pytest.raises(SystemExit, match="0-sweep: cannot read its records .*line 1 is not JSON"):
        table.main([str(copy), "--reps", "200"])
    metrics.write_text(metrics.read_text().split("\n", 1)[1])
    # a score that is not a number, a config.json without its run section, a diverged run's damaged config.json
    kept_metrics, config = metrics.read_text(), run.parent / "0-sweep" / "config.json"
    metrics.write_text('{"step": 1, "eval/normalized_score": "high"}\n' + kept_metrics)
    with pytest.raises(SystemExit, match="0-sweep: cannot read its records .*eval/normalized_score = 'high' at step 1"):
        table.main([str(copy), "--reps", "200"])
    metrics.write_text(kept_metrics)
    kept_config = config.read_text()
    config.write_text(json.dumps({k: v for k, v in json.loads(kept_config).items() if k != "run"}))
    with pytest.raises(SystemExit, match="0-sweep: cannot read its records .*config.json lacks run"):
        table.main([str(copy), "--reps", "200"])
    config.write_text(kept_config)
    kept_diverged = (run / "config.json").read_text()
    (run / "config.json").write_text(kept_diverged[:20])
    with pytest.raises(SystemExit, match="1-sweep: cannot read its records"):
        table.main([str(copy), "--reps", "200"])
    (run / "config.json").write_text(kept_diverged)
    # a diverged folder beside a finished run of the same seed is refused, as two finished folders are
    shutil.copytree(run, run.parent / "0-again")
    (run.parent / "0-again" / "config.json").write_text((run.parent / "0-sweep" / "config.json").read_text())
    with pytest.raises(SystemExit, match="seed 0 of bc on offrl/tiny-v0 has a finished run folder"):
        table.main([str(copy), "--reps", "200"])


def test_rows_on_different_data_of_one_dataset_id_are_named(sweeps, tmp_path, monkeypatch):
    """A suite dataset id whose runs trained on data of different checksums (another CPU did not regenerate it bit
    for bit): the rows' dataset cells name their checksums and a section says which rows used which; with one
    checksum per id, or for an id without a committed reference (a D4RL file, whose checksum is of the rows as
    each algorithm loads them), the table says nothing of it."""
    import shutil

    from offrl.data import suite

    copy = tmp_path / "local"
    shutil.copytree(sweeps["root"] / "local", copy)
    plain = table.main([str(copy), "--reps", "200"])
    assert "## Rows on different data" not in plain and "(data " not in plain
    record = copy / "bc" / "bc" / "offrl-tiny-v0" / "1-sweep" / "dataset.json"
    saved = json.loads(record.read_text())
    record.write_text(json.dumps({**saved, "checksum": "0123456789abcdef"}))
    assert "## Rows on different data" not in table.main([str(copy), "--reps", "200"])  # no reference for tiny
    original = saved["checksum"]
    monkeypatch.setattr(suite, "reference_checksums", lambda: {"offrl/tiny-v0": original})  # as for a suite id
    text = table.main([str(copy), "--reps", "200"])
    first, second = sorted([original, "0123456789abcdef"])
    assert f"| bc | offrl/tiny-v0 (data {first[:8]}, {second[:8]}) | 2 |" in text
    assert "## Rows on different data of one dataset id" in text
    assert f"`{original}` (the committed reference): bc" in text.split("## Rows on different data")[1]
    summary = table.summarize(table.collect([copy]), "t", None, reps=200)
    assert summary["differing_data"]["offrl/tiny-v0"]["checksums"] == {first: ["bc"], second: ["bc"]}
    # reference returns that differ between runs of one id: their normalized scores are on two scales
    assert "## Rows normalized with different reference returns" not in text
    assert "differing_reference_scores" not in summary
    record.write_text(json.dumps({**saved, "ref_max_score": saved["ref_max_score"] + 1.0}))
    text = table.main([str(copy), "--reps", "200"])
    section = text.split("## Rows normalized with different reference returns")[1]
    assert f"- offrl/tiny-v0: {saved['ref_min_score']} to {saved['ref_max_score']}: bc; " in section
    assert f"{saved['ref_min_score']} to {saved['ref_max_score'] + 1.0}: bc." in section
    summary = table.summarize(table.collect([copy]), "t", None, reps=200)
    assert [p["ref_max_score"] for p in summary["differing_reference_scores"]["offrl/tiny-v0"]] == sorted(
        [saved["ref_max_score"], saved["ref_max_score"] + 1.0], key=lambda high: str((saved["ref_min_score"], high)))


def test_a_row_stopped_early_says_where_beside_its_budget(sweeps, tmp_path):
    """RCSL stops on its hold-out loss: its final.json's stopped_at_step, not the budget, is what it trained; a
    row whose runs stopped early shows both, and a table without such runs says nothing of it."""
    import shutil

    copy = tmp_path / "local"
    shutil.copytree(sweeps["root"] / "local", copy)
    for seed, stopped in ((0, 30), (1, 45)):
        path = copy / "bc" / "bc" / "offrl-tiny-v0" / f"{seed}-sweep" / "final.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "stopped_at_step": stopped}))
    ray = str(sweeps["root"] / "ray")  # td3's runs
    text = table.main([str(copy), ray, "--reps", "200"])
    (bc,) = [line for line in text.splitlines() if line.startswith("| bc | offrl")]
    (td3,) = [line for line in text.splitlines() if line.startswith("| td3 | offrl")]
    assert "| 2 | 60 (stopped at 30-45) |" in bc and "| 2 | 60 |" in td3
    assert "in brackets where early stopping (RCSL's hold-out loss) ended the runs" in text
    rows = {r["variant"]: r for r in table.summarize(table.collect([copy, Path(ray)]), "t", None, reps=200)["rows"]}
    assert rows["bc"]["stopped_at"] == [30, 45] and "stopped_at" not in rows["td3"]
    path.write_text(json.dumps({**json.loads(path.read_text()), "stopped_at_step": 60}))  # seed 1 ran all 60 steps
    (bc,) = [line for line in table.main([str(copy), "--reps", "200"]).splitlines() if line.startswith("| bc | offrl")]
    assert "| 2 | 60 (1 of 2 stopped at 30) |" in bc
    untouched = table.main([str(sweeps["root"] / "local"), ray, "--reps", "200"])
    assert "stopped at" not in untouched and "early stopping" not in untouched


def test_plots_cli_writes_the_pngs(sweeps, tmp_path):
    written = run_cli(PYTHON, "-m", "benchmarks.plots", str(sweeps["root"] / "local"), "--out-dir", str(tmp_path / "p"),
                      "--reps", "200").stdout.split()
    assert sorted(p.rsplit("/", 1)[1] for p in written) == ["aggregates.png", "curves-offrl-tiny-v0.png", "profiles.png"]
    assert all((tmp_path / "p" / name).exists() for name in ("aggregates.png", "profiles.png"))


@pytest.mark.parametrize("count", [3, 10, 11, 20, 21, 40])
def test_plot_colors_are_distinct_per_variant(count):
    """The committed grid plots 11 variants: each needs its own colour, not tab10's wrap back to the first."""
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    colors = plots._colors([f"variant{i}" for i in range(count)])
    assert len(colors) == count and len(set(colors.values())) == count


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_speed_benchmark_reports_every_algorithm(precision, tmp_path):
    """A smoke run (no timing is asserted): the report and the markdown table hold each algorithm."""
    import torch

    from benchmarks import speed

    threads = torch.get_num_threads()
    try:
        report = speed.main(["--algos", "bc", "dt", "--warmup", "1", "--blocks", "1", "--per-block", "1",
                             "--threads", "1", "--precision", precision, "--matmul-size", "128", "--batch-size", "4",
                             "--markdown", str(tmp_path / "speed.md")])
    finally:
        torch.set_num_threads(threads)
    (run,) = report["runs"]
    assert report["precision"] == precision and [r["algo"] for r in run["results"]] == ["bc", "dt"]
    assert all(r["median_ms"] > 0 and r["gflop_per_update"] > 0 for r in run["results"])
    table = (tmp_path / "speed.md").read_text()
    assert "| 1 | dt | 4 |" in table and ("bfloat16" in table) == (precision == "bf16")


FAKE_RUN = """
import json, pathlib, signal, sys, time
run_dir, threads, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
(run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
with open(run_dir.parent / "launches.txt", "a") as f:
    f.write(f"{run_dir.name} {threads}\\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
(run_dir / "checkpoints" / "last.pt").write_text("")
if threads == 1:
    time.sleep(60)  # a 1-thread run only ends when the sweep stops it
(run_dir / "final.json").write_text(json.dumps({"steps": steps}))
"""


class FakeJob(sweep.Job):
    """A run that finishes only when launched with 2 threads, so the test does not race the sweep."""

    def command(self, common, threads=1):
        return [PYTHON, "-c", FAKE_RUN, str(self.run_dir), str(threads), str(self.steps)]


def test_spread_threads_restarts_the_last_run_with_the_idle_cores(tmp_path):
    lone = FakeJob("fake", "bc", [], "d", 0, 10, tmp_path)
    assert sweep.run([lone], [], parallel=2, spread_threads=True) == []
    assert (lone.run_dir.parent / "launches.txt").read_text().split("\n")[:-1] == ["0-sweep 1", "0-sweep 2"]
    assert sweep.thread_shares(5, 2) == [3, 2] and sweep.thread_shares(2, 2) == [1, 1]


RETRIED_RUN = """
import json, pathlib, sys, time
run_dir, threads, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with open(run_dir.parent / "launches.txt", "a") as f:
    f.write(f"{run_dir.name} {threads}\\n")
if threads == 1:
    time.sleep(60)  # stopped by the sweep's SIGTERM before training starts: diverged.json stays
(run_dir / "diverged.json").unlink()  # as Run.steps() does once training starts
(run_dir / "final.json").write_text(json.dumps({"steps": steps}))
"""


class RetriedJob(sweep.Job):
    def command(self, common, threads=1):
        return [PYTHON, "-c", RETRIED_RUN, str(self.run_dir), str(threads), str(self.steps)]


def test_a_retried_diverged_run_stopped_before_training_is_restarted_with_the_idle_cores(tmp_path):
    """--retry-diverged with --spread-threads: the retried run is stopped for more threads before it trained (its
    diverged.json still the one it was retried for); it is started again, not counted as diverged meanwhile."""
    job = RetriedJob("fake", "bc", [], "d", 0, 10, tmp_path)
    (job.run_dir / "checkpoints").mkdir(parents=True)
    (job.run_dir / "checkpoints" / "last.pt").write_text("")
    (job.run_dir / "diverged.json").write_text(json.dumps({"step": 5, "metrics": ["loss"]}))
    assert sweep.run([job], [], parallel=2, spread_threads=True, retry_diverged=True) == []
    # the first process may be stopped before it writes its line
    assert (job.run_dir.parent / "launches.txt").read_text().split("\n")[:-1][-1] == "0-sweep 2"
    assert job.done()


def test_table_caption_states_threads_a_resume_changed():
    run = {"final": 50.0, "best": 60.0, "seed": 0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "env": {"processor": "x86_64", "cpu_count": 2, "device": "cpu"}, "wall": None, "threads": 1}
    runs = [{**run, "seed": seed, "run_dir": f"{seed}-sweep", "threads": 1 + (seed == 2)} for seed in range(3)]
    two_metrics = {("bc [eval]", "d"): runs, ("bc [eval_half_target]", "d"): runs}  # each run counted once
    mixed = table.render(two_metrics, "t", None)
    assert "from 3 runs" in mixed and "threads per run as last resumed: 2 at 1, 1 at 2" in mixed
    assert "one thread per run" not in mixed
    assert "one thread per run" in table.render({("bc", "d"): runs[:2]}, "t", None)


def test_table_lists_the_dynamics_models_the_model_based_rows_rolled_out():
    """Model-based runs' final.json records (world_models.train.model_record) become one line per dataset and
    model file, with the rows that used it; runs from before the record are counted; no section without any."""
    env = {"processor": "x86_64", "cpu_count": 2, "device": "cpu", "packages": {"torch": "2.13.0"}}
    run = {"final": 50.0, "best": 60.0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "wall": None, "threads": 1, "env": env, "model_based": True}
    record = {"file": "/cache/m.pt", "sha256": "0123456789abcdef", "epochs": 50, "holdout_mse": [0.5, 0.1, 0.3],
              "elites": [1, 2], "training": {"wall_seconds": 7200.0, "cpu_seconds": 3600.0, "timed_from_epoch": 19,
                                             "environment": {**env, "cpu_model": "AMD EPYC"}}}
    groups = {(label, "d"): [{**run, "seed": s, "run_dir": f"{label}{s}", "dynamics_model": record} for s in range(2)]
              for label in ("mopo", "ravl")}
    groups[("mobile", "e")] = [{**run, "seed": 0, "run_dir": "mobile0", "dynamics_model": None}]
    text = table.render(groups, "t", None, reps=50)
    assert ("| d | `0123456789abcdef` | 50 | 0.2 | 1.00 | 2.00 | 19 | AMD EPYC (x86_64), 2 cores, device cpu; torch 2.13.0 "
            "| mopo (2), ravl (2) |") in text
    assert "recorded no model (finished before offrl recorded it): e: 1." in text
    assert "## Dynamics models" not in table.render({("mobile", "e"): groups[("mobile", "e")]}, "t", None, reps=50)
    # rows on two machines: the model names the key of the one it trained on, described as the table describes
    # machines (here without CPU names, which one run did not record)
    other = {**env, "cpu_count": 16}
    groups[("mobile", "e")] = [{**groups[("mobile", "e")][0], "env": other}]
    text = table.render(groups, "t", None, reps=50)
    assert "- M1: x86_64, 2 cores, device cpu; torch 2.13.0\n- M2: x86_64, 16 cores" in text
    assert "| 19 | M1 | mopo (2), ravl (2) |" in text
    assert table.summarize(groups, "t", None, reps=50)["dynamics_models"]["models"][0]["machine_key"] == "M1"


def test_table_caption_names_each_machine_when_rows_ran_on_different_ones():
    cpu = {"processor": "x86_64", "cpu_count": 16, "device": "cpu", "packages": {"torch": "2.11.0"}}
    gpu = {**cpu, "device": "cuda", "cuda_device": "NVIDIA H100"}
    run = {"final": 50.0, "best": 60.0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "wall": None, "threads": 1}
    groups = {("bc", "d"): [{**run, "seed": s, "run_dir": f"bc{s}", "env": cpu} for s in range(2)],
              ("cql", "d"): [{**run, "seed": s, "run_dir": f"cql{s}", "env": gpu} for s in range(2)]}
    text = table.render(groups, "t", None)
    assert ("Hardware: each row's machine column, the machines listed below the caption; all rows: one thread "
            "per run.") in text
    assert ("Machines:\n\n- M1: x86_64, 16 cores, device cpu; torch 2.11.0\n"
            "- M2: x86_64, 16 cores, device cuda (NVIDIA H100); torch 2.11.0\n") in text
    assert "| precision | machine | final" in text
    assert "| bc | d | 2 | 10 | fp32 | M1 | 50.0" in text and "| cql | d | 2 | 10 | fp32 | M2 | 50.0" in text
    summary = table.summarize(groups, "t", None)
    assert summary["machines"] == {"M1": "x86_64, 16 cores, device cpu; torch 2.11.0",
                                   "M2": "x86_64, 16 cores, device cuda (NVIDIA H100); torch 2.11.0"}
    assert [row["machines"] for row in summary["rows"]] == [["M1"], ["M2"]]
    same = table.render({("bc", "d"): groups[("bc", "d")]}, "t", None)
    assert "Hardware: x86_64, 16 cores, device cpu; torch 2.11.0, one thread per run" in same
    assert "| machine |" not in same and "machines" not in table.summarize({("bc", "d"): groups[("bc", "d")]}, "t", None)
    # CPU model names once every run recorded one; a run from before offrl recorded it hides them all
    epyc = {**cpu, "cpu_model": "AMD EPYC 9R14", "cpu_native_bf16": True}
    named = {("bc", "d"): [{**r, "env": epyc} for r in groups[("bc", "d")]]}
    assert "Hardware: AMD EPYC 9R14 (x86_64, native bfloat16), 16 cores, device cpu;" in table.render(named, "t", None)
    named[("bc", "d")][1]["env"] = cpu
    assert "Hardware: x86_64, 16 cores, device cpu; torch 2.11.0, one thread per run" in table.render(named, "t", None)
    # a variant whose datasets ran on different machines: each of its rows names its own; a row whose seeds
    # ran on two machines names both
    xeon = {**cpu, "cpu_model": "Xeon", "cpu_native_bf16": True}
    split = {("bc", "d"): [{**r, "env": epyc} for r in groups[("bc", "d")]],
             ("bc", "e"): [{**r, "env": xeon} for r in groups[("bc", "d")]],
             ("cql", "d"): [{**r, "env": epyc} for r in groups[("bc", "d")]],
             ("cql", "e"): [{**groups[("bc", "d")][0], "env": xeon}, {**groups[("bc", "d")][1], "env": epyc}]}
    text = table.render(split, "t", None)
    assert "- M1: AMD EPYC 9R14 (x86_64, native bfloat16), 16 cores" in text and "- M2: Xeon (x86_64, native" in text
    assert "| bc | d | 2 | 10 | fp32 | M1 |" in text and "| cql | d | 2 | 10 | fp32 | M1 |" in text
    assert "| bc | e | 2 | 10 | fp32 | M2 |" in text and "| cql | e | 2 | 10 | fp32 | M1, M2 |" in text


def test_aggregate_coverage_names_each_variant_by_the_shorter_of_what_it_has_and_lacks():
    every = [f"d{i}" for i in range(5)]
    aggregates = [{"variant": "a", "datasets": every}, {"variant": "b", "datasets": every},
                  {"variant": "c", "datasets": every[:4]}, {"variant": "d", "datasets": ["d1", "d3"]}]
    assert table.coverage(aggregates) == "a, b: all 5; c: 4, all but d4; d: 2, d1, d3"
    assert table.coverage(aggregates[2:]) == "c: all 4; d: 2, d1, d3"  # all of what the variants cover


def test_speed_benchmark_refuses_an_algorithm_without_one_update_or_an_unknown_one(capsys):
    from benchmarks import speed

    for algo, message in (("mbrcsl", "its run trains a behaviour policy"),
                          ("td3bc", "unknown (known: bc td3_bc")):
        with pytest.raises(SystemExit):
            speed.main(["--algos", "bc", algo])
        assert f"--algos {algo}: {message}" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--algos td3bc: unknown"):  # with --end-to-end too, before any run
        speed.main(["--end-to-end", "20", "--algos", "td3_bc", "td3bc"])


def test_speed_benchmark_times_an_algorithm_with_the_options_given():
    """--run-args without --end-to-end sets the timed algorithm's options (WSRL's pre-training ensemble here);
    a world-model step takes none."""
    import torch

    from benchmarks import speed

    cfg = speed.configured("cql", "--hidden 16 16 --num-critics 4 --critic-subsample 2 --layer-norm", compile=True)
    assert (cfg.hidden, cfg.num_critics, cfg.critic_subsample, cfg.layer_norm, cfg.run.compile) == ((16, 16), 4, 2, True, True)
    assert speed.configured("cql", "") is None
    timed = speed.time_algorithm("cql", torch.device("cpu"), 1, 1, 1, batch_size=8,
                                 cfg=speed.configured("cql", "--hidden 16 16 --num-critics 4 --critic-subsample 2"))
    assert timed["median_ms"] > 0 and timed["batch_size"] == 8
    with pytest.raises(SystemExit, match="no options"):
        speed.configured("dynamics", "--hidden 16")


def test_speed_benchmark_times_the_world_models_and_model_based_updates(tmp_path):
    import torch

    from benchmarks import speed

    threads = torch.get_num_threads()
    (tmp_path / "speed.md").write_text("<!-- updates -->\nmodel-free table\n<!-- /updates -->\n")
    try:
        report = speed.main(["--algos", "dynamics", "rollout", "mopo", "mobile", "ravl", "--warmup", "1", "--blocks",
                             "1", "--per-block", "1", "--threads", "1", "--matmul-size", "128", "--batch-size", "8",
                             "--markdown", str(tmp_path / "speed.md"), "--section", "model-based",
                             "--title", "Model-based updates"])
    finally:
        torch.set_num_threads(threads)
    results = {r["algo"]: r for r in report["runs"][0]["results"]}
    assert set(results) == {"dynamics", "rollout", "mopo", "mobile", "ravl"}
    assert all(r["median_ms"] > 0 for r in results.values())
    assert results["dynamics"]["gflop_per_update"] > 0 and results["rollout"]["batch_size"] == 8
    table = (tmp_path / "speed.md").read_text()
    assert "| 1 | dynamics | 8 |" in table and "## Model-based updates (cpu" in table
    assert table.startswith("<!-- updates -->\nmodel-free table\n<!-- /updates -->")  # the other part is kept
    assert "<!-- model-based -->" in table and "nan: FLOPs not countable" in table


def test_speed_benchmark_compiles_the_dynamics_step_as_model_compile_does():
    """`--compile` times the dynamics ensemble's step as --model.compile trains it (the trainer's compiled loss),
    one graph."""
    import torch
    from torch._dynamo.utils import counters

    from benchmarks import speed

    before = counters["stats"]["unique_graphs"]
    _, update = speed.dynamics_step(speed.synthetic_data(), torch.device("cpu"), 8, compile=True)
    losses = [update()["nll"] for _ in range(3)]
    assert counters["stats"]["unique_graphs"] - before == 1 and all(torch.isfinite(x) for x in losses)


def test_end_to_end_charges_evaluations_and_checkpoints_as_a_full_run_makes_them():
    from benchmarks import speed

    assert speed.events_per_run(1_000_000, 5000) == 200 and speed.events_per_run(10_500, 5000) == 3
    assert speed.events_per_run(200_000, 0) == 1  # every = 0: only at the end
    evaluation = {"start": 10.0, "end": 13.0, "stepping_s": 2.0, "vector_steps": 100, "limit": 1000}
    assert speed.charged_evaluation_s(evaluation) == pytest.approx(1.0 + 20.0)  # stepping scaled to the time limit
    assert speed.charged_evaluation_s({**evaluation, "vector_steps": 1000}) == pytest.approx(3.0)
    rcsl = speed.run_config("rcsl", "offrl/tiny-v0", "cpu", 1, [])
    assert speed.periodic_work(rcsl) == 2000  # the lcm of logging every 1000 and hold-out checks every 2000


def test_speed_end_to_end_reports_a_real_run_beside_its_update_time(tiny, tmp_path, monkeypatch):
    """A smoke run (no timing is asserted): a real 40-step TD3+BC run through `python -m algos.td3_bc` gives a row
    with a finite ratio and a peak RSS; MOPO without a cached dynamics model is skipped, not trained."""
    import math

    import torch

    from benchmarks import speed

    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))  # empty
    threads = torch.get_num_threads()
    try:
        report = speed.main(["--end-to-end", "40", "--e2e-warmup", "10", "--algos", "td3_bc", "mopo", "--dataset", tiny,
                             "--run-args", "--hidden 16 16 --log.every 10 --eval.episodes 2", "--warmup", "1",
                             "--blocks", "1", "--per-block", "2", "--markdown", str(tmp_path / "speed.md"),
                             "--runs-dir", str(tmp_path / "runs")])
    finally:
        torch.set_num_threads(threads)
    td3, mopo = report["rows"]
    assert "error" not in td3 and "skipped" not in td3, td3
    assert td3["steps"] == 40 and td3["warmup"] == 10 and td3["full_steps"] == 1_000_000
    assert math.isfinite(td3["ratio"]) and td3["ratio"] > 0 and td3["update_ms"] > 0
    assert len(td3["update_round_ms"]) >= 2  # timed before and after the run
    assert td3["end_to_end_ms"] >= td3["loop_ms"] > 0 and td3["peak_rss_mib"] > 50 and td3["peak_cuda_mib"] is None
    assert td3["evaluations"] == 200 and td3["checkpoints"] == 20  # TD3+BC's defaults: eval every 5000, checkpoint 50000
    assert td3["evaluation_s"] > 0 and td3["checkpoint_s"] > 0 and td3["run_steps_per_s"] > 0
    assert "no cached dynamics model" in mopo["skipped"] and not (tmp_path / "models").exists()
    run_dir = tmp_path / "runs" / "1-threads" / "speed" / "td3_bc" / "offrl-tiny-v0" / "0-sweep"
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 40
    config = json.loads((run_dir / "config.json").read_text())
    assert config["eval"]["every"] == 0 and config["run"]["checkpoint_every"] == 0 and config["hidden"] == [16, 16]
    table = (tmp_path / "speed.md").read_text()
    assert table.startswith("<!-- end-to-end -->\n## End-to-end training speed (cpu")
    assert "| 1 | td3_bc | 40 (10) |" in table and "- mopo (1 thread(s)): skipped, no cached dynamics model" in table


def test_end_to_end_probe_finds_a_cached_model_of_data_with_rows_left_out(tiny, tmp_path, monkeypatch):
    """run_probe's guard looks for the model where load_or_train caches it: data whose s' comes from the next row
    (a D4RL file without next_observations) have their own cache entry, which the guard once missed."""
    from benchmarks import run_probe
    from offrl.data import load_dataset
    from offrl.data.sources import NEXT_ROW
    from world_models import train as wt
    from world_models.ensemble import EnsembleConfig

    monkeypatch.setattr(wt, "load_or_train", lambda *args, **kwargs: "loaded")  # restored after the test
    run_probe._no_model_training()
    dataset = load_dataset(tiny)
    dataset.metadata["next_observations"] = NEXT_ROW
    cfg = EnsembleConfig()
    with pytest.raises(SystemExit):  # nothing cached yet
        wt.load_or_train(dataset, cfg, 0, cache_dir=tmp_path)
    folder = wt.cache_folder(dataset, cfg, 0, tmp_path)
    assert folder.name.split("-")[1] == "nonterminal"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"")
    assert wt.load_or_train(dataset, cfg, 0, cache_dir=tmp_path) == "loaded"


def test_grid_script_dry_run_covers_the_grid_with_options_the_algorithms_accept(tmp_path):
    """benchmarks/grid.sh with DRY_RUN=1 runs nothing: its sweeps cover ten algorithms x nine datasets x 3 seeds
    in four budget classes, and every run's options parse for its algorithm; ONLY and DATASETS cut a slice."""
    import os
    import shlex
    import subprocess

    import tyro

    from benchmarks import speed, sweep

    def dry(**env):
        text = subprocess.run(["bash", str(speed.ROOT / "benchmarks" / "grid.sh"), str(tmp_path / "runs")], check=True,
                              capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", **env},
                              timeout=120).stdout  # a script that ignored DRY_RUN would start training
        return [shlex.split(line) for line in text.splitlines()]

    lines = dry()
    sweeps = [line for line in lines if line[:3] == ["python", "-m", "benchmarks.sweep"]]
    assert [line[line.index("--name") + 1] for line in sweeps] == ["grid-fast", "grid-slow", "grid-mopo", "grid-mb-slow"]
    algos = []
    for line in sweeps:
        datasets = line[line.index("--datasets") + 1:line.index("--seeds")]
        assert len(datasets) == 9 and line[line.index("--seeds") + 1:line.index("--steps")] == ["0", "1", "2"]
        common = shlex.split(line[line.index("--common") + 1])
        for label, algo, extra in (sweep.parse_variant(line[i + 1]) for i, x in enumerate(line) if x == "--variant"):
            module = __import__(f"algos.{algo}", fromlist=["Config"])
            tyro.cli(module.Config, args=["--dataset", datasets[0], *common, *extra])  # exits on an unknown option
            algos.append(label)
    assert sorted(algos) == sorted("bc td3_bc iql cql riql dt rcsl mopo mobile ravl".split())
    trainings = [line for line in lines if "world_models.train" in line]  # as the script runs them: one thread each
    assert len(trainings) == 9 and all(line[:5] == ["OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "python", "-m",
                                                    "world_models.train"] for line in trainings)
    assert lines[-1][:3] == ["python", "-m", "benchmarks.table"] and "results/grid/grid.json" in lines[-1]
    part = dry(ONLY="iql cql", DATASETS="offrl/hopper/medium-v0", BF16="cql")
    sweeps = [line for line in part if line[:3] == ["python", "-m", "benchmarks.sweep"]]
    assert [line[line.index("--variant") + 1] for line in sweeps] == ["iql=iql", "cql-bf16=cql --run.precision bf16"]
    assert not any("world_models.train" in line for line in part)
    assert all(line[line.index("--datasets") + 1:line.index("--seeds")] == ["offrl/hopper/medium-v0"] for line in sweeps)
    # COMPILE: --run.compile on the named algorithms, the labels unchanged, the caption's command naming it; an
    # algorithm that does not compile is refused
    part = dry(ONLY="iql cql", DATASETS="offrl/hopper/medium-v0", BF16="cql", COMPILE="cql")
    sweeps = [line for line in part if line[:3] == ["python", "-m", "benchmarks.sweep"]]
    variants = [line[line.index("--variant") + 1] for line in sweeps]
    assert variants == ["iql=iql", "cql-bf16=cql --run.precision bf16 --run.compile"]
    assert "COMPILE='cql'" in part[-1][part[-1].index("--command") + 1]
    refused = subprocess.run(["bash", str(speed.ROOT / "benchmarks" / "grid.sh"), str(tmp_path / "runs")],
                             capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", "COMPILE": "mopo"},
                             timeout=120)
    assert refused.returncode == 2 and "mopo does not compile" in refused.stderr
    # MODEL_PRECISION=bf16: the models train under bf16 and the runs ask for those models (the same cache key);
    # MODEL_COMPILE=1 likewise: the models' training loss compiled, the runs asking for those models
    part = dry(ONLY="mopo ravl", DATASETS="offrl/hopper/medium-v0", MODEL_PRECISION="bf16", MODEL_COMPILE="1")
    trains = [line[2:] for line in part if line[2:5] == ["python", "-m", "world_models.train"]]
    assert len(trains) == 1 and trains[0][trains[0].index("--model.precision") + 1] == "bf16"
    assert "--model.compile" in trains[0]
    checked = []
    for line in (line for line in part if line[:3] == ["python", "-m", "benchmarks.sweep"]):
        for label, algo, extra in (sweep.parse_variant(line[i + 1]) for i, x in enumerate(line) if x == "--variant"):
            assert extra[extra.index("--model.precision") + 1] == "bf16"
            module = __import__(f"algos.{algo}", fromlist=["Config"])
            model = tyro.cli(module.Config, args=["--dataset", "d", *extra]).model
            assert model.precision == "bf16" and model.compile
            checked.append(label)
    assert checked == ["mopo", "ravl"]
    assert "MODEL_PRECISION=bf16 MODEL_COMPILE=1" in part[-1][part[-1].index("--command") + 1]
    plain = dry(ONLY="mopo", DATASETS="offrl/hopper/medium-v0")
    assert any(line[2:5] == ["python", "-m", "world_models.train"] for line in plain)
    assert not any("--model.compile" in " ".join(line) for line in plain)
    # STATUS=1 reads the (here empty) run folders through benchmarks.sweep --status and makes or trains nothing
    env = {k: v for k, v in os.environ.items() if k != "DRY_RUN"}
    text = subprocess.run(["bash", str(speed.ROOT / "benchmarks" / "grid.sh"), str(tmp_path / "status")], check=True,
                          capture_output=True, text=True, env={**env, "STATUS": "1", "ONLY": "bc mopo"},
                          timeout=120).stdout
    assert [line for line in text.splitlines() if line.startswith("grid-")] == ["grid-fast (100000 steps):",
                                                                                 "grid-mopo (20000 steps):"]
    rows = {line.split()[0]: line.split()[1:8] for line in text.splitlines() if line.split()[0] in ("bc", "mopo")}
    assert rows == {"bc": ["27", "0", "0", "0", "0", "27", "2700000"], "mopo": ["27", "0", "0", "0", "0", "27", "540000"]}
    # and each dataset's dynamics model (world_models.train --status with the grid's model options)
    models = text.split("dynamics models (world_models.train --seed 0 --model.max-epochs 50 --threads 1 --status):\n")[1]
    assert models.splitlines()[:9] == [f"  {d}: dataset not made yet" for d in (
        f"offrl/{env}/{level}-v0" for env in ("hopper", "halfcheetah", "walker2d")
        for level in ("medium", "medium-replay", "medium-expert"))]
    assert not (tmp_path / "status").exists()


def test_grid_script_makes_data_with_other_bytes_once_more_under_mkl_cbwr_then_refuses_it(tmp_path):
    """A dataset grid.sh makes with other bytes than the committed reference is made again under
    MKL_CBWR=SSE4_2 (it reproduces some datasets on Intel CPUs); still other, the grid refuses to run on it and
    names the fix. A dataset made before is left as it is (no second making on every call)."""
    import os
    import subprocess

    from benchmarks import speed

    policies = tmp_path / "policies"  # a reference no machine makes, for the tiny dataset
    policies.mkdir()
    (policies / "checksums.json").write_text(json.dumps({"offrl/tiny-v0": "0" * 16}))
    env = {**{k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "MKL_CBWR")},
           "MINARI_DATASETS_PATH": str(tmp_path / "minari"), "OFFRL_POLICIES_PATH": str(policies),
           "ONLY": "bc", "DATASETS": "offrl/tiny-v0"}

    def grid():
        return subprocess.run(["bash", str(speed.ROOT / "benchmarks" / "grid.sh"), str(tmp_path / "runs")],
                              capture_output=True, text=True, env=env, timeout=300)

    first = grid()
    assert first.returncode == 2, first.stderr
    assert "offrl/tiny-v0: made here with other bytes than the committed reference; making it again with " \
        "MKL_CBWR=SSE4_2" in first.stderr
    assert "the committed reference is 0000000000000000" in first.stderr and "MKL_CBWR=SSE4_2 in front of" in first.stderr
    assert not (tmp_path / "runs" / "grid-fast").exists()  # no run started
    again = grid()
    assert again.returncode == 2 and "making it again" not in again.stderr
    env["STATUS"] = "1"  # says so, and runs nothing
    status = grid()
    assert status.returncode == 0, status.stderr
    assert "datasets:\n  offrl/tiny-v0: made here with other bytes than the committed reference (" in status.stdout
    assert "the reference 0000000000000000): its runs are refused unless OTHER_DATA=1" in status.stdout


def test_wsrl_script_dry_run_pre_trains_then_runs_four_variants_with_options_the_algorithms_accept(tmp_path):
    """benchmarks/wsrl.sh with DRY_RUN=1 runs nothing: a CQL pre-training sweep, then the four online variants
    from each seed's pre-trained run, every run's options parsing for its algorithm; SEEDS runs a subset with
    the same per-seed commands, PRE_EVAL_EVERY sets only the pre-training's evaluation period, PRE_COMMON and
    ONLINE_COMMON add options to one stage, STAGE=pre stops after the pre-training."""
    import os
    import shlex
    import subprocess

    import tyro

    from benchmarks import speed, sweep

    def dry(out=tmp_path / "runs", **env):
        text = subprocess.run(["bash", str(speed.ROOT / "benchmarks" / "wsrl.sh"), str(out)], check=True,
                              capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", **env},
                              timeout=120).stdout  # a script that ignored DRY_RUN would start training
        return [shlex.split(line) for line in text.splitlines()]

    def sweeps(lines):
        return {line[line.index("--name") + 1]: line for line in lines if line[:3] == ["python", "-m", "benchmarks.sweep"]}

    def option(line, name):
        return line[line.index(name) + 1]

    lines = dry()
    assert not (tmp_path / "runs").exists()  # nothing ran
    pre, online = sweeps(lines)["wsrl-pre"], sweeps(lines)["wsrl-online"]
    assert [line[:3] for line in lines] == [["python", "-m", "offrl.cli"], pre[:3], online[:3],
                                            ["python", "-m", "benchmarks.wsrl_plot"], ["python", "-m", "benchmarks.table"]]
    labels = {}
    for line in (pre, online):
        assert line[line.index("--seeds") + 1:line.index("--steps")] == ["0", "1", "2"]
        common = shlex.split(option(line, "--common"))
        for label, algo, extra in (sweep.parse_variant(line[i + 1]) for i, x in enumerate(line) if x == "--variant"):
            extra = [x.replace("{seed}", "0") for x in extra]
            module = __import__(f"algos.{algo}", fromlist=["Config"])
            labels[label] = tyro.cli(module.Config, args=["--dataset", "offrl/hopper/medium-v0", *common, *extra])
    assert sorted(labels) == ["cql", "no-warmup", "retain-0.5", "scratch", "wsrl"]
    assert labels["cql"].num_critics == 10 and labels["cql"].eval.every == 5000
    pre_run = str(tmp_path / "runs" / "wsrl-pre" / "cql" / "cql" / "offrl-hopper-medium-v0" / "0-sweep")
    assert [str(labels[k].checkpoint) for k in ("wsrl", "retain-0.5", "no-warmup")] == [pre_run] * 3
    assert (labels["wsrl"].warmup_steps, labels["no-warmup"].warmup_steps, labels["retain-0.5"].offline_ratio) == (5000, 0, 0.5)
    # the plot and the table caption the commands they were made by
    assert all(option(line, "--command").startswith(shlex.join(pre[:5])) for line in lines[3:])

    part = dry(SEEDS="1", PRE_EVAL_EVERY="1000", COMMON="--run.precision bf16", EVAL_EVERY="500", JOBS="1")
    pre1, online1 = sweeps(part)["wsrl-pre"], sweeps(part)["wsrl-online"]
    assert pre1[pre1.index("--seeds") + 1:pre1.index("--steps")] == ["1"] and option(online1, "--seeds") == "1"
    assert shlex.split(option(pre1, "--common"))[:2] == ["--eval.every", "1000"]
    assert shlex.split(option(online1, "--common"))[:2] == ["--eval.every", "500"]
    assert all(shlex.split(option(line, "--common"))[-2:] == ["--run.precision", "bf16"] for line in (pre1, online1))
    assert option(part[3], "--title").endswith(", 1 seed")
    assert [line[:3] for line in dry(STAGE="pre", SEEDS="2")] == [["python", "-m", "offrl.cli"], pre[:3]]
    staged = sweeps(dry(COMMON="--run.precision bf16", PRE_COMMON="--log.every 500", ONLINE_COMMON="--run.compile"))
    assert shlex.split(option(staged["wsrl-pre"], "--common"))[-4:] == ["--run.precision", "bf16", "--log.every", "500"]
    assert shlex.split(option(staged["wsrl-online"], "--common"))[-3:] == ["--run.precision", "bf16", "--run.compile"]
    # an out-dir with a space reaches the online runs' --checkpoint as one path
    spaced = sweeps(dry(out=tmp_path / "my runs"))["wsrl-online"]
    checkpoints = {option(sweep.parse_variant(spaced[i + 1])[2], "--checkpoint")
                   for i, x in enumerate(spaced) if x == "--variant"}
    assert checkpoints == {str(tmp_path / "my runs" / "wsrl-pre" / "cql" / "cql" / "offrl-hopper-medium-v0" / "{seed}-sweep"),
                           "none"}


def test_a_table_says_env_steps_for_online_algorithms():
    """--steps counts gradient steps offline and env steps online (WSRL, SAC: their STEP_UNIT); the caption and
    the learning curves' x axis say which."""
    from benchmarks import table

    assert table.step_unit(["bc", "iql", "bc"]) == "gradient steps"
    assert table.step_unit(["wsrl", "sac"]) == "env steps"
    assert table.step_unit(["iql", "wsrl", "sac"]) == "steps (env steps for sac, wsrl; gradient steps for the others)"
    assert table.step_unit(["no_such_algorithm"]) == "gradient steps"


def test_only_rollout_rounds_inside_the_timed_loop_count_toward_its_rollout_share():
    """MOPO/MOBILE/RAVL's rollout rounds are the algorithm's own work: the ratio's denominator adds their time per
    step, from the rounds that started and ended inside the loop after its warm-up (run_probe's windows)."""
    from benchmarks import speed

    loop = {"t_warm": 10.0, "t_end": 30.0}
    rounds = [{"start": 1.0, "end": 3.0},     # the warm-up's round: not in the timed loop
              {"start": 12.0, "end": 14.5},   # inside
              {"start": 20.0, "end": 21.0},   # inside
              {"start": 29.5, "end": 31.0}]   # ends after the loop
    assert speed.seconds_in_loop(rounds, loop) == pytest.approx(3.5)
    assert speed.seconds_in_loop([], loop) == 0


def test_sweep_status_counts_runs_by_state_and_prices_the_steps_left_at_the_finished_runs_pace(tmp_path, capsys):
    """`--status` runs nothing; it reads the run folders: final.json (finished), a held lock (running),
    diverged.json (diverged: no steps left, a sweep does not resume it), a checkpoint (interrupted), nothing
    (not started); the steps left come from each unfinished run's last logged step, the core-hours from the
    finished runs' core-seconds per step (final.json's core_seconds, or for a run without them its wall_seconds
    times config.json's threads)."""
    import argparse
    import json

    argv = ["--name", "s", "--out-dir", str(tmp_path), "--variant", "bc=bc", "--variant", "iql=iql",
            "--datasets", "d", "--seeds", "0", "1", "2", "--steps", "100"]
    jobs = {(j.label, j.seed): j for j in sweep.jobs_of(argparse.Namespace(
        name="s", out_dir=str(tmp_path), variant=["bc=bc", "iql=iql"], datasets=["d"], seeds=[0, 1, 2], steps=100))}
    # bc: two finished runs, 0.36 and 0.72 core-seconds a step: one recorded its core-seconds (36 s of wall
    # time, at first on one thread, then resumed on two), the other predates them (36 s on 2 threads)
    finished = {0: {"steps": 100, "wall_seconds": 30.0, "core_seconds": 36.0}, 1: {"steps": 100, "wall_seconds": 36.0}}
    for seed, final in finished.items():
        run_dir = jobs["bc", seed].run_dir
        run_dir.mkdir(parents=True)
        (run_dir / "final.json").write_text(json.dumps(final))
        (run_dir / "config.json").write_text(json.dumps({"run": {"threads": 2}}))
    interrupted = jobs["bc", 2].run_dir
    (interrupted / "checkpoints").mkdir(parents=True)
    (interrupted / "checkpoints" / "last.pt").write_bytes(b"")
    (interrupted / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "loss": 1.0}) + "\n" for k in (20, 40)))
    stopped = jobs["iql", 1].run_dir  # a NaN at step 50, after a checkpoint
    (stopped / "checkpoints").mkdir(parents=True)
    (stopped / "checkpoints" / "last.pt").write_bytes(b"")
    (stopped / "metrics.jsonl").write_text(json.dumps({"step": 50, "loss": float("nan")}) + "\n")
    (stopped / "diverged.json").write_text(json.dumps({"step": 50, "metrics": ["loss"]}))
    running = jobs["iql", 0]
    running.run_dir.mkdir(parents=True)
    (running.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10}) + "\n")
    with open(running.lock_path, "a") as lock:  # as the run's process holds it
        assert sweep.try_lock(lock)
        sweep.main([*argv, "--status"])
        rows = {r["variant"]: r for r in sweep.status(list(jobs.values()))}
    assert rows["bc"] == {"variant": "bc", "runs": 3, "finished": 2, "running": 0, "diverged": 0, "interrupted": 1,
                          "not started": 0, "steps_left": 60, "core_seconds_per_step": pytest.approx(0.54),
                          "core_hours_left": pytest.approx(60 * 0.54 / 3600)}
    assert [rows["iql"][k] for k in ("running", "diverged", "interrupted", "not started", "steps_left")] == [1, 1, 0, 1, 190]
    assert rows["iql"]["core_seconds_per_step"] is None and rows["iql"]["core_hours_left"] is None
    printed = capsys.readouterr().out
    assert "? (none finished)" in printed
    assert not jobs["iql", 2].run_dir.exists() and not jobs["iql", 2].lock_path.exists()  # it made nothing
    # with the lock let go, that run counts as not started (no checkpoint yet): a sweep starts it from step 0
    after = {r["variant"]: r for r in sweep.status(list(jobs.values()))}["iql"]
    assert after["not started"] == 2 and after["diverged"] == 1 and after["steps_left"] == 200


def test_a_sweep_leaves_a_diverged_run_alone_unless_told_to_retry_it(tmp_path, capsys):
    """Resumed, a run that stopped on a NaN replays the same steps with the same RNG state into the same NaN: a
    sweep starts no process for it, names it and exits non-zero; --retry-diverged hands it to the backend."""
    import argparse
    import json

    args = argparse.Namespace(name="s", out_dir=str(tmp_path), variant=["bc=bc"], datasets=["d"], seeds=[0, 1], steps=100)
    first, second = sweep.jobs_of(args)
    for job in (first, second):
        (job.run_dir / "checkpoints").mkdir(parents=True)
        (job.run_dir / "checkpoints" / "last.pt").write_bytes(b"")
    (second.run_dir / "diverged.json").write_text(json.dumps({"step": 70, "metrics": ["actor_loss"], "value": "nan"}))
    runnable, left = sweep.set_aside_diverged([first, second])
    assert runnable == [first] and left == [second]
    assert "bc d seed 1 (actor_loss not finite at step 70" in capsys.readouterr().out
    (second.run_dir / "final.json").write_text(json.dumps({"steps": 100}))  # finished after all (resumed by hand)
    assert sweep.set_aside_diverged([second]) == ([second], [])
    (second.run_dir / "final.json").unlink()

    handed = []
    def fake_run(jobs, *rest):
        handed.append(jobs)
        return []
    argv = ["--name", "s", "--out-dir", str(tmp_path), "--variant", "bc=bc", "--datasets", "d", "--seeds", "0", "1",
            "--steps", "100"]
    import unittest.mock
    with unittest.mock.patch.object(sweep, "run", fake_run):
        with pytest.raises(SystemExit) as stopped:
            sweep.main(argv)
        assert stopped.value.code == sweep.RUNS_FAILED
        assert "1 run(s) failed (1 left alone as diverged)" in capsys.readouterr().err
        assert [j.seed for j in handed[-1]] == [0]
        sweep.main([*argv, "--retry-diverged"])
        assert [j.seed for j in handed[-1]] == [0, 1]
    # a run that diverges in another process while a sweep waits for it is not started again either: the local
    # backend passes it over, a Ray task returns without starting it
    assert sweep.run([second], [], 1) == [second] and not second.log_path.exists()
    result = sweep.run_command(second.command([]), str(second.run_dir), str(second.log_path), {}, None)
    assert "diverged" in str(result["returncode"]) and second.log_path.read_text() == ""


def assert_committed_table_regenerates(script: str, args: list[str], env: dict, folder: Path, names: tuple[str, ...],
                                        tmp_path, hint: str):
    """The last command `DRY_RUN=1 bash <script> <args>` prints is a benchmarks.table command; run with its
    --out/--json/--plots moved into tmp_path, it gives the committed files `names` in `folder`, byte for byte."""
    import os
    import shlex
    import subprocess

    printed = subprocess.run(["bash", script, *args], cwd=ROOT, check=True, text=True, capture_output=True,
                             env={**os.environ, **env, "DRY_RUN": "1"}, timeout=120).stdout
    command = shlex.split(printed.splitlines()[-1])
    assert command[:3] == ["python", "-m", "benchmarks.table"]
    committed = {}
    for option in ("--out", "--json", "--plots"):
        if option in command:
            path = Path(command[command.index(option) + 1])
            committed[path.name] = ROOT / path
            command[command.index(option) + 1] = str(tmp_path / path.name)
    assert sorted(committed) == sorted([*names, "plots"])
    subprocess.run([PYTHON, *command[1:]], cwd=ROOT, check=True, capture_output=True, timeout=600)
    for name in names:
        assert committed[name] == folder / name
        assert (tmp_path / name).read_bytes() == committed[name].read_bytes(), f"{folder.name}/{name}: {hint}"


def test_committed_grid_table_regenerates_from_the_committed_run_folders(tmp_path):
    """results/grid/grid.md and grid.json are what grid.sh's table command makes from the run folders committed
    under results/grid/runs, byte for byte: the budgets and precision come from the table's own caption, the
    command from `DRY_RUN=1 benchmarks/grid.sh`, and only its output paths move to a temporary folder."""
    import re
    import shlex

    md = (ROOT / "results" / "grid" / "grid.md").read_text()
    words = shlex.split(re.search(r"^Command: `(.*)`$", md, re.M).group(1))
    script = words.index("benchmarks/grid.sh")
    assert words[script + 1:] == ["results/grid/runs"], "the committed table must come from the committed run folders"
    env = dict(word.split("=", 1) for word in words[:script])
    assert_committed_table_regenerates(
        "benchmarks/grid.sh", ["results/grid/runs"], env, ROOT / "results" / "grid", ("grid.md", "grid.json"), tmp_path,
        "not what the run folders under results/grid/runs give: a run finished or was added after the table was "
        "made; make it again with grid.sh's step-4 command (DRY_RUN=1 prints it)")


def test_committed_riql_reward_scale_table_regenerates_from_its_committed_run_folders(tmp_path):
    """results/riql-reward-scale/ is what benchmarks/riql_reward_scale.sh's table command (DRY_RUN=1 prints it)
    makes from the run folders committed beside it and the grid's riql-bf16 and iql-bf16 hopper runs, byte for
    byte."""
    folder = ROOT / "results" / "riql-reward-scale"
    grid_iql = len(list((ROOT / "results" / "grid" / "runs" / "grid-fast" / "iql-bf16").glob("iql/offrl-hopper-*/*/final.json")))
    assert json.loads((folder / "riql-reward-scale.json").read_text())["runs"] == 18 + grid_iql, \
        "2 RIQL variants x 3 datasets x 3 seeds, and the grid's IQL hopper runs made so far"
    assert_committed_table_regenerates(
        "benchmarks/riql_reward_scale.sh", [], {}, folder, ("riql-reward-scale.md", "riql-reward-scale.json"), tmp_path,
        "not what the committed run folders give; make it again with the script's last command (DRY_RUN=1 prints it)")


WSRL_100K_ONLINE_30K = {"SEEDS": "0 1 2", "JOBS": "2", "COMMON": "--run.precision bf16", "PRE_COMMON": "--run.compile",
                        "ONLINE_COMMON": "--run.compile", "PRE_STEPS": "100000", "PRE_EVAL_EVERY": "2500",
                        "ONLINE_STEPS": "30000", "WARMUP": "5000", "EVAL_EVERY": "500", "DIP_WINDOW": "3000",
                        "LAST_EVALS": "10", "CONTEXT_DIP_WINDOW": "5000",
                        "RESULTS": "results/wsrl-hopper-medium-100k-online30k"}


def test_committed_wsrl_30k_tables_regenerate_from_their_committed_run_folders(tmp_path):
    """results/wsrl-hopper-medium-100k-online30k{.md,-claims.md,.json} are what benchmarks/wsrl.sh's two render
    commands (DRY_RUN=1 prints them; results/README gives the settings) make from the committed run folders, byte
    for byte (the PNG is left out: matplotlib's bytes are not the point)."""
    import os
    import shlex
    import subprocess

    out = "results/wsrl-hopper-medium-100k-online30k/runs"
    printed = subprocess.run(["bash", "benchmarks/wsrl.sh", out], cwd=ROOT, check=True, text=True, capture_output=True,
                             env={**os.environ, **WSRL_100K_ONLINE_30K, "DRY_RUN": "1"}, timeout=120).stdout
    commands = [shlex.split(line) for line in printed.splitlines()]
    plot, table = commands[-2], commands[-1]
    assert plot[:3] == ["python", "-m", "benchmarks.wsrl_plot"] and table[:3] == ["python", "-m", "benchmarks.table"]
    results = ROOT / WSRL_100K_ONLINE_30K["RESULTS"]
    moved = {}
    for command in (plot, table):
        for option in ("--out", "--markdown"):
            if option in command:
                path = Path(command[command.index(option) + 1])
                moved[path.name] = ROOT / path
                command[command.index(option) + 1] = str(tmp_path / path.name)
        subprocess.run([PYTHON, *command[1:]], cwd=ROOT, check=True, capture_output=True, timeout=600)
    names = [f"{results.name}.md", f"{results.name}-claims.md", f"{results.name}.json"]
    assert sorted(moved) == sorted([f"{results.name}.png", *names[:2]])
    for name in names:
        assert (tmp_path / name).read_bytes() == (results.parent / name).read_bytes(), \
            f"{name}: not what the committed run folders give; render it again (results/README, WSRL)"


def test_a_sweep_refuses_finished_runs_made_with_other_options(tmp_path):
    """A finished run counts as the sweep's only if the sweep's command line for it gives the config it was made
    with (up to what a resume may change): else the table would mix configs under one label."""
    import tyro

    from benchmarks import sweep
    from offrl.config import to_dict

    job = sweep.Job("bc", "bc", ["--frac", "0.5"], "offrl/tiny-v0", 0, 100, tmp_path / "s")
    made_with = ["--eval.episodes", "3"]
    job.run_dir.mkdir(parents=True)
    cfg = tyro.cli(__import__("algos.bc", fromlist=["Config"]).Config, args=job.command(made_with)[3:])
    (job.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), default=str))
    (job.run_dir / "final.json").write_text(json.dumps({"steps": 100}))
    sweep.check_finished_options([job], made_with)  # the same options
    sweep.check_finished_options([job], ["--eval.episodes", "10", "--run.threads", "2"])  # what a resume may change
    with pytest.raises(SystemExit, match=r"(?s)1 finished run\(s\) were made with other options.*frac: 0.5 -> 0.25"):
        sweep.check_finished_options([sweep.Job("bc", "bc", ["--frac", "0.25"], "offrl/tiny-v0", 0, 100, tmp_path / "s")],
                                     made_with)
    # MOBILE records the dataset's model-epoch cap (30 on walker2d medium) that its command line leaves unset
    import algos.mobile

    mobile = sweep.Job("mobile", "mobile", [], "offrl/walker2d/medium-v0", 0, 100, tmp_path / "m")
    mobile.run_dir.mkdir(parents=True)
    recorded = algos.mobile.resolve_config(tyro.cli(algos.mobile.Config, args=mobile.command([])[3:]))
    assert recorded.model.max_epochs == 30
    (mobile.run_dir / "config.json").write_text(json.dumps(to_dict(recorded), default=str))
    (mobile.run_dir / "final.json").write_text(json.dumps({"steps": 100}))
    sweep.check_finished_options([mobile], [])
    with pytest.raises(SystemExit, match=r"model.max_epochs: 30 -> 5"):
        sweep.check_finished_options([sweep.Job("mobile", "mobile", ["--model.max-epochs", "5"], "offrl/walker2d/medium-v0",
                                                0, 100, tmp_path / "m")], [])
    # finished at another --steps with no checkpoint (a committed record): refused, not started afresh elsewhere
    longer = sweep.Job("bc", "bc", ["--frac", "0.5"], "offrl/tiny-v0", 0, 200, tmp_path / "s")
    with pytest.raises(SystemExit, match=r"finished at 100 steps, no checkpoint to continue to 200"):
        sweep.check_finished_options([longer], made_with)
    (job.run_dir / "checkpoints").mkdir()
    (job.run_dir / "checkpoints" / "last.pt").write_text("")
    sweep.check_finished_options([longer], made_with)  # with a checkpoint the sweep extends it


def test_a_run_another_sweep_finishes_meanwhile_counts_only_with_this_sweeps_options(tmp_path, monkeypatch, capsys):
    """A second sweep under the same name waits for the first's runs; one that first sweep finishes with other
    options (looked at only once it is finished) is this sweep's failure, not its run."""
    import tyro

    from benchmarks import sweep
    from offrl.config import to_dict

    made_with = ["--eval.episodes", "3"]
    job = sweep.Job("bc", "bc", ["--frac", "0.5"], "offrl/tiny-v0", 0, 100, tmp_path / "s")
    job.run_dir.mkdir(parents=True)
    cfg = tyro.cli(__import__("algos.bc", fromlist=["Config"]).Config, args=job.command(made_with)[3:])
    (job.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), default=str))
    (job.run_dir / "final.json").write_text(json.dumps({"steps": 100}))
    monkeypatch.setattr(sweep, "unfinished", lambda jobs: list(jobs))  # unfinished when the sweep looked
    other = sweep.Job("bc", "bc", ["--frac", "0.25"], "offrl/tiny-v0", 0, 100, tmp_path / "s")
    assert sweep.run([other], made_with, parallel=1) == [other]
    assert "finished by another process with other options than this sweep's (frac: 0.5 -> 0.25)" in capsys.readouterr().out
    assert sweep.run([job], made_with, parallel=1) == []
    assert "done bc offrl/tiny-v0 seed 0 (by another process)" in capsys.readouterr().out
    # finished between the loop's look and the lock: launch finds it so under the lock
    looks = []
    monkeypatch.setattr(sweep.Job, "done", lambda self: looks.append(1) or len(looks) > 1)
    assert sweep.run([other], made_with, parallel=1) == [other] and len(looks) >= 2
    printed = capsys.readouterr().out
    assert "finished by another process with other options" in printed and "start bc" not in printed


def test_a_sweep_refuses_a_variant_label_given_twice(tmp_path):
    """A label names the run folders: two variants under one label would share them (the second calling the
    first's runs its own)."""
    from benchmarks import sweep

    with pytest.raises(SystemExit, match="--variant label 'a' given more than once"):
        sweep.main(["--name", "s", "--out-dir", str(tmp_path), "--datasets", "offrl/tiny-v0", "--seeds", "0",
                    "--steps", "10", "--variant", "a=bc", "--variant", "a=bc --frac 0.5"])


def test_a_ray_task_does_not_run_a_run_finished_while_it_waited(tmp_path):
    """A Ray task that gets the run's lock after another sweep finished the run returns without starting it
    (a resume would rewrite final.json with one more resume and more wall time)."""
    from benchmarks import sweep

    run_dir = tmp_path / "0-sweep"
    run_dir.mkdir()
    (run_dir / "final.json").write_text(json.dumps({"steps": 100}))
    never = [PYTHON, "-m", "algos.no_such_module", "--steps", "100"]  # exits 1 if it were started
    result = sweep.run_command(never, str(run_dir), str(tmp_path / "0-sweep.log"), {}, None)
    assert result["returncode"] == 0 and not (tmp_path / "0-sweep.log").read_text()
    assert sweep.run_command([*never[:-1], "200"], str(run_dir), str(tmp_path / "0-sweep.log"), {}, None)["returncode"] == 1
    # a run whose final.json records a failure (MBRCSL without a kept rollout) is run again, as the local backend does
    (run_dir / "final.json").write_text(json.dumps({"steps": 100, "failed": "no rollout passed the threshold"}))
    assert sweep.run_command(never, str(run_dir), str(tmp_path / "0-sweep.log"), {}, None)["returncode"] == 1


def test_a_run_recorded_as_failed_is_run_again_and_named_by_the_table(tmp_path, capsys):
    """MBRCSL without a kept rollout writes final.json (its rollout statistics) marked failed and exits 1: a sweep
    counted it finished on the next run, and the table dropped it without a word."""
    job = sweep.Job("m", "mbrcsl", [], "offrl/tiny-v0", 0, 20, tmp_path)
    job.run_dir.mkdir(parents=True)
    final = {"algo": "mbrcsl", "dataset": "offrl/tiny-v0", "seed": 0, "steps": 20, "rollouts/kept": 0,
             "behaviour/normalized_score": 12.5}
    (job.run_dir / "final.json").write_text(json.dumps(final))
    (job.run_dir / "config.json").write_text(json.dumps({"eval": {"episodes": 2}, "run": {}}))
    (job.run_dir / "environment.json").write_text("{}")
    (job.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "behaviour/normalized_score": 12.5}) + "\n")
    assert job.done()
    (job.run_dir / "final.json").write_text(json.dumps({**final, "failed": "no rollout passed the threshold"}))
    assert not job.done()
    assert table.collect(tmp_path) == {}  # no RCSL score: named, not silently dropped
    assert f"{job.run_dir} failed (no rollout passed the threshold): no eval/normalized_score" in capsys.readouterr().err
    (kept,) = table.collect(tmp_path, ["behaviour/normalized_score"]).values()  # its behaviour policy's score stands
    assert kept[0]["final"] == 12.5


@pytest.mark.skipif(not HAS_RAY, reason="ray is an optional extra")
@pytest.mark.parametrize("given, env, expected", [(None, None, "local"), (None, "10.0.0.1:6379", None),
                                                  ("auto", None, "auto")])
def test_ray_backend_joins_the_cluster_it_is_told_to(given, env, expected, tmp_path, monkeypatch):
    """Without --ray-address or RAY_ADDRESS the sweep starts its own Ray instance, as --help says; ray.init(None)
    would join a cluster that `ray start` left running on the machine."""
    import ray

    class Started(Exception):
        pass

    def init(address=None, **kwargs):
        raise Started(address)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    job = sweep.Job("r", "bc", [], "offrl/tiny-v0", 0, 20, tmp_path)
    with pytest.raises(Started) as started:
        sweep.run_ray([job], [], given)
    assert started.value.args[0] == expected


def test_benchmark_tools_refuse_bad_input_with_one_line_and_change_nothing(tmp_path, capsys, monkeypatch):
    """From a bad-input audit of benchmarks/*.py: a markdown part with a lost marker (the next write took the
    following part with it), an --env-key that names no single folder (suite_policies replaces that folder: '' was
    the whole policies folder), a dataset card with no dataset on the machine (it emptied the committed card),
    --jobs 0 (waited forever), --steps below 1, --reps below 1, and a finished run without the table's metric
    (left out of its row without a word)."""
    import shutil

    from benchmarks import dataset_card, plots, seeds_throughput, suite_policies
    from benchmarks.sections import write_section

    page = tmp_path / "page.md"
    page.write_text("<!-- a -->\nold\n\n<!-- b -->\nkeep\n<!-- /b -->\n")
    with pytest.raises(SystemExit, match="part 'a' has 1 '<!-- a -->' and 0 '<!-- /a -->' markers"):
        write_section(page, "a", "new")
    assert "keep" in page.read_text() and "new" not in page.read_text()
    # the measuring commands refuse such a file (or a folder) before they measure, not after
    from benchmarks import contention, speed, speed_gpu

    def measured(*args, **kwargs):
        raise AssertionError("measured before it checked --markdown")

    for module, name in ((speed, "matmul_gflops"), (speed, "end_to_end"), (contention.subprocess, "run"),
                         (seeds_throughput, "run_all")):
        monkeypatch.setattr(module, name, measured)
    for main, argv, part in ((speed.main, ["--algos", "bc"], "updates"),
                             (speed.main, ["--end-to-end", "10", "--algos", "bc"], "end-to-end"),
                             (contention.main, [], "contention"), (seeds_throughput.main, [], "seeds-in-one-process"),
                             (speed_gpu.main, [], "gpu")):
        page.write_text(f"<!-- {part} -->\nold\n")
        with pytest.raises(SystemExit, match=f"part '{part}' has 1"):  # speed_gpu: before "needs a CUDA device"
            main([*argv, "--markdown", str(page)])
    with pytest.raises(SystemExit, match="is a folder"):
        seeds_throughput.main(["--markdown", str(tmp_path)])
    with pytest.raises(SystemExit):
        speed_gpu.main(["--seed-algos", "iql", "cql", "no_such"])
    assert "--seed-algos cql no_such: no batched-seeds trainer (algorithms with one: bc iql td3_bc)" in capsys.readouterr().err
    policies_dest = tmp_path / "policies"
    (policies_dest / "hopper").mkdir(parents=True)
    for key in ("", "..", "hopper/../..", "a/b"):
        with pytest.raises(SystemExit):
            suite_policies.main([str(tmp_path), "--env-key", key, "--dest", str(policies_dest)])
        assert f"--env-key {key!r}: one folder name" in capsys.readouterr().err
    assert (policies_dest / "hopper").is_dir()
    card = tmp_path / "datasets.md"
    card.write_text("the committed card\n")
    with pytest.raises(SystemExit, match="none of the suite's datasets is on this machine"):
        dataset_card.main(["--out", str(card)])
    assert card.read_text() == "the committed card\n"
    for main, argv, message in ((seeds_throughput.main, ["--jobs", "0"], "--jobs: at least 1"),
                                (sweep.main, ["--name", "s", "--out-dir", str(tmp_path), "--datasets", "d", "--seeds",
                                              "0", "--steps", "-5", "--variant", "bc=bc"], "--steps -5: at least 1"),
                                (plots.main, [str(tmp_path), "--out-dir", str(tmp_path / "p"), "--reps", "0"],
                                 "--reps 0: at least 1")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    # a finished run without the metric: a note names it
    run = tmp_path / "sweep" / "bc" / "bc" / "offrl-hopper-medium-v0" / "0-sweep"
    shutil.copytree(ROOT / "results/grid/runs/grid-fast/bc-bf16/bc/offrl-hopper-medium-v0/0-sweep", run)
    shutil.copytree(ROOT / "results/grid/runs/grid-fast/bc-bf16/bc/offrl-hopper-medium-v0/1-sweep", run.parent / "1-sweep")
    final = json.loads((run / "final.json").read_text())
    del final["eval/normalized_score"]
    (run / "final.json").write_text(json.dumps(final))
    groups = table.collect(tmp_path / "sweep")
    assert [r["seed"] for rs in groups.values() for r in rs] == [1]
    assert f"note: {run} finished: no eval/normalized_score in its final.json, not in that row" in capsys.readouterr().err
    # a damaged final.json under --datasets, an --out that is a folder, rollout counts of no run
    (run / "final.json").write_text("{")
    with pytest.raises(SystemExit, match=f"run folder {run}: cannot read its records"):
        table.main([str(tmp_path / "sweep"), "--datasets", "offrl/hopper/medium-v0"])
    with pytest.raises(SystemExit):
        table.main([str(tmp_path / "sweep"), "--out", str(tmp_path)])
    assert f"--out {tmp_path}: a folder, or under a file" in capsys.readouterr().err
    # sweep --status over a finished run whose config.json is damaged: its pace is left out, with a note
    status_run = tmp_path / "status" / "s" / "bc" / "bc" / "offrl-hopper-medium-v0" / "0-sweep"
    shutil.copytree(ROOT / "results/grid/runs/grid-fast/bc-bf16/bc/offrl-hopper-medium-v0/0-sweep", status_run)
    final = json.loads((status_run / "final.json").read_text())
    final.pop("core_seconds", None)  # a run from before it: its pace comes from config.json's threads
    (status_run / "final.json").write_text(json.dumps(final))
    (status_run / "config.json").write_text("{")
    sweep.main(["--name", "s", "--out-dir", str(tmp_path / "status"), "--datasets", "offrl/hopper/medium-v0",
                "--seeds", "0", "1", "--steps", "100000", "--variant", "bc=bc", "--status"])
    assert f"note: run folder {status_run}: cannot read its records" in capsys.readouterr().err
    from benchmarks import rollout_counts

    for roots, message in (([str(tmp_path / "nowhere")], "no such sweep folder"),
                           ([str(tmp_path / "sweep")], "no finished MBRCSL run under")):
        with pytest.raises(SystemExit):
            rollout_counts.main(roots)
        assert message in capsys.readouterr().err
