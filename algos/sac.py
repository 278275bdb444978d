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
critics and alpha, batch 256, buffer 1M, gamma 0.99, tau 0.005, initial alpha 1.0; learning_starts 5000
is cleanrl's (SB3: 100). Where the references differ: cleanrl runs critic and alpha at 1e-3 and its actor
twice every second step; log-std is clamped to [-5, 2] (cleanrl squashes it into that range smoothly,
SB3 and SpinningUp clamp at -20); log pi is that of the env's action (with -sum log(action scale), as
cleanrl; SB3's is in the unit box), so the target entropy -|A| is in env units: the same for the suite's
[-1, 1] boxes, another target on other boxes. The temperature loss multiplies log alpha itself and reuses
the actor step's log-probs (SB3, softlearning, OfflineRL-Kit); cleanrl multiplies alpha, so its gradient is
alpha times this one, and samples fresh log-probs after the actor step.

Every `actor_every` env steps the actor's weights are written to `<run>/actors/actor_<step>.pt`
(format in `offrl.policies`): the dataset suite rolls out that sequence to rebuild medium-replay.
Resume restores networks, optimizers, replay data and RNG state, and for a MuJoCo env the simulator's
state, the episode in progress and the env's RNGs, so a resumed run ends with the same numbers as
an uninterrupted one (CPU); other envs start a fresh episode seeded with seed + step (`offrl.online.EnvLoop`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import torch

from offrl import policies
from offrl.config import EvalConfig, RunConfig, RunConfigBase
from offrl.data import ReplayBuffer, Spaces
from offrl.online import EnvLoop
from offrl.run import Run, cli_main
from offrl.sac import SACAgent

STEP_UNIT = "env steps"  # --steps counts env steps (what benchmarks.table and benchmarks.plots say)


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
    """Evaluation every 10k env steps."""
    run: RunConfig = field(default_factory=lambda: RunConfig(checkpoint_every=50_000))
    """Checkpoints (with the replay buffer) every 50k env steps."""


class SAC(SACAgent):
    """The shared soft actor-critic update (`offrl.sac`) with this file's config."""

    def __init__(self, cfg: Config, spaces: Spaces, device: torch.device):
        self.cfg = cfg
        super().__init__(spaces.obs_dim, spaces.act_dim, spaces.action_low, spaces.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, cfg.init_alpha, cfg.autotune, cfg.target_entropy,
                         cfg.gamma, cfg.tau, cuda_graph=cfg.run.cuda_graph)


Agent = SAC


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
        finished = loop.step(action, buffer)
        if finished is not None:
            run.log_values(step, finished)
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
