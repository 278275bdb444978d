"""Every algorithm stopped at an arbitrary step (SIGTERM as step 37 begins: between its log rows, checkpoints,
hold-out checks and rollout rounds) and resumed ends as a run that was not stopped: the same metrics rows and the
same final.json, each training step's numbers included (CPU); `offrl eval` of its checkpoint then gives its final
evaluation. TD3+BC stops at an even step too: the actor's metrics, repeated in the rows of critic-only steps, must
come back with the checkpoint. BC, IQL and TD3+BC also under --seeds. SAC, MOPO, RCSL's early stop, MBRCSL and
WSRL have tests of their own (tests/test_reliability.py, test_model_based.py, test_return_conditioned.py,
test_mbrcsl.py, test_wsrl.py)."""

import json
import os

import pytest

import forkserver
from conftest import PYTHON, ROOT, assert_reevaluation_reproduces, strip, tiny_model

INJECT = str(ROOT / "tests" / "fault_injection.py")
STOP_AT = 37
COMMON = ["--steps", "60", "--eval.every", "0", "--eval.episodes", "2", "--log.every", "1", "--log.wandb", "disabled",
          "--log.no-progress", "--run.threads", "1"]
TINY_MODEL = [*tiny_model(max_epochs=3), "--rollout-every", "25", "--rollout-batch", "100"]
ALGOS = {
    "td3_bc": ["--hidden", "32", "32"],
    "bc": ["--hidden", "32", "32"],
    "iql": ["--hidden", "32", "32"],
    "cql": ["--hidden", "32", "32", "--n-actions", "2"],
    "riql": ["--hidden", "32", "32"],
    "dt": ["--context", "5", "--embed-dim", "32", "--batch-size", "8", "--warmup-steps", "10"],
    "rcsl": ["--hidden", "32", "--holdout-every", "20", "--patience", "5"],
    "mobile": ["--hidden", "32", "32", "--num-samples", "3", *TINY_MODEL],
    "ravl": ["--hidden", "32", "32", "--num-critics", "4", *TINY_MODEL],
}


def train(algo, out_dir, *extra, stop_at=None):
    """A run in a process of its own; a resume (--resume) in a fresh interpreter, whose string-hash seed differs
    from the forked straight and stopped runs' (tests/forkserver.py), so order-dependent state would show."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if stop_at is not None:
        env["FAULT_SIGTERM_AT_STEP"] = str(stop_at)
    return forkserver.run([PYTHON, INJECT, "-m", f"algos.{algo}", *COMMON, *ALGOS[algo], "--run.out-dir", str(out_dir),
                           *extra], cwd=ROOT, env=env, timeout=600, fresh="--resume" in extra)


def records(out_dir, seed=0):
    (run_dir,) = [p for p in out_dir.glob(f"*/*/{seed}-*") if p.is_dir()]
    rows = [strip(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, rows, strip(json.loads((run_dir / "final.json").read_text()))


@pytest.mark.parametrize("algo, stop_at", [*((algo, STOP_AT) for algo in ALGOS), ("td3_bc", STOP_AT - 1)])
def test_a_run_stopped_at_any_step_resumes_to_the_same_records(tiny, tmp_path, monkeypatch, algo, stop_at):
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))  # the model-based runs share one dynamics model
    straight = train(algo, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    stopped = train(algo, tmp_path / "stopped", stop_at=stop_at)
    assert stopped.returncode == 143 and f"after step {stop_at}" in stopped.stderr, stopped.stderr
    resumed = train(algo, tmp_path / "stopped", "--resume", "latest")
    assert resumed.returncode == 0 and f"at step {stop_at}" in resumed.stderr, resumed.stderr
    run_dir, rows, final = records(tmp_path / "stopped")
    _, expected_rows, expected_final = records(tmp_path / "straight")
    assert len(expected_rows) >= 60 and any(row["step"] > stop_at for row in rows)
    assert rows == expected_rows
    assert final == expected_final
    assert_reevaluation_reproduces(run_dir)  # `offrl eval` rebuilds the resumed run's policy from its checkpoint


@pytest.mark.parametrize("algo, stop_at", [("bc", STOP_AT), ("iql", STOP_AT), ("td3_bc", STOP_AT - 1)])
def test_seeds_in_one_process_stopped_at_any_step_resume_to_the_same_records(tiny, tmp_path, algo, stop_at):
    """--seeds: every seed's run stops at the step, and each comes back from its own checkpoint (TD3+BC's batched
    actor metrics included, at a critic-only step)."""
    seeds = ["--seeds", "0", "1"]
    assert train(algo, tmp_path / "straight", *seeds).returncode == 0
    stopped = train(algo, tmp_path / "stopped", *seeds, stop_at=stop_at)
    assert stopped.returncode == 143 and f"stopped after step {stop_at}" in stopped.stderr, stopped.stderr
    resumed = train(algo, tmp_path / "stopped", *seeds, "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr
    for seed in (0, 1):
        _, rows, final = records(tmp_path / "stopped", seed)
        _, expected_rows, expected_final = records(tmp_path / "straight", seed)
        assert rows == expected_rows and final == expected_final
        assert rows[stop_at]["step"] == stop_at + 1 and (algo != "td3_bc" or "actor_loss" in rows[stop_at])
