"""RIQL: "Towards Robust Offline Reinforcement Learning under Diverse Data Corruption"
(Yang et al., ICLR 2024).

IQL made robust to corrupted data with three changes (docs/FACTS.md section 5):
1. a K-critic ensemble whose alpha-quantile (not min) is V's target: a few corrupted members
   cannot drag it down or up;
2. a Huber loss for Q, so corrupted targets pull with bounded force;
3. observations normalized with statistics over observations and next observations together.

    target_q = quantile_alpha { Q_targ_k(s, a) }_k                 (linear interpolation)
    V:      L_V  = mean |tau - 1(u < 0)| u^2,  u = target_q - V(s)
    actor:  w    = min(exp(beta * (target_q - V(s))), 100)
            L_pi = mean w * ||pi(s) - a||^2                        (deterministic, default)  |  -mean w * log pi(a|s)
    Q:      y    = clamp(r + gamma * (1 - d) * V(s'), -100, 1000)
            L_Q  = sum_k mean huber_delta(Q_k(s, a) - y),  delta = 1 / sigma^2
    target: Polyak update of the Q ensemble with tau.

The Huber threshold is parameterized as RIQL does, by sigma with delta = 1 / sigma^2:
huber_delta(u) = u^2 / (2 delta) for |u| < delta, else |u| - delta / 2. A LARGER sigma means a
SMALLER delta and a more robust (L1-like) loss: sigma 0.1 -> delta 100 (about MSE), sigma 1 ->
delta 1, sigma 3 -> delta 1/9.

Defaults follow RIQL's code (built on CORL's IQL): K = 5, quantile 0.25, sigma 1.0, expectile 0.7,
beta 3.0, 2x256 networks, Adam 3e-4 (actor cosine-decayed), batch 256, gamma 0.99, tau 0.005,
deterministic actor, no reward normalization, 3M steps evaluated every 10k. Per-dataset sigma,
quantile and K from the paper's config are in docs/FACTS.md. As in CORL/RIQL, the advantage and the Q
target use V before its update (official IQL uses it after).
RIQL initializes its critics as EDAC does, and so do we (`offrl.nets.edac_critic_init`: hidden biases 0.1,
last layer U(+-3e-3), hidden weights U(+-1/sqrt(out)), the first layer's included).
Rewards stay raw by default, as in RIQL's code (offrl's IQL scales them by 1000 / return range, as the
official IQL; CORL's IQL only in its hopper medium and medium-replay configs). On clean
data at short budgets this matters: beta 3 on advantages in raw reward units (hopper: about 3 a step) puts
the mean AWR weight at about 7-22 on the suite's hopper datasets, where IQL's scaled rewards give it 1.2-1.7
on medium and medium-expert, so the actor regresses onto few transitions. At the grid's 100k steps,
`--data.normalize-reward` brings the mean weight to about 1 on hopper medium and medium-expert and lifts
RIQL there toward IQL, but not on medium-replay, where the weights stay at 9-19 as IQL's do (13-14)
(results/riql-reward-scale/, benchmarks/riql_reward_scale.sh). The paper's 3M steps were not run here.
Deviations: the actor's cosine schedule spans --steps (the reference's spans 3M steps whatever the run's
length, so a shortened run decays its actor's learning rate fully here and hardly at all there); the
Gaussian actor (`--actor gaussian`, not the default) has a tanh on its mean, the reference's none; L_Q
sums the K critics' losses where RIQL's code averages over them: each critic's gradient is K times the
reference's, which Adam's normalization cancels (up to its eps), the critics' parameters being their own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal

import torch

from offrl.checkpoint import Stateful
from offrl.compiling import compiled
from offrl.config import DataConfig, EvalConfig, TrainConfig
from offrl.data import Batch, TrainingData, load_for_training
from offrl.losses import awr_weights, ensemble_quantile, expectile_loss, huber_loss
from offrl.nets import DeterministicActor, EnsembleCritic, GaussianActor, ValueNetwork, edac_critic_init, soft_update
from offrl.optim import adam, constant, cosine_decay
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    steps: int = 3_000_000
    """Gradient steps (RIQL: 3000 epochs x 1000)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor (cosine-decayed to 0 with --cosine-actor-lr)."""
    value_lr: float = 3e-4
    """Adam learning rate of V."""
    critic_lr: float = 3e-4
    """Adam learning rate of the Q ensemble."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor, V and Q."""
    num_critics: int = 5
    """Q ensemble size K (5; 3 for some datasets in the paper)."""
    quantile: float = 0.25
    """alpha: V's target is this quantile of the K target critics (0.1-0.5 in the paper)."""
    sigma: float = 1.0
    """Huber scale: delta = 1 / sigma^2 (0.1 ~ MSE ... 3.0 ~ L1)."""
    target_clip: tuple[float, float] = (-100.0, 1000.0)
    """Clamp of the Q target."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target Q ensemble."""
    expectile: float = 0.7
    """Expectile of V's regression."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights."""
    exp_adv_max: float = 100.0
    """Cap on exp(beta * A)."""
    actor: Literal["deterministic", "gaussian"] = "deterministic"
    """Deterministic advantage-weighted MSE (RIQL default) or Gaussian AWR."""
    cosine_actor_lr: bool = True
    """Cosine-decay the actor's learning rate to 0 over --steps."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=10_000))
    """Evaluation every 10k steps (RIQL's eval frequency)."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_states=True, state_stats_with_next=True))
    """Preprocessing: states standardized with statistics over observations and next observations (RIQL's);
    raw rewards."""

    @property
    def schedule_spans_steps(self) -> bool:
        """The actor's cosine spans --steps: a resume with other --steps follows the new budget (offrl.run warns)."""
        return self.cosine_actor_lr


class RIQL(Stateful):
    STATE = ("actor", "value", "critic", "critic_target", "optimizer", "schedule", "normalizer")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        obs_dim, act_dim = data.obs_dim, data.act_dim
        self.normalizer = data.preprocessing.state_normalizer(device)
        self.critic = EnsembleCritic(obs_dim, act_dim, cfg.num_critics, cfg.hidden)
        edac_critic_init(self.critic)
        self.critic.to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = ValueNetwork(obs_dim, cfg.hidden).to(device)
        if cfg.actor == "gaussian":
            self.actor = GaussianActor(obs_dim, act_dim, data.action_low, data.action_high, cfg.hidden)
        else:
            self.actor = DeterministicActor(obs_dim, act_dim, data.action_low, data.action_high, cfg.hidden)
        self.actor.to(device)
        # V, actor and Q all use V before this step (as CORL/RIQL), so the three losses share one backward
        # and one fused Adam step (per-parameter, so equal to three optimizers); the actor's group decays.
        self.optimizer = adam([{"params": self.value.parameters(), "lr": cfg.value_lr},
                               {"params": self.actor.parameters(), "lr": cfg.actor_lr},
                               {"params": self.critic.parameters(), "lr": cfg.critic_lr}], device)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [constant, cosine_decay(cfg.steps) if cfg.cosine_actor_lr else constant, constant])
        self.huber_delta = 1.0 / cfg.sigma**2
        self._update = compiled(self._update_impl, cfg.run.compile)

    def _update_impl(self, batch: Batch) -> dict[str, torch.Tensor]:
        obs, actions = batch.observations, batch.actions
        with torch.no_grad():
            target_q = ensemble_quantile(self.critic_target(obs, actions), self.cfg.quantile)
            next_v = self.value(batch.next_observations)

        # V: expectile regression toward the ensemble quantile.
        v = self.value(obs)
        value_loss = expectile_loss(target_q - v, self.cfg.expectile)

        # Actor: advantage-weighted regression (V before its update, as CORL/RIQL).
        advantage = target_q - v.detach()
        weights = awr_weights(advantage, self.cfg.beta, self.cfg.exp_adv_max)
        if self.cfg.actor == "gaussian":
            actor_loss = -(weights * self.actor.log_prob(obs, actions)).mean()
        else:
            actor_loss = (weights * ((self.actor(obs) - actions) ** 2).sum(-1)).mean()

        # Q: Huber regression onto the clamped r + gamma * (1 - d) * V(s').
        target = (batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * next_v).clamp(*self.cfg.target_clip)
        q = self.critic(obs, actions)
        critic_loss = huber_loss(q - target, self.huber_delta).mean(dim=1).sum()

        self.optimizer.zero_grad(set_to_none=True)
        (value_loss + actor_loss + critic_loss).backward()
        self.optimizer.step()
        self.schedule.step()
        soft_update(self.critic_target, self.critic, self.cfg.tau)
        return {"value_loss": value_loss.detach(), "actor_loss": actor_loss.detach(),
                "critic_loss": critic_loss.detach(), "v_mean": v.detach().mean(), "q_mean": q.detach().mean(),
                "q_std": q.detach().std(dim=0).mean(), "advantage_mean": advantage.mean(), "weight_mean": weights.mean()}

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self._update(batch)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(self.normalizer(obs))


Agent = RIQL


def train(cfg: Config) -> dict:
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("riql", cfg, data)
    buffer = data.buffer(run.device, seed=cfg.seed)
    agent = RIQL(cfg, data, run.device)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        with run.precision():
            metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish()


if __name__ == "__main__":
    cli_main(Config, train)
