"""Loaders: a local Minari dataset id, a D4RL-format `.hdf5` file, an offrl `.npz` file.

Every loader returns a validated `Dataset` with metadata `name`, `source`, `env_id`, `env_spec`
(Gymnasium spec JSON, when known), `ref_min_score`, `ref_max_score`, `ref_source` and `checksum`.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from offrl import scores
from offrl.data.dataset import (
    ARRAY_FIELDS,
    FLAG_FIELDS,
    MATRIX_FIELDS,
    Dataset,
    as_column,
    as_matrix,
    check_dtype,
    close_open_episodes,
    describe,
    episode_starts_from_flags,
    to_float32,
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
        if dataset.metadata.get("env_spec") and _env_spec_id(dataset.metadata["env_spec"]) != env_id:
            dataset.metadata["env_spec"] = None
        d4rl_env = dataset.metadata.get("d4rl_env")
        if str(dataset.metadata.get("ref_source")).startswith("D4RL table") and not scores.is_d4rl_env(env_id, d4rl_env):
            # D4RL's references are returns in its v2 envs: not scores in another env (an npz named like D4RL)
            dataset.metadata.update(ref_min_score=None, ref_max_score=None, ref_source=None)
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
    if metadata.get("d4rl_env"):
        return (f"no reference scores: D4RL's table gives returns in its v2 envs, which offrl evaluates on "
                f"{scores.GYMNASIUM_ENV_FOR_D4RL[metadata['d4rl_env']]}; on {metadata.get('env_id')} runs report raw "
                "returns unless you pass --data.ref-min-score and --data.ref-max-score")
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
                           "make one with `offrl datasets make`, or fetch it from Minari's remote (--data.download; "
                           "world_models.train: --download)") from None
    except Exception as exc:  # minari raises many kinds for corrupt folders and failed downloads
        raise DatasetError(dataset_id, f"cannot load Minari dataset: {_reason(exc)}") from None

    import gymnasium as gym

    if not isinstance(mdata.observation_space, gym.spaces.Box) or not isinstance(mdata.action_space, gym.spaces.Box):
        raise DatasetError(dataset_id, "only Box observation and action spaces are supported "
                           f"(got {type(mdata.observation_space).__name__}, {type(mdata.action_space).__name__})")
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ARRAY_FIELDS}
    starts, row = [], 0
    spaces = {"observations": tuple(mdata.observation_space.shape), "actions": tuple(mdata.action_space.shape)}
    try:
        for episode in mdata.iterate_episodes():
            obs, actions, rewards, terminations, truncations = _minari_episode(episode, spaces, dataset_id)
            starts.append(row)
            row += len(actions)
            columns["observations"].append(obs[:-1])
            columns["next_observations"].append(obs[1:])
            columns["actions"].append(actions)
            columns["rewards"].append(rewards)
            columns["terminals"].append(terminations)
            columns["timeouts"].append(truncations)
    except DatasetError:
        raise
    except Exception as exc:  # minari's readers fail with KeyError, AssertionError, OSError, ... on damaged files
        _diagnose_minari_hdf5(mdata, dataset_id)  # names the episode and field when it can
        raise DatasetError(dataset_id, f"cannot read episode data: {_reason(exc)}") from None
    _check_minari_episode_count(mdata, dataset_id)
    if not starts:
        raise DatasetError(dataset_id, "the dataset has no episodes")
    meta = mdata.storage.metadata
    declared = meta.get("total_steps")
    if isinstance(declared, (int, np.integer)) and not isinstance(declared, bool) and declared != row:
        raise DatasetError(dataset_id, f"the metadata's total_steps is {declared}, but its episodes hold {row} steps",
                           "total_steps")
    arrays = {k: np.concatenate(v) for k, v in columns.items()}
    spec = getattr(mdata, "_eval_env_spec", None) or mdata.spec.env_spec
    metadata = {
        "name": dataset_id,
        "source": f"minari:{dataset_id}",
        "env_id": spec.id if spec is not None else None,
        "env_spec": spec.to_json() if spec is not None else None,
        "ref_min_score": _reference_score(meta.get("ref_min_score"), "ref_min_score", dataset_id),
        "ref_max_score": _reference_score(meta.get("ref_max_score"), "ref_max_score", dataset_id),
        "ref_source": "dataset metadata" if meta.get("ref_max_score") is not None else None,
        "description": meta.get("description"),
        "stored_checksum": _offrl_metadata(meta).get("checksum"),
        "offrl": _offrl_metadata(meta),
    }
    _check_reference_order(metadata, dataset_id)
    dataset = Dataset(**arrays, episode_starts=np.asarray(starts, np.int64), metadata=metadata)
    # Episodes that end with neither flag (a recording stopped early) are cut: bootstrap them.
    dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    return dataset.validate(dataset_id)


MINARI_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


def _minari_episode(episode, spaces: dict[str, tuple], dataset_id: str) -> tuple[np.ndarray, ...]:
    """One episode's observations [T+1, obs_dim], actions [T, act_dim], rewards, terminations and
    truncations [T] as float32, checked: numbers only, the shapes the dataset's spaces give, T + 1
    observations for T actions, T >= 1, finite values within float32, 0/1 flags on the last step only."""
    import h5py

    where = f"episode {episode.id}: "
    values = {}
    for name in MINARI_KEYS:
        value = getattr(episode, name)
        if isinstance(value, h5py.Empty):
            raise DatasetError(dataset_id, f"{where}holds no data (an empty HDF5 dataset)", name)
        value = np.asarray(value)
        check_dtype(value, name, dataset_id, flags=name in ("terminations", "truncations"), where=where)
        values[name] = value
    for name, shape in spaces.items():
        value = values[name]
        if value.ndim == 0 or value.shape[1:] != shape:
            rows = "T + 1" if name == "observations" else "T"
            raise DatasetError(dataset_id, f"{where}shape {value.shape} does not match the dataset's {name[:-1]} "
                               f"space: expected [{rows}, {', '.join(map(str, shape))}]", name)
    for name in ("rewards", "terminations", "truncations"):
        values[name] = as_column(values[name], name, dataset_id, where=where)
    steps = len(values["actions"])
    if len(values["observations"]) != steps + 1:
        raise DatasetError(dataset_id, f"{where}length {len(values['observations'])} for {steps} actions (Minari "
                           "stores T + 1 observations for T actions)", "observations")
    for name in ("rewards", "terminations", "truncations"):
        if len(values[name]) != steps:
            raise DatasetError(dataset_id, f"{where}length {len(values[name])} does not match its {steps} actions", name)
    if steps == 0:
        raise DatasetError(dataset_id, f"{where}the episode has no steps (one observation, no actions)", "actions")
    out = {}
    for name in MINARI_KEYS:
        flags = name in ("terminations", "truncations")
        value = to_float32(values[name], name, dataset_id, flags=flags, where=where)
        if flags and value[:-1].any():
            step = int(np.argmax(value[:-1] > 0))
            raise DatasetError(dataset_id, f"{where}step {step} of {steps} ends the episode in the middle (only an "
                               f"episode's last step can be a {name[:-1]})", name)
        out[name] = value.reshape(len(value), -1) if name in ("observations", "actions") else value
    return tuple(out[name] for name in MINARI_KEYS)


def _minari_hdf5_file(mdata) -> Path | None:
    storage = mdata.storage
    path = getattr(storage, "_file_path", None)
    return Path(path) if getattr(storage, "FORMAT", None) == "hdf5" and path is not None else None


def _diagnose_minari_hdf5(mdata, dataset_id: str) -> None:
    """After minari failed to read an hdf5-format dataset: raise a DatasetError naming the missing or
    unreadable episode and field, if the file shows one."""
    import h5py

    path = _minari_hdf5_file(mdata)
    if path is None:
        return
    try:
        with h5py.File(path, "r") as f:
            for index in range(int(mdata.total_episodes)):
                group = f.get(f"episode_{index}")
                if not isinstance(group, h5py.Group):
                    raise DatasetError(dataset_id, f"episode {index} is missing from {path.name} (the metadata lists "
                                       f"{mdata.total_episodes} episodes)")
                for key in MINARI_KEYS:
                    node = group.get(key)
                    where = f"episode {index}: "
                    if node is None:
                        raise DatasetError(dataset_id, f"{where}missing key (the episode has: "
                                           f"{', '.join(sorted(group.keys())) or 'no keys'})", key)
                    if not isinstance(node, h5py.Dataset):
                        raise DatasetError(dataset_id, f"{where}expected an array, got an HDF5 {_h5_kind(node)}", key)
                    if node.shape is None:
                        raise DatasetError(dataset_id, f"{where}holds no data (an empty HDF5 dataset)", key)
                    if node.ndim == 0:
                        raise DatasetError(dataset_id, f"{where}expected one entry per step, got a scalar (shape ())", key)
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(dataset_id, f"cannot read {path}: {_reason(exc)}") from None


def _check_minari_episode_count(mdata, dataset_id: str) -> None:
    """An hdf5-format dataset's file holds exactly the episodes its metadata lists (minari would
    silently skip the others)."""
    import h5py

    path = _minari_hdf5_file(mdata)
    if path is None:
        return
    try:
        with h5py.File(path, "r") as f:
            found = sum(1 for key in f.keys() if re.fullmatch(r"episode_\d+", key))
    except Exception as exc:
        raise DatasetError(dataset_id, f"cannot read {path}: {_reason(exc)}") from None
    if found != mdata.total_episodes:
        raise DatasetError(dataset_id, f"{path.name} holds {found} episodes, but the metadata lists "
                           f"{mdata.total_episodes} (total_episodes)")


def _h5_kind(node) -> str:
    import h5py

    return "group" if isinstance(node, h5py.Group) else type(node).__name__


def _offrl_metadata(meta: dict) -> dict:
    raw = meta.get("offrl")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _reference_score(value: Any, key: str, source: str) -> float | None:
    """A reference return from a file's metadata: None, or a finite number."""
    if value is None:
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DatasetError(source, f"expected a number, got {value!r}", key) from None
    if not math.isfinite(score):
        raise DatasetError(source, f"must be a finite number, got {score}", key)
    return score


def _check_reference_order(metadata: dict, source: str) -> None:
    low, high = metadata.get("ref_min_score"), metadata.get("ref_max_score")
    # Equal scores leave the normalized score undefined. A max below the min is kept: the suite's makers
    # record what their policies returned, and an env whose "expert" scores below random is data, not damage.
    if low is not None and high is not None and high == low:
        raise DatasetError(source, f"ref_max_score {high} must differ from ref_min_score {low} "
                           "(normalized score = 100 * (return - min) / (max - min))", "ref_max_score")


def _reason(exc: BaseException) -> str:
    """An exception as one short line for a DatasetError message (the CLI prints errors as one line)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _env_spec_id(spec: Any) -> str | None:
    return (json.loads(spec) if isinstance(spec, str) else spec).get("id")


# ------------------------------------------------------------------------------------- D4RL hdf5
D4RL_REQUIRED = ("observations", "actions", "rewards", "terminals")

NEXT_ROW = "next row"
"""metadata["next_observations"] of D4RL transitions without next_observations: s' is the next row's s."""
UNKNOWN_AT_EPISODE_ENDS = "unknown at episode ends"
"""metadata["next_observations"] of recorded D4RL trajectories without next_observations: s' = s on each
episode's last row."""


def load_d4rl_hdf5(path: Path, env_id: str | None = None, max_episode_steps: int = 1000,
                   trajectories: bool = False) -> Dataset:
    """D4RL `qlearning_dataset` semantics (docs/FACTS.md section 0), with OfflineRL-Kit's fix:

    - rows i = 0..N-2; s' = next_observations[i] when the file has it, else observations[i+1];
    - rows with timeouts[i] = 1 are dropped (their s' is the next episode's first state in files
      without next_observations); without a `timeouts` key a row is final, and dropped, when its
      in-episode step counter reaches max_episode_steps - 1. The counter follows D4RL's loop: it is
      reset to 0 at a final row, and at a terminal row reset to 0 and then incremented like every
      kept row, so the row after a terminal counts as step 1;
    - terminals pass through as the no-bootstrap flag.
    Episodes split after terminals and dropped timeout rows, and, in a file with next_observations, where
    the next row's s is not this row's s' (D4RL's loop never splits there: s' is always the next row's s);
    their last kept row gets timeout = 1 when they did not terminate (so they are bootstrapped, as D4RL does
    by never marking them done). Episode boundaries matter for the return range, %BC and return weighting.
    `load_dataset` leaves `max_episode_steps` at 1000, the locomotion envs' limit; D4RL reads the env's
    own (`env._max_episode_steps`), so a file without timeouts from an env of another limit needs this
    function called with it.

    `trajectories=True` (sequence models: DT, RCSL) reads the file as recorded instead, as the DT and
    RvS references do (`download_d4rl_datasets.py`): every row is kept, an episode ends at a terminal
    or a final row (for files without timeouts, qlearning_dataset's step counter; DT's script counts
    the row after a final row as step 1, as after a terminal), and the final row keeps its
    action and reward. s' is next_observations[i] when the file has it, else observations[i+1] inside
    an episode; for an episode's last row in a file without next_observations it is unknown and set
    to s itself (sequence models do not read s'; metadata "next_observations" then says so, and the
    transition buffer of an algorithm that reads s' refuses such data). A trailing unfinished episode is
    kept as cut (DT's script drops it).
    """
    import h5py

    source = str(path)
    try:
        with h5py.File(path, "r") as f:
            keys = set(f.keys())
            for key in D4RL_REQUIRED:
                if key not in keys:
                    raise DatasetError(source, f"missing key (the file has: {', '.join(sorted(keys)) or 'no keys'})", key)
            raw = {k: _read_h5_array(f[k], k, source) for k in (*D4RL_REQUIRED, "timeouts", "next_observations") if k in keys}
            attrs = {k: _attr(v) for k, v in f.attrs.items()}
    except DatasetError:
        raise
    except Exception as exc:  # h5py raises OSError for non-HDF5 or truncated files
        raise DatasetError(source, f"cannot read file as HDF5: {_reason(exc)}") from None

    raw = _checked_columns(raw, source)
    n = len(raw["rewards"])
    if n < 2:
        raise DatasetError(source, "needs at least 2 rows", "rewards")
    obs, actions, rewards, terminals = raw["observations"], raw["actions"], raw["rewards"], raw["terminals"]
    if "timeouts" in raw:
        timeouts = raw["timeouts"] > 0
    else:
        timeouts = final_rows_by_step_count(terminals, max_episode_steps)
    has_next = "next_observations" in raw
    next_obs = raw["next_observations"] if has_next else np.roll(obs, -1, axis=0)
    if trajectories:
        dataset = _recorded_trajectories(obs, actions, rewards, next_obs, terminals, timeouts, has_next)
        dataset.metadata = _file_metadata(path, attrs, env_id, fmt="d4rl-hdf5")
        dataset.metadata["rows"] = "trajectories"
        if not has_next:  # each episode's last row has s' = s (TrainingData.buffer and model_rows read this)
            dataset.metadata["next_observations"] = UNKNOWN_AT_EPISODE_ENDS
        return dataset.validate(source)

    keep = np.arange(n - 1)
    keep = keep[~timeouts[keep]]
    if len(keep) == 0:
        raise DatasetError(source, "no transitions left: qlearning_dataset's rows drop the last row and every "
                           "time-out row, and that is every row of this file", "timeouts")
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
    if not has_next:
        # s' is the next row's s, as D4RL's qlearning_dataset makes it: on a terminal row that is the next
        # episode's first state, which a Q target ignores (1 - d = 0) but a dynamics model would learn from
        # (world_models.train.model_rows leaves those rows out)
        dataset.metadata["next_observations"] = NEXT_ROW
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


def _read_h5_array(node, name: str, source: str) -> np.ndarray:
    import h5py

    if not isinstance(node, h5py.Dataset):
        raise DatasetError(source, f"expected an array, got an HDF5 {_h5_kind(node)}", name)
    if node.shape is None:
        raise DatasetError(source, "holds no data (an empty HDF5 dataset)", name)
    try:
        return np.asarray(node[()])
    except Exception as exc:
        raise DatasetError(source, f"cannot read array: {_reason(exc)}", name) from None


def _checked_columns(raw: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """The flat format's arrays (D4RL or offrl .npz), checked in this order so that the message names
    the first real problem: numbers only (0/1 flags may be bool), shapes ([N, dim] or [N]), lengths equal
    to rewards', next_observations' width equal to observations', finite values within float32, 0/1
    flags. Returns them as float32 with [N, dim] / [N] shapes."""
    for key, value in raw.items():
        check_dtype(value, key, source, flags=key in FLAG_FIELDS)
    shaped = {k: as_matrix(v, k, source) if k in MATRIX_FIELDS else as_column(v, k, source) for k, v in raw.items()}
    n = len(shaped["rewards"])
    for key, value in shaped.items():
        if len(value) != n:
            raise DatasetError(source, f"length {len(value)} does not match rewards' length {n}", key)
    if "next_observations" in shaped and shaped["next_observations"].shape[1] != shaped["observations"].shape[1]:
        raise DatasetError(source, f"width {shaped['next_observations'].shape[1]} != observations' width "
                           f"{shaped['observations'].shape[1]}", "next_observations")
    return {k: to_float32(v, k, source, flags=k in FLAG_FIELDS) for k, v in shaped.items()}


def _file_metadata(path: Path, attrs: dict, env_id: str | None, fmt: str) -> dict:
    """Env id and reference scores from the file's attributes, else from its name (D4RL table)."""
    source = str(path)
    if attrs.get("env_id") is not None and not isinstance(attrs["env_id"], str):
        raise DatasetError(source, f"expected an env id string, got {attrs['env_id']!r}", "env_id")
    spec = attrs.get("env_spec")
    if spec is not None:
        try:
            parsed = json.loads(spec) if isinstance(spec, str) else spec
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise DatasetError(source, "expected a Gymnasium EnvSpec as a JSON object (EnvSpec.to_json()), got "
                               f"{str(spec)[:60]!r}", "env_spec")
    metadata = {
        "name": path.stem,
        "source": f"{fmt}:{path}",
        "env_id": env_id or attrs.get("env_id"),
        "env_spec": spec,
        "ref_min_score": _reference_score(attrs.get("ref_min_score"), "ref_min_score", source),
        "ref_max_score": _reference_score(attrs.get("ref_max_score"), "ref_max_score", source),
        "ref_source": "file attributes" if attrs.get("ref_max_score") is not None else None,
    }
    _check_reference_order(metadata, source)
    # D4RL locomotion data by its name, unless the file says it was recorded in another env (an offrl export of
    # Gymnasium v5 data saved as hopper-medium.npz is not D4RL's, and D4RL's numbers do not describe it)
    recorded_in = attrs.get("env_id")
    d4rl_env = scores.d4rl_env_from_name(path.stem) or scores.d4rl_env_from_name(str(recorded_in or ""))
    if d4rl_env is not None and recorded_in and not scores.is_d4rl_env(recorded_in, d4rl_env):
        d4rl_env = None
    if d4rl_env is not None:
        metadata["d4rl_env"] = d4rl_env  # a D4RL locomotion file: published settings (e.g. DT's targets) apply
    if metadata["ref_max_score"] is None and d4rl_env is not None:
        metadata["env_id"] = metadata["env_id"] or scores.GYMNASIUM_ENV_FOR_D4RL[d4rl_env]
        if scores.is_d4rl_env(metadata["env_id"], d4rl_env):  # not with --data.env-id Hopper-v5, say
            ref_min, ref_max = scores.D4RL_REF_SCORES[d4rl_env]
            metadata.update(ref_min_score=ref_min, ref_max_score=ref_max,
                            ref_source=f"D4RL table for '{d4rl_env}' (mujoco-py v2 envs)")
    return metadata


# ------------------------------------------------------------------------------------- offrl npz
def load_npz(path: Path) -> Dataset:
    """The offrl transition format written by `Dataset.save_npz`: all six arrays are required;
    `episode_starts` and `metadata_json` are optional (episodes are then split after terminal and
    timeout rows and where s' does not continue into the next row's s)."""
    source = str(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        if "pickle" in str(exc):  # numpy takes any file that is neither a zip nor an .npy for a pickle
            with open(path, "rb") as f:
                pickled = f.read(1) == b"\x80"  # a pickle's protocol opcode (protocols 2 and up)
            if pickled:
                raise DatasetError(source, "cannot read file as .npz: it is a pickle, and offrl never unpickles data "
                                   "files (unpickling can run code); save the arrays with np.savez") from None
            raise DatasetError(source, "cannot read file as .npz: not an .npz archive (np.savez writes a zip of "
                               ".npy arrays)") from None
        raise DatasetError(source, f"cannot read file as .npz: {_reason(exc)}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DatasetError(source, "cannot read file as .npz: it holds a single .npy array, not an archive of named "
                           "arrays (np.savez)")
    try:
        with archive as f:
            keys = set(f.files)
            for key in ARRAY_FIELDS:
                if key not in keys:
                    raise DatasetError(source, f"missing key (the file has: {', '.join(sorted(keys)) or 'no keys'})", key)
            # only the keys offrl reads: others are ignored, never loaded (nor unpickled)
            raw = {k: _read_npz_array(f, k, source) for k in (*ARRAY_FIELDS, "episode_starts", "metadata_json")
                   if k in keys}
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(source, f"cannot read file as .npz: {_reason(exc)}") from None
    arrays = _checked_columns({k: raw[k] for k in ARRAY_FIELDS}, source)
    if len(arrays["rewards"]) == 0:
        raise DatasetError(source, "the dataset has no transitions", "rewards")
    metadata = _npz_metadata(raw.get("metadata_json"), source)
    dataset = Dataset(**arrays, episode_starts=np.zeros(1, np.int64), metadata=metadata)
    if "episode_starts" in raw:
        starts = raw["episode_starts"]
        if starts.dtype.kind not in "iu" or starts.ndim != 1:
            raise DatasetError(source, f"episode starts must be a 1-dimensional array of integers, got {describe(starts)}",
                               "episode_starts")
        dataset.episode_starts = starts.astype(np.int64)
    else:
        dataset.episode_starts = episode_starts_from_flags(dataset.terminals, dataset.timeouts,
                                                           dataset.observations, dataset.next_observations)
        dataset.timeouts = close_open_episodes(dataset.timeouts, dataset.terminals, dataset.episode_starts)
    file_meta = _file_metadata(path, metadata, None, fmt="npz")
    dataset.metadata = {**metadata, **{k: v for k, v in file_meta.items() if metadata.get(k) is None}}
    dataset.metadata["source"] = file_meta["source"]
    for key in ("ref_min_score", "ref_max_score"):
        dataset.metadata[key] = file_meta[key]  # checked numbers
    return dataset.validate(source)


def _read_npz_array(archive, name: str, source: str) -> np.ndarray:
    """One member of an .npz archive, loaded without unpickling (allow_pickle=False)."""
    try:
        value = archive[name]
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DatasetError(source, "holds a pickled object array (dtype object), which offrl refuses to load: "
                               "unpickling can run code; save plain numeric arrays", name) from None
        raise DatasetError(source, f"cannot read array: {_reason(exc)}", name) from None
    except Exception as exc:
        raise DatasetError(source, f"cannot read array: {_reason(exc)}", name) from None
    if not isinstance(value, np.ndarray):  # numpy returns a member that is not an .npy file as raw bytes
        raise DatasetError(source, "cannot read array: the archive member is not an .npy array", name)
    return value


def _npz_metadata(value: np.ndarray | None, source: str) -> dict:
    """`metadata_json`: a 0-d string array holding a JSON object."""
    if value is None:
        return {}
    if value.ndim != 0 or value.dtype.kind not in "US":
        raise DatasetError(source, f"expected a JSON object in a 0-d string array, got {describe(value)}", "metadata_json")
    text = value.item()
    try:
        metadata = json.loads(text.decode() if isinstance(text, bytes) else text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(source, f"not valid JSON: {exc}", "metadata_json") from None
    if not isinstance(metadata, dict):
        raise DatasetError(source, f"expected a JSON object, got a JSON {type(metadata).__name__}", "metadata_json")
    return metadata


def sanitize(name: str) -> str:
    """A dataset id or path as one folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name).stem if name.endswith(FILE_SUFFIXES) else name).strip("-")
