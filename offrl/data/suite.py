"""Datasets the project makes itself, written as real local Minari datasets.

`write_minari_dataset` builds a dataset under a temporary Minari root and moves the finished folder
into place, so a failed or interrupted write never leaves a half-written dataset behind (one of those
makes `minari.list_local_datasets()` crash). The checksum stored in the metadata is computed from
the dataset as `load_minari` reads it back, so `verify` can compare regenerations exactly.

`RECIPES` maps each makeable id to the function that makes it; the tiny dataset for tests and the
quickstart is `offrl/tiny-v0`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from offrl.errors import DatasetError


@dataclass
class Episode:
    observations: np.ndarray  # [T + 1, obs_dim]
    actions: np.ndarray  # [T, act_dim]
    rewards: np.ndarray  # [T]
    terminations: np.ndarray  # [T] bool
    truncations: np.ndarray  # [T] bool
    seed: int | None = None

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class MadeDataset:
    episodes: list[Episode]
    env_spec: object  # gymnasium EnvSpec
    ref_min_score: float
    ref_max_score: float
    description: str
    algorithm_name: str
    info: dict = field(default_factory=dict)


def datasets_root() -> Path:
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def local_path(dataset_id: str) -> Path:
    return datasets_root() / dataset_id


def exists(dataset_id: str) -> bool:
    return (local_path(dataset_id) / "data" / "metadata.json").exists()


@contextlib.contextmanager
def _minari_root(path: Path):
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def write_minari_dataset(dataset_id: str, made: MadeDataset, overwrite: bool = False) -> str:
    """Write episodes as a local Minari dataset (hdf5 format); return the dataset's checksum."""
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    from offrl.data.sources import load_minari

    final = local_path(dataset_id)
    if exists(dataset_id) and not overwrite:
        raise DatasetError(dataset_id, f"already exists at {final} (use --force to replace it)")
    root = datasets_root()
    root.mkdir(parents=True, exist_ok=True)
    buffers = [
        EpisodeBuffer(id=i, seed=ep.seed, observations=np.asarray(ep.observations),
                      actions=np.asarray(ep.actions), rewards=list(map(float, ep.rewards)),
                      terminations=list(map(bool, ep.terminations)), truncations=list(map(bool, ep.truncations)))
        for i, ep in enumerate(made.episodes)
    ]
    with tempfile.TemporaryDirectory(dir=root, prefix=".tmp-") as tmp:
        with _minari_root(Path(tmp)):
            mdata = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=made.env_spec, eval_env=made.env_spec,
                algorithm_name=made.algorithm_name, author="offrl", author_email="offrl@users.noreply.invalid",
                code_permalink="offrl/data/suite.py", ref_min_score=float(made.ref_min_score),
                ref_max_score=float(made.ref_max_score), description=made.description, data_format="hdf5",
            )
            checksum = load_minari(dataset_id).checksum()
            mdata.storage.update_metadata({"offrl": json.dumps({**made.info, "checksum": checksum})})
        staged = Path(tmp) / dataset_id
        final.parent.mkdir(parents=True, exist_ok=True)
        namespace_file = Path(tmp) / dataset_id.split("/")[0] / "namespace_metadata.json"
        if "/" in dataset_id and namespace_file.exists() and not (root / dataset_id.split("/")[0] / namespace_file.name).exists():
            shutil.copy(namespace_file, root / dataset_id.split("/")[0] / namespace_file.name)
        old = None
        if final.exists():
            old = final.with_name(f".old-{final.name}-{os.getpid()}")
            final.rename(old)
        staged.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return checksum


# ------------------------------------------------------------------------------- the tiny dataset
TINY_ENV = "InvertedPendulum-v5"
TINY_MAX_STEPS = 200
TINY_GAINS = np.array([1.0, 10.0, 1.0, 1.0])  # linear state feedback that balances the pole
TINY_NOISE = (0.5, 1.0, 1.5)  # per-episode action-noise std, cycled: mixes terminated and truncated episodes


def make_tiny(seed: int = 0, transitions: int = 10_000) -> MadeDataset:
    """InvertedPendulum-v5 (200-step limit) under a noisy linear controller, about 10k transitions.

    Actions: clip(K @ obs + sigma * N(0, 1), -3, 3) with sigma cycling through 0.5, 1.0, 1.5 per
    episode; resets seeded seed, seed + 1, ...; the last episode is cut at `transitions` rows."""
    import gymnasium as gym

    env = gym.make(TINY_ENV, max_episode_steps=TINY_MAX_STEPS)
    rng = np.random.default_rng(seed)
    episodes, total, index = [], 0, 0
    while total < transitions:
        noise = TINY_NOISE[index % len(TINY_NOISE)]
        episode = rollout(env, lambda o: np.clip(TINY_GAINS @ o + noise * rng.standard_normal(1), -3.0, 3.0),
                          seed=seed + index, max_steps=transitions - total)
        episodes.append(episode)
        total += len(episode)
        index += 1
    ref_min = float(np.mean([rollout(env, lambda o: env.action_space.sample(), seed=10_000 + i).rewards.sum()
                             for i in range(100)]))
    ref_max = float(np.mean([rollout(env, lambda o: np.clip(TINY_GAINS @ o, -3.0, 3.0).reshape(1), seed=20_000 + i).rewards.sum()
                             for i in range(100)]))
    env.close()
    return MadeDataset(
        episodes=episodes, env_spec=env.spec, ref_min_score=ref_min, ref_max_score=ref_max,
        algorithm_name="noisy-linear-controller",
        description=("offrl tiny test dataset: InvertedPendulum-v5 with a 200-step limit, a linear controller "
                     f"K={TINY_GAINS.tolist()} with Gaussian action noise std cycling {list(TINY_NOISE)} per episode. "
                     "ref_min: uniform random policy, 100 episodes; ref_max: the noise-free controller, 100 episodes."),
        info={"recipe": "tiny", "seed": seed, "transitions": transitions},
    )


def rollout(env, policy: Callable[[np.ndarray], np.ndarray], seed: int, max_steps: int | None = None) -> Episode:
    """One episode in a single env; stops early (truncated) after `max_steps`."""
    obs, _ = env.reset(seed=seed)
    if seed is not None:
        env.action_space.seed(seed)
    observations, actions, rewards, terms, truncs = [obs], [], [], [], []
    while True:
        action = np.asarray(policy(obs), dtype=np.float32).reshape(env.action_space.shape)
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
        terms.append(terminated)
        cut = max_steps is not None and len(actions) >= max_steps
        truncs.append(truncated or (cut and not terminated))
        if terminated or truncated or cut:
            break
    return Episode(np.asarray(observations), np.asarray(actions), np.asarray(rewards, dtype=np.float64),
                   np.asarray(terms), np.asarray(truncs), seed)


RECIPES: dict[str, Callable[[], MadeDataset]] = {"offrl/tiny-v0": make_tiny}


def make(dataset_id: str, overwrite: bool = False) -> dict:
    """Make a registered dataset; returns its id, checksum and generation time in seconds."""
    if dataset_id not in RECIPES:
        raise DatasetError(dataset_id, f"no recipe to make it (known: {', '.join(sorted(RECIPES))})")
    start = time.perf_counter()
    made = RECIPES[dataset_id]()
    checksum = write_minari_dataset(dataset_id, made, overwrite=overwrite)
    return {"id": dataset_id, "checksum": checksum, "seconds": time.perf_counter() - start,
            "episodes": len(made.episodes), "transitions": int(sum(len(e) for e in made.episodes))}


def ensure(dataset_id: str) -> None:
    """Make a registered dataset when it is not on disk yet."""
    if dataset_id in RECIPES and not exists(dataset_id):
        make(dataset_id)
