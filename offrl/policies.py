"""Policy files: small, weights-only actor checkpoints that roll out without the training code.

Format `offrl-actor-v1` (a dict saved with torch.save, read with weights_only=True):

    format       "offrl-actor-v1"
    kind         "tanh_gaussian" (SAC/CQL) | "deterministic" (TD3/TD3+BC/BC) | "gaussian" (IQL)
    obs_dim, act_dim, hidden       network shape
    action_low, action_high        float32 tensors, the env's action bounds
    state_dict                     the actor's weights
    obs_mean, obs_std              optional float32 tensors: observations are normalized first
    layer_norm, dropout            optional: the hidden layers' LayerNorm (CQL --actor-layer-norm) and dropout
                                   (IQL --actor-dropout; inactive when acting, but it shifts the layers' names)
    env_id, step, last_eval        provenance (last_eval is a JSON string)
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offrl import checkpoint as ckpt
from offrl.errors import CheckpointError
from offrl.nets import DeterministicActor, GaussianActor, TanhGaussianActor

FORMAT = "offrl-actor-v1"
KINDS = {"tanh_gaussian": TanhGaussianActor, "deterministic": DeterministicActor, "gaussian": GaussianActor}
ACTOR_OPTIONS = {"tanh_gaussian": ("layer_norm",), "deterministic": ("layer_norm", "dropout"), "gaussian": ("dropout",)}


def kind_of(actor: torch.nn.Module) -> str:
    for kind, cls in KINDS.items():
        if type(actor) is cls:
            return kind
    raise TypeError(f"no policy-file kind for {type(actor).__name__}")


def save_actor(path: str | Path, actor: torch.nn.Module, env_id: str, step: int, hidden, obs_mean=None,
               obs_std=None, last_eval: dict | None = None) -> Path:
    """Write an actor as a policy file (float32 weights on the CPU, atomically)."""
    obs_dim = next(m for m in actor.modules() if isinstance(m, torch.nn.Linear)).in_features
    dropout = next((m.p for m in actor.modules() if isinstance(m, torch.nn.Dropout)), 0.0)
    state = {
        "format": FORMAT, "kind": kind_of(actor), "obs_dim": int(obs_dim),
        "act_dim": int(actor.action_scale.numel()), "hidden": list(hidden),
        "action_low": (actor.action_bias - actor.action_scale).detach().cpu(),
        "action_high": (actor.action_bias + actor.action_scale).detach().cpu(),
        "state_dict": {k: v.detach().cpu() for k, v in actor.state_dict().items()},
        "env_id": env_id, "step": int(step), "last_eval": json.dumps(last_eval or {}),
        "layer_norm": any(isinstance(m, torch.nn.LayerNorm) for m in actor.modules()), "dropout": float(dropout),
    }
    if obs_mean is not None:
        state["obs_mean"] = torch.as_tensor(np.asarray(obs_mean), dtype=torch.float32)
        state["obs_std"] = torch.as_tensor(np.asarray(obs_std), dtype=torch.float32)
    return ckpt.save(path, state)


@dataclass
class Policy:
    """A loaded policy: batched numpy observations in, numpy actions out."""

    actor: torch.nn.Module
    kind: str
    env_id: str | None
    step: int | None
    obs_mean: torch.Tensor | None = None
    obs_std: torch.Tensor | None = None
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    def in_float64(self) -> "Policy":
        """This policy computing in float64 and returning float32 actions. CPUs differ in the last bits
        of float32 results (BLAS summation order, SIMD tanh/exp, vectorized randn), and one differing bit
        makes a MuJoCo trajectory diverge; in float64 such differences (~1e-16) rarely survive the rounding
        to float32, so most datasets come out with the same checksum on other machines. Not all: on a Xeon
        with AMX halfcheetah medium and medium-expert differed (README: MKL's choice of kernels, in part), and
        `offrl datasets make` warns when a checksum differs from the committed one."""
        to64 = lambda t: None if t is None else t.double()  # noqa: E731
        actor = copy.deepcopy(self.actor).double()
        return replace(self, actor=actor, obs_mean=to64(self.obs_mean), obs_std=to64(self.obs_std), dtype=torch.float64)

    def obs_dim(self) -> int | None:
        """The observation size the actor reads (its first linear layer's inputs), None if it has none."""
        first = next((m for m in self.actor.modules() if isinstance(m, torch.nn.Linear)), None)
        return None if first is None else first.in_features

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(obs), dtype=self.dtype, device=self.device)
        return (x - self.obs_mean) / self.obs_std if self.obs_mean is not None else x

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """Actions for a batch [n, obs_dim]; `deterministic=False` samples (tanh-Gaussian and Gaussian
        kinds) with `generator`, so rollouts are reproducible."""
        x = self._obs(obs)
        if deterministic or self.kind == "deterministic":
            return self.actor.act(x).float().cpu().numpy()
        if self.kind == "tanh_gaussian":
            mean, log_std = self.actor.distribution(x)
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            return self.actor.to_env(torch.tanh(mean + log_std.exp() * noise)).float().cpu().numpy()
        mean = self.actor.net(x)
        log_std = self.actor.log_std.clamp(self.actor.log_std_min, self.actor.log_std_max)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        unit = (mean + log_std.exp() * noise).clamp(-1.0, 1.0)
        return self.actor.to_env(unit).float().cpu().numpy()


# Training checkpoints (runs/<algo>/.../checkpoints/last.pt) whose agent has an `actor` of a known kind: the
# offline actors, and every agent built on offrl.sac.SACAgent (SAC, MOPO, MOBILE, RAVL, WSRL: a tanh-Gaussian actor
# of the config's `hidden` and `actor_layer_norm`).
RUN_CHECKPOINT_KINDS = {"sac": "tanh_gaussian", "cql": "tanh_gaussian", "td3_bc": "deterministic", "bc": "deterministic",
                        "iql": "gaussian", "riql": "deterministic", "mopo": "tanh_gaussian", "mobile": "tanh_gaussian",
                        "ravl": "tanh_gaussian", "wsrl": "tanh_gaussian"}


def _from_run_checkpoint(state: dict, path) -> dict:
    algo = state.get("algo")
    if algo not in RUN_CHECKPOINT_KINDS:
        raise CheckpointError(f"policy {path}: a training checkpoint of '{algo}', whose actor offrl cannot load "
                              f"as a policy (supported: {', '.join(RUN_CHECKPOINT_KINDS)})")
    agent = state["objects"]["agent"]
    actor_state = agent["actor"]
    config = json.loads(state["config"])
    kind = RUN_CHECKPOINT_KINDS[algo]
    if algo in ("iql", "riql") and "actor" in config:  # their actor type is an option
        kind = config["actor"]
    first_weight = next(v for k, v in actor_state.items() if k.endswith(".weight") and v.dim() == 2)
    scale, bias = actor_state["action_scale"], actor_state["action_bias"]
    out = {"format": FORMAT, "kind": kind, "obs_dim": first_weight.shape[1],
           "act_dim": scale.numel(), "hidden": config["hidden"], "action_low": bias - scale,
           "action_high": bias + scale, "state_dict": actor_state, "env_id": None, "step": state.get("step"),
           "layer_norm": bool(config.get("actor_layer_norm", False)), "dropout": float(config.get("actor_dropout", 0.0))}
    normalizer = agent.get("normalizer")
    if normalizer is not None and normalizer["mean"].dim() == 1:
        out["obs_mean"], out["obs_std"] = normalizer["mean"], normalizer["std"]
    return out


def load_policy(path: str | Path, device: torch.device | str = "cpu") -> Policy:
    """Load an offrl-actor-v1 policy file, or the actor of an offrl training checkpoint."""
    state = ckpt.load(path, map_location="cpu")
    if "objects" in state and "algo" in state:
        state = _from_run_checkpoint(state, path)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"policy {path}: not an {FORMAT} policy file (format: {state.get('format')!r}); "
                              "save one with offrl.policies.save_actor")
    kind = state.get("kind")
    if kind not in KINDS:
        raise CheckpointError(f"policy {path}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    low, high = state["action_low"].numpy(), state["action_high"].numpy()
    options = {"layer_norm": bool(state.get("layer_norm", False)), "dropout": float(state.get("dropout", 0.0))}
    options = {k: v for k, v in options.items() if v and k in ACTOR_OPTIONS[kind]}  # files before them: neither
    actor = KINDS[kind](int(state["obs_dim"]), int(state["act_dim"]), low, high, tuple(state["hidden"]), **options)
    ckpt.load_state_dicts({"actor": actor}, {"actor": state["state_dict"]}, str(path))
    device = torch.device(device)
    actor.to(device).eval()
    mean = state.get("obs_mean")
    return Policy(actor, kind, state.get("env_id"), state.get("step"),
                  None if mean is None else mean.to(device), None if mean is None else state["obs_std"].to(device), device)


def describe(path: str | Path) -> dict[str, Any]:
    state = ckpt.load(path)
    keys = ("format", "kind", "obs_dim", "act_dim", "hidden", "layer_norm", "dropout", "env_id", "step")
    return {k: state.get(k) for k in keys} | {
        "last_eval": json.loads(state.get("last_eval") or "{}")}
