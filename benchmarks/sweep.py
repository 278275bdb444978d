"""Run a grid of training runs as parallel 1-thread processes; resumable.

    python -m benchmarks.sweep --name hopper-mr --out-dir runs-bench \\
        --variant bc=bc --variant iql=iql --variant cql=cql \\
        --datasets offrl/hopper/medium-replay-v0 --seeds 0 1 2 --steps 100000 --jobs 2

A variant is `label=algo [extra options]`, e.g. `--variant "iql-corrupt=iql --data.corrupt next_observations"`.
Run i of a variant lives in <out-dir>/<name>/<label>/<algo>/<dataset>/<seed>-sweep/. Rerunning the same
command skips finished runs and continues interrupted ones from their last checkpoint (--resume auto),
so a sweep can span sessions. Two 1-thread processes beat one 2-thread process on 2 cores (MEASURED.md).

At a sweep's tail fewer runs are left than --jobs, and cores idle. With --spread-threads the sweep then
stops a running run (SIGTERM: it finishes its step and saves a checkpoint) and resumes it at once with
the idle cores as extra threads (`--run.threads` is a setting a resume may change). A run's threads only
grow, so each is restarted at most a few times; threads change float reductions, not the algorithm.
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
from dataclasses import dataclass
from pathlib import Path

from offrl.checkpoint import has_checkpoint
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
        final = self.run_dir / "final.json"
        return final.exists() and json.loads(final.read_text()).get("steps") == self.steps

    def has_checkpoint(self) -> bool:
        return has_checkpoint(self.run_dir)

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
    return [Job(label, algo, extra, dataset, seed, args.steps, out)
            for label, algo, extra in map(parse_variant, args.variant)
            for dataset in args.datasets for seed in args.seeds]


@dataclass
class Running:
    job: Job
    proc: subprocess.Popen
    start: float
    threads: int
    respawn_threads: int | None = None  # set once the run was asked to stop for a restart with more threads


def thread_shares(cores: int, runs: int) -> list[int]:
    """Cores split over `runs` processes, the first ones taking the remainder: (5, 2) -> [3, 2]."""
    return [cores // runs + (i < cores % runs) for i in range(runs)]


def launch(job: Job, common: list[str], threads: int) -> subprocess.Popen:
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with open(job.run_dir.parent / f"{job.seed}-sweep.log", "a") as log:  # the child keeps its own handle
        return subprocess.Popen(job.command(common, threads), stdout=log, stderr=subprocess.STDOUT, env=env)


def run(jobs: list[Job], common: list[str], parallel: int, spread_threads: bool = False) -> list[Job]:
    """Run the unfinished jobs, `parallel` at a time; returns the ones that failed."""
    pending = [j for j in jobs if not j.done()]
    print(f"{len(jobs) - len(pending)} of {len(jobs)} runs already finished; {len(pending)} to go", flush=True)
    running: list[Running] = []
    failed = []
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            running.append(Running(job, launch(job, common, 1), time.time(), 1))
            print(f"start {job.label} {job.dataset} seed {job.seed}", flush=True)
        if spread_threads and not pending and running:
            for entry, share in zip(running, thread_shares(parallel, len(running))):
                # only a run with a checkpoint: one stopped before its first would resume in a new folder
                if share > entry.threads and entry.respawn_threads is None and entry.job.has_checkpoint():
                    entry.respawn_threads = share
                    entry.proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        for entry in list(running):
            job, proc = entry.job, entry.proc
            if proc.poll() is None:
                continue
            if entry.respawn_threads is not None and not job.done():
                entry.proc, entry.threads = launch(job, common, entry.respawn_threads), entry.respawn_threads
                entry.respawn_threads = None
                print(f"resume {job.label} {job.dataset} seed {job.seed} with {entry.threads} threads", flush=True)
                continue
            running.remove(entry)
            # a run told to stop may have been past its last step already, finishing as the signal came
            ok = job.done() and (proc.returncode == 0 or entry.respawn_threads is not None)
            print(f"{'done' if ok else 'FAILED'} {job.label} {job.dataset} seed {job.seed} "
                  f"({(time.time() - entry.start) / 60:.1f} min, exit {proc.returncode})", flush=True)
            if not ok:
                failed.append(job)
    return failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="sweep name (a folder under --out-dir)")
    parser.add_argument("--out-dir", default="runs-bench")
    parser.add_argument("--variant", action="append", required=True, help="label=algo [options], repeatable")
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one per core)")
    parser.add_argument("--common", default="", help="options for every run, e.g. '--eval.every 10000'")
    parser.add_argument("--spread-threads", action="store_true",
                        help="when fewer runs are left than --jobs, restart them with the idle cores as threads")
    args = parser.parse_args(argv)
    failed = run(jobs_of(args), shlex.split(args.common), args.jobs, args.spread_threads)
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed; see their logs next to the run folders")


if __name__ == "__main__":
    main()
