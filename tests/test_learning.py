"""Learning tests: each algorithm does what it claims on a task built to need it, kept fast (RCSL's and the world
models' are in test_return_conditioned.py and test_world_models.py).

The value-based ones get a two-action bandit: one-step episodes from 8 states, every state tried with action +0.8
(reward 1) and with -0.8 (reward 0), in equal numbers. Behaviour cloning can only average the two behaviours (about
0); an offline RL algorithm must pick the rewarding one from the same data. CQL must also keep its critic's values
of actions the data never took below those it took; RIQL must keep the rewarded behaviour when a fifth of the
other's rewards are corrupted, where IQL follows them. The Decision Transformer gets episodes of the two behaviours
and must act as the one whose return it is asked for."""

import numpy as np
import pytest
import torch

from offrl.data import Dataset, load_for_training

from conftest import two_behaviours

GOOD, BAD = 0.8, -0.8
ENV = "offrl_test_envs:OffrlPointMass-v0"  # obs 2, action 1 in [-1, 1]: the shapes the bandit's data have


def two_action_bandit(folder, corrupted: float | None = None):
    """The bandit's data as an .npz (with `corrupted`, every 5th row of the unrewarded action gets that reward
    instead of 0), and its 8 states."""
    rng = np.random.default_rng(0)
    states = rng.normal(size=(8, 2)).astype(np.float32)
    per_action = 64
    obs = np.repeat(states, 2 * per_action, axis=0)
    actions = np.tile(np.repeat([GOOD, BAD], per_action), 8).astype(np.float32)[:, None]
    rewards = (actions[:, 0] == GOOD).astype(np.float32)
    if corrupted is not None:
        rewards[np.flatnonzero(actions[:, 0] == BAD)[::5]] = corrupted
    n = len(obs)
    ones, zeros = np.ones(n, np.float32), np.zeros(n, np.float32)
    path = folder / ("two-actions.npz" if corrupted is None else "two-actions-corrupted.npz")
    Dataset(obs, actions, rewards, obs, ones, zeros, np.arange(n), {"name": path.stem, "env_id": ENV}).validate() \
        .save_npz(str(path))
    return str(path), torch.as_tensor(states)


@pytest.fixture(scope="module")
def bandit(tmp_path_factory):
    return two_action_bandit(tmp_path_factory.mktemp("bandit"))


def train(module, bandit, steps, **options):
    """An agent of `module` trained `steps` updates on the bandit, as its train() would (no run folder)."""
    import importlib

    algo = importlib.import_module(f"algos.{module}")
    path, _ = bandit
    cfg = algo.Config(dataset=path, **options)
    cfg.data.env_id = ENV
    data = load_for_training(path, cfg.data, seed=0)
    torch.manual_seed(0)
    agent = {"bc": "BC", "td3_bc": "TD3BC", "iql": "IQL", "cql": "CQL", "riql": "RIQL"}[module]
    agent = getattr(algo, agent)(cfg, data, torch.device("cpu"))
    buffer = data.buffer("cpu", seed=0)
    for _ in range(steps):
        agent.update(buffer.sample(cfg.batch_size))
    return agent


def test_bc_averages_the_two_behaviours(bandit):
    untrained = train("bc", bandit, 0, hidden=(64, 64), batch_size=256).act(bandit[1])
    assert untrained.abs().max() > 0.2  # the initial network does not already act about 0 everywhere
    actions = train("bc", bandit, 600, hidden=(64, 64), batch_size=256).act(bandit[1])
    assert actions.abs().max() < 0.08, actions  # 0.03 on this CPU; the untrained network's reach 0.28


@pytest.mark.parametrize("module", ["td3_bc", "iql", "riql"])
def test_offline_rl_picks_the_rewarding_behaviour(bandit, module):
    agent = train(module, bandit, 800, hidden=(64, 64), batch_size=64)
    actions = agent.act(bandit[1])
    assert (actions > 0.5).all(), actions
    if module == "iql":  # in-sample: advantage-weighted regression onto the data's actions, the good one's weight e^3
        assert (actions - GOOD).abs().max() < 0.05, actions


def test_cql_pushes_down_the_values_of_actions_the_data_never_took(bandit):
    """Without its penalty the critic interpolates between the two data actions (Q(0) about halfway between their
    rewards); with it, an action the data never took is valued far below even the unrewarded one."""
    states = bandit[1]

    def q(agent, action):
        with torch.no_grad():
            return agent.critic(states, torch.full((len(states), 1), action)).mean().item()

    plain = train("cql", bandit, 800, hidden=(64, 64), batch_size=64, n_actions=4, cql_alpha=0.0)
    assert q(plain, BAD) + 0.2 < q(plain, 0.0) < q(plain, GOOD) - 0.2
    conservative = train("cql", bandit, 800, hidden=(64, 64), batch_size=64, n_actions=4)
    assert q(conservative, 0.0) < q(conservative, BAD) - 2.0
    assert q(conservative, BAD) + 0.2 < q(conservative, GOOD)  # the data's two actions still in reward order


def test_dt_acts_as_the_behaviour_whose_return_it_is_asked_for(tmp_path):
    """Episodes of return 10 took +0.8 at every step (reward 1 each), episodes of return 0 took -0.8, from the
    same random states: asked for return 10 the Decision Transformer acts +0.8 along the episode (its
    return-to-go falling by the rewards received), asked for 0 it acts -0.8."""
    from algos.dt import DT, Config, ReturnConditionedActor
    from offrl.data.sequences import SequenceBuffer

    rng = np.random.default_rng(0)
    path = str(tmp_path / "two-behaviours.npz")
    two_behaviours(rng, 2, {"name": "two-behaviours", "env_id": ENV}, action=GOOD).save_npz(path)
    cfg = Config(dataset=path, context=5, embed_dim=32, batch_size=16, warmup_steps=10, rtg_scale=1.0)
    cfg.data.env_id = ENV
    data = load_for_training(path, cfg.data)
    torch.manual_seed(0)
    agent = DT(cfg, data, torch.device("cpu"))
    buffer = SequenceBuffer(data.dataset, cfg.context, "cpu", seed=0, rtg_scale=cfg.rtg_scale,
                            max_timestep=cfg.max_timestep)
    for _ in range(600):
        agent.update(buffer.sample(cfg.batch_size))
    states = torch.as_tensor(rng.normal(size=(50, 2)).astype(np.float32))
    for target, reward, action in ((10.0, 1.0, GOOD), (0.0, 0.0, BAD)):
        actor = ReturnConditionedActor(agent, target)
        actor.reset(len(states))
        for _ in range(4):
            actions = actor(states)
            # on average the behaviour's action; nearly every state beyond 0.3 on its side (a few unseen random
            # states may sit nearer 0, as in RCSL's test)
            right_side = (actions * np.sign(action) > 0.3).float().mean().item()
            assert abs(actions.mean().item() - action) < 0.15 and right_side >= 0.9, actions
            actor.observe(torch.full((len(states),), reward))


def test_riql_keeps_the_rewarded_behaviour_where_corrupted_rewards_pull_iql_away(tmp_path):
    """A fifth of the unrewarded action's rows carry reward 10 instead of 0 (RIQL's reward corruption): IQL's
    squared-error critic values that action at their mean, 2, above the rewarded one's 1, and acts as it; RIQL's
    Huber critic (delta 1) values it near 0.25 and keeps acting as the rewarded behaviour."""
    corrupted = two_action_bandit(tmp_path, corrupted=10.0)
    iql = train("iql", corrupted, 800, hidden=(64, 64), batch_size=64).act(corrupted[1])
    riql = train("riql", corrupted, 800, hidden=(64, 64), batch_size=64).act(corrupted[1])
    assert (iql < -0.5).all() and (riql > 0.4).all(), (iql, riql)
    # the Huber loss is what holds: RIQL with sigma 0.1 (delta 100, about squared error) follows the corruption too
    squared = train("riql", corrupted, 800, hidden=(64, 64), batch_size=64, sigma=0.1).act(corrupted[1])
    assert (squared < -0.5).all(), squared
