"""Run an offrl module as `python -m` would, with faults injected, for the reliability tests:

    python tests/fault_injection.py -m algos.td3_bc --steps 100 ...

Faults, from environment variables (each counts events in this process only):
    FAULT_KILL_IN_SAVE=N      the N-th checkpoint file write stops halfway and the process SIGKILLs itself
    FAULT_FULL_DISK_SAVE=N    the N-th checkpoint file write fails halfway with ENOSPC
    FAULT_FULL_DISK_LOG=N     writing the N-th metrics line fails with ENOSPC
    FAULT_SIGNAL_IN_EVAL=SIG  the first evaluation sends this process SIG (e.g. 2 = SIGINT) and goes on;
                              FAULT_SIGNAL_TWICE=1 sends it a second time as well
    FAULT_POISON=STEP         from step STEP on, every logged metric whose name contains 'loss' is NaN
                              (FAULT_POISON_VALUE=inf for +inf)
    FAULT_SIGTERM_AT_STEP=K   the run sends itself SIGTERM as training step K begins (a stop at any step,
                              not only where a checkpoint or a log row falls)
    FAULT_SIGNAL_AFTER_MODEL_EPOCH=N:SIG  a dynamics-model training sends this process SIG as its N-th epoch
                              ends (before that epoch's checkpoint); FAULT_SIGNAL_TWICE=1 sends it twice

Nothing here is imported by offrl: the faults are patched in from outside, as a test harness would.
"""

from __future__ import annotations

import errno
import io
import os
import runpy
import signal
import sys


def counter(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def patch_checkpoint_writes() -> None:
    import torch

    kill_at, full_at = counter("FAULT_KILL_IN_SAVE"), counter("FAULT_FULL_DISK_SAVE")
    if kill_at is None and full_at is None:
        return
    real_save, writes = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO) or not hasattr(f, "write"):
            return real_save(obj, f, *args, **kwargs)
        writes[0] += 1
        if writes[0] not in (kill_at, full_at):
            return real_save(obj, f, *args, **kwargs)
        data = io.BytesIO()
        real_save(obj, data, *args, **kwargs)
        f.write(data.getvalue()[: len(data.getvalue()) // 2])
        f.flush()
        if writes[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    torch.save = save


def patch_metrics_writes() -> None:
    full_at = counter("FAULT_FULL_DISK_LOG")
    if full_at is None:
        return
    from offrl import logging as offrl_logging

    real_init, lines = offrl_logging.Logger.__init__, [0]

    class FullDisk:
        def __init__(self, file):
            self._file = file

        def write(self, text):
            lines[0] += 1
            if lines[0] >= full_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self._file.write(text)

        def __getattr__(self, name):
            return getattr(self._file, name)

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._file = FullDisk(self._file)

    offrl_logging.Logger.__init__ = init


def patch_evaluation() -> None:
    sig = counter("FAULT_SIGNAL_IN_EVAL")
    if sig is None:
        return
    from offrl import run as offrl_run

    real_evaluate, calls = offrl_run.evaluate, [0]

    def evaluate(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            os.kill(os.getpid(), sig)
            if os.environ.get("FAULT_SIGNAL_TWICE"):
                os.kill(os.getpid(), sig)
        return real_evaluate(*args, **kwargs)

    offrl_run.evaluate = evaluate


def patch_losses() -> None:
    start = counter("FAULT_POISON")
    if start is None:
        return
    import torch
    from offrl import run as offrl_run

    value = float(os.environ.get("FAULT_POISON_VALUE", "nan"))
    real_log = offrl_run.Run.log

    def log(self, step, metrics, force=False):
        if step >= start:
            metrics = {k: torch.full_like(v, value) if "loss" in k else v for k, v in metrics.items()}
        return real_log(self, step, metrics, force)

    offrl_run.Run.log = log


def patch_steps() -> None:
    at = counter("FAULT_SIGTERM_AT_STEP")
    if at is None:
        return
    from offrl import multiseed, run as offrl_run

    def stopping_at(real_steps):
        def steps(*args, **kwargs):
            for step in real_steps(*args, **kwargs):
                if step == at:
                    os.kill(os.getpid(), signal.SIGTERM)
                yield step
        return steps

    offrl_run.Run._iterate = stopping_at(offrl_run.Run._iterate)
    multiseed.SeedRuns.steps = stopping_at(multiseed.SeedRuns.steps)  # --seeds: one loop for every seed's run


def patch_model_epochs() -> None:
    value = os.environ.get("FAULT_SIGNAL_AFTER_MODEL_EPOCH")
    if not value:
        return
    epoch, sig = (int(x) for x in value.split(":"))
    from world_models import ensemble

    real_train_epoch = ensemble.EnsembleTrainer.train_epoch

    def train_epoch(self):
        real_train_epoch(self)
        if self.epoch == epoch:
            os.kill(os.getpid(), sig)
            if os.environ.get("FAULT_SIGNAL_TWICE"):
                os.kill(os.getpid(), sig)

    ensemble.EnsembleTrainer.train_epoch = train_epoch


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: python tests/fault_injection.py -m MODULE [ARGS...]")
    module, args = sys.argv[2], sys.argv[3:]
    sys.path.insert(0, os.getcwd())
    patch_checkpoint_writes()
    patch_metrics_writes()
    patch_evaluation()
    patch_losses()
    patch_steps()
    patch_model_epochs()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
