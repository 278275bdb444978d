"""Seeds trained as one batched model (`--seeds`): each seed's numbers against its single-seed run, resume,
the per-seed run folders, and the errors."""

import json
from pathlib import Path

import pytest

from conftest import PYTHON, assert_reevaluation_reproduces, run_cli

ARGS = ["--eval.every", "100", "--eval.episodes", "3", "--log.every", "50", "--log.wandb", "disabled",
        "--log.no-progress"]
WIDTH = ["--hidden", "64", "64"]  # what is compared does not depend on the width; 256 wide took 2-4x longer


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_folder(root: Path, seed: int, algo: str = "iql") -> Path:
    (found,) = root.glob(f"{algo}/*/{seed}-*")
    return found


@pytest.mark.parametrize("algo, extra", [("iql", []), ("td3_bc", []), ("bc", ["--frac", "0.5"])])
def test_each_seed_matches_its_single_seed_run(tiny, tmp_path, algo, extra):
    """Batched matmuls sum in another order than single ones, so the seeds' losses agree with their single-seed
    runs to rounding at first (rel 1e-4 at step 50) and drift slowly (rel 1e-2 by step 200); the evaluations,
    deterministic policies on the same env seeds, give the same returns. (%BC: the same episodes kept.)"""
    run_cli(PYTHON, "-m", f"algos.{algo}", "--seeds", "0", "1", "--steps", "200", *ARGS, *WIDTH, *extra,
            "--run.out-dir", str(tmp_path / "multi"))
    for seed in (0, 1):
        run_cli(PYTHON, "-m", f"algos.{algo}", "--seed", str(seed), "--steps", "200", *ARGS, *WIDTH, *extra,
                "--run.out-dir", str(tmp_path / "single"))
        finals = [json.loads((run_folder(tmp_path / name, seed, algo) / "final.json").read_text())
                  for name in ("multi", "single")]
        assert finals[0].get("train/kept_episodes") == finals[1].get("train/kept_episodes")
        batched = metrics(run_folder(tmp_path / "multi", seed, algo))
        single = metrics(run_folder(tmp_path / "single", seed, algo))
        assert [r["step"] for r in batched] == [r["step"] for r in single]
        for a, b in zip(batched, single):
            tolerance = 1e-4 if a["step"] <= 50 else 1e-2
            for key in ("value_loss", "critic_loss", "actor_loss", "q_mean"):
                if key in a:
                    assert a[key] == pytest.approx(b[key], rel=tolerance, abs=1e-6), (seed, a["step"], key)
            if "eval/return_mean" in a:
                assert a["eval/return_mean"] == pytest.approx(b["eval/return_mean"], rel=1e-3)
        config = json.loads((run_folder(tmp_path / "multi", seed, algo) / "config.json").read_text())
        assert config["seed"] == seed and config["seeds"] is None  # the folder is a single-seed run's
    loss = "actor_loss" if algo == "bc" else "critic_loss"
    first = [metrics(run_folder(tmp_path / "multi", seed, algo))[0][loss] for seed in (0, 1)]
    assert first[0] != first[1]  # the seeds differ from each other


def test_a_resumed_multi_seed_run_continues_exactly_and_each_folder_stands_alone(tiny, tmp_path):
    """Stopped after 100 steps and continued to 200, as one 200-step run (a constant actor lr: the cosine schedule
    is a function of --steps)."""
    ARGS = [*globals()["ARGS"], *WIDTH, "--no-cosine-actor-lr"]
    run_cli(PYTHON, "-m", "algos.iql", "--seeds", "3", "4", "--steps", "200", *ARGS, "--run.out-dir", str(tmp_path / "straight"))
    run_cli(PYTHON, "-m", "algos.iql", "--seeds", "3", "4", "--steps", "100", *ARGS, "--run.out-dir", str(tmp_path / "split"))
    run_cli(PYTHON, "-m", "algos.iql", "--seeds", "3", "4", "--steps", "200", *ARGS, "--run.out-dir", str(tmp_path / "split"),
            "--resume", "latest")
    for seed in (3, 4):
        straight, split = (json.loads((run_folder(tmp_path / name, seed) / "final.json").read_text())
                           for name in ("straight", "split"))
        for key in ("eval/return_mean", "train/critic_loss", "train/actor_loss", "train/value_loss"):
            assert straight[key] == split[key], (seed, key)
        # the 2 seeds share their one-thread process: each counts half its core-seconds
        assert straight["core_seconds"] == pytest.approx(straight["wall_seconds"] / 2, rel=1e-3)
    assert_reevaluation_reproduces(run_folder(tmp_path / "straight", 3))  # `offrl eval` rebuilds seed 3 alone


def test_seeds_errors(tiny, tmp_path):
    other = run_cli(PYTHON, "-m", "algos.cql", "--seeds", "0", "1", "--steps", "10", "--run.out-dir", str(tmp_path),
                    check=False)
    assert other.returncode == 1 and "does not train seeds as one batched model yet" in other.stderr
    twice = run_cli(PYTHON, "-m", "algos.iql", "--seeds", "0", "0", "--steps", "10", "--run.out-dir", str(tmp_path),
                    check=False)
    assert twice.returncode == 1 and "none given twice" in twice.stderr and "Traceback" not in twice.stderr
    dropout = run_cli(PYTHON, "-m", "algos.iql", "--seeds", "0", "1", "--actor-dropout", "0.1", "--steps", "10",
                      "--run.out-dir", str(tmp_path), check=False)
    assert dropout.returncode == 1 and "--actor-dropout 0.1: dropout is not drawn per seed" in dropout.stderr
    assert "Traceback" not in dropout.stderr


def two_bc_seeds(out_dir):
    """BC seeds 0 and 1 as one batched run, 20 steps, evaluated at the end only, into `out_dir`."""
    from algos import bc

    cfg = bc.Config(steps=20, seeds=[0, 1])
    cfg.eval.every, cfg.eval.episodes, cfg.log.wandb, cfg.run.out_dir = 0, 2, "disabled", str(out_dir)
    return cfg


def test_a_multi_seed_run_gives_the_process_its_signal_handlers_back(tiny, tmp_path):
    """Each seed's Run saves the handler it finds (the previous seed's run's for all but the first); when they
    finish, the process's own handlers are back, so a later Ctrl-C is not swallowed by a finished run."""
    import signal

    from algos import bc

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    cfg = two_bc_seeds(tmp_path)
    bc.train_seeds(cfg)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_signal_while_a_later_seeds_run_is_built_stops_every_seed(tiny, tmp_path, monkeypatch):
    """The signal reaches the handler installed then, the last-built seed's run's; the loop reads the first run's
    flag: every seed stops after the first step, with a checkpoint, instead of the signal being lost."""
    import os
    import signal

    from algos import bc
    from offrl import run as offrl_run

    from conftest import saved_step

    real_init = offrl_run.Run.__init__

    def init(self, algo, cfg, *args, **kwargs):
        real_init(self, algo, cfg, *args, **kwargs)
        if cfg.seed == 1:  # the last seed's run is built and holds the handler
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(offrl_run.Run, "__init__", init)
    cfg = two_bc_seeds(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        bc.train_seeds(cfg)
    assert stopped.value.code == 128 + signal.SIGTERM
    for seed in (0, 1):
        assert saved_step(run_folder(tmp_path, seed, "bc") / "checkpoints" / "last.pt") == 1


def test_seeds_whose_records_fail_to_open_let_go_of_everything(tiny, tmp_path, monkeypatch):
    """An error while the seeds' records open (a full disk, wandb failing to start) after the first seed's
    opened: its logger is closed, the process's handlers are back and the new folders are gone."""
    import signal

    from algos import bc
    from offrl import run as offrl_run

    real_open, opened = offrl_run.Run.open_records, []

    def open_records(self):
        if self.cfg.seed == 1:
            raise OSError("no space left on device")
        real_open(self)
        opened.append(self.logger)

    monkeypatch.setattr(offrl_run.Run, "open_records", open_records)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    cfg = two_bc_seeds(tmp_path)
    with pytest.raises(OSError, match="no space"):
        bc.train_seeds(cfg)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert len(opened) == 1 and opened[0]._file.closed and not list(tmp_path.glob("bc/*/*"))


def test_a_later_seed_refused_while_the_runs_are_built_leaves_no_folder(tiny, tmp_path, monkeypatch):
    """A seed whose Run is refused (e.g. its checkpoint damaged under --resume auto) after an earlier seed's folder
    was made: that folder is removed and the process's handlers are back (an empty folder was left before)."""
    import signal

    from algos import bc
    from offrl import run as offrl_run
    from offrl.errors import OffrlError
    from offrl.multiseed import seed_configs

    real_init = offrl_run.Run.__init__

    def init(self, algo, cfg, *args, **kwargs):
        if cfg.seed == 1:
            raise OffrlError("seed 1's checkpoint is damaged")
        real_init(self, algo, cfg, *args, **kwargs)

    monkeypatch.setattr(offrl_run.Run, "__init__", init)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    cfg = two_bc_seeds(tmp_path)
    with pytest.raises(OffrlError, match="damaged"):
        bc.train_seeds(cfg)
    assert {sig: signal.getsignal(sig) for sig in before} == before and not list(tmp_path.glob("bc/*/*"))
    with pytest.raises(OffrlError, match="--seeds 0 -1: each seed 0 or more"):
        seed_configs(bc.Config(seeds=[0, -1]))


def test_seeds_whose_checkpoints_are_at_different_steps_are_refused_and_leave_no_new_folder(tiny, tmp_path):
    """A kill between the seeds' checkpoint writes leaves them at different steps: --seeds --resume says to resume
    each alone, lets go of the folders (each alone then resumes) and removes a folder it made for a seed without
    a checkpoint, so retries do not pile up empty folders. The refusal changes no record in the seeds' folders
    (config.json, environment.json's resume entries, metrics.jsonl, dataset.json)."""
    import signal

    args = ["--eval.every", "0", "--eval.episodes", "2", "--log.wandb", "disabled", "--hidden", "16", "16",
            "--run.checkpoint-every", "20", "--run.out-dir", str(tmp_path)]
    run_cli(PYTHON, "-m", "algos.bc", "--seeds", "0", "1", "--steps", "20", *args)
    run_cli(PYTHON, "-m", "algos.bc", "--seed", "0", "--steps", "40", *args, "--resume", "latest")  # seed 0 ahead

    def records():
        return {p: p.read_bytes() for p in sorted(tmp_path.glob("bc/*/*/*")) if p.is_file() and p.name != ".lock"}

    before_refusal = records()
    apart = run_cli(PYTHON, "-m", "algos.bc", "--seeds", "0", "1", "--steps", "60", *args, "--resume", "latest",
                    "--eval.episodes", "3", check=False)  # an option a resume may change, written on a resume
    assert apart.returncode == 1 and "seed 0 at step 40, seed 1 at step 20" in apart.stderr
    assert "--seed N --resume latest" in apart.stderr and "Traceback" not in apart.stderr
    assert records() == before_refusal and any(p.name == "environment.json" for p in before_refusal)
    run_cli(PYTHON, "-m", "algos.bc", "--seed", "1", "--steps", "60", *args, "--resume", "latest")  # alone: fine
    # seed 2 never ran: --resume auto makes a folder for it, removed when the seeds are refused (in this process)
    from algos import bc

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    cfg = bc.Config(steps=60, seeds=[0, 2], hidden=(16, 16), resume="auto")
    cfg.eval.every, cfg.eval.episodes, cfg.log.wandb, cfg.run.out_dir = 0, 2, "disabled", str(tmp_path)
    with pytest.raises(Exception, match="seed 2 at step 0"):
        bc.train_seeds(cfg)
    assert {sig: signal.getsignal(sig) for sig in before} == before  # the process's handlers are back
    assert not list(tmp_path.glob("bc/*/2-*"))
