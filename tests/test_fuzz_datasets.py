"""Fuzzing the three file sources of `load_dataset` (D4RL `.hdf5`, offrl `.npz`, a local Minari dataset).

Every generated case knows what a correct loader does with it: a malformed file (wrong dtype, shape,
length, missing key, NaN/inf, a value beyond float32, a flag that is not 0/1 or ends an episode in its
middle, an unreadable file, ...) must end in `DatasetError` naming the field (where there is one) and
the problem, never in another exception and never in a silently accepted dataset; a valid one (extra
keys, integer or float64 columns, bool flags, [N, 1] columns, ...) must load with the arrays that were
written. No code path may unpickle user data: `pickle.load`/`pickle.loads` are watched in every case.

Cases are drawn per kind of malformation (the `kind` parameter), so every kind gets its share of
examples; `test_zz_example_counts` prints how many cases ran per source, valid and refused.
"""

from __future__ import annotations

import collections
import json
import pickle
import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from offrl.data.dataset import Dataset
from offrl.errors import DatasetError

COUNTS: collections.Counter = collections.Counter()  # examples run, per source and outcome
UNPICKLED: list[str] = []  # calls of pickle.load/loads made while a loader ran

# Per parametrized case kind (about 120 kinds): the whole file takes about half a minute on one busy core.
FUZZ = settings(max_examples=20, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FLAGS = {"terminals", "timeouts", "terminations", "truncations"}
MATRIX = {"observations", "actions", "next_observations"}
NPZ_FIELDS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
MINARI_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


# ------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def own_minari_root(tmp_path_factory):
    """This module's Minari datasets live in a folder of their own (never ~/.minari)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(tmp_path_factory.mktemp("minari-fuzz")))
        yield


@pytest.fixture(scope="module", autouse=True)
def watch_unpickling():
    """Record every pickle.load/pickle.loads call (numpy's object-array reader goes through them)."""
    real_load, real_loads = pickle.load, pickle.loads

    def load(*args, **kwargs):
        UNPICKLED.append("pickle.load")
        return real_load(*args, **kwargs)

    def loads(*args, **kwargs):
        UNPICKLED.append("pickle.loads")
        return real_loads(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pickle, "load", load)
        mp.setattr(pickle, "loads", loads)
        yield


# --------------------------------------------------------------------------------- case records
@dataclass
class Outcome:
    """What a correct loader does: load (ok) or raise DatasetError with one of `fields` (None: the
    error names no field) and a message matching the regex `words`."""

    ok: bool
    fields: frozenset | None = None
    words: str = ""

    @staticmethod
    def error(fields, words: str) -> "Outcome":
        return Outcome(False, None if fields is None else frozenset([fields] if isinstance(fields, str) else fields), words)


OK = Outcome(True)


class Group:
    """An HDF5 group where an array belongs."""


class Empty:
    """An HDF5 dataset without data (h5py.Empty)."""


class Ragged(list):
    """Rows of different lengths: an HDF5 variable-length dataset, or a pickled object array in .npz."""


class Void(bytes):
    """Opaque bytes (an HDF5 opaque / numpy void value), e.g. a pickle someone stored."""


def check(load, outcome: Outcome, expected: dict[str, np.ndarray] | None = None, source: str = "") -> Dataset | None:
    """Run `load` and hold it to `outcome`; for a valid case compare the arrays with `expected`."""
    del UNPICKLED[:]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="minari")
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # float32 overflow inside distances of huge values
        if outcome.ok:
            try:
                dataset = load()
            except DatasetError as exc:
                raise AssertionError(f"a valid {source} case was refused: {exc}") from exc
            assert not UNPICKLED, f"user data was unpickled ({UNPICKLED})"
            COUNTS[(source, "valid")] += 1
            for key, want in (expected or {}).items():
                got = getattr(dataset, key)
                assert got.dtype == (np.int64 if key == "episode_starts" else np.float32), (key, got.dtype)
                np.testing.assert_array_equal(got, want, err_msg=key)
            dataset.validate()
            return dataset
        with pytest.raises(DatasetError) as info:
            dataset = load()
            raise AssertionError(f"silently accepted a bad {source} dataset: {len(dataset)} rows, "
                                 f"expected an error about {sorted(outcome.fields or [])} matching {outcome.words!r}")
        assert not UNPICKLED, f"user data was unpickled ({UNPICKLED})"
        COUNTS[(source, "refused")] += 1
        err = info.value
        message = str(err)
        note(f"error: {message}")
        assert "\n" not in message, message
        if outcome.fields is not None:  # (None: a file-level problem, which needs no field)
            assert err.field in outcome.fields, f"field {err.field!r} not in {sorted(outcome.fields)}: {message}"
        assert re.search(outcome.words, message), f"{outcome.words!r} not in: {message}"
        return None


# ------------------------------------------------------------------------------------- strategies
def reals(shape):
    return hnp.arrays(np.float32, shape, elements=st.floats(-100, 100, width=32))


def flags(n):
    return hnp.arrays(np.bool_, n).map(lambda a: a.astype(np.float32))


FIELD_MUTATIONS = ("string", "complex", "object", "bool", "int", "float64", "float16", "scalar", "extra_dim", "nan",
                   "inf", "length", "group", "empty", "flag_value", "huge", "big_but_fits", "width0", "flat", "column")


def applies(kind: str, name: str, fmt: str) -> bool:
    """Whether field mutation `kind` makes sense for field `name` in format `fmt`."""
    if kind == "flag_value":
        return name in FLAGS
    if kind in ("huge", "big_but_fits"):
        return name not in FLAGS
    if kind in ("width0", "flat"):
        return name in MATRIX
    if kind == "column":
        return name not in MATRIX
    if kind in ("group", "empty"):
        return fmt != "npz"
    return True


def field_kinds(fmt: str, fields) -> list[str]:
    return [f"field:{k}" for k in FIELD_MUTATIONS if any(applies(k, name, fmt) for name in fields)]


def field_mutation(draw, kind: str, name: str, a: np.ndarray, fmt: str, reference: str | None = None, others=()):
    """Apply mutation `kind` to field `name` (logical float32 array `a`): (value to write, Outcome, logical
    value when the case stays valid). `reference` is the field other lengths are compared with."""
    event(f"{fmt}: {kind}")
    note(f"mutation: {kind} in {name}")
    n = len(a)
    err = lambda words: Outcome.error(name, words)  # noqa: E731
    position = draw(st.integers(0, max(a.size - 1, 0)))
    if kind == "string":
        return a.astype(str), err("dtype"), None  # numeric-looking text: astype(float32) would accept it
    if kind == "complex":
        return a.astype(np.complex64) + 1j * draw(st.sampled_from([0.0, 1.0])), err("dtype"), None
    if kind == "object":
        rows = Ragged(np.atleast_1d(row)[: 1 + i % 2] for i, row in enumerate(a))
        return rows, err("pickle" if fmt == "npz" else "dtype"), None
    if kind == "bool":
        if name in FLAGS:
            return a.astype(bool), OK, a
        return a != 0, err("dtype"), None
    if kind == "int":
        dtype = draw(st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64]))
        value = np.round(np.abs(a) if np.dtype(dtype).kind == "u" else a).astype(dtype)
        return value, OK, value.astype(np.float32)
    if kind == "float64":
        return a.astype(np.float64), OK, a
    if kind == "float16":
        value = a.astype(np.float16)
        return value, OK, value.astype(np.float32)
    if kind == "scalar":
        return np.float32(1.0) if draw(st.booleans()) else np.array(1.0), err("shape"), None
    if kind == "extra_dim":
        return (a[:, None, :] if a.ndim == 2 else np.stack([a, a], 1)), err("shape"), None
    if kind == "column":
        return a[:, None], OK, a
    if kind == "flat":
        if a.shape[1] == 1:
            return a[:, 0], OK, a
        return a.reshape(-1), Outcome.error({name, *others}, "length"), None
    if kind == "width0":
        return a[:, :0], err("width"), None
    if kind in ("nan", "inf"):
        if a.size == 0:
            return a, OK, a
        value = a.astype(draw(st.sampled_from([np.float32, np.float64, np.float16]))).copy()
        value.flat[position] = np.nan if kind == "nan" else draw(st.sampled_from([np.inf, -np.inf]))
        return value, err("NaN" if kind == "nan" else "inf"), None
    if kind in ("huge", "big_but_fits"):
        value = a.astype(np.float64)
        if kind == "huge":
            value.flat[position] = draw(st.floats(3.5e38, 1e300)) * draw(st.sampled_from([1, -1]))
            return value, err("float32"), None
        value.flat[position] = draw(st.floats(-3e38, 3e38))
        return value, OK, value.astype(np.float32)
    if kind == "length":
        n2 = draw(st.integers(0, n + 2).filter(lambda m: m != n))
        value = np.concatenate([a] * 3)[:n2] if n else np.zeros((n2, *a.shape[1:]), a.dtype)
        fields = set(others) if name == reference else {name}
        return value, Outcome.error(fields, "length"), None
    if kind == "flag_value":
        bad = draw(st.sampled_from([2, -1, 0.5, 3, 255, 1e-3, 1.5]))
        value = a.astype(np.float32 if bad != int(bad) or bad < 0 else draw(st.sampled_from([np.float32, np.int64, np.uint8])))
        if value.size == 0:
            return value, OK, a
        value.flat[position] = bad
        return value, err("0 or 1"), None
    if kind == "group":
        return Group(), err("group"), None
    if kind == "empty":
        return Empty(), err("no data"), None
    raise AssertionError(kind)


# ------------------------------------------------------------------------------------ file writers
def put_h5(group: h5py.Group, key: str, value) -> None:
    if isinstance(value, Group):
        group.create_group(key).create_dataset("inner", data=np.zeros(3))
    elif isinstance(value, Empty):
        group.create_dataset(key, data=h5py.Empty("f4"))
    elif isinstance(value, Ragged):
        data = group.create_dataset(key, (len(value),), dtype=h5py.vlen_dtype(np.float32))
        for i, row in enumerate(value):
            data[i] = np.asarray(row, np.float32)
    elif isinstance(value, Void):
        group.create_dataset(key, data=np.void(bytes(value)))
    elif isinstance(value, np.ndarray) and value.dtype.kind == "U":
        if value.ndim and len(value) % 2:  # variable-length strings (read back as an object array)
            group.create_dataset(key, data=value.astype(object), dtype=h5py.string_dtype())
        else:  # fixed-length bytes
            group.create_dataset(key, data=value.astype("S"))
    else:
        group.create_dataset(key, data=value)


def write_h5(path: Path, arrays: dict, attrs: dict | None = None) -> None:
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            put_h5(f, key, value)
        for key, value in (attrs or {}).items():
            f.attrs[key] = value


def npz_value(value):
    if isinstance(value, Ragged):
        array = np.empty(len(value), dtype=object)  # saved pickled: np.save's default allow_pickle=True
        array[:] = [np.asarray(row) for row in value]
        return array
    return value


def write_npz(path: Path, arrays: dict, compressed: bool) -> None:
    (np.savez_compressed if compressed else np.savez)(path, **{k: npz_value(v) for k, v in arrays.items()})


FILE_PROBLEMS = ("zero_bytes", "garbage", "truncated", "directory")


def spoil_file(path: Path, problem: str, garbage: bytes) -> None:
    """Replace a written file by an unreadable one (or, `no_arrays`, by a readable one holding nothing)."""
    if problem == "no_arrays":
        if path.suffix == ".npz":
            np.savez(path)
        else:
            h5py.File(path, "w").close()
    elif problem == "zero_bytes":
        path.write_bytes(b"")
    elif problem == "garbage":
        path.write_bytes(garbage)
    elif problem == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif problem == "directory":
        path.unlink()
        path.mkdir()


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def unique_name() -> str:
    COUNTS["files"] += 1
    return f"case{COUNTS['files']}"


# ------------------------------------------------------------------------------------------- D4RL
D4RL_FIELDS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
D4RL_KINDS = (["missing", "extra", "width", "too_few_rows", "all_timeouts"]
              + [f"file:{p}" for p in FILE_PROBLEMS + ("no_arrays",)]
              + [f"attrs:{a}" for a in ("env_id", "scores", "bad_score", "nan_score", "reversed_scores", "bad_spec",
                                        "bad_env_id")]
              + field_kinds("hdf5", D4RL_FIELDS))


@st.composite
def d4rl_cases(draw, kind: str):
    n, obs_dim, act_dim = draw(st.integers(2, 7)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    arrays = {"observations": draw(reals((n, obs_dim))), "actions": draw(reals((n, act_dim))),
              "rewards": draw(reals(n)), "terminals": draw(flags(n))}
    if draw(st.booleans()) or kind == "all_timeouts":
        arrays["timeouts"] = draw(flags(n))
        arrays["timeouts"][0] = 0  # row 0 is kept: the base file is valid
    if draw(st.booleans()):
        arrays["next_observations"] = draw(reals((n, obs_dim)))
    if kind == "all_timeouts":  # qlearning_dataset keeps no row; trajectories keep them all
        arrays["timeouts"][: n - 1] = 1
    logical = dict(arrays)  # what a correct loader reads
    written = dict(arrays)  # what goes into the file
    attrs: dict = {}
    outcome, problem = OK, None
    kind, _, choice = kind.partition(":")
    if kind == "field":
        name = draw(st.sampled_from([k for k in sorted(arrays) if applies(choice, k, "hdf5")]))
        written[name], outcome, logical[name] = field_mutation(
            draw, choice, name, arrays[name], "hdf5", reference="rewards", others=set(arrays) - {"rewards"})
    elif kind == "missing":
        name = draw(st.sampled_from(sorted(arrays)))
        del written[name], logical[name]
        if name not in ("timeouts", "next_observations"):
            outcome = Outcome.error(name, "missing key")
    elif kind == "extra":
        name = draw(st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True).filter(lambda k: k not in D4RL_FIELDS))
        written[name] = draw(st.sampled_from([np.zeros(3), np.array(["x", "yz"]), Group(), Ragged([[1.0], [1.0, 2.0]]),
                                              np.zeros((n + 1, 2, 2)), Void(b"\x80\x04K\x01.")]))
    elif kind == "attrs":
        if choice == "env_id":
            attrs["env_id"] = "Pendulum-v1"
        elif choice == "scores":
            attrs.update(ref_min_score=-5.0, ref_max_score=draw(st.floats(-4.0, 1e6)))
        elif choice == "bad_score":
            key = draw(st.sampled_from(["ref_min_score", "ref_max_score"]))
            attrs.update(ref_min_score=0.0, ref_max_score=1.0)
            attrs[key] = draw(st.sampled_from(["abc", "", np.zeros(2)]))
            outcome = Outcome.error(key, "number")
        elif choice == "nan_score":
            key = draw(st.sampled_from(["ref_min_score", "ref_max_score"]))
            attrs.update(ref_min_score=0.0, ref_max_score=1.0)
            attrs[key] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            outcome = Outcome.error(key, "finite")
        elif choice == "reversed_scores":
            # equal scores leave the normalization undefined; a max below the min is kept as recorded
            high = draw(st.sampled_from([1.0, 0.0, -3.0]))
            attrs.update(ref_min_score=1.0, ref_max_score=high)
            outcome = Outcome.error("ref_max_score", "differ") if high == 1.0 else OK
        elif choice == "bad_spec":
            attrs.update(env_id="Pendulum-v1", env_spec=draw(st.sampled_from(["{not json", "[1, 2]", "3"])))
            outcome = Outcome.error("env_spec", "JSON")
        else:
            attrs["env_id"] = draw(st.sampled_from([3, 1.5, np.zeros(2)]))
            outcome = Outcome.error("env_id", "env id")
        note(f"attrs: {attrs}")
    elif kind == "file":
        problem = choice
        outcome = (Outcome.error("observations", "missing key .*no keys") if choice == "no_arrays"
                   else Outcome.error(None, "cannot read|not a file"))
    elif kind == "width":
        width = draw(st.sampled_from([w for w in (obs_dim - 1, obs_dim + 1) if w >= 1]))
        written["next_observations"] = np.zeros((n, width), np.float32)
        outcome = Outcome.error("next_observations", "width")
    elif kind == "too_few_rows":
        rows = draw(st.integers(0, 1))
        written = {k: v[:rows] for k, v in written.items()}
        outcome = Outcome.error({"rewards"}, "at least 2 rows")
    trajectories = draw(st.booleans())
    expected = None
    if outcome.ok:
        outcome, expected = d4rl_oracle(logical, trajectories)
    return written, attrs, problem, draw(st.binary(max_size=64)), trajectories, outcome, expected


def d4rl_oracle(arrays: dict, trajectories: bool):
    """qlearning_dataset's rows (or, for trajectories, every row) of a valid file of < 1000 rows."""
    n = len(arrays["rewards"])
    if trajectories:
        rows = np.arange(n)
    else:
        timeouts = arrays.get("timeouts", np.zeros(n))
        rows = np.array([i for i in range(n - 1) if not timeouts[i]], dtype=np.int64)
    if len(rows) == 0:
        return Outcome.error("timeouts", "no transitions"), None
    expected = {k: np.asarray(arrays[k], np.float32).reshape(n, -1)[rows] for k in ("observations", "actions")}
    expected.update({k: np.asarray(arrays[k], np.float32).reshape(-1)[rows] for k in ("rewards", "terminals")})
    if "next_observations" in arrays:
        expected["next_observations"] = np.asarray(arrays["next_observations"], np.float32).reshape(n, -1)[rows]
    elif not trajectories:
        expected["next_observations"] = np.asarray(arrays["observations"], np.float32).reshape(n, -1)[rows + 1]
    return OK, expected


@pytest.mark.parametrize("kind", D4RL_KINDS)
@FUZZ
@given(data=st.data())
def test_fuzz_d4rl_hdf5(kind, data, workdir):
    from offrl.data import load_dataset

    case = data.draw(d4rl_cases(kind), label="case")
    written, attrs, problem, garbage, trajectories, outcome, expected = case
    path = workdir / f"{unique_name()}.hdf5"
    write_h5(path, written, attrs)
    if problem:
        spoil_file(path, problem, garbage)
    COUNTS["d4rl"] += 1
    try:
        check(lambda: load_dataset(str(path), env_id="Pendulum-v1" if "env_spec" in attrs else None,
                                   d4rl_trajectories=trajectories), outcome, expected, "d4rl")
    finally:
        remove(path)


# ------------------------------------------------------------------------------------- offrl npz
@st.composite
def episodes_dataset(draw, max_episodes=3):
    """A valid offrl dataset: 1-3 episodes of 1-4 rows, each ending in a terminal and/or a timeout."""
    lengths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_episodes))
    n, obs_dim, act_dim = sum(lengths), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    terminals, timeouts = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for end in np.cumsum(lengths) - 1:
        how = draw(st.sampled_from(["terminal", "timeout", "both"]))
        terminals[end] = how in ("terminal", "both")
        timeouts[end] = how in ("timeout", "both")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return Dataset(draw(reals((n, obs_dim))), draw(reals((n, act_dim))), draw(reals(n)), draw(reals((n, obs_dim))),
                   terminals, timeouts, starts, {"name": "fuzz"}).validate()


NPZ_KINDS = (["missing", "extra", "width", "no_rows", "member", "mid_episode"]
             + [f"file:{p}" for p in FILE_PROBLEMS + ("npy", "pickle", "no_arrays")]
             + [f"starts:{c}" for c in ("not_zero", "unsorted", "beyond", "negative", "float", "integral_float",
                                        "string", "2d", "scalar", "nan")]
             + [f"metadata:{c}" for c in ("not_json", "list", "number", "array", "bytes_ok", "bad_score", "nan_score",
                                          "extra_ok", "scores_ok")]
             + field_kinds("npz", NPZ_FIELDS))


@st.composite
def npz_cases(draw, kind: str):
    ds = draw(episodes_dataset())
    n = len(ds)
    arrays = {k: getattr(ds, k) for k in NPZ_FIELDS}
    logical, written = dict(arrays), dict(arrays)
    with_starts = draw(st.booleans())
    if with_starts:
        written["episode_starts"] = ds.episode_starts
        written["metadata_json"] = np.array(json.dumps({"env_id": "Pendulum-v1"}))
    outcome, problem = OK, None
    kind, _, choice = kind.partition(":")
    if kind == "field":
        name = draw(st.sampled_from([k for k in NPZ_FIELDS if applies(choice, k, "npz")]))
        written[name], outcome, logical[name] = field_mutation(
            draw, choice, name, arrays[name], "npz", reference="rewards", others=set(NPZ_FIELDS) - {"rewards"})
    elif kind == "missing":
        name = draw(st.sampled_from(sorted(written)))
        del written[name]
        if name in NPZ_FIELDS:
            outcome = Outcome.error(name, "missing key")
        elif name == "episode_starts":
            with_starts = False
    elif kind == "extra":
        name = draw(st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True).filter(
            lambda k: k not in NPZ_FIELDS and k not in ("episode_starts", "metadata_json")))
        written[name] = draw(st.sampled_from([np.zeros(3), np.array(["x", "yz"]), Ragged([[1.0], [1.0, 2.0]]),
                                              np.zeros((n + 1, 2, 2)), np.array(3)]))
    elif kind == "file":
        problem = choice
        outcome = (Outcome.error("observations", "missing key .*no keys") if choice == "no_arrays"
                   else Outcome.error(None, "cannot read|not a file|pickle"))
    elif kind == "width":
        width = draw(st.sampled_from([w for w in (ds.obs_dim - 1, ds.obs_dim + 1) if w >= 1]))
        written["next_observations"] = np.zeros((n, width), np.float32)
        outcome = Outcome.error("next_observations", "width")
    elif kind == "no_rows":
        written = {k: (v[:0] if k in NPZ_FIELDS else v) for k, v in written.items()}
        if with_starts:
            written["episode_starts"] = draw(st.sampled_from([np.zeros(0, np.int64), np.zeros(1, np.int64)]))
        outcome = Outcome.error(None, "no transitions")
    elif kind == "member":
        name = draw(st.sampled_from(NPZ_FIELDS))
        written[name] = Void(draw(st.binary(max_size=40)))
        outcome = Outcome.error(name, "cannot read")
    elif kind == "starts":
        starts = ds.episode_starts
        value = {
            "not_zero": starts + 1,
            "unsorted": starts[::-1] if len(starts) > 1 else np.array([0, 0]),
            "beyond": np.append(starts, n + draw(st.integers(0, 3))),
            "negative": np.append(starts, -1),
            "float": starts + 0.5,
            "integral_float": starts.astype(np.float64),
            "string": starts.astype(str),
            "2d": starts[None, :].repeat(2, 0),
            "scalar": np.array(0),
            "nan": np.append(starts.astype(np.float64), np.nan),
        }[choice]
        note(f"episode_starts: {value!r}")
        written["episode_starts"], with_starts = value, True
        outcome = Outcome.error("episode_starts", "episode starts")
    elif kind == "mid_episode":
        long = [i for i, length in enumerate(ds.episode_lengths()) if length >= 2]
        if long:
            episode = draw(st.sampled_from(long))
            row = int(ds.episode_starts[episode]) + draw(st.integers(0, int(ds.episode_lengths()[episode]) - 2))
            name = draw(st.sampled_from(["terminals", "timeouts"]))
            value = arrays[name].copy()
            value[row] = 1
            written[name] = logical[name] = value
            if with_starts:
                outcome = Outcome.error(name, "middle")
            # (without episode_starts a flag ends an episode wherever it is: a valid file)
    elif kind == "metadata":
        value = {
            "not_json": np.array("{env_id: Hopper"),
            "list": np.array("[1, 2]"),
            "number": np.array("3.5"),
            "array": np.array([1.0, 2.0]),
            "bytes_ok": np.array(json.dumps({"env_id": "Pendulum-v1"}).encode()),
            "bad_score": np.array(json.dumps({"ref_min_score": "abc", "ref_max_score": 1.0})),
            "nan_score": np.array('{"ref_min_score": NaN, "ref_max_score": 1.0}'),
            "extra_ok": np.array(json.dumps({"anything": [1, {"x": None}]})),
            "scores_ok": np.array(json.dumps({"ref_min_score": -1, "ref_max_score": 2.5})),
        }[choice]
        written["metadata_json"] = value
        if choice in ("bad_score", "nan_score"):
            outcome = Outcome.error("ref_min_score", "number|finite")
        elif not choice.endswith("ok"):
            outcome = Outcome.error("metadata_json", "JSON")
    expected = None
    if outcome.ok:
        expected = {k: np.asarray(v, np.float32) for k, v in logical.items()}
        if with_starts:
            expected["episode_starts"] = ds.episode_starts
        else:
            expected.pop("timeouts")  # episodes are then split by flags and jumps; cut ones get a timeout
    return written, problem, draw(st.binary(max_size=64)), draw(st.booleans()), outcome, expected, logical["timeouts"]


@pytest.mark.parametrize("kind", NPZ_KINDS)
@FUZZ
@given(data=st.data())
def test_fuzz_npz(kind, data, workdir):
    from offrl.data import load_dataset

    case = data.draw(npz_cases(kind), label="case")
    written, problem, garbage, compressed, outcome, expected, timeouts = case
    path = workdir / f"{unique_name()}.npz"
    voids = {k: v for k, v in written.items() if isinstance(v, Void)}
    write_npz(path, {k: v for k, v in written.items() if k not in voids}, compressed)
    if voids:  # a member whose bytes are not an .npy array
        with zipfile.ZipFile(path, "a") as archive:
            for key, value in voids.items():
                archive.writestr(f"{key}.npy", bytes(value))
    if problem == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros((3, 2)))
    elif problem == "pickle":
        path.write_bytes(pickle.dumps({"observations": np.zeros(3)}))
    elif problem:
        spoil_file(path, problem, garbage)
    COUNTS["npz"] += 1
    try:
        dataset = check(lambda: load_dataset(str(path)), outcome, expected, "npz")
        if dataset is not None and "timeouts" not in expected:
            written_timeouts = np.asarray(timeouts, np.float32).reshape(-1)
            assert set(np.unique(dataset.timeouts)) <= {0.0, 1.0}
            assert (dataset.timeouts >= written_timeouts).all()  # kept; cut episodes are closed with one
    finally:
        remove(path)


# ------------------------------------------------------------------------------------------ Minari
@st.composite
def minari_episodes(draw):
    """1-3 episodes of 1-4 steps (T + 1 observations) ending terminated, truncated, both or neither."""
    obs_dim, act_dim = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    episodes = []
    for _ in range(draw(st.integers(1, 3))):
        steps = draw(st.integers(1, 4))
        how = draw(st.sampled_from(["terminated", "truncated", "both", "neither"]))
        terminations, truncations = np.zeros(steps, bool), np.zeros(steps, bool)
        terminations[-1] = how in ("terminated", "both")
        truncations[-1] = how in ("truncated", "both")
        episodes.append({"observations": draw(reals((steps + 1, obs_dim))), "actions": draw(reals((steps, act_dim))),
                         "rewards": draw(reals(steps)).astype(np.float64), "terminations": terminations,
                         "truncations": truncations})
    return obs_dim, act_dim, episodes


def minari_oracle(episodes: list[dict]) -> dict[str, np.ndarray]:
    timeouts = []
    for e in episodes:
        t = np.asarray(e["truncations"], np.float32).reshape(-1).copy()
        if not np.asarray(e["terminations"]).reshape(-1)[-1]:
            t[-1] = 1.0  # an episode ending with neither flag was cut: bootstrapped
        timeouts.append(t)
    lengths = [len(np.asarray(e["actions"])) for e in episodes]
    cat = lambda key, f: np.concatenate([f(np.asarray(e[key], np.float32)) for e in episodes])  # noqa: E731
    return {
        "observations": cat("observations", lambda o: o.reshape(len(o), -1)[:-1]),
        "next_observations": cat("observations", lambda o: o.reshape(len(o), -1)[1:]),
        "actions": cat("actions", lambda a: a.reshape(len(a), -1)),
        "rewards": cat("rewards", lambda r: r.reshape(-1)),
        "terminals": cat("terminations", lambda r: r.reshape(-1)),
        "timeouts": np.concatenate(timeouts),
        "episode_starts": np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64),
    }


MINARI_KINDS = (["missing", "extra", "mid_episode", "zero_steps", "drop_episode", "extra_episode", "space", "not_box",
                 "metadata", "total_steps", "scores"]
                + [f"main_file:{p}" for p in FILE_PROBLEMS + ("gone",)]
                + field_kinds("minari", MINARI_FIELDS))


@st.composite
def minari_cases(draw, kind: str):
    obs_dim, act_dim, episodes = draw(minari_episodes())
    logical = [dict(e) for e in episodes]
    edits: list[tuple] = []  # (what, where, value) applied to the written dataset
    outcome = OK
    kind, _, choice = kind.partition(":")
    e = draw(st.integers(0, len(episodes) - 1))
    if kind == "field":
        name = draw(st.sampled_from([k for k in MINARI_FIELDS if applies(choice, k, "minari")]))
        others = set(MINARI_FIELDS) - {"actions"}
        start = episodes[e][name].astype(np.float32) if name in FLAGS else episodes[e][name]
        value, outcome, logical[e][name] = field_mutation(draw, choice, name, start, "minari", reference="actions",
                                                          others=others)
        width = obs_dim if name == "observations" else act_dim
        if name in MATRIX and isinstance(value, np.ndarray) and value.dtype.kind in "fiu" and value.shape[1:] != (width,):
            outcome = Outcome.error(name, "shape")  # exactly the shape the dataset's space gives
        edits.append(("replace", f"episode_{e}/{name}", value))
    elif kind == "missing":
        name = draw(st.sampled_from(MINARI_FIELDS))
        edits.append(("delete", f"episode_{e}/{name}", None))
        outcome = Outcome.error(name, "missing")
    elif kind == "extra":
        name = draw(st.sampled_from(["foo", "infos/bar", "infos/deep/baz", "custom_data"]))
        edits.append(("replace", f"episode_{e}/{name}", draw(st.sampled_from(
            [np.zeros(3), np.array(["x", "yz"]), Void(b"\x80\x04K\x01."), Ragged([[1.0], [1.0, 2.0]])]))))
    elif kind == "mid_episode":
        long = [i for i, ep in enumerate(episodes) if len(ep["actions"]) >= 2]
        if long:
            e = draw(st.sampled_from(long))
            steps = len(episodes[e]["actions"])
            name = draw(st.sampled_from(["terminations", "truncations"]))
            value = episodes[e][name].copy()
            value[draw(st.integers(0, steps - 2))] = True
            edits.append(("replace", f"episode_{e}/{name}", value))
            outcome = Outcome.error(name, "middle")
    elif kind == "zero_steps":
        for name in MINARI_FIELDS:
            edits.append(("replace", f"episode_{e}/{name}", episodes[e][name][:1 if name == "observations" else 0]))
        outcome = Outcome.error(None, "no steps")
    elif kind == "drop_episode":
        edits.append(("delete", f"episode_{e}", None))
        outcome = Outcome.error(None, "episode")
    elif kind == "extra_episode":
        edits.append(("copy", f"episode_{len(episodes)}", f"episode_{e}"))
        outcome = Outcome.error(None, "episode")
    elif kind == "space":
        which = draw(st.sampled_from(["observation_space", "action_space"]))
        dim = obs_dim if which == "observation_space" else act_dim
        new = draw(st.sampled_from([d for d in (dim - 1, dim + 1) if d >= 1]))
        edits.append(("meta", which, json.dumps({"type": "Box", "dtype": "float32", "shape": [new],
                                                 "low": [-1.0] * new, "high": [1.0] * new})))
        outcome = Outcome.error("observations" if which == "observation_space" else "actions", "space")
    elif kind == "not_box":
        which = draw(st.sampled_from(["observation_space", "action_space"]))
        edits.append(("meta", which, json.dumps({"type": "Discrete", "dtype": "int64", "n": 3, "start": 0})))
        outcome = Outcome.error(None, "Box")
    elif kind == "metadata":
        edits.append(("file", "metadata.json", draw(st.sampled_from([b"", b"{", b"[]", b"{}", b"\x00\xff" * 5]))))
        outcome = Outcome.error(None, "cannot load Minari dataset")
    elif kind == "main_file":
        edits.append(("main", choice, draw(st.binary(max_size=64))))
        outcome = Outcome.error(None, "cannot (load|read)")
    elif kind == "total_steps":
        total = sum(len(ep["actions"]) for ep in episodes)
        edits.append(("meta", "total_steps", total + draw(st.sampled_from([-1, 1, 5]))))
        outcome = Outcome.error("total_steps", "total_steps")
    elif kind == "scores":
        key = draw(st.sampled_from(["ref_min_score", "ref_max_score"]))
        bad = draw(st.sampled_from(["abc", [1, 2], float("nan"), {"x": 1}]))
        edits.append(("meta", "ref_min_score", 0.0))
        edits.append(("meta", "ref_max_score", 1.0))
        edits.append(("meta", key, bad))
        outcome = Outcome.error(key, "number|finite")
    note(f"edits: {[(what, where) for what, where, _ in edits]}")
    expected = minari_oracle(logical) if outcome.ok else None
    return obs_dim, act_dim, episodes, edits, outcome, expected


def write_minari(dataset_id: str, obs_dim: int, act_dim: int, episodes: list[dict]) -> Path:
    import gymnasium as gym
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [EpisodeBuffer(id=i, seed=i, observations=e["observations"], actions=e["actions"],
                             rewards=list(map(float, e["rewards"])), terminations=list(map(bool, e["terminations"])),
                             truncations=list(map(bool, e["truncations"]))) for i, e in enumerate(episodes)]
    minari.create_dataset_from_buffers(
        dataset_id, buffers, observation_space=gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32),
        action_space=gym.spaces.Box(-1, 1, (act_dim,), np.float32), algorithm_name="fuzz", author="offrl",
        author_email="offrl@users.noreply.invalid", code_permalink="tests/test_fuzz_datasets.py", data_format="hdf5")
    from offrl.data import suite

    return suite.local_path(dataset_id) / "data"


def apply_minari_edits(data_dir: Path, edits: list[tuple]) -> None:
    main = data_dir / "main_data.hdf5"
    for what, where, value in edits:
        if what in ("replace", "delete", "copy"):
            with h5py.File(main, "a") as f:
                if what == "copy":
                    f.copy(f[value], where)
                    continue
                if where in f:
                    del f[where]
                if what == "replace":
                    group, _, key = where.rpartition("/")
                    put_h5(f.require_group(group), key, value)
        elif what == "meta":
            meta = json.loads((data_dir / "metadata.json").read_text())
            meta[where] = value
            (data_dir / "metadata.json").write_text(json.dumps(meta))
        elif what == "file":
            (data_dir / where).write_bytes(value)
        elif what == "main":
            if where == "gone":
                main.unlink()
            else:
                spoil_file(main, where, value)


@pytest.mark.parametrize("kind", MINARI_KINDS)
@FUZZ
@given(data=st.data())
def test_fuzz_minari(kind, data):
    from offrl.data import load_dataset, suite

    case = data.draw(minari_cases(kind), label="case")
    obs_dim, act_dim, episodes, edits, outcome, expected = case
    dataset_id = f"fuzz/{unique_name()}-v0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data_dir = write_minari(dataset_id, obs_dim, act_dim, episodes)
    apply_minari_edits(data_dir, edits)
    COUNTS["minari"] += 1
    try:
        check(lambda: load_dataset(dataset_id), outcome, expected, "minari")
    finally:
        shutil.rmtree(suite.local_path(dataset_id), ignore_errors=True)


# ------------------------------------------------------------------------- widths against the env
@settings(FUZZ, max_examples=25)
@given(source=st.sampled_from(["hdf5", "npz", "minari"]), obs_dim=st.integers(1, 5), act_dim=st.integers(1, 2),
       data=st.data())
def test_fuzz_widths_against_the_env(source, obs_dim, act_dim, data, workdir):
    """Pendulum-v1 observes 3 numbers and takes 1 action: other widths are refused by load_for_training,
    naming the field."""
    from offrl.config import DataConfig
    from offrl.data import load_for_training, suite

    ds = data.draw(episodes_dataset(max_episodes=2).filter(lambda d: len(d) >= 2))
    ds = Dataset(np.resize(ds.observations, (len(ds), obs_dim)), np.resize(ds.actions, (len(ds), act_dim)),
                 ds.rewards, np.resize(ds.next_observations, (len(ds), obs_dim)), ds.terminals, ds.timeouts,
                 ds.episode_starts, {"env_id": "Pendulum-v1"})
    name = unique_name()
    if source == "hdf5":
        path = str(workdir / f"{name}.hdf5")
        write_h5(Path(path), {k: getattr(ds, k) for k in NPZ_FIELDS}, {"env_id": "Pendulum-v1"})
    elif source == "npz":
        path = str(workdir / f"{name}.npz")
        ds.save_npz(path)
    else:
        path = f"fuzz/{name}-v0"
        lengths = ds.episode_lengths()
        episodes = []
        for start, length in zip(ds.episode_starts, lengths):
            rows = slice(start, start + length)
            episodes.append({"observations": np.concatenate([ds.observations[rows], ds.next_observations[rows][-1:]]),
                             "actions": ds.actions[rows], "rewards": ds.rewards[rows],
                             "terminations": ds.terminals[rows] > 0, "truncations": ds.timeouts[rows] > 0})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data_dir = write_minari(path, obs_dim, act_dim, episodes)
        import gymnasium as gym

        apply_minari_edits(data_dir, [("meta", "env_spec", gym.spec("Pendulum-v1").to_json())])
    if obs_dim != 3:
        outcome = Outcome.error("observations", "observation width .* does not match env")
    elif act_dim != 1:
        outcome = Outcome.error("actions", "action width .* does not match env")
    else:
        outcome = OK
    COUNTS["env widths"] += 1
    try:
        config = DataConfig(make_if_missing=False, d4rl_trajectories=True)
        check(lambda: load_for_training(path, config).dataset, outcome, None, f"{source} (env)")
    finally:
        if source == "minari":
            shutil.rmtree(suite.local_path(path), ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------- safe loading
class _Payload:
    """Unpickling this creates the file `marker` (what a malicious pickle could do instead)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_no_loader_unpickles_user_data(tmp_path):
    """A pickled object array in an .npz is refused with a DatasetError naming the field (numpy's own
    ValueError never escapes), a pickle file named .npz is refused, and pickled bytes stored in an HDF5
    file or in a Minari dataset's infos are never unpickled: the marker file that unpickling would
    create never appears and pickle.load/loads are never called."""
    from offrl.data import load_dataset

    control = tmp_path / "control"  # the payload is live: numpy with allow_pickle=True runs it
    evil = np.empty(1, dtype=object)
    evil[0] = _Payload(control)
    np.savez(tmp_path / "control.npz", observations=evil)
    with np.load(tmp_path / "control.npz", allow_pickle=True) as f:
        f["observations"]
    assert control.exists() and UNPICKLED
    del UNPICKLED[:]

    marker = tmp_path / "unpickled"
    ds = Dataset(np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32), np.zeros(4, np.float32),
                 np.ones((4, 2), np.float32), np.array([0, 0, 0, 1], np.float32), np.zeros(4, np.float32),
                 np.array([0]), {}).validate()
    arrays = {k: getattr(ds, k) for k in NPZ_FIELDS}
    evil = np.empty(4, dtype=object)
    evil[:] = [_Payload(marker)] * 4
    for name in NPZ_FIELDS:
        np.savez(tmp_path / "evil.npz", **{**arrays, name: evil})
        del UNPICKLED[:]
        with pytest.raises(DatasetError) as err:
            load_dataset(str(tmp_path / "evil.npz"))
        assert err.value.field == name and "pickle" in err.value.problem, err.value
        assert not marker.exists() and not UNPICKLED
    # an extra key holding a pickled object is ignored, not unpickled
    np.savez(tmp_path / "extra.npz", **arrays, notes=evil)
    assert len(load_dataset(str(tmp_path / "extra.npz"))) == 4
    (tmp_path / "whole.npz").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(DatasetError, match="pickle"):
        load_dataset(str(tmp_path / "whole.npz"))
    assert not marker.exists() and not UNPICKLED

    # HDF5: h5py reads opaque bytes as numpy void, never as a pickle
    payload = Void(pickle.dumps(_Payload(marker)))
    write_h5(tmp_path / "evil.hdf5", {**arrays, "rewards": np.array([np.void(bytes(payload))] * 4)})
    with pytest.raises(DatasetError) as err:
        load_dataset(str(tmp_path / "evil.hdf5"))
    assert err.value.field == "rewards" and "dtype" in err.value.problem
    write_h5(tmp_path / "extra.hdf5", {**arrays, "pickled_infos": payload})
    assert len(load_dataset(str(tmp_path / "extra.hdf5"))) == 3
    assert not marker.exists() and not UNPICKLED

    # Minari: a pickle in an episode's infos is left alone
    episodes = [{"observations": np.zeros((4, 2), np.float32), "actions": np.zeros((3, 1), np.float32),
                 "rewards": np.zeros(3), "terminations": np.array([0, 0, 1], bool), "truncations": np.zeros(3, bool)}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data_dir = write_minari("fuzz/pickled-infos-v0", 2, 1, episodes)
    apply_minari_edits(data_dir, [("replace", "episode_0/infos/state", payload)])
    assert len(load_dataset("fuzz/pickled-infos-v0")) == 3
    assert not marker.exists() and not UNPICKLED


# ------------------------------------------------------------------------------------------ report
def test_zz_example_counts(record_property, capsys):
    """How many generated cases ran per source (printed to the terminal; also a junit property)."""
    sources = ("d4rl", "npz", "minari", "env widths")
    ran = {s: COUNTS[s] for s in sources}
    detail = {s: {o: COUNTS[(s, o)] for o in ("valid", "refused") if COUNTS[(s, o)]} for s in ("d4rl", "npz", "minari")}
    line = "fuzz examples per source: " + ", ".join(f"{s} {n}" for s, n in ran.items()) + f" ({detail})"
    with capsys.disabled():
        print(f"\n{line}")
    record_property("fuzz_examples", json.dumps(ran))
    if any(ran.values()):  # (when run alone, e.g. with -k, the fuzz tests did not run)
        for source in ("d4rl", "npz", "minari"):
            if ran[source]:
                assert COUNTS[(source, "valid")] and COUNTS[(source, "refused")], detail
