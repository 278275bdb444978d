"""MBRCSL: the rollout filter and its returns-to-go, the generative behaviour policies' losses by hand, the
stitching dataset, and command-line runs on the tiny dataset."""

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from algos.mbrcsl import (Config, RolloutCollector, Rollouts, above_threshold, best_episode_return, rollout_full,
                          to_dataset)
from conftest import PYTHON, assert_reevaluation_reproduces, run_cli
from offrl import checkpoint as ckpt, generative
from offrl.data import load_dataset
from offrl.data.sequences import returns_to_go
from offrl.errors import CheckpointError
from world_models.termination import never


class ConstantRewardModel:
    """A stand-in dynamics ensemble: the state does not move, reward = obs[0] + action[0], no noise, or a
    terminal once obs[1] > 0 (with `terminal_after`)."""

    elite_index = torch.tensor([0])

    def __call__(self, obs, actions):
        mean = torch.cat([torch.zeros_like(obs), (obs[:, :1] + actions[:, :1])], dim=-1).unsqueeze(0)
        return mean, torch.full_like(mean, -80.0)  # std e^-40: the sample is the mean


class ZeroPolicy:
    def sample(self, obs, generator=None):
        return torch.zeros(obs.shape[0], 1)


def test_threshold_keeps_exactly_the_rollouts_above_it():
    returns = torch.tensor([1.0, 5.0, 5.0001, 3.0, 7.0, -2.0])
    assert above_threshold(returns, 5.0).tolist() == [2, 4]  # strictly greater, as the reference
    assert above_threshold(returns, 100.0).tolist() == []

    starts = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0], [2.0, 0.0]])  # return = 10 * obs[0]
    cfg = Config(num_trajectories=1000, rollout_batch=64, max_rollout_epochs=3)
    collector = RolloutCollector(ConstantRewardModel(), never, starts, 10, threshold=12.0, cfg=cfg, seed=0)
    while not collector.done:
        collector.epoch(ZeroPolicy())
    made = torch.cat(collector.all_returns)
    kept = collector.kept_rollouts()
    assert collector.epochs == 3 and len(made) == 192
    assert len(kept) == int((made > 12.0).sum()) > 0
    assert torch.all(kept.returns > 12.0) and set(kept.returns.tolist()) <= {15.0, 20.0}
    summary = collector.summary()
    assert summary["rollouts/made"] == 192 and summary["rollouts/kept"] == len(kept)


def test_default_threshold_counts_whole_recorded_episodes_of_a_d4rl_file(tmp_path):
    """Q-learning rows drop a timed-out episode's last row and the file's last row; the threshold does not."""
    import types

    import h5py

    terminals, timeouts = np.zeros(10, bool), np.zeros(10, bool)
    terminals[3], timeouts[6] = True, True
    path = str(tmp_path / "hopper-test-v2.hdf5")
    with h5py.File(path, "w") as f:
        f["observations"] = np.arange(10, dtype=np.float32)[:, None].repeat(2, 1)
        f["actions"] = np.full((10, 1), 0.5, np.float32)
        f["rewards"] = np.arange(10, dtype=np.float32)
        f["terminals"], f["timeouts"] = terminals, timeouts
    qlearning = load_dataset(path)
    # episodes as Q-learning rows: 0-3 (6), 4-5 (9, row 6 dropped), 7-8 (15, the file's last row dropped)
    assert qlearning.episode_returns().tolist() == [6.0, 9.0, 15.0]
    data = types.SimpleNamespace(dataset=qlearning)
    # as recorded: 0-3 (6), 4-6 (15), 7-9 (24)
    assert best_episode_return(Config(dataset=path), data) == 24.0
    recorded = types.SimpleNamespace(dataset=load_dataset(path, d4rl_trajectories=True))
    assert best_episode_return(Config(dataset=path), recorded) == 24.0
    npz = types.SimpleNamespace(dataset=qlearning.replace(metadata={**qlearning.metadata, "source": "npz:x.npz"}))
    assert best_episode_return(Config(dataset=path), npz) == 15.0  # other sources are whole episodes already


def test_collector_stops_once_enough_are_kept_and_restores_exactly():
    starts = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    cfg = Config(num_trajectories=5, rollout_batch=4, max_rollout_epochs=100)
    collector = RolloutCollector(ConstantRewardModel(), never, starts, 3, threshold=4.0, cfg=cfg, seed=1)
    collector.epoch(ZeroPolicy())
    state = collector.state_dict()
    while not collector.done:
        collector.epoch(ZeroPolicy())
    assert collector.kept_count >= 5 and collector.epochs < 100
    copy = RolloutCollector(ConstantRewardModel(), never, starts, 3, threshold=4.0, cfg=cfg, seed=99)
    copy.load_state_dict(state)
    while not copy.done:
        copy.epoch(ZeroPolicy())
    assert copy.epochs == collector.epochs and torch.equal(copy.kept_rollouts().returns, collector.kept_rollouts().returns)


def test_returns_to_go_are_computed_within_each_rollout():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0], [10.0, 20.0, 30.0, 40.0]])  # the first ended after 3 steps
    rollouts = Rollouts(observations=torch.zeros(2, 4, 3), actions=torch.zeros(2, 4, 1), rewards=rewards,
                        next_observations=torch.zeros(2, 4, 3), terminated=torch.tensor([True, False]),
                        lengths=torch.tensor([3, 4]), returns=torch.tensor([6.0, 100.0]))
    dataset = to_dataset(rollouts)
    assert len(dataset) == 7 and dataset.episode_starts.tolist() == [0, 3]
    assert dataset.terminals.tolist() == [0, 0, 1, 0, 0, 0, 0] and dataset.timeouts.tolist() == [0, 0, 0, 0, 0, 0, 1]
    assert returns_to_go(dataset).tolist() == [6.0, 5.0, 3.0, 100.0, 90.0, 70.0, 40.0]


def test_a_rollout_stops_at_its_terminal_state():
    class TerminatingModel(ConstantRewardModel):
        def __call__(self, obs, actions):  # the second coordinate grows by 1 a step
            mean, logvar = super().__call__(obs, actions)
            mean[..., 1] = 1.0
            return mean, logvar

    def ends(next_obs):
        return next_obs[:, 1] >= 2.0

    rollouts = rollout_full(TerminatingModel(), ZeroPolicy(), torch.tensor([[1.0, 0.0], [1.0, -10.0]]), 5, ends)
    assert rollouts.lengths.tolist() == [2, 5] and rollouts.terminated.tolist() == [True, False]
    assert rollouts.returns.tolist() == [2.0, 5.0]


def test_cosine_schedule_by_hand():
    def alpha_bar(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
    expected = [1 - alpha_bar(0.5) / alpha_bar(0.0), min(1 - alpha_bar(1.0) / alpha_bar(0.5), 0.999)]
    assert generative.cosine_betas(2).tolist() == pytest.approx(expected)
    assert expected[1] == 0.999  # alpha_bar(1) is ~0: the cap applies


def test_diffusion_denoising_loss_on_a_known_case():
    policy = generative.DiffusionPolicy(1, 2, [0.0], [1.0], [-1, -1], [1, 1], diffusion_steps=4)
    abar = policy.alphas_cumprod
    actions = torch.tensor([[0.5, -0.5], [1.0, 0.0]])
    noise = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    t = torch.tensor([0, 3])
    seen = {}

    def predict_zero(noisy, steps, obs):
        seen["noisy"] = noisy
        return torch.zeros_like(noisy)

    policy.net.forward = predict_zero
    loss = policy.loss(torch.zeros(2, 1), actions, t=t, noise=noise)
    assert loss.item() == pytest.approx((1 + 4 + 1 + 0.25) / 4)  # an all-zero prediction: mean eps^2
    a = abar[t].unsqueeze(-1)
    assert torch.allclose(seen["noisy"], a.sqrt() * actions + (1 - a).sqrt() * noise)

    policy.net.forward = lambda noisy, steps, obs: noise  # the true noise: no loss
    assert policy.loss(torch.zeros(2, 1), actions, t=t, noise=noise).item() == pytest.approx(0.0, abs=1e-12)


def test_diffusion_sampler_returns_the_action_an_exact_denoiser_points_to():
    """With eps_theta(x_t, t) = (x_t - sqrt(abar_t) a*) / sqrt(1 - abar_t), every step predicts a_0 = a*, and the
    last step (t = 0, no noise) returns a* exactly: the sampler's posterior coefficients are right."""
    policy = generative.DiffusionPolicy(1, 2, [0.0], [1.0], [-1, -1], [1, 1], diffusion_steps=10)
    target = torch.tensor([0.3, -0.7])

    def exact(noisy, steps, obs):
        a = policy.alphas_cumprod[steps].unsqueeze(-1)
        return (noisy - a.sqrt() * target) / (1 - a).sqrt()

    policy.net.forward = exact
    out = policy.sample_unit(torch.zeros(5, 1), torch.Generator().manual_seed(0))
    assert torch.allclose(out, target.expand(5, 2), atol=1e-5)


def test_gaussian_mixture_loss_by_hand():
    policy = generative.GaussianMixturePolicy(1, 1, [0.0], [1.0], [-1], [1], components=2, hidden=(4,))
    for p in policy.net.parameters():
        torch.nn.init.zeros_(p)  # equal weights, means 0, log-stds 0: a standard normal
    a = torch.tensor([[0.5], [-1.0]])
    expected = np.mean([0.5 * x ** 2 + 0.5 * math.log(2 * math.pi) for x in (0.5, -1.0)])
    assert policy.loss(torch.zeros(2, 1), a).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("kind", ["diffusion", "gmm"])
def test_behaviour_policy_learns_a_two_mode_action_and_its_file_acts_alone(kind, tmp_path):
    """Half the data acts -0.8, half +0.8 in the same state: cloning must keep both modes (an MSE policy would
    answer 0), and a saved file samples the same actions as the policy it was saved from."""
    torch.manual_seed(0)
    obs = torch.zeros(512, 1)
    actions = torch.where(torch.arange(512).unsqueeze(-1) % 2 == 0, -0.8, 0.8)
    cfg = generative.BehaviourConfig(kind=kind, steps=600, lr=3e-3, widths=(16, 32), time_dim=8, hidden=(32,),
                                     components=2, diffusion_steps=10)
    policy = generative.build(cfg, 1, 1, [0.0], [1.0], [-1.0], [1.0])
    trainer = generative.BehaviourTrainer(policy, cfg, obs, actions, seed=0)
    for _ in range(cfg.steps):
        trainer.update()
    sampler = trainer.sampler()
    samples = sampler.sample(torch.zeros(400, 1), torch.Generator().manual_seed(1)).squeeze(-1)
    near = lambda c: ((samples - c).abs() < 0.25).float().mean().item()  # noqa: E731
    assert near(-0.8) > 0.3 and near(0.8) > 0.3 and near(0.0) < 0.1
    path = generative.save(tmp_path / "behaviour.pt", sampler, cfg)
    loaded, loaded_cfg, _ = generative.load(path)
    assert loaded_cfg == cfg
    same = [p.sample(torch.zeros(8, 1), torch.Generator().manual_seed(2)) for p in (sampler, loaded)]
    assert torch.equal(same[0], same[1])
    old = ckpt.load(path)
    old["format"] = "offrl-behaviour-policy-v1"  # a file from before the conditioning lost its Mish
    ckpt.save(tmp_path / "v1.pt", old)
    with pytest.raises(CheckpointError, match="format v1"):
        generative.load(tmp_path / "v1.pt")
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError):
        generative.load(path)


FAST = ["--behaviour.steps", "60", "--behaviour.widths", "8", "16", "--behaviour.time-dim", "8", "--steps", "60",
        "--rcsl.hidden", "32", "32", "--rcsl.holdout-every", "20", "--rollout-batch", "30", "--num-trajectories", "20",
        "--max-rollout-epochs", "3", "--horizon", "50", "--eval.episodes", "2", "--log.every", "20",
        "--log.wandb", "disabled", "--model.members", "3", "--model.elites", "2", "--model.hidden", "16", "16",
        "--model.weight-decay", "0", "0", "0", "--model.max-epochs", "2"]
LOADED_BEHAVIOUR = FAST[FAST.index("--steps"):]  # with --behaviour-policy: no --behaviour.* (refused there)


def test_mbrcsl_end_to_end_on_tiny(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    result = run_cli(PYTHON, "-m", "algos.mbrcsl", *FAST, "--threshold", "0", "--run.out-dir", str(tmp_path / "a"))
    assert "final normalized score" in result.stdout
    (run_dir,) = (tmp_path / "a").glob("mbrcsl/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert final["rollouts/made"] == 30 * final["rollouts/epochs"] and final["rollouts/epochs"] <= 3
    assert final["rollouts/kept"] >= 20 or final["rollouts/epochs"] == 3
    assert final["target_return"] == final["rollouts/kept_return_max"] > 0
    assert np.isfinite(final["eval/normalized_score"]) and np.isfinite(final["behaviour/normalized_score"])
    from offrl.data import load_dataset

    kept = load_dataset(str(run_dir / "rollouts.npz"))
    assert kept.num_episodes == final["rollouts/kept"] and np.all(kept.episode_returns() > 0)
    assert_reevaluation_reproduces(run_dir)  # `offrl eval` rebuilds the RCSL policy and its target from the checkpoint

    # the saved behaviour policy replaces the behaviour-cloning phase of another run, whose --behaviour.* options
    # would do nothing: refused
    given = run_cli(PYTHON, "-m", "algos.mbrcsl", *FAST, "--threshold", "0", "--behaviour-policy",
                    str(run_dir / "behaviour.pt"), "--run.out-dir", str(tmp_path / "b"), check=False)
    assert given.returncode == 1 and "Traceback" not in given.stderr and not (tmp_path / "b").exists()
    assert ("--behaviour.steps acts only without --behaviour-policy; --behaviour.widths acts only without "
            "--behaviour-policy; --behaviour.time-dim acts only without --behaviour-policy: the file's policy is rolled out, "
            "not trained: drop the --behaviour.* options") in given.stderr
    again = run_cli(PYTHON, "-m", "algos.mbrcsl", *LOADED_BEHAVIOUR, "--threshold", "0", "--behaviour-policy",
                    str(run_dir / "behaviour.pt"), "--run.out-dir", str(tmp_path / "b"))
    (second,) = (tmp_path / "b").glob("mbrcsl/*/*")
    assert json.loads((second / "final.json").read_text())["steps"] == 60 and not (second / "behaviour.pt").exists()
    assert final["steps"] == 60 and final["total_steps"] == 120  # --steps as asked (sweeps compare it), then both phases
    assert "final normalized score" in again.stdout


def test_mbrcsl_resumed_after_its_rollouts_ends_as_one_straight_run(tiny, tmp_path, monkeypatch):
    """--steps 0 stops after the behaviour policy and the rollouts (checkpointed); resuming with --steps 60
    trains RCSL on the same rollouts and ends with the numbers of a straight 60-step run."""
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    at = FAST.index("--steps")
    fast = FAST[:at] + FAST[at + 2:]
    run_cli(PYTHON, "-m", "algos.mbrcsl", *fast, "--steps", "60", "--threshold", "0", "--run.out-dir", str(tmp_path / "straight"))
    first = run_cli(PYTHON, "-m", "algos.mbrcsl", *fast, "--steps", "0", "--threshold", "0",
                    "--run.out-dir", str(tmp_path / "split"))
    assert "RCSL not trained" in first.stdout
    (split_dir,) = (tmp_path / "split").glob("mbrcsl/*/*")
    assert (split_dir / "rollouts.npz").exists() and "eval/return_mean" not in json.loads((split_dir / "final.json").read_text())
    run_cli(PYTHON, "-m", "algos.mbrcsl", *fast, "--steps", "60", "--threshold", "0", "--run.out-dir",
            str(tmp_path / "split"), "--resume", "latest")
    (straight_dir,) = (tmp_path / "straight").glob("mbrcsl/*/*")
    a, b = (json.loads((d / "final.json").read_text()) for d in (straight_dir, split_dir))
    for key in ("eval/return_mean", "rollouts/kept", "target_return", "train/loss", "best_holdout_loss"):
        assert a[key] == b[key], key


def test_mbrcsl_says_when_no_rollout_passes_the_threshold(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    result = run_cli(PYTHON, "-m", "algos.mbrcsl", *FAST, "--threshold", "1e9", "--run.out-dir", str(tmp_path),
                     check=False)
    assert result.returncode == 1 and "none of 90 rollouts passed the threshold" in result.stderr
    assert "Traceback" not in result.stderr
    (run_dir,) = tmp_path.glob("mbrcsl/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert final["rollouts/kept"] == 0 and final["rollouts/made"] == 90 and "rollouts/return_max" in final
    assert final["failed"] == "no rollout passed the threshold"  # so a sweep runs it again and a table names it


def test_mbrcsl_rejects_a_behaviour_policy_of_other_dims(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    cfg = generative.BehaviourConfig(widths=(8,), time_dim=8)
    path = generative.save(tmp_path / "other.pt", generative.build(cfg, 3, 1, [0.0] * 3, [1.0] * 3, [-1.0], [1.0]), cfg)
    result = run_cli(PYTHON, "-m", "algos.mbrcsl", *LOADED_BEHAVIOUR, "--behaviour-policy", str(path), "--run.out-dir",
                     str(tmp_path / "runs"), check=False)
    assert result.returncode == 1 and "acts on 3-dim states" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------ stitching dataset
needs_maze = pytest.mark.skipif(importlib.util.find_spec("gymnasium_robotics") is None,
                                reason="needs gymnasium-robotics (pip install -e \".[maze]\")")


@needs_maze
def test_stitching_data_never_drives_the_best_route_whole():
    from offrl.data.maze import make_stitch

    made = make_stitch(seed=0, episodes_per_group=6)
    returns = np.array([e.rewards.sum() for e in made.episodes]).reshape(4, 6)
    assert all(len(e) == 200 and e.truncations[-1] and not e.terminations.any() for e in made.episodes)
    short, detour = returns[:2].mean(), returns[2].mean()
    assert short < detour < made.ref_max_score  # the best route beats every route in the data
    assert returns.max() == made.info["best_return"] < 0.8 * made.ref_max_score
    assert made.ref_min_score < short
    # the short groups end near the middle cell, the detour near the goal
    end = lambda e: e.observations[-1, :2]  # noqa: E731
    assert np.linalg.norm(end(made.episodes[0]) - [-0.5, -0.5]) < 0.5
    assert np.linalg.norm(end(made.episodes[12]) - [1.5, -0.5]) < 0.6


# that the full stitching dataset regenerates to the committed checksum: tests/test_suite.py,
# test_all_levels_made_listed_and_consistent (it is made there by `offrl datasets make --all`)


def test_return_scale_is_the_largest_magnitude_of_the_kept_returns():
    """RCSL's conditioning divides returns-to-go by the kept rollouts' largest |return|: the best return where
    returns are positive, the most negative one's magnitude where all are negative, 1 where all are 0."""
    from algos.mbrcsl import return_scale

    assert return_scale(np.array([3.0, 12.5, 7.0])) == 12.5
    assert return_scale(np.array([-40.0, -25.0])) == 40.0  # the best return, -25, is no scale
    assert return_scale(np.array([-2.0, 5.0])) == 5.0
    assert return_scale(np.zeros(3)) == 1.0
