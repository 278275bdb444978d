"""Termination functions for model rollouts: whether a predicted next observation ends the episode,
as the Gymnasium v5 MuJoCo env itself would decide (`terminated`, not time-limit truncation; the v4 envs
that D4RL files evaluate on, offrl.scores, decide by the same rules).

Each function reads its healthy ranges from the env it is made for (`gym.make(spec).unwrapped`), so a
dataset recorded with non-default env arguments gets matching terminations:

- Hopper-v5:   healthy iff z in (z_min, z_max), angle in (a_min, a_max) and every entry of the state
               vector after x and z within (s_min, s_max) (defaults 0.7 < z, |angle| < 0.2, |s| < 100);
- Walker2d-v5: healthy iff z in (0.8, 2.0) and angle in (-1, 1) (defaults);
- Ant-v5:      healthy iff the state is finite and z in [0.2, 1.0] (defaults);
- InvertedPendulum-v5 (offrl/tiny-v0): ends when the observation is not finite or |angle| > 0.2;
- HalfCheetah-v5 (and any env whose `terminate_when_unhealthy` is False): never terminates;
- offrl/PointMazeStitch-v0 (an env with `never_terminates = True`): never terminates.
`terminated = not healthy`. An env this module does not know gets the "never" function and a
warning naming it, since rollouts would then run through states the real env would end.

Observations carry qpos without x (and y for Ant) followed by qvel, which v5 clips to [-10, 10] in
Hopper and Walker2d; the env's state check uses unclipped velocities, so a velocity beyond 10 (far
inside the +-100 range) decides nothing here. Deviation from OfflineRL-Kit's functions (and MOBILE's
copy of them): those use hard-coded v2 ranges, end HalfCheetah rollouts and Walker2d rollouts at any
|obs| >= 100, which the envs never do, and check Hopper's state range as `np.abs(obs < 100)`, which
tests only the upper bound. RAVL's functions are the env's rules, as here.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

TerminationFn = Callable[[torch.Tensor], torch.Tensor]
"""next observations [..., obs_dim] -> terminated [...] (bool)."""


def never(next_obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(next_obs.shape[:-1], dtype=torch.bool, device=next_obs.device)


def _between(x: torch.Tensor, low: float, high: float, inclusive: bool = False) -> torch.Tensor:
    return (x >= low) & (x <= high) if inclusive else (x > low) & (x < high)


def termination_fn(env_spec) -> TerminationFn:
    """The termination function of an env id or spec (`offrl.evaluation.env_spec_from_metadata`)."""
    from offrl import envs

    env = envs.make(env_spec)
    try:
        base = env.unwrapped
        name = type(base).__name__
        if getattr(base, "never_terminates", False):  # offrl.envs.StitchPointMaze
            return never
        if not getattr(base, "_terminate_when_unhealthy", name != "HalfCheetahEnv"):
            return never
        if name in ("HopperEnv", "Walker2dEnv"):
            offset = 0 if base._exclude_current_positions_from_observation else 1  # obs then starts with x
            z_range, angle_range = base._healthy_z_range, base._healthy_angle_range
            state_range = getattr(base, "_healthy_state_range", None)

            def hopper_or_walker(next_obs: torch.Tensor) -> torch.Tensor:
                z, angle = next_obs[..., offset], next_obs[..., offset + 1]
                healthy = _between(z, *z_range) & _between(angle, *angle_range)
                if state_range is not None:  # Hopper: qpos[2:] and qvel, i.e. the observation after z
                    healthy &= _between(next_obs[..., offset + 1:], *state_range).all(dim=-1)
                return ~healthy
            return hopper_or_walker
        if name == "AntEnv":
            offset = 0 if base._exclude_current_positions_from_observation else 2
            state_dims = base.data.qpos.size - 2 + offset + base.data.qvel.size
            z_range = base._healthy_z_range

            def ant(next_obs: torch.Tensor) -> torch.Tensor:
                healthy = torch.isfinite(next_obs[..., :state_dims]).all(dim=-1)
                healthy &= _between(next_obs[..., offset], *z_range, inclusive=True)
                return ~healthy
            return ant
        if name == "InvertedPendulumEnv":
            def inverted_pendulum(next_obs: torch.Tensor) -> torch.Tensor:
                return ~torch.isfinite(next_obs).all(dim=-1) | (next_obs[..., 1].abs() > 0.2)
            return inverted_pendulum
        if name == "HalfCheetahEnv":
            return never
    finally:
        env.close()
    env_id = env_spec if isinstance(env_spec, str) else env_spec.id
    warnings.warn(f"no termination function for {env_id}: model rollouts of it will never terminate", stacklevel=2)
    return never
