"""Online SAC smoke test and the weights-only policy files it writes."""

import json

import numpy as np
import pytest
import torch

from offrl import policies
from offrl.errors import CheckpointError
from offrl.nets import DeterministicActor, GaussianActor, TanhGaussianActor

from conftest import PYTHON, assert_reevaluation_reproduces, run_cli, tiny_model


def test_sac_trains_and_saves_actor_snapshots(tmp_path):
    run_cli(PYTHON, "-m", "algos.sac", "--env-id", "InvertedPendulum-v5", "--steps", "600", "--learning-starts", "200",
            "--actor-every", "200", "--eval.every", "300", "--eval.episodes", "2", "--log.every", "100",
            "--log.wandb", "disabled", "--hidden", "64", "64", "--run.out-dir", str(tmp_path))
    (run_dir,) = tmp_path.glob("sac/InvertedPendulum-v5/*")
    actors = sorted(p.name for p in (run_dir / "actors").iterdir())
    assert actors == ["actor_0000200.pt", "actor_0000400.pt", "actor_0000600.pt"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("train/episode_return" in r for r in rows)
    assert any("alpha" in r and "critic_loss" in r for r in rows)
    policy = policies.load_policy(run_dir / "actors" / "actor_0000600.pt")
    assert policy.kind == "tanh_gaussian" and policy.step == 600 and policy.env_id == "InvertedPendulum-v5"
    assert policy.act(np.zeros((3, 4))).shape == (3, 1)
    assert_reevaluation_reproduces(run_dir)


@pytest.mark.parametrize("cls, kind", [(TanhGaussianActor, "tanh_gaussian"), (DeterministicActor, "deterministic"),
                                       (GaussianActor, "gaussian")])
def test_policy_file_round_trip(tmp_path, cls, kind):
    torch.manual_seed(0)
    actor = cls(5, 2, [-2.0, -1.0], [2.0, 1.0], (16, 16))
    mean, std = np.arange(5, dtype=np.float32), np.full(5, 2.0, np.float32)
    policies.save_actor(tmp_path / "a.pt", actor, env_id="X-v0", step=7, hidden=(16, 16), obs_mean=mean, obs_std=std)
    policy = policies.load_policy(tmp_path / "a.pt")
    assert policy.kind == kind
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    expected = actor.act(torch.as_tensor((obs - mean) / std)).numpy()
    np.testing.assert_allclose(policy.act(obs), expected, rtol=1e-6)
    sampled = [policy.act(obs, deterministic=False, generator=torch.Generator().manual_seed(seed)) for seed in (3, 3, 4)]
    np.testing.assert_array_equal(sampled[0], sampled[1])  # one seed, one draw
    assert (np.abs(sampled[0]) <= [2.0, 1.0]).all()
    if kind == "deterministic":  # no noise to draw: its actions are its mode's
        np.testing.assert_array_equal(sampled[0], policy.act(obs))
        np.testing.assert_array_equal(sampled[0], sampled[2])
    else:  # drawn around the mode, by the generator
        assert not np.allclose(sampled[0], policy.act(obs)) and not np.allclose(sampled[0], sampled[2])


def test_a_file_that_is_not_a_policy_is_refused(tmp_path):
    torch.save({"step": 1}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="not an offrl-actor-v1 policy file"):
        policies.load_policy(tmp_path / "x.pt")


def test_every_algorithm_built_on_the_sac_agent_loads_as_a_tanh_gaussian_policy():
    """`datasets make --policy` and the attack critic take a training checkpoint of every algorithm whose agent is
    offrl.sac.SACAgent (MOPO's, MOBILE's, RAVL's and WSRL's were refused as 'cannot load as a policy')."""
    import importlib
    import pkgutil

    import algos
    from offrl.sac import SACAgent

    built_on_sac = sorted(name for _, name, _ in pkgutil.iter_modules(algos.__path__)
                          if issubclass(getattr(importlib.import_module(f"algos.{name}"), "Agent", object), SACAgent))
    assert built_on_sac == ["mobile", "mopo", "ravl", "sac", "wsrl"]
    assert {name: policies.RUN_CHECKPOINT_KINDS.get(name) for name in built_on_sac} == dict.fromkeys(built_on_sac, "tanh_gaussian")


@pytest.mark.parametrize("algo, options, kind", [
    ("iql", ["--actor-dropout", "0.1"], "gaussian"),
    ("iql", ["--actor", "deterministic", "--actor-dropout", "0.1"], "deterministic"),
    ("cql", ["--actor-layer-norm", "--n-actions", "2"], "tanh_gaussian"),
    ("mopo", [*tiny_model(max_epochs=1), "--rollout-every", "10", "--rollout-batch", "50"], "tanh_gaussian")])
def test_training_checkpoints_of_actors_with_dropout_or_layer_norm_load_as_policies(tiny, tmp_path, monkeypatch, algo,
                                                                                   options, kind):
    """IQL's --actor-dropout shifts its layers' names and CQL's --actor-layer-norm adds weights: the actor was rebuilt
    without them and refused ('does not fit this config'), for `datasets make --policy` and the attack critic too.
    A model-based run's checkpoint (its dynamics model and buffers beside the agent) loads its actor too."""
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    run_cli(PYTHON, "-m", f"algos.{algo}", "--dataset", tiny, "--steps", "20", "--eval.every", "0", "--eval.episodes", "2",
            "--log.wandb", "disabled", "--hidden", "16", "16", "--run.out-dir", str(tmp_path), *options)
    (checkpoint,) = tmp_path.glob(f"{algo}/*/*/checkpoints/last.pt")
    policy = policies.load_policy(checkpoint)
    assert policy.kind == kind and policy.act(np.zeros((3, 4))).shape == (3, 1)
    # the run's own agent, rebuilt as `offrl eval` rebuilds it, acts alike
    from offrl.eval_run import load_saved_run

    _, _, agent, *_ = load_saved_run(checkpoint, device="cpu")
    agent.actor.eval()  # as evaluation runs it: no dropout
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(policy.act(obs), agent.act(torch.as_tensor(obs)).numpy(), rtol=1e-6, atol=1e-7)
    saved = policies.save_actor(tmp_path / "a.pt", policy.actor, env_id="X-v0", step=20, hidden=(16, 16))
    again = policies.load_policy(saved)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(again.act(obs), policy.actor.act(torch.as_tensor(obs)).numpy())
