"""The one in-memory dataset format and its validation.

A `Dataset` holds N transitions as float32 arrays plus the episode boundaries:

    observations[i], actions[i], rewards[i], next_observations[i]  the step (s, a, r, s')
    terminals[i] = 1   the episode ended in a terminal state: do not bootstrap from s'
    timeouts[i]  = 1   the episode was cut after this row (time limit, end of data): bootstrap
    episode_starts     sorted row indices where an episode begins (always starts with 0)

Rows of one episode are contiguous. A terminal or timeout can only sit on an episode's last row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offrl.errors import DatasetError

ARRAY_FIELDS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
MATRIX_FIELDS = ("observations", "actions", "next_observations")  # [N, dim]; the others are [N]
FLAG_FIELDS = ("terminals", "timeouts")  # 0/1


@dataclass
class Dataset:
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    episode_starts: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)

    # ----------------------------------------------------------------- shape
    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def obs_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions.shape[1]

    @property
    def num_episodes(self) -> int:
        return len(self.episode_starts)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", "dataset"))

    def episode_ends(self) -> np.ndarray:
        """Exclusive end row of each episode."""
        return np.append(self.episode_starts[1:], len(self)).astype(np.int64)

    def episode_lengths(self) -> np.ndarray:
        return self.episode_ends() - self.episode_starts

    def episode_index(self) -> np.ndarray:
        """For each row, the index of its episode."""
        return np.repeat(np.arange(self.num_episodes), self.episode_lengths())

    def episode_returns(self, discount: float = 1.0) -> np.ndarray:
        """Sum of rewards per episode (discounted from each episode's first step)."""
        if discount == 1.0:
            return np.add.reduceat(self.rewards.astype(np.float64), self.episode_starts) if len(self) else np.zeros(0)
        step = np.arange(len(self)) - np.repeat(self.episode_starts, self.episode_lengths())
        return np.add.reduceat(self.rewards.astype(np.float64) * discount**step, self.episode_starts)

    # ------------------------------------------------------------- transform
    def replace(self, **changes) -> "Dataset":
        return dataclasses.replace(self, **changes)

    def select_episodes(self, episodes: np.ndarray) -> "Dataset":
        """A new dataset with only the given episodes (in the given order)."""
        episodes = np.asarray(episodes, dtype=np.int64)
        starts, ends = self.episode_starts[episodes], self.episode_ends()[episodes]
        rows = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(episodes) else np.zeros(0, np.int64)
        lengths = ends - starts
        new_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(episodes) else np.zeros(0, np.int64)
        arrays = {k: getattr(self, k)[rows] for k in ARRAY_FIELDS}
        return self.replace(**arrays, episode_starts=new_starts, metadata=dict(self.metadata))

    # ------------------------------------------------------------- integrity
    def checksum(self) -> str:
        """sha256 (first 16 hex digits) over every array's float32 bytes and the episode boundaries."""
        digest = hashlib.sha256()
        for name in ARRAY_FIELDS:
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(getattr(self, name), dtype=np.float32).tobytes())
        digest.update(np.ascontiguousarray(self.episode_starts, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def validate(self, source: str | None = None) -> "Dataset":
        """Raise DatasetError naming the field and the problem; return self when all is well."""
        src = source or self.metadata.get("source", self.name)
        for name in ARRAY_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, np.ndarray):
                raise DatasetError(src, f"expected an array, got {type(value).__name__}", name)
        for name in ARRAY_FIELDS:
            check_dtype(getattr(self, name), name, src, flags=name in FLAG_FIELDS)
        n = len(self.rewards) if self.rewards.ndim else 0
        for name in ARRAY_FIELDS:
            value = getattr(self, name)
            want_ndim = 2 if name in MATRIX_FIELDS else 1
            if value.ndim != want_ndim:
                raise DatasetError(src, f"expected {want_ndim} dimension(s), got shape {value.shape}", name)
            if len(value) != n:
                raise DatasetError(src, f"length {len(value)} does not match rewards' length {n}", name)
        for name in ("observations", "actions"):
            if getattr(self, name).shape[1] == 0:
                raise DatasetError(src, f"width 0: shape {getattr(self, name).shape} has no features", name)
        if self.next_observations.shape[1] != self.observations.shape[1]:
            raise DatasetError(src, f"width {self.next_observations.shape[1]} != observations' width "
                               f"{self.observations.shape[1]}", "next_observations")
        if n == 0:
            raise DatasetError(src, "the dataset has no transitions", "rewards")
        for name in ARRAY_FIELDS:
            check_finite(getattr(self, name), name, src)
        for name in FLAG_FIELDS:
            check_flags(getattr(self, name), name, src)
        starts = self.episode_starts
        if not isinstance(starts, np.ndarray) or starts.dtype.kind not in "iu" or starts.ndim != 1:
            raise DatasetError(src, "episode starts must be a 1-dimensional array of integers, got "
                               f"{describe(starts)}", "episode_starts")
        if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= n:
            raise DatasetError(src, "episode starts must be strictly increasing, begin at 0 and lie below "
                               f"the number of rows ({n})", "episode_starts")
        last_rows = self.episode_ends() - 1
        inner = np.ones(n, dtype=bool)
        inner[last_rows] = False
        for name in ("terminals", "timeouts"):
            misplaced = inner & (getattr(self, name) > 0)
            if misplaced.any():
                raise DatasetError(src, f"row {int(np.argmax(misplaced))} ends an episode in the middle of one "
                                   "(terminal/timeout rows must be an episode's last row)", name)
        return self

    # ---------------------------------------------------------------- saving
    def save_npz(self, path: str) -> None:
        """Write the offrl transition format (readable by `load_npz`)."""
        np.savez_compressed(
            path,
            **{k: getattr(self, k) for k in ARRAY_FIELDS},
            episode_starts=self.episode_starts,
            metadata_json=np.array(json.dumps(self.metadata, default=str)),
        )


def describe(value: Any) -> str:
    """An array's dtype and shape (or a non-array's type), for error messages."""
    if isinstance(value, np.ndarray):
        return f"dtype {value.dtype}, shape {value.shape}"
    return type(value).__name__


def check_dtype(value: Any, name: str, source: str, flags: bool = False, where: str = "") -> None:
    """Refuse what is not plain numbers: text, objects (ragged rows, pickles), complex numbers and
    bools; bools are fine in 0/1 flag columns (terminals, timeouts). `where` prefixes the message."""
    if not isinstance(value, np.ndarray):
        raise DatasetError(source, f"{where}expected an array, got {type(value).__name__}", name)
    if value.dtype.kind not in ("fiub" if flags else "fiu"):
        what = "0/1 flags" if flags else "real numbers"
        hint = {"U": " (text)", "S": " (text)", "O": " (objects: text or rows of different lengths)",
                "c": " (complex numbers)", "b": " (booleans)", "V": " (raw bytes or records)"}.get(value.dtype.kind, "")
        raise DatasetError(source, f"{where}expected {what}, got dtype {value.dtype}{hint}", name)


def check_finite(value: np.ndarray, name: str, source: str, where: str = "") -> None:
    if np.issubdtype(value.dtype, np.floating):
        bad = ~np.isfinite(value)
        if bad.any():
            row = int(np.argwhere(bad)[0][0]) if value.ndim else 0
            kind = "NaN" if np.isnan(value[bad]).any() else "inf"
            raise DatasetError(source, f"{where}{int(bad.sum())} non-finite value(s) ({kind}; first at row {row})", name)


def check_flags(value: np.ndarray, name: str, source: str, where: str = "") -> None:
    bad = (value != 0) & (value != 1)
    if bad.any():
        row = int(np.argwhere(bad)[0][0]) if value.ndim else 0
        raise DatasetError(source, f"{where}values must be 0 or 1, row {row} is {value[bad][0]:g}", name)


def to_float32(value: np.ndarray, name: str, source: str, flags: bool = False, where: str = "") -> np.ndarray:
    """A numeric column (dtype already checked with `check_dtype`) as float32: refuses NaN/inf, values
    too large for float32 (they would silently become inf) and, for flags, values other than 0 and 1."""
    check_finite(value, name, source, where)
    out = np.asarray(value, dtype=np.float32)
    if value.dtype.kind == "f" and value.dtype.itemsize > 4:
        over = np.isinf(out)
        if over.any():
            row = int(np.argwhere(over)[0][0]) if value.ndim else 0
            raise DatasetError(source, f"{where}{int(over.sum())} value(s) too large for float32 (|x| > 3.4e38; "
                               f"first at row {row}: {value[over][0]:g})", name)
    if flags:
        check_flags(out, name, source, where)
    return out


def as_matrix(value: np.ndarray, name: str, source: str) -> np.ndarray:
    """An [N, dim] field (a 1-dimensional array is one feature per row)."""
    if value.ndim == 1:
        value = value.reshape(-1, 1)
    if value.ndim != 2:
        raise DatasetError(source, f"expected shape [N, dim], got shape {value.shape}", name)
    if value.shape[1] == 0:
        raise DatasetError(source, f"width 0: shape {value.shape} has no features", name)
    return value


def as_column(value: np.ndarray, name: str, source: str, where: str = "") -> np.ndarray:
    """An [N] field ([N, 1] is accepted and flattened)."""
    if value.ndim == 2 and value.shape[1] == 1:
        value = value.reshape(-1)
    if value.ndim != 1:
        raise DatasetError(source, f"{where}expected shape [N] (or [N, 1]), got shape {value.shape}", name)
    return value


def episode_starts_from_flags(
    terminals: np.ndarray,
    timeouts: np.ndarray,
    observations: np.ndarray | None = None,
    next_observations: np.ndarray | None = None,
    tolerance: float = 1e-6,
) -> np.ndarray:
    """Episode starts for flat data: a new episode begins after a terminal or timeout row, and
    (when both arrays are given) where next_observations[i] differs from observations[i + 1], which
    catches episodes cut without a flag. (The official IQL code runs the same test on
    `qlearning_dataset` output, whose next observations are the next rows: there it fires only where a
    timeout row was dropped.)"""
    ends = (terminals > 0) | (timeouts > 0)
    if observations is not None and next_observations is not None and len(observations) > 1:
        jump = np.linalg.norm(observations[1:] - next_observations[:-1], axis=1) > tolerance
        ends[:-1] |= jump
    starts = np.flatnonzero(ends[:-1]) + 1
    return np.concatenate([[0], starts]).astype(np.int64)


def close_open_episodes(timeouts: np.ndarray, terminals: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
    """Mark the last row of every episode that ends without a terminal as a timeout (cut: bootstrap)."""
    timeouts = timeouts.copy()
    if len(timeouts) == 0:
        return timeouts
    last_rows = np.append(episode_starts[1:], len(timeouts)) - 1
    open_end = terminals[last_rows] == 0
    timeouts[last_rows[open_end]] = 1.0
    return timeouts
