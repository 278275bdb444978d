"""Normalized scores: 100 * (return - ref_min) / (ref_max - ref_min).

Reference scores come from the dataset's metadata (the offrl suite and Minari datasets with an
expert policy), or, for D4RL files, from D4RL's table (docs/FACTS.md section 0). The D4RL values were
measured on mujoco-py v2 environments; they are only used for D4RL data (a file named like D4RL's whose own
env id, if it has one, is D4RL's) evaluated on the env below, and say so in `ref_source`: never for the
Gymnasium v5 suite, a file recorded in another env, or under `--data.env-id` of another env (runs then
report returns unless given --data.ref-min-score/--data.ref-max-score).

A D4RL file evaluates by default on the Gymnasium v4 env (GYMNASIUM_ENV_FOR_D4RL), the v2 envs' models and
rewards on the maintained `mujoco` bindings, rather than v5, which changed what D4RL recorded: Walker2d-v5
gives both feet friction 1.9 (v2: right foot 0.9, left 1.9), Hopper-v5 and Walker2d-v5 stop paying the
healthy reward on the falling step, and Ant-v5 observes 105 numbers (non-zero contact forces) where D4RL's
ant files hold 111 (v2's, with contact forces that MuJoCo >= 2.0 left at zero: offrl/D4RLAnt-v4 in
offrl.envs). `--data.env-id` picks another (without D4RL's reference scores).
"""

from __future__ import annotations

import re

import numpy as np

# d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE, shared by every dataset of an env (random/medium/...).
D4RL_REF_SCORES: dict[str, tuple[float, float]] = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}

GYMNASIUM_ENV_FOR_D4RL = {  # see the module docstring; 'module:EnvId' makes gym import offrl.envs, which registers it
    "hopper": "Hopper-v4",
    "halfcheetah": "HalfCheetah-v4",
    "walker2d": "Walker2d-v4",
    "ant": "offrl.envs:offrl/D4RLAnt-v4",
}


def d4rl_env_from_name(name: str) -> str | None:
    """'hopper-medium-v2' -> 'hopper'; None when the name is not a D4RL locomotion dataset: neither a Gymnasium
    env id ('Hopper-v5', a user file's --data.env-id, whose scores are not D4RL's) nor an antmaze file saved
    under its URL name ('Ant_maze_u-maze_...')."""
    match = re.match(r"^(hopper|halfcheetah|walker2d|ant)[-_](?!maze)(?!v\d+$)", name.lower())
    return match.group(1) if match else None


def is_d4rl_env(env_id: str | None, d4rl_env: str | None) -> bool:
    """Whether `env_id` is where offrl evaluates D4RL's `d4rl_env` data (GYMNASIUM_ENV_FOR_D4RL), or D4RL's own
    name for it ('hopper-medium-v2' as a file's env id), so that D4RL's reference scores apply there."""
    if not env_id or d4rl_env not in GYMNASIUM_ENV_FOR_D4RL:
        return False
    mapped = GYMNASIUM_ENV_FOR_D4RL[d4rl_env]
    return env_id in (mapped, mapped.split(":")[-1]) or d4rl_env_from_name(env_id) == d4rl_env


def normalized_score(returns, ref_min: float | None, ref_max: float | None):
    """Elementwise normalized score (0 = reference random, 100 = reference expert); None without refs."""
    if ref_min is None or ref_max is None:
        return None
    if ref_max == ref_min:
        raise ValueError(f"reference scores are equal ({ref_min}); cannot normalize")
    return 100.0 * (np.asarray(returns, dtype=np.float64) - ref_min) / (ref_max - ref_min)
