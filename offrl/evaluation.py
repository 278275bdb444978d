"""Deterministic policy evaluation: N episodes at once in a Gymnasium vector env, one batched
policy call per step, scored against the dataset's reference returns."""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import gymnasium as gym
import numpy as np
import torch

from offrl import envs as offrl_envs
from offrl import scores
from offrl.errors import OffrlError


def env_spec_from_metadata(metadata: dict):
    """The dataset's recorded env spec (keeps e.g. a custom time limit), else its env id."""
    spec_json = metadata.get("env_spec")
    if spec_json:
        return gym.envs.registration.EnvSpec.from_json(spec_json if isinstance(spec_json, str) else json.dumps(spec_json))
    env_id = metadata.get("env_id")
    if not env_id:
        from offrl.errors import DatasetError

        raise DatasetError(metadata.get("name", "dataset"), "no evaluation env recorded; pass --data.env-id (e.g. Hopper-v5)")
    return env_id


def make_env(metadata: dict) -> gym.Env:
    """The dataset's evaluation env. An env another package registers is found when its id is written
    'module:EnvId' (gymnasium imports the module, which registers it) or when the recorded spec's entry
    point names the package; otherwise the error says how to name it."""
    return _make(env_spec_from_metadata(metadata), metadata)


def make_vector_env(metadata: dict, num_envs: int) -> gym.vector.VectorEnv:
    spec = env_spec_from_metadata(metadata)
    # SyncVectorEnv: on 2 cores AsyncVectorEnv's process overhead made it slower when measured.
    return gym.vector.SyncVectorEnv([lambda: _make(spec, metadata) for _ in range(num_envs)])


def _make(spec, metadata: dict) -> gym.Env:
    try:
        return offrl_envs.make(spec)
    except (gym.error.UnregisteredEnv, ModuleNotFoundError) as exc:
        from offrl.errors import DatasetError

        name = spec if isinstance(spec, str) else spec.id
        raise DatasetError(metadata.get("name", "dataset"), f"cannot make evaluation env '{name}': {exc} An env "
                           "registered by another package is named 'module:EnvId' (e.g. --data.env-id "
                           "gymnasium_robotics:AdroitHandDoor-v1); install that package first") from None


def reachable_modules(obj: Any, depth: int = 4) -> list[torch.nn.Module]:
    """The top-level `nn.Module`s a policy can reach: the policy itself, the object a bound method
    belongs to, a closure's or partial's captured values, and (recursively, `depth` levels) the
    attributes, lists and dicts of plain objects. A module's own submodules are not listed: `eval()`
    of the module covers them."""
    found: dict[int, torch.nn.Module] = {}
    seen: set[int] = set()

    def visit(x: Any, level: int) -> None:
        if id(x) in seen or level < 0 or x is None or isinstance(x, (str, bytes, int, float, bool, torch.Tensor)):
            return
        seen.add(id(x))
        if isinstance(x, torch.nn.Module):
            found.setdefault(id(x), x)
            return
        if hasattr(x, "__self__") and hasattr(x, "__func__"):  # a bound method
            visit(x.__self__, level)
            return
        if isinstance(x, functools.partial):
            for item in (x.func, *x.args, *x.keywords.values()):
                visit(item, level - 1)
            return
        if callable(x) and getattr(x, "__closure__", None):
            for cell in x.__closure__:
                with contextlib.suppress(ValueError):  # an empty cell
                    visit(cell.cell_contents, level - 1)
        if isinstance(x, dict):
            items = list(x.values())
        elif isinstance(x, (list, tuple, set)):
            items = list(x)
        else:
            items = list(getattr(x, "__dict__", {}).values())
        for item in items:
            visit(item, level - 1)

    visit(obj, depth)
    return list(found.values())


@contextlib.contextmanager
def eval_mode(*objects: Any) -> Iterator[None]:
    """Put every module `objects` reach (see `reachable_modules`) in eval mode (dropout off, batch
    norm on running statistics) and restore each submodule's own training flag afterwards."""
    modules = [m for obj in objects for m in reachable_modules(obj)]
    flags = [(sub, sub.training) for module in modules for sub in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for sub, training in flags:
            sub.training = training


@dataclass
class EvalResult:
    returns: np.ndarray
    lengths: np.ndarray
    normalized: np.ndarray | None

    def split(self, parts: int) -> list["EvalResult"]:
        """Equal consecutive parts (the episodes of several seeds run in one vector env)."""
        pieces = [np.split(x, parts) if x is not None else [None] * parts for x in (self.returns, self.lengths, self.normalized)]
        return [EvalResult(*p) for p in zip(*pieces)]

    def summary(self) -> dict[str, float]:
        out = {"eval/return_mean": float(self.returns.mean()), "eval/return_std": float(self.returns.std()),
               "eval/length_mean": float(self.lengths.mean())}
        if self.normalized is not None:
            out["eval/normalized_score"] = float(self.normalized.mean())
            out["eval/normalized_score_std"] = float(self.normalized.std())
        return out


@torch.no_grad()
def evaluate(policy: Callable[[torch.Tensor], torch.Tensor], metadata: dict, episodes: int = 10, seed: int = 0,
             device: torch.device | str = "cpu", envs: gym.vector.VectorEnv | None = None,
             reset_seeds: list[int] | None = None) -> EvalResult:
    """Run `episodes` episodes in parallel, env i reset with seed + i (or reset_seeds[i]); `policy` maps a float32 batch
    of observations [n, obs_dim] on `device` to actions [n, act_dim] (clipped to the action space; a NaN/inf
    action is an OffrlError, since an env may step and score it anyway).

    A stateful policy (Decision Transformer, RCSL) may also have `reset(n)`, called before the
    episodes, and `observe(rewards)`, called after every step with the rewards [n] on `device`.
    Every module the policy reaches runs in eval mode (no dropout) and gets its training flags back
    afterwards."""
    with eval_mode(policy):
        return _evaluate(policy, metadata, episodes, seed, device, envs, reset_seeds)


def _evaluate(policy, metadata, episodes, seed, device, envs, reset_seeds=None) -> EvalResult:
    own_envs = envs is None
    envs = envs or make_vector_env(metadata, episodes)
    if envs.num_envs != episodes:
        raise ValueError(f"vector env has {envs.num_envs} envs for {episodes} episodes")
    low, high = envs.single_action_space.low, envs.single_action_space.high
    if hasattr(policy, "reset"):
        policy.reset(episodes)
    try:
        if reset_seeds is not None and len(reset_seeds) != episodes:
            raise ValueError(f"{len(reset_seeds)} reset seeds for {episodes} episodes")
        obs, _ = envs.reset(seed=list(reset_seeds) if reset_seeds is not None else [seed + i for i in range(episodes)])
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device).reshape(episodes, -1)
            actions = policy(obs_t).reshape(episodes, -1).cpu().numpy()
            if not np.isfinite(actions[running]).all():  # clipped, NaN stays NaN; the env may score it anyway
                bad = np.flatnonzero(running & ~np.isfinite(actions).all(axis=1)).tolist()
                raise OffrlError(f"the policy's actions are not finite (NaN/inf) in evaluation episodes {bad} at "
                                 f"step {int(lengths.max())}: its weights or its input normalization")
            obs, rewards, terminated, truncated, _ = envs.step(np.clip(actions, low, high))
            if hasattr(policy, "observe"):
                policy.observe(torch.as_tensor(rewards, dtype=torch.float32, device=device))
            returns += np.where(running, rewards, 0.0)
            lengths += running
            running &= ~(terminated | truncated)
    finally:
        if own_envs:
            envs.close()
    normalized = scores.normalized_score(returns, metadata.get("ref_min_score"), metadata.get("ref_max_score"))
    return EvalResult(returns, lengths, normalized)
