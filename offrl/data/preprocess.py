"""Preprocessing shared by all algorithms, applied in one place (`prepare`) so that training and
evaluation see the same transform."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from offrl.data.dataset import Dataset
from offrl.errors import DatasetError, OffrlError


def state_stats(observations: np.ndarray, eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and (std + eps), CORL's `compute_mean_std` + `normalize_states`."""
    mean = observations.mean(0, dtype=np.float64).astype(np.float32)
    std = (observations.std(0, dtype=np.float64) + eps).astype(np.float32)
    return mean, std


def normalize_states(dataset: Dataset, mean: np.ndarray, std: np.ndarray) -> Dataset:
    return dataset.replace(observations=(dataset.observations - mean) / std,
                           next_observations=(dataset.next_observations - mean) / std)


def ended_episodes(dataset: Dataset, max_episode_steps: int | None) -> np.ndarray:
    """Per episode, whether it ended: terminated, or cut by the env's step limit (`max_episode_steps` rows, or one
    fewer in D4RL's Q-learning form, which drops each time-out row), rather than cut short by the end of a
    collection (the suite's parallel envs still running when its row budget was reached leave up to 20 such
    pieces a dataset, some 26-31 steps long). All True without `max_episode_steps`, or when none ended."""
    if not max_episode_steps:
        return np.ones(dataset.num_episodes, dtype=bool)
    last = dataset.episode_ends() - 1
    ended = (dataset.terminals[last] > 0) | (dataset.episode_lengths() >= max_episode_steps - 1)
    return ended if ended.any() else np.ones(dataset.num_episodes, dtype=bool)


def return_range_factor(dataset: Dataset, max_episode_steps: int | None = None) -> float:
    """1000 / (max episode return - min episode return), official IQL's locomotion scaling, over the episodes
    that ended (`ended_episodes`): a piece the data cut short does not set the range. Official IQL counts a
    D4RL file's trailing piece, CORL does not; D4RL has at most that one. CORL's `return_reward_range` ends
    an "episode" at a terminal or after 1000 rows of qlearning_dataset's output (whose timed-out episodes
    have 999 rows, so its units straddle episodes) and scales by max_episode_steps rather than 1000; here
    the episodes are the data's own, as in official IQL."""
    returns = dataset.episode_returns()[ended_episodes(dataset, max_episode_steps)]
    spread = float(returns.max() - returns.min())
    if spread <= 0:
        raise DatasetError(dataset.name, "all episodes have the same return; return-range reward scaling "
                           "is undefined (turn off --data.normalize-reward)", "rewards")
    return 1000.0 / spread


def top_trajectories(dataset: Dataset, frac: float, discount: float = 1.0) -> Dataset:
    """Keep the best round(frac * episodes) episodes by (discounted) return, at least one (%BC; CORL ranks
    1000-row chunks instead and keeps max(1, int(frac * n)), see algos/bc.py)."""
    if not 0.0 < frac <= 1.0:
        raise OffrlError(f"--frac {frac}: the fraction of episodes kept must be in (0, 1]")
    if frac == 1.0:
        return dataset
    returns = dataset.episode_returns(discount)
    keep = max(1, int(round(frac * dataset.num_episodes)))
    best = np.sort(np.argsort(-returns, kind="stable")[:keep])
    return dataset.select_episodes(best)


def return_weights(dataset: Dataset, temperature: float = 0.1, max_episode_steps: int | None = None) -> np.ndarray:
    """Per-transition sampling probabilities of return-weighted sampling (RW, Hong et al. 2023):
    p_i ~ exp(G_hat(episode of i) / temperature), G_hat = (G - G_min) / (G_max - G_min), with G_min and G_max
    over the episodes that ended (`ended_episodes`; a piece the data cut short gets its G_hat on that scale).

    Deviation: the authors' d3rlpy wrapper computes G_hat but then applies the softmax to the raw
    returns (a leftover of their 'fix max-min normalization' change); we use G_hat, as their AW
    variant and the paper do."""
    if not temperature > 0:
        raise OffrlError(f"--data.return-temperature {temperature}: must be > 0")
    returns = dataset.episode_returns()
    ended = returns[ended_episodes(dataset, max_episode_steps)]
    spread = ended.max() - ended.min()
    scaled = (returns - ended.min()) / spread if spread > 0 else np.zeros_like(returns)
    logits = np.repeat(scaled / temperature, dataset.episode_lengths())
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def clip_actions(dataset: Dataset, low: np.ndarray, high: np.ndarray, eps: float = 1e-5) -> Dataset:
    """Clip into [low, high] shrunk by eps * half-range (official IQL clips to +-(1 - 1e-5))."""
    half = (high - low) / 2.0
    return dataset.replace(actions=np.clip(dataset.actions, low + eps * half, high - eps * half).astype(np.float32))


@dataclass
class Preprocessing:
    """The transforms applied to a dataset; `obs_mean/obs_std` are None when states are raw."""

    obs_mean: np.ndarray | None = None
    obs_std: np.ndarray | None = None
    reward_scale: float = 1.0
    reward_bias: float = 0.0

    def state_normalizer(self, device: torch.device) -> "StateNormalizer":
        return StateNormalizer(self.obs_mean, self.obs_std, device)


class StateNormalizer(torch.nn.Module):
    """(obs - mean) / std on the device; the identity when states are not normalized. Saved with
    the agent so a checkpoint alone evaluates correctly."""

    def __init__(self, mean: np.ndarray | None, std: np.ndarray | None, device: torch.device | str = "cpu"):
        super().__init__()
        self.enabled = mean is not None
        self.register_buffer("mean", torch.as_tensor(mean if mean is not None else 0.0, dtype=torch.float32, device=device))
        self.register_buffer("std", torch.as_tensor(std if std is not None else 1.0, dtype=torch.float32, device=device))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.mean) / self.std if self.enabled else obs


def refuse_reward_transform(data_cfg, algo: str) -> None:
    """Return-conditioned policies (DT, RCSL) condition on returns in the env's units: their evaluation targets
    and the rewards they subtract while acting are the env's, so rewards scaled for training would condition
    them on returns they never saw."""
    flags = [flag for flag, on in (("--data.normalize-reward", data_cfg.normalize_reward),
                                   ("--data.reward-scale", data_cfg.reward_scale != 1.0),
                                   ("--data.reward-bias", data_cfg.reward_bias != 0.0)) if on]
    if flags:
        raise OffrlError(f"{algo} conditions on returns in the env's reward units (its targets and the rewards it "
                         f"subtracts while acting are the env's): drop {', '.join(flags)}")


CORRUPTION_OPTIONS = ("corruption_mode", "corruption_rate", "corruption_range", "corruption_seed", "attack_critic",
                      "attack_device")


def refuse_options_without_their_switch(data_cfg) -> None:
    """Data options that only act under another one, given without it (compared with DataConfig's defaults, which
    no algorithm changes for these): the run would record them as if applied."""
    from offrl.config import DataConfig

    default = DataConfig()

    def given(names):
        return [f"--data.{n.replace('_', '-')}" for n in names if getattr(data_cfg, n) != getattr(default, n)]

    if data_cfg.corrupt is None and given(CORRUPTION_OPTIONS):
        raise OffrlError(f"{', '.join(given(CORRUPTION_OPTIONS))} without --data.corrupt <field>: nothing would be "
                         "corrupted; name the field (observations, actions, rewards, next_observations) or drop them")
    adversarial = data_cfg.corruption_mode == "adversarial" and data_cfg.corrupt != "rewards"
    if data_cfg.corrupt is not None and not adversarial and given(("attack_critic", "attack_device")):
        raise OffrlError(f"{', '.join(given(('attack_critic', 'attack_device')))}: only the adversarial corruption of "
                         "observations, actions or next_observations runs an attack critic (this run: "
                         f"{data_cfg.corruption_mode} corruption of {data_cfg.corrupt}); drop it")
    if data_cfg.sampling == "uniform" and given(("return_temperature",)):
        raise OffrlError("--data.return-temperature without --data.sampling return-weighted: uniform sampling has no "
                         "temperature; drop it or weight the sampling")


def refuse_unread_corruption(data_cfg, algo: str, reads: set[str]) -> None:
    """`--data.corrupt <field>` of a field the algorithm never reads (`reads`, with s' too where the state
    statistics include it: --data.normalize-states --data.state-stats-with-next, and rewards where the batches are
    return-weighted) would change nothing it trains on while its run record said the data were corrupted."""
    if data_cfg.normalize_states and data_cfg.state_stats_with_next:
        reads = reads | {"next_observations"}
    if data_cfg.sampling == "return-weighted":  # its weights come from the (corrupted) returns
        reads = reads | {"rewards"}
    if data_cfg.corrupt is not None and data_cfg.corrupt not in reads:
        raise OffrlError(f"--data.corrupt {data_cfg.corrupt}: {algo} never reads {data_cfg.corrupt} (it reads "
                         f"{', '.join(sorted(reads))}), so the corruption would change nothing it trains on: drop it")


def refuse_weighted_sampling(data_cfg, algo: str, how: str) -> None:
    """`--data.sampling return-weighted` weights the rows of `TrainingData.buffer()`; an algorithm that
    draws its batches another way (`how`) would ignore it while its run record said it was applied."""
    if data_cfg.sampling != "uniform":
        raise OffrlError(f"{algo} draws its batches as {how}, not from the transition buffer that "
                         f"--data.sampling {data_cfg.sampling} weights: drop that option")


def apply(dataset: Dataset, cfg, action_low: np.ndarray | None = None, action_high: np.ndarray | None = None,
          max_episode_steps: int | None = None) -> tuple[Dataset, Preprocessing]:
    """Apply the `DataConfig` options in a fixed order: action clip, reward scaling, state normalization.
    `max_episode_steps`: the env's step limit, which tells the episodes that ended from pieces the data cut
    (`return_range_factor`)."""
    pre = Preprocessing()
    if cfg.clip_actions:
        if action_low is None or action_high is None:
            raise ValueError("clip_actions needs the env's action bounds")
        dataset = clip_actions(dataset, action_low, action_high)
    scale = return_range_factor(dataset, max_episode_steps) if cfg.normalize_reward else 1.0
    scale *= cfg.reward_scale
    if scale != 1.0 or cfg.reward_bias != 0.0:
        dataset = dataset.replace(rewards=(dataset.rewards * scale + cfg.reward_bias).astype(np.float32))
    pre.reward_scale, pre.reward_bias = scale, cfg.reward_bias
    if cfg.normalize_states:
        observations = (np.concatenate([dataset.observations, dataset.next_observations])
                        if getattr(cfg, "state_stats_with_next", False) else dataset.observations)
        pre.obs_mean, pre.obs_std = state_stats(observations, cfg.state_norm_eps)
        dataset = normalize_states(dataset, pre.obs_mean, pre.obs_std)
    return dataset, pre
