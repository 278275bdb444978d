"""TD3+BC: "A Minimalist Approach to Offline Reinforcement Learning" (Fujimoto & Gu, NeurIPS 2021).

TD3 with a behaviour-cloning term in the actor loss and normalized states.

Critic (twin Q, MSE each, summed):
    a~' = clip(pi_targ(s') + clip(eps, -c, c), low, high),  eps ~ N(0, (sigma * scale)^2), c = 0.5 * scale
    y   = r + gamma * (1 - d) * min_i Q_targ_i(s', a~')
    L_Q = sum_i mean (Q_i(s, a) - y)^2
Actor (every `policy_freq` critic steps):
    lambda = alpha / mean|Q_1(s, pi(s))|            (denominator detached)
    L_pi   = -lambda * mean Q_1(s, pi(s)) + mean (pi(s) - a)^2
then Polyak updates of the actor and both critics with tau.

Defaults are the paper's locomotion settings (docs/FACTS.md section 2): alpha 2.5, gamma 0.99, tau 0.005,
policy noise 0.2, noise clip 0.5, policy freq 2, batch 256, Adam 3e-4, 2x256 networks, states
normalized with std + 1e-3, no reward normalization.

Deviations: the twin critics are one batched ensemble (same maths as two networks); noise scale and
clip use the per-dimension half-range of the action box (the paper's max_action for symmetric boxes);
the actor loss back-propagates into the actor only (the paper computes, then discards, critic grads).
The smoothing noise comes from the agent's own generator (checkpointed), seeded from --seed apart from
the batches' generator (`offrl.checkpoint.stream_seed`; seeded with --seed itself, it drew the very words
that picked the batch rows), so that a seed trained inside a batched `--seeds` run draws the same noise as
its single-seed run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from offrl.checkpoint import SeededGenerator, Stateful
from offrl.compiling import compiled
from offrl.config import DataConfig, TrainConfig
from offrl.data import Batch, TrainingData, load_for_training
from offrl.graphs import GraphedStep
from offrl.multiseed import SeedAgents
from offrl.nets import DeterministicActor, EnsembleCritic, frozen, soft_update
from offrl.optim import adam
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    batch_size: int = 256
    """Transitions per gradient step."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target networks."""
    alpha: float = 2.5
    """BC trade-off: lambda = alpha / mean|Q|."""
    policy_noise: float = 0.2
    """Target policy smoothing noise std, as a fraction of the action half-range."""
    noise_clip: float = 0.5
    """Clip of the smoothing noise, as a fraction of the action half-range."""
    policy_freq: int = 2
    """Actor and target updates every this many critic updates."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_states=True))
    """Preprocessing: states standardized (TD3+BC's normalization, eps 1e-3)."""


def critic_target(batch: Batch, next_q: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = r + gamma * (1 - d) * min_i Q_targ_i(s', a~'); next_q is [E, B]."""
    return batch.rewards + gamma * (1.0 - batch.terminals) * next_q.min(dim=0).values


def actor_loss(q_pi: torch.Tensor, pi: torch.Tensor, data_actions: torch.Tensor, alpha: float):
    """-lambda * mean Q(s, pi(s)) + MSE(pi(s), a) with lambda = alpha / mean|Q| (denominator detached)."""
    lam = alpha / q_pi.abs().mean().detach()
    return -lam * q_pi.mean() + F.mse_loss(pi, data_actions), lam


class TD3BC(Stateful):
    STATE = ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt", "normalizer", "noise")
    # the actor's metrics repeat in the rows of critic-only steps; checkpointed, so a resumed run logs them too
    VALUES = ("updates", "actor_metrics")
    VALUES_ADDED_LATER = ("actor_metrics",)

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        self.normalizer = data.preprocessing.state_normalizer(device)
        self.actor = DeterministicActor(data.obs_dim, data.act_dim, data.action_low, data.action_high, cfg.hidden).to(device)
        self.critic = EnsembleCritic(data.obs_dim, data.act_dim, 2, cfg.hidden).to(device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam([{"params": self.actor.parameters(), "lr": cfg.actor_lr}], device)
        self.critic_opt = adam([{"params": self.critic.parameters(), "lr": cfg.critic_lr}], device)
        # the smoothing noise's own stream (one per seed with --seeds), apart from the batches' (seeded with the seed)
        self.noise = SeededGenerator(device, cfg.seed, stream="td3_bc smoothing noise")
        self.updates = 0
        self.actor_metrics: dict[str, torch.Tensor] = {}
        # --run.compile compiles the loss functions (forward and backward); the optimizer steps stay eager
        self._critic_loss = compiled(self.critic_loss, cfg.run.compile)
        self._actor_objective = compiled(self.actor_objective, cfg.run.compile)
        self._gradient_step = GraphedStep(self.gradient_step, device, cfg.run.cuda_graph,
                                          optimizers=(self.actor_opt, self.critic_opt))

    def smoothing_noise(self, actions: torch.Tensor) -> torch.Tensor:
        """eps ~ N(0, 1) for the target policy's smoothing, from the agent's own generator."""
        return torch.randn(actions.shape, device=actions.device, generator=self.noise.generator)

    def critic_loss(self, batch: Batch, noise: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.no_grad():
            scale = self.actor.action_scale
            noise = (noise * self.cfg.policy_noise).clamp(-self.cfg.noise_clip, self.cfg.noise_clip)
            next_actions = self.actor_target(batch.next_observations) + noise * scale
            next_actions = torch.maximum(torch.minimum(next_actions, self.actor.action_bias + scale), self.actor.action_bias - scale)
            target = critic_target(batch, self.critic_target(batch.next_observations, next_actions), self.cfg.gamma)
        q = self.critic(batch.observations, batch.actions)
        loss = ((q - target) ** 2).mean(dim=1).sum()
        return loss, {"critic_loss": loss.detach(), "q_mean": q.detach().mean()}

    def critic_step(self, batch: Batch, noise: torch.Tensor) -> dict[str, torch.Tensor]:
        loss, metrics = self._critic_loss(batch, noise)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        return metrics

    def actor_objective(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pi = self.actor(batch.observations)
        q_pi = self.critic(batch.observations, pi, members=slice(0, 1))[0]  # Q_1 alone, as TD3
        loss, lam = actor_loss(q_pi, pi, batch.actions, self.cfg.alpha)
        return loss, {"actor_loss": loss.detach(), "lambda": lam.detach()}

    def actor_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        loss, metrics = self._actor_objective(batch)
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward(inputs=list(self.actor.parameters()))
        self.actor_opt.step()
        soft_update(self.actor_target, self.actor, self.cfg.tau)
        soft_update(self.critic_target, self.critic, self.cfg.tau)
        return metrics

    def gradient_step(self, batch: Batch, noise: torch.Tensor, with_actor: bool) -> dict[str, torch.Tensor]:
        """The step's device work: the critic's, and every `policy_freq`-th step the actor's and the targets'
        (two CUDA graphs on CUDA, offrl/graphs.py)."""
        metrics = self.critic_step(batch, noise)
        if not with_actor:
            return metrics
        # the critic frozen around the compiled actor objective, not inside it (a graph break): its backward
        # would otherwise compute Q_1's unused weight gradients
        with frozen(self.critic):
            return {**metrics, **self.actor_step(batch)}

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        self.updates += 1
        with_actor = self.updates % self.cfg.policy_freq == 0
        metrics = self._gradient_step(batch, self.smoothing_noise(batch.actions), with_actor, key=with_actor)
        if with_actor:
            self.actor_metrics = {k: metrics[k] for k in ("actor_loss", "lambda")}
        return {**metrics, **self.actor_metrics}

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self.normalizer(obs))


Agent = TD3BC


def train(cfg: Config) -> dict:
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("td3_bc", cfg, data)
    buffer = data.buffer(run.device, seed=cfg.seed)
    agent = TD3BC(cfg, data, run.device)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        with run.precision():
            metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish()


class TD3BCSeeds(SeedAgents):
    """The seeds of `--seeds` as one batched TD3+BC (offrl/multiseed.py): seed i draws its batches and
    smoothing noise from generators seeded as its single-seed run's; every seed steps at once (CUDA graphs
    on CUDA, one with and one without the delayed actor step)."""

    def __init__(self, cfgs: list[Config], data: TrainingData, device: torch.device):
        super().__init__(cfgs, data, device, lambda c: TD3BC(c, data, device),
                         ("actor", "critic", "actor_target", "critic_target"), ("actor_opt", "critic_opt"),
                         carried=("actor_metrics",))
        self.actor_opt = self.batch.batched_optimizers["actor_opt"]
        self.critic_opt = self.batch.batched_optimizers["critic_opt"]
        self._gradient_step = GraphedStep(self.gradient_step, device, self.cfg.run.cuda_graph,
                                          optimizers=(self.actor_opt, self.critic_opt))

    def gradient_step(self, sample: Batch, noise: torch.Tensor, with_actor: bool) -> dict[str, torch.Tensor]:
        template, batch = self.agents[0], self.batch
        loss, metrics = batch.vmap(template.critic_loss, sample, noise)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # each seed's weights get their own loss's gradient
        self.critic_opt.step()
        if not with_actor:
            return metrics
        loss, actor_metrics = batch.vmap(template.actor_objective, sample)
        self.actor_opt.zero_grad(set_to_none=True)
        loss.sum().backward(inputs=batch.params_of("actor"))
        self.actor_opt.step()
        batch.soft_update("actor_target", "actor", self.cfg.tau)
        batch.soft_update("critic_target", "critic", self.cfg.tau)
        return {**metrics, **actor_metrics}

    def update(self) -> dict[str, torch.Tensor]:
        for agent in self.agents:
            agent.updates += 1
        with_actor = self.agents[0].updates % self.cfg.policy_freq == 0
        sample = self.samplers.sample(self.cfg.batch_size)
        noise = torch.stack([a.smoothing_noise(sample.actions[i]) for i, a in enumerate(self.agents)])
        metrics = self._gradient_step(sample, noise, with_actor, key=with_actor)
        if with_actor:
            self.batch.carried["actor_metrics"] = {k: metrics[k] for k in ("actor_loss", "lambda")}
        return {**metrics, **self.batch.carried["actor_metrics"]}


Seeds = TD3BCSeeds


def train_seeds(cfg: Config) -> list[dict]:
    """`--seeds 0 1 2`: the seeds as one batched model in one process (offrl/multiseed.py), one run folder each."""
    from offrl import multiseed

    return multiseed.train("td3_bc", TD3BCSeeds, cfg)


if __name__ == "__main__":
    cli_main(Config, train)
