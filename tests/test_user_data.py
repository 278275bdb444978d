"""A user's own data: envs registered by other packages ('module:EnvId') and reference scores given
on the command line."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from offrl.config import DataConfig
from offrl.data import DatasetError, load_dataset, load_for_training
from offrl.data.dataset import Dataset
from offrl.evaluation import evaluate

from conftest import PYTHON, run_cli

ENV = "offrl_test_envs:OffrlPointMass-v0"


def point_mass_npz(path: Path, metadata: dict) -> Path:
    rng = np.random.default_rng(0)
    n, length = 300, 30
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    timeouts = np.zeros(n, np.float32)
    timeouts[length - 1::length] = 1
    Dataset(obs, rng.uniform(-1, 1, (n, 1)).astype(np.float32), -obs[:, 0] ** 2, obs + 0.01, np.zeros(n, np.float32),
            timeouts, np.arange(0, n, length), metadata).save_npz(str(path))
    return path


def with_tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))


def test_env_of_another_package_named_module_colon_id(tmp_path, monkeypatch):
    with_tests_on_path(monkeypatch)
    path = point_mass_npz(tmp_path / "pm.npz", {"env_id": ENV})
    data = load_for_training(str(path), DataConfig(make_if_missing=False))
    assert data.obs_dim == 2 and data.act_dim == 1
    result = evaluate(lambda obs: torch.zeros(obs.shape[0], 1), data.metadata, episodes=2)
    assert (result.lengths == 30).all() and result.normalized is None
    out = run_cli(PYTHON, "-m", "offrl.cli", "datasets", "validate", str(path))
    assert "ok:" in out.stdout and "warning: no reference scores" in out.stdout


def test_unknown_env_gets_an_error_that_says_how_to_name_it(tmp_path):
    path = point_mass_npz(tmp_path / "pm.npz", {"env_id": "OffrlNeverRegistered-v0"})
    with pytest.raises(DatasetError, match="module:EnvId"):
        load_for_training(str(path), DataConfig(make_if_missing=False))
    with pytest.raises(DatasetError, match="cannot make evaluation env 'no_such_package:Door-v1'"):
        load_for_training(str(path), DataConfig(make_if_missing=False, env_id="no_such_package:Door-v1"))


def test_reference_scores_from_the_command_line(tmp_path, monkeypatch):
    with_tests_on_path(monkeypatch)
    path = point_mass_npz(tmp_path / "pm.npz", {"env_id": ENV})
    assert load_dataset(str(path)).metadata.get("ref_max_score") is None
    meta = load_dataset(str(path), ref_min_score=-30.0, ref_max_score=0.0).metadata
    assert (meta["ref_min_score"], meta["ref_max_score"]) == (-30.0, 0.0) and "user" in meta["ref_source"]
    with pytest.raises(DatasetError, match="pass both"):
        load_dataset(str(path), ref_max_score=0.0)
    with pytest.raises(DatasetError, match="max > min"):
        load_dataset(str(path), ref_min_score=1.0, ref_max_score=0.0)
    out = run_cli(PYTHON, "-m", "offrl.cli", "datasets", "validate", str(path), "--ref-min-score", "-30",
                  "--ref-max-score", "0")
    assert "reference scores: min -30, max 0" in out.stdout and "warning" not in out.stdout
    run_cli(PYTHON, "-m", "algos.bc", "--dataset", str(path), "--steps", "50", "--eval.episodes", "2",
            "--log.wandb", "disabled", "--run.out-dir", str(tmp_path / "runs"), "--data.ref-min-score", "-30",
            "--data.ref-max-score", "0", "--hidden", "16", "16")
    run_dir = next((tmp_path / "runs" / "bc").glob("*/*"))
    recorded = json.loads((run_dir / "dataset.json").read_text())
    assert (recorded["ref_min_score"], recorded["ref_max_score"]) == (-30.0, 0.0)
    final = json.loads((run_dir / "final.json").read_text())
    expected = 100 * (final["eval/return_mean"] + 30) / 30
    assert final["eval/normalized_score"] == pytest.approx(expected)
