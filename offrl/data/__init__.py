"""Datasets: loading, validation, preprocessing and the replay buffer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from offrl.data.buffer import Batch, ReplayBuffer
from offrl.data.dataset import Dataset
from offrl.data.preprocess import Preprocessing, StateNormalizer
from offrl.data.sources import UNKNOWN_AT_EPISODE_ENDS, load_dataset
from offrl.errors import DatasetError, OffrlError

__all__ = ["Batch", "Dataset", "DatasetError", "Preprocessing", "ReplayBuffer", "Spaces", "StateNormalizer",
           "TrainingData", "load_dataset", "load_for_training"]


@dataclass
class Spaces:
    """What an agent needs to know about its env's spaces."""

    obs_dim: int
    act_dim: int
    action_low: np.ndarray
    action_high: np.ndarray

    @classmethod
    def of(cls, env) -> "Spaces":
        space = env.action_space
        return cls(int(np.prod(env.observation_space.shape)), int(np.prod(space.shape)),
                   space.low.astype(np.float32), space.high.astype(np.float32))


@dataclass
class TrainingData:
    """A preprocessed dataset with what an agent needs to know about its env."""

    dataset: Dataset
    preprocessing: Preprocessing
    obs_dim: int
    act_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    sample_weights: np.ndarray | None = None  # per-transition probabilities (return-weighted sampling)
    corruption: object | None = None  # offrl.data.corruption.Corruption when --data.corrupt is set

    @property
    def metadata(self) -> dict:
        return self.dataset.metadata

    def refuse_unknown_next_observations(self) -> None:
        """For an algorithm that learns from s': refuse data whose episodes' last rows have s' = s."""
        if self.metadata.get("next_observations") == UNKNOWN_AT_EPISODE_ENDS:
            raise DatasetError(self.dataset.name, "--data.d4rl-trajectories keeps each episode's last row, whose "
                               "s' this file does not record (no next_observations); an algorithm that learns "
                               "from s' needs qlearning_dataset's rows: drop --data.d4rl-trajectories",
                               "next_observations")

    def buffer(self, device, seed: int, reads_next_observations: bool = True) -> ReplayBuffer:
        """The dataset as a replay buffer on `device`, sampling as the data config says. An algorithm that
        reads s' (`reads_next_observations`: every one but BC) refuses recorded D4RL trajectories without
        next_observations, whose episodes' last rows carry s' = s: a Q target would bootstrap from V(s)."""
        if reads_next_observations:
            self.refuse_unknown_next_observations()
        buffer = ReplayBuffer.from_dataset(self.dataset, device, seed=seed)
        if self.sample_weights is not None:
            buffer.set_sampling_weights(self.sample_weights)
        return buffer


def load_for_training(source: str, data_cfg, select=None, seed: int = 0, check_options: bool = True) -> TrainingData:
    """Load (making an offrl suite dataset if missing), check it against its evaluation env's
    spaces, apply the corruption `data_cfg` asks for, then `select` (a Dataset -> Dataset filter, e.g. %BC's top
    trajectories) and then the preprocessing, so statistics come from the data actually trained on.
    `check_options`: refuse data options given without the option they act under (a new or resumed run); a
    saved run rebuilt for evaluation passes False, as its config cannot be changed."""
    from offrl.data import preprocess, suite
    from offrl.evaluation import make_env

    if check_options:
        preprocess.refuse_options_without_their_switch(data_cfg)

    if not (math.isfinite(data_cfg.reward_scale) and math.isfinite(data_cfg.reward_bias)):
        # a NaN scale would show up later as a NaN loss, taken for a divergence
        raise OffrlError(f"--data.reward-scale {data_cfg.reward_scale} / --data.reward-bias {data_cfg.reward_bias}: "
                         "must be finite numbers")
    if data_cfg.make_if_missing:
        suite.ensure(source)
    dataset = load_dataset(source, env_id=data_cfg.env_id, download=data_cfg.download,
                           ref_min_score=data_cfg.ref_min_score, ref_max_score=data_cfg.ref_max_score,
                           d4rl_trajectories=data_cfg.d4rl_trajectories)
    env = make_env(dataset.metadata)
    try:
        check_env_compat(dataset, env.observation_space, env.action_space)
        low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
        max_episode_steps = env.spec.max_episode_steps if env.spec is not None else None
    finally:
        env.close()
    corruption = None
    if data_cfg.corrupt is not None:
        from offrl.data.corruption import corrupt

        seed_used = data_cfg.corruption_seed if data_cfg.corruption_seed is not None else seed
        dataset, corruption = corrupt(dataset, data_cfg.corrupt, data_cfg.corruption_mode, data_cfg.corruption_rate,
                                      data_cfg.corruption_range, seed_used, data_cfg.attack_critic,
                                      device=data_cfg.attack_device)
    if select is not None:  # after the corruption: %BC ranks episodes by the returns it is given, and every
        dataset = select(dataset)  # algorithm sees the same corrupted rows of a dataset for one corruption seed
    weights = None
    if data_cfg.sampling == "return-weighted":  # from the raw returns: a reward bias would favour long episodes
        weights = preprocess.return_weights(dataset, data_cfg.return_temperature, max_episode_steps)
    dataset, pre = preprocess.apply(dataset, data_cfg, low, high, max_episode_steps)
    return TrainingData(dataset, pre, dataset.obs_dim, dataset.act_dim, low, high, weights, corruption)


def check_env_compat(dataset: Dataset, observation_space, action_space) -> None:
    """The dataset's observation/action widths must match the env's spaces."""
    obs_shape, act_shape = observation_space.shape, action_space.shape
    env_id = dataset.metadata.get("env_id")
    if obs_shape is None or int(np.prod(obs_shape)) != dataset.obs_dim:
        raise DatasetError(dataset.name, f"observation width {dataset.obs_dim} does not match env {env_id}'s "
                           f"observation space {obs_shape}", "observations")
    if act_shape is None or int(np.prod(act_shape)) != dataset.act_dim:
        raise DatasetError(dataset.name, f"action width {dataset.act_dim} does not match env {env_id}'s "
                           f"action space {act_shape}", "actions")
