"""One logger for a run: `metrics.jsonl` (one JSON object per logged step), `config.json`,
`environment.json` (package versions, git commit, device) and wandb (offline by default)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

PACKAGES = ("offrl", "torch", "numpy", "gymnasium", "mujoco", "minari", "tyro", "wandb", "h5py")


def environment_info(device) -> dict[str, Any]:
    import torch

    from offrl.nets import cpu_has_native_bf16, cpu_model

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_native_bf16": cpu_has_native_bf16(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "packages": versions,
        "git_commit": git_commit(),
        "argv": sys.argv,
    }
    if getattr(device, "type", None) == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
    return info


def git_commit() -> str | None:
    """The commit of the offrl source tree (with '-dirty' when it has uncommitted changes)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5).stdout.strip()
        if not commit:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_json(path: Path, value, **dumps) -> None:
    """Write a run record atomically (a temp file beside it, flushed to disk, then os.replace): a process killed
    mid-write, or a machine that loses power after it, leaves the old record or the new one whole, never a cut-off
    or empty one (the sweeps read final.json as the sign of a finished run)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(value, **dumps))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Logger:
    def __init__(self, run_dir: Path, config: dict, log_cfg, algo: str, dataset: str, device,
                 wandb_id: str | None = None, resumed: bool = False, concurrent: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "config.json", config, indent=2, default=str)
        env_path = self.run_dir / "environment.json"
        info = environment_info(device)
        if resumed and env_path.exists():  # keep where the run started; record each resume's environment
            try:
                started = json.loads(env_path.read_text())
            except ValueError:  # damaged outside offrl (its own writes are atomic): keep it aside, record anew
                env_path.replace(env_path.with_name(env_path.name + ".damaged"))
                print(f"warning: {env_path} could not be read; kept as {env_path.name}.damaged, a new record "
                      "starts with this resume", file=sys.stderr)
                started = {"resumes": []}
            started.setdefault("resumes", []).append(info)
            info = started
        write_json(env_path, info, indent=2)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._file = open(self.metrics_path, "a")
        self._last_line = last_line(self.metrics_path)
        self.wandb_run = None
        self.wandb_id = wandb_id
        if log_cfg.wandb != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wandb_run = wandb.init(
                project=log_cfg.project, group=log_cfg.group or f"{algo}-{dataset}", name=self.run_dir.name,
                dir=str(self.run_dir), config=config, mode=log_cfg.wandb, id=wandb_id,
                resume="allow" if resumed else None,
                reinit="create_new" if concurrent else "finish_previous",
            )
            self.wandb_id = self.wandb_run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "time": round(time.time(), 3), **metrics}
        line = json.dumps(row)
        try:
            self._file.write(line + "\n")
            self._file.flush()
            self._last_line = line
        except OSError as exc:
            from offrl.checkpoint import NO_SPACE
            from offrl.errors import OffrlError

            if exc.errno not in NO_SPACE:
                raise
            raise OffrlError(f"{self.metrics_path}: cannot be written ({os.strerror(exc.errno)}) at step {step}; "
                             "the run stops, its last checkpoint is unchanged (--resume latest once there is room)") from None
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def metrics_end(self) -> tuple[int, str]:
        """metrics.jsonl's length now (every row is flushed as it is logged) and its last line, which a checkpoint
        records (`truncate_metrics`). Synced to disk first (once a checkpoint): a machine that crashes keeps the
        rows a surviving checkpoint counts on, which a resume would not log again."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return os.fstat(self._file.fileno()).st_size, self._last_line

    def close(self) -> None:
        self._file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def last_line(path: Path) -> str:
    """The file's last line without its newline ('' for an empty or missing file)."""
    if not path.exists():
        return ""
    return path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1].decode(errors="replace")


def step_of(line: str) -> int | None:
    """The step of one metrics.jsonl row; None for a line cut off by a killed process (or without a step)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(path: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl. A last line cut off by a killed process is left out (a resume drops it
    too: `truncate_metrics`); a damaged line before it raises ValueError naming it."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON ({e})") from None
    return rows


def truncate_metrics(path: Path, last_step: int, checkpoint_end: tuple[int, str] | None = None) -> None:
    """Drop what a resumed run will log again: rows written after its checkpoint, rows logged after `last_step`,
    and a last line cut off by a killed process. `checkpoint_end` = (the file's length, its last line) when the
    checkpoint was saved, where the checkpoint recorded them: the file is cut there, which also drops rows of the
    checkpoint's own step logged after it (a final evaluation after an early stop). Where the file no longer has
    that line ending there (edited since, e.g. a damaged line mended), it is cut by step alone, with a warning."""
    if not path.exists():
        return
    data = path.read_bytes()
    if checkpoint_end is not None:
        length, line_then = checkpoint_end
        if data[:length].endswith((line_then + "\n").encode()) or (length == 0 and not line_then):
            data = data[:length]
        else:
            print(f"warning: {path} changed since the checkpoint was saved; rows logged after it at its own step "
                  f"({last_step}) are kept, rows after that step dropped", file=sys.stderr)
    kept = [line for line in data.decode(errors="replace").splitlines()
            if line.strip() and (step := step_of(line)) is not None and step <= last_step]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write("".join(line + "\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Progress:
    """A one-line progress display: redrawn in place on a terminal (at most 5 times a second), a plain
    line every `min_interval` seconds (and when forced, e.g. at every evaluation) otherwise. Counts
    training steps by default; `unit` names other things counted (transitions, episodes)."""

    def __init__(self, total: int, label: str, enabled: bool = True, start: int = 0, min_interval: float = 10.0,
                 unit: str = "step"):
        self.total, self.label, self.enabled, self.unit = total, label, enabled, unit
        self.tty = sys.stderr.isatty()
        self.start_time, self.start_step = time.perf_counter(), start
        self.last_print = 0.0
        self.min_interval = min_interval
        self.score: float | None = None

    def steps_per_second(self, step: int) -> float:
        elapsed = time.perf_counter() - self.start_time
        return (step - self.start_step) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, score: float | None = None, force: bool = False, extra: str | None = None) -> None:
        """`extra` replaces the training line's 'eval score' field."""
        if score is not None:
            self.score = score
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_print < (0.2 if self.tty else self.min_interval):
            return
        self.last_print = now
        rate = self.steps_per_second(step)
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        if extra is None:
            extra = f"eval score {self.score:.1f}" if self.score is not None else "eval score -"
        line = (f"{self.label} | {self.unit} {step}/{self.total} ({100 * step / max(self.total, 1):.0f}%) | "
                f"{rate:.0f} {self.unit}s/s | {extra} | eta {_duration(eta)}")
        self._write(("\r" + line + "\033[K") if self.tty else line + "\n")

    def _write(self, text: str) -> None:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except OSError:  # a closed terminal (EIO until its SIGHUP arrives): no progress, the training goes on
            self.enabled = False

    def close(self) -> None:
        if self.enabled and self.tty:
            self._write("\n")


def _duration(seconds: float) -> str:
    if seconds != seconds:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
