"""Several seeds of one algorithm trained in one process as one batched model (`--seeds 0 1 2`).

Every parameter, and with it every optimizer state, gets a leading seed dimension: seed i's networks
are built exactly as a single-seed run builds them (`torch.manual_seed(i)` first), then stacked. The
agent's own loss methods run under `torch.func.vmap` over the seed dimension, with the seed's
weights swapped in by `torch.func.functional_call`; the sum of the seeds' losses is backpropagated,
so each seed's weights get exactly their own gradient, and Adam, being elementwise, steps each slice
as a separate Adam would. Each seed samples its batches with its own generator, seeded as a
single-seed run's replay buffer is, from one shared copy of the data.

Each seed keeps a run folder of its own (config.json without `seeds`, metrics.jsonl, final.json,
checkpoints/last.pt) in the format of a single-seed run, so `offrl eval`, `--resume`, the tables and
a single-seed process all read it. All seeds are evaluated together in one vector env (seed i's
episodes reset with seeds i + offset + j, as its single-seed run's), one batched policy call per step.

What differs from separate runs is the float order: a batched matmul sums in another order than a
single one, so metrics agree with the single-seed runs' to rounding at first and then drift apart as
any two chaotic trainings do (tests/test_multiseed.py states the tolerance). On a GPU this is where
the speed-up is; on a CPU, see results/speed.md ("seeds in one process").
"""

from __future__ import annotations

import copy
import dataclasses
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch
from torch import nn

from offrl.data.buffer import Batch, ReplayBuffer
from offrl.errors import OffrlError
from offrl.evaluation import evaluate


def seed_configs(cfg) -> list:
    """One config per seed, as a single-seed run of that seed has it (no `seeds`)."""
    seeds = list(cfg.seeds)
    if len(set(seeds)) != len(seeds) or min(seeds, default=0) < 0:  # a negative one failed after the first seed's folder
        raise OffrlError(f"--seeds {' '.join(map(str, seeds))}: each seed 0 or more, none given twice")
    if cfg.log.name:  # one name for several seeds' folders: a resume would take one seed's for another's
        raise OffrlError("--seeds with --log.name: each seed's run folder is named <seed>-<time>; leave --log.name out")
    data = getattr(cfg, "data", None)
    if data is not None and data.corrupt is not None and data.corruption_seed is None:
        raise OffrlError("--seeds with --data.corrupt: give --data.corruption-seed, so that every seed trains on the "
                         "same corrupted data")
    dropout = {name: getattr(cfg, name) for name in ("actor_dropout", "dropout") if getattr(cfg, name, 0)}
    if dropout:
        # a dropout mask drawn inside the batched step would come from one stream, not each seed's own
        flags = ", ".join(f"--{name.replace('_', '-')} {value:g}" for name, value in dropout.items())
        raise OffrlError(f"--seeds with {flags}: dropout is not drawn per seed in the batched model; run the seeds "
                         "as separate processes (benchmarks.sweep)")
    return [dataclasses.replace(cfg, seed=s, seeds=None) for s in seeds]


class SeedSamplers:
    """One replay buffer's rows, sampled by one generator per seed (each seeded as that seed's buffer)."""

    def __init__(self, buffer: ReplayBuffer, seeds: Sequence[int]):
        self.buffer = buffer
        self.views = []
        for s in seeds:
            view = copy.copy(buffer)  # shares the storage tensor; gets its own generator
            view.generator = torch.Generator(device=buffer.device).manual_seed(s)
            self.views.append(view)

    def sample(self, batch_size: int) -> Batch:
        """[S, B, ...] batches: row block i drawn by seed i's generator."""
        return self.buffer.gather(torch.stack([v.sample_index(batch_size) for v in self.views]))


class _Call(nn.Module):
    """Holds an agent's modules as children so that `functional_call` can swap their weights, and runs
    one of the agent's methods with them."""

    def __init__(self, agent: Any, module_names: Sequence[str]):
        super().__init__()
        self.agent = [agent]  # a list: not a child module
        for name in module_names:
            self.add_module(name, getattr(agent, name))
        self.method: Callable | None = None

    def forward(self, *args):
        return self.method(*args)


class SeedBatch:
    """S agents of one class as one: stacked weights, optimizers over them, and per-seed views
    (`view(i)`) in the single-seed agent's checkpoint format.

    `modules`: the agent's attributes holding networks (all stacked); `optimizers`: attributes holding
    optimizers over those networks' parameters; `schedulers`: LR schedulers of those optimizers; `carried`:
    attributes holding dicts of metrics that the agent checkpoints (e.g. TD3+BC's actor metrics, repeated between
    actor steps), kept here in `carried[name]` as [S] tensors."""

    def __init__(self, agents: list, modules: Sequence[str], optimizers: Sequence[str], schedulers: Sequence[str] = (),
                 carried: Sequence[str] = ()):
        self.agents, self.modules, self.optimizers, self.schedulers = agents, list(modules), list(optimizers), list(schedulers)
        self.carried: dict[str, dict[str, torch.Tensor]] = {name: {} for name in carried}
        template = agents[0]
        self.call = _Call(template, self.modules)
        names = [n for n, _ in self.call.named_parameters()]
        members = [dict(_Call(a, self.modules).named_parameters()) for a in agents]
        self.params = {n: torch.stack([m[n].detach() for m in members]).requires_grad_(members[0][n].requires_grad)
                       for n in names}
        buffer_members = [dict(_Call(a, self.modules).named_buffers()) for a in agents]
        self.buffers = {n: torch.stack([m[n] for m in buffer_members]) for n in buffer_members[0]}
        stacked_of = {id(p): self.params[n] for n, p in self.call.named_parameters()}
        self.batched_optimizers = {}
        for name in self.optimizers:
            opt = getattr(template, name)
            groups = [{**{k: v for k, v in g.items() if k not in ("params", "initial_lr")},
                       "params": [stacked_of[id(p)] for p in g["params"]]} for g in opt.param_groups]
            self.batched_optimizers[name] = type(opt)(groups, **{k: v for k, v in opt.defaults.items() if k != "lr"},
                                                      lr=opt.defaults["lr"])
        self.batched_schedulers = {}
        for name in self.schedulers:  # LambdaLR (what offrl's algorithms use), in the template's state
            sched = getattr(template, name)
            opt_name = next(o for o in self.optimizers if getattr(template, o) is sched.optimizer)
            batched = torch.optim.lr_scheduler.LambdaLR(self.batched_optimizers[opt_name], sched.lr_lambdas)
            batched.load_state_dict(sched.state_dict())
            self.batched_schedulers[name] = batched
        self.seeds = len(agents)

    # ------------------------------------------------------------------ running the agent's methods
    def vmap(self, method: Callable, *args, randomness: str = "different"):
        """`method(*args)` of the template agent for every seed at once: args carry a leading seed dim."""
        def one(params, buffers, *a):
            self.call.method = method
            return torch.func.functional_call(self.call, (params, buffers), a)
        return torch.func.vmap(one, randomness=randomness)(self.params, self.buffers, *args)

    def params_of(self, module: str) -> list[torch.Tensor]:
        prefix = module + "."
        return [p for n, p in self.params.items() if n.startswith(prefix)]

    def soft_update(self, target: str, source: str, tau: float) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(self.params_of(target), self.params_of(source), tau)

    def acting(self, method: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
        """A policy for one vector env holding every seed's episodes in turn: obs [S * E, obs_dim]."""
        def act(obs: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                out = self.vmap(method, obs.reshape(self.seeds, -1, obs.shape[-1]))
            return out.reshape(obs.shape[0], -1)
        return act

    # ------------------------------------------------------------------ per-seed state
    def write_back(self, i: int) -> None:
        """Copy seed i's slice of every weight, optimizer and scheduler state into agent i."""
        agent = self.agents[i]
        with torch.no_grad():
            for n, p in _Call(agent, self.modules).named_parameters():
                p.copy_(self.params[n][i])
        for name, batched in self.batched_optimizers.items():
            getattr(agent, name).load_state_dict(_slice_optimizer_state(batched.state_dict(), i, self.seeds))
        for name, batched in self.batched_schedulers.items():
            getattr(agent, name).load_state_dict(batched.state_dict())
        for name, metrics in self.carried.items():
            setattr(agent, name, {k: v[i] for k, v in metrics.items()})

    def restack(self) -> None:
        """Agents -> stacked weights and optimizer states (after the agents were loaded from checkpoints)."""
        members = [dict(_Call(a, self.modules).named_parameters()) for a in self.agents]
        with torch.no_grad():
            for n, stacked in self.params.items():
                stacked.copy_(torch.stack([m[n].detach() for m in members]))
        for name, batched in self.batched_optimizers.items():
            states = [getattr(a, name).state_dict() for a in self.agents]
            batched.load_state_dict(_stack_optimizer_states(states))
        for name, batched in self.batched_schedulers.items():
            batched.load_state_dict(getattr(self.agents[0], name).state_dict())
        for name in self.carried:
            per_seed = [getattr(a, name) for a in self.agents]
            self.carried[name] = {k: torch.stack([m[k] for m in per_seed]) for k in per_seed[0]} if all(per_seed) else {}

    def view(self, i: int) -> "SeedView":
        return SeedView(self, i)


class SeedAgents:
    """What every algorithm's `Seeds` class starts from: the seeds' agents built as their single-seed runs
    build them, stacked into one `SeedBatch`, a sampler per seed over one shared buffer, one checkpoint state
    per seed and one batched policy. Subclasses add the gradient step and `update()`."""

    READS_NEXT_OBSERVATIONS = True  # TrainingData.buffer's check; BC's update does not read s'

    def __init__(self, cfgs: list, data: Any, device: torch.device, build: Callable[[Any], Any],
                 modules: Sequence[str], optimizers: Sequence[str], schedulers: Sequence[str] = (),
                 carried: Sequence[str] = ()):
        self.cfg = cfgs[0]
        buffer = data.buffer(device, seed=cfgs[0].seed, reads_next_observations=self.READS_NEXT_OBSERVATIONS)
        self.samplers = SeedSamplers(buffer, [c.seed for c in cfgs])
        self.agents = build_seeded(build, cfgs)
        self.batch = SeedBatch(self.agents, modules, optimizers, schedulers, carried)
        self.states = [{"agent": self.batch.view(i), "buffer": self.samplers.views[i]} for i in range(len(cfgs))]
        self.act = self.batch.acting(self.agents[0].act)


class SeedView:
    """Seed i of a SeedBatch as the single-seed agent its run checkpoints."""

    def __init__(self, batch: SeedBatch, i: int):
        self.batch, self.i = batch, i

    def state_dict(self) -> dict:
        self.batch.write_back(self.i)
        return self.batch.agents[self.i].state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batch.agents[self.i].load_state_dict(state)


def _slice_optimizer_state(state: dict, i: int, seeds: int) -> dict:
    out = {"param_groups": state["param_groups"], "state": {}}
    for key, entry in state["state"].items():
        out["state"][key] = {k: (v[i].clone() if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == seeds else v)
                             for k, v in entry.items()}
    return out


def _stack_optimizer_states(states: list[dict]) -> dict:
    first = states[0]
    out = {"param_groups": first["param_groups"], "state": {}}
    for key, entry in first["state"].items():
        out["state"][key] = {k: (torch.stack([s["state"][key][k] for s in states]) if torch.is_tensor(v) and v.dim() > 0 else v)
                             for k, v in entry.items()}
    return out


class _SeedMetrics(Mapping):
    """Seed i's view of [S]-shaped metrics, sliced only when read: `Run.log` reads them every log.every
    steps and keeps them otherwise; slicing 7 metrics for 64 seeds at every step took 0.38 ms on this
    project's CPU, against a 2.4 ms graphed 64-seed IQL step on an H100 (results/speed-gpu.md)."""

    def __init__(self, metrics: dict[str, torch.Tensor], i: int):
        self.metrics, self.i = metrics, i

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.metrics[key][self.i]

    def __iter__(self):
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)


class SeedRuns:
    """One `offrl.run.Run` per seed (its own folder, logs, checkpoints), driven by one loop."""

    def __init__(self, algo: str, cfgs: list, data: Any = None):
        from offrl.run import Run

        # the records open once the seeds are known to resume together: a refused resume changes no folder
        self.runs = []
        try:
            for c in cfgs:
                self.runs.append(Run(algo, c, data, concurrent=True, open_records=False))
        except BaseException:  # a later seed refused (e.g. its checkpoint damaged): the earlier ones let go too
            self._let_go()
            raise
        for run in self.runs:
            run.process_share = 1 / len(self.runs)
        starts = {r.start_step for r in self.runs}
        if len(starts) > 1:  # e.g. killed between the seeds' checkpoint writes, each seed's a file of its own
            found = ", ".join(f"seed {r.cfg.seed} at step {r.start_step}" for r in self.runs)
            self._let_go()
            raise OffrlError(f"--seeds with --resume: the seeds' checkpoints are at different steps ({found}); "
                             "resume each seed as a run of its own (--seed N --resume latest), which continues it "
                             "exactly, or start the seeds afresh")
        try:
            for run in self.runs:
                run.open_records()
        except BaseException:  # e.g. a full disk, wandb failing to start
            self._let_go()
            raise
        self.start_step = starts.pop()
        self.device = self.runs[0].device
        self.cfg = cfgs[0]
        # each Run saved the handler it found, the previous seed's run's for all but the first: the process's
        # own are the first run's, given back at `finish`
        self.process_handlers = dict(self.runs[0]._previous_handlers)
        if threading.current_thread() is threading.main_thread():  # one handler stops every seed's run
            for sig in self.process_handlers:  # the signals a Run handles (SIGHUP unless under nohup)
                signal.signal(sig, self._request_stop)
        # a signal while a later seed's Run was built reached the handler then installed, an earlier seed's run's:
        # every seed stops on it (the loop reads the first run's flag)
        pending = next((run.stop_signal for run in self.runs if run.stop_signal is not None), None)
        if pending is not None:
            for run in self.runs:
                run.stop_signal = pending

    def _let_go(self) -> None:
        """Before the loop starts, on an error: close what the runs opened, give the process its signal handlers
        back, release the folders and remove those made just now (by --resume auto for a seed without a
        checkpoint: nothing in them yet), so retries do not pile up empty folders."""
        for run in reversed(self.runs):
            try:
                run.abandon()
            except Exception as exc:  # noqa: BLE001 - the error being raised is the one to report
                print(f"warning: seed {run.cfg.seed}'s logs were not closed cleanly: {exc}", file=sys.stderr)
            run._restore_signals()

    def _request_stop(self, signum, frame) -> None:
        if self.runs[0].stop_signal is not None:  # a second signal: stop now; the last periodic checkpoints stand
            raise KeyboardInterrupt
        for run in self.runs:
            run.stop_signal = signum
        from offrl.run import say_stopping

        say_stopping(signum, f"signal {signum}: stopping every seed after this step with a checkpoint\n")

    def precision(self):
        """Context for one batched gradient step (`--run.precision`, the same for every seed)."""
        return self.runs[0].precision()

    def steps(self, states: list[dict], after_restore: Callable[[], None] | None = None):
        """Restore every seed's state when resuming (then `after_restore()`), and yield the steps."""
        for run, state in zip(self.runs, states):
            run.steps(state)
        if self.start_step > 0 and after_restore is not None:
            after_restore()
        for step in range(self.start_step + 1, self.runs[0].total_steps + 1):
            yield step
            if self.runs[0].stop_signal is not None:
                for run in self.runs:  # every seed checked before any saves: their checkpoints stay at one step
                    run.check_unlogged()
                for run in self.runs:
                    run.close_at(step)
                for sig, handler in self.process_handlers.items():
                    signal.signal(sig, handler)
                print(f"stopped after step {step}; checkpoints saved; continue with the same --seeds and "
                      "--resume latest", file=sys.stderr)
                raise SystemExit(128 + self.runs[0].stop_signal)

    def log(self, step: int, metrics: dict[str, torch.Tensor]) -> None:
        for i, run in enumerate(self.runs):
            run.log(step, _SeedMetrics(metrics, i))

    def evaluate(self, step: int, policy: Callable[[torch.Tensor], torch.Tensor], metadata: dict) -> None:
        """Every seed's evaluation episodes in one vector env, each seed's reset as in its own run."""
        if not self.runs[0]._due(step, self.cfg.eval.every):
            return
        for run in self.runs:  # a NaN since the last logged step stops the runs as a divergence, as Run.evaluate
            run.check_unlogged()
        episodes = self.cfg.eval.episodes
        seeds = [r.eval_seed + j for r in self.runs for j in range(episodes)]
        result = evaluate(policy, metadata, episodes * len(self.runs), device=self.device, reset_seeds=seeds)
        for run, part in zip(self.runs, result.split(len(self.runs))):
            run.record_evaluation(step, part)

    def checkpoint(self, step: int, states: list[dict]) -> None:
        if self.runs[0]._due(step, self.cfg.run.checkpoint_every):
            for run in self.runs:  # every seed checked before any saves: a NaN in one stops all at the same step
                run.check_unlogged()
        for run, state in zip(self.runs, states):
            run.checkpoint(step, state)

    def finish(self, extra: dict | None = None) -> list[dict]:
        finals = [run.finish(extra) for run in self.runs]
        for sig, handler in self.process_handlers.items():
            signal.signal(sig, handler)
        return finals


def build_seeded(build: Callable[[Any], Any], cfgs: list, compile_ok: bool = False) -> list:
    """build(cfg) for every seed's config, with the global torch RNG seeded as a single-seed run seeds it."""
    from offrl.run import seed_everything

    if cfgs[0].run.compile and not compile_ok:
        raise OffrlError("--seeds does not combine with --run.compile yet")
    agents = []
    for cfg in cfgs:
        seed_everything(cfg.seed)
        agents.append(build(cfg))
    return agents


def train(algo: str, make_seeds: Callable[[list, Any, torch.device], Any], cfg, select: Callable | None = None,
          extras: Callable[[Any], dict] | None = None) -> list[dict]:
    """The `--seeds` training loop: `make_seeds(cfgs, data, device)` (an algorithm's `Seeds` class) holds the
    batched model and its `update()`, `states` (one checkpoint state per seed), `batch` and `act`. `select`
    picks episodes as the data loads (BC's --frac), `extras(data)` adds to every seed's final.json."""
    from offrl.data import load_for_training

    cfgs = seed_configs(cfg)
    data = load_for_training(cfg.dataset, cfg.data, select=select, seed=cfgs[0].seed)
    runs = SeedRuns(algo, cfgs, data)
    seeds = make_seeds(cfgs, data, runs.device)
    for step in runs.steps(seeds.states, after_restore=seeds.batch.restack):
        with runs.precision():
            metrics = seeds.update()
        runs.log(step, metrics)
        runs.evaluate(step, seeds.act, data.metadata)
        runs.checkpoint(step, seeds.states)
    return runs.finish(extras(data) if extras else None)
