"""Model-based algorithms on the tiny dataset: command-line smoke runs, the cached model reused, and an
interrupted run that resumes to the same numbers."""

import json

import numpy as np
import pytest

from conftest import PYTHON, VOLATILE, run_cli, tiny_model

TINY_MODEL = tiny_model(max_epochs=3)
FAST = ["--eval.episodes", "3", "--log.every", "50", "--log.wandb", "disabled", "--hidden", "32", "32",
        "--rollout-every", "100", "--rollout-batch", "200", *TINY_MODEL]


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def test_mopo_smoke_and_its_model_is_reused(tiny, tmp_path, model_cache):
    first = run_cli(PYTHON, "-m", "algos.mopo", "--steps", "200", "--eval.every", "100", *FAST,
                    "--run.out-dir", str(tmp_path / "a"))
    assert "final normalized score" in first.stdout and "dynamics model | epoch 1" in first.stderr
    (run_dir,) = (tmp_path / "a").glob("mopo/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert np.isfinite(final["eval/normalized_score"]) and final["rollout_length"] == 5
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("rollout/transitions", 0) > 0 for r in rows) and any("rollout/penalty_mean" in r for r in rows)
    assert len(list(model_cache.glob("*/model.pt"))) == 1
    # the run names the model it rolled out: the file's hash, its hold-out errors, elites and training
    import hashlib

    (model_file,) = model_cache.glob("*/model.pt")
    model = final["dynamics_model"]
    assert final["model_file"] == model["file"] == str(model_file)
    assert model["sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()[:16]
    assert model["epochs"] == 3 and len(model["holdout_mse"]) == model["config"]["members"] > len(model["elites"])
    assert model["training"]["timed_from_epoch"] == 0 and model["training"]["cpu_seconds"] > 0
    second = run_cli(PYTHON, "-m", "algos.mopo", "--steps", "50", "--eval.every", "0", *FAST,
                     "--run.out-dir", str(tmp_path / "b"))
    assert "reusing" in second.stderr and "epoch 1" not in second.stderr  # no second model was trained
    other_seed = run_cli(PYTHON, "-m", "algos.mopo", "--steps", "50", "--eval.every", "0", *FAST, "--seed", "1",
                         "--model-seed", "0", "--run.out-dir", str(tmp_path / "c"))
    assert "reusing" in other_seed.stderr and len(list(model_cache.glob("*/model.pt"))) == 1


def test_mopo_resumes_to_the_same_numbers(tiny, tmp_path, model_cache):
    """Stopped after 150 steps (between two rollout rounds) and continued to 200, as one 200-step run (MOPO has
    no schedule that depends on --steps; MOBILE's cosine actor schedule does, so its runs resume only with the
    same --steps), even when the cached dynamics model is gone by then (resumed on another machine): the run
    rolls out the model its checkpoint holds and trains none."""
    args = ["--eval.every", "0", *FAST]
    run_cli(PYTHON, "-m", "algos.mopo", "--steps", "200", *args, "--run.out-dir", str(tmp_path / "straight"))
    run_cli(PYTHON, "-m", "algos.mopo", "--steps", "150", *args, "--run.out-dir", str(tmp_path / "split"))
    import shutil

    import torch

    from offrl import checkpoint as ckpt

    shutil.rmtree(model_cache)
    resumed = run_cli(PYTHON, "-m", "algos.mopo", "--steps", "200", *args, "--run.out-dir", str(tmp_path / "split"),
                      "--resume", "latest")
    assert "the run's checkpoint holds it" in resumed.stderr and "dynamics model | epoch" not in resumed.stderr
    assert not model_cache.exists()

    runs = [next((tmp_path / name).glob("mopo/*/*")) for name in ("straight", "split")]
    finals = [{k: v for k, v in json.loads((r / "final.json").read_text()).items() if k not in VOLATILE} for r in runs]
    # the split run's record says its model's file is not there, and gives the model it rolled out
    models = [final.pop("dynamics_model") for final in finals]
    assert "file_unread" in models[1] and "sha256" in models[0] and "sha256" not in models[1]
    assert models[1]["file"] == models[0]["file"]  # the cache entry it started from
    assert models[1]["holdout_mse"] == models[0]["holdout_mse"] and models[1]["elites"] == models[0]["elites"]
    assert finals[0] == finals[1] and "eval/return_mean" in finals[0]
    rows = [[{k: v for k, v in json.loads(line).items() if k not in VOLATILE}
             for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs]
    # the split run's first process ended with its own evaluation at step 150; every other row is the same, the
    # rollout round's metrics (from step 101) in the resumed process's row at step 200 included
    rows[1] = [row for row in rows[1] if not (row["step"] == 150 and any(k.startswith("eval/") for k in row))]
    assert rows[0] == rows[1] and len(rows[0]) > 4  # every logged row, the resumed steps included
    resumed = [row for row in rows[1] if row["step"] > 150 and not any(k.startswith("eval/") for k in row)]
    assert resumed and all("rollout/reward_mean" in row for row in resumed)
    states = [ckpt.load(r / "checkpoints" / "last.pt")["objects"] for r in runs]

    def tensors(tree, path=""):
        if isinstance(tree, torch.Tensor):
            yield path, tree
        elif isinstance(tree, dict):
            for k in sorted(tree, key=str):
                yield from tensors(tree[k], f"{path}/{k}")
        elif isinstance(tree, (list, tuple)):
            for i, v in enumerate(tree):
                yield from tensors(v, f"{path}[{i}]")

    straight, split = dict(tensors(states[0])), dict(tensors(states[1]))
    assert straight.keys() == split.keys() and any("buffer" in k or "model" in k for k in straight)
    for name, value in straight.items():
        assert torch.equal(value, split[name]), name  # models, optimizers, model buffer, rollout RNG


def test_a_model_path_run_resumes_after_its_model_file_is_gone(tiny, tmp_path, model_cache):
    """The checkpoint holds the model the run rolls out: with --model-path's file gone, it is built from --model's
    options, into which the checkpoint's weights must fit (else a clear error asks for the file back)."""
    import shutil

    trained = run_cli(PYTHON, "-m", "world_models.train", "--dataset", tiny, *TINY_MODEL, "--cache-dir", str(tmp_path / "m"))
    model_file = tmp_path / "model.pt"
    shutil.copy(trained.stdout.splitlines()[-1].split("model: ", 1)[1], model_file)
    untiny = FAST[:FAST.index(TINY_MODEL[0])]  # the default --model options: not the file's
    for name, args in (("fits", FAST), ("other", untiny)):
        out = ["--run.out-dir", str(tmp_path / name), "--model-path", str(model_file), "--eval.every", "0"]
        run_cli(PYTHON, "-m", "algos.mopo", "--steps", "40", *args, *out)
        model_file.rename(tmp_path / "away.pt")
        resumed = run_cli(PYTHON, "-m", "algos.mopo", "--steps", "60", *args, *out, "--resume", "latest", check=False)
        (tmp_path / "away.pt").rename(model_file)
        if name == "fits":
            assert resumed.returncode == 0 and "no model file is read" in resumed.stderr, resumed.stderr
            record = json.loads(next((tmp_path / name).glob("mopo/*/*/final.json")).read_text())
            assert record["model_file"] == str(model_file) and record["steps"] == 60
        else:
            assert resumed.returncode == 1 and "Traceback" not in resumed.stderr, resumed.stderr
            assert f"--model-path {model_file} is gone: put it back" in resumed.stderr
            assert "does not fit one built from the --model options (Missing key(s)" in resumed.stderr  # 4 layers, not 2
    # options the file makes unused: refused before a run folder is made (the file's config builds the model)
    import dataclasses

    from algos import mopo
    from offrl.errors import OffrlError
    from offrl.run import parse_config

    cfg = parse_config(mopo.Config, ["--steps", "40", *FAST, "--model-path", str(model_file), "--run.out-dir",
                                     str(tmp_path / "refused"), "--model-seed", "3", "--retrain-model"])
    cfg.model = dataclasses.replace(cfg.model, hidden=(8, 8), compile=True)
    with pytest.raises(OffrlError) as refused:  # in process: it stops before a run folder, as the CLI does
        mopo.train(cfg)
    assert ("--model-seed does nothing with --model-path; --retrain-model does nothing with --model-path; "
            "--model.hidden (8, 8) differs from the --model-path file's (16, 16); --model.compile True differs from "
            "the --model-path file's False") in str(refused.value)
    assert not (tmp_path / "refused").exists()
    assert not list(model_cache.glob("*/model.pt"))  # none trained


def test_mobile_and_mopo_per_dataset_settings():
    """(h, beta, tune alpha, real ratio, model epochs) by dataset, the random levels included (the official
    configs/gym/*_random.py), the suite's names read as D4RL's env and level; other data the default."""
    from algos.mobile import DEFAULT_SETTING, SETTINGS
    from world_models.config import dataset_setting

    assert dataset_setting("offrl/hopper/random-v0", SETTINGS, DEFAULT_SETTING) == (5, 5.0, True, None, None)
    assert dataset_setting("halfcheetah-random-v2", SETTINGS, DEFAULT_SETTING)[:2] == (5, 0.5)
    assert dataset_setting("offrl/walker2d/random-v0", SETTINGS, DEFAULT_SETTING)[:2] == (5, 2.0)
    assert dataset_setting("offrl/walker2d/medium-v0", SETTINGS, DEFAULT_SETTING) == (5, 0.5, True, None, 30)
    assert dataset_setting("offrl/hopper/medium-replay-v0", SETTINGS, DEFAULT_SETTING) == (5, 0.1, False, None, None)
    assert dataset_setting("offrl/tiny-v0", SETTINGS, DEFAULT_SETTING) == DEFAULT_SETTING
    from algos import mopo  # OfflineRL-Kit's v2 table, and the official v0 configs for the random level it lacks

    assert dataset_setting("offrl/hopper/medium-replay-v0", mopo.SETTINGS, mopo.DEFAULT_SETTING) == (5, 2.5)
    assert dataset_setting("offrl/walker2d/random-v0", mopo.SETTINGS, mopo.DEFAULT_SETTING) == (1, 1.0)
    assert dataset_setting("offrl/halfcheetah/random-v0", mopo.SETTINGS, mopo.DEFAULT_SETTING) == (5, 0.5)
    # D4RL's own file names have underscores (they fell back to the default setting)
    assert dataset_setting("/data/d4rl/hopper_medium_replay-v2.hdf5", mopo.SETTINGS, mopo.DEFAULT_SETTING) == (5, 2.5)
    assert dataset_setting("walker2d_medium-v2.hdf5", SETTINGS, DEFAULT_SETTING) == (5, 0.5, True, None, 30)
    # Minari's names of the same env and level too, and a level is not read as a longer one that ends with it
    assert dataset_setting("mujoco/hopper/medium-v0", mopo.SETTINGS, mopo.DEFAULT_SETTING) == \
        dataset_setting("hopper-medium-v2", mopo.SETTINGS, mopo.DEFAULT_SETTING)
    assert dataset_setting("mujoco/hopper/medium-expert-v0", SETTINGS, DEFAULT_SETTING) == \
        dataset_setting("hopper-medium-expert-v2", SETTINGS, DEFAULT_SETTING) != \
        dataset_setting("hopper-expert-v2", SETTINGS, DEFAULT_SETTING)
    assert dataset_setting("mujoco/hopper/simple-v0", SETTINGS, DEFAULT_SETTING) == DEFAULT_SETTING


@pytest.mark.parametrize("algo", ["mopo", "mobile", "ravl", "mbrcsl"])
def test_model_based_algorithms_refuse_preprocessed_data_before_a_run_folder_or_a_model(tiny, tmp_path, model_cache, algo):
    """Their dynamics model learns the raw data: normalized states or scaled rewards are refused up front, before
    a run folder is made or a model trained (hours on a CPU)."""
    import importlib

    from offrl.config import DataConfig
    from offrl.errors import OffrlError

    module = importlib.import_module(f"algos.{algo}")
    for data in (DataConfig(normalize_states=True), DataConfig(reward_scale=2.0)):
        cfg = module.Config(dataset=tiny, data=data)
        cfg.run.out_dir = str(tmp_path / "runs")
        with pytest.raises(OffrlError, match=f"{algo} learns a dynamics model of the raw data"):
            module.train(cfg)
    assert not (tmp_path / "runs").exists() and not model_cache.exists()


@pytest.mark.parametrize("algo", ["mopo", "mobile", "ravl"])
def test_a_real_ratio_outside_zero_to_one_or_weighted_sampling_of_no_dataset_row_is_refused(tiny, tmp_path, model_cache,
                                                                                           algo):
    import importlib

    from offrl.config import DataConfig
    from offrl.errors import OffrlError

    module = importlib.import_module(f"algos.{algo}")
    cases = [({"real_ratio": 1.5}, r"--real-ratio 1.5: the fraction of dataset rows in a batch, in \[0, 1\]"),
             ({"real_ratio": 0.0, "data": DataConfig(sampling="return-weighted")},
              r"model rows only \(--real-ratio 0.0 gives no dataset row in a batch of 256\).*return-weighted")]
    for options, message in cases:
        cfg = module.Config(dataset=tiny, **options)
        cfg.run.out_dir = str(tmp_path / "runs")
        with pytest.raises(OffrlError, match=message):
            module.train(cfg)
    assert not (tmp_path / "runs").exists() and not model_cache.exists()


def test_mobile_smoke(tiny, tmp_path, model_cache):
    result = run_cli(PYTHON, "-m", "algos.mobile", "--steps", "150", "--eval.every", "100", "--num-samples", "3", *FAST,
                     "--run.out-dir", str(tmp_path))
    assert "final normalized score" in result.stdout and "beta 1.0, alpha tuned" in result.stdout
    (run_dir,) = tmp_path.glob("mobile/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert np.isfinite(final["eval/normalized_score"]) and final["train/penalty_mean"] > 0


def test_ravl_smoke(tiny, tmp_path, model_cache):
    result = run_cli(PYTHON, "-m", "algos.ravl", "--steps", "150", "--eval.every", "100", "--num-critics", "4", *FAST,
                     "--run.out-dir", str(tmp_path))
    assert "final normalized score" in result.stdout
    (run_dir,) = tmp_path.glob("ravl/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert np.isfinite(final["eval/normalized_score"]) and np.isfinite(final["train/diversity_loss"])


def test_edac_diversity_loss_by_hand():
    """Critics linear in the action, Q_i = <w_i, a>: the normalized gradients are w_i / |w_i|, so with two
    critics L_div = 1/(2 - 1) * (<g_1, g_2> + <g_2, g_1>) = 2 cos(w_1, w_2) at every row."""
    import torch

    from algos.ravl import diversity_loss

    weights = torch.tensor([[3.0, 4.0], [1.0, 0.0]])

    class LinearCritics(torch.nn.Module):
        ensemble_size = 2

        def forward(self, obs, actions):
            return (actions * weights[:, None, :]).sum(-1)

    loss = diversity_loss(LinearCritics(), torch.zeros(5, 3), torch.randn(5, 2))
    assert loss.item() == pytest.approx(2 * 3 / 5)
