"""Deterministic, vectorized data collection.

`collect` steps N envs together with one batched policy call per step and gives every new
episode an explicit reset seed (seed, seed + 1, ... in the order episodes start), so the same
arguments produce the same transitions bit for bit on the same platform. It stops at exactly
`transitions` rows: the episodes still running then are cut and marked truncated (bootstrapped);
D4RL's fixed-size datasets leave their last, cut trajectory without either flag.

A policy is `policy(obs [n, obs_dim] float64, step) -> actions [n, act_dim]`, where `step` counts
the transitions collected so far; a schedule of checkpoints (medium-replay) switches on it, as the
learner's policy changed while its replay buffer filled.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch

from offrl.data.suite import Episode
from offrl.policies import Policy

PolicyFn = Callable[[np.ndarray, int], np.ndarray]


def uniform_policy(action_space: gym.spaces.Box, seed: int) -> PolicyFn:
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, step: int) -> np.ndarray:
        return rng.uniform(action_space.low, action_space.high, size=(len(obs), *action_space.shape)).astype(np.float32)

    return act


def sampled_policy(policy: Policy, seed: int, deterministic: bool = False) -> PolicyFn:
    """A policy file's actor, sampling with its own seeded generator (or its mode), computing in float64
    so that the actions, and so the data, are the same on every CPU (`Policy.in_float64`)."""
    policy = policy.in_float64()
    generator = torch.Generator(device=policy.device).manual_seed(seed)

    def act(obs: np.ndarray, step: int) -> np.ndarray:
        return policy.act(obs, deterministic=deterministic, generator=generator)

    return act


def scheduled_policy(schedule: Sequence[tuple[int, PolicyFn]]) -> PolicyFn:
    """[(from_step, policy), ...] sorted by from_step: the policy whose range holds `step`."""
    starts = [s for s, _ in schedule]
    if starts != sorted(starts) or starts[0] != 0:
        raise ValueError(f"schedule must start at step 0 and be sorted, got starts {starts}")

    def act(obs: np.ndarray, step: int) -> np.ndarray:
        index = int(np.searchsorted(starts, step, side="right")) - 1
        return schedule[index][1](obs, step)

    return act


@contextlib.contextmanager
def _one_thread():
    """Policy calls on a batch of a few dozen rows gain nothing from threads, which cost much beside other
    jobs (measured: 230 us per float64 call at 1 thread against 1.4 ms at 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@_one_thread()
def collect(env_spec, policy: PolicyFn, transitions: int, seed: int, num_envs: int = 20,
            progress: Callable[[int, int], None] | None = None) -> list[Episode]:
    """Exactly `transitions` rows from `num_envs` envs stepped together; episodes in order of completion
    (then the cut ones by env index). `progress(transitions so far, finished episodes)` is called
    after every batch of env steps."""
    envs = [gym.make(env_spec) for _ in range(num_envs)]
    next_seed = seed
    obs, records, finished = [], [], []
    for env in envs:
        first, _ = env.reset(seed=next_seed)
        obs.append(first)
        records.append(_Recorder(first, next_seed))
        next_seed += 1
    low, high = envs[0].action_space.low, envs[0].action_space.high
    collected = 0
    try:
        while collected < transitions:
            active = min(num_envs, transitions - collected)
            actions = np.asarray(policy(np.stack(obs[:active]), collected), dtype=np.float32)
            actions = np.clip(actions, low, high)
            for i in range(active):
                next_obs, reward, terminated, truncated, _ = envs[i].step(actions[i])
                records[i].add(actions[i], reward, next_obs, terminated, truncated)
                if terminated or truncated:
                    finished.append(records[i].episode())
                    next_obs, _ = envs[i].reset(seed=next_seed)
                    records[i] = _Recorder(next_obs, next_seed)
                    next_seed += 1
                obs[i] = next_obs
            collected += active
            if progress is not None:
                progress(collected, len(finished))
    finally:
        for env in envs:
            env.close()
    for record in records:
        if record.length:
            record.truncations[-1] = True
            finished.append(record.episode())
    return finished


class _Recorder:
    def __init__(self, first_obs: np.ndarray, seed: int):
        self.observations, self.actions, self.rewards = [first_obs], [], []
        self.terminations, self.truncations = [], []
        self.seed = seed

    @property
    def length(self) -> int:
        return len(self.actions)

    def add(self, action, reward, next_obs, terminated, truncated) -> None:
        self.actions.append(action)
        self.rewards.append(reward)
        self.observations.append(next_obs)
        self.terminations.append(bool(terminated))
        self.truncations.append(bool(truncated))

    def episode(self) -> Episode:
        return Episode(np.asarray(self.observations), np.asarray(self.actions), np.asarray(self.rewards, np.float64),
                       np.asarray(self.terminations), np.asarray(self.truncations), self.seed)


@_one_thread()
def average_return(env_spec, policy: PolicyFn, episodes: int, seed: int,
                   progress: Callable[[int, int], None] | None = None) -> float:
    """Mean undiscounted return of `episodes` complete episodes (env i reset with seed + i), all
    run together with one batched policy call per step; `progress(finished episodes, env steps)`
    after every step."""
    envs = [gym.make(env_spec) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    low, high = envs[0].action_space.low, envs[0].action_space.high
    step = 0
    try:
        while running.any():
            index = np.flatnonzero(running)
            actions = np.clip(np.asarray(policy(obs[index], step), dtype=np.float32), low, high)
            for k, i in enumerate(index):
                obs[i], reward, terminated, truncated, _ = envs[i].step(actions[k])
                returns[i] += reward
                running[i] = not (terminated or truncated)
            step += len(index)
            if progress is not None:
                progress(int((~running).sum()), step)
    finally:
        for env in envs:
            env.close()
    return float(returns.mean())
