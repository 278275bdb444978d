"""Deterministic, vectorized data collection.

`collect` steps N envs together with one batched policy call per step and gives every new
episode an explicit reset seed (seed, seed + 1, ... in the order episodes start), so the same
arguments produce the same transitions bit for bit on the same platform. It stops at exactly
`transitions` rows: the episodes still running then are cut and marked truncated (bootstrapped),
as D4RL's fixed-size datasets end with time-outs.

A policy is `policy(obs [n, obs_dim] float64, step) -> actions [n, act_dim]`, where `step` counts
the transitions collected so far; a schedule of checkpoints (medium-replay) switches on it, as the
learner's policy changed while its replay buffer filled.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from pathlib import Path
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


# ---------------------------------------------------------------------- one set of BLAS kernels on every CPU
# MKL, torch's BLAS on x86, picks its kernels by CPU (AVX-512 ones on a Xeon, SSE4.2 ones on an AMD EPYC), and each
# kernel sums a matrix product in its own order. Computing in float64 hides most of that in the rounding to float32
# actions, not all of it, and one differing bit makes a MuJoCo trajectory diverge: under its own kernels a Xeon with
# AMX made halfcheetah medium and medium-expert and hopper medium-expert with other bytes than the committed
# reference. MKL's Conditional Numerical Reproducibility mode runs one branch of kernels on every CPU that has it;
# the reference checksums come from an AMD EPYC, where MKL ran its SSE4.2 branch, and pinned to that branch the
# Xeon regenerates all of them. The branch can be set only before MKL's first call in a process, and it then holds
# for the whole process (SSE4.2 matrix products are several times slower than AVX-512 ones): so the dataset
# commands pin their own process (`offrl datasets make`, `verify`), and a training run that needs a suite dataset
# made has a child process make it (`suite.ensure`).
MKL_CBWR_BRANCH, MKL_CBWR_SSE4_2, MKL_CBWR_SUCCESS = 1, 8, 0  # mkl_cbwr.h
DATA_BLAS_BRANCH = MKL_CBWR_SSE4_2
_warned_unpinned = False


def _mkl_cbwr():
    """(get, set) of MKL's reproducibility mode from the MKL inside torch, or None without MKL (e.g. on ARM)."""
    libraries = [None, *Path(torch.__file__).parent.joinpath("lib").glob("libtorch_cpu*")]
    for library in libraries:
        try:
            lib = ctypes.CDLL(library if library is None else str(library))
            get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
        except (OSError, AttributeError):
            continue
        get.argtypes = set_.argtypes = [ctypes.c_int]
        get.restype = set_.restype = ctypes.c_int
        return get, set_
    return None


def blas_pinned() -> bool | None:
    """True when this process's MKL runs the data's pinned branch, False when it runs another, None without MKL."""
    cbwr = _mkl_cbwr()
    return None if cbwr is None else cbwr[0](MKL_CBWR_BRANCH) == DATA_BLAS_BRANCH


def pin_blas() -> bool | None:
    """Pin this process's MKL to the data's branch of kernels (above); call it before anything multiplies a
    matrix. True when pinned (now or before), None without MKL, False when too late (MKL was used already)."""
    cbwr = _mkl_cbwr()
    if cbwr is None:
        return None
    return cbwr[0](MKL_CBWR_BRANCH) == DATA_BLAS_BRANCH or cbwr[1](DATA_BLAS_BRANCH) == MKL_CBWR_SUCCESS


def sampled_policy(policy: Policy, seed: int, deterministic: bool = False) -> PolicyFn:
    """A policy file's actor, sampling with its own seeded generator (or its mode), computing in float64
    (`Policy.in_float64`) with MKL's pinned kernels (when the process pinned them: above), so that the actions,
    and so the data, are the same on every CPU; warns once when this process's MKL is not pinned."""
    global _warned_unpinned
    if blas_pinned() is False and not _warned_unpinned:
        _warned_unpinned = True
        warnings.warn("this process's MKL runs its own CPU's kernels, not the pinned ones the dataset commands use "
                      "(offrl.data.rollout.pin_blas, before any matrix product): data made here may differ in bits "
                      "from other machines' (`offrl datasets make` pins them)", stacklevel=2)
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
