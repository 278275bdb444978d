"""Run a grid of training runs as parallel 1-thread processes; resumable.

    python -m benchmarks.sweep --name hopper-mr --out-dir runs-bench \\
        --variant bc=bc --variant iql=iql --variant cql=cql \\
        --datasets offrl/hopper/medium-replay-v0 --seeds 0 1 2 --steps 100000 --jobs 2

A variant is `label=algo [extra options]`, e.g. `--variant "iql-corrupt=iql --data.corrupt next_observations"`.
Run i of a variant lives in <out-dir>/<name>/<label>/<algo>/<dataset>/<seed>-sweep/. Rerunning the same
command skips finished runs and continues interrupted ones from their last checkpoint (--resume auto),
so a sweep can span sessions (a final.json that records a failure, MBRCSL's without a kept rollout, is run again); a run that stopped on a NaN/inf (its diverged.json) is left alone and
counted as failed, since resuming it replays the same steps into the same NaN (--retry-diverged runs
it again). Two 1-thread processes beat one 2-thread process on 2 cores
(results/speed.md, "Runs sharing the CPU").

Each run holds a lock (`<seed>-sweep.lock` beside its log) for as long as its process lives, with either
backend. A run whose process outlived its sweep (the sweep alone was killed) keeps its lock and goes on;
a new sweep started meanwhile leaves that run alone until its process exits, then skips it if it
finished or resumes it if not. Never two processes in one run folder. Stop a local sweep with all its
runs by signalling its process group (Ctrl-C in its terminal, or `kill -- -<pgid>`): each run saves a
checkpoint on SIGINT/SIGTERM.

At a sweep's tail fewer runs are left than --jobs, and cores idle. With --spread-threads the sweep then
stops a running run (SIGTERM: it finishes its step and saves a checkpoint) and resumes it at once with
the idle cores as extra threads (`--run.threads` is a setting a resume may change). A run's threads only
grow, so each is restarted at most a few times; threads change float reductions, not the algorithm.

With --backend ray each run is a Ray task (`pip install -e ".[ray]"`) asking for --threads CPUs (and one
GPU when --common says `--device cuda`: Ray hides the GPUs from a task that asks for none, so without it a
run trains on the CPU, --device auto included; the sweep warns when the cluster has GPUs), on the cluster
that --ray-address names (`auto`: the one `ray start` made on this machine; host:port or ray://host:10001
another; omitted: RAY_ADDRESS, else a Ray instance started for this sweep on this machine only). The task runs the same command line as the
local backend, in a subprocess, so finished runs are skipped and interrupted ones continue from their
checkpoints exactly as locally; a task whose node dies is retried and resumes. Every node needs this
checkout importable (e.g. `pip install -e .` at the same path) and the datasets under the same
MINARI_DATASETS_PATH, and --out-dir must be a path every node and this machine see (a shared
filesystem): the runs write there and the sweep reads their final.json there. Ctrl-C cancels the tasks;
each stops its run with SIGTERM, which checkpoints, so the next invocation resumes.

`--status` runs nothing: per variant, how many runs have finished, run now (their lock is held), stopped
on a NaN/inf (diverged), were interrupted (a checkpoint to resume) or have not started, the steps left
(from each started run's last logged step; it resumes at its last checkpoint, a little before; none for
a diverged run, which a sweep does not resume), and at the variant's pace so far (its
finished runs' core-seconds per step from final.json: wall time times each process's threads,
evaluations and checkpoints included) the core-hours those steps need. A run finished at another --steps counts as
interrupted when it has a checkpoint (a sweep resumes it to a larger --steps; one finished at more steps is
refused by its resume, so the sweep reports it failed) and as not started when it has none (a sweep refuses
it: finished with other options).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from offrl.checkpoint import diverged, has_checkpoint, try_lock
from offrl.logging import step_of
from offrl.data.sources import sanitize


@dataclass
class Job:
    label: str
    algo: str
    extra: list[str]
    dataset: str
    seed: int
    steps: int
    out_dir: Path

    @property
    def run_dir(self) -> Path:
        return self.out_dir / self.label / self.algo / sanitize(self.dataset) / f"{self.seed}-sweep"

    def done(self) -> bool:
        """Finished at this sweep's --steps; a final.json that records a failure (MBRCSL without a kept rollout)
        is not done: the sweep runs it again and reports it failed again."""
        final = self.run_dir / "final.json"
        if not final.exists():
            return False
        try:
            record = json.loads(final.read_text())
        except (OSError, ValueError):  # empty or cut short (a crash right after the write): the run rewrites it
            return False
        return isinstance(record, dict) and record.get("steps") == self.steps and "failed" not in record

    def has_checkpoint(self) -> bool:
        return has_checkpoint(self.run_dir)

    def diverged(self) -> dict | None:
        """What the run's diverged.json says when a NaN/inf stopped it and it was not resumed since."""
        return None if self.done() else diverged(self.run_dir)

    @property
    def log_path(self) -> Path:
        return self.run_dir.parent / f"{self.seed}-sweep.log"

    @property
    def lock_path(self) -> Path:
        return self.log_path.with_suffix(".lock")  # the Ray backend's too (run_command)

    def command(self, common: list[str], threads: int = 1) -> list[str]:
        return [sys.executable, "-m", f"algos.{self.algo}", "--dataset", self.dataset, "--seed", str(self.seed),
                "--steps", str(self.steps), "--run.threads", str(threads), "--run.out-dir", str(self.out_dir / self.label),
                "--log.name", f"{self.seed}-sweep", "--log.wandb", "disabled", "--log.no-progress",
                "--resume", "auto", *common, *self.extra]


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    label, _, spec = text.partition("=")
    parts = shlex.split(spec)
    if not label or not parts:
        raise SystemExit(f"--variant {text!r}: expected label=algo [options]")
    return label, parts[0], parts[1:]


def jobs_of(args) -> list[Job]:
    out = Path(args.out_dir) / args.name
    variants = list(map(parse_variant, args.variant))
    labels = [label for label, _, _ in variants]
    if twice := sorted({label for label in labels if labels.count(label) > 1}):
        # a label names the run folders: the second variant would wait on the first's runs and call them its own
        raise SystemExit(f"error: --variant label {', '.join(map(repr, twice))} given more than once; each variant "
                         "needs a label of its own")
    return [Job(label, algo, extra, dataset, seed, args.steps, out)
            for label, algo, extra in variants for dataset in args.datasets for seed in args.seeds]


@dataclass
class Running:
    job: Job
    proc: subprocess.Popen
    start: float
    threads: int
    respawn_threads: int | None = None  # set once the run was asked to stop for a restart with more threads
    # diverged.json's version when the process started (a --retry-diverged run's): only a newer one means the
    # run diverged meanwhile; a retried run stopped before training removed it still has the old one
    diverged_at_start: int | None = None

    def diverged_meanwhile(self) -> bool:
        return self.job.diverged() is not None and diverged_version(self.job) != self.diverged_at_start


def diverged_version(job: Job) -> int | None:
    """diverged.json's modification time (ns), None without one."""
    try:
        return (job.run_dir / "diverged.json").stat().st_mtime_ns
    except FileNotFoundError:
        return None


def thread_shares(cores: int, runs: int) -> list[int]:
    """Cores split over `runs` processes, the first ones taking the remainder: (5, 2) -> [3, 2]."""
    return [cores // runs + (i < cores % runs) for i in range(runs)]


UNSTARTED = ".unstarted-"
"""What a folder set aside by `set_aside_unstarted` has in its name: `<run>.unstarted-<k>`."""


def set_aside_unstarted(run_dir: Path) -> Path | None:
    """Move aside a run folder with neither a checkpoint nor a final.json: a run stopped before its first
    checkpoint, with nothing to resume. Left in place, `--resume auto` would start the run again in
    `<name>-1`, where the sweep does not look; renamed `<name>.unstarted-<k>` (kept for a look at what it
    logged), the new start reuses the name. Standard library only (a Ray task runs it on its node)."""
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"  # as offrl.checkpoint.has_checkpoint
    if (not run_dir.is_dir() or (run_dir / "final.json").exists() or (checkpoints / "last.pt").exists()
            or (checkpoints / "previous.pt").exists()):
        return None
    k = 1
    while run_dir.with_name(f"{run_dir.name}{UNSTARTED}{k}").exists():
        k += 1
    aside = run_dir.with_name(f"{run_dir.name}{UNSTARTED}{k}")
    run_dir.rename(aside)
    return aside


SET_BY_THE_SWEEP = {"--dataset", "--seed", "--seeds", "--steps", "--run.threads", "--run.out-dir", "--log.name",
                    "--resume"}
"""Run options that Job.command sets: given again in --common or a variant they would win (the last value counts),
and the run would train elsewhere or to another budget than the sweep checks for (or, for threads, with
other threads than OMP_NUM_THREADS and Ray's num_cpus say)."""


RUNS_FAILED = 3
"""The exit status of a sweep whose runs ran and some failed or diverged; a sweep that could not start (bad
sweep options, finished runs made with other options) exits 1 or 2. A run option the algorithm refuses (a typo
in --common or a variant) is found by the run itself, so it fails every run: exit 3. grid.sh goes on after a 3,
not after the others."""


FINISHED = "finished"
"""What `launch` returns for a run found finished once it held the run's lock."""


def other_options(job: Job, common: list[str]) -> str | None:
    """For a finished run: which of its options differ from this sweep's command line for it (None: none).
    `check_finished_options` looks at the runs finished when a sweep starts; a run another process (a second
    sweep under the same name) finishes while this one waits for it is looked at here."""
    if changes := option_changes(job, common):
        return "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
    return None


def done_elsewhere(job: Job, common: list[str]) -> bool:
    """Report a run another process finished meanwhile; False (a failure of this sweep) when that process ran it
    with other options than this sweep asks for."""
    if details := other_options(job, common):
        print(f"FAILED {job.label} {job.dataset} seed {job.seed}: finished by another process with other options "
              f"than this sweep's ({details}); a new --name or --out-dir keeps both", flush=True)
        return False
    print(f"done {job.label} {job.dataset} seed {job.seed} (by another process)", flush=True)
    return True


def launch(job: Job, common: list[str], threads: int) -> subprocess.Popen | str | None:
    """Start the run's process, which inherits the run's lock and holds it until it exits; None when another
    process holds that lock (a run an earlier sweep started and that outlived it), FINISHED when the run
    turned out finished under the lock."""
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(job.lock_path, "a") as lock:
        if not try_lock(lock):
            return None
        if job.done():  # finished by a process that let go of the lock since this sweep looked
            return FINISHED
        set_aside_unstarted(job.run_dir)  # under the lock: no live process is writing this folder
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        with open(job.log_path, "a") as log:  # the child keeps its own handles
            return subprocess.Popen(job.command(common, threads), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    pass_fds=(lock.fileno(),) if os.name == "posix" else ())


def job_config(job: Job, common: list[str]):
    """The Config a job's command line gives its algorithm (offrl.run.parse_config, --config included); a bad
    --config (moved, another algorithm's) is one line naming the run."""
    import importlib

    from offrl.errors import OffrlError
    from offrl.run import parse_config

    try:
        return parse_config(importlib.import_module(f"algos.{job.algo}").Config, job.command(common)[3:])
    except OffrlError as exc:
        raise SystemExit(f"error: {job.run_dir}: {exc}") from None


def option_changes(job: Job, common: list[str]) -> list[tuple[str, object, object]]:
    """For a run folder with a config.json: the options it was made with that this sweep's command line for it
    would change and a resume may not (offrl.run.config_changes: what `--resume` refuses)."""
    import importlib

    from offrl.config import to_dict
    from offrl.run import config_changes, default_config

    saved = job.run_dir / "config.json"
    if not saved.exists():
        return []
    module = importlib.import_module(f"algos.{job.algo}")
    cfg = job_config(job, common)
    if hasattr(module, "resolve_config"):  # defaults the algorithm fills in from the dataset before the run starts
        cfg = module.resolve_config(cfg)
    current = json.loads(json.dumps(to_dict(cfg), default=str))
    return config_changes(json.loads(saved.read_text()), current, default_config(module.Config))


def check_finished_options(jobs: list[Job], common: list[str]) -> None:
    """A finished run made with other options than this sweep asks for would be counted as this sweep's: refuse
    (an unfinished one would be refused by its own resume)."""
    problems, stranded = [], []
    for job in jobs:
        if job.done() and (details := other_options(job, common)):
            problems.append(f"{job.run_dir}: {details}")
        elif (job.run_dir / "final.json").exists() and not job.done() and not job.has_checkpoint():
            # e.g. a committed record (no checkpoints): --resume auto would start it afresh in <seed>-sweep-1,
            # where the sweep does not look, and every later sweep would call the run failed
            try:
                record = json.loads((job.run_dir / "final.json").read_text())
            except (OSError, ValueError):
                record = {"failed": "its final.json cannot be read"}
            if "failed" in record:
                stranded.append(f"{job.run_dir}: failed ({record['failed']}), no checkpoint to run it again from")
            else:
                stranded.append(f"{job.run_dir}: finished at {record.get('steps')} steps, no checkpoint to continue "
                                f"to {job.steps}")
    if problems:
        raise SystemExit(f"error: {len(problems)} finished run(s) were made with other options than this sweep asks "
                         "for (a new --name or --out-dir keeps both):\n  " + "\n  ".join(problems))
    if stranded:
        raise SystemExit(f"error: {len(stranded)} run(s) ended (at another --steps, or failed) and have no checkpoint to "
                         "continue from (a new --name or --out-dir runs them afresh):\n  " + "\n  ".join(stranded))


def unfinished(jobs: list[Job]) -> list[Job]:
    pending = [j for j in jobs if not j.done()]
    print(f"{len(jobs) - len(pending)} of {len(jobs)} runs already finished; {len(pending)} to go", flush=True)
    return pending


def set_aside_diverged(jobs: list[Job]) -> tuple[list[Job], list[Job]]:
    """(the jobs to run, the diverged ones left alone): resumed, a diverged run replays the steps from its last
    checkpoint with the same RNG state into the same NaN, so a sweep does not retry it unless told to."""
    runnable, left = [], []
    for job in jobs:
        record = job.diverged()
        if record is None:
            runnable.append(job)
            continue
        left.append(job)
        print(f"diverged, not run again: {job.label} {job.dataset} seed {job.seed} ({', '.join(record.get('metrics', []))} "
              f"not finite at step {record.get('step', '?')}; {job.run_dir / 'diverged.json'}); --retry-diverged "
              "runs it again", flush=True)
    return runnable, left


def last_logged_step(run_dir: Path) -> int:
    """The last `step` in the run's metrics.jsonl (0 when none): how far an unfinished run got."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return 0
    with open(metrics, "rb") as f:  # the tail is enough: a long run's file holds many rows
        f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
        tail = f.read().decode(errors="replace").splitlines()
    return next((int(step) for step in map(step_of, reversed(tail)) if step is not None), 0)


def run_state(job: Job) -> str:
    """finished, running (another process holds the run's lock), diverged (stopped on a NaN/inf), interrupted
    (a checkpoint) or not started. Testing the lock takes it for an instant; a sweep that meets it then waits
    for the run and tries again."""
    if job.done():
        return "finished"
    if job.lock_path.exists():
        with open(job.lock_path, "a") as lock:
            if not try_lock(lock):
                return "running"
    if job.diverged() is not None:
        return "diverged"
    return "interrupted" if job.has_checkpoint() else "not started"


def finished_core_seconds(run_dir: Path) -> float | None:
    """A finished run's core-seconds: final.json's core_seconds (wall time times each process's threads), or for
    a run that predates it its wall_seconds times config.json's run.threads (its last process's threads;
    0, torch's default, read as every core); None when neither is recorded."""
    try:
        final = json.loads((run_dir / "final.json").read_text())
        if final.get("core_seconds"):
            return final["core_seconds"]
        if not final.get("wall_seconds"):
            return None
        from offrl.run import core_seconds_from_wall

        config = run_dir / "config.json"
        threads = json.loads(config.read_text()).get("run", {}).get("threads", 1) if config.exists() else 1
        return core_seconds_from_wall(final["wall_seconds"], threads)
    except (OSError, ValueError, AttributeError, TypeError) as e:  # a damaged record: its pace is unknown
        print(f"note: run folder {run_dir}: cannot read its records ({type(e).__name__}: {e}); its pace is left out",
              file=sys.stderr)
        return None


def status(jobs: list[Job]) -> list[dict]:
    """One row per variant (label): run counts by state, steps left, and their core-hours at the finished runs'
    pace (core-seconds per step, `finished_core_seconds`; None before any run of the variant finished)."""
    rows: dict[str, dict] = {}
    for job in jobs:
        row = rows.setdefault(job.label, {"variant": job.label, "runs": 0, "finished": 0, "running": 0,
                                          "diverged": 0, "interrupted": 0, "not started": 0, "steps_left": 0,
                                          "_paces": []})
        state = run_state(job)
        row["runs"] += 1
        row[state] += 1
        if state == "finished":
            core_seconds = finished_core_seconds(job.run_dir)
            if core_seconds:
                row["_paces"].append(core_seconds / job.steps)
        elif state == "diverged":  # not run again by a sweep (--retry-diverged): no steps left to plan for
            pass
        elif state == "not started":  # a folder without a checkpoint is set aside and started from step 0
            row["steps_left"] += job.steps
        else:  # it resumes at its last checkpoint, up to --run.checkpoint-every before its last logged step
            row["steps_left"] += job.steps - min(job.steps, last_logged_step(job.run_dir))
    for row in rows.values():
        paces = row.pop("_paces")
        row["core_seconds_per_step"] = sum(paces) / len(paces) if paces else None
        row["core_hours_left"] = (row["steps_left"] * row["core_seconds_per_step"] / 3600
                                  if row["core_seconds_per_step"] is not None else None)
    return list(rows.values())


def print_status(rows: list[dict]) -> None:
    print(f"{'variant':24s} {'runs':>5s} {'finished':>9s} {'running':>8s} {'diverged':>9s} {'interrupted':>12s} "
          f"{'not started':>12s} {'steps left':>11s} {'core-s/step':>11s} {'core-hours left':>16s}")
    for r in rows:
        pace = f"{r['core_seconds_per_step']:.4f}" if r["core_seconds_per_step"] is not None else "-"
        hours = f"{r['core_hours_left']:.1f}" if r["core_hours_left"] is not None else "? (none finished)"
        print(f"{r['variant']:24s} {r['runs']:5d} {r['finished']:9d} {r['running']:8d} {r['diverged']:9d} "
              f"{r['interrupted']:12d} {r['not started']:12d} {r['steps_left']:11d} {pace:>11s} {hours:>16s}")


def run(jobs: list[Job], common: list[str], parallel: int, spread_threads: bool = False, threads: int = 1,
        retry_diverged: bool = False) -> list[Job]:
    """Run the unfinished jobs, `parallel` at a time with `threads` threads each; returns the ones that failed.
    A run that diverges meanwhile (here or in another process) is not started again, unless `retry_diverged`
    for one another process left diverged."""
    pending = unfinished(jobs)
    running: list[Running] = []
    failed = []
    held: list[Job] = []  # runs whose lock another process holds: tried again every pass
    waiting: list[Job] = []  # those reported as waiting (once each)
    while pending or running or held:
        pending += held
        held = []
        for job in list(pending):
            if len(running) >= parallel:
                break
            pending.remove(job)
            if job.done():  # finished by a process of an earlier sweep meanwhile
                if not done_elsewhere(job, common):
                    failed.append(job)
                continue
            if not retry_diverged and set_aside_diverged([job])[1]:  # diverged in another process meanwhile
                failed.append(job)
                continue
            proc = launch(job, common, threads)
            if proc == FINISHED:
                if not done_elsewhere(job, common):
                    failed.append(job)
                continue
            if proc is None:
                if job not in waiting:
                    waiting.append(job)
                    print(f"waiting: {job.label} {job.dataset} seed {job.seed} is running in another process "
                          f"(lock {job.lock_path})", flush=True)
                held.append(job)
                continue
            running.append(Running(job, proc, time.time(), threads, diverged_at_start=diverged_version(job)))
            print(f"start {job.label} {job.dataset} seed {job.seed} (pid {proc.pid})", flush=True)
        if spread_threads and not pending and not held and running:
            for entry, share in zip(running, thread_shares(parallel * threads, len(running))):
                # only a run with a checkpoint: one stopped before its first would resume in a new folder
                if share > entry.threads and entry.respawn_threads is None and entry.job.has_checkpoint():
                    entry.respawn_threads = share
                    entry.proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        for entry in list(running):
            job, proc = entry.job, entry.proc
            if proc.poll() is None:
                continue
            # a run told to stop checks its last metrics before its checkpoint: one that diverged there stays failed
            if entry.respawn_threads is not None and not job.done() and not entry.diverged_meanwhile():
                proc = launch(job, common, entry.respawn_threads)
                if proc == FINISHED:  # by another process, between this run's exit and the lock
                    running.remove(entry)
                    if not done_elsewhere(job, common):
                        failed.append(job)
                    continue
                if proc is not None:
                    entry.proc, entry.threads = proc, entry.respawn_threads
                    entry.respawn_threads = None
                    print(f"resume {job.label} {job.dataset} seed {job.seed} with {entry.threads} threads", flush=True)
                    continue
                running.remove(entry)  # another process took the run between its exit and now: wait for it
                held.append(job)
                continue
            running.remove(entry)
            # a run told to stop may have been past its last step already, finishing as the signal came
            ok = job.done() and (proc.returncode == 0 or entry.respawn_threads is not None)
            print(f"{'done' if ok else 'FAILED'} {job.label} {job.dataset} seed {job.seed} "
                  f"({(time.time() - entry.start) / 60:.1f} min, exit {proc.returncode})", flush=True)
            if not ok:
                failed.append(job)
    return failed


# ---------------------------------------------------------------- Ray backend

def device_options(options: list[str]) -> list[str]:
    """The values of a run's --device options (`--device cuda`, `--device=cuda:1`)."""
    values = []
    for i, option in enumerate(options):
        if option == "--device" and i + 1 < len(options):
            values.append(options[i + 1])
        elif option.startswith("--device="):
            values.append(option.partition("=")[2])
    return values


def wants_gpu(options: list[str]) -> bool:
    """Whether a run's options put it on a CUDA device (`--device cuda`, `--device=cuda:1`): the last --device
    given, which is the one the run takes (a variant's --device cpu after --common's --device cuda)."""
    devices = device_options(options)
    return bool(devices) and devices[-1].startswith("cuda")


def ray_resources(job: Job, common: list[str], threads: int) -> dict:
    """A run's Ray task resources: a CPU per thread, and a GPU when its options say --device cuda (or a --config it
    starts from does)."""
    gpu = wants_gpu([*common, *job.extra])  # the order of Job.command: a variant's options come last
    if not gpu and any(o == "--config" or o.startswith("--config=") for o in [*common, *job.extra]):
        gpu = job_config(job, common).device.startswith("cuda")
    return {"num_cpus": threads, "num_gpus": 1 if gpu else 0}


def hidden_gpus_warning(cluster_gpus: float, runs_without_gpu: int) -> str | None:
    """Ray hides the GPUs from a task that asks for none (its CUDA_VISIBLE_DEVICES is empty), so there a run's
    --device auto finds no GPU and trains on the CPU: said once, when the cluster has GPUs."""
    if cluster_gpus > 0 and runs_without_gpu > 0:
        return (f"warning: the cluster has {cluster_gpus:g} GPU(s), but {runs_without_gpu} run(s) ask Ray for none "
                "(neither --device cuda nor --device cpu in their options): Ray hides the GPUs from such tasks, so "
                "they train on the CPU (--device auto finds no GPU there); put --device cuda in --common to give each "
                "run a GPU")
    return None


def run_command(command: list[str], run_dir: str, log_path: str, env_updates: dict[str, str], cwd: str | None,
                retry_diverged: bool = False) -> dict:
    """The body of a run's Ray task, on whichever node Ray picks: the local backend's command line in a
    subprocess with this node's Python, its output appended to the run's log. Standard library only (Ray
    ships it by value). A cancelled task stops the run with SIGTERM, which checkpoints. When the worker
    crashes, the run may go on as an orphan (Ray stops a worker's children only when the worker exits
    cleanly); Ray's retry of the task waits on the lock beside the run folder, which the run holds until it
    exits, and then finds it finished or resumes it from its checkpoint."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    start = time.time()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **env_updates}
    if cwd is not None and not os.path.isdir(cwd):
        cwd = None
    with open(Path(log_path).with_suffix(".lock"), "a") as lock, open(log_path, "a") as log:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            fcntl = None
        while fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the run too (pass_fds), until it exits
                break
            except BlockingIOError:
                time.sleep(1)
        final = Path(run_dir) / "final.json"  # finished meanwhile by the process that held the lock (a local sweep)
        if final.exists() and "--steps" in command:
            import json

            try:
                record = json.loads(final.read_text())
                if str(record.get("steps")) == command[command.index("--steps") + 1] and "failed" not in record:
                    return {"returncode": 0, "seconds": time.time() - start, "node": socket.gethostname()}
            except ValueError:  # a final.json being written: let the run itself decide
                pass
        if not retry_diverged and (Path(run_dir) / "diverged.json").exists():  # (offrl.checkpoint.DIVERGED_FILE)
            return {"returncode": "diverged meanwhile (diverged.json), not started again", "seconds": time.time() - start,
                    "node": socket.gethostname()}
        set_aside_unstarted(Path(run_dir))
        proc = subprocess.Popen([sys.executable, *command[1:]], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                pass_fds=(lock.fileno(),))
        try:
            while proc.poll() is None:  # not proc.wait(): ray.cancel's KeyboardInterrupt only lands between bytecodes
                time.sleep(0.5)
            returncode = proc.returncode
        except BaseException:  # ray.cancel raises KeyboardInterrupt here: let the run checkpoint and exit
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return {"returncode": returncode, "seconds": time.time() - start, "node": socket.gethostname()}


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise SystemExit("--backend ray needs Ray: pip install -e '.[ray]' (or pip install 'ray>=2.9')") from e
    return ray


def task_environment() -> dict[str, str]:
    """What a run needs from this machine's environment on any node: this checkout on PYTHONPATH (where it
    exists there), the datasets folder and wandb settings."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    for name in ("MINARI_DATASETS_PATH", "WANDB_MODE", "WANDB_DIR", "WANDB_SILENT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run_ray(jobs: list[Job], common: list[str], address: str | None = None, threads: int = 1,
            max_retries: int = 3, retry_diverged: bool = False) -> list[Job]:
    """Run the unfinished jobs as Ray tasks on the cluster at `address` (or an already initialized Ray);
    returns the ones that failed. A run counts as done when its final.json says so, read here: the run
    folders must be on a filesystem this machine shares with the nodes."""
    ray = _import_ray()
    from ray import cloudpickle

    # absolute run folders: a task's working directory is this one only where a node has it
    pending = [replace(job, out_dir=job.out_dir.resolve()) for job in unfinished(jobs)]
    if not pending:
        return []
    if not ray.is_initialized():
        if address is None and not os.environ.get("RAY_ADDRESS"):
            address = "local"  # a new instance: ray.init(None) would join a cluster `ray start` left on this machine
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if run_command.__module__ != "__main__":  # (functions of __main__ travel by value anyway)
        cloudpickle.register_pickle_by_value(sys.modules[run_command.__module__])  # nodes need not import benchmarks
    task = ray.remote(run_command)
    env, cwd = task_environment(), os.getcwd()
    resources = [ray_resources(job, common, threads) for job in pending]
    on_cpu_by_default = sum(r["num_gpus"] == 0 and "cpu" not in device_options([*common, *job.extra])
                            for job, r in zip(pending, resources))
    warning = hidden_gpus_warning(ray.cluster_resources().get("GPU", 0), on_cpu_by_default)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    refs = {}
    for job, job_resources in zip(pending, resources):
        job.run_dir.parent.mkdir(parents=True, exist_ok=True)
        options = dict(job_resources, max_retries=max_retries, retry_exceptions=False)
        env_job = {**env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        ref = task.options(**options, name=f"{job.label}-{sanitize(job.dataset)}-{job.seed}").remote(
            job.command(common, threads), str(job.run_dir), str(job.log_path), env_job, cwd, retry_diverged)
        refs[ref] = (job, time.time())
        print(f"submit {job.label} {job.dataset} seed {job.seed} ({options['num_cpus']} CPU, "
              f"{options['num_gpus']} GPU)", flush=True)
    failed = []
    try:
        while refs:
            (ref,), _ = ray.wait(list(refs), num_returns=1)
            job, start = refs.pop(ref)
            try:
                result = ray.get(ref)
                code, where = result["returncode"], f" on {result['node']}"
            except Exception as e:  # noqa: BLE001 - the task died (node lost past its retries, ...)
                code, where = f"task error {type(e).__name__}", ""
            ok = code == 0 and job.done()
            if code == 0 and not ok:
                where += (f": exited 0, but {job.run_dir / 'final.json'} does not show {job.steps} steps here (see "
                          "its log; is --out-dir on a filesystem that this machine shares with the nodes?)")
            elif ok and (details := other_options(job, common)):  # the task found it finished by another process
                ok, where = False, f"{where}: finished by another process with other options than this sweep's ({details})"
            print(f"{'done' if ok else 'FAILED'} {job.label} {job.dataset} seed {job.seed} "
                  f"({(time.time() - start) / 60:.1f} min, exit {code}){where}", flush=True)
            if not ok:
                failed.append(job)
    except KeyboardInterrupt:
        print(f"interrupted: cancelling {len(refs)} run(s); each checkpoints on SIGTERM, rerun to resume", flush=True)
        for ref in refs:
            ray.cancel(ref)
        ray.wait(list(refs), num_returns=len(refs), timeout=330)
        raise SystemExit(130) from None
    return failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="sweep name (a folder under --out-dir)")
    parser.add_argument("--out-dir", default="runs-bench",
                        help="where the run folders go; with --backend ray a path every node and this machine see")
    parser.add_argument("--variant", action="append", required=True, help="label=algo [options], repeatable")
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=2,
                        help="local backend: runs at a time (one per core); Ray schedules by the cluster's resources")
    parser.add_argument("--threads", type=int, default=1, help="threads per run (Ray: CPUs per task)")
    parser.add_argument("--common", default="", help="options for every run, e.g. '--eval.every 10000' (one "
                        "option alone needs '=': --common=--run.compile)")
    parser.add_argument("--spread-threads", action="store_true",
                        help="when fewer runs are left than --jobs, restart them with the idle cores as threads "
                             "(local backend)")
    parser.add_argument("--backend", choices=["local", "ray"], default="local",
                        help="local: processes on this machine; ray: one Ray task per run (see above)")
    parser.add_argument("--ray-address", default=None,
                        help="auto (the cluster `ray start` made here), host:port or ray://host:10001; "
                             "default: RAY_ADDRESS, else a Ray instance on this machine for this sweep")
    parser.add_argument("--ray-retries", type=int, default=3,
                        help="times Ray reruns a run whose worker or node died (it resumes from its checkpoint)")
    parser.add_argument("--retry-diverged", action="store_true",
                        help="run again the runs that stopped on a NaN/inf (their diverged.json), from their last "
                             "checkpoint (from step 0 without one); by default a sweep leaves them alone and counts "
                             "them as failed")
    parser.add_argument("--status", action="store_true",
                        help="run nothing: print each variant's finished, running, diverged, interrupted and unstarted "
                             "runs, steps left and their core-hours at the pace of its finished runs")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: at least 1")
    if args.jobs < 1 or args.threads < 1:  # --jobs 0 would wait forever for a free slot
        parser.error(f"--jobs {args.jobs} --threads {args.threads}: each at least 1")
    try:
        shlex.split(args.common)
        for text in args.variant:
            shlex.split(text)
    except ValueError as e:  # an unclosed quote
        parser.error(f"--common/--variant: {e}")
    for where, text in [("--common", args.common), *(("--variant", v.partition("=")[2]) for v in args.variant)]:
        if taken := sorted({w.split("=", 1)[0] for w in shlex.split(text)} & SET_BY_THE_SWEEP):
            parser.error(f"{where} {text!r}: {', '.join(taken)} is the sweep's to set (its --datasets, --seeds, "
                         "--steps, --threads and --out-dir); give it to the sweep")
    if args.status:
        print_status(status(jobs_of(args)))
        return
    if args.backend == "ray" and args.spread_threads:
        parser.error("--spread-threads is for the local backend (a Ray task keeps the CPUs it asked for)")
    common = shlex.split(args.common)
    check_finished_options(jobs_of(args), common)
    jobs, left = (jobs_of(args), []) if args.retry_diverged else set_aside_diverged(jobs_of(args))
    if args.backend == "ray":
        failed = run_ray(jobs, common, args.ray_address, args.threads, args.ray_retries, args.retry_diverged)
    else:
        failed = run(jobs, common, args.jobs, args.spread_threads, args.threads, args.retry_diverged)
    if failed or left:
        print(f"{len(failed) + len(left)} run(s) failed ({len(left)} left alone as diverged); see their logs next to "
              "the run folders", file=sys.stderr)
        raise SystemExit(RUNS_FAILED)


if __name__ == "__main__":
    main()
