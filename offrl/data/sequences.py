"""Trajectory views of a Dataset for return-conditioned methods (Decision Transformer, RCSL).

- `returns_to_go`: R_t = sum_{t' >= t} gamma^(t' - t) r_t' to the end of the recorded episode
  (gamma = 1 by default, as DT and RvS), per row.
- `episode_timesteps`: each row's position in its episode.
- `SequenceBuffer`: segments of K consecutive steps of one episode, sampled on the device. A start
  row is drawn uniformly over all rows, which is DT's "episode with probability proportional to its
  length, then a uniform start"; a segment that runs past its episode's end is shortened and
  padded on the left (states 0, actions -10, returns-to-go 0, timestep 0, mask 0), as DT does (its states
  are padded with 0 before normalizing, so -mean/std there; masked out of attention and loss either way;
  algos/dt.py then zeroes the padded actions in the unit box before its model sees them, which the masks make
  the same).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from offrl import checkpoint as ckpt
from offrl.data.dataset import Dataset


def returns_to_go(dataset: Dataset, gamma: float = 1.0) -> np.ndarray:
    rewards = dataset.rewards.astype(np.float64)
    if gamma == 1.0:  # vectorized: episode total - rewards before t
        cumulative = np.cumsum(rewards)
        before_episode = np.repeat(np.concatenate([[0.0], cumulative])[dataset.episode_starts], dataset.episode_lengths())
        totals = np.repeat(cumulative[dataset.episode_ends() - 1], dataset.episode_lengths())
        return (totals - (cumulative - rewards - before_episode) - before_episode).astype(np.float32)
    rtg = np.zeros(len(dataset), dtype=np.float64)
    for start, end in zip(dataset.episode_starts, dataset.episode_ends()):
        running = 0.0
        for i in range(end - 1, start - 1, -1):
            running = rewards[i] + gamma * running
            rtg[i] = running
    return rtg.astype(np.float32)


def episode_timesteps(dataset: Dataset) -> np.ndarray:
    starts = np.repeat(dataset.episode_starts, dataset.episode_lengths())
    return (np.arange(len(dataset)) - starts).astype(np.int64)


class Segments(NamedTuple):
    states: torch.Tensor  # [B, K, obs_dim]
    actions: torch.Tensor  # [B, K, act_dim]
    returns_to_go: torch.Tensor  # [B, K, 1] (scaled)
    timesteps: torch.Tensor  # [B, K] long
    mask: torch.Tensor  # [B, K] bool, False on padding


class SequenceBuffer:
    PAD_ACTION = -10.0

    def __init__(self, dataset: Dataset, context: int, device: torch.device | str = "cpu", seed: int = 0,
                 rtg_scale: float = 1000.0, max_timestep: int = 1000):
        self.context, self.device = context, torch.device(device)
        self.states = torch.as_tensor(dataset.observations, device=self.device)
        self.actions = torch.as_tensor(dataset.actions, device=self.device)
        self.rtg = torch.as_tensor(returns_to_go(dataset) / rtg_scale, device=self.device).unsqueeze(-1)
        self.timesteps = torch.as_tensor(np.minimum(episode_timesteps(dataset), max_timestep - 1), device=self.device)
        ends = np.repeat(dataset.episode_ends(), dataset.episode_lengths())
        self.episode_end = torch.as_tensor(ends, device=self.device)  # exclusive end row of each row's episode
        self.size = len(dataset)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.offsets = torch.arange(context, device=self.device)

    def sample(self, batch_size: int) -> Segments:
        start = torch.randint(self.size, (batch_size,), device=self.device, generator=self.generator)
        return self.segments(start)

    def segments(self, start: torch.Tensor) -> Segments:
        """Segments beginning at rows `start`, shortened at their episode's end and left-padded to K."""
        length = torch.minimum(self.episode_end[start] - start, torch.full_like(start, self.context))
        rows = start.unsqueeze(1) + self.offsets - (self.context - length).unsqueeze(1)  # [B, K]
        mask = rows >= start.unsqueeze(1)
        rows = torch.where(mask, rows, start.unsqueeze(1))
        pad = ~mask
        return Segments(
            states=self.states[rows].masked_fill(pad.unsqueeze(-1), 0.0),
            actions=self.actions[rows].masked_fill(pad.unsqueeze(-1), self.PAD_ACTION),
            returns_to_go=self.rtg[rows].masked_fill(pad.unsqueeze(-1), 0.0),
            timesteps=self.timesteps[rows].masked_fill(pad, 0),
            mask=mask,
        )

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        ckpt.restore_generator(self.generator, state["generator"])
