"""Checkpoints: written atomically (temp file in the same folder, fsync, rename) and read with
`torch.load(weights_only=True)`, so a crash mid-write never replaces a good checkpoint and a file
cannot execute code when loaded."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from offrl.errors import CheckpointError



def run_checkpoint(run_dir: str | os.PathLike) -> Path:
    """Where a run folder keeps its latest checkpoint (written by offrl.run, found by resume, eval, sweeps)."""
    return Path(run_dir) / "checkpoints" / "last.pt"


def save(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: file not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path}: cannot be loaded (corrupt, truncated, or not an offrl "
                              f"checkpoint): {first_line}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: expected a dict, found {type(state).__name__}")
    return state


def load_state_dicts(objects: dict[str, Any], states: dict[str, Any], source: str) -> None:
    """Load each object's state, naming the object when keys or shapes do not match."""
    missing = sorted(set(objects) - set(states))
    if missing:
        raise CheckpointError(f"checkpoint {source}: has no state for {', '.join(missing)}")
    for name, obj in objects.items():
        try:
            obj.load_state_dict(states[name])
        except (RuntimeError, KeyError, ValueError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise CheckpointError(f"checkpoint {source}: state of '{name}' does not fit this config: {first_line}") from None



class Stateful:
    """`state_dict` / `load_state_dict` for an agent: the attributes named in STATE (modules,
    optimizers, schedulers: anything with state_dict) and in VALUES (tensors, restored in place, and
    plain numbers such as update counters)."""

    STATE: tuple[str, ...] = ()
    VALUES: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, name).state_dict() for name in self.STATE}
        for name in self.VALUES:
            value = getattr(self, name)
            state[name] = value.detach().clone() if torch.is_tensor(value) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            getattr(self, name).load_state_dict(state[name])
        for name in self.VALUES:
            current = getattr(self, name)
            if torch.is_tensor(current):
                with torch.no_grad():
                    current.copy_(state[name])
            else:
                setattr(self, name, type(current)(state[name]))
