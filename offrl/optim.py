"""Optimizer helpers shared by the algorithms."""

from __future__ import annotations

import math

import torch


def cosine_decay(total_steps: int):
    """lr multiplier 0.5 * (1 + cos(pi * step / total)): CosineAnnealingLR to 0, in closed form, so one
    optimizer can decay one parameter group (the actor) and keep the others constant."""
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


def constant(step: int) -> float:
    return 1.0


def adam(groups: list[dict], device: torch.device) -> torch.optim.Adam:
    """Adam over parameter groups, fused where the device supports it (CPU's default path is slowest)."""
    return torch.optim.Adam(groups, fused=device.type in ("cpu", "cuda"))
