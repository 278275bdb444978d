"""Checkpoints: written atomically (temp file in the same folder, fsync, rename), carrying a SHA-256
of their contents, and read with `torch.load(weights_only=True)`. A crash mid-write never replaces a
good checkpoint, a file damaged later (truncated, bit flips) is detected rather than half-loaded, and
a file cannot execute code when loaded.

A file is `torch.save({"format": FORMAT, "sha256": hex, "payload": uint8 tensor})`, the payload being
the `torch.save` bytes of the state. Files written before the checksum existed (a plain state dict)
still load. `save(..., keep_previous=True)` first keeps the current file as `previous_path(path)` (a
hard link, so some checkpoint exists at every instant), and `load_or_previous` falls back to it, with
a warning, when the newest is damaged."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from offrl.errors import CheckpointError, StopRequested

try:
    import fcntl
except ImportError:  # not POSIX: no file locks
    fcntl = None

FORMAT = "offrl-checkpoint-v2"
# errors that mean the disk (or a quota or file-size limit) has no room for the file
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def run_checkpoint(run_dir: str | os.PathLike) -> Path:
    """Where a run folder keeps its latest checkpoint (written by offrl.run, found by resume, eval, sweeps)."""
    return Path(run_dir) / "checkpoints" / "last.pt"


def previous_path(path: str | os.PathLike) -> Path:
    """The checkpoint kept from before the latest save (`checkpoints/last.pt` -> `checkpoints/previous.pt`)."""
    path = Path(path)
    return path.with_name("previous.pt") if path.name == "last.pt" else path.with_name(f"{path.stem}.previous{path.suffix}")


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    last = run_checkpoint(run_dir)
    return last.exists() or previous_path(last).exists()


# Written into a run folder when training stopped on a NaN/inf (offrl.run), removed when the run is resumed.
DIVERGED_FILE = "diverged.json"


def diverged(run_dir: str | os.PathLike) -> dict | None:
    """What a run folder's diverged.json says (step, metrics, value, last_checkpoint_step), or None: a run
    that stopped on a NaN/inf and has not been resumed since."""
    path = Path(run_dir) / DIVERGED_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # cut short: still a divergence
        return {}


def try_lock(file) -> bool:
    """Take an exclusive flock on an open file without waiting: False when another process holds it
    (always True where there is no fcntl). The lock lasts while any process has the file open, so a child
    given the descriptor (subprocess `pass_fds`) holds it until it exits."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def exclusive(lock_path: str | os.PathLike, waiting: str | None = None, should_stop: Callable[[], bool] | None = None,
              poll_seconds: float = 0.5):
    """Hold an exclusive lock on the file `lock_path` for the block; when another process holds it, print
    `waiting` to stderr once and wait until it lets go (at the latest when that process exits). With
    `should_stop`, the wait looks at it every `poll_seconds` and gives up with StopRequested when it is true
    (a signal handler that only sets a flag cannot end a blocking flock: the call is retried after it)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        if not try_lock(lock):
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            if should_stop is None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            else:
                while not try_lock(lock):
                    if should_stop():
                        raise StopRequested(f"stopped waiting for the lock {lock_path}")
                    time.sleep(poll_seconds)
        yield


def claim_run_folder(run_dir: str | os.PathLike):
    """Claim a run folder for this process: a POSIX record lock (lockf) on `<run_dir>/.lock`, held while the
    returned file is open and at the latest until the process exits. Another process holding it (a run still
    going there, e.g. the same `--resume latest` started twice) is a CheckpointError, raised before anything
    in the folder is read or changed. A record lock belongs to its process, so a process may claim a folder
    it holds again (a run resumed in the process that ran it); and closing any file of `.lock` in the process
    releases it, so a claim is closed when its run ends (Run.finish, a divergence), not left to the collector."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = open(run_dir / ".lock", "a")
    if fcntl is not None:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise CheckpointError(f"run folder {run_dir} is in use by another process (a run still going there): "
                                      "wait for it to end or stop it first") from None
            # e.g. NFS without a lock daemon (ENOLCK), a Lustre mount without flock (ENOSYS/EOPNOTSUPP)
            raise CheckpointError(f"run folder {run_dir}: its file system refuses the lock that keeps two processes "
                                  f"from training in one folder ({os.strerror(exc.errno)}); put --run.out-dir on a "
                                  "file system with POSIX locks (a local disk, NFS with its lock daemon)") from None
    return lock


def _encode(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getbuffer()
    return {"format": FORMAT, "sha256": hashlib.sha256(raw).hexdigest(),
            "payload": torch.frombuffer(bytearray(raw), dtype=torch.uint8)}


def save(path: str | os.PathLike, state: dict[str, Any], keep_previous: bool = False) -> Path:
    """Write `state` to `path` atomically. A full disk raises CheckpointError and leaves `path` as it was."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        encoded = _encode(state)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(encoded, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            _keep(path, previous_path(path))
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise CheckpointError(f"checkpoint {path}: cannot be written ({os.strerror(exc.errno)}); the "
                                  "checkpoint already there is unchanged") from None
        raise
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return path


def _keep(path: Path, previous: Path) -> None:
    """previous <- path, atomically, without a moment in which neither exists."""
    link = previous.with_name(f".{previous.name}.link")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    try:
        os.link(path, link)
    except OSError:  # a file system without hard links
        shutil.copyfile(path, link)
    os.replace(link, previous)


def remove_stale_temporaries(folder: str | os.PathLike) -> None:
    """Delete the temp files of writes that a killed process never finished."""
    for stale in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: file not found")
    # The envelope (a byte payload and its hash) stays on the CPU, where its bytes are read; only the
    # checkpoint inside goes to map_location (a CUDA run resuming read the payload on the GPU before).
    state = _torch_load(path, path, "cpu")
    if state.get("format") != FORMAT or "payload" not in state:  # a plain torch.save file
        return _torch_load(path, path, map_location)
    raw = state["payload"].numpy().tobytes()
    if hashlib.sha256(raw).hexdigest() != state.get("sha256"):
        raise CheckpointError(f"checkpoint {path}: corrupt (its contents do not match their SHA-256)")
    return _torch_load(io.BytesIO(raw), path, map_location)


def _torch_load(source, path: Path, map_location) -> dict[str, Any]:
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path}: cannot be loaded (corrupt, truncated, or not an offrl "
                              f"checkpoint): {first_line}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: expected a dict, found {type(state).__name__}")
    return state


def load_or_previous(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], Path]:
    """`path`'s state, or, when it is missing or damaged, the previous checkpoint's (with a warning on
    stderr); returns the state and the file it came from. Raises when neither loads."""
    path = Path(path)
    try:
        return load(path, map_location), path
    except CheckpointError as error:
        previous = previous_path(path)
        if not previous.is_file():
            raise
        state = load(previous, map_location)
        print(f"warning: {error}; using the previous checkpoint {previous} (step {state.get('step', '?')})",
              file=sys.stderr)
        return state, previous


# Objects checkpoints hold only since a later version: an older checkpoint without one resumes with the
# object as the run built it, and a warning saying what that means
ADDED_LATER = {
    "dynamics_model": "the dynamics model this run loaded (the cache entry or --model-path)",
    "last_rollout": "no rollout/* metrics logged until the next rollout round",
}


def load_state_dicts(objects: dict[str, Any], states: dict[str, Any], source: str) -> None:
    """Load each object's state, naming the object when keys or shapes do not match."""
    missing = sorted(set(objects) - set(states))
    if older := [name for name in missing if name in ADDED_LATER]:
        print(f"warning: checkpoint {source} predates saving {', '.join(older)}; resuming with "
              f"{'; '.join(ADDED_LATER[name] for name in older)}", file=sys.stderr)
        missing = [name for name in missing if name not in ADDED_LATER]
        objects = {name: obj for name, obj in objects.items() if name not in older}
    if missing:
        raise CheckpointError(f"checkpoint {source}: has no state for {', '.join(missing)}")
    for name, obj in objects.items():
        try:
            load_state(obj, states[name])
        except (RuntimeError, KeyError, ValueError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise CheckpointError(f"checkpoint {source}: state of '{name}' does not fit this config: {first_line}") from None


def load_state(obj: Any, state: Any) -> None:
    """obj.load_state_dict(state); an optimizer keeps the `capturable` flags it was built with. A checkpoint's flags
    belong to the device it was written on: True from a CUDA run fails on the CPU (a resume may change --device),
    and False from an older CUDA run would make a capturable-built Adam read its step count with .item()."""
    if not isinstance(obj, torch.optim.Optimizer):
        obj.load_state_dict(state)
        return
    built = [group.get("capturable") for group in obj.param_groups]
    obj.load_state_dict(state)
    for group, flag in zip(obj.param_groups, built):
        if flag is not None:
            group["capturable"] = flag


class Stateful:
    """`state_dict` / `load_state_dict` for an agent: the attributes named in STATE (modules,
    optimizers, schedulers: anything with state_dict) and in VALUES (tensors, restored in place, and
    plain numbers such as update counters, or dicts of tensors such as metrics carried between steps).
    VALUES_ADDED_LATER: those of VALUES that checkpoints of an older offrl lack; such a checkpoint keeps them
    as the agent was built."""

    STATE: tuple[str, ...] = ()
    VALUES: tuple[str, ...] = ()
    VALUES_ADDED_LATER: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, name).state_dict() for name in self.STATE}
        for name in self.VALUES:
            value = getattr(self, name)
            if isinstance(value, dict):
                state[name] = {k: v.detach().clone() for k, v in value.items()}
            else:
                state[name] = value.detach().clone() if torch.is_tensor(value) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            load_state(getattr(self, name), state[name])
        for name in self.VALUES:
            if name not in state and name in self.VALUES_ADDED_LATER:
                print(f"warning: the checkpoint predates saving {type(self).__name__}'s {name}; resuming with it as "
                      "built", file=sys.stderr)
                continue
            current = getattr(self, name)
            if torch.is_tensor(current):
                with torch.no_grad():
                    current.copy_(state[name])
            else:
                setattr(self, name, type(current)(state[name]))


def stream_seed(seed: int, stream: str) -> int:
    """A seed for the named random stream `stream` of run seed `seed`, unrelated to `seed` and to every other
    (seed, stream) pair. Two generators seeded alike draw the same random words, so a second stream seeded
    with the run's seed would replay its batches' draws, and one seeded with seed + k another seed's under
    --seeds."""
    digest = hashlib.blake2b(f"{seed}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are 64-bit; keep it non-negative


_CPU_GENERATOR_STATE_BYTES = torch.Generator().get_state().numel()  # Mersenne Twister: 5056
_CUDA_GENERATOR_STATE_BYTES = 16  # Philox: seed and offset


def restore_generator(generator: torch.Generator, state: torch.Tensor) -> None:
    """Set `generator` to a saved state (`generator.get_state()`). A CPU generator's state (5056 bytes) and a
    CUDA one's (seed and offset, 16 bytes) do not fit each other: from a checkpoint of the other device type (a
    CUDA run resumed or evaluated on the CPU, or the other way) the stream starts afresh from a seed derived
    from the saved state, so the run stays reproducible but does not draw what it would have on the device it
    was saved on (`Run.steps` says so when a resume changes the device type)."""
    state = state.cpu()  # generator states are CPU byte tensors, also for CUDA; map_location may have moved it
    sizes = {state.numel(), generator.get_state().numel()}
    if sizes != {_CPU_GENERATOR_STATE_BYTES, _CUDA_GENERATOR_STATE_BYTES}:  # the same type, or a damaged state
        generator.set_state(state)  # (torch refuses a state of the wrong size)
        return
    digest = hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest()
    generator.manual_seed(int.from_bytes(digest, "little") >> 1)


class SeededGenerator:
    """A torch.Generator that a run checkpoints (model rollouts, TD3+BC's smoothing noise) (state_dict / load_state_dict).
    With `stream`, seeded by `stream_seed(seed, stream)`."""

    def __init__(self, device: torch.device | str, seed: int, stream: str | None = None):
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed if stream is None else stream_seed(seed, stream))

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        restore_generator(self.generator, state["state"])
