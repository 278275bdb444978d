"""A run interrupted and resumed ends with the same numbers as one that was not (CPU)."""

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from offrl import checkpoint as ckpt
from offrl.errors import OffrlError, TrainingDiverged

from conftest import PYTHON, ROOT, run_cli, saved_step, strip

STEPS = 1000
COMMON = ["--steps", str(STEPS), "--eval.every", "250", "--eval.episodes", "3", "--log.every", "100",
          "--run.checkpoint-every", "100", "--log.wandb", "disabled", "--log.no-progress", "--run.threads", "1",
          "--hidden", "64", "64"]


def metrics(run_dir):
    return [strip(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def only_run(base):
    runs = [p for p in base.glob("td3_bc/*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def straight_run(tiny, tmp_path_factory):
    """The COMMON run, uninterrupted: what every interrupted one must end as."""
    out = tmp_path_factory.mktemp("straight")
    run_cli(PYTHON, "-m", "algos.td3_bc", *COMMON, "--run.out-dir", str(out))
    return only_run(out)


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_run_resumes_to_the_same_result(tiny, tmp_path, stop, straight_run):
    """SIGKILL: resume from the last periodic checkpoint. SIGTERM (and SIGHUP, a closed terminal): the run
    checkpoints the step it was on and exits; resuming continues from exactly there."""
    expected_dir = straight_run

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGHUP's default action in the child, also under `nohup pytest` (whose ignored SIGHUP the run, by design, keeps)
    proc = subprocess.Popen([PYTHON, "-m", "algos.td3_bc", *COMMON, "--run.out-dir", str(killed)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline:
        found = list(killed.glob("td3_bc/*/*/checkpoints/last.pt"))
        step = saved_step(found[0]) if found else None
        if step is not None and step >= 300:
            break
        time.sleep(0.02)
    proc.send_signal(stop)
    code = proc.wait()
    run_dir = only_run(killed)
    assert not (run_dir / "final.json").exists(), "the run finished before it could be interrupted"
    interrupted_at = saved_step(run_dir / "checkpoints" / "last.pt")
    assert interrupted_at < STEPS
    if stop != signal.SIGKILL:
        assert code == 128 + stop
        logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert interrupted_at >= max(logged)  # the checkpoint is the step it stopped at, not an older one

    result = run_cli(PYTHON, "-m", "algos.td3_bc", *COMMON, "--run.out-dir", str(killed), "--resume", "latest")
    assert f"resumed {run_dir} at step {interrupted_at}" in result.stderr
    assert only_run(killed) == run_dir
    assert metrics(run_dir) == metrics(expected_dir)
    environment = json.loads((run_dir / "environment.json").read_text())
    assert len(environment["resumes"]) == 1 and environment["packages"]["torch"]
    final, expected = (strip(json.loads((d / "final.json").read_text())) for d in (run_dir, expected_dir))
    assert final == expected
    assert "eval/normalized_score" in final and "train/critic_loss" in final


def test_a_closed_terminal_stops_the_run_with_a_checkpoint_at_its_step(tiny, tmp_path):
    """A terminal that closes is hung up before its SIGHUP arrives: every write to it fails (EIO) from then on,
    the progress line's and the signal handler's notice included, and it no longer counts as a terminal for
    os.isatty. The run still checkpoints the step it was on and exits as on SIGTERM (it had died with a
    traceback in the middle of a step, losing everything since its last checkpoint)."""
    import pty

    master, slave = pty.openpty()
    args = [a for a in COMMON if a != "--log.no-progress"]  # the progress line redraws on a terminal
    proc = subprocess.Popen([PYTHON, "-m", "algos.td3_bc", *args, "--run.out-dir", str(tmp_path)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    os.close(slave)
    os.set_blocking(master, False)  # read here, never by a thread blocked in read: that would keep the pty open

    def drain():  # what the run prints, so that it never waits on a full terminal
        try:
            while os.read(master, 4096):
                pass
        except OSError:
            pass

    deadline = time.time() + 120
    while time.time() < deadline:
        drain()
        found = list(tmp_path.glob("td3_bc/*/*/checkpoints/last.pt"))
        if found and (saved_step(found[0]) or 0) >= 300:
            break
        time.sleep(0.02)
    os.close(master)  # the terminal is gone: hung up now, its SIGHUP after the run has written to it again
    time.sleep(0.5)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 128 + signal.SIGHUP
    run_dir = only_run(tmp_path)
    assert not (run_dir / "final.json").exists()
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert saved_step(run_dir / "checkpoints" / "last.pt") >= max(logged)  # the step it stopped at


def test_a_run_still_going_cannot_be_resumed_by_a_second_process(tiny, tmp_path):
    """`--resume latest` while the run it finds is still going (here: stopped with SIGSTOP) is refused in one
    line before the folder is touched; once that process is gone, the same command resumes the run."""
    args = [*COMMON[2:], "--run.out-dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([PYTHON, "-m", "algos.td3_bc", *args, "--steps", "100000"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not list(tmp_path.glob("td3_bc/*/*/checkpoints/last.pt")):
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGSTOP)
        run_dir = only_run(tmp_path)
        before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        short = ["--steps", str(saved_step(run_dir / "checkpoints" / "last.pt") + 20)]  # quick, were it let in
        refused = run_cli(PYTHON, "-m", "algos.td3_bc", *args, *short, "--resume", "latest", check=False)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert f"run folder {run_dir} is in use by another process" in refused.stderr
        assert {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    finally:
        proc.kill()
        proc.wait()
    resumed = run_cli(PYTHON, "-m", "algos.td3_bc", *args, *short, "--resume", "latest")
    assert f"resumed {run_dir}" in resumed.stderr and (run_dir / "final.json").exists()


def test_resume_refuses_a_changed_hyperparameter(tiny, tmp_path):
    args = ["--steps", "50", "--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled",
            "--hidden", "32", "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.td3_bc", *args)
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args, "--alpha", "1.0", "--resume", "latest", check=False)
    assert result.returncode == 1 and "alpha: 2.5 -> 1.0" in result.stderr and "Traceback" not in result.stderr
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args, "--run.precision", "bf16", "--resume", "latest", check=False)
    assert result.returncode == 1 and "run.precision: 'fp32' -> 'bf16'" in result.stderr
    # more steps is a legal change, and so is flushing subnormals or not: the run continues where it stopped
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "80", "--run.no-flush-denormal",
                     "--resume", "latest")
    assert "at step 50" in result.stderr
    assert json.loads((only_run(tmp_path) / "config.json").read_text())["run"]["flush_denormal"] is False
    assert json.loads((only_run(tmp_path) / "final.json").read_text())["steps"] == 80
    # fewer steps than it has trained would train nothing and write a final.json claiming 60 steps: refused,
    # and the run's files stay as they were
    run_dir = only_run(tmp_path)
    before = {name: (run_dir / name).read_bytes() for name in ("final.json", "metrics.jsonl")}
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "60", "--resume", "latest", check=False)
    assert result.returncode == 1 and "has trained 80 steps, more than this run's 60" in result.stderr
    assert "Traceback" not in result.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_resume_refuses_a_run_whose_evaluation_env_changed(tiny, tmp_path):
    """A run that evaluated on one env (e.g. a D4RL file's v5 default, before offrl evaluated those on v4) is not
    resumed on another without being told: its evaluations would stop being comparable."""
    args = ["--steps", "20", "--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled",
            "--hidden", "16", "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.td3_bc", *args)
    record = only_run(tmp_path) / "dataset.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "env_id": "InvertedPendulum-v4"}))
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "40", "--resume", "latest", check=False)
    assert result.returncode == 1 and "this run evaluated on InvertedPendulum-v4" in result.stderr
    assert "--data.env-id InvertedPendulum-v4" in result.stderr and "Traceback" not in result.stderr
    # the remedy it names resumes the run (the option, not given at the start, names the env it evaluated on)
    resumed = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "40", "--resume", "latest",
                      "--data.env-id", "InvertedPendulum-v4")
    assert "resumed" in resumed.stderr and json.loads((only_run(tmp_path) / "final.json").read_text())["steps"] == 40
    other = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "60", "--resume", "latest",
                    "--data.env-id", "InvertedPendulum-v5", check=False)  # any other env is still refused
    assert other.returncode == 1 and "data.env_id" in other.stderr


def test_resume_keeps_the_reference_scores_a_run_normalized_with(tiny, tmp_path):
    """A run whose data now gives other reference scores (or none: D4RL's table is dropped for another env) would
    record scores in other units than before and mix them in its best score: refused, naming the option that keeps
    the recorded ones, which then resumes it."""
    args = ["--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled", "--hidden", "16",
            "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "20", *args)
    record_path = only_run(tmp_path) / "dataset.json"
    record = json.loads(record_path.read_text())
    wanted = record["ref_max_score"] + 1.0
    record_path.write_text(json.dumps({**record, "ref_max_score": wanted}))
    refused = run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "40", *args, "--resume", "latest", check=False)
    assert refused.returncode == 1 and f"normalized with ref_max_score {wanted!r}" in refused.stderr
    assert f"--data.ref-max-score {wanted!r}" in refused.stderr and "Traceback" not in refused.stderr
    run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "40", *args, "--resume", "latest", "--data.ref-max-score", str(wanted))
    assert json.loads((only_run(tmp_path) / "final.json").read_text())["steps"] == 40


def test_a_resume_that_changes_a_schedule_over_steps_says_so(tiny, tmp_path):
    """IQL's actor learning rate follows a cosine over --steps: a resume with other --steps follows the new budget
    (RELIABILITY.md), and says so, since its rate jumps to the new schedule's value; without the cosine it is quiet."""
    args = ["--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled", "--hidden", "32", "32"]
    for cosine, out in ((["--cosine-actor-lr"], tmp_path / "cosine"),
                        (["--no-cosine-actor-lr"], tmp_path / "constant")):
        run_cli(PYTHON, "-m", "algos.iql", "--steps", "40", *args, *cosine, "--run.out-dir", str(out))
        result = run_cli(PYTHON, "-m", "algos.iql", "--steps", "80", *args, *cosine, "--run.out-dir", str(out),
                         "--resume", "latest")
        (run_dir,) = [p for p in out.glob("iql/*/*") if p.is_dir()]
        assert json.loads((run_dir / "final.json").read_text())["steps"] == 80
        warned = "resumed with --steps 80 instead of 40, it follows the new budget" in result.stderr
        assert warned == (cosine == ["--cosine-actor-lr"])


def test_gradient_steps_flush_subnormal_floats_unless_told_not_to(tmp_path):
    """--run.flush-denormal (default on): inside a run's gradient step (`Run.precision`) the CPU treats floats
    below float32's normal range as zero, where x86 cores would otherwise compute through slow microcode;
    outside it (evaluation, data) and with the option off they are kept."""
    from algos.bc import Config
    from offrl.run import Run

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal floats")
    tiny_value = 1e-39  # a float32 subnormal
    for flush in (True, False):
        cfg = Config(steps=1)
        cfg.run.out_dir, cfg.run.threads, cfg.run.flush_denormal = str(tmp_path / str(flush)), 0, flush
        run = Run("bc", cfg)
        with run.precision():
            inside = torch.tensor([tiny_value]).item(), bool((torch.full((4,), 1e-20) * 1e-20).eq(0).all())
        assert inside == ((0.0, True) if flush else (pytest.approx(tiny_value, rel=1e-3), False))
        assert torch.tensor([tiny_value]).item() == pytest.approx(tiny_value, rel=1e-3)  # kept after the step
        run.logger.close()
        run._restore_signals()


def test_resume_holds_an_option_newer_than_the_run_to_its_default(tiny, tmp_path):
    """A checkpoint from before an option existed trained at its default: resuming it with another value would
    change the run halfway (for --model.precision, load another dynamics model), so it is refused like any
    changed option; the default is accepted."""
    from offrl import checkpoint as ckpt

    args = ["--steps", "30", "--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled",
            "--hidden", "32", "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.td3_bc", *args)
    last = only_run(tmp_path) / "checkpoints" / "last.pt"
    state = ckpt.load(last)
    config = json.loads(state["config"])
    del config["run"]["precision"], config["run"]["cuda_graph"]  # as a run started before those options
    ckpt.save(last, {**state, "config": json.dumps(config)})
    more = [*args[2:], "--steps", "40", "--resume", "latest"]
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *more, "--run.precision", "bf16", check=False)
    assert result.returncode == 1 and "run.precision: 'fp32' -> 'bf16'" in result.stderr, result.stderr
    assert "at step 30" in run_cli(PYTHON, "-m", "algos.td3_bc", *more).stderr


def test_a_non_finite_loss_stops_the_run_naming_loss_and_step(tiny, tmp_path):
    from algos.td3_bc import Config
    from offrl.run import Run

    cfg = Config(steps=10)
    cfg.log.wandb, cfg.log.every, cfg.run.out_dir = "disabled", 1, str(tmp_path)
    import signal as signals

    before = signals.getsignal(signals.SIGINT)
    run = Run("td3_bc", cfg)
    run.log(1, {"critic_loss": torch.tensor(1.0)})
    with pytest.raises(TrainingDiverged, match=r"critic_loss became nan at step 2.*no checkpoint"):
        run.log(2, {"critic_loss": torch.tensor(float("nan")), "actor_loss": torch.tensor(0.0)})
    assert signals.getsignal(signals.SIGINT) is before  # the run gave Ctrl-C back
    # the folder says so, for a sweep not to start it again
    assert ckpt.diverged(run.dir) == {"step": 2, "metrics": ["critic_loss"], "value": "nan", "last_checkpoint_step": None}

    # a full disk as the diverged step's metrics are logged: still reported as the divergence, still recorded
    full = Run("td3_bc", cfg)

    def no_room(*args, **kwargs):
        raise OffrlError(f"{full.logger.metrics_path}: cannot be written (No space left on device) at step 2")

    full.logger.log = no_room
    with pytest.raises(TrainingDiverged, match=r"critic_loss became nan at step 2"):
        full.log(2, {"critic_loss": torch.tensor(float("nan"))})
    assert ckpt.diverged(full.dir)["step"] == 2


def test_a_diverged_run_says_so_in_its_folder_until_it_is_resumed(tiny, tmp_path):
    from algos.td3_bc import Config
    from offrl.run import Run

    def config(**kwargs):
        cfg = Config(steps=10, **kwargs)
        cfg.log.wandb, cfg.log.progress, cfg.eval.every, cfg.run.out_dir = "disabled", False, 0, str(tmp_path)
        cfg.log.every = 1
        return cfg

    state = {"net": torch.nn.Linear(1, 1)}
    run = Run("td3_bc", config())
    with pytest.raises(TrainingDiverged, match=r"the last good checkpoint \(step 3\)"):
        for step in run.steps(state):
            run.checkpoint(step, force=step == 3)
            run.log(step, {"q": torch.tensor(float("inf") if step == 5 else 1.0)})
    assert ckpt.diverged(run.dir) == {"step": 5, "metrics": ["q"], "value": "inf", "last_checkpoint_step": 3}
    assert ckpt.diverged(tmp_path) is None
    resumed = Run("td3_bc", config(resume=str(run.dir)))  # tried again, e.g. by `sweep --retry-diverged`
    assert resumed.start_step == 3 and ckpt.diverged(run.dir) is not None  # until training starts again
    resumed.steps(state)
    assert ckpt.diverged(run.dir) is None
    resumed.logger.close()
    resumed._restore_signals()


def test_a_non_finite_host_value_stops_the_run_too(tiny, tmp_path):
    """Numbers logged from the host (RCSL's hold-out loss, online episode returns) are checked as losses are."""
    from algos.rcsl import Config
    from offrl.run import Run

    cfg = Config(steps=10)
    cfg.log.wandb, cfg.run.out_dir = "disabled", str(tmp_path)
    run = Run("rcsl", cfg)
    run.log_values(2, {"holdout_loss": 0.5, "best_holdout_loss": 0.5})
    with pytest.raises(TrainingDiverged, match=r"holdout_loss became inf at step 4"):
        run.log_values(4, {"holdout_loss": float("inf"), "best_holdout_loss": 0.5})


def test_resume_latest_without_a_run_is_a_clear_error(tmp_path):
    result = run_cli(PYTHON, "-m", "algos.bc", "--resume", "latest", "--run.out-dir", str(tmp_path), check=False)
    assert result.returncode == 1 and "no run with a checkpoint" in result.stderr
    (tmp_path / "early").mkdir()  # a run folder stopped before its first checkpoint
    result = run_cli(PYTHON, "-m", "algos.bc", "--resume", str(tmp_path / "early"), "--run.out-dir", str(tmp_path),
                     check=False)
    assert result.returncode == 1 and "a folder without a checkpoint" in result.stderr


def test_wall_time_adds_up_over_resumes(tmp_path, monkeypatch):
    """final.json's wall_seconds is the run's time over all its processes, not the last one's; the
    time between a kill and the resume does not count. Unknown (None) after a checkpoint without it.
    core_seconds weighs each process's time by its torch threads (a resume on 2 threads counts twice)."""
    import offrl.run
    from algos.td3_bc import Config
    from offrl.run import Run

    clock = [1000.0]
    monkeypatch.setattr(offrl.run.time, "perf_counter", lambda: clock[0])

    def config(steps=4, **kwargs):
        cfg = Config(steps=steps, **kwargs)
        cfg.log.wandb, cfg.log.progress, cfg.eval.every, cfg.run.out_dir = "disabled", False, 0, str(tmp_path)
        return cfg

    state = {"net": torch.nn.Linear(1, 1)}
    first = Run("td3_bc", config())
    for step in first.steps(state):
        clock[0] += 10.0
        if step == 2:
            first.checkpoint(step, force=True)  # then the process "dies"
            break
    first.logger.close()
    first._restore_signals()
    clock[0] += 500.0  # down time before the resume
    threads = torch.get_num_threads()
    monkeypatch.setattr(offrl.run.torch, "get_num_threads", lambda: 2 * threads)  # the resume's process
    resumed = Run("td3_bc", config(resume=str(first.dir)))
    for step in resumed.steps(state):
        clock[0] += 10.0
        resumed.checkpoint(step)  # at the last step, as every algorithm's loop does
    final = resumed.finish()
    assert final["wall_seconds"] == pytest.approx(40.0) and final["resumes"] == 1
    assert final["core_seconds"] == pytest.approx(20.0 * threads + 20.0 * 2 * threads)
    assert json.loads((first.dir / "final.json").read_text())["wall_seconds"] == pytest.approx(40.0)

    checkpoint = first.dir / "checkpoints" / "last.pt"
    saved = ckpt.load(checkpoint)
    assert saved["wall_seconds"] == pytest.approx(40.0)
    del saved["core_seconds"]  # as written before offrl kept core-seconds: its wall time at its config's threads
    torch.save(saved, checkpoint)
    later = Run("td3_bc", config(resume=str(first.dir), steps=5))
    for step in later.steps(state):
        clock[0] += 10.0
        later.checkpoint(step)
    saved_threads = json.loads(saved["config"])["run"]["threads"]
    assert later.finish()["core_seconds"] == pytest.approx(40.0 * saved_threads + 10.0 * 2 * threads)

    saved = ckpt.load(checkpoint)
    del saved["wall_seconds"], saved["core_seconds"]  # as written before offrl kept the wall time
    torch.save(saved, checkpoint)  # and without the checksum wrapper, as such files were written
    again = Run("td3_bc", config(resume=str(first.dir), steps=6))
    for step in again.steps(state):
        clock[0] += 10.0
    final = again.finish()
    assert final["wall_seconds"] is None and final["core_seconds"] is None


def test_resume_drops_a_cut_off_metrics_line_and_rows_after_its_checkpoint(tmp_path):
    """A killed process can leave half a JSON line, and rows of steps the resumed run will log again."""
    from offrl.logging import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 0.5 * s} for s in (10, 20, 30, 40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 50, "loss": 2')
    truncate_metrics(path, 30)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:3]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5')  # cut inside the step itself
    truncate_metrics(path, 40)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_resume_drops_rows_logged_after_its_checkpoint_at_the_checkpoint_step(tmp_path, capsys):
    """A checkpoint records metrics.jsonl's length and last line: rows of its own step logged after it (a final
    evaluation after an early stop's checkpoint) are dropped on resume, which logs them again. A file edited since
    (a line mended to another length, so the length no longer ends at that line) is cut by step alone, with a
    warning, rather than at a length that now falls elsewhere."""
    from offrl.logging import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": 0.5 * s}) for s in (10, 20, 30)]
    before = "".join(row + "\n" for row in rows)
    after = json.dumps({"step": 30, "eval/return_mean": 7.0}) + "\n" + json.dumps({"step": 40, "loss": 1.0}) + "\n"
    end = (len(before.encode()), rows[-1])
    path.write_text(before + after)
    truncate_metrics(path, 30, end)
    assert path.read_text() == before and "changed since" not in capsys.readouterr().err
    truncate_metrics(path, 30, (0, ""))  # a checkpoint saved before any row
    assert path.read_text() == ""
    mended = json.dumps({"step": 10, "loss": 5.0, "note": "mended"})  # longer than the line it replaced
    path.write_text(mended + "\n" + "".join(row + "\n" for row in rows[1:]) + after)
    truncate_metrics(path, 30, end)
    assert [json.loads(line) for line in path.read_text().splitlines()][-1] == {"step": 30, "eval/return_mean": 7.0}
    assert "changed since the checkpoint was saved" in capsys.readouterr().err


def test_resume_refuses_data_that_differs_from_what_the_run_trained_on(tiny, tmp_path):
    """dataset.json records the trained data's checksum (after preprocessing): a dataset made again differently,
    or another offrl computing another reward scale, would change the run halfway, so the resume is refused
    naming what changed, and the folder is left as it was."""
    args = ["--steps", "30", "--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled",
            "--hidden", "32", "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.td3_bc", *args)
    run_dir = only_run(tmp_path)
    record = json.loads((run_dir / "dataset.json").read_text())
    record |= {"trained_checksum": "0" * 16, "reward_scale": 0.5}  # as if trained on other rewards
    (run_dir / "dataset.json").write_text(json.dumps(record))
    before = {name: (run_dir / name).read_bytes() for name in ("final.json", "metrics.jsonl", "dataset.json")}
    result = run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "40", "--resume", "latest", check=False)
    assert result.returncode == 1 and "the data differs from what this run trained on" in result.stderr
    assert "reward_scale: 0.5 -> 1.0" in result.stderr and "Traceback" not in result.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    (run_dir / "dataset.json").write_text(json.dumps({k: v for k, v in record.items() if k != "trained_checksum"}))
    assert run_cli(PYTHON, "-m", "algos.td3_bc", *args[2:], "--steps", "40", "--resume", "latest").returncode == 0
