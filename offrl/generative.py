"""Generative behaviour policies: p(a | s) learned by behaviour cloning, to sample actions that look like
the data's (MBRCSL rolls them out inside a dynamics model).

`DiffusionPolicy` (MBRCSL's `SimpleDiffusionPolicy`): a DDPM over actions in the unit box, conditioned
on the state. With T diffusion steps and the "squaredcos_cap_v2" schedule

    alpha_bar(u) = cos((u + 0.008) / 1.008 * pi / 2)^2,  beta_t = min(1 - alpha_bar((t+1)/T) / alpha_bar(t/T), 0.999)
    abar_t = prod_{i<=t} (1 - beta_i)
    loss = mean || eps - eps_theta(sqrt(abar_t) a + sqrt(1 - abar_t) eps, t, s) ||^2,  t ~ U{0..T-1}, eps ~ N(0, I)

Sampling is DDPM's ancestral sampler as diffusers' DDPMScheduler runs it (clip_sample=True,
"fixed_small" variance): from a ~ N(0, I), for t = T-1 .. 0, predict a_0 = (a - sqrt(1 - abar_t) eps) /
sqrt(abar_t) clipped to [-1, 1], take the posterior mean of a_{t-1} given a_0 and a_t, and add noise
except at t = 0 (so actions end in the box). The network is the reference's: a sinusoidal time embedding
through an MLP (Mish), concatenated with the state, conditions residual blocks (Linear, LayerNorm, Mish,
FiLM) arranged as a U: down widths, two middle blocks, up widths with skip connections. Sampling uses an
exponential moving average of the weights, decay min((1 + n) / (10 + n), 0.9999) after n updates.

`GaussianMixturePolicy` (a cheaper alternative, not in the MBRCSL reference, whose behaviour-policy ablations
are an MLP and a DT; K components): an MLP gives mixture logits,
means and log-stds per component; loss = -log sum_k pi_k N(a; mu_k, sigma_k^2); sampling picks a
component, then samples it, clipped to the box.

Deviations from the reference, for a CPU: the diffusion network's widths default to an eighth of its
(256, 512, 1024) (a 290k-parameter network; sampling it for 200 rollouts of 200 steps takes about 7 s on one core), and states are normalized by the data's mean and std inside the policy (the
reference feeds raw states and an always-zero extra input). The reference's learning rate 1e-4 with
500 warm-up steps is stepped once per epoch, so its rate stays below 1e-5 for all 50 epochs; here
AdamW runs at the stated rate from the first step.

A policy file (`save` / `load`) holds the weights (the EMA ones for diffusion), the normalizer, the
action box and the constructor's arguments, so a file alone acts: `load(path).sample(obs)`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from offrl import checkpoint as ckpt
from offrl.errors import CheckpointError
from offrl.optim import AdamW

FORMAT = "offrl-behaviour-policy-v2"  # v1: the diffusion network read its condition through a Mish (not the reference's)


@dataclass
class BehaviourConfig:
    """How the generative behaviour policy is built and trained."""

    kind: Literal["diffusion", "gmm"] = "diffusion"
    """A diffusion policy (the paper's) or a Gaussian mixture (a cheaper alternative, not the paper's)."""
    steps: int = 20_000
    """Gradient steps (the reference: 50 epochs of its 199k transitions at batch 256, about 39k)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-6
    """AdamW weight decay."""
    diffusion_steps: int = 10
    """T, denoising steps (the reference: 10 on the point maze, 5 on roboverse)."""
    widths: tuple[int, ...] = (32, 64, 128)
    """Diffusion network: widths of the down path (the up path mirrors it); the reference uses (256, 512, 1024)."""
    time_dim: int = 32
    """Diffusion network: size of the sinusoidal time embedding (the reference: 256)."""
    components: int = 5
    """Gaussian mixture: components."""
    hidden: tuple[int, ...] = (256, 256)
    """Gaussian mixture: hidden layer widths."""


# ------------------------------------------------------------------------------ diffusion schedule
def cosine_betas(steps: int, max_beta: float = 0.999) -> torch.Tensor:
    """diffusers' "squaredcos_cap_v2" schedule (Nichol & Dhariwal 2021), in float64."""
    def alpha_bar(u: float) -> float:
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
    return torch.tensor([min(1 - alpha_bar((t + 1) / steps) / alpha_bar(t / steps), max_beta) for t in range(steps)],
                        dtype=torch.float64)


def mish(x: torch.Tensor) -> torch.Tensor:
    """x tanh(softplus(x)) = x n / (n + 2) with n = e^x (e^x + 2): the same function, about 3x faster than
    torch's CPU kernel (which took half of a sampling step)."""
    e = torch.exp(x.clamp(max=20.0))
    n = e * (e + 2)
    return x * n / (n + 2)


class Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mish(x)


class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        angles = t.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class FiLMBlock(nn.Module):
    """Linear-LayerNorm-Mish, FiLM by the condition (one Linear on the raw condition, as the reference's
    `ConditionalResidualLinearBlock`), Linear-LayerNorm-Mish, plus a residual path."""

    def __init__(self, in_dim: int, out_dim: int, cond_dim: int):
        super().__init__()
        self.first = nn.Sequential(nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim), Mish())
        self.film = nn.Linear(cond_dim, 2 * out_dim)
        self.second = nn.Sequential(nn.Linear(out_dim, out_dim), nn.LayerNorm(out_dim), Mish())
        self.residual = nn.Linear(in_dim, out_dim) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, bias = self.film(cond).chunk(2, dim=-1)
        return self.second(scale * self.first(x) + bias) + self.residual(x)


class NoiseNetwork(nn.Module):
    """eps_theta(a_t, t, s): the reference's ConditionalUnet1D on vectors."""

    def __init__(self, obs_dim: int, act_dim: int, widths: tuple[int, ...], time_dim: int):
        super().__init__()
        self.time = nn.Sequential(SinusoidalEmbedding(time_dim), nn.Linear(time_dim, 4 * time_dim), Mish(),
                                  nn.Linear(4 * time_dim, time_dim))
        cond = time_dim + obs_dim
        dims = [act_dim, *widths]
        self.down = nn.ModuleList(nn.ModuleList([FiLMBlock(a, b, cond), FiLMBlock(b, b, cond)])
                                  for a, b in zip(dims[:-1], dims[1:]))
        self.middle = nn.ModuleList([FiLMBlock(widths[-1], widths[-1], cond), FiLMBlock(widths[-1], widths[-1], cond)])
        ups = list(reversed(widths))
        self.up = nn.ModuleList(nn.ModuleList([FiLMBlock(2 * a, b, cond), FiLMBlock(b, b, cond)])
                                for a, b in zip(ups[:-1], ups[1:]))
        self.out = nn.Sequential(nn.Linear(widths[0], widths[0]), nn.LayerNorm(widths[0]), Mish(),
                                 nn.Linear(widths[0], act_dim))

    def forward(self, noisy_actions: torch.Tensor, t: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """`t`: [n] steps, or [1] for one step shared by every row (its embedding is computed once)."""
        time = self.time(t).expand(obs.shape[0], -1)
        cond = torch.cat([time, obs], dim=-1)
        x, skips = noisy_actions, []
        for first, second in self.down:
            x = second(first(x, cond), cond)
            skips.append(x)
        for block in self.middle:
            x = block(x, cond)
        for first, second in self.up:
            x = second(first(torch.cat([x, skips.pop()], dim=-1), cond), cond)
        return self.out(x)


class BehaviourPolicy(nn.Module):
    """What both kinds share: the state normalizer and the action box (the models work in [-1, 1])."""

    def __init__(self, obs_dim: int, act_dim: int, obs_mean, obs_std, action_low, action_high):
        super().__init__()
        self.obs_dim, self.act_dim = obs_dim, act_dim
        f32 = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float32))  # noqa: E731
        self.register_buffer("obs_mean", f32(obs_mean))
        self.register_buffer("obs_std", f32(obs_std))
        self.register_buffer("action_scale", (f32(action_high) - f32(action_low)) / 2)
        self.register_buffer("action_bias", (f32(action_high) + f32(action_low)) / 2)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        return ((actions - self.action_bias) / self.action_scale).clamp(-1.0, 1.0)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions [n, act_dim] in the env's box for raw states [n, obs_dim]."""
        return self.sample_unit(self.normalize(obs), generator) * self.action_scale + self.action_bias

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # `offrl.evaluation.evaluate` calls the policy
        return self.sample(obs)


class DiffusionPolicy(BehaviourPolicy):
    def __init__(self, obs_dim: int, act_dim: int, obs_mean, obs_std, action_low, action_high, diffusion_steps: int = 10,
                 widths: tuple[int, ...] = (32, 64, 128), time_dim: int = 32):
        super().__init__(obs_dim, act_dim, obs_mean, obs_std, action_low, action_high)
        self.net = NoiseNetwork(obs_dim, act_dim, tuple(widths), time_dim)
        betas = cosine_betas(diffusion_steps)
        alphas_cumprod = torch.cumprod(1 - betas, dim=0)
        self.register_buffer("betas", betas.float())
        self.register_buffer("alphas_cumprod", alphas_cumprod.float())
        self.steps = diffusion_steps

    def loss(self, obs: torch.Tensor, unit_actions: torch.Tensor, generator: torch.Generator | None = None,
             t: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Denoising loss on normalized states and unit-box actions (`t`, `noise`: given, or drawn)."""
        n = obs.shape[0]
        if t is None:
            t = torch.randint(self.steps, (n,), device=obs.device, generator=generator)
        if noise is None:
            noise = torch.randn(unit_actions.shape, device=obs.device, generator=generator)
        abar = self.alphas_cumprod[t].unsqueeze(-1)
        noisy = abar.sqrt() * unit_actions + (1 - abar).sqrt() * noise
        return ((self.net(noisy, t, obs) - noise) ** 2).mean()

    @torch.no_grad()
    def sample_unit(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        n = obs.shape[0]
        x = torch.randn((n, self.act_dim), device=obs.device, generator=generator)
        for t in range(self.steps - 1, -1, -1):
            abar = self.alphas_cumprod[t]
            abar_prev = self.alphas_cumprod[t - 1] if t > 0 else torch.ones_like(abar)
            alpha, beta = abar / abar_prev, 1 - abar / abar_prev
            eps = self.net(x, torch.full((1,), t, device=obs.device, dtype=torch.long), obs)
            x0 = ((x - (1 - abar).sqrt() * eps) / abar.sqrt()).clamp(-1.0, 1.0)
            x = (abar_prev.sqrt() * beta / (1 - abar)) * x0 + (alpha.sqrt() * (1 - abar_prev) / (1 - abar)) * x
            if t > 0:
                variance = ((1 - abar_prev) / (1 - abar) * beta).clamp(min=1e-20)
                x = x + variance.sqrt() * torch.randn(x.shape, device=obs.device, generator=generator)
        return x


class GaussianMixturePolicy(BehaviourPolicy):
    def __init__(self, obs_dim: int, act_dim: int, obs_mean, obs_std, action_low, action_high, components: int = 5,
                 hidden: tuple[int, ...] = (256, 256)):
        super().__init__(obs_dim, act_dim, obs_mean, obs_std, action_low, action_high)
        from offrl.nets import mlp

        self.components = components
        self.net = mlp(obs_dim, components * (1 + 2 * act_dim), tuple(hidden))

    def mixture(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.net(obs)
        k, d = self.components, self.act_dim
        logits = out[:, :k]
        means = out[:, k:k + k * d].reshape(-1, k, d)
        log_stds = out[:, k + k * d:].reshape(-1, k, d).clamp(-5.0, 2.0)
        return torch.log_softmax(logits, dim=-1), means, log_stds

    def loss(self, obs: torch.Tensor, unit_actions: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        log_weights, means, log_stds = self.mixture(obs)
        z = (unit_actions.unsqueeze(1) - means) / log_stds.exp()
        log_prob = (-0.5 * z ** 2 - log_stds - 0.5 * math.log(2 * math.pi)).sum(-1)  # [n, k]
        return -torch.logsumexp(log_weights + log_prob, dim=-1).mean()

    @torch.no_grad()
    def sample_unit(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        log_weights, means, log_stds = self.mixture(obs)
        pick = torch.multinomial(log_weights.exp(), 1, generator=generator).squeeze(-1)
        rows = torch.arange(obs.shape[0], device=obs.device)
        noise = torch.randn(means.shape[0], self.act_dim, device=obs.device, generator=generator)
        return (means[rows, pick] + log_stds[rows, pick].exp() * noise).clamp(-1.0, 1.0)


def build(cfg: BehaviourConfig, obs_dim: int, act_dim: int, obs_mean, obs_std, action_low, action_high) -> BehaviourPolicy:
    if cfg.kind == "diffusion":
        return DiffusionPolicy(obs_dim, act_dim, obs_mean, obs_std, action_low, action_high, cfg.diffusion_steps,
                               cfg.widths, cfg.time_dim)
    return GaussianMixturePolicy(obs_dim, act_dim, obs_mean, obs_std, action_low, action_high, cfg.components, cfg.hidden)


class BehaviourTrainer:
    """AdamW on the behaviour-cloning loss over (raw state, action) tensors on the device, with an EMA copy
    of the weights for the diffusion policy (what it samples with): decay min((1 + n) / (10 + n), 0.9999) after
    update n, from n = 0 (the reference's `ema.py` uses decay 0 at its first step, then this schedule: only the
    first update's averaging differs)."""

    def __init__(self, policy: BehaviourPolicy, cfg: BehaviourConfig, observations: torch.Tensor, actions: torch.Tensor,
                 seed: int = 0):
        import copy

        self.policy, self.cfg = policy, cfg
        self.obs = policy.normalize(observations)
        self.unit_actions = policy.to_unit(actions)
        device = observations.device
        self.optimizer = AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                               fused=device.type in ("cpu", "cuda"))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.ema = copy.deepcopy(policy).requires_grad_(False) if cfg.kind == "diffusion" else None
        self.updates = 0

    def update(self) -> dict[str, torch.Tensor]:
        rows = torch.randint(len(self.obs), (self.cfg.batch_size,), device=self.obs.device, generator=self.generator)
        loss = self.policy.loss(self.obs[rows], self.unit_actions[rows], self.generator)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self.ema is not None:
            decay = min((1 + self.updates) / (10 + self.updates), 0.9999)
            with torch.no_grad():
                torch._foreach_lerp_(list(self.ema.parameters()), list(self.policy.parameters()), 1 - decay)
        self.updates += 1
        return {"behaviour_loss": loss.detach()}

    def sampler(self) -> BehaviourPolicy:
        """The policy to sample with: the EMA weights for diffusion."""
        return self.ema if self.ema is not None else self.policy

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "ema": self.ema.state_dict() if self.ema is not None else {},
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(), "updates": self.updates,
                "format": FORMAT}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != FORMAT:
            raise CheckpointError("a behaviour policy in training saved before its diffusion network's conditioning was "
                                  "brought to the reference's: this version cannot resume it; start the run again")
        self.policy.load_state_dict(state["policy"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.restore_generator(self.generator, state["generator"])
        self.updates = int(state["updates"])


def save(path: str | Path, policy: BehaviourPolicy, cfg: BehaviourConfig, info: dict | None = None) -> Path:
    """Write a self-contained policy file (atomic, checksummed)."""
    return ckpt.save(path, {"format": FORMAT, "config": asdict(cfg), "obs_dim": policy.obs_dim, "act_dim": policy.act_dim,
                            "state": {k: v.detach().cpu() for k, v in policy.state_dict().items()}, "info": info or {}})


def load(path: str | Path, device: torch.device | str = "cpu") -> tuple[BehaviourPolicy, BehaviourConfig, dict]:
    """A policy file written by `save`: (policy on `device` in eval mode, its config, its info)."""
    state = ckpt.load(path)
    if state.get("format") == "offrl-behaviour-policy-v1":
        raise CheckpointError(f"{path}: a behaviour policy made before its diffusion network's conditioning was brought "
                              "to the reference's (format v1): this version computes another network from it; train a "
                              "new one")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an offrl behaviour-policy file (format {state.get('format')!r})")
    raw = dict(state["config"])
    for key in ("widths", "hidden"):
        raw[key] = tuple(raw[key])
    cfg = BehaviourConfig(**raw)
    weights = state["state"]
    policy = build(cfg, int(state["obs_dim"]), int(state["act_dim"]), weights["obs_mean"], weights["obs_std"],
                   np.zeros(int(state["act_dim"])), np.ones(int(state["act_dim"])))
    try:
        policy.load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weights do not fit its own config: {str(exc).splitlines()[0]}") from None
    return policy.to(device).eval(), cfg, state.get("info", {})
