"""Data corruption, RIQL's protocol (Yang et al., ICLR 2024; docs/FACTS.md section 5), for any algorithm
through `--data.corrupt <field>`.

Each transition is hit independently with probability `rate` (a NumPy generator seeded with the
corruption seed picks them); one field per run:

random       observations / actions / next_observations: x <- x + range * std(x) * U(-1, 1)^d, with
             the per-dimension std over the whole (clean) field; rewards: r <- U(-30 range, 30 range)
             (replaced, not perturbed).
adversarial  observations / actions: x <- x + p * std(x), p in [-range, range]^d found by 100 steps that
             minimize a trained critic's Q(s, a) at the perturbed input, averaged over the critic
             ensemble and the rows, as RIQL's `attack.py` does it: p starts at U(-range, range) * std(x)
             (RIQL's draw, which is then applied times std once more); each step is the first step of
             a fresh Adam (RIQL builds a new one every step), p <- p - lr * g / (|g| + 1e-8) with
             lr = 0.01 * range, i.e. a sign-gradient step, then p is clamped into [-range, range];
             next_observations: the same, minimizing Q(s', pi(s')) with the checkpoint's deterministic
             action (RIQL's own next-observation attack fails at its HEAD: its actor returns a tuple);
             rewards: r <- -range * r.
             The critic comes from an offrl training checkpoint (iql, riql, cql, td3_bc, sac, mopo, mobile,
             ravl, wsrl, with its state normalization), trained on the clean data by this project; it runs on
             the CPU unless --data.attack-device says otherwise.
Deviations from RIQL: its attacks use a pretrained EDAC agent (10 critics) where any offrl Q-ensemble
checkpoint is accepted here (RAVL's is EDAC's 10-critic agent, trained on model rollouts as well); rows are
attacked in chunks of 50k instead of 10 chunks (each row's steps depend only on its own gradient; the step's
1e-8 sits beside a gradient scaled by the chunk's size, so rows with a near-zero gradient can step
differently); and the corruption is drawn per seed, where RIQL caches one adversarial dataset per env and
reuses it for every seed.

The corruption comes before the data config's preprocessing (`offrl.data.load_for_training`), so an
algorithm's action clipping and reward scaling act on the corrupted data: IQL's defaults (both on, as the
official IQL) clip corrupted actions back into the box and take the return range from corrupted rewards,
where the RIQL repository's IQL baseline does neither. For that baseline pass
`--data.no-clip-actions --data.no-normalize-reward` to IQL. RIQL's per-dataset and per-corruption sigma,
quantile and K (docs/FACTS.md section 5) are not set from `--data.corrupt`: pass them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from offrl.config import resolve_device
from offrl.data.dataset import Dataset
from offrl.errors import OffrlError

FIELDS = ("observations", "actions", "rewards", "next_observations")


@dataclass
class Corruption:
    field: str
    mode: str
    rate: float
    scale: float
    seed: int
    rows: np.ndarray  # indices of the corrupted transitions
    original: np.ndarray  # their clean values

    def summary(self) -> dict:
        return {"field": self.field, "mode": self.mode, "rate": self.rate, "range": self.scale, "seed": self.seed,
                "rows_hit": int(len(self.rows))}


def corrupt(dataset: Dataset, field: str, mode: str = "random", rate: float = 0.3, scale: float = 1.0, seed: int = 0,
            critic_checkpoint: str | None = None, attack_steps: int = 100, chunk_size: int = 50_000,
            device: torch.device | str = "cpu") -> tuple[Dataset, Corruption]:
    """`field` of a `rate` fraction of the rows (drawn from `seed`) corrupted as RIQL's attack.py does; an
    adversarial attack on observations or actions runs the critic on `device` ('cpu', 'cuda', 'auto', ...:
    --data.attack-device), whose float rounding can move a perturbation that sits on a sign flip of the
    gradient, so CPU and CUDA need not give the same bytes."""
    if field not in FIELDS:
        raise OffrlError(f"--data.corrupt {field}: choose one of {', '.join(FIELDS)}")
    if not 0.0 <= rate <= 1.0:
        raise OffrlError(f"--data.corruption-rate must be in [0, 1], got {rate}")
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(rng.random(len(dataset)) < rate)
    clean = getattr(dataset, field)
    values = clean.copy()
    if mode == "random":
        if field == "rewards":
            values[rows] = rng.uniform(-30 * scale, 30 * scale, size=len(rows)).astype(np.float32)
        else:
            std = clean.std(0, dtype=np.float64).astype(np.float32)
            values[rows] = clean[rows] + scale * std * rng.uniform(-1, 1, size=(len(rows), clean.shape[1])).astype(np.float32)
    elif mode == "adversarial":
        if field == "rewards":
            values[rows] = -scale * clean[rows]
        else:
            if critic_checkpoint is None:
                raise OffrlError("adversarial corruption of observations, actions or next observations needs "
                                 "--data.attack-critic <offrl training checkpoint trained on the clean data>")
            attacker = AttackCritic(critic_checkpoint, resolve_device(str(device)))
            values[rows] = adversarial_perturbation(dataset, field, rows, scale, attacker, rng, attack_steps, chunk_size)
    else:
        raise OffrlError(f"--data.corruption-mode {mode}: choose random or adversarial")
    info = Corruption(field, mode, rate, scale, seed, rows, clean[rows].copy())
    corrupted = dataset.replace(**{field: values.astype(np.float32)}, metadata={**dataset.metadata, "corruption": info.summary()})
    return corrupted, info


class AttackCritic:
    """The critics Q_i(s, a) and the actor pi(s) of an offrl training checkpoint, in raw (unnormalized) state space."""

    # every algorithm whose checkpoint loads as a policy (offrl.policies.RUN_CHECKPOINT_KINDS) and has a Q critic
    # ensemble ('critic'): BC has none
    KINDS = ("iql", "riql", "cql", "td3_bc", "sac", "mopo", "mobile", "ravl", "wsrl")

    def __init__(self, path: str, device: torch.device | str = "cpu"):
        from offrl import checkpoint as ckpt
        from offrl.nets import EnsembleCritic
        from offrl.policies import load_policy

        state = ckpt.load(path, map_location="cpu")
        algo = state.get("algo")
        if algo not in self.KINDS or "objects" not in state:
            raise OffrlError(f"attack critic {path}: not a training checkpoint of {', '.join(self.KINDS)} (found {algo!r})")
        config = json.loads(state["config"])
        agent = state["objects"]["agent"]
        critic_state = agent["critic"]
        weights = [v for k, v in critic_state.items() if k.endswith("weight") and v.dim() == 3]
        # CQL's and WSRL's --shared-critic-output: one output layer for all members, [out, in] (else [E, in, out])
        shared_output = bool(config.get("shared_critic_output", False))
        outputs = [v.shape[0] for k, v in critic_state.items() if k.endswith("weight") and v.dim() == 2] \
            if shared_output else [weights[-1].shape[-1]]
        if outputs[-1:] != [1]:
            raise OffrlError(f"attack critic {path}: needs a scalar Q (HL-Gauss critics are not supported)")
        ensemble, in_dim = weights[0].shape[0], weights[0].shape[1]
        layer_norm = any("net.1.weight" in k and v.dim() == 3 and v.shape[1] == 1 for k, v in critic_state.items())
        act_dim = agent["actor"]["action_scale"].numel()
        self.critic = EnsembleCritic(in_dim - act_dim, act_dim, ensemble, tuple(config["hidden"]), layer_norm=layer_norm,
                                     shared_output=shared_output)
        self.critic.load_state_dict(critic_state)
        self.critic.to(device).eval().requires_grad_(False)
        normalizer = agent.get("normalizer")
        self.mean = self.std = None
        if normalizer is not None and normalizer["mean"].dim() == 1:
            self.mean, self.std = normalizer["mean"].to(device), normalizer["std"].to(device)
        self.policy = load_policy(path, device).actor.requires_grad_(False)
        self.device = torch.device(device)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.mean) / self.std if self.mean is not None else obs

    def q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q(s, a) of every critic, [E, B]."""
        return self.critic(self.normalize(obs), actions)

    def q_of_policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(s', pi(s')) of every critic with pi's deterministic action (the mean / mode), [E, B]."""
        normalized = self.normalize(obs)
        action = self.policy.to_env(torch.tanh(self.policy.distribution(normalized)[0])) if hasattr(self.policy, "distribution") \
            else self.policy(normalized)
        return self.critic(normalized, action)


def adversarial_perturbation(dataset: Dataset, field: str, rows: np.ndarray, scale: float,
                             checkpoint: "str | AttackCritic", rng: np.random.Generator, steps: int = 100,
                             chunk_size: int = 50_000) -> np.ndarray:
    """x + p * std(x) with p in [-scale, scale]^d minimizing the critics' mean Q (RIQL's attack: a fresh
    Adam step, i.e. a sign-gradient step, per iteration, projected back into the box). Runs on the attack
    critic's device (CPU for a path or a critic without one); the starting points are drawn on the CPU."""
    attacker = AttackCritic(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    device = getattr(attacker, "device", torch.device("cpu"))
    clean = getattr(dataset, field)
    std = torch.as_tensor(clean.std(0, dtype=np.float64), dtype=torch.float32).to(device)
    out = np.empty((len(rows), clean.shape[1]), np.float32)
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    for start in range(0, len(rows), chunk_size):
        index = rows[start:start + chunk_size]
        obs = torch.as_tensor(dataset.observations[index], device=device)
        actions = torch.as_tensor(dataset.actions[index], device=device)
        target = torch.as_tensor(clean[index], device=device)
        p = (torch.rand(target.shape, generator=generator).to(device) * 2 - 1) * scale * std
        for _ in range(steps):
            p.requires_grad_(True)
            perturbed = target + p * std
            if field == "observations":
                q = attacker.q(perturbed, actions)
            elif field == "actions":
                q = attacker.q(obs, perturbed)
            else:
                q = attacker.q_of_policy(perturbed)
            (grad,) = torch.autograd.grad(q.mean(), p)
            with torch.no_grad():  # a fresh Adam's first step: m_hat = g, v_hat = g^2
                p = (p - 0.01 * scale * grad / (grad.abs() + 1e-8)).clamp(-scale, scale)
        out[start:start + len(index)] = (target + p * std).cpu().numpy()
    return out


def save(info: Corruption, path: str | Path) -> None:
    np.savez_compressed(path, rows=info.rows, original=info.original, summary=np.array(json.dumps(info.summary())))
