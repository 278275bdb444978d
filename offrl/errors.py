"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class OffrlError(Exception):
    """Base class for errors caused by input (files, options), not by bugs."""


class DatasetError(OffrlError):
    """A dataset that cannot be used: missing, unreadable, misaligned, non-finite or mismatched."""

    def __init__(self, source: str, problem: str, field: str | None = None):
        self.source, self.problem, self.field = source, problem, field
        where = f"field '{field}': " if field else ""
        super().__init__(f"dataset {source}: {where}{problem}")


class CheckpointError(OffrlError):
    """A checkpoint that cannot be loaded (missing, truncated, or from another config)."""


class TrainingDiverged(OffrlError):
    """A loss became NaN/inf; the last good checkpoint is kept."""


class StopRequested(Exception):
    """A stop signal arrived during long work before a run's first step (a dynamics model training, or waiting
    for another process's training of it); the work has checkpointed what it had (the message says where).
    Not an OffrlError: `Run.before_first_step` turns it into the run's stop."""
