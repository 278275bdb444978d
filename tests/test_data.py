"""Data layer: Minari alignment, D4RL semantics, npz round trip, validation errors, preprocessing, buffer."""

import os
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

from offrl.data import ReplayBuffer, load_dataset
from offrl.data import preprocess, suite
from offrl.data.dataset import Dataset
from offrl.errors import DatasetError

from conftest import PYTHON, run_cli


# ------------------------------------------------------------------------------ Minari alignment
def test_minari_rows_equal_the_env_steps_that_produced_them():
    """Episodes of different lengths, some terminated and some truncated: every (s, a, r, s', done)
    row must be exactly the env step that produced it, with timeouts kept apart from terminals."""
    env = gym.make("InvertedPendulum-v5", max_episode_steps=40)
    rng = np.random.default_rng(3)
    recorded, episodes = [], []
    # noise 0 balances until the 40-step limit (truncated); large noise falls early (terminated);
    # the last episode is cut by the recorder after 17 steps (truncated without the limit).
    for index, (noise, cut) in enumerate([(0.0, None), (3.0, None), (0.0, 17), (2.0, None), (0.0, None)]):
        obs, _ = env.reset(seed=100 + index)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        while True:
            action = np.clip(np.array([1.0, 10.0, 1.0, 1.0]) @ obs + noise * rng.standard_normal(1), -3, 3).astype(np.float32)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            truncated = truncated or (cut is not None and len(actions) + 1 >= cut and not terminated)
            recorded.append((obs, action, reward, next_obs, terminated, truncated))
            observations.append(next_obs), actions.append(action), rewards.append(reward)
            terms.append(terminated), truncs.append(truncated)
            obs = next_obs
            if terminated or truncated:
                break
        episodes.append(suite.Episode(np.array(observations), np.array(actions), np.array(rewards),
                                      np.array(terms), np.array(truncs), seed=100 + index))
    lengths = [len(e) for e in episodes]
    assert len(set(lengths)) >= 3, lengths
    assert any(e.terminations[-1] for e in episodes) and any(e.truncations[-1] for e in episodes)

    made = suite.MadeDataset(episodes, env.spec, 0.0, 40.0, "alignment test", "test")
    suite.write_minari_dataset("test/alignment-v0", made)
    ds = load_dataset("test/alignment-v0")

    assert len(ds) == len(recorded) == sum(lengths)
    assert ds.episode_starts.tolist() == np.cumsum([0] + lengths[:-1]).tolist()
    for row, (obs, action, reward, next_obs, terminated, truncated) in enumerate(recorded):
        np.testing.assert_array_equal(ds.observations[row], obs.astype(np.float32))
        np.testing.assert_array_equal(ds.actions[row], action)
        assert ds.rewards[row] == np.float32(reward)
        np.testing.assert_array_equal(ds.next_observations[row], next_obs.astype(np.float32))
        assert ds.terminals[row] == float(terminated)
        assert ds.timeouts[row] == float(truncated)
    assert ds.metadata["checksum"] == ds.metadata["stored_checksum"]
    assert ds.metadata["env_spec"] and '"max_episode_steps": 40' in ds.metadata["env_spec"]


def test_failed_write_leaves_no_dataset_behind(monkeypatch):
    import minari

    env = gym.make("InvertedPendulum-v5")
    episode = suite.rollout(env, lambda o: np.zeros(1), seed=0, max_steps=5)
    made = suite.MadeDataset([episode], env.spec, 0.0, 1.0, "d", "a")

    written = []

    def write_half_then_fail(dataset_id, *args, **kwargs):
        # where Minari would write: a folder with part of a dataset in it, then the disk fills
        folder = Path(os.environ["MINARI_DATASETS_PATH"]) / dataset_id / "data"
        folder.mkdir(parents=True)
        (folder / "main_data.hdf5").write_bytes(b"partial")
        written.append(folder)
        raise RuntimeError("disk full")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", write_half_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        suite.write_minari_dataset("test/broken-v0", made)
    monkeypatch.undo()
    assert written and not written[0].exists()  # the half-written folder went with the failed write
    assert not suite.local_path("test/broken-v0").exists()
    minari.list_local_datasets()  # a half-written folder would make this crash


# ----------------------------------------------------------------------------------- D4RL hdf5
def write_hdf5(path, **arrays):
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f[key] = value
    return str(path)


def d4rl_arrays(n=10, obs_dim=2):
    obs = np.arange(n, dtype=np.float32)[:, None].repeat(obs_dim, 1)
    terminals = np.zeros(n, bool)
    terminals[3] = True
    timeouts = np.zeros(n, bool)
    timeouts[6] = True
    return dict(observations=obs, actions=np.full((n, 1), 0.5, np.float32),
                rewards=np.arange(n, dtype=np.float32), terminals=terminals, timeouts=timeouts)


def test_d4rl_qlearning_semantics(tmp_path):
    """Rows 0..N-2, s' = obs[i+1], timeout rows dropped, terminals kept as done."""
    ds = load_dataset(write_hdf5(tmp_path / "hopper-test-v2.hdf5", **d4rl_arrays()))
    kept = [0, 1, 2, 3, 4, 5, 7, 8]
    assert ds.observations[:, 0].tolist() == kept
    assert ds.next_observations[:, 0].tolist() == [k + 1 for k in kept]
    assert ds.terminals.tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    # episode 2 ends before the dropped timeout row (cut: bootstrap); the file ends mid-episode 3.
    assert ds.timeouts.tolist() == [0, 0, 0, 0, 0, 1, 0, 1]
    assert ds.episode_starts.tolist() == [0, 4, 6]
    assert ds.metadata["env_id"] == "Hopper-v4"  # the v2 env's model and rewards (offrl.scores)
    assert ds.metadata["ref_min_score"] == pytest.approx(-20.272305)
    assert "D4RL" in ds.metadata["ref_source"]


def test_d4rl_references_only_for_d4rl_data_on_the_env_offrl_evaluates_it_on(tmp_path):
    """D4RL's table (returns in its v2 envs) gives a file's references only where the data is D4RL's by name
    and is evaluated on the env offrl maps it to: not data a file says was recorded in another env, and not
    under --data.env-id of another env (runs then report returns, and the warning says why)."""
    from offrl.data.sources import missing_reference_scores

    plain = write_hdf5(tmp_path / "hopper-medium-v2.hdf5", **d4rl_arrays())
    meta = load_dataset(plain).metadata
    assert meta["d4rl_env"] == "hopper" and meta["env_id"] == "Hopper-v4" and meta["ref_max_score"] == 3234.3
    assert load_dataset(plain, env_id="Hopper-v4").metadata["ref_max_score"] == 3234.3
    elsewhere = load_dataset(plain, env_id="Hopper-v5").metadata
    assert elsewhere["ref_min_score"] is None and elsewhere["ref_max_score"] is None and elsewhere["ref_source"] is None
    assert elsewhere["d4rl_env"] == "hopper"  # still D4RL's data
    assert "D4RL's table gives returns in its v2 envs" in missing_reference_scores(elsewhere)
    # a file recorded in Hopper-v5 (its own env_id) is not D4RL's data, whatever its name
    with h5py.File(write_hdf5(tmp_path / "hopper-medium-v5.hdf5", **d4rl_arrays()), "a") as f:
        f.attrs["env_id"] = "Hopper-v5"
    v5 = load_dataset(str(tmp_path / "hopper-medium-v5.hdf5")).metadata
    assert "d4rl_env" not in v5 and v5["ref_max_score"] is None and v5["env_id"] == "Hopper-v5"
    # an offrl export of v5 data with its own references, saved under a D4RL-like name
    exported = load_dataset(plain, env_id="Hopper-v5", ref_min_score=0.0, ref_max_score=2500.0)
    exported.metadata.pop("d4rl_env")
    exported.save_npz(str(tmp_path / "hopper-medium.npz"))
    loaded = load_dataset(str(tmp_path / "hopper-medium.npz")).metadata
    assert "d4rl_env" not in loaded and loaded["ref_max_score"] == 2500.0 and loaded["env_id"] == "Hopper-v5"
    # an npz of D4RL's data (no env id of its own) gets the table, and loses it under another env
    bare = load_dataset(plain)
    bare.metadata.update(env_id=None, ref_min_score=None, ref_max_score=None, ref_source=None)
    bare.metadata.pop("d4rl_env")
    bare.save_npz(str(tmp_path / "walker2d-medium-v2.npz"))
    assert load_dataset(str(tmp_path / "walker2d-medium-v2.npz")).metadata["ref_max_score"] == 4592.3
    assert load_dataset(str(tmp_path / "walker2d-medium-v2.npz"), env_id="Walker2d-v5").metadata["ref_max_score"] is None


@pytest.mark.parametrize("name,obs_dim,act_dim", [("hopper", 11, 3), ("halfcheetah", 17, 6), ("walker2d", 17, 6),
                                                   ("ant", 111, 8)])
def test_d4rl_files_evaluate_on_the_envs_d4rl_recorded(tmp_path, name, obs_dim, act_dim):
    """D4RL's locomotion files evaluate on Gymnasium's v4 envs (the v2 models and rewards): Walker2d's feet keep
    v2's frictions 0.9 and 1.9 (v5: both 1.9), and ant files' 111 numbers are Ant-v4's 27 and v2's 84 contact
    forces, zero under MuJoCo >= 2.0 (Ant-v5 observes 105). No 'out of date' warning reaches the user."""
    import warnings

    from offrl.data import check_env_compat
    from offrl.evaluation import make_env
    from world_models.termination import termination_fn

    n = 12
    arrays = dict(observations=np.zeros((n, obs_dim), np.float32), actions=np.zeros((n, act_dim), np.float32),
                  rewards=np.zeros(n, np.float32), terminals=np.zeros(n, bool), timeouts=np.zeros(n, bool))
    ds = load_dataset(write_hdf5(tmp_path / f"{name}-medium-v2.hdf5", **arrays))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        env = make_env(ds.metadata)
        done = termination_fn(ds.metadata["env_id"])
    check_env_compat(ds, env.observation_space, env.action_space)  # raises on a width mismatch
    assert env.spec.max_episode_steps == 1000 and "-v4" in ds.metadata["env_id"]
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        obs, _, terminated, _, _ = env.step(np.zeros(act_dim))
        # healthy states only (zero actions): termination on falls is tested in test_world_models
        assert done(torch.as_tensor(obs[None], dtype=torch.float32)).item() == terminated
    assert obs.shape == (obs_dim,)
    model = env.unwrapped.model
    if name == "walker2d":
        assert [model.geom("foot_geom").friction[0], model.geom("foot_left_geom").friction[0]] == [0.9, 1.9]
    if name == "ant":
        assert not obs[27:].any() and obs[:27].any()
    env.close()


def test_d4rl_uses_next_observations_when_present(tmp_path):
    arrays = d4rl_arrays()
    arrays["next_observations"] = arrays["observations"] + 0.5  # not equal to obs[i+1]: every row ends an episode
    ds = load_dataset(write_hdf5(tmp_path / "walker2d-x-v2.hdf5", **arrays), env_id="Walker2d-v5")
    assert ds.next_observations[:, 0].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 7.5, 8.5]
    assert ds.num_episodes == len(ds)
    assert "next_observations" not in ds.metadata


def test_dynamics_models_leave_out_terminal_rows_whose_next_state_is_the_next_row(tmp_path, monkeypatch):
    """Without next_observations a terminal row's s' is the next episode's first state: the Q-learners keep the
    row (their targets do not read s' there), a dynamics model learns from the other rows, in a cache entry of its
    own; with next_observations every row."""
    from world_models.train import model_rows

    ds = load_dataset(write_hdf5(tmp_path / "hopper-test-v2.hdf5", **d4rl_arrays()))
    assert ds.terminals.tolist() == [0, 0, 0, 1, 0, 0, 0, 0] and ds.next_observations[3, 0] == 4  # row 4 starts anew
    assert ds.metadata["next_observations"] == "next row"
    assert model_rows(ds).tolist() == [0, 1, 2, 4, 5, 6, 7]
    arrays = d4rl_arrays()
    arrays["next_observations"] = arrays["observations"] + 0.5
    with_next = load_dataset(write_hdf5(tmp_path / "walker2d-x-v2.hdf5", **arrays), env_id="Walker2d-v5")
    assert model_rows(with_next) == slice(None)
    from world_models import train as world_train
    from world_models.ensemble import EnsembleConfig

    folders = []
    monkeypatch.setattr(world_train, "_load_or_train",
                        lambda dataset, cfg, seed, device, folder, *rest: folders.append(folder))
    for dataset in (ds, with_next):
        world_train.load_or_train(dataset, EnsembleConfig(), cache_dir=tmp_path / "models", progress=False)
    assert folders[0].name.split("-")[-2] == "nonterminal" and "nonterminal" not in folders[1].name


def test_d4rl_without_timeouts_uses_the_episode_step_limit(tmp_path):
    arrays = d4rl_arrays()
    del arrays["timeouts"]
    arrays["terminals"][:] = False
    with h5py.File(tmp_path / "x.hdf5", "w") as f:
        for k, v in arrays.items():
            f[k] = v
    from offrl.data.sources import load_d4rl_hdf5

    ds = load_d4rl_hdf5(tmp_path / "x.hdf5", env_id="Hopper-v5", max_episode_steps=4)
    # steps 3 and 7 are each episode's 4th step: dropped as timeouts
    assert ds.observations[:, 0].tolist() == [0, 1, 2, 4, 5, 6, 8]
    assert ds.episode_starts.tolist() == [0, 3, 6]


def test_d4rl_without_timeouts_counts_steps_as_d4rl_after_a_terminal(tmp_path):
    """d4rl.qlearning_dataset resets its step counter at a terminal and then increments it like any
    kept row, so the row after a terminal is step 1: with a limit of 4 steps and a terminal at row 2,
    rows 5 and 9 are the dropped final rows (not 6 and 10)."""
    from offrl.data.sources import load_d4rl_hdf5

    arrays = d4rl_arrays(n=12)
    del arrays["timeouts"]
    arrays["terminals"][:] = False
    arrays["terminals"][2] = True
    ds = load_d4rl_hdf5(Path(write_hdf5(tmp_path / "x.hdf5", **arrays)), env_id="Hopper-v5", max_episode_steps=4)
    assert ds.observations[:, 0].tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 10]
    assert ds.terminals.tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert ds.episode_starts.tolist() == [0, 3, 5, 8]


def test_d4rl_rows_as_recorded_for_sequence_models(tmp_path):
    """With d4rl_trajectories every row stays (the final row of each episode too), as DT and RvS read
    D4RL files; DT and RCSL default to it."""
    from algos import dt, rcsl

    path = write_hdf5(tmp_path / "hopper-test-v2.hdf5", **d4rl_arrays())
    ds = load_dataset(path, d4rl_trajectories=True)
    assert ds.observations[:, 0].tolist() == list(range(10))
    assert ds.episode_starts.tolist() == [0, 4, 7]
    assert ds.terminals.tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert ds.timeouts.tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0, 1]  # the timeout row, and the file's unfinished end
    assert ds.rewards.tolist() == list(range(10))
    # s' is obs[i+1] inside an episode; an episode's last s' is not in a file without next_observations
    assert ds.next_observations[:, 0].tolist() == [1, 2, 3, 3, 5, 6, 6, 8, 9, 9]
    assert dt.Config().data.d4rl_trajectories and rcsl.Config().data.d4rl_trajectories
    assert not load_dataset(path).metadata.get("rows")  # others keep qlearning_dataset's transitions


def test_recorded_d4rl_trajectories_without_next_states_are_refused_where_s_prime_is_read(tmp_path):
    """Each episode's last row has s' = s there: a Q-learner's buffer refuses it (it would bootstrap Q(s) from
    V(s) on time-out rows), BC's does not, and a dynamics model leaves those rows out."""
    from offrl.data import TrainingData, preprocess
    from world_models.train import model_rows

    ds = load_dataset(write_hdf5(tmp_path / "hopper-test-v2.hdf5", **d4rl_arrays()), d4rl_trajectories=True)
    data = TrainingData(ds, preprocess.Preprocessing(), 2, 1, -np.ones(1, np.float32), np.ones(1, np.float32))
    with pytest.raises(DatasetError, match="drop --data.d4rl-trajectories"):
        data.buffer("cpu", seed=0)
    from world_models.rollout import ModelData

    with pytest.raises(DatasetError, match="drop --data.d4rl-trajectories"):
        ModelData.check_raw(data, "mopo")  # before its dynamics model trains
    assert len(data.buffer("cpu", seed=0, reads_next_observations=False)) == 10
    assert model_rows(ds).tolist() == [0, 1, 2, 4, 5, 7, 8]  # not the last rows 3, 6 and 9 of the episodes
    arrays = d4rl_arrays()
    arrays["next_observations"] = arrays["observations"] + 0.5  # recorded: every s' is known
    known = load_dataset(write_hdf5(tmp_path / "walker2d-x-v2.hdf5", **arrays), env_id="Walker2d-v5",
                         d4rl_trajectories=True)
    known_data = TrainingData(known, preprocess.Preprocessing(), 2, 1, -np.ones(1, np.float32), np.ones(1, np.float32))
    assert len(known_data.buffer("cpu", seed=0)) == 10 and model_rows(known) == slice(None)


# ----------------------------------------------------------------------------------- npz format
def small_dataset(n=12):
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    terminals = np.zeros(n, np.float32)
    terminals[4] = 1
    timeouts = np.zeros(n, np.float32)
    timeouts[[8, n - 1]] = 1
    return Dataset(obs, rng.uniform(-1, 1, (n, 2)).astype(np.float32), np.arange(n, dtype=np.float32),
                   rng.normal(size=(n, 3)).astype(np.float32), terminals, timeouts,
                   np.array([0, 5, 9]), {"name": "small", "env_id": "Swimmer-v5"}).validate()


def test_npz_round_trip(tmp_path):
    ds = small_dataset()
    ds.save_npz(tmp_path / "small.npz")
    back = load_dataset(str(tmp_path / "small.npz"))
    for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts", "episode_starts"):
        np.testing.assert_array_equal(getattr(back, key), getattr(ds, key))
    assert back.checksum() == ds.checksum()
    assert back.metadata["env_id"] == "Swimmer-v5"


def test_episode_returns_and_selection():
    ds = small_dataset()
    assert ds.episode_returns().tolist() == [0 + 1 + 2 + 3 + 4, 5 + 6 + 7 + 8, 9 + 10 + 11]
    assert ds.episode_returns(0.5)[1] == pytest.approx(5 + 0.5 * 6 + 0.25 * 7 + 0.125 * 8)
    best = preprocess.top_trajectories(ds, frac=0.34)  # 1 of 3 episodes
    assert best.rewards.tolist() == [9, 10, 11] and best.episode_starts.tolist() == [0]
    two = preprocess.top_trajectories(ds, frac=0.67)
    assert two.rewards.tolist() == [5, 6, 7, 8, 9, 10, 11] and two.episode_starts.tolist() == [0, 4]


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("change, field, words", [
    (lambda a: a["rewards"].__setitem__(7, np.nan), "rewards", "NaN"),
    (lambda a: a["observations"].__setitem__((2, 1), np.inf), "observations", "inf"),
    (lambda a: a.pop("actions"), "actions", "missing key"),
    (lambda a: a.__setitem__("terminals", a["terminals"][:-2]), "terminals", "length 8"),
    (lambda a: a.__setitem__("observations", np.zeros((10, 2, 2), np.float32)), "observations", "shape"),
])
def test_bad_hdf5_is_refused_naming_field_and_problem(tmp_path, change, field, words):
    arrays = d4rl_arrays()
    change(arrays)
    path = write_hdf5(tmp_path / "hopper-bad-v2.hdf5", **arrays)
    with pytest.raises(DatasetError) as err:
        load_dataset(path)
    assert err.value.field == field and words in str(err.value)


def test_unreadable_and_missing_files(tmp_path):
    (tmp_path / "junk.hdf5").write_bytes(b"\x00not hdf5")
    (tmp_path / "junk.npz").write_bytes(b"\x00not a zip")
    for name, words in [("junk.hdf5", "cannot read"), ("junk.npz", "cannot read"), ("absent.hdf5", "not found")]:
        with pytest.raises(DatasetError, match=words):
            load_dataset(str(tmp_path / name))
    with pytest.raises(DatasetError, match="no local Minari dataset"):
        load_dataset("nobody/nothing-v0")


def test_npz_missing_key_and_misplaced_terminal(tmp_path):
    ds = small_dataset()
    arrays = {k: getattr(ds, k) for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
    np.savez(tmp_path / "nonext.npz", **arrays)
    with pytest.raises(DatasetError, match="next_observations"):
        load_dataset(str(tmp_path / "nonext.npz"))
    bad = ds.replace(terminals=np.eye(1, len(ds), 1, dtype=np.float32)[0])  # terminal on row 1, mid-episode
    with pytest.raises(DatasetError, match="terminals"):
        bad.validate()
    # a file that is no archive at all is said to be that, a pickle to be a pickle (numpy takes both for pickles)
    import pickle

    (tmp_path / "text.npz").write_text("observations,actions\n")
    with pytest.raises(DatasetError, match="not an .npz archive"):
        load_dataset(str(tmp_path / "text.npz"))
    (tmp_path / "pickled.npz").write_bytes(pickle.dumps(arrays))
    with pytest.raises(DatasetError, match="it is a pickle"):
        load_dataset(str(tmp_path / "pickled.npz"))


def test_dims_that_do_not_match_the_env(tmp_path):
    from offrl.config import DataConfig
    from offrl.data import load_for_training

    arrays = d4rl_arrays(obs_dim=5)  # Hopper-v4 (a D4RL hopper file's evaluation env) observes 11 numbers
    path = write_hdf5(tmp_path / "hopper-narrow-v2.hdf5", **arrays)
    with pytest.raises(DatasetError, match=r"observation width 5 does not match env Hopper-v4"):
        load_for_training(path, DataConfig())


def test_cli_refuses_bad_files_in_one_line(tmp_path):
    arrays = d4rl_arrays()
    arrays["rewards"][3] = np.nan
    nan_path = write_hdf5(tmp_path / "hopper-nan-v2.hdf5", **arrays)
    arrays = d4rl_arrays()
    del arrays["actions"]
    noact_path = write_hdf5(tmp_path / "hopper-noact-v2.hdf5", **arrays)
    for path, words in [(nan_path, "'rewards'"), (noact_path, "'actions': missing key")]:
        for cmd in (["offrl", "datasets", "validate", path],
                    [PYTHON, "-m", "algos.td3_bc", "--dataset", path, "--run.out-dir", str(tmp_path / "runs")]):
            result = run_cli(*cmd, check=False)
            assert result.returncode == 1
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.stderr
            assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # a refused dataset leaves no half-made run behind


# --------------------------------------------------------------------------------- preprocessing
def test_state_normalization_and_reward_options():
    from offrl.config import DataConfig

    ds = small_dataset()
    mean, std = preprocess.state_stats(ds.observations, eps=1e-3)
    np.testing.assert_allclose(mean, ds.observations.mean(0), rtol=1e-6)
    np.testing.assert_allclose(std, ds.observations.std(0) + 1e-3, rtol=1e-6)
    out, pre = preprocess.apply(ds, DataConfig(normalize_states=True, normalize_reward=True, reward_scale=2.0, reward_bias=-1.0))
    # episode returns 10, 26, 30 -> factor 1000 / (30 - 10) = 50; then * 2 - 1
    assert pre.reward_scale == pytest.approx(100.0)
    np.testing.assert_allclose(out.rewards, ds.rewards * 100.0 - 1.0)
    np.testing.assert_allclose(out.observations, (ds.observations - mean) / std, rtol=1e-6)
    np.testing.assert_allclose(out.next_observations, (ds.next_observations - mean) / std, rtol=1e-6)
    normalizer = pre.state_normalizer("cpu")
    np.testing.assert_allclose(normalizer(torch.as_tensor(ds.observations)).numpy(), out.observations, rtol=1e-6)


def test_return_range_leaves_out_episodes_the_data_cut_short():
    """Episodes: 0-4 terminated (return 10), 5-8 cut after 4 rows (26), 9-11 cut after 3 rows (30). With a step
    limit of 5 the second reached it (4 rows: D4RL's Q-learning form drops the time-out row) and the third is
    a piece the data cut: the range is 26 - 10. Without the limit, or when every truncated episode is a piece,
    each episode counts."""
    ds = small_dataset()
    assert preprocess.return_range_factor(ds) == pytest.approx(1000 / 20)
    assert preprocess.return_range_factor(ds, max_episode_steps=5) == pytest.approx(1000 / 16)
    assert preprocess.return_range_factor(ds, max_episode_steps=4) == pytest.approx(1000 / 20)  # all reached it
    only_pieces = ds.replace(terminals=np.zeros(12, np.float32))
    assert preprocess.return_range_factor(only_pieces, max_episode_steps=100) == pytest.approx(1000 / 20)


def test_action_clipping():
    ds = small_dataset().replace(actions=np.array([[-5.0, 0.3]] * 12, np.float32))
    clipped = preprocess.clip_actions(ds, np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    assert clipped.actions[0].tolist() == pytest.approx([-1 + 1e-5, 0.3])


# ----------------------------------------------------------------------------------------- buffer
def test_buffer_sampling_is_seeded_and_returns_real_rows():
    ds = small_dataset()
    a, b = ReplayBuffer.from_dataset(ds, seed=7), ReplayBuffer.from_dataset(ds, seed=7)
    x, y = a.sample(64), b.sample(64)
    for u, v in zip(x, y):
        torch.testing.assert_close(u, v)
    rows = {tuple(r) for r in np.concatenate([ds.observations, ds.actions, ds.rewards[:, None]], 1).tolist()}
    got = torch.cat([x.observations, x.actions, x.rewards[:, None]], 1).tolist()
    assert all(tuple(r) in rows for r in got)
    saved = a.state_dict()
    first = a.sample(8).rewards
    a.load_state_dict(saved)
    torch.testing.assert_close(a.sample(8).rewards, first)


def test_buffer_ring_overwrites_oldest():
    buffer = ReplayBuffer(obs_dim=1, act_dim=1, capacity=4)
    for start in (0, 3):
        n = 3
        buffer.add(np.arange(start, start + n)[:, None], np.zeros((n, 1)), np.arange(start, start + n),
                   np.zeros((n, 1)), np.zeros(n))
    assert len(buffer) == 4
    assert sorted(buffer.storage[:, 0].tolist()) == [2, 3, 4, 5]


def test_a_full_ring_restored_into_a_larger_buffer_keeps_its_order():
    """SAC sizes its buffer by --steps; a run resumed with more steps restores a full, wrapped ring into a
    larger buffer: the next write must land after the newest row, not over the oldest."""
    def add(buffer, values):
        n = len(values)
        buffer.add(np.array(values)[:, None], np.zeros((n, 1)), np.array(values), np.zeros((n, 1)), np.zeros(n))

    small = ReplayBuffer(obs_dim=1, act_dim=1, capacity=4)
    add(small, [0, 1, 2, 3, 4, 5])  # wrapped: rows hold 4 5 2 3, the next write would go to row 2
    large = ReplayBuffer(obs_dim=1, act_dim=1, capacity=8)
    large.load_state_dict(small.state_dict())
    add(large, [6, 7])
    assert len(large) == 6 and large.storage[:6, 0].tolist() == [2, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="more than this buffer's capacity"):
        ReplayBuffer(obs_dim=1, act_dim=1, capacity=2).load_state_dict(small.state_dict())


def test_buffer_rows_from_host_arrays_equal_rows_from_tensors():
    """Host data goes to the device in one copy (one sync per online env step on CUDA, not five): the same float32
    rows as from tensors, float64 and bool inputs included."""
    from offrl.data.buffer import ReplayBuffer

    rng = np.random.default_rng(0)
    fields = (rng.normal(size=(7, 3)), rng.normal(size=(7, 2)).astype(np.float32), rng.normal(size=7) * 1e3,
              rng.normal(size=(7, 3)), rng.random(7) < 0.5)
    from_host, from_tensors = ReplayBuffer(3, 2, 10, "cpu"), ReplayBuffer(3, 2, 10, "cpu")
    from_host.add(*fields)
    from_tensors.add(*(torch.as_tensor(x).to(torch.float32) for x in fields))
    assert torch.equal(from_host.storage, from_tensors.storage) and len(from_host) == 7


def test_corruption_comes_before_the_episode_selection_and_a_field_never_read_is_refused(tiny, tmp_path):
    """%BC ranks episodes by the (corrupted) returns it is given, and sees the corrupted rows every other algorithm
    on that dataset and corruption seed sees; corrupting a field an algorithm never reads is refused up front."""
    import algos.bc as bc
    import algos.dt as dt
    import algos.rcsl as rcsl
    from offrl.config import DataConfig
    from offrl.data import load_dataset, load_for_training
    from offrl.errors import OffrlError

    given = []
    data = load_for_training(tiny, DataConfig(corrupt="rewards", corruption_rate=0.5), seed=0,
                             select=lambda d: given.append(d) or d)
    assert not np.array_equal(given[0].rewards, load_dataset(tiny).rewards)
    np.testing.assert_array_equal(given[0].rewards, data.dataset.rewards)
    top_half = load_for_training(tiny, DataConfig(corrupt="rewards", corruption_rate=0.5), seed=0,
                                 select=bc.selection(bc.Config(dataset=tiny, frac=0.5)))
    np.testing.assert_array_equal(top_half.corruption.rows, data.corruption.rows)  # the same rows hit as without --frac
    assert len(top_half.dataset) < len(data.dataset)
    bc.check_data(bc.Config(dataset=tiny, frac=0.1, data=DataConfig(corrupt="rewards")))  # %BC reads returns
    # and so do return weights
    bc.check_data(bc.Config(dataset=tiny, data=DataConfig(corrupt="rewards", sampling="return-weighted")))
    for module, options, field in ((bc, {}, "rewards"), (bc, {"frac": 0.1}, "next_observations"),
                                   (dt, {}, "next_observations"), (rcsl, {}, "next_observations")):
        cfg = module.Config(dataset=tiny, data=DataConfig(corrupt=field), **options)
        cfg.run.out_dir = str(tmp_path / "runs")
        with pytest.raises(OffrlError, match=f"--data.corrupt {field}: .* never reads {field}"):
            module.train(cfg)
    # the state statistics read s' with --data.normalize-states --data.state-stats-with-next
    bc.check_data(bc.Config(dataset=tiny, data=DataConfig(corrupt="next_observations", normalize_states=True,
                                                          state_stats_with_next=True)))
    assert not (tmp_path / "runs").exists()


def test_data_options_given_without_the_option_they_act_under_are_refused(tiny, tmp_path):
    """--data.corruption-* / --data.attack-* without --data.corrupt, an attack critic for a corruption that runs
    none, a return temperature under uniform sampling: refused before anything loads (the run would record them
    as applied)."""
    from offrl.config import DataConfig
    from offrl.data import load_for_training
    from offrl.errors import OffrlError

    for options, message in (
            ({"corruption_rate": 0.1, "corruption_mode": "adversarial"},
             "--data.corruption-mode, --data.corruption-rate without --data.corrupt <field>: nothing would be corrupted"),
            ({"attack_device": "cuda"}, "--data.attack-device without --data.corrupt"),
            ({"corrupt": "actions", "attack_critic": "x.pt"},
             "--data.attack-critic: only the adversarial corruption .* \\(this run: random corruption of actions\\)"),
            ({"corrupt": "rewards", "corruption_mode": "adversarial", "attack_critic": "x.pt"},
             "adversarial corruption of rewards"),
            ({"return_temperature": 0.5}, "--data.return-temperature without --data.sampling return-weighted")):
        with pytest.raises(OffrlError, match=message):
            load_for_training(str(tmp_path / "not-even-there.npz"), DataConfig(**options))
    # a saved run rebuilt for evaluation (offrl eval) loads its data whatever its config holds
    from offrl.data import load_dataset

    data = load_for_training(tiny, DataConfig(corruption_rate=0.1), check_options=False)
    assert data.dataset.checksum() == load_dataset(tiny).checksum()
