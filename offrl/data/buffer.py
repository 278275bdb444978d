"""Replay buffer on the training device.

All fields live in one packed [capacity, width] tensor, so a batch is one gather and one split
into views; indices come from a seeded `torch.Generator` on the same device, so sampling never
syncs with the host. The buffer also takes online transitions (`add`), for SAC and fine-tuning.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from offrl import checkpoint as ckpt
from offrl.data.dataset import Dataset


class Batch(NamedTuple):
    observations: torch.Tensor  # [B, obs_dim]
    actions: torch.Tensor  # [B, act_dim]
    rewards: torch.Tensor  # [B]
    next_observations: torch.Tensor  # [B, obs_dim]
    terminals: torch.Tensor  # [B], 1 = do not bootstrap


class ReplayBuffer:
    def __init__(self, obs_dim: int, act_dim: int, capacity: int, device: torch.device | str = "cpu", seed: int = 0,
                 checkpoint_data: bool = True):
        """`checkpoint_data`: put the rows themselves in `state_dict` (online data exists nowhere else);
        a buffer made from a dataset leaves them out, since resuming rebuilds it from the dataset."""
        self.obs_dim, self.act_dim, self.capacity = obs_dim, act_dim, capacity
        self.checkpoint_data = checkpoint_data
        self.device = torch.device(device)
        self._split = (obs_dim, act_dim, 1, obs_dim, 1)
        self.storage = torch.zeros(capacity, sum(self._split), dtype=torch.float32, device=self.device)
        self.size = 0
        self.position = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.cdf: torch.Tensor | None = None  # set by set_sampling_weights

    @classmethod
    def from_dataset(cls, dataset: Dataset, device: torch.device | str = "cpu", seed: int = 0,
                     capacity: int | None = None) -> "ReplayBuffer":
        buffer = cls(dataset.obs_dim, dataset.act_dim, capacity or len(dataset), device, seed, checkpoint_data=False)
        buffer.add(dataset.observations, dataset.actions, dataset.rewards, dataset.next_observations, dataset.terminals)
        return buffer

    def __len__(self) -> int:
        return self.size

    def add(self, observations, actions, rewards, next_observations, terminals) -> None:
        """Append rows (numpy or tensors, leading batch dim); oldest rows are overwritten when full."""
        fields = (observations, actions, rewards, next_observations, terminals)
        if not any(torch.is_tensor(x) for x in fields):  # host data: one copy to the device, not five (an online
            n = len(observations)                        # env step's five would be five syncs on CUDA)
            rows = torch.as_tensor(np.concatenate([np.asarray(x, dtype=np.float32).reshape(n, -1) for x in fields], axis=1),
                                   device=self.device)
        else:
            rows = torch.cat([
                torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x, dtype=torch.float32, device=self.device)
                .reshape(len(observations), -1)
                for x in fields
            ], dim=1)
        n = len(rows)
        if n > self.capacity:
            rows, n = rows[-self.capacity:], self.capacity
        end = self.position + n
        if end <= self.capacity:
            self.storage[self.position:end] = rows
        else:
            first = self.capacity - self.position
            self.storage[self.position:] = rows[:first]
            self.storage[: n - first] = rows[first:]
        self.position = end % self.capacity
        self.size = min(self.size + n, self.capacity)

    def set_sampling_weights(self, weights: np.ndarray | torch.Tensor) -> None:
        """Sample row i with probability weights[i] / sum(weights) (float64 CDF + searchsorted: O(B log N)
        per batch, no host sync). Pass None to go back to uniform sampling."""
        if weights is None:
            self.cdf = None
            return
        weights = torch.as_tensor(weights, dtype=torch.float64, device=self.device)
        if weights.shape != (self.size,) or not torch.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(f"sampling weights must be {self.size} finite non-negative numbers with a positive sum")
        cdf = torch.cumsum(weights, 0)
        self.cdf = cdf / cdf[-1]

    def sample(self, batch_size: int) -> Batch:
        return self.gather(self.sample_index(batch_size))

    def sample_index(self, batch_size: int) -> torch.Tensor:
        """The rows `sample` draws (uniform, or by the sampling weights), for callers that also need the
        same rows of a per-transition tensor of their own."""
        if self.cdf is None:
            return torch.randint(self.size, (batch_size,), device=self.device, generator=self.generator)
        u = torch.rand(batch_size, dtype=torch.float64, device=self.device, generator=self.generator)
        return torch.searchsorted(self.cdf, u, right=True).clamp_(max=self.size - 1)

    def gather(self, index: torch.Tensor) -> Batch:
        """The rows `index` names; an index of shape [..., B] gives fields [..., B, dim] (e.g. [seeds, B])."""
        obs, act, rew, next_obs, term = self.storage[index].split(self._split, dim=-1)
        return Batch(obs, act, rew.squeeze(-1), next_obs, term.squeeze(-1))

    def state_dict(self) -> dict:
        state = {"generator": self.generator.get_state(), "size": self.size, "position": self.position}
        if self.checkpoint_data:
            state["rows"] = self.storage[: self.size].clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        ckpt.restore_generator(self.generator, state["generator"])
        self.size, self.position = int(state["size"]), int(state["position"])
        if self.checkpoint_data:
            rows = state["rows"].to(self.device)
            if self.size > self.capacity:
                raise ValueError(f"the saved buffer holds {self.size} rows, more than this buffer's capacity {self.capacity}")
            if self.size < self.capacity and self.position != self.size:
                # a full ring buffer restored into a larger one (a run resumed with more steps): oldest
                # row first, and the next write goes after the newest instead of over the oldest
                rows = torch.cat([rows[self.position:], rows[: self.position]])
                self.position = self.size
            self.storage[: self.size] = rows
