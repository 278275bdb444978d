"""Normalized scores and vectorized evaluation."""

import numpy as np
import pytest
import torch

from offrl import scores
from offrl.data import load_dataset
from offrl.data.suite import TINY_GAINS
from offrl.errors import OffrlError
from offrl.evaluation import evaluate, make_env


def test_normalized_score():
    assert scores.normalized_score([3234.3], -20.272305, 3234.3)[0] == pytest.approx(100.0)
    assert scores.normalized_score([-20.272305], -20.272305, 3234.3)[0] == pytest.approx(0.0)
    assert scores.normalized_score([50.0, 150.0], 0.0, 200.0).tolist() == [25.0, 75.0]
    assert scores.normalized_score([1.0], None, 2.0) is None
    with pytest.raises(ValueError):
        scores.normalized_score([1.0], 2.0, 2.0)
    assert scores.d4rl_env_from_name("halfcheetah-medium-replay-v2") == "halfcheetah"
    assert scores.d4rl_env_from_name("my-data") is None
    assert scores.d4rl_env_from_name("hopper_medium-v2") == "hopper"
    # a Gymnasium env id (a user file's --data.env-id) and an antmaze file's URL name are not D4RL locomotion data
    assert scores.d4rl_env_from_name("Hopper-v5") is None and scores.d4rl_env_from_name("Walker2d-v4") is None
    assert scores.d4rl_env_from_name("Ant_maze_u-maze_noisy_multistart_False_multigoal_False_sparse_fixed") is None
    assert scores.d4rl_env_from_name("antmaze-umaze-v2") is None and scores.d4rl_env_from_name("ant-medium-v2") == "ant"


def manual_returns(metadata, policy, seeds):
    env = make_env(metadata)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy(obs))
            total += r
            done = term or trunc
        out.append(total)
    return np.array(out)


def test_vector_evaluation_matches_single_env_rollouts(tiny):
    meta = load_dataset(tiny).metadata
    gains = torch.tensor(TINY_GAINS * 0.6, dtype=torch.float32)  # a weaker controller: returns vary by seed

    def policy(obs):
        return (obs @ gains).clamp(-3, 3).unsqueeze(-1)

    result = evaluate(policy, meta, episodes=6, seed=11)
    expected = manual_returns(meta, lambda o: np.clip(np.array([o @ (TINY_GAINS * 0.6)]), -3, 3).astype(np.float32),
                              range(11, 17))
    np.testing.assert_allclose(result.returns, expected, rtol=1e-5)
    np.testing.assert_allclose(result.normalized, 100 * (expected - meta["ref_min_score"]) /
                               (meta["ref_max_score"] - meta["ref_min_score"]), rtol=1e-5)
    assert result.lengths.max() <= 200
    summary = result.summary()
    assert summary["eval/normalized_score"] == pytest.approx(result.normalized.mean())


def test_evaluation_refuses_non_finite_actions(tiny):
    """InvertedPendulum scores a NaN action like any other (+1 a step until it falls): a policy gone NaN would
    get a finite, plausible score."""
    meta = load_dataset(tiny).metadata
    gains = torch.tensor(TINY_GAINS, dtype=torch.float32)

    def policy(obs):  # episode 2 goes NaN at its 5th step
        actions = (obs @ gains).clamp(-3, 3).unsqueeze(-1)
        policy.steps += 1
        if policy.steps >= 5:
            actions[2] = float("nan")
        return actions

    policy.steps = 0
    with pytest.raises(OffrlError, match=r"not finite \(NaN/inf\) in evaluation episodes \[2\] at step 4"):
        evaluate(policy, meta, episodes=3, seed=0)


class RecordingPolicy:
    """Wraps a policy and keeps every batch of actions it returned."""

    def __init__(self, policy):
        self.policy, self.actions = policy, []

    def __call__(self, obs):
        action = self.policy(obs)
        self.actions.append(action.clone())
        return action


def test_evaluation_runs_dropout_actors_in_eval_mode_and_restores_training(tiny):
    from algos.iql import IQL, Config
    from offrl.data import load_for_training

    cfg = Config(dataset=tiny, actor_dropout=0.5, hidden=(32, 32))
    data = load_for_training(tiny, cfg.data)
    torch.manual_seed(0)
    agent = IQL(cfg, data, torch.device("cpu"))
    agent.value.eval()  # a module someone left in eval mode keeps it
    obs = torch.randn(8, data.obs_dim)
    assert not torch.equal(agent.act(obs), agent.act(obs))  # training mode: dropout is on
    first, second = RecordingPolicy(agent.act), RecordingPolicy(agent.act)
    a = evaluate(first, data.metadata, episodes=3, seed=0)
    b = evaluate(second, data.metadata, episodes=3, seed=0)
    assert len(first.actions) == len(second.actions)
    for x, y in zip(first.actions, second.actions):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    np.testing.assert_array_equal(a.returns, b.returns)
    assert agent.actor.training and all(m.training for m in agent.actor.modules())
    assert not agent.value.training


def test_reachable_modules_follow_methods_closures_and_attributes():
    from offrl.evaluation import reachable_modules

    inner, outer = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

    class Holder:
        def __init__(self):
            self.nets = {"a": inner}

        def act(self, x):
            return x

    holder = Holder()
    assert reachable_modules(holder.act) == [inner]
    assert reachable_modules(lambda x: outer(holder.act(x))) in ([outer, inner], [inner, outer])
    seq = torch.nn.Sequential(inner)
    assert reachable_modules(seq) == [seq]  # a module is listed itself, not its children
