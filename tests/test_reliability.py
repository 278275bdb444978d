"""Faults a preempted or unlucky job meets, injected on purpose (tests/fault_injection.py): SIGKILL at
random steps and in the middle of a checkpoint write, a damaged last.pt, a full disk, signals during an
evaluation, NaN/inf losses. Each run ends as an uninterrupted one would, or stops with a clear error and
its last good checkpoint intact."""

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from offrl import checkpoint as ckpt

import forkserver
from conftest import PYTHON, ROOT, VOLATILE, saved_step, tiny_model

INJECT = str(Path(__file__).resolve().parent / "fault_injection.py")
QUIET = ["--log.wandb", "disabled", "--log.no-progress", "--run.threads", "1"]
OFFLINE = ["-m", "algos.td3_bc", "--steps", "800", "--eval.every", "400", "--eval.episodes", "3", "--log.every", "50",
           "--run.checkpoint-every", "100", "--hidden", "64", "64", *QUIET]
ONLINE = ["-m", "algos.sac", "--env-id", "InvertedPendulum-v5", "--steps", "1000", "--learning-starts", "200",
          "--eval.every", "500", "--eval.episodes", "2", "--log.every", "50", "--run.checkpoint-every", "100",
          "--actor-every", "0", "--hidden", "32", "32", *QUIET]


def launch(args, out_dir, faults=None, resume=False):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(faults or {})}
    command = [PYTHON, INJECT, *args, "--run.out-dir", str(out_dir), *(["--resume", "latest"] if resume else [])]
    return forkserver.popen(command, cwd=ROOT, env=env)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def the_run(base):
    runs = [p for p in base.glob("*/*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def kill_after_checkpoint(proc, base, step, timeout=120):
    """SIGKILL `proc` as soon as its checkpoint has reached `step`; returns that checkpoint's step."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = list(base.glob("*/*/*/checkpoints/last.pt"))
        seen = saved_step(found[0]) if found else None
        if seen is not None and seen >= step:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            return seen
        time.sleep(0.01)
    raise AssertionError(f"the run ended or stalled before checkpointing step {step}: {finish(proc)}")


def rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE} for line in lines]


def final(run_dir):
    return {k: v for k, v in json.loads((run_dir / "final.json").read_text()).items() if k not in VOLATILE}


def assert_same_tree(a, b, where="objects"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tree(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def crash_and_resume(args, tmp_path, kills):
    """Kill a run at random checkpointed steps, then once in the middle of a checkpoint write, damage
    the last checkpoint, resume to the end; compare with an uninterrupted run."""
    straight = tmp_path / "straight"
    code, _, err = finish(launch(args, straight))
    assert code == 0, err

    crashed = tmp_path / "crashed"
    steps = int(args[args.index("--steps") + 1])
    targets = sorted(random.Random(0).sample(range(100, steps - 300, 100), kills))
    stopped_at = []
    for i, target in enumerate(targets):
        stopped_at.append(kill_after_checkpoint(launch(args, crashed, resume=i > 0), crashed, target))
    run_dir = the_run(crashed)
    checkpoints = run_dir / "checkpoints"
    assert stopped_at == sorted(stopped_at) and stopped_at[-1] < steps

    # killed halfway through writing its second checkpoint: last.pt is still the first one
    code, _, _ = finish(launch(args, crashed, {"FAULT_KILL_IN_SAVE": "2"}, resume=True))
    assert code == -signal.SIGKILL
    assert list(checkpoints.glob(".*.tmp")), "the half-written temp file should be there"
    assert saved_step(checkpoints / "last.pt") == stopped_at[-1] + 100

    # the newest checkpoint damaged (cut short): the previous one is used, with a warning
    last = checkpoints / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    code, out, err = finish(launch(args, crashed, resume=True))
    assert code == 0, err
    assert "corrupt" in err and f"using the previous checkpoint {checkpoints / 'previous.pt'} (step {stopped_at[-1]})" in err
    assert not list(checkpoints.glob(".*.tmp")) and (checkpoints / "last.pt.damaged").exists()

    expected = the_run(straight)
    assert rows(run_dir) == rows(expected)
    assert final(run_dir) == final(expected)
    # counted along the checkpoints it continued from: the process killed in its write left only last.pt,
    # which was then damaged, so its resume is not among them
    assert json.loads((run_dir / "final.json").read_text())["resumes"] == kills
    a, b = ckpt.load(run_dir / "checkpoints" / "last.pt"), ckpt.load(expected / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == steps
    assert_same_tree(a["objects"], b["objects"])
    assert_same_tree(a["rng"], b["rng"], "rng")


def test_offline_run_survives_repeated_kills(tiny, tmp_path):
    crash_and_resume(OFFLINE, tmp_path, kills=3)


def test_online_sac_survives_repeated_kills(tmp_path):
    """SAC's checkpoint holds the MuJoCo state, the episode in progress and the env's RNGs, so an online
    run too ends exactly as an uninterrupted one."""
    crash_and_resume(ONLINE, tmp_path, kills=2)


def short(eval_every=0):
    return ["-m", "algos.td3_bc", "--steps", "300", "--eval.every", str(eval_every), "--eval.episodes", "2",
            "--log.every", "50", "--run.checkpoint-every", "100", "--hidden", "32", "32", *QUIET]


SHORT = short()


@pytest.mark.parametrize("where", ["checkpoint", "log"])
def test_a_full_disk_ends_the_run_and_keeps_the_last_checkpoint(tiny, tmp_path, where):
    # checkpoint: the second checkpoint write fails; log: the third metrics line (step 150) fails
    faults = {"FAULT_FULL_DISK_SAVE": "2"} if where == "checkpoint" else {"FAULT_FULL_DISK_LOG": "3"}
    code, _, err = finish(launch(SHORT, tmp_path, faults))
    assert code == 1 and "No space left on device" in err and "Traceback" not in err, err
    assert ("last.pt: cannot be written" if where == "checkpoint" else "metrics.jsonl: cannot be written") in err
    checkpoints = the_run(tmp_path) / "checkpoints"
    assert saved_step(checkpoints / "last.pt") == 100
    assert not list(checkpoints.glob(".*.tmp"))
    code, _, err = finish(launch(SHORT, tmp_path, resume=True))  # once there is room again
    assert code == 0 and "at step 100" in err, err
    assert final(the_run(tmp_path))["steps"] == 300


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_evaluation_checkpoints_that_step_and_exits(tiny, tmp_path, sig):
    args = short(eval_every=150)  # periodic checkpoints at 100 and 200: one at 150 is the signal's own
    code, _, err = finish(launch(args, tmp_path / "stopped", {"FAULT_SIGNAL_IN_EVAL": str(int(sig))}))
    run_dir = the_run(tmp_path / "stopped")
    assert code == 128 + sig and "Traceback" not in err, err
    assert saved_step(run_dir / "checkpoints" / "last.pt") == 150
    assert [r["step"] for r in rows(run_dir) if "eval/return_mean" in r] == [150]  # the evaluation finished
    code, _, err = finish(launch(args, tmp_path / "stopped", resume=True))
    assert code == 0, err
    finish(launch(args, tmp_path / "straight"))
    assert rows(run_dir) == rows(the_run(tmp_path / "straight"))


def test_a_second_signal_stops_at_once(tiny, tmp_path):
    args = short(eval_every=150)
    code, _, err = finish(launch(args, tmp_path, {"FAULT_SIGNAL_IN_EVAL": str(int(signal.SIGINT)), "FAULT_SIGNAL_TWICE": "1"}))
    assert code == 130 and "interrupted; continue with --resume latest" in err and "Traceback" not in err, err
    assert saved_step(the_run(tmp_path) / "checkpoints" / "last.pt") == 100  # the periodic checkpoint stands


MOPO = ["-m", "algos.mopo", "--steps", "20", "--eval.every", "0", "--log.every", "10", "--rollout-every", "10",
        "--rollout-batch", "50", "--hidden", "32", "32", *tiny_model(max_epochs=4), *QUIET]


@pytest.mark.parametrize("twice", [False, True])
def test_a_signal_while_the_dynamics_model_trains_stops_the_run_there(tiny, tmp_path, monkeypatch, twice):
    """Not after the model (hours on a CPU) and one step: after the model's epoch, which is checkpointed (a second
    signal: at once, the previous epoch's checkpoint standing). The new run had done nothing: its folder goes;
    the same command then continues the model's training and runs."""
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    faults = {"FAULT_SIGNAL_AFTER_MODEL_EPOCH": f"2:{int(signal.SIGTERM)}", **({"FAULT_SIGNAL_TWICE": "1"} if twice else {})}
    code, _, err = finish(launch(MOPO, tmp_path / "runs", faults))
    assert code == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert "stopped by signal 15 while getting its dynamics model: the run had done no step" in err, err
    assert not [p for p in (tmp_path / "runs").glob("mopo/*/*")]  # the empty run folder is gone
    (training,) = (tmp_path / "models").glob("*/training.pt")
    kept_epoch = 1 if twice else 2
    assert ckpt.load(training)["epoch"] == kept_epoch and not list((tmp_path / "models").glob("*/model.pt"))
    if not twice:
        assert f"checkpointed at epoch 2 in {training}" in err, err
    code, _, err = finish(launch(MOPO, tmp_path / "runs"))
    assert code == 0 and f"continuing the training in {training} at epoch {kept_epoch}" in err, err
    assert final(the_run(tmp_path / "runs"))["dynamics_model"]["epochs"] == 4


def test_before_the_first_step_a_pending_signal_skips_the_work_and_a_further_one_changes_nothing(tiny, tmp_path,
                                                                                                  monkeypatch, capfd):
    """A signal that came before the block (the handlers are the Run's from its construction) stops the run at
    its start, without the work, and its notice promises no step; one more while the run stops (closing its logs)
    neither raises nor leaves the folder behind."""
    from algos import bc
    from offrl import logging as offrl_logging
    from offrl.run import Run

    cfg = bc.Config(steps=10)
    cfg.log.wandb, cfg.run.out_dir = "disabled", str(tmp_path)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    run = Run("bc", cfg)
    os.kill(os.getpid(), signal.SIGTERM)  # a flag only: the Run's handler
    notice = capfd.readouterr().err  # the handler writes to fd 2
    assert "stopping before this process's first step where it can" in notice and "after this step" not in notice, notice
    real_close = offrl_logging.Logger.close

    def close(self):
        os.kill(os.getpid(), signal.SIGINT)  # while the run stops
        real_close(self)

    monkeypatch.setattr(offrl_logging.Logger, "close", close)
    with pytest.raises(SystemExit) as stopped:
        with run.before_first_step("doing the work", "after it"):
            raise AssertionError("the work ran")
    assert stopped.value.code == 128 + signal.SIGTERM and not run.dir.exists()
    assert {sig: signal.getsignal(sig) for sig in before} == before


TINY_MODEL = [*tiny_model(max_epochs=2), "--rollout-every", "100", "--rollout-batch", "100", "--hidden", "32", "32"]
ALGORITHM_ARGS = {
    "bc": ["--hidden", "32", "32"], "td3_bc": ["--hidden", "32", "32"], "iql": ["--hidden", "32", "32"],
    "cql": ["--hidden", "32", "32"], "riql": ["--hidden", "32", "32"],
    "dt": ["--embed-dim", "32", "--layers", "1", "--heads", "1", "--batch-size", "16"], "rcsl": ["--hidden", "64", "64"],
    "sac": ["--env-id", "InvertedPendulum-v5", "--learning-starts", "10", "--actor-every", "0", "--hidden", "32", "32"],
    "wsrl": ["--checkpoint", "none", "--warmup-steps", "10", "--batch-size", "8", "--hidden", "32", "32",
             "--buffer-size", "100"],
    "mopo": TINY_MODEL, "mobile": [*TINY_MODEL, "--num-samples", "3"], "ravl": [*TINY_MODEL, "--num-critics", "3"],
    # 10 behaviour-policy steps, then rollouts, then RCSL from step 11: the poison lands in RCSL's phase
    "mbrcsl": ["--behaviour.steps", "10", "--behaviour.widths", "8", "16", "--behaviour.time-dim", "8",
               "--rcsl.hidden", "32", "32", "--rollout-batch", "30", "--num-trajectories", "20",
               "--max-rollout-epochs", "3", "--horizon", "50", "--threshold", "0", *tiny_model(max_epochs=2)],
}


@pytest.fixture(scope="module")
def shared_models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.mark.parametrize("algo", sorted(ALGORITHM_ARGS))
def test_a_non_finite_loss_stops_every_algorithm(tiny, tmp_path, algo, shared_models, monkeypatch):
    """From step 25 on every loss the algorithm logs is NaN (inf for every other algorithm): the run stops
    at step 25 naming each loss, exits non-zero, and its checkpoint is the one of step 20 (it loads). The clean
    run that names the losses trains under --run.precision bf16, every algorithm's setting in the committed grid
    (and --model.precision bf16 where a dynamics model trains): it must finish with finite losses and score."""
    monkeypatch.setenv("OFFRL_MODELS", str(shared_models))
    value = "inf" if sorted(ALGORITHM_ARGS).index(algo) % 2 else "nan"
    args = ["-m", f"algos.{algo}", "--steps", "40", "--log.every", "1", "--run.checkpoint-every", "10", "--eval.every", "0",
            *QUIET, *ALGORITHM_ARGS[algo]]
    bf16 = ["--run.precision", "bf16", *(["--model.precision", "bf16"] if "--model.members" in args else [])]
    clean = launch([*args, *bf16], tmp_path / "clean", {"FAULT_POISON": "1000"})  # the names of the losses it logs
    code, _, err = finish(clean)
    assert code == 0, err
    final = json.loads((the_run(tmp_path / "clean") / "final.json").read_text())
    assert np.isfinite(final["eval/return_mean"]) and json.loads(
        (the_run(tmp_path / "clean") / "config.json").read_text())["run"]["precision"] == "bf16"
    # the losses logged at the poisoned step (MBRCSL's phases log different ones)
    losses = sorted(k for row in rows(the_run(tmp_path / "clean")) if row.get("step") == 25 for k in row if "loss" in k)
    assert losses, "the algorithm logs no loss at step 25"

    code, _, err = finish(launch(args, tmp_path / "poisoned", {"FAULT_POISON": "25", "FAULT_POISON_VALUE": value}))
    assert code == 1 and "Traceback" not in err, err
    message = next(line for line in err.splitlines() if line.startswith("error:"))
    assert f"became {value} at step 25" in message and "last good checkpoint (step 20)" in message, message
    named = message.split(": ", 2)[2].split(" became")[0].split(", ")
    assert sorted(named) == losses, message
    # the fault poisons only the logged losses, not the networks, so the checkpoint's values say nothing here: what
    # counts is that it loads and is the one from before the bad step (nothing was written after it)
    state = ckpt.load(the_run(tmp_path / "poisoned") / "checkpoints" / "last.pt")
    assert state["step"] == 20


def test_a_diverged_run_lets_go_of_its_folder_when_it_stops(tmp_path):
    """A run folder's claim is a POSIX record lock, which closing any of the process's files of it releases: a
    diverged Run left its claim open until collected, when it would drop the claim of a run resumed there in the
    same process. It closes the claim as it stops; the folder can then be claimed (here by another process)."""
    from algos.td3_bc import Config
    from offrl.errors import TrainingDiverged
    from offrl.run import Run

    cfg = Config(steps=4)
    cfg.log.wandb, cfg.log.progress, cfg.log.every, cfg.eval.every, cfg.run.out_dir = "disabled", False, 1, 0, str(tmp_path)
    run = Run("td3_bc", cfg)
    state = {"net": torch.nn.Linear(1, 1)}
    with pytest.raises(TrainingDiverged):
        for step in run.steps(state):
            run.log(step, {"loss": torch.tensor(float("nan") if step == 2 else 1.0)})
    assert run._folder_claim.closed
    claimed = subprocess.run([PYTHON, "-c", f"from offrl import checkpoint; checkpoint.claim_run_folder({str(run.dir)!r})"],
                             cwd=ROOT, capture_output=True, text=True)
    assert claimed.returncode == 0, claimed.stderr


def test_a_nan_between_logged_steps_stops_the_run_as_diverged_at_an_evaluation(tiny, tmp_path):
    """Weights gone NaN after the last logged step make NaN actions at the next evaluation: that is the run
    diverging (diverged.json, which a sweep does not resume into the same NaN), not an evaluation error."""
    from algos.td3_bc import Config
    from offrl.data import load_dataset
    from offrl.errors import TrainingDiverged
    from offrl.run import Run

    cfg = Config(steps=20, dataset=tiny)
    cfg.log.wandb, cfg.log.progress, cfg.log.every, cfg.eval.every, cfg.run.out_dir = "disabled", False, 10, 5, str(tmp_path)
    cfg.eval.episodes = 2
    run = Run("td3_bc", cfg)
    metadata = load_dataset(tiny).metadata
    with pytest.raises(TrainingDiverged, match="loss became nan at step 5"):  # the step before the evaluation
        for step in run.steps({"net": torch.nn.Linear(1, 1)}):
            run.log(step, {"loss": torch.tensor(float("nan") if step >= 4 else 1.0)})
            run.evaluate(step, lambda obs: torch.full((obs.shape[0], 1), float("nan")), metadata)
    assert json.loads((run.dir / ckpt.DIVERGED_FILE).read_text())["step"] == 5
