"""Train a dynamics ensemble on a dataset, or find the one already trained: `python -m world_models.train`.

    python -m world_models.train --dataset offrl/hopper/medium-replay-v0
    python -m world_models.train --dataset my-data.npz --model.max-epochs 50 --seed 1
    python -m world_models.train --dataset offrl/tiny-v0 --retrain
    python -m world_models.train --dataset offrl/hopper/medium-v0 --model.max-epochs 50 --status  # trained yet?

A trained model is cached under `<cache>/<dataset checksum>-<config hash>/model.pt`, where the hash
covers the ensemble config and the seed, so every algorithm run on the same data and config reuses
it (`world_models.train.load_or_train`); the algorithms' `--model-path` names a model file explicitly. Training
writes its full state after every epoch (`training.pt` beside it), so a killed training continues
from its last epoch when started again. Processes that ask for the same model at once (the seeds of a
MOPO sweep) do not all train it: one does, holding `lock` in the model's folder, and the others wait for
it and reuse its model. Files are written atomically and read with `torch.load(weights_only=True)`.

The model file also records how it was trained: epochs, and wall and CPU seconds summed over every process
that trained it (kept in `training.pt` across resumes; a training begun before offrl timed it is timed from
the epoch it continued at, `timed_from_epoch`) with the last process's machine. A model-based run copies
that, the file's SHA-256 and its model's hold-out errors and elites into its final.json (`dynamics_model`,
`model_record`), and `benchmarks.table` lists the models of its model-based rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from offrl import checkpoint as ckpt
from offrl.config import resolve_device
from offrl.data.dataset import Dataset
from offrl.data.sources import NEXT_ROW, UNKNOWN_AT_EPISODE_ENDS
from offrl.errors import CheckpointError, OffrlError, StopRequested
from offrl.nets import retain_freed_memory, seeded_cpu_init, warn_if_emulated_bf16
from world_models.ensemble import (DynamicsEnsemble, EnsembleConfig, EnsembleTrainer, check_config, fit,
                                   transitions_to_training)

FORMAT = "offrl-dynamics-v1"


def default_cache() -> Path:
    """$OFFRL_MODELS, else ~/.cache/offrl/models (an empty OFFRL_MODELS too: it cached models in the working
    folder, as Path("") is ".")."""
    return Path(os.environ.get("OFFRL_MODELS") or Path.home() / ".cache" / "offrl" / "models")


@dataclass
class TrainModelConfig:
    dataset: str = "offrl/tiny-v0"
    """Minari dataset id, D4RL .hdf5 or offrl .npz file."""
    model: EnsembleConfig = field(default_factory=EnsembleConfig)
    """The ensemble's architecture and training (with the dataset and seed, its cache key)."""
    seed: int = 0
    """Seed of the holdout split, bootstrap samples and initialization."""
    device: str = "auto"
    """'auto' (cuda when available), 'cpu', 'cuda', ..."""
    threads: int = 1
    """torch CPU threads (0: torch's default)."""
    download: bool = False
    """Fetch a Minari dataset that is not on this machine (e.g. mujoco/hopper/medium-v0) from Minari's remote, as
    the algorithms' --data.download does."""
    cache_dir: Optional[str] = None
    """Where trained models are kept (default: $OFFRL_MODELS or ~/.cache/offrl/models)."""
    retrain: bool = False
    """Train a new model even when the cache has one for this dataset and config."""
    progress: bool = True
    """Print a line per epoch: train NLL and holdout MSE per member."""
    status: bool = False
    """Say where this dataset, config and seed's model stands in the cache (trained, a training stopped or
    going on at some epoch, with the CPU hours its remaining epochs take at most at its pace, not begun) and
    exit: trains nothing, makes no dataset, waits for no lock (it takes a free one for an instant)."""


def cache_key(dataset_checksum: str, cfg: EnsembleConfig, seed: int) -> str:
    model = asdict(cfg)
    if model["precision"] == "fp32":  # as before the option existed: float32 models keep their keys
        del model["precision"]
    if not model["compile"]:  # eager models too
        del model["compile"]
    config = json.dumps({"model": model, "seed": seed}, sort_keys=True)
    return f"{dataset_checksum}-{hashlib.sha256(config.encode()).hexdigest()[:12]}"


def save_model(path: Path, model: DynamicsEnsemble, dataset_checksum: str, seed: int, extra: dict | None = None) -> Path:
    config = asdict(model.cfg)
    if not config["compile"]:  # an eager model's file as before the option existed: older offrl versions load it
        del config["compile"]
    # on the host, as policy files: a model trained on CUDA loads with a plain torch.load on a machine without one
    weights = model.state_dict()
    for name, value in weights.items():  # in place: the OrderedDict and its metadata, so the same bytes on the CPU
        weights[name] = value.cpu()
    return ckpt.save(path, {"format": FORMAT, "model": weights, "obs_dim": model.obs_dim,
                            "act_dim": model.act_dim, "config": json.dumps(config), "seed": seed,
                            "dataset_checksum": dataset_checksum, **(extra or {})})


def model_record(path: str | Path, model: DynamicsEnsemble) -> dict:
    """What a model-based run rolled out, for its final.json: `model`'s hold-out errors, elites and config, and
    from its file (when the file still holds this model) the file's SHA-256, epochs and training time and
    machine ('training' is None for models saved before offrl recorded it)."""
    record = {"file": str(path), "holdout_mse": model.holdout_mse.tolist(), "elites": model.elites,
              "config": asdict(model.cfg)}
    try:
        state = ckpt.load(path, map_location="cpu")
        same = torch.equal(state["model"]["holdout_mse"], model.holdout_mse.cpu())
    except (CheckpointError, KeyError, TypeError) as exc:
        return {**record, "file_unread": str(exc)}
    if not same:  # the cache entry was trained again while this run was stopped; the run kept its own model
        return {**record, "file_unread": "the file holds another model now (trained again since this run began)"}
    return {**record, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16],
            "dataset_checksum": state.get("dataset_checksum"), "seed": state.get("seed"),
            "epochs": state.get("epochs"), "training": state.get("training")}


def load_model(path: str | Path, device: torch.device | str = "cpu", obs_dim: int | None = None,
               act_dim: int | None = None) -> DynamicsEnsemble:
    """A saved model; with obs_dim/act_dim, a model of other dims is refused with a clear error."""
    state = ckpt.load(path, map_location="cpu")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"dynamics model {path}: not an offrl dynamics model (no '{FORMAT}' format tag)")
    if (obs_dim is not None and state["obs_dim"] != obs_dim) or (act_dim is not None and state["act_dim"] != act_dim):
        raise CheckpointError(f"dynamics model {path}: made for obs {state['obs_dim']} / act {state['act_dim']}, "
                              f"the data has obs {obs_dim} / act {act_dim}")
    saved = json.loads(state["config"])
    if unknown := sorted(set(saved) - {f.name for f in fields(EnsembleConfig)}):  # options of a newer offrl
        print(f"warning: dynamics model {path} was saved with options this offrl does not know ({', '.join(unknown)}); "
              "loading it without them", file=sys.stderr)
    cfg = EnsembleConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k not in unknown})
    with torch.random.fork_rng(devices=[]):  # the weights are overwritten: leave the caller's RNG as it was
        model = DynamicsEnsemble(state["obs_dim"], state["act_dim"], cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"dynamics model {path}: weights do not fit its config: {str(exc).splitlines()[0]}") from None
    return model.to(device)


def model_rows(dataset: Dataset) -> np.ndarray | slice:
    """The rows a dynamics model learns from: all of them, but for data whose s' was taken from the next row
    (a D4RL file without next_observations: metadata "next_observations" = "next row") the terminal rows, whose
    s' is then the next episode's first state, are left out, as OfflineRL-Kit's qlearning_dataset leaves them
    out. (The Q-learners keep them: their targets do not read s' there.) Recorded D4RL trajectories without
    next_observations (UNKNOWN_AT_EPISODE_ENDS) leave out each episode's last row, whose s' is s itself."""
    if dataset.metadata.get("next_observations") == NEXT_ROW:
        return np.flatnonzero(dataset.terminals == 0)
    if dataset.metadata.get("next_observations") == UNKNOWN_AT_EPISODE_ENDS:
        last = np.zeros(len(dataset), dtype=bool)
        last[dataset.episode_ends() - 1] = True
        return np.flatnonzero(~last)
    return slice(None)


def cache_folder(dataset: Dataset, cfg: EnsembleConfig, seed: int, cache_dir: str | Path | None = None,
                 checksum: str | None = None) -> Path:
    """Where the model of this dataset, config and seed is cached: <cache>/<checksum>[-rows left out]-<config hash>.
    The checksum is of `dataset` as given (`checksum`, when the caller has it): data corrupted or clipped after
    loading (--data.corrupt, --data.clip-actions) gets its own entry, though its metadata keep the file's checksum;
    for data as loaded the two agree, so models cached before keep their entries."""
    checksum = checksum or dataset.checksum()
    # a model trained without some rows gets its own cache entry, apart from any trained on them
    left_out = {NEXT_ROW: "nonterminal", UNKNOWN_AT_EPISODE_ENDS: "without-episode-ends"}
    rows = model_rows(dataset)
    rows_key = checksum if isinstance(rows, slice) else f"{checksum}-{left_out[dataset.metadata['next_observations']]}"
    root = Path(cache_dir or default_cache())
    if root.exists() and not root.is_dir():  # else NotADirectoryError at the lock, or 'not begun' under --status
        raise OffrlError(f"the dynamics-model cache {root} (--cache-dir, else OFFRL_MODELS or ~/.cache/offrl/models) "
                         "is a file")
    return root / cache_key(rows_key, cfg, seed)


def model_status(dataset: Dataset, cfg: EnsembleConfig, seed: int = 0, cache_dir: str | Path | None = None) -> str:
    """One line on where the cached model of this dataset, config and seed stands, without training or waiting:
    'trained' (its epochs and file), 'training now' / 'stopped' at its last checkpointed epoch (whether a
    process holds the entry's lock; with --model.max-epochs, the CPU hours the epochs left take at the pace of
    those it timed: at most, as early stopping may end it sooner), or 'not begun'."""
    folder = cache_folder(dataset, cfg, seed, cache_dir)
    path, training, lock = folder / "model.pt", folder / "training.pt", folder / "lock"
    if path.exists():
        return f"trained, {ckpt.load(path, map_location='cpu').get('epochs', '?')} epochs: {path}"
    busy = False
    if lock.exists():  # held while a process trains the entry (or waits to reuse its model)
        # taken for an instant where it is free: a training starting in that instant says it waits, and waits
        # until the file is closed here (or its next 0.5 s poll)
        with open(lock) as held:
            busy = not ckpt.try_lock(held)
    cap = "early stopping only" if cfg.max_epochs is None else f"at most {cfg.max_epochs}"
    if training.exists():
        saved = ckpt.load(training, map_location="cpu")
        epoch, spent = int(saved["epoch"]), saved.get("spent") or {}
        timed = epoch - spent.get("timed_from_epoch", epoch)
        if cfg.max_epochs is not None and timed > 0:  # the CPU time of the epochs it timed, per epoch
            hours = spent["cpu_seconds"] / timed * (cfg.max_epochs - epoch) / 3600
            cap += f"; at most {hours:.1f} CPU hours left at its pace so far"
        state = "training now" if busy else "stopped (the same command continues it)"
        return f"{state}, {epoch} epochs done ({cap}): {training}"
    return f"training now, no epoch done yet: {folder}" if busy else f"not begun: {folder}"


def load_or_train(dataset: Dataset, cfg: EnsembleConfig, seed: int = 0, device: torch.device | str = "cpu",
                  model_path: str | None = None, retrain: bool = False, cache_dir: str | Path | None = None,
                  progress: bool = True, should_stop: Callable[[], bool] | None = None) -> tuple[DynamicsEnsemble, Path]:
    """The model for `dataset` (raw, unnormalized transitions): `model_path` if given, else the cached
    one for this dataset, config and seed, else a new one trained (continuing a stopped training).
    `should_stop` (a run's stop signal): looked at after each epoch's checkpoint and while waiting for another
    process's training; when true, StopRequested says where the training stands."""
    device = torch.device(device)
    if model_path is not None:
        return load_model(model_path, device, dataset.obs_dim, dataset.act_dim), Path(model_path)
    checksum = dataset.checksum()  # of the rows as given, not the file's (metadata) one: see cache_folder
    folder = cache_folder(dataset, cfg, seed, cache_dir, checksum)
    # One process trains a cache entry (e.g. the seeds of a MOPO sweep started together); the others
    # wait for it and reuse its model instead of training the same one again.
    with ckpt.exclusive(folder / "lock", f"dynamics model: waiting for another process training {folder}",
                        should_stop):
        return _load_or_train(dataset, cfg, seed, device, folder, checksum, retrain, progress, should_stop)


def _load_or_train(dataset: Dataset, cfg: EnsembleConfig, seed: int, device: torch.device, folder: Path,
                   checksum: str, retrain: bool, progress: bool,
                   should_stop: Callable[[], bool] | None = None) -> tuple[DynamicsEnsemble, Path]:
    path, training = folder / "model.pt", folder / "training.pt"
    for entry in (path, training):  # else a traceback: IsADirectoryError from the load, or --retrain's unlink
        if entry.exists() and not entry.is_file():
            raise OffrlError(f"dynamics model cache entry {entry} is not a file; move it away (or pick another "
                             "--cache-dir) and train again")
    if path.exists() and not retrain:
        if progress:
            print(f"dynamics model: reusing {path}", file=sys.stderr)
        return load_model(path, device, dataset.obs_dim, dataset.act_dim), path
    if retrain:
        for stale in (path, training):
            stale.unlink(missing_ok=True)
    warn_if_emulated_bf16(cfg.precision, device, "--model.precision")
    rows = model_rows(dataset)
    inputs, targets = transitions_to_training(dataset.observations[rows], dataset.actions[rows],
                                              dataset.rewards[rows], dataset.next_observations[rows])
    with seeded_cpu_init(seed):
        model = DynamicsEnsemble(dataset.obs_dim, dataset.act_dim, cfg).to(device)
    trainer = EnsembleTrainer(model, inputs, targets, seed)
    spent = {"wall_seconds": 0.0, "cpu_seconds": 0.0, "timed_from_epoch": 0}
    if training.exists():
        state = ckpt.load(training, map_location=device)
        trainer.load_state_dict(state)
        # a training begun before offrl timed its epochs is timed from the epoch it continues at
        spent = state.get("spent") or {**spent, "timed_from_epoch": trainer.epoch}
        if progress:
            print(f"dynamics model: continuing the training in {training} at epoch {trainer.epoch}", file=sys.stderr)
    start, cpu_start = time.perf_counter(), time.process_time()

    def spent_so_far() -> dict:
        """Time over every process that trained this model: wall (counts pauses, e.g. SIGSTOP) and CPU
        (this process's threads, so it does not)."""
        return {**spent, "wall_seconds": spent["wall_seconds"] + time.perf_counter() - start,
                "cpu_seconds": spent["cpu_seconds"] + time.process_time() - cpu_start}

    def on_epoch(t: EnsembleTrainer) -> None:
        ckpt.save(training, {**t.state_dict(), "spent": spent_so_far()})
        if progress:
            holdout = " ".join(f"{x:.4g}" for x in t.last_holdout)
            print(f"dynamics model | epoch {t.epoch} | train NLL {np.mean(t.last_train_nll):.4g} | holdout MSE per "
                  f"member {holdout} | {t.epochs_without_improvement}/{cfg.patience} epochs without improvement | "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        if should_stop is not None and should_stop() and not t.done:
            raise StopRequested(f"the dynamics model's training is checkpointed at epoch {t.epoch} in {training} "
                                "and continues from there")

    if should_stop is not None and should_stop():  # e.g. while the data were prepared (seconds for 2M rows)
        where = f"is checkpointed at epoch {trainer.epoch} in {training}" if training.exists() else "has not begun"
        raise StopRequested(f"the dynamics model's training {where}")
    fit(model, inputs, targets, on_epoch=on_epoch, trainer=trainer)
    from offrl.logging import environment_info

    save_model(path, model, checksum, seed, {"epochs": trainer.epoch, "dataset": dataset.metadata.get("name"),
                                             "training": {**spent_so_far(), "environment": environment_info(device)}})
    training.unlink(missing_ok=True)
    if progress:
        errors = " ".join(f"{x:.4g}" for x in model.holdout_mse.tolist())
        print(f"dynamics model: {trainer.epoch} epochs; holdout MSE per member {errors}; elites {model.elites} "
              f"-> {path}", file=sys.stderr)
    return model, path


def main(cfg: TrainModelConfig) -> Path | None:
    from offrl.data import load_dataset
    from offrl.data import suite

    if cfg.threads < 0 or cfg.seed < 0:
        raise OffrlError(f"--threads {cfg.threads} --seed {cfg.seed}: neither may be negative (--threads 0: torch's "
                         "default)")
    check_config(cfg.model, training=True)  # before a cache entry is made for it
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    retain_freed_memory()  # as runs do by default (--run.retain-freed-memory)
    if cfg.status:
        if cfg.dataset in suite.known_ids() and not suite.exists(cfg.dataset):
            print(f"{cfg.dataset}: dataset not made yet")
        else:
            dataset = load_dataset(cfg.dataset, download=cfg.download)
            print(f"{cfg.dataset}: {model_status(dataset, cfg.model, cfg.seed, cfg.cache_dir)}")
        return None
    suite.ensure(cfg.dataset)
    dataset = load_dataset(cfg.dataset, download=cfg.download)
    model, path = load_or_train(dataset, cfg.model, cfg.seed, resolve_device(cfg.device), retrain=cfg.retrain,
                                cache_dir=cfg.cache_dir, progress=cfg.progress)
    print(f"holdout MSE per member: {', '.join(f'{x:.4g}' for x in model.holdout_mse.tolist())}")
    print(f"elites: {model.elites}")
    print(f"model: {path}")
    return path


if __name__ == "__main__":
    import tyro

    try:
        main(tyro.cli(TrainModelConfig))
    except OffrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C: training.pt (written atomically) holds the last finished epoch
        print("interrupted; a training is checkpointed at its last finished epoch: the same command continues it",
              file=sys.stderr)
        raise SystemExit(130) from None
