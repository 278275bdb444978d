"""A package-style module that registers an env on import, as gymnasium_robotics does: datasets name
its env as 'offrl_test_envs:OffrlPointMass-v0'."""

import gymnasium as gym
import numpy as np


class PointMass(gym.Env):
    """x' = x + 0.1 v, v' = v + 0.1 a; reward -x^2; 30 steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1, 1, 2)
        return self.state.copy(), {}

    def step(self, action):
        x, v = self.state
        self.state = np.array([x + 0.1 * v, v + 0.1 * float(np.clip(action[0], -1, 1))])
        return self.state.copy(), -float(x * x), False, False, {}


if "OffrlPointMass-v0" not in gym.registry:
    gym.register("OffrlPointMass-v0", entry_point=PointMass, max_episode_steps=30)
