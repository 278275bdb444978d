"""Losses and targets that several algorithms share (IQL, RIQL, CQL, WSRL, ...), each tested
against hand-computed cases in tests/test_value_losses.py."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def expectile_weights(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """|tau - 1(diff < 0)| for diff = target - prediction."""
    return torch.where(diff < 0, 1.0 - expectile, expectile)


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """IQL's L2^tau: mean |tau - 1(u < 0)| u^2 with u = target - prediction."""
    return (expectile_weights(diff, expectile) * diff**2).mean()


def awr_weights(advantage: torch.Tensor, beta: float, max_weight: float = 100.0) -> torch.Tensor:
    """min(exp(beta * A), max_weight), IQL's advantage-weighted regression weights (EXP_ADV_MAX = 100)."""
    return torch.exp(beta * advantage).clamp(max=max_weight)


def subsampled_min(values: torch.Tensor, k: int | None) -> torch.Tensor:
    """The min over dim 0 (the ensemble) of `k` members drawn at random with replacement (REDQ's target, drawn
    as WSRL's `jax.random.randint`, so a draw can repeat a member; REDQ's own code draws without), or over
    every member when k is None. The draw uses torch's global RNG on the values' device: no host sync."""
    if k is None:
        return values.min(dim=0).values
    return values.index_select(0, draw_members(values.shape[0], k, values.device)).min(dim=0).values


def draw_members(ensemble_size: int, k: int, device: torch.device) -> torch.Tensor:
    """The k members, with replacement, that `subsampled_min` and `subsampled_critic_min` take the min over."""
    return torch.randint(ensemble_size, (k,), device=device)


def subsampled_critic_min(critic, obs: torch.Tensor, actions: torch.Tensor, k: int | None) -> torch.Tensor:
    """`subsampled_min(critic(obs, actions), k)` with the same draw from the same RNG state, evaluating only the
    drawn members (`EnsembleCritic(..., members=index)`): k / E of the ensemble's work for a target."""
    if k is None:
        return critic(obs, actions).min(dim=0).values
    return critic(obs, actions, members=draw_members(critic.ensemble_size, k, obs.device)).min(dim=0).values


def huber_loss(diff: torch.Tensor, delta: float) -> torch.Tensor:
    """RIQL's Huber: 0.5 u^2 / delta where |u| < delta, else |u| - 0.5 delta (elementwise).

    RIQL sets delta = 1 / sigma^2: sigma = 0.1 -> delta = 100 (close to a scaled MSE), sigma = 1 ->
    delta = 1, sigma = 3 -> delta = 1/9 (close to L1). Larger sigma means more robust."""
    abs_diff = diff.abs()
    return torch.where(abs_diff < delta, 0.5 * diff**2 / delta, abs_diff - 0.5 * delta)


def ensemble_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile over the ensemble dim 0 (linear interpolation, as torch.quantile / RIQL)."""
    return torch.quantile(values, q, dim=0)


class HLGauss(nn.Module):
    """HL-Gauss classification targets (Imani & White 2018; Farebrother et al. 2024, docs/FACTS.md 15).

    `bins` bins on [v_min, v_max]; a scalar target y becomes the mass of N(y, sigma^2) in each bin,
    renormalized over the support; the loss is cross-entropy against it; the value read out is the
    expectation over bin centers. sigma = sigma_ratio * bin width (0.75 recommended)."""

    def __init__(self, v_min: float, v_max: float, bins: int = 101, sigma_ratio: float = 0.75):
        super().__init__()
        if not v_max > v_min:
            raise ValueError(f"HL-Gauss needs v_max > v_min, got [{v_min}, {v_max}]")
        self.v_min, self.v_max, self.bins = float(v_min), float(v_max), int(bins)
        self.sigma = sigma_ratio * (self.v_max - self.v_min) / bins
        edges = torch.linspace(self.v_min, self.v_max, bins + 1)
        self.register_buffer("edges", edges)
        self.register_buffer("centers", (edges[:-1] + edges[1:]) / 2)

    def target_probs(self, target: torch.Tensor) -> torch.Tensor:
        """[...] scalar targets -> [..., bins] probabilities (sum to 1)."""
        target = target.clamp(self.v_min, self.v_max).unsqueeze(-1)
        cdf = 0.5 * (1.0 + torch.erf((self.edges - target) / (self.sigma * math.sqrt(2.0))))
        mass = cdf[..., 1:] - cdf[..., :-1]
        return mass / (cdf[..., -1:] - cdf[..., :1])

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        return (F.softmax(logits, dim=-1) * self.centers).sum(-1)

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-element cross-entropy [...] against the (constant) HL-Gauss target of `target`."""
        return -(self.target_probs(target.detach()) * F.log_softmax(logits, dim=-1)).sum(-1)
