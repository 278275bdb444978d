"""Environments offrl defines itself, and `make`, gym.make for the envs offrl evaluates on.

`offrl/D4RLAnt-v4`: the Ant that D4RL's ant-*-v2 files were recorded and scored on. Their 111-number
observations are gym Ant-v2's (qpos without x, y; qvel; 84 contact forces), whose contact forces were
always zero under MuJoCo >= 2.0 (openai/gym#1541, D4RL#143), so that its contact cost was zero too.
This is Gymnasium's Ant-v4 without contact forces (the same model, rewards and healthy range as v2, no
contact cost) with 84 zeros appended to each observation. Gymnasium's Ant-v5 observes 105 numbers
(non-zero contact forces, the world body's left out) and charges a contact cost.

`offrl/PointMazeStitch-v0`: MBRCSL's point-maze stitching task (Zhou et al., ICLR 2024;
docs/FACTS.md section 8), on gymnasium-robotics' PointMaze (`pip install -e ".[maze]"`):

    map (1 = wall)          start S = cell (1, 2), goal G = cell (2, 4), 200 steps, no termination
    1 1 1 1 1 1
    1 . S 1 1 1             observation [x, y, vx, vy] (the goal is not observed: it is fixed)
    1 . M . G 1             action: force in [-1, 1]^2
    1 1 1 1 1 1             reward: exp(-||goal - (x, y)||) every step (PointMaze's dense reward)

Every reset puts the ball and the goal at their cells' centres plus uniform noise of +-0.25 in x and
y (PointMaze's own reset). As in the reference code, the episode never terminates at the goal (the
reference ignores PointMaze's `terminated` and always runs 200 steps): reward keeps coming while
the ball stays near the goal, so a return is "how soon, and how close". A learned model needs no
termination function here and the reward is a function of the next position (its mean over the
goal's unobserved jitter is what a model can learn).
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np

from offrl.errors import OffrlError

STITCH_MAP = [[1, 1, 1, 1, 1, 1],
              [1, 0, 0, 1, 1, 1],
              [1, 0, 0, 0, 0, 1],
              [1, 1, 1, 1, 1, 1]]
STITCH_START = (1, 2)
STITCH_GOAL = (2, 4)
STITCH_HORIZON = 200
STITCH_ENV_ID = "offrl/PointMazeStitch-v0"
D4RL_ANT_ENV_ID = "offrl/D4RLAnt-v4"
D4RL_ANT_CONTACT_DIMS = 84


def _point_maze_class():
    try:
        from gymnasium_robotics.envs.maze.point_maze import PointMazeEnv
    except ImportError as exc:
        raise OffrlError(f"{STITCH_ENV_ID} needs gymnasium-robotics: pip install -e \".[maze]\" ({exc})") from None
    return PointMazeEnv


class StitchPointMaze(gym.Env):
    """PointMaze on the stitching map with a fixed start and goal, flat 4-dim observations and no
    termination (see the module docstring)."""

    metadata = {"render_modes": []}
    never_terminates = True  # read by world_models.termination

    def __init__(self):
        layout = [list(row) for row in STITCH_MAP]
        layout[STITCH_START[0]][STITCH_START[1]] = "r"
        layout[STITCH_GOAL[0]][STITCH_GOAL[1]] = "g"
        self.maze_env = _point_maze_class()(maze_map=layout, reward_type="dense", continuing_task=True,
                                            reset_target=False)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float64)
        self.action_space = self.maze_env.action_space

    @property
    def maze(self):
        return self.maze_env.maze

    @property
    def goal(self) -> np.ndarray:
        return self.maze_env.goal

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        obs, info = self.maze_env.reset(seed=seed)
        return obs["observation"], info

    def step(self, action):
        obs, reward, _, _, info = self.maze_env.step(np.asarray(action, dtype=np.float64))
        return obs["observation"], float(reward), False, False, info

    def close(self):
        self.maze_env.close()


class _ZeroContactForces(gym.ObservationWrapper):
    """Appends D4RL_ANT_CONTACT_DIMS zeros to each observation (see the module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        pad = np.full(D4RL_ANT_CONTACT_DIMS, np.inf, dtype=low.dtype)  # unbounded, as v2 declared them
        self.observation_space = gym.spaces.Box(np.concatenate([low, -pad]), np.concatenate([high, pad]),
                                                dtype=env.observation_space.dtype)

    def observation(self, observation):
        return np.concatenate([observation, np.zeros(D4RL_ANT_CONTACT_DIMS, dtype=observation.dtype)])


def d4rl_ant(**kwargs) -> gym.Env:
    from gymnasium.envs.mujoco.ant_v4 import AntEnv

    return _ZeroContactForces(AntEnv(use_contact_forces=False, **kwargs))


def make(spec, **kwargs) -> gym.Env:
    """gym.make, without Gymnasium's "out of date" warning for the v4 MuJoCo envs that D4RL files evaluate
    on by design (offrl.scores.GYMNASIUM_ENV_FOR_D4RL)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*The environment \S+-v4 is out of date")
        return gym.make(spec, **kwargs)


def register() -> None:
    if STITCH_ENV_ID not in gym.registry:
        gym.register(STITCH_ENV_ID, entry_point="offrl.envs:StitchPointMaze", max_episode_steps=STITCH_HORIZON)
    if D4RL_ANT_ENV_ID not in gym.registry:
        gym.register(D4RL_ANT_ENV_ID, entry_point="offrl.envs:d4rl_ant", max_episode_steps=1000)


register()
