"""Sweep and table tooling: IQM by hand, a tiny resumable sweep rendered as a table."""

import json

import numpy as np
import pytest

from benchmarks import sweep, table
from offrl.optim import cosine_decay

from conftest import PYTHON, run_cli


def test_iqm_by_hand():
    assert table.iqm(np.array([4.0, 1.0, 3.0, 2.0])) == pytest.approx(2.5)  # mean of the middle two
    # n = 3: quarter weights at the cut points -> (0.25 * 1 + 2 + 0.25 * 10) / 1.5
    assert table.iqm(np.array([1.0, 2.0, 10.0])) == pytest.approx((0.25 + 2 + 2.5) / 1.5)
    low, high = table.bootstrap_ci(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert low <= table.iqm(np.array([1.0, 2.0, 3.0, 4.0, 5.0])) <= high


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


def test_a_sweep_runs_resumes_and_makes_a_table(tiny, tmp_path):
    args = ["-m", "benchmarks.sweep", "--name", "t", "--out-dir", str(tmp_path), "--variant", "bc=bc --hidden 16",
            "--variant", "td3=td3_bc --hidden 16", "--datasets", tiny, "--seeds", "0", "1", "--steps", "60",
            "--jobs", "2", "--common", "--eval.every 30 --eval.episodes 2"]
    out = run_cli(PYTHON, *args).stdout
    assert "0 of 4 runs already finished" in out and out.count("done ") == 4
    again = run_cli(PYTHON, *args).stdout
    assert "4 of 4 runs already finished; 0 to go" in again
    text = run_cli(PYTHON, "-m", "benchmarks.table", str(tmp_path / "t"), "--title", "tiny",
                   "--out", str(tmp_path / "t.md")).stdout
    rows = [line for line in text.splitlines() if line.startswith("| bc") or line.startswith("| td3")]
    assert len(rows) == 2 and all("| 2 |" in r for r in rows)
    assert "Seeds [0, 1]; 60 gradient steps; each evaluation 2 episodes" in text and "one thread per run" in text
    assert (tmp_path / "t.md").read_text().strip() == text.strip()
    two = run_cli(PYTHON, "-m", "benchmarks.table", str(tmp_path / "t"), "--metric", "eval/normalized_score",
                  "--metric", "eval/return_mean").stdout
    assert sum(line.startswith("| bc [eval] |") or line.startswith("| bc [eval/return_mean] |")
               for line in two.splitlines()) == 2
    # final = the final checkpoints evaluated again (offrl eval), cached beside each run
    redone = run_cli(PYTHON, "-m", "benchmarks.table", str(tmp_path / "t"), "--reevaluate", "3", "--reeval-seed", "5").stdout
    assert "evaluated again by `offrl eval` with 3 episodes from reset seed 5" in redone
    caches = sorted((tmp_path / "t" / "bc").glob("*/*/*/reeval-3ep-seed5.json"))
    assert len(caches) == 2 and len(list((tmp_path / "t").glob("*/*/*/*/reeval-3ep-seed5.json"))) == 4
    reports = [json.loads(c.read_text()) for c in caches]
    assert all(r["episodes"] == 3 and r["seed"] == 5 for r in reports)
    mean = np.mean([r["results"]["eval"]["normalized_score"] for r in reports])
    (bc_row,) = [line for line in redone.splitlines() if line.startswith("| bc |")]
    assert f"| {mean:.1f} ± " in bc_row


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


def test_table_caption_states_threads_a_resume_changed():
    run = {"final": 50.0, "best": 60.0, "seed": 0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "env": {"processor": "x86_64", "cpu_count": 2, "device": "cpu"}, "wall": None, "threads": 1}
    runs = [{**run, "seed": seed, "run_dir": f"{seed}-sweep", "threads": 1 + (seed == 2)} for seed in range(3)]
    two_metrics = {("bc [eval]", "d"): runs, ("bc [eval_half_target]", "d"): runs}  # each run counted once
    mixed = table.render(two_metrics, "t", None)
    assert "from 3 runs" in mixed and "threads per run as last resumed: 2 at 1, 1 at 2" in mixed
    assert "one thread per run" not in mixed
    assert "one thread per run" in table.render({("bc", "d"): runs[:2]}, "t", None)


def test_table_caption_names_each_machine_when_rows_ran_on_different_ones():
    cpu = {"processor": "x86_64", "cpu_count": 16, "device": "cpu", "packages": {"torch": "2.11.0"}}
    gpu = {**cpu, "device": "cuda", "cuda_device": "NVIDIA H100"}
    run = {"final": 50.0, "best": 60.0, "steps": 10, "episodes": 2, "train_episodes": 2, "precision": "fp32",
           "wall": None, "threads": 1}
    groups = {("bc", "d"): [{**run, "seed": s, "run_dir": f"bc{s}", "env": cpu} for s in range(2)],
              ("cql", "d"): [{**run, "seed": s, "run_dir": f"cql{s}", "env": gpu} for s in range(2)]}
    caption = table.render(groups, "t", None)
    assert ("Hardware: by row: bc: x86_64, 16 cores, device cpu; torch 2.11.0; "
            "cql: x86_64, 16 cores, device cuda (NVIDIA H100); torch 2.11.0") in caption
    same = table.render({("bc", "d"): groups[("bc", "d")]}, "t", None)
    assert "Hardware: x86_64, 16 cores, device cpu; torch 2.11.0, one thread per run" in same


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
