"""IQL: "Offline Reinforcement Learning with Implicit Q-Learning" (Kostrikov, Nair & Levine, ICLR 2022).

Learns V as an upper expectile of Q over dataset actions (never querying out-of-distribution
actions), backs Q up from V, and extracts the policy by advantage-weighted regression. Per step,
in the official code's order:

    V:      L_V  = mean |tau - 1(u < 0)| u^2,  u = min_i Q_targ_i(s, a) - V(s)
    actor:  A    = min_i Q_targ_i(s, a) - V(s)          (V after its update)
            w    = min(exp(beta * A), 100)
            L_pi = -mean w * log pi(a|s)                 (gaussian)  |  mean w * ||pi(s) - a||^2  (deterministic)
    Q:      y    = r + gamma * (1 - d) * V(s')            (V after its update)
            L_Q  = sum_i mean (Q_i(s, a) - y)^2
    target: Polyak update of the Q ensemble with tau.

Defaults are the official locomotion config (docs/FACTS.md section 3): expectile 0.7, beta 3.0,
gamma 0.99, tau 0.005, 2x256 networks, Adam 3e-4 with the actor's lr cosine-decayed to 0 over
training, batch 256, Gaussian actor with tanh mean and state-independent log-std clipped to
[-5, 2] (not tanh-squashed; evaluated at its mean); rewards scaled by 1000 / (max - min episode
return); dataset actions clipped to the bounds shrunk by 1e-5; no state normalization.

`--critic-loss hl-gauss` (Farebrother et al. 2024, docs/FACTS.md section 15) makes Q and V categorical over
`hl_bins` bins on [v_min, v_max] (default: [min(r_min, 0), max(r_max, 0)] / (1 - gamma) of the preprocessed
data, so the support always holds 0), trained with cross-entropy against HL-Gauss targets (sigma =
`hl_sigma_ratio` x bin width) and read out as expectations. V's expectile becomes a weight on its cross-
entropy: |tau - 1(u < 0)| with u = target - E[V] (this weighting is our choice; the paper has no IQL).

Deviations: twin critics are one batched ensemble; actions are scaled to the env's box (the
official code assumes [-1, 1]); PyTorch's default initialization (the official code draws every weight
orthogonal with gain sqrt(2), biases 0; CORL keeps PyTorch's); rewards are scaled on any data (the official
code scales the locomotion tasks only, antmaze gets r - 1), and the return range leaves out an episode cut
by the end of the data (offrl.data.preprocess.return_range_factor; the official code counts every piece
between dones, the cut one included). CORL also uses V before its update for A and
y (not offered here; algos/riql.py does) and normalizes states (--data.normalize-states).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch

from offrl.checkpoint import Stateful
from offrl.compiling import compiled
from offrl.config import DataConfig, TrainConfig
from offrl.data import Batch, TrainingData, load_for_training
from offrl.graphs import GraphedStep
from offrl.losses import HLGauss, awr_weights, expectile_loss, expectile_weights
from offrl.multiseed import SeedAgents
from offrl.nets import DeterministicActor, EnsembleCritic, GaussianActor, ValueNetwork, soft_update
from offrl.optim import adam, constant, cosine_decay
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
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
    num_critics: int = 2
    """Q ensemble size (min over members for targets)."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.005
    """Polyak rate of the target Q ensemble."""
    expectile: float = 0.7
    """Expectile of V's regression (0.5 = mean; 0.7 locomotion, 0.9 AntMaze)."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights (3.0 locomotion, 10.0 AntMaze)."""
    exp_adv_max: float = 100.0
    """Cap on exp(beta * A)."""
    actor: Literal["gaussian", "deterministic"] = "gaussian"
    """Gaussian AWR (official) or deterministic advantage-weighted MSE (CORL's hopper configs)."""
    actor_dropout: float = 0.0
    """Dropout in the actor's hidden layers."""
    cosine_actor_lr: bool = True
    """Cosine-decay the actor's learning rate to 0 over --steps."""
    critic_loss: Literal["mse", "hl-gauss"] = "mse"
    """Regression (official) or HL-Gauss classification for Q and V."""
    hl_bins: int = 101
    """HL-Gauss: number of bins."""
    hl_v_min: Optional[float] = None
    """HL-Gauss: lower end of the value support (default min(min reward, 0) / (1 - gamma))."""
    hl_v_max: Optional[float] = None
    """HL-Gauss: upper end of the value support (default max(max reward, 0) / (1 - gamma))."""
    hl_sigma_ratio: float = 0.75
    """HL-Gauss: sigma as a multiple of the bin width."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_reward=True, clip_actions=True))
    """Preprocessing: rewards scaled by 1000 / (max - min episode return) and dataset actions clipped, as IQL's
    locomotion setting."""

    def option_problems(self) -> list[str]:
        """HL-Gauss's value range, beyond offrl.config.OPTION_RANGES (offrl.run.check_run_options asks)."""
        if self.critic_loss != "hl-gauss":
            return []
        if self.hl_v_min is not None and self.hl_v_max is not None and not self.hl_v_min < self.hl_v_max:
            return [f"--hl-v-min {self.hl_v_min} --hl-v-max {self.hl_v_max}: the low end below the high one"]
        if self.gamma >= 1 and (self.hl_v_min is None or self.hl_v_max is None):
            return [f"--gamma {self.gamma} with --critic-loss hl-gauss: the value range defaults to the rewards' "
                    "over 1 - gamma; give --hl-v-min and --hl-v-max"]
        return []

    @property
    def schedule_spans_steps(self) -> bool:
        """The actor's cosine spans --steps: a resume with other --steps follows the new budget (offrl.run warns)."""
        return self.cosine_actor_lr


class IQL(Stateful):
    STATE = ("actor", "value", "critic", "critic_target", "value_opt", "actor_critic_opt", "actor_schedule", "normalizer")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        obs_dim, act_dim = data.obs_dim, data.act_dim
        self.normalizer = data.preprocessing.state_normalizer(device)
        self.hl = None
        out_dim = 1
        if cfg.critic_loss == "hl-gauss":
            rewards = data.dataset.rewards
            v_min = cfg.hl_v_min if cfg.hl_v_min is not None else min(float(rewards.min()), 0.0) / (1 - cfg.gamma)
            v_max = cfg.hl_v_max if cfg.hl_v_max is not None else max(float(rewards.max()), 0.0) / (1 - cfg.gamma)
            self.hl = HLGauss(v_min, v_max, cfg.hl_bins, cfg.hl_sigma_ratio).to(device)
            out_dim = cfg.hl_bins
        self.critic = EnsembleCritic(obs_dim, act_dim, cfg.num_critics, cfg.hidden, out_dim=out_dim).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = ValueNetwork(obs_dim, cfg.hidden, out_dim=out_dim).to(device)
        if cfg.actor == "gaussian":
            self.actor = GaussianActor(obs_dim, act_dim, data.action_low, data.action_high, cfg.hidden, cfg.actor_dropout)
        else:
            self.actor = DeterministicActor(obs_dim, act_dim, data.action_low, data.action_high, cfg.hidden,
                                            dropout=cfg.actor_dropout)
        self.actor.to(device)
        self.value_opt = adam([{"params": self.value.parameters(), "lr": cfg.value_lr}], device)
        # Adam is per-parameter, so one optimizer over actor and Q groups equals two; the actor's group decays.
        self.actor_critic_opt = adam([{"params": self.actor.parameters(), "lr": cfg.actor_lr},
                                      {"params": self.critic.parameters(), "lr": cfg.critic_lr}], device)
        self.actor_schedule = torch.optim.lr_scheduler.LambdaLR(
            self.actor_critic_opt, [cosine_decay(cfg.steps) if cfg.cosine_actor_lr else constant, constant])
        # --run.compile compiles the loss functions (forward and backward); the optimizer steps stay eager.
        self._value_loss = compiled(self.value_loss, cfg.run.compile)
        self._actor_critic_loss = compiled(self.actor_critic_loss, cfg.run.compile)
        self._gradient_step = GraphedStep(self.gradient_step, device, cfg.run.cuda_graph,
                                          optimizers=(self.value_opt, self.actor_critic_opt))

    # Scalar readouts: the network output itself (mse) or the HL-Gauss expectation.
    def q_values(self, critic: EnsembleCritic, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        out = critic(obs, actions)
        return out if self.hl is None else self.hl.value(out)

    def v_value(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.value(obs)
        return out if self.hl is None else self.hl.value(out)

    def value_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expectile regression of V toward the target critics' min; returns (loss, target_q, V(s))."""
        obs = batch.observations
        with torch.no_grad():
            target_q = self.q_values(self.critic_target, obs, batch.actions).min(dim=0).values
        if self.hl is None:
            v = self.value(obs)
            loss = expectile_loss(target_q - v, self.cfg.expectile)
        else:
            logits = self.value(obs)
            v = self.hl.value(logits)
            weights = expectile_weights(target_q - v.detach(), self.cfg.expectile)
            loss = (weights * self.hl.cross_entropy(logits, target_q)).mean()
        return loss, target_q, v.detach()

    def actor_critic_loss(self, batch: Batch, target_q: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actor and Q, both with the updated V: advantage-weighted regression, and regression onto
        r + gamma * (1 - d) * V(s'). V(s) and V(s') come from one forward pass."""
        obs, actions = batch.observations, batch.actions
        with torch.no_grad():
            v_new, next_v = self.v_value(torch.cat([obs, batch.next_observations])).chunk(2)
            advantage = target_q - v_new
            weights = awr_weights(advantage, self.cfg.beta, self.cfg.exp_adv_max)
            target = batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * next_v
        if self.cfg.actor == "gaussian":
            actor_loss = -(weights * self.actor.log_prob(obs, actions)).mean()
        else:
            actor_loss = (weights * ((self.actor(obs) - actions) ** 2).sum(-1)).mean()
        out = self.critic(obs, actions)
        if self.hl is None:
            q = out
            critic_loss = ((q - target) ** 2).mean(dim=1).sum()
        else:
            q = self.hl.value(out)
            critic_loss = self.hl.cross_entropy(out, target.expand(out.shape[0], -1)).mean(dim=1).sum()
        return actor_loss + critic_loss, {"actor_loss": actor_loss.detach(), "critic_loss": critic_loss.detach(),
                                          "q_mean": q.detach().mean(), "advantage_mean": advantage.mean(),
                                          "weight_mean": weights.mean()}

    def gradient_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The step's device work (a CUDA graph on CUDA, offrl/graphs.py); `update` adds the schedule."""
        value_loss, target_q, v = self._value_loss(batch)
        self.value_opt.zero_grad(set_to_none=True)
        value_loss.backward()
        self.value_opt.step()
        # Actor and Q steps are independent once V has stepped: one backward, one fused Adam step.
        loss, metrics = self._actor_critic_loss(batch, target_q)
        self.actor_critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_critic_opt.step()
        soft_update(self.critic_target, self.critic, self.cfg.tau)
        return {"value_loss": value_loss.detach(), "v_mean": v.mean(), **metrics}

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        metrics = self._gradient_step(batch)
        self.actor_schedule.step()
        return metrics

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(self.normalizer(obs))


Agent = IQL


def train(cfg: Config) -> dict:
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("iql", cfg, data)
    buffer = data.buffer(run.device, seed=cfg.seed)
    agent = IQL(cfg, data, run.device)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        with run.precision():
            metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish()


class IQLSeeds(SeedAgents):
    """The seeds of `--seeds` as one batched IQL (offrl/multiseed.py): `update()` draws each seed's batch
    with that seed's generator and takes every seed's gradient step at once (a CUDA graph on CUDA)."""

    def __init__(self, cfgs: list[Config], data: TrainingData, device: torch.device):
        super().__init__(cfgs, data, device, lambda c: IQL(c, data, device),
                         ("actor", "value", "critic", "critic_target"), ("value_opt", "actor_critic_opt"),
                         ("actor_schedule",))
        self.value_opt = self.batch.batched_optimizers["value_opt"]
        self.actor_critic_opt = self.batch.batched_optimizers["actor_critic_opt"]
        self.actor_schedule = self.batch.batched_schedulers["actor_schedule"]
        self._gradient_step = GraphedStep(self.gradient_step, device, self.cfg.run.cuda_graph,
                                          optimizers=(self.value_opt, self.actor_critic_opt))

    def gradient_step(self, sample: Batch) -> dict[str, torch.Tensor]:
        template, batch = self.agents[0], self.batch
        value_loss, target_q, v = batch.vmap(template.value_loss, sample)
        self.value_opt.zero_grad(set_to_none=True)
        value_loss.sum().backward()  # each seed's weights get their own loss's gradient
        self.value_opt.step()
        loss, metrics = batch.vmap(template.actor_critic_loss, sample, target_q)
        self.actor_critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.actor_critic_opt.step()
        batch.soft_update("critic_target", "critic", self.cfg.tau)
        return {"value_loss": value_loss.detach(), "v_mean": v.mean(dim=-1), **metrics}

    def update(self) -> dict[str, torch.Tensor]:
        metrics = self._gradient_step(self.samplers.sample(self.cfg.batch_size))
        self.actor_schedule.step()
        return metrics


Seeds = IQLSeeds


def train_seeds(cfg: Config) -> list[dict]:
    """`--seeds 0 1 2`: the seeds as one batched model in one process (offrl/multiseed.py), one run folder each."""
    from offrl import multiseed

    return multiseed.train("iql", IQLSeeds, cfg)


if __name__ == "__main__":
    cli_main(Config, train)
