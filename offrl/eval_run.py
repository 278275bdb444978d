"""Evaluate a saved run again: `offrl eval <run folder or checkpoint>`.

A training run evaluates with the episode count it was given (often 10-20, to keep training cheap).
This rebuilds the run's agent from its checkpoint (`checkpoints/last.pt`: the algorithm's name, its
full config and every object's state) and evaluates it with as many episodes as asked, on the same
vectorized evaluator; with the run's own episode count and seed it reproduces a finished run's final
evaluation (on the same device and thread count).

An algorithm module may define two hooks (the defaults fit every algorithm whose agent is built as
`Agent(cfg, data, device)` and acts through `agent.act`):

    eval_setup(cfg, device) -> (agent, metadata)      build the agent (untrained) and the eval env's metadata
    eval_policies(cfg, agent, metadata, targets) -> {name: policy}
                                                       what to evaluate once the state is loaded; "eval" is
                                                       the run's score; `targets` (conditioning returns) is
                                                       None unless the user passed --targets
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from offrl import checkpoint as ckpt
from offrl.config import from_dict, resolve_device
from offrl.errors import CheckpointError, OffrlError
from offrl.evaluation import evaluate
from offrl.nets import retain_freed_memory


def checkpoint_of(path: str | Path) -> Path:
    """A run folder's checkpoint, or the checkpoint file itself."""
    path = Path(path)
    if path.is_dir():
        path = ckpt.run_checkpoint(path)
        if not ckpt.has_checkpoint(path.parent.parent):
            raise CheckpointError(f"{path.parent.parent}: not a run folder with a checkpoint (no checkpoints/last.pt)")
    elif not path.exists():
        raise CheckpointError(f"{path}: no such run folder or checkpoint file")
    return path


def default_setup(module, cfg, device: torch.device) -> tuple[Any, dict]:
    from offrl.data import load_for_training

    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed, check_options=False)
    return module.Agent(cfg, data, device), data.metadata


def default_policies(cfg, agent, metadata: dict, targets: Sequence[float] | None) -> dict[str, Callable]:
    if targets:
        raise OffrlError(f"--targets: {type(agent).__name__} is not return-conditioned")
    return {"eval": agent.act}


def load_saved_run(path: str | Path, device: str = "auto", threads: int | None = None):
    """The run saved at `path`, rebuilt: (algorithm module, config, agent with the saved state, eval
    metadata, checkpoint file, step)."""
    state, file = ckpt.load_or_previous(checkpoint_of(path))
    algo, config = state.get("algo"), state.get("config")
    if not isinstance(algo, str) or not isinstance(config, str) or "objects" not in state:
        raise CheckpointError(f"checkpoint {file}: not an offrl training checkpoint (no algo, config or objects)")
    try:
        module = importlib.import_module(f"algos.{algo}")
    except ModuleNotFoundError:
        raise CheckpointError(f"checkpoint {file}: algorithm '{algo}' is not in this version of offrl") from None
    cfg = from_dict(module.Config, json.loads(config), where=f"checkpoint {file}: config")
    cfg.device = device
    threads = cfg.run.threads if threads is None else threads  # 0: torch's default, as --run.threads 0
    if threads > 0:
        torch.set_num_threads(threads)
    if cfg.run.retain_freed_memory:
        retain_freed_memory()
    setup = getattr(module, "eval_setup", None) or (lambda c, d: default_setup(module, c, d))
    agent, metadata = setup(cfg, resolve_device(device))
    ckpt.load_state_dicts({"agent": agent}, state["objects"], str(file))
    return module, cfg, agent, metadata, file, int(state["step"])


def evaluate_saved_run(path: str | Path, episodes: int | None = None, seed: int | None = None,
                       device: str = "auto", targets: Sequence[float] | None = None,
                       threads: int | None = None) -> dict[str, Any]:
    """Rebuild the run saved at `path` and evaluate it; episodes and seed default to the run's own
    (`eval.episodes`, seed + `eval.seed_offset`). Returns the summaries by policy name."""
    module, cfg, agent, metadata, file, step = load_saved_run(path, device, threads)
    policies = getattr(module, "eval_policies", default_policies)(cfg, agent, metadata, targets)
    episodes = episodes or cfg.eval.episodes
    seed = cfg.seed + cfg.eval.seed_offset if seed is None else seed
    results = {}
    for name, policy in policies.items():
        summary = evaluate(policy, metadata, episodes, seed, resolve_device(device)).summary()
        results[name] = {k.split("/", 1)[1]: v for k, v in summary.items()}
    return {"checkpoint": str(file), "algo": module.__name__.split(".")[-1], "run_label": cfg.run_label, "step": step,
            "episodes": episodes, "seed": seed, "results": results}


def target_policies(targets: Sequence[float], actor: Callable[[float], Callable]) -> dict[str, Callable]:
    """Return-conditioned policies by name: the first target's is "eval" (the run's score), the others
    "eval_target_<target>"; repeated targets are evaluated once."""
    unique = list(dict.fromkeys(float(t) for t in targets))
    return {"eval" if i == 0 else f"eval_target_{t:g}": actor(t) for i, t in enumerate(unique)}
