"""What every training loop shares: the run folder, seeding, resume, logging, evaluation,
checkpoints, the divergence check and the final metrics. An algorithm file drives it:

    run = Run("td3_bc", cfg)
    ... build dataset, networks, optimizers ...
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):               # restores `state` first when resuming
        metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)                  # host sync only every log.every steps (and eval/checkpoint steps)
        run.evaluate(step, agent.act, data.metadata)  # every eval.every steps and at the end
        run.checkpoint(step, state)             # every run.checkpoint_every steps and at the end
    return run.finish()

A run lives in <out_dir>/<algo>/<dataset>/<seed>-<time>/ with config.json, environment.json,
metrics.jsonl, final.json and checkpoints/last.pt (and diverged.json when a NaN/inf stopped it).
Resuming reopens the folder, restores models, optimizers, sampler and RNG state, and drops metrics
logged after the checkpoint, so an interrupted-and-resumed run ends with the same numbers as an
uninterrupted one (CPU).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import errno
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from offrl import checkpoint as ckpt
from offrl.config import from_dict, option_range_problems, resolve_device, to_dict
from offrl.data.sources import sanitize
from offrl.errors import CheckpointError, OffrlError, StopRequested, TrainingDiverged
from offrl.evaluation import evaluate
from offrl.logging import Logger, Progress, truncate_metrics, write_json
from offrl.nets import gradient_step, retain_freed_memory, warn_if_emulated_bf16

# Config fields (dotted paths; a section name covers all of it) that may change when a run is resumed:
# they do not change the algorithm or its data, though threads, compiling, the device and flushing subnormals
# change float rounding (and a device its random streams). run.precision is not among them: it changes the
# numbers beyond rounding. Where a
# learning-rate schedule spans --steps (a config's `schedule_spans_steps`), a new budget changes the schedule
# from the resume on: allowed (RELIABILITY.md), with a warning.
RECORDED_DATA_OPTIONS = {"data.env_id": "env_id", "data.ref_min_score": "ref_min_score",
                         "data.ref_max_score": "ref_max_score"}
"""Data options a resume may set, unset at the start, to the value the run's dataset.json recorded."""
RESUMABLE_CHANGES = ("steps", "resume", "device", "eval", "log", "run.out_dir", "run.checkpoint_every",
                     "run.threads", "run.compile", "run.cuda_graph", "run.flush_denormal", "run.retain_freed_memory")
# The algorithms whose update reads --run.compile; the others take the option and would ignore it.
COMPILING_ALGORITHMS = ("bc", "td3_bc", "iql", "riql", "cql", "dt", "wsrl")


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{'run': {'threads': 1}} -> {'run.threads': 1}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(saved: dict, current: dict, defaults: dict) -> list[tuple[str, Any, Any]]:
    """(option, saved value, current value) for each option of a run's saved config (config.json's nesting) that
    `current` changes and a resume may not change. An option that did not exist when the run started trained
    it at the option's default (`defaults`, flattened; new options keep the old behaviour by default, but for
    resumable ones such as run.flush_denormal), so the current config must ask for that default too (e.g.
    run.precision fp32, model.precision fp32: another value would train on, or load a dynamics model, unlike
    the run's start)."""
    saved, current = flatten(saved), flatten(current)
    for key, value in defaults.items():
        saved.setdefault(key, value)
    return [(key, saved[key], current.get(key)) for key in sorted(saved)
            if not resumable(key) and saved[key] != current.get(key)]


def core_seconds_from_wall(wall_seconds: float, threads: int | None) -> float:
    """A run's core-seconds where only its wall time is known (recorded before offrl kept core-seconds): at the
    threads its config asked for, 0 or None (torch's default) read as every core."""
    return wall_seconds * (threads or os.cpu_count() or 1)


def default_config(config_cls: type) -> dict[str, Any]:
    """A Config class at its defaults, flattened as config.json stores it ({} where it has required fields)."""
    try:
        default = config_cls()
    except TypeError:
        return {}
    return flatten(json.loads(json.dumps(to_dict(default), default=str)))


def resumable(path: str) -> bool:
    return any(path == allowed or path.startswith(allowed + ".") for allowed in RESUMABLE_CHANGES)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_run_options(cfg: Any, total_steps: int, phased: bool = False) -> None:
    """Options every run shares whose bad values would otherwise fail late (at the first evaluation, after steps
    that then have no checkpoint), pass silently (a run of no steps) or look like a divergence (a batch of 0 rows
    gives NaN losses). `phased`: an algorithm whose phases count the steps (MBRCSL: --steps 0 makes rollouts only)."""
    problems = []
    if cfg.steps < 0 or (total_steps < 1 and not phased):
        problems.append(f"--steps {cfg.steps}: a run trains at least one step")
    if cfg.seed < 0:
        problems.append(f"--seed {cfg.seed}: seeds are 0 or more")
    if cfg.eval.episodes < 1:
        problems.append(f"--eval.episodes {cfg.eval.episodes}: an evaluation runs at least one episode "
                        "(--eval.every 0 evaluates only at the end)")
    if cfg.eval.every < 0 or cfg.log.every < 1 or cfg.run.checkpoint_every < 0:
        problems.append(f"--eval.every {cfg.eval.every} / --log.every {cfg.log.every} / --run.checkpoint-every "
                        f"{cfg.run.checkpoint_every}: evaluation and checkpoint periods are 0 (only at the end) or "
                        "more, the logging period 1 or more")
    if cfg.seed + cfg.eval.seed_offset < 0:
        problems.append(f"--eval.seed-offset {cfg.eval.seed_offset}: the evaluation episodes reset with seed + "
                        "offset + i, which must not be negative")
    if cfg.run.threads < 0:
        problems.append(f"--run.threads {cfg.run.threads}: 1 or more (0: torch's default)")
    problems += option_range_problems(cfg)  # the algorithm's options: learning rates, discounts, batch sizes, ...
    if cfg.log.wandb != "disabled" and importlib.util.find_spec("wandb") is None:
        problems.append(f"--log.wandb {cfg.log.wandb} needs the wandb package, which is not installed here "
                        "(pip install wandb; or --log.wandb disabled: metrics.jsonl is written either way)")
    if problems:
        raise OffrlError("; ".join(problems))


class Run:
    def __init__(self, algo: str, cfg: Any, data: Any = None, total_steps: int | None = None,
                 concurrent: bool = False, open_records: bool = True):
        """`data`: the TrainingData an offline run trains on; what it was (checksum, preprocessing,
        corrupted rows) is written to the run folder. `total_steps`: the steps the run counts, when
        they are more than `cfg.steps` (an algorithm with phases, e.g. MBRCSL). `concurrent`: other
        runs live in the same process (several seeds trained as one, `offrl.multiseed`). `open_records`
        False: the folder's records (config.json, environment.json, dataset.json, metrics.jsonl cut back to
        the checkpoint, the logger) are left as they are until `open_records()`, for a caller that may still
        refuse the resume (`offrl.multiseed`: seeds at different steps)."""
        self.algo, self.cfg = algo, cfg
        self.total_steps = cfg.steps if total_steps is None else int(total_steps)
        check_run_options(cfg, self.total_steps, phased=total_steps is not None)  # before a folder is made
        self.device = resolve_device(cfg.device)
        if cfg.run.threads:  # 0: torch's default
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.retain_freed_memory:
            retain_freed_memory()
        warn_if_emulated_bf16(cfg.run.precision, self.device, "--run.precision")
        if cfg.run.compile and algo not in COMPILING_ALGORITHMS:
            print(f"warning: --run.compile has no effect on {algo} (only {', '.join(COMPILING_ALGORITHMS)} "
                  "compile their updates)", file=sys.stderr)
        seed_everything(cfg.seed)
        self.config = json.loads(json.dumps(to_dict(cfg), default=str))  # as config.json stores it
        self.dataset_name = sanitize(cfg.run_label)
        self.resume_from: Path | None = None
        found = self._find_resume(cfg.resume) if cfg.resume else None
        if found is not None:
            self.dir, self.resume_from = found
        else:
            name = cfg.log.name or f"{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            self.dir = self._unique(Path(cfg.run.out_dir) / algo / self.dataset_name / name)
        self._folder_claim = ckpt.claim_run_folder(self.dir)  # before the folder is read or changed
        self.checkpoint_path = ckpt.run_checkpoint(self.dir)
        self.start_step = 0
        self.best_score: float | None = None
        self.last_eval: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.extra_evals: dict[str, dict[str, float]] = {}
        self.last_checkpoint_step: int | None = None
        self._restored_state: dict | None = None
        self._state: dict | None = None  # the objects a checkpoint saves, from `steps` on
        self._unchecked: tuple[int, dict] | None = None  # metrics of a step not yet checked for NaN/inf
        # wall time of the run's counted steps over all its processes; None after resuming a checkpoint
        # that did not record it (written before offrl kept it)
        self.wall_before: float | None = 0.0
        # the same times each process's torch threads (core-seconds: what a sweep's --status plans with);
        # None after resuming a checkpoint that did not record it
        self.core_before: float | None = 0.0
        self.process_share = 1.0  # this run's part of its process (--seeds: 1 / seeds)
        self.resumes = 0
        wandb_id = None
        data_record = self._data_record(data) if data is not None else None
        if self.resume_from is not None:
            self._restored_state, loaded = ckpt.load_or_previous(self.resume_from, map_location=self.device)
            if loaded != self.resume_from and self.resume_from.exists():
                # keep the damaged file for inspection, out of the way of the next save's previous.pt
                self.resume_from.replace(self.resume_from.with_name(self.resume_from.name + ".damaged"))
            self.resume_from = loaded
            ckpt.remove_stale_temporaries(self.resume_from.parent)
            ckpt.remove_stale_temporaries(self.dir)  # run records a killed write left (offrl.logging.write_json)
            self._check_same_config(self._restored_state)
            if data_record is not None:
                self._check_same_data(data_record)
            self.start_step = int(self._restored_state["step"])
            if self.start_step > self.total_steps:
                # it would train nothing and write a final.json that claims fewer steps than its metrics hold
                raise CheckpointError(f"{self.resume_from} has trained {self.start_step} steps, more than this run's "
                                      f"{self.total_steps}: resume it with --steps {self.start_step} or more, or "
                                      "start a new run folder")
            self.best_score = self._restored_state.get("best_score")
            self.last_eval = json.loads(self._restored_state.get("last_eval", "{}"))
            self.last_metrics = json.loads(self._restored_state.get("last_metrics", "{}"))
            self.extra_evals = json.loads(self._restored_state.get("extra_evals", "{}"))
            wandb_id = self._restored_state.get("wandb_id")
            self.wall_before = self._restored_state.get("wall_seconds")
            self.core_before = self._restored_state.get("core_seconds")
            if self.core_before is None and self.wall_before is not None:  # a checkpoint from before core_seconds
                saved_threads = json.loads(self._restored_state.get("config", "{}")).get("run", {}).get("threads")
                self.core_before = core_seconds_from_wall(self.wall_before, saved_threads)
            self.resumes = int(self._restored_state.get("resumes", 0)) + 1
        self.logger: Logger | None = None
        self._records = (wandb_id, concurrent, data, data_record)
        if open_records:
            self.open_records()
        # SIGTERM / SIGINT: finish the current step, checkpoint exactly there, exit (resume continues
        # bit-for-bit); a session that ends, or Ctrl-C, then loses no training.
        self.stop_signal: int | None = None
        self._preparing: tuple[str, str] | None = None  # (doing, stops) inside `before_first_step`
        self._stopping = False  # `_stop_before_first_step` under way
        self._previous_handlers = {}
        if threading.current_thread() is threading.main_thread():
            hangup = getattr(signal, "SIGHUP", None)  # a closed terminal; not on Windows
            for sig in (signal.SIGTERM, signal.SIGINT, hangup):
                if sig is None or (sig == hangup and signal.getsignal(sig) == signal.SIG_IGN):
                    continue  # started to ignore hangups (nohup): keep ignoring them
                self._previous_handlers[sig] = signal.signal(sig, self._request_stop)
        self.progress = Progress(self.total_steps, f"{algo} {cfg.run_label} seed {cfg.seed}", cfg.log.progress, self.start_step)
        self.start_time = time.perf_counter()

    def open_records(self) -> None:
        """Write the run's records and open its logger (a resume: metrics.jsonl cut back to the checkpoint first)."""
        wandb_id, concurrent, data, data_record = self._records
        if self._restored_state is not None:
            end = self._restored_state.get("metrics_end")
            truncate_metrics(self.dir / "metrics.jsonl", self.start_step, tuple(end) if end is not None else None)
        self.logger = Logger(self.dir, self.config, self.cfg.log, self.algo, self.dataset_name, self.device,
                             wandb_id=wandb_id, resumed=self.resume_from is not None, concurrent=concurrent)
        if data is not None:
            self._record_data(data, data_record)
        self._records = None

    def _request_stop(self, signum, frame) -> None:
        if self._stopping:
            return
        if self.stop_signal is not None:  # a second signal: stop now; the last periodic checkpoint stands
            raise KeyboardInterrupt
        self.stop_signal = signum
        if self._preparing is not None:
            say_stopping(signum, f"signal {signum}: stopping {self._preparing[1]}; signal again to stop at once\n")
        elif self._state is None:  # no step yet: work before the first (a dynamics model) may stop sooner
            say_stopping(signum, f"signal {signum}: stopping before this process's first step where it can, else after "
                                 "it with a checkpoint; signal again to stop at once\n")
        else:
            say_stopping(signum, f"signal {signum}: stopping after this step (its evaluation, if one runs, first) "
                                 "with a checkpoint; signal again to stop at once\n")

    def restored_object(self, name: str) -> Any:
        """The state a resumed run's checkpoint holds for its object `name` (None: a new run, or no such object),
        for what must be built from it before `steps` restores every object (a model-based run's dynamics model)."""
        if self._restored_state is None:
            return None
        return self._restored_state["objects"].get(name)

    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    @contextlib.contextmanager
    def before_first_step(self, doing: str, stops: str):
        """Long work before the run's first step (`doing`, e.g. training its dynamics model) that looks at
        `stop_requested` itself and raises StopRequested where it can stop (`stops`, e.g. "after the model's
        current epoch"). A signal then ends the run there, not after the work and one step: a new run has no
        step to checkpoint and its folder, which holds nothing yet, is removed (a rerun of the command starts
        it again, and the work continues from its own checkpoint); a resumed run's checkpoint stands. A second
        signal (KeyboardInterrupt) ends it the same way at once. (With wandb online, the new run's wandb run,
        made with the folder, stays there, empty.)"""
        if self.stop_signal is not None:  # signalled since the handlers were installed: do none of the work
            self._stop_before_first_step(doing, "")
        self._preparing = (doing, stops)
        try:
            yield
        except (StopRequested, KeyboardInterrupt) as exc:
            self._stop_before_first_step(doing, str(exc) if isinstance(exc, StopRequested) else "")
        finally:
            self._preparing = None
        if self.stop_signal is not None:  # the work ended before it looked at the signal
            self._stop_before_first_step(doing, "")

    def _stop_before_first_step(self, doing: str, where: str) -> None:
        signum = self.stop_signal if self.stop_signal is not None else signal.SIGINT
        self._stopping = True  # a further signal meanwhile changes nothing (closing wandb can take seconds)
        try:
            self.abandon()
        finally:  # an error while closing: the process gets its handlers back all the same
            self._stopping = False
            self._restore_signals()
        if self.resume_from is None:
            kept = f"the run had done no step: its folder {self.dir} is removed and the same command starts it again"
        else:
            kept = f"its checkpoint at step {self.start_step} stands; continue with --resume latest"
        print(f"stopped by signal {signum} while {doing}: {kept}" + (f"; {where}" if where else ""), file=sys.stderr)
        raise SystemExit(128 + signum)

    def abandon(self) -> None:
        """Let go of a run that has done no step in this process: close its logs (if opened), release its folder,
        and remove the folder if this run made it (nothing in it yet: retries do not pile up empty folders). A
        resumed run's folder and checkpoint stay. The signal handlers are the caller's to give back."""
        try:
            if self.logger is not None:
                self.logger.close()
        finally:
            self._folder_claim.close()
            if self.resume_from is None:
                shutil.rmtree(self.dir, ignore_errors=True)

    def _restore_signals(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    # ------------------------------------------------------------------------------ run folders
    @staticmethod
    def _unique(path: Path) -> Path:
        candidate, i = path, 1
        while candidate.exists():
            candidate, i = path.with_name(f"{path.name}-{i}"), i + 1
        try:
            candidate.mkdir(parents=True)
        except OSError as exc:  # e.g. --run.out-dir names a file, or a folder this user cannot write
            raise OffrlError(f"cannot make the run folder {candidate} ({exc.strerror or exc}): check --run.out-dir") \
                from None
        return candidate

    def _find_resume(self, resume: str) -> tuple[Path, Path] | None:
        """'latest': the newest run of this algo/dataset/seed with a checkpoint (an error if none); with --log.name,
        the newest of that name's folders (<name>, or <name>-1, ... that a start beside a folder without a
        checkpoint made); 'auto': the same, or None (start a new run) when there is none."""
        if resume in ("latest", "auto"):
            base = Path(self.cfg.run.out_dir) / self.algo / self.dataset_name
            name = self.cfg.log.name
            # --log.name names the run folder: only that name's folders are this run (another name's run,
            # finished or not, is not to be extended)
            if name:
                pattern = f"{name} (or {name}-<n>)"
                folders = [p for p in base.glob(f"{glob.escape(name)}*")
                           if re.fullmatch(re.escape(name) + r"(-\d+)?", p.name)]
            else:
                pattern = f"{self.cfg.seed}-*"
                folders = base.glob(pattern)
            candidates = sorted((p for p in folders if ckpt.has_checkpoint(p)), key=self._checkpoint_time)
            if not candidates:
                if resume == "auto":
                    return None
                raise CheckpointError(f"--resume latest: no run with a checkpoint under {base}/{pattern}")
            return candidates[-1], ckpt.run_checkpoint(candidates[-1])
        path = Path(resume)
        if path.is_dir() and ckpt.has_checkpoint(path):
            return path, ckpt.run_checkpoint(path)
        if path.is_file():
            # only a checkpoint inside a run folder (<run>/checkpoints/<file>): a copy elsewhere would make its
            # grandparent folder, whatever it holds, the run folder that is then written to. A run folder whose
            # config.json was lost still counts (as it does given as a folder): its other records say what it is
            records = ("config.json", "metrics.jsonl", "environment.json")
            if path.parent.name != "checkpoints" or not any((path.parent.parent / r).is_file() for r in records):
                raise CheckpointError(f"--resume {resume}: not a checkpoint inside a run folder "
                                      "(<run>/checkpoints/<file> beside the run's config.json or metrics.jsonl); copy "
                                      "the whole run folder to resume elsewhere")
            return path.parent.parent, path
        if path.is_dir():
            raise CheckpointError(f"--resume {resume}: a folder without a checkpoint (checkpoints/last.pt): the run "
                                  "stopped before its first one; start it again")
        raise CheckpointError(f"--resume {resume}: no such run folder or checkpoint file")

    @staticmethod
    def _checkpoint_time(run_dir: Path) -> float:
        last = ckpt.run_checkpoint(run_dir)
        return max(p.stat().st_mtime for p in (last, ckpt.previous_path(last)) if p.exists())

    def _check_same_config(self, state: dict) -> None:
        saved = json.loads(state.get("config", "{}"))
        changed = config_changes(saved, self.config, default_config(type(self.cfg)))
        # --data.env-id / --data.ref-*-score giving what the run's dataset.json recorded, which _check_same_data
        # asks for when the data's defaults changed since (a D4RL file: v5 before offrl evaluated those on v4)
        recorded = self._recorded_data()
        changed = [c for c in changed if not (c[0] in RECORDED_DATA_OPTIONS and c[1] is None
                                              and c[2] == recorded.get(RECORDED_DATA_OPTIONS[c[0]]))]
        if changed:
            details = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changed)
            raise CheckpointError(f"checkpoint {self.resume_from}: the config differs from the run being resumed ({details})")
        # allowed (RELIABILITY.md), but said: a LambdaLR keeps its step count, not its lambda, so the rate
        # jumps to the new schedule's value at once
        if getattr(self.cfg, "schedule_spans_steps", False) and saved.get("steps") not in (None, self.cfg.steps):
            print(f"warning: this run's learning-rate schedule spans its --steps; resumed with --steps "
                  f"{self.cfg.steps} instead of {saved['steps']}, it follows the new budget from here on (the rate "
                  "jumps to that schedule's value now)", file=sys.stderr)

    def _recorded_data(self) -> dict:
        """This run's dataset.json ({} where unread)."""
        try:
            record = json.loads((self.dir / "dataset.json").read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    @staticmethod
    def _data_record(data: Any) -> dict[str, Any]:
        meta = data.metadata
        pre = data.preprocessing
        record = {k: meta.get(k) for k in ("name", "source", "env_id", "checksum", "ref_min_score", "ref_max_score",
                                            "ref_source", "corruption")}
        record |= {"trained_checksum": data.dataset.checksum(),  # after corruption and preprocessing
                   "transitions": len(data.dataset), "episodes": data.dataset.num_episodes,
                   "normalized_states": pre.obs_mean is not None, "reward_scale": pre.reward_scale,
                   "reward_bias": pre.reward_bias, "return_weighted_sampling": data.sample_weights is not None}
        return record

    def _check_same_data(self, record: dict[str, Any]) -> None:
        """The data a resumed run trains on must be what it trained on: the same file and the same preprocessing
        (a dataset made again differently, or another offrl computing another reward scale, would change it)."""
        path = self.dir / "dataset.json"
        try:
            saved = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            raise CheckpointError(f"{path} could not be read, so the data this run trained on cannot be checked: "
                                  "restore it, or start a new run folder") from None
        if not saved.get("trained_checksum"):
            return  # a run folder from before offrl recorded it
        current = json.loads(json.dumps(record, default=str))
        if saved.get("env_id") and current.get("env_id") and saved["env_id"] != current["env_id"]:
            # e.g. a D4RL file's default evaluation env, v5 before offrl evaluated those on v4 (offrl.scores)
            raise CheckpointError(f"{self.dir}: this run evaluated on {saved['env_id']}, the data now names "
                                  f"{current['env_id']}; resume with --data.env-id {saved['env_id']} to keep its "
                                  "evaluations comparable, or start a new run folder")
        for key, option in (("ref_min_score", "--data.ref-min-score"), ("ref_max_score", "--data.ref-max-score")):
            if key in saved and saved[key] != current.get(key):
                # its scores so far were normalized with the saved references: another pair (or none, e.g. D4RL's
                # table dropped for another env) would put other units into its records and best score
                raise CheckpointError(f"{self.dir}: this run's scores were normalized with {key} {saved[key]!r}, the "
                                      f"data now gives {current.get(key)!r}; resume with {option} {saved[key]!r} "
                                      "to keep them, or start a new run folder")
        if saved["trained_checksum"] != current["trained_checksum"]:
            changed = [f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in
                       ("checksum", "transitions", "reward_scale", "reward_bias", "normalized_states", "corruption")
                       if saved.get(k) != current[k]]
            raise CheckpointError(f"{self.dir}: the data differs from what this run trained on (trained checksum "
                                  f"{saved['trained_checksum']} -> {current['trained_checksum']}"
                                  f"{'; ' + ', '.join(changed) if changed else ''}); start a new run folder")

    def _record_data(self, data: Any, record: dict[str, Any]) -> None:
        meta = data.metadata
        write_json(self.dir / "dataset.json", record, indent=2, default=str)
        from offrl.data.sources import missing_reference_scores

        warning = missing_reference_scores(meta)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        if data.corruption is not None:
            from offrl.data import corruption

            corruption.save(data.corruption, self.dir / "corruption.npz")

    # ------------------------------------------------------------------------------------ loop
    def precision(self):
        """Context for one gradient step: bfloat16 autocast under `--run.precision bf16`, and subnormal floats
        flushed to zero under `--run.flush-denormal` (the default). Only the step flushes: evaluation, data,
        checkpoints and world-model training compute as IEEE 754 says."""
        return gradient_step(self.device, self.cfg.run.precision, self.cfg.run.flush_denormal)

    def steps(self, state: dict[str, Any]) -> Iterator[int]:
        """Restore `state` when resuming, then yield step numbers start+1 .. total_steps (cfg.steps, or more for a
        phased algorithm such as MBRCSL)."""
        if self._restored_state is not None:
            ckpt.load_state_dicts(state, self._restored_state["objects"], str(self.resume_from))
            rng = self._restored_state["rng"]
            torch.set_rng_state(rng["torch"].cpu())  # map_location may have moved it
            if "cuda" in rng and torch.cuda.is_available():  # one state per GPU the saving process saw, in order:
                # a process that sees fewer (a 1-GPU node, CUDA_VISIBLE_DEVICES) restores those it has
                torch.cuda.set_rng_state_all([state.cpu() for state in rng["cuda"][:torch.cuda.device_count()]])
                if "cuda_run_device" in rng and self.device.type == "cuda":
                    # the GPU the run trained on, wherever it is now (saved on cuda:1, resumed with
                    # CUDA_VISIBLE_DEVICES=1 as cuda:0): by position, it would get another GPU's stream
                    torch.cuda.set_rng_state(rng["cuda_run_device"].cpu(), self.device)
            saved_on = "cuda" if "cuda" in rng else "cpu"
            if saved_on != self.device.type:  # checkpoint.restore_generator reseeds the streams that cannot carry over
                print(f"warning: this run's checkpoint was written on {saved_on} and is resumed on {self.device.type}: "
                      "its random streams (batches, noise, rollouts) cannot carry over and restart from seeds (derived "
                      "from the saved states, or the run's seed), so it goes on reproducibly but not as it would "
                      f"have on {saved_on}", file=sys.stderr)
            self.last_checkpoint_step = self.start_step
            self._restored_state = None
            # tried again (a resume refused before this point keeps it): it says so anew if it diverges again
            (self.dir / ckpt.DIVERGED_FILE).unlink(missing_ok=True)
            print(f"resumed {self.dir} at step {self.start_step}", file=sys.stderr)
        self._state = state
        return self._iterate()

    def _iterate(self) -> Iterator[int]:
        for step in range(self.start_step + 1, self.total_steps + 1):
            yield step  # the loop body (update, log, evaluate, checkpoint) runs here
            self.stop_if_signalled(step)

    def stop_if_signalled(self, step: int) -> None:
        """After a SIGTERM/SIGINT: checkpoint with `step` as the last one done and exit. The loop calls it
        after every step; a long piece of work between steps (MBRCSL's rollouts) calls it itself."""
        if self.stop_signal is None:
            return
        self.close_at(step)
        print(f"stopped by signal {self.stop_signal} after step {step}; checkpoint saved to "
              f"{self.checkpoint_path}; continue with --resume latest", file=sys.stderr)
        raise SystemExit(128 + self.stop_signal)

    def close_at(self, step: int) -> None:
        """Stop here: checkpoint `step` as the last one done, close the logger, give the signals back."""
        self.checkpoint(step, force=True)
        self.logger.close()
        self._restore_signals()

    def _due(self, step: int, every: int) -> bool:
        return step == self.total_steps or (every > 0 and step % every == 0)

    def log(self, step: int, metrics: dict[str, torch.Tensor], force: bool = False) -> None:
        """Keep the tensors; gather them to the host (one sync) every log.every steps. A NaN or inf
        among them ends the run (TrainingDiverged) with the metric's name and the step."""
        if not (force or self._due(step, self.cfg.log.every)):
            self._unchecked = (step, metrics)  # checked before the next checkpoint is written
            return
        row = self._gather(metrics)
        self._stop_if_diverged(step, row)
        self._unchecked = None
        row["steps_per_second"] = self.progress.steps_per_second(step)
        self.last_metrics = row
        self.logger.log(step, row)
        self.progress.update(step)

    @staticmethod
    def _gather(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
        names = list(metrics)
        values = torch.stack([metrics[k].detach().float().reshape(()) for k in names]).cpu().tolist()
        return dict(zip(names, values))

    def _stop_if_diverged(self, step: int, row: dict[str, float]) -> None:
        bad = [k for k, v in row.items() if not np.isfinite(v)]
        if not bad:
            return
        kept = (f"the last good checkpoint (step {self.last_checkpoint_step}) is kept at {self.checkpoint_path}"
                if self.last_checkpoint_step is not None else "no checkpoint was written before it")
        try:
            self.logger.log(step, row)
        except (OSError, OffrlError) as e:  # a full disk: the divergence is still what to report
            print(f"warning: the diverged step's metrics were not logged: {e}", file=sys.stderr)
        try:
            self.logger.close()
        except (OSError, OffrlError) as e:
            print(f"warning: the run's logs were not closed cleanly: {e}", file=sys.stderr)
        self._restore_signals()
        # a sweep reads this and does not start the run again on its own: a resume would replay the same
        # steps from the same RNG state into the same divergence
        try:
            (self.dir / ckpt.DIVERGED_FILE).write_text(json.dumps({
                "step": step, "metrics": bad, "value": str(row[bad[0]]),
                "last_checkpoint_step": self.last_checkpoint_step}, indent=2))
        except OSError as e:  # a full disk: the divergence is still what to report
            print(f"warning: could not write {self.dir / ckpt.DIVERGED_FILE}: {e}", file=sys.stderr)
        self._folder_claim.close()  # now, not whenever this Run is collected (it would drop a later claim's lock)
        raise TrainingDiverged(f"{self.algo} seed {self.cfg.seed}: {', '.join(bad)} became {row[bad[0]]} at step "
                               f"{step}; {kept}")

    def log_values(self, step: int, values: dict[str, float]) -> None:
        """Log host-side numbers (e.g. online episode returns, a hold-out loss) as they come; a NaN or inf
        among them ends the run as in `log`."""
        self._stop_if_diverged(step, values)
        self.logger.log(step, values)

    def evaluate(self, step: int, policy: Callable[[torch.Tensor], torch.Tensor], metadata: dict,
                 force: bool = False, prefix: str | None = None) -> dict[str, float] | None:
        """Evaluate every eval.every steps and at the end. With `prefix` (e.g. a second conditioning
        target) the results are logged under that prefix and are not the run's score."""
        if not (force or self._due(step, self.cfg.eval.every)):
            return None
        self.check_unlogged()  # a NaN since the last logged step is a divergence, not the policy's NaN actions
        result = evaluate(policy, metadata, self.cfg.eval.episodes, self.eval_seed, self.device)
        return self.record_evaluation(step, result, prefix)

    @property
    def eval_seed(self) -> int:
        """Evaluation episode i resets with eval_seed + i."""
        return self.cfg.seed + self.cfg.eval.seed_offset

    def record_evaluation(self, step: int, result, prefix: str | None = None) -> dict[str, float]:
        """Log an evaluation's results (an `offrl.evaluation.EvalResult`) as `evaluate` does: the run's
        score, or with `prefix` an extra evaluation (several seeds evaluated in one vector env use this)."""
        summary = result.summary()
        if prefix is not None:
            summary = {k.replace("eval/", f"{prefix}/", 1): v for k, v in summary.items()}
            self.extra_evals[prefix] = summary
            self.logger.log(step, summary)
            return summary
        score = summary.get("eval/normalized_score", summary["eval/return_mean"])
        self.best_score = score if self.best_score is None else max(self.best_score, score)
        summary["eval/best_score"] = self.best_score
        self.last_eval = summary
        self.logger.log(step, summary)
        self.progress.update(step, score, force=True)
        return summary

    def check_unlogged(self) -> None:
        """Check the metrics of a step that was not logged, as every checkpoint does first: never checkpoint a
        diverged state over the last good one."""
        if self._unchecked is not None:
            unchecked_step, metrics = self._unchecked
            self._stop_if_diverged(unchecked_step, self._gather(metrics))
            self._unchecked = None

    def checkpoint(self, step: int, state: dict[str, Any] | None = None, force: bool = False) -> None:
        if not (force or self._due(step, self.cfg.run.checkpoint_every)):
            return
        self.check_unlogged()
        state = state if state is not None else self._state
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state_all()
            rng["cuda_run_device"] = torch.cuda.get_rng_state(self.device)
        ckpt.save(self.checkpoint_path, {
            "step": step, "algo": self.algo, "config": json.dumps(self.config, default=str),
            "objects": {name: obj.state_dict() for name, obj in state.items()}, "rng": rng,
            "best_score": self.best_score, "last_eval": json.dumps(self.last_eval),
            "last_metrics": json.dumps(self.last_metrics), "extra_evals": json.dumps(self.extra_evals),
            "wandb_id": self.logger.wandb_id, "wall_seconds": self.wall_seconds(), "core_seconds": self.core_seconds(),
            "resumes": self.resumes, "metrics_end": self.logger.metrics_end(),
        }, keep_previous=True)
        self.last_checkpoint_step = step

    def wall_seconds(self) -> float | None:
        """Wall time so far, over every process of a resumed run (steps redone after a kill count once)."""
        return None if self.wall_before is None else self.wall_before + time.perf_counter() - self.start_time

    def core_seconds(self) -> float | None:
        """Wall time times torch's threads, summed over the run's processes (a run resumed with more
        threads counts each process at its own; seeds trained in one process share it equally); None where a
        resumed checkpoint did not record it."""
        if self.core_before is None:
            return None
        return self.core_before + (time.perf_counter() - self.start_time) * torch.get_num_threads() * self.process_share

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write final.json, print the final score, close the logger; return the final metrics."""
        self.progress.close()
        final = {
            "algo": self.algo, "dataset": self.cfg.run_label, "seed": self.cfg.seed, "steps": self.cfg.steps,
            **({"total_steps": self.total_steps} if self.total_steps != self.cfg.steps else {}),
            "run_dir": str(self.dir), **self.last_eval, **{k: v for e in self.extra_evals.values() for k, v in e.items()},
            **{f"train/{k}": v for k, v in self.last_metrics.items()},
            "wall_seconds": self.wall_seconds(), "core_seconds": self.core_seconds(), "resumes": self.resumes,
            **(extra or {}),
        }
        # atomically: a sweep, its --status and the tables read final.json as the sign of a finished run
        write_json(self.dir / "final.json", final, indent=2)  # a killed write's temp is removed at the next resume
        self.logger.close()
        self._restore_signals()
        self._folder_claim.close()
        score = self.last_eval.get("eval/normalized_score")
        if score is not None:
            print(f"final normalized score: {score:.1f} ± {self.last_eval['eval/normalized_score_std']:.1f} "
                  f"(return {self.last_eval['eval/return_mean']:.1f}, {self.cfg.eval.episodes} episodes) -> {self.dir}")
        elif self.last_eval:
            print(f"final return: {self.last_eval['eval/return_mean']:.1f} (no reference scores) -> {self.dir}")
        return final


def is_terminal(fd: int) -> bool:
    """Whether `fd` is a terminal, a hung-up one included: os.isatty asks tcgetattr, which fails with EIO once
    the terminal has closed, so isatty is False on exactly the terminals whose writes fail."""
    try:
        import termios
    except ImportError:  # not POSIX
        return os.isatty(fd)
    try:
        termios.tcgetattr(fd)
    except termios.error as exc:
        return bool(exc.args) and exc.args[0] == errno.EIO
    except OSError:
        return False
    return True


def say_stopping(signum: int, message: str) -> None:
    """A stop signal's notice, from its handler. A closed terminal is hung up before its SIGHUP arrives, and
    every write to it then fails (EIO), in the handler and in whatever prints next (progress, the checkpoint's
    note): so on SIGHUP, stdout and stderr that are that terminal go to /dev/null, as under nohup, and the run
    checkpoints and exits as it does on SIGTERM."""
    if signum == getattr(signal, "SIGHUP", None):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            devnull = None
        for fd in (1, 2):
            try:
                if devnull is not None and is_terminal(fd):
                    os.dup2(devnull, fd)
            except OSError:
                pass
        if devnull is not None:
            os.close(devnull)
    try:
        os.write(2, message.encode())
    except OSError:  # nowhere to say it: the stop goes ahead
        pass


CONFIG_OPTION_HELP = ("--config RUN: start from the options a saved run of this algorithm was trained with (its folder or "
                      "its config.json), in a new run folder under the default --run.out-dir (its --resume, --log.name "
                      "and --run.out-dir are dropped); the other options given override them, e.g. --config "
                      "runs/iql/<dataset>/0-<time> --seed 1. Settings the algorithm filled in from the saved run's "
                      "dataset (MOPO's and MOBILE's per-task ones) come along: give them for another --dataset.")


def saved_config(config_cls: type, path: str | os.PathLike):
    """The config a run folder's config.json holds, as the defaults of a new run of the same algorithm: resume,
    log.name and run.out_dir back at their defaults (the new run must not continue, share or join the saved run's
    folder, e.g. a sweep's, whose table would count it)."""
    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    try:
        values = json.loads(file.read_text())
    except (OSError, ValueError) as exc:  # (JSONDecodeError, and UnicodeDecodeError for a checkpoint given)
        raise OffrlError(f"--config {path}: not a run's config.json; give the run folder or its config.json "
                         f"({type(exc).__name__})") from None
    if not isinstance(values, dict):
        raise OffrlError(f"--config {path}: not a run config (a JSON object of options)")
    # __main__ under `python -m algos.<algo>` (its spec names it) or `python algos/<algo>.py` (its file does)
    module = sys.modules.get(config_cls.__module__)
    spec_name = getattr(getattr(module, "__spec__", None), "name", None)
    algo = (spec_name or config_cls.__module__).rpartition(".")[2]
    if algo == "__main__" and getattr(module, "__file__", None):
        algo = Path(module.__file__).stem
    saved_algo = _recorded_algo(file.parent)
    if saved_algo is not None and saved_algo != algo:
        raise OffrlError(f"--config {path}: a {saved_algo} run's config, not {algo}'s")
    cfg = from_dict(config_cls, values, where=f"--config {file}")
    cfg.resume, cfg.log.name, cfg.run.out_dir = None, None, config_cls().run.out_dir
    return cfg


def _recorded_algo(run_dir: Path) -> str | None:
    """The algorithm a run folder belongs to: its final.json's, else its place <out_dir>/<algo>/<dataset>/<run>."""
    try:
        return json.loads((run_dir / "final.json").read_text())["algo"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    name = run_dir.parent.parent.name
    try:
        known = name.isidentifier() and importlib.util.find_spec(f"algos.{name}") is not None
    except (ImportError, ValueError):
        known = False
    return name if known and (run_dir / "config.json").is_file() else None


def _split_config_option(argv: list[str]) -> tuple[str | None, list[str]]:
    """(--config's value, the other arguments)."""
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 == len(argv):
                raise OffrlError("--config needs a run folder or its config.json")
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


def parse_config(config_cls: type, argv: list[str], prog: str | None = None):
    """A Config from command-line arguments, as `python -m algos.<algo>` reads them (--config included)."""
    import tyro

    config_path, argv = _split_config_option(list(argv))
    default = saved_config(config_cls, config_path) if config_path is not None else tyro.MISSING_NONPROP
    # (the Configs' docstrings are dataclasses' signatures, which tyro leaves out)
    cfg = tyro.cli(config_cls, args=argv, prog=prog, default=default, description=CONFIG_OPTION_HELP)
    if config_path is not None and cfg.resume is not None and cfg.log.name is None:
        # --config resets log.name and run.out_dir, so 'latest' found another run than the saved one, silently
        # (a sweep names each run's folder with --log.name: that resume is its own run's)
        raise OffrlError(f"--config {config_path} with --resume {cfg.resume}: --config starts a new run from a saved "
                         "run's options, --resume continues a run with its own; give one of them (or --log.name "
                         "for the folder to continue)")
    if getattr(cfg, "seeds", None) is not None and not cfg.seeds:  # a bare --seeds trained seed 0 and recorded []
        raise OffrlError("--seeds without a seed: give one or more (--seeds 0 1 2), or leave it out for --seed")
    if getattr(cfg, "seeds", None) and any(arg == "--seed" or arg.startswith("--seed=") for arg in argv):
        # --seeds names every seed the process trains; a --seed beside it was ignored, silently
        raise OffrlError(f"--seed {cfg.seed} with --seeds {' '.join(map(str, cfg.seeds))}: --seeds names every seed "
                         "the process trains; give the seed among them, or --seed alone")
    return cfg


def cli_main(config_cls: type, train: Callable[[Any], dict], argv: list[str] | None = None, prog: str | None = None) -> None:
    """Parse a Config with tyro (from a saved run's config with --config) and train; input errors print one line and
    exit 1, no traceback."""
    if prog is None:
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        prog = f"python -m {main_spec.name}" if main_spec is not None else None
    try:
        cfg = parse_config(config_cls, sys.argv[1:] if argv is None else argv, prog)
    except OffrlError as exc:  # --config's
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        if getattr(cfg, "seeds", None):
            train_seeds = getattr(sys.modules[train.__module__], "train_seeds", None)
            if train_seeds is None:
                raise OffrlError(f"--seeds: {train.__module__} does not train seeds as one batched model yet (bc, "
                                 "td3_bc and iql do); run one process per seed (python -m benchmarks.sweep --seeds ...)")
            train_seeds(cfg)
            return
        train(cfg)
    except OffrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # before the run's own handler is installed, or after it is restored
        print("interrupted; continue with --resume latest", file=sys.stderr)
        raise SystemExit(130) from None
