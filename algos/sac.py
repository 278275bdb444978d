"""Soft Actor-Critic, online (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications").

Trains the behaviour policies of offrl's dataset suite. Maximum-entropy actor-critic:

Critic (twin Q as one 2-member ensemble, MSE each, summed):
    a' ~ pi(.|s'),  y = r + gamma * (1 - d) * (min_i Q_targ_i(s', a') - alpha * log pi(a'|s'))
    L_Q = sum_i mean (Q_i(s, a) - y)^2
Actor (tanh-Gaussian, reparameterized):
    L_pi = mean (alpha * log pi(a~|s) - min_i Q_i(s, a~)),  a~ ~ pi(.|s)
Temperature (automatic entropy tuning, target entropy -|A|):
    L_alpha = -mean log_alpha * (log pi(a~|s) + target_entropy)      (log-probs detached)
then a Polyak update of the critics with tau. One gradient step per env step after
`learning_starts` uniform-random steps; time-limit truncations are bootstrapped.

Defaults follow the SAC paper / Stable-Baselines3 for MuJoCo: 2x256 ReLU, Adam 3e-4 for actor,
critics and alpha, batch 256, buffer 1M, gamma 0.99, tau 0.005, initial alpha 1.0.

Every `actor_every` env steps the actor's weights are written to `<run>/actors/actor_<step>.pt`
(format in `offrl.policies`): the dataset suite rolls out that sequence to rebuild medium-replay.
Resume restores networks, optimizers, replay data and RNG state, and for a MuJoCo env the simulator's
state, the episode in progress and the env's RNGs, so a resumed run ends with the same numbers as
an uninterrupted one (CPU); other envs start a fresh episode seeded with seed + step (`EnvLoop`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import torch

from offrl import policies
from offrl.config import EvalConfig, RunConfig, RunConfigBase
from offrl.data import ReplayBuffer, Spaces
from offrl.errors import CheckpointError
from offrl.run import Run, cli_main
from offrl.sac import SACAgent


@dataclass
class Config(RunConfigBase):
    env_id: str = "Hopper-v5"
    """Gymnasium env to train in."""
    steps: int = 1_000_000
    """Env steps (one gradient step per env step after learning_starts)."""
    learning_starts: int = 5_000
    """Uniform-random env steps before learning starts."""
    batch_size: int = 256
    """Transitions per gradient step."""
    buffer_size: int = 1_000_000
    """Replay capacity."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    alpha_lr: float = 3e-4
    """Adam learning rate of log alpha."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune: bool = True
    """Tune alpha toward the target entropy; otherwise keep init_alpha."""
    target_entropy: float | None = None
    """Target entropy (default -action_dim)."""
    actor_every: int = 10_000
    """Save the actor's weights every this many env steps (0 = never)."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=10_000, episodes=10))
    run: RunConfig = field(default_factory=lambda: RunConfig(checkpoint_every=50_000))


class SAC(SACAgent):
    """The shared soft actor-critic update (`offrl.sac`) with this file's config."""

    def __init__(self, cfg: Config, spaces: Spaces, device: torch.device):
        self.cfg = cfg
        super().__init__(spaces.obs_dim, spaces.act_dim, spaces.action_low, spaces.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, cfg.init_alpha, cfg.autotune, cfg.target_entropy,
                         cfg.gamma, cfg.tau)


Agent = SAC


class EnvLoop:
    """The single training env and its episode bookkeeping, checkpointable. For a MuJoCo env the
    checkpoint holds the simulator's whole integration state (`mj_getState`, warm start included),
    the time-limit counter, the current observation and both RNGs (resets, random actions), so a
    resumed run continues the interrupted episode exactly. Other envs, and checkpoints written
    before offrl kept that state, start a new episode seeded by the step instead."""

    def __init__(self, env_id: str, seed: int):
        self.env = gym.make(env_id)
        self.seed = seed
        self.env.action_space.seed(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return, self.episode_length, self.episodes = 0.0, 0, 0
        self.restored_exactly = False

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
        values = state["physics"].numpy()
        if values.size != mujoco.mj_stateSize(sim.model, spec):
            raise CheckpointError(f"the checkpoint's simulator state has {values.size} numbers, "
                                  f"{self.env.spec.id if self.env.spec else 'this env'} needs {mujoco.mj_stateSize(sim.model, spec)}")
        mujoco.mj_setState(sim.model, sim.data, values, spec)
        mujoco.mj_forward(sim.model, sim.data)
        self.env.set_wrapper_attr("_elapsed_steps", int(state["elapsed_steps"]))
        sim.np_random.bit_generator.state = json.loads(state["reset_rng"])
        self.env.action_space.np_random.bit_generator.state = json.loads(state["action_rng"])
        self.obs = state["obs"].numpy().astype(self.env.observation_space.dtype)
        self.episode_return, self.episode_length = float(state["episode_return"]), int(state["episode_length"])
        self.restored_exactly = True


def eval_metadata(cfg: Config) -> dict:
    """What the evaluator needs to make the env (no reference scores: returns only)."""
    return {"env_id": cfg.env_id, "name": cfg.env_id}


def eval_setup(cfg: Config, device: torch.device) -> tuple[SAC, dict]:
    """For `offrl eval`: an agent of the env's spaces, to load a checkpoint into."""
    env = gym.make(cfg.env_id)
    try:
        spaces = Spaces.of(env)
    finally:
        env.close()
    return SAC(cfg, spaces, device), eval_metadata(cfg)


def train(cfg: Config) -> dict:
    run = Run("sac", cfg)
    loop = EnvLoop(cfg.env_id, cfg.seed)
    spaces = Spaces.of(loop.env)
    agent = SAC(cfg, spaces, run.device)
    buffer = ReplayBuffer(spaces.obs_dim, spaces.act_dim, min(cfg.buffer_size, cfg.steps), run.device, seed=cfg.seed)
    state = {"agent": agent, "buffer": buffer, "loop": loop}
    actors_dir = Path(run.dir) / "actors"
    metadata = eval_metadata(cfg)
    metrics: dict[str, torch.Tensor] = {}
    steps = run.steps(state)
    if run.start_step > 0 and not loop.restored_exactly:
        loop.restart(run.start_step)
    for step in steps:
        if step <= cfg.learning_starts:
            action = loop.env.action_space.sample()
        else:
            obs_t = torch.as_tensor(loop.obs, dtype=torch.float32, device=run.device).unsqueeze(0)
            action = agent.explore(obs_t)[0].cpu().numpy()
        next_obs, reward, terminated, truncated, _ = loop.env.step(action)
        buffer.add(loop.obs[None], action[None], np.array([reward]), next_obs[None], np.array([float(terminated)]))
        loop.obs = next_obs
        loop.episode_return += float(reward)
        loop.episode_length += 1
        if terminated or truncated:
            loop.episodes += 1
            run.log_values(step, {"train/episode_return": loop.episode_return,
                                  "train/episode_length": loop.episode_length, "train/episodes": loop.episodes})
            loop.obs, _ = loop.env.reset()
            loop.episode_return, loop.episode_length = 0.0, 0
        if step > cfg.learning_starts:
            with run.precision():
                metrics = agent.update(buffer.sample(cfg.batch_size))
            run.log(step, metrics)
        run.evaluate(step, agent.act, metadata)
        if cfg.actor_every and step % cfg.actor_every == 0:
            policies.save_actor(actors_dir / f"actor_{step:07d}.pt", agent.actor, env_id=cfg.env_id, step=step,
                                hidden=cfg.hidden, last_eval=run.last_eval)
        run.checkpoint(step, state)
    loop.env.close()
    return run.finish()


if __name__ == "__main__":
    cli_main(Config, train)
