"""The online env loop that SAC and WSRL share: one training env, its episode bookkeeping, and a
checkpointable state that makes a resumed online run continue exactly."""

from __future__ import annotations

import json

import gymnasium as gym
import mujoco
import numpy as np
import torch

from offrl import envs
from offrl.errors import CheckpointError


class EnvLoop:
    """The single training env and its episode bookkeeping, checkpointable. For a MuJoCo env the
    checkpoint holds the simulator's whole integration state (`mj_getState`, warm start included),
    the time-limit counter, the current observation and both RNGs (resets, random actions), so a
    resumed run continues the interrupted episode exactly. Other envs, and checkpoints written
    before offrl kept that state, start a new episode seeded by the step instead."""

    def __init__(self, env: str | gym.Env, seed: int):
        """`env`: an env id, or an env already made (e.g. `offrl.evaluation.make_env(metadata)`, which keeps
        a dataset's recorded spec)."""
        self.env = envs.make(env) if isinstance(env, str) else env
        self.seed = seed
        self.env.action_space.seed(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return, self.episode_length, self.episodes = 0.0, 0, 0
        self.restored_exactly = False

    def step(self, action: np.ndarray, buffer, reward_scale: float = 1.0, reward_bias: float = 0.0) -> dict | None:
        """Take `action`, add the transition to `buffer` (its reward as r * reward_scale + reward_bias, the
        training data's reward transform; terminations stop bootstrapping, time limits do not) and start a
        new episode when this one ends. Returns the finished episode's raw return, length and count, else None."""
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        stored = reward * reward_scale + reward_bias if (reward_scale, reward_bias) != (1.0, 0.0) else reward
        buffer.add(self.obs[None], action[None], np.array([stored]), next_obs[None], np.array([float(terminated)]))
        self.obs = next_obs
        self.episode_return += float(reward)
        self.episode_length += 1
        if not (terminated or truncated):
            return None
        self.episodes += 1
        finished = {"train/episode_return": self.episode_return, "train/episode_length": self.episode_length,
                    "train/episodes": self.episodes}
        self.obs, _ = self.env.reset()
        self.episode_return, self.episode_length = 0.0, 0
        return finished

    def restart(self, step: int) -> None:
        """After a resume without the env's state: the interrupted episode is lost; start a new one seeded by the step."""
        self.env.action_space.seed(self.seed + step)
        self.obs, _ = self.env.reset(seed=self.seed + step)
        self.episode_return, self.episode_length = 0.0, 0

    def _physics(self):
        sim = self.env.unwrapped
        if not (hasattr(sim, "model") and hasattr(sim, "data") and isinstance(getattr(sim, "model"), mujoco.MjModel)):
            return None
        return sim, mujoco.mjtState.mjSTATE_INTEGRATION

    def state_dict(self) -> dict:
        state = {"episodes": self.episodes}
        physics = self._physics()
        if physics is not None:
            sim, spec = physics
            values = np.empty(mujoco.mj_stateSize(sim.model, spec))
            mujoco.mj_getState(sim.model, sim.data, values, spec)
            state |= {"physics": torch.from_numpy(values), "obs": torch.from_numpy(np.array(self.obs, dtype=np.float64)),
                      "episode_return": self.episode_return, "episode_length": self.episode_length,
                      "elapsed_steps": int(self.env.get_wrapper_attr("_elapsed_steps") or 0),
                      # PCG64 states are 128-bit integers: kept as JSON text for weights-only loading
                      "reset_rng": json.dumps(sim.np_random.bit_generator.state),
                      "action_rng": json.dumps(self.env.action_space.np_random.bit_generator.state)}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.episodes = int(state["episodes"])
        physics = self._physics()
        if "physics" not in state or physics is None:
            return
        sim, spec = physics
        values = state["physics"].cpu().numpy()  # map_location puts it on the run's device
        if values.size != mujoco.mj_stateSize(sim.model, spec):
            raise CheckpointError(f"the checkpoint's simulator state has {values.size} numbers, "
                                  f"{self.env.spec.id if self.env.spec else 'this env'} needs {mujoco.mj_stateSize(sim.model, spec)}")
        mujoco.mj_setState(sim.model, sim.data, values, spec)
        mujoco.mj_forward(sim.model, sim.data)
        self.env.set_wrapper_attr("_elapsed_steps", int(state["elapsed_steps"]))
        sim.np_random.bit_generator.state = json.loads(state["reset_rng"])
        self.env.action_space.np_random.bit_generator.state = json.loads(state["action_rng"])
        self.obs = state["obs"].cpu().numpy().astype(self.env.observation_space.dtype)
        self.episode_return, self.episode_length = float(state["episode_return"]), int(state["episode_length"])
        self.restored_exactly = True
