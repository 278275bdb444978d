"""Loaders: a local Minari dataset id, a D4RL-format `.hdf5` file, an offrl `.npz` file.

Every loader returns a validated `Dataset` with metadata `name`, `source`, `env_id`, `env_spec`
(Gymnasium spec JSON, when known), `ref_min_score`, `ref_max_score`, `ref_source` and `checksum`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from offrl import scores
from offrl.data.dataset import (
    ARRAY_FIELDS,
    Dataset,
    check_finite,
    close_open_episodes,
    episode_starts_from_flags,
)
from offrl.errors import DatasetError

FILE_SUFFIXES = (".hdf5", ".h5", ".npz")


def is_file_source(source: str) -> bool:
    return source.endswith(FILE_SUFFIXES) or os.path.sep in source and os.path.exists(source)


def load_dataset(source: str, env_id: str | None = None, download: bool = False,
                 ref_min_score: float | None = None, ref_max_score: float | None = None,
                 d4rl_trajectories: bool = False) -> Dataset:
    """Load by Minari id or by path (`.hdf5`/`.h5` = D4RL format, `.npz` = offrl format).

    `env_id` overrides (or supplies, for files that lack it) the evaluation environment;
    `ref_min_score` / `ref_max_score` override (or supply) the reference returns of normalized scores;
    `d4rl_trajectories` reads a D4RL file's rows as recorded (see `load_d4rl_hdf5`)."""
    if is_file_source(source):
        path = Path(source)
        if not path.exists():
            raise DatasetError(source, "file not found")
        if not path.is_file():
            raise DatasetError(source, "not a file")
        dataset = load_npz(path) if path.suffix == ".npz" else load_d4rl_hdf5(path, env_id, trajectories=d4rl_trajectories)
    else:
        dataset = load_minari(source, download=download)
    if env_id:
        dataset.metadata["env_id"] = env_id
        if dataset.metadata.get("env_spec") and json.loads(dataset.metadata["env_spec"]).get("id") != env_id:
            dataset.metadata["env_spec"] = None
    set_reference_scores(dataset.metadata, ref_min_score, ref_max_score, source)
    dataset.metadata["checksum"] = dataset.checksum()
    return dataset


def set_reference_scores(metadata: dict, ref_min: float | None, ref_max: float | None, source: str) -> None:
    """Override the reference returns given by the user (--data.ref-min-score / --data.ref-max-score)."""
    if ref_min is None and ref_max is None:
        return
    given = [name for name, value in (("--data.ref-min-score", ref_min), ("--data.ref-max-score", ref_max)) if value is not None]
    if ref_min is not None:
        metadata["ref_min_score"] = float(ref_min)
    if ref_max is not None:
        metadata["ref_max_score"] = float(ref_max)
    low, high = metadata.get("ref_min_score"), metadata.get("ref_max_score")
    if low is None or high is None:
        raise DatasetError(source, f"{' and '.join(given)} given, but the dataset has no "
                           f"{'ref_max_score' if high is None else 'ref_min_score'}: pass both reference scores")
    if not np.isfinite([low, high]).all() or high <= low:
        raise DatasetError(source, f"reference scores must be finite with max > min (min {low}, max {high})")
    metadata["ref_source"] = f"user ({', '.join(given)})" + (f"; before: {metadata['ref_source']}" if metadata.get("ref_source") else "")


def missing_reference_scores(metadata: dict) -> str | None:
    """A warning to show when the data has no reference returns (no normalized scores), else None."""
    if metadata.get("ref_min_score") is not None and metadata.get("ref_max_score") is not None:
        return None
    return ("no reference scores (ref_min_score/ref_max_score): runs report raw returns, not normalized scores, and "
            "DT needs --target-return; pass --data.ref-min-score and --data.ref-max-score (random and expert returns)")


# ---------------------------------------------------------------------------------------- Minari
def load_minari(dataset_id: str, download: bool = False) -> Dataset:
    """Build transitions per episode: s = obs[:-1], s' = obs[1:], terminal = terminations,
    timeout = truncations (bootstrapped). Every episode's lengths are checked."""
    import minari

    if download:
        os.environ.setdefault("HF_HUB_OFFLINE", "0")
    try:
        mdata = minari.load_dataset(dataset_id, download=download)
    except FileNotFoundError:
        local = ", ".join(sorted(minari.list_local_datasets())) or "none"
        raise DatasetError(dataset_id, f"no local Minari dataset with this id (local: {local}); "
                           "make one with `offrl datasets make`, or pass --data.download to fetch it") from None
    except Exception as exc:  # minari raises many kinds for corrupt folders and failed downloads
        raise DatasetError(dataset_id, f"cannot load Minari dataset: {type(exc).__name__}: {exc}") from None

    import gymnasium as gym

    if not isinstance(mdata.observation_space, gym.spaces.Box) or not isinstance(mdata.action_space, gym.spaces.Box):
        raise DatasetError(dataset_id, "only Box observation and action spaces are supported "
                           f"(got {type(mdata.observation_space).__name__}, {type(mdata.action_space).__name__})")
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ARRAY_FIELDS}
    starts, row = [], 0
    for episode in mdata.iterate_episodes():
        obs = np.asarray(episode.observations, dtype=np.float32).reshape(len(episode.observations), -1)
        actions = np.asarray(episode.actions, dtype=np.float32).reshape(len(episode.actions), -1)
        steps = len(actions)
        for name, value in (("observations", obs[:-1]), ("rewards", episode.rewards),
                            ("terminations", episode.terminations), ("truncations", episode.truncations)):
            if len(value) != steps:
                raise DatasetError(dataset_id, f"episode {episode.id}: {len(value)} entries for {steps} actions "
                                   "(Minari stores T+1 observations for T actions)", name)
        starts.append(row)
        row += steps
        columns["observations"].append(obs[:-1])
        columns["next_observations"].append(obs[1:])
        columns["actions"].append(actions)
        columns["rewards"].append(np.asarray(episode.rewards, dtype=np.float32))
        columns["terminals"].append(np.asarray(episode.terminations, dtype=np.float32))
        columns["timeouts"].append(np.asarray(episode.truncations, dtype=np.float32))
    if not starts:
        raise DatasetError(dataset_id, "the dataset has no episodes")
    arrays = {k: np.concatenate(v) for k, v in columns.items()}
    meta = mdata.storage.metadata
    spec = getattr(mdata, "_eval_env_spec", None) or mdata.spec.env_spec
    metadata = {
        "name": dataset_id,
        "source": f"minari:{dataset_id}",
        "env_id": spec.id if spec is not None else None,
        "env_spec": spec.to_json() if spec is not None else None,
        "ref_min_score": _float_or_none(meta.get("ref_min_score")),
        "ref_max_score": _float_or_none(meta.get("ref_max_score")),
        "ref_source": "dataset metadata" if meta.get("ref_max_score") is not None else None,
        "description": meta.get("description"),
        "stored_checksum": _offrl_metadata(meta).get("checksum"),
        "offrl": _offrl_metadata(meta),
    }
    dataset = Dataset(**arrays, episode_starts=np.asarray(starts, np.int64), metadata=metadata)
    # Episodes that end with neither flag (a recording stopped early) are cut: bootstrap them.
    dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    return dataset.validate(dataset_id)


def _offrl_metadata(meta: dict) -> dict:
    raw = meta.get("offrl")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


# ------------------------------------------------------------------------------------- D4RL hdf5
D4RL_REQUIRED = ("observations", "actions", "rewards", "terminals")


def load_d4rl_hdf5(path: Path, env_id: str | None = None, max_episode_steps: int = 1000,
                   trajectories: bool = False) -> Dataset:
    """D4RL `qlearning_dataset` semantics (FACTS.md section 0), with OfflineRL-Kit's fix:

    - rows i = 0..N-2; s' = next_observations[i] when the file has it, else observations[i+1];
    - rows with timeouts[i] = 1 are dropped (their s' is the next episode's first state in files
      without next_observations); without a `timeouts` key a row is final, and dropped, when its
      in-episode step counter reaches max_episode_steps - 1. The counter follows D4RL's loop: it is
      reset to 0 at a final row, and at a terminal row reset to 0 and then incremented like every
      kept row, so the row after a terminal counts as step 1;
    - terminals pass through as the no-bootstrap flag.
    Episodes split after terminals and dropped timeout rows; their last kept row gets timeout = 1
    when they did not terminate (so they are bootstrapped, as D4RL does by never marking them done).

    `trajectories=True` (sequence models: DT, RCSL) reads the file as recorded instead, as the DT and
    RvS references do (`download_d4rl_datasets.py`): every row is kept, an episode ends at a terminal
    or a final row (for files without timeouts, qlearning_dataset's step counter; DT's script counts
    the row after a final row as step 1, as after a terminal), and the final row keeps its
    action and reward. s' is next_observations[i] when the file has it, else observations[i+1] inside
    an episode; for an episode's last row in a file without next_observations it is unknown and set
    to s itself (sequence models do not read s'). A trailing unfinished episode is kept as cut (DT's
    script drops it).
    """
    import h5py

    source = str(path)
    try:
        with h5py.File(path, "r") as f:
            keys = set(f.keys())
            for key in D4RL_REQUIRED:
                if key not in keys:
                    raise DatasetError(source, f"missing key (the file has: {', '.join(sorted(keys)) or 'no keys'})", key)
            raw = {k: np.asarray(f[k][()]) for k in (*D4RL_REQUIRED, "timeouts", "next_observations") if k in keys}
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
    except DatasetError:
        raise
    except Exception as exc:  # h5py raises OSError for non-HDF5 or truncated files
        raise DatasetError(source, f"cannot read file as HDF5: {exc}") from None

    n = len(raw["rewards"])
    obs = _as_2d(raw["observations"], "observations", source)
    actions = _as_2d(raw["actions"], "actions", source)
    for key, value in raw.items():
        if len(value) != n:
            raise DatasetError(source, f"length {len(value)} does not match rewards' length {n}", key)
        check_finite(np.asarray(value, dtype=np.float64) if value.dtype.kind in "biu" else value, key, source)
    if n < 2:
        raise DatasetError(source, "needs at least 2 rows", "rewards")
    terminals = raw["terminals"].astype(np.float32).reshape(-1)
    rewards = raw["rewards"].astype(np.float32).reshape(-1)
    if "timeouts" in raw:
        timeouts = raw["timeouts"].astype(bool).reshape(-1)
    else:
        timeouts = final_rows_by_step_count(terminals, max_episode_steps)
    has_next = "next_observations" in raw
    next_obs = _as_2d(raw["next_observations"], "next_observations", source) if has_next else np.roll(obs, -1, axis=0)
    if trajectories:
        dataset = _recorded_trajectories(obs, actions, rewards, next_obs, terminals, timeouts, has_next)
        dataset.metadata = _file_metadata(path, attrs, env_id, fmt="d4rl-hdf5")
        dataset.metadata["rows"] = "trajectories"
        return dataset.validate(source)

    keep = np.arange(n - 1)
    keep = keep[~timeouts[keep]]
    # A kept row ends its episode when it is terminal, or when the next original row was a dropped
    # timeout row, or (with next_observations) when the next row does not continue from its s'.
    ends = terminals[keep] > 0
    ends |= timeouts[keep + 1]
    if has_next:
        ends |= np.linalg.norm(obs[keep + 1] - next_obs[keep], axis=1) > 1e-6
    kept_ends = ends.copy()
    new_timeouts = (kept_ends & (terminals[keep] == 0)).astype(np.float32)
    starts = np.concatenate([[0], np.flatnonzero(kept_ends[:-1]) + 1]).astype(np.int64)
    dataset = Dataset(
        observations=obs[keep].astype(np.float32),
        actions=actions[keep].astype(np.float32),
        rewards=rewards[keep],
        next_observations=next_obs[keep].astype(np.float32),
        terminals=terminals[keep],
        timeouts=new_timeouts,
        episode_starts=starts,
    )
    dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    dataset.metadata = _file_metadata(path, attrs, env_id, fmt="d4rl-hdf5")
    return dataset.validate(source)


def final_rows_by_step_count(terminals: np.ndarray, max_episode_steps: int) -> np.ndarray:
    """D4RL's final-row rule for files without `timeouts` (`qlearning_dataset`'s loop, transcribed):

        for i: final = step == max_episode_steps - 1
               if final: step = 0; continue         (the row is dropped)
               if terminal: step = 0
               step += 1
    """
    final = np.zeros(len(terminals), dtype=bool)
    step = 0
    for i in range(len(terminals)):
        if step == max_episode_steps - 1:
            final[i], step = True, 0
            continue
        if terminals[i]:
            step = 0
        step += 1
    return final


def _recorded_trajectories(obs, actions, rewards, next_obs, terminals, timeouts, has_next) -> Dataset:
    """Every row of a D4RL file, split into episodes after terminal and final rows."""
    n = len(rewards)
    ends = (terminals > 0) | timeouts
    starts = np.concatenate([[0], np.flatnonzero(ends[:-1]) + 1]).astype(np.int64)
    if not has_next:
        next_obs = next_obs.copy()
        next_obs[ends] = obs[ends]  # s' of an episode's last row is not in the file
        next_obs[n - 1] = obs[n - 1]
    new_timeouts = (ends & (terminals == 0)).astype(np.float32)
    dataset = Dataset(observations=obs.astype(np.float32), actions=actions.astype(np.float32), rewards=rewards,
                      next_observations=next_obs.astype(np.float32), terminals=terminals, timeouts=new_timeouts,
                      episode_starts=starts)
    dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    return dataset


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _as_2d(value: np.ndarray, name: str, source: str) -> np.ndarray:
    if value.ndim == 1:
        return value.reshape(-1, 1)
    if value.ndim != 2:
        raise DatasetError(source, f"expected shape [N, dim], got {value.shape}", name)
    return value


def _file_metadata(path: Path, attrs: dict, env_id: str | None, fmt: str) -> dict:
    """Env id and reference scores from the file's attributes, else from its name (D4RL table)."""
    metadata = {
        "name": path.stem,
        "source": f"{fmt}:{path}",
        "env_id": env_id or attrs.get("env_id"),
        "env_spec": attrs.get("env_spec"),
        "ref_min_score": _float_or_none(attrs.get("ref_min_score")),
        "ref_max_score": _float_or_none(attrs.get("ref_max_score")),
        "ref_source": "file attributes" if attrs.get("ref_max_score") is not None else None,
    }
    d4rl_env = scores.d4rl_env_from_name(path.stem) or scores.d4rl_env_from_name(str(metadata["env_id"] or ""))
    if d4rl_env is not None:
        metadata["d4rl_env"] = d4rl_env  # a D4RL locomotion file: published settings (e.g. DT's targets) apply
    if metadata["ref_max_score"] is None:
        if d4rl_env is not None:
            ref_min, ref_max = scores.D4RL_REF_SCORES[d4rl_env]
            metadata.update(ref_min_score=ref_min, ref_max_score=ref_max,
                            ref_source=f"D4RL table for '{d4rl_env}' (mujoco-py v2 envs)")
            metadata["env_id"] = metadata["env_id"] or scores.GYMNASIUM_ENV_FOR_D4RL[d4rl_env]
    return metadata


# ------------------------------------------------------------------------------------- offrl npz
def load_npz(path: Path) -> Dataset:
    """The offrl transition format written by `Dataset.save_npz`: all six arrays are required;
    `episode_starts` and `metadata_json` are optional (episodes are then split after terminal and
    timeout rows and where s' does not continue into the next row's s)."""
    source = str(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = set(f.files)
            for key in ARRAY_FIELDS:
                if key not in keys:
                    raise DatasetError(source, f"missing key (the file has: {', '.join(sorted(keys)) or 'no keys'})", key)
            raw = {k: f[k] for k in keys}
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(source, f"cannot read file as .npz: {exc}") from None
    arrays = {}
    for key in ARRAY_FIELDS:
        value = raw[key]
        if key in ("observations", "actions", "next_observations"):
            value = _as_2d(value, key, source)
        else:
            value = value.reshape(-1) if value.ndim == 2 and value.shape[1] == 1 else value
        if value.dtype.kind not in "fbiu":
            raise DatasetError(source, f"expected numbers, got dtype {value.dtype}", key)
        arrays[key] = value.astype(np.float32)
    metadata = json.loads(str(raw["metadata_json"])) if "metadata_json" in raw else {}
    dataset = Dataset(**arrays, episode_starts=np.zeros(1, np.int64), metadata=metadata)
    n = len(dataset.rewards)
    for key in ARRAY_FIELDS:
        if len(arrays[key]) != n:
            raise DatasetError(source, f"length {len(arrays[key])} does not match rewards' length {n}", key)
        check_finite(arrays[key], key, source)
    if "episode_starts" in raw:
        dataset.episode_starts = raw["episode_starts"].astype(np.int64).reshape(-1)
    else:
        dataset.episode_starts = episode_starts_from_flags(dataset.terminals, dataset.timeouts,
                                                           dataset.observations, dataset.next_observations)
        dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    file_meta = _file_metadata(path, metadata, None, fmt="npz")
    dataset.metadata = {**metadata, **{k: v for k, v in file_meta.items() if metadata.get(k) is None}}
    dataset.metadata["source"] = file_meta["source"]
    return dataset.validate(source)


def sanitize(name: str) -> str:
    """A dataset id or path as one folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name).stem if name.endswith(FILE_SUFFIXES) else name).strip("-")
