"""Run a training module unchanged, as `python -m <module>` would, and record where its time goes.

    OFFRL_PROBE=probe.json python -m benchmarks.run_probe algos.td3_bc --dataset ... --steps 2000

For `python -m benchmarks.speed --end-to-end`: it wraps `offrl.run.Run`'s loop, `evaluate` and
`checkpoint` with perf_counter timers (a clock read per step; nothing else changes) and at exit writes
OFFRL_PROBE, a JSON object with

- loop: the run folder, the step numbers, the time step OFFRL_PROBE_WARMUP + 1 started (t_warm) and the
  time the loop ended (t_end);
- evaluations: per evaluation that ran, its step, start, end, `force`, the env setup time, the
  stepping time, the vector env steps (its longest episode) and the env's time limit;
- checkpoints: per checkpoint written, its step, start, end and `force`;
- rollouts: per model rollout round (MOPO, MOBILE, RAVL: `world_models.rollout.ModelData.rollout`), its start
  and end;
- cuda: torch.cuda.max_memory_allocated / max_memory_reserved in bytes, where CUDA was used;
- skipped: why the run did not train (OFFRL_PROBE_NO_MODEL_TRAINING=1 and a model-based run whose
  dynamics model is neither cached nor given with --model-path; the process then exits with 3).

Standard library and offrl only; times are time.perf_counter() of this process.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time
from pathlib import Path

NO_MODEL_EXIT = 3

probe: dict = {"loop": {}, "evaluations": [], "checkpoints": [], "rollouts": [], "cuda": None, "skipped": None}


def _write() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        probe["cuda"] = {"peak_allocated": int(torch.cuda.max_memory_allocated()),
                         "peak_reserved": int(torch.cuda.max_memory_reserved())}
    path = Path(os.environ["OFFRL_PROBE"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(probe, indent=1))
    tmp.replace(path)


def _instrument(warmup: int) -> None:
    import offrl.evaluation
    import offrl.run

    Run = offrl.run.Run
    iterate, evaluate_method, checkpoint_method = Run._iterate, Run.evaluate, Run.checkpoint
    evaluate_fn = offrl.run.evaluate
    loop = probe["loop"]

    def _iterate(self):
        loop.update(run_dir=str(self.dir), start_step=self.start_step, steps=self.cfg.steps, warmup=warmup,
                    t_warm=None, last_step=None)
        loop["t_start"] = time.perf_counter()
        try:
            for step in iterate(self):
                if step == self.start_step + warmup + 1:
                    loop["t_warm"] = time.perf_counter()
                loop["last_step"] = step
                yield step
        finally:  # also when the algorithm breaks out of the loop (RCSL's early stopping)
            loop["t_end"] = time.perf_counter()

    current: list[dict] = []  # the evaluation in progress, filled by `evaluate` below

    def evaluate(policy, metadata, episodes=10, seed=0, device="cpu", envs=None):
        start = time.perf_counter()
        own = envs is None
        if own:
            envs = offrl.evaluation.make_vector_env(metadata, episodes)
        made = time.perf_counter()
        try:
            result = evaluate_fn(policy, metadata, episodes, seed, device, envs)
            stepped = time.perf_counter()
            spec = getattr(getattr(envs, "envs", [None])[0], "spec", None)
        finally:
            if own:
                envs.close()
        current.append({"setup_s": (made - start) + (time.perf_counter() - stepped), "stepping_s": stepped - made,
                        "vector_steps": int(result.lengths.max()), "limit": getattr(spec, "max_episode_steps", None)})
        return result

    def timed_evaluate(self, step, policy, metadata, force=False, prefix=None):
        current.clear()
        start = time.perf_counter()
        summary = evaluate_method(self, step, policy, metadata, force=force, prefix=prefix)
        if summary is not None:
            probe["evaluations"].append({"step": step, "start": start, "end": time.perf_counter(), "force": force,
                                         "prefix": prefix, **(current[0] if current else {})})
        return summary

    def timed_checkpoint(self, step, state=None, force=False):
        due = force or self._due(step, self.cfg.run.checkpoint_every)
        start = time.perf_counter()
        checkpoint_method(self, step, state, force=force)
        if due:
            probe["checkpoints"].append({"step": step, "start": start, "end": time.perf_counter(), "force": force})

    Run._iterate, Run.evaluate, Run.checkpoint = _iterate, timed_evaluate, timed_checkpoint
    offrl.run.evaluate = evaluate

    import world_models.rollout

    ModelData = world_models.rollout.ModelData
    rollout_method = ModelData.rollout

    def timed_rollout(self, *args, **kwargs):
        start = time.perf_counter()
        metrics = rollout_method(self, *args, **kwargs)  # ends with a host sync (the live rows' count)
        probe["rollouts"].append({"start": start, "end": time.perf_counter()})
        return metrics

    ModelData.rollout = timed_rollout


def _no_model_training() -> None:
    """Model-based runs: exit instead of training a dynamics model that is not cached."""
    import world_models.train as wt

    load_or_train = wt.load_or_train

    def guarded(dataset, cfg, seed=0, device="cpu", model_path=None, retrain=False, cache_dir=None, progress=True,
                **options):
        if model_path is None:  # the cache path load_or_train reads
            path = wt.cache_folder(dataset, cfg, seed, cache_dir) / "model.pt"
            if retrain or not path.exists():
                probe["skipped"] = (f"no cached dynamics model ({path}); train it first (python -m world_models.train "
                                    f"--dataset {dataset.metadata.get('name')} --seed {seed} ...) or pass --model-path")
                print(f"run_probe: {probe['skipped']}", file=sys.stderr)
                raise SystemExit(NO_MODEL_EXIT)
        return load_or_train(dataset, cfg, seed, device, model_path, retrain, cache_dir, progress, **options)

    wt.load_or_train = guarded


def main() -> None:
    if len(sys.argv) < 2 or not os.environ.get("OFFRL_PROBE"):
        raise SystemExit("usage: OFFRL_PROBE=out.json python -m benchmarks.run_probe MODULE [ARGS...]")
    # checked before the run: the probe is written at exit, where a bad path would lose it after all the work
    out = Path(os.environ["OFFRL_PROBE"])
    if not out.parent.is_dir() or out.is_dir():
        raise SystemExit(f"error: OFFRL_PROBE={out}: a file in an existing folder")
    warmup = os.environ.get("OFFRL_PROBE_WARMUP", "0")
    if not warmup.isdigit():
        raise SystemExit(f"error: OFFRL_PROBE_WARMUP={warmup}: a number of steps (0 or more)")
    atexit.register(_write)
    _instrument(int(warmup))
    if os.environ.get("OFFRL_PROBE_NO_MODEL_TRAINING") == "1":
        _no_model_training()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
