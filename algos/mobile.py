"""MOBILE: "Model-Bellman Inconsistency for Model-based Offline Reinforcement Learning" (Sun et al., ICML 2023).

Like MOPO, SAC learns from dataset transitions mixed with short model rollouts, but the penalty sits in
the critic's target and measures how much the ensemble's members disagree about the Bellman backup:

    u(s, a)  = std over elites i of mean_m min_j Q_targ_j(s'_{i,m}, a'),  s'_{i,m} ~ N(s + mu_i, sigma_i^2),
               a' ~ pi(s'_{i,m}), m = 1..M (M = 10);  u = 0 on the batch's dataset rows
    y        = max(0, r - beta * u(s, a) + gamma (1 - d) min_j Q_targ_j(s', a')),  a' ~ pi(s')   (deterministic backup)
    L_Q      = mean over critics and batch of (Q_j(s, a) - y)^2
    L_pi     = mean (alpha log pi(a~|s) - min_j Q_j(s, a~));   alpha = min(exp(log alpha), 1), tuned to -|A|
               (or fixed at 0.2 where the paper's config turns tuning off)

Defaults (docs/FACTS.md section 10, the official `configs/gym/*.py` and OfflineRL-Kit's `mobile.py`): SAC 2 x 256
with 2 critics, actor lr 1e-4 decayed to 0 by a cosine over the run, critic lr 3e-4, alpha lr 1e-4 from
alpha 1 when tuned (the official `train.py` starts log alpha at 0; its config's alpha 0.2 is the fixed
value where tuning is off, as docs/FACTS.md says), batch 256, gamma 0.99, tau 5e-3, real ratio 0.05, M = 10, rollouts of 50k states every 1000
steps kept for 5 rounds, 3M steps; (h, beta) and the other per-task settings from the official table
(hopper medium-replay: h 5, beta 0.1, alpha fixed at 0.2; the random levels too: h 5, beta 0.5, 5.0 and 2.0
for halfcheetah, hopper and walker2d), also for any other dataset named by the same env and level (the offrl
suite's, Minari's mujoco/hopper/medium-v0: `world_models.config.dataset_setting`). Other data: h 5, beta 1.0,
alpha tuned. The dynamics models train
without an epoch cap (early stopping only) but on walker2d medium (30), as the official configs; OfflineRL-Kit's
`run_mobile.py` caps every task at 30 epochs, so its models can train for fewer epochs than these.

Deviations: the actor's cosine schedule is applied per step in closed form (the official code steps a
CosineAnnealingLR once per 1000-step epoch; the two differ by less than one epoch's decay). The penalty
costs M x elites extra actor and target-critic passes per sample (about 50 x a SAC step's forward work),
measured in `benchmarks.speed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from offrl.data import Batch, TrainingData, load_for_training
from offrl.nets import soft_update
from offrl.optim import cosine_decay
from offrl.run import Run, cli_main
from offrl.sac import SACAgent
from world_models.config import ModelBasedConfig, dataset_setting
from world_models.ensemble import DynamicsEnsemble
from world_models.rollout import ModelData, model_summary, bellman_penalty, benchmark_model_data, check_mixing, real_rows

# (h, beta, tune alpha, real ratio, dynamics max epochs) per (env, level): the official configs (docs/FACTS.md section 10).
SETTINGS = {("halfcheetah", "medium"): (5, 0.5, True, None, None), ("hopper", "medium"): (5, 1.5, False, None, None),
            ("walker2d", "medium"): (5, 0.5, True, None, 30), ("halfcheetah", "medium-replay"): (5, 0.1, True, None, None),
            ("hopper", "medium-replay"): (5, 0.1, False, None, None), ("walker2d", "medium-replay"): (1, 0.5, True, None, None),
            ("halfcheetah", "medium-expert"): (5, 1.0, True, 0.5, None), ("hopper", "medium-expert"): (5, 1.5, True, None, None),
            ("walker2d", "medium-expert"): (1, 1.5, True, None, None),
            ("halfcheetah", "random"): (5, 0.5, True, None, None), ("hopper", "random"): (5, 5.0, True, None, None),
            ("walker2d", "random"): (5, 2.0, True, None, None)}
DEFAULT_SETTING = (5, 1.0, True, None, None)


@dataclass
class Config(ModelBasedConfig):
    penalty_coef: Optional[float] = None
    """beta: weight of the Bellman-inconsistency penalty (default: the dataset's entry, else 1.0)."""
    num_samples: int = 10
    """M: next states sampled per elite for the penalty."""
    tune_alpha: Optional[bool] = None
    """Tune the entropy temperature (default: the dataset's entry, else yes); otherwise keep init_alpha."""
    init_alpha: Optional[float] = None
    """Initial (or fixed) entropy temperature (default: 1.0 when tuned, as the official code starts log alpha
    at 0; 0.2 when fixed, the official configs' alpha)."""
    num_critics: int = 2
    """Q ensemble size."""
    deterministic_backup: bool = True
    """Leave the entropy term out of the TD target (official default)."""
    real_ratio: Optional[float] = None
    """Fraction of each batch drawn from the dataset (default: the dataset's entry, else 0.05)."""

    @property
    def schedule_spans_steps(self) -> bool:
        """The actor's cosine spans --steps: a resume with other --steps follows the new budget (offrl.run warns)."""
        return True


class MOBILE(SACAgent):
    """SAC's networks and optimizers (`offrl.sac`) with MOBILE's update and a cosine actor schedule."""

    STATE = (*SACAgent.STATE, "actor_schedule")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device, model: DynamicsEnsemble | None = None,
                 penalty_coef: float = 1.0, tune_alpha: bool = True, generator: torch.Generator | None = None):
        self.cfg, self.model, self.penalty_coef, self.tune_alpha = cfg, model, penalty_coef, tune_alpha
        self.generator = generator
        init_alpha = cfg.init_alpha if cfg.init_alpha is not None else (1.0 if tune_alpha else 0.2)
        super().__init__(data.obs_dim, data.act_dim, data.action_low, data.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, init_alpha, gamma=cfg.gamma, tau=cfg.tau,
                         num_critics=cfg.num_critics)
        self.actor_schedule = torch.optim.lr_scheduler.LambdaLR(self.actor_opt, cosine_decay(cfg.steps))

    def target_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.critic_target(obs, actions).min(dim=0).values

    def update(self, batch: Batch, n_real: int) -> dict[str, torch.Tensor]:
        """One step on a mixed batch whose first `n_real` rows are dataset transitions."""
        cfg = self.cfg
        alpha = self.log_alpha.detach().exp().clamp(max=1.0)
        with torch.no_grad():
            penalty = bellman_penalty(self.model, batch.observations, batch.actions, lambda s: self.actor(s)[0],
                                      self.target_q, cfg.num_samples, self.generator)
            penalty[:n_real] = 0.0
            next_actions, next_log_prob = self.actor(batch.next_observations)
            next_q = self.target_q(batch.next_observations, next_actions)
            if not cfg.deterministic_backup:
                next_q = next_q - alpha * next_log_prob
            target = (batch.rewards - self.penalty_coef * penalty + cfg.gamma * (1.0 - batch.terminals) * next_q).clamp(min=0.0)
        q = self.critic(batch.observations, batch.actions)
        critic_loss = ((q - target) ** 2).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        actions, log_prob = self.actor(batch.observations)
        actor_loss = (alpha * log_prob - self.critic(batch.observations, actions).min(dim=0).values).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=list(self.actor.parameters()))
        self.actor_opt.step()
        self.actor_schedule.step()
        if self.tune_alpha:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_opt.step()
        soft_update(self.critic_target, self.critic, cfg.tau)
        return {"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach(), "q_mean": q.detach().mean(),
                "penalty_mean": penalty[n_real:].mean(), "alpha": alpha, "entropy": -log_prob.detach().mean()}


Agent = MOBILE


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One gradient step on a mixed batch, as `train` runs it (for benchmarks/speed.py; no model training)."""
    agent = MOBILE(cfg, data, device)
    model_data = benchmark_model_data(data, cfg, cfg.rollout_length or 5, device, agent.explore)
    agent.model, agent.generator = model_data.model, model_data.rng.generator
    real_ratio = cfg.real_ratio if cfg.real_ratio is not None else 0.05
    return lambda: agent.update(model_data.batch(cfg.batch_size, real_ratio), real_rows(cfg.batch_size, real_ratio))


def resolve_config(cfg: Config) -> Config:
    """`cfg` with the dataset's model-epoch cap (SETTINGS) where --model.max-epochs is not given, as the run
    records it (config.json): a sweep compares a finished run's options with this (benchmarks.sweep)."""
    model_epochs = dataset_setting(cfg.dataset, SETTINGS, DEFAULT_SETTING)[4]
    if model_epochs is not None and cfg.model.max_epochs is None:
        cfg.model.max_epochs = model_epochs
    return cfg


def train(cfg: Config) -> dict:
    horizon, penalty_coef, tune_alpha, real_ratio, _ = dataset_setting(cfg.dataset, SETTINGS, DEFAULT_SETTING)
    horizon = cfg.rollout_length or horizon
    penalty_coef = cfg.penalty_coef if cfg.penalty_coef is not None else penalty_coef
    tune_alpha = cfg.tune_alpha if cfg.tune_alpha is not None else tune_alpha
    real_ratio = cfg.real_ratio if cfg.real_ratio is not None else (real_ratio or 0.05)
    check_mixing(cfg.data, cfg.batch_size, real_ratio, "mobile")  # before the data load (an attack can take minutes)
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    ModelData.check_raw(data, "mobile", cfg)
    run = Run("mobile", resolve_config(cfg), data)
    model_data, model_file = ModelData.create(data, cfg, horizon, run)
    agent = MOBILE(cfg, data, run.device, model_data.model, penalty_coef, tune_alpha, model_data.rng.generator)
    state = {"agent": agent, **model_data.objects()}
    n_real = real_rows(cfg.batch_size, real_ratio)
    print(f"mobile: rollout length {horizon}, beta {penalty_coef}, alpha {'tuned' if tune_alpha else 'fixed'}, "
          f"real ratio {real_ratio}, elites {model_data.model.elites}")
    for step in run.steps(state):
        if (step - 1) % cfg.rollout_every == 0:
            model_data.rollout(agent.explore)
        with run.precision():
            metrics = agent.update(model_data.batch(cfg.batch_size, real_ratio), n_real)
        run.log(step, {**metrics, **model_data.last_rollout.metrics})
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish({**model_summary(model_file, model_data.model), "rollout_length": horizon, "penalty_coef": penalty_coef,
                       "tune_alpha": tune_alpha, "real_ratio": real_ratio})


if __name__ == "__main__":
    cli_main(Config, train)
