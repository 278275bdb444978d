"""Shared fixtures: every test session gets its own Minari datasets folder with offrl/tiny-v0 in it."""

import os
import sys
import warnings
from pathlib import Path

import pytest

import forkserver

ROOT = Path(__file__).resolve().parent.parent


# One thread per process, in the test process and in every command it starts, as offrl's runs default
# to: a multi-threaded suite beside another busy process on 2 cores slows both down many times over.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
forkserver.snapshot_environment()


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def minari_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari")
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    os.environ["WANDB_SILENT"] = "true"
    warnings.filterwarnings("ignore", category=UserWarning, module="minari")
    yield root
    if old is None:
        os.environ.pop("MINARI_DATASETS_PATH", None)
    else:
        os.environ["MINARI_DATASETS_PATH"] = old


@pytest.fixture(scope="session")
def tiny(minari_root):
    """The tiny dataset, made once per session; returns its id."""
    from offrl.data import suite

    suite.ensure("offrl/tiny-v0")
    return "offrl/tiny-v0"


def run_cli(*args, cwd=None, timeout=300, check=True):
    """Run a command line as a user would (python -m ... / offrl ...) in a process of its own and return the
    result; forked from a Python with torch imported where it can be (tests/forkserver.py)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = forkserver.run(list(args), cwd=cwd or ROOT, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


PYTHON = sys.executable

# run-record fields that differ between two runs of the same numbers (clocks, resumes, the folder)
VOLATILE = ("time", "steps_per_second", "train/steps_per_second", "wall_seconds", "core_seconds", "resumes", "run_dir")


def tiny_model(max_epochs: int) -> list[str]:
    """Options for a dynamics ensemble small enough to train in a test: 3 members, 2 elites, 16x16, no decay."""
    return ["--model.members", "3", "--model.elites", "2", "--model.hidden", "16", "16",
            "--model.weight-decay", "0", "0", "0", "--model.max-epochs", str(max_epochs)]


def strip(row: dict) -> dict:
    """A run record without its VOLATILE fields."""
    return {k: v for k, v in row.items() if k not in VOLATILE}


def assert_reevaluation_reproduces(run_dir):
    """`offrl eval` of a finished run, with the run's own episodes and seed, gives its last evaluations."""
    import json

    from offrl.eval_run import evaluate_saved_run

    final = json.loads((Path(run_dir) / "final.json").read_text())
    report = evaluate_saved_run(run_dir, device="cpu")
    assert report["results"], report
    for name, result in report["results"].items():
        for key in ("return_mean", "length_mean"):
            assert result[key] == pytest.approx(final[f"{name}/{key}"], rel=1e-6), (name, key, result, final)
    return report


def two_behaviours(rng, obs_dim, metadata, episodes=40, length=10, action=0.8):
    """Episodes of return `length` that took +`action` at every step (reward 1 each) alternating with episodes of
    return 0 that took -`action`, from random states drawn from `rng`: the return-conditioned algorithms' task."""
    import numpy as np

    from offrl.data import Dataset

    n = episodes * length
    good = np.repeat(np.arange(episodes) % 2 == 0, length)
    obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
    timeouts = np.zeros(n, np.float32)
    timeouts[length - 1::length] = 1
    return Dataset(obs, np.where(good, action, -action).astype(np.float32)[:, None], good.astype(np.float32), obs,
                   np.zeros(n, np.float32), timeouts, np.arange(0, n, length), metadata).validate()


def saved_step(path):
    """The step the checkpoint at `path` holds, or None while it is missing or being replaced."""
    from offrl import checkpoint as ckpt

    try:
        return ckpt.load(path)["step"]
    except Exception:
        return None


def assert_compiled_critics_train_as_eager(compiled, eager, compiled_metrics, eager_metrics):
    """An agent with compiled critics against the same agent eager after the same updates: the critics' state_dict
    keys (what checkpoints hold), every network's parameters and every update's metrics, up to float rounding."""
    import torch

    assert compiled.critic.state_dict().keys() == eager.critic.state_dict().keys()
    for net in ("critic", "critic_target", "actor"):
        for got, want in zip(getattr(compiled, net).parameters(), getattr(eager, net).parameters()):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for got, want in zip(compiled_metrics, eager_metrics):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
