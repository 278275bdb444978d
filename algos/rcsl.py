"""RCSL: return-conditioned supervised learning with an MLP (RvS-R, Emmons et al. ICLR 2022; the
RCSL policy of MBRCSL, Zhou et al. ICLR 2024).

pi(a | s, omega) is trained by supervised learning on dataset actions, conditioned on how much
return is still to come:

    omega_t = R_t / rtg_scale                     (--conditioning rtg: undiscounted return-to-go, MBRCSL)
    omega_t = R_t / (H - t)                       (--conditioning average: RvS-R; H = the longest episode)
    L = mean (f(s, omega) - a)^2                  (--head deterministic; mean over action dimensions)
    L = -mean log N(a; f_mu(s, omega), sigma(s, omega)^2)   (--head gaussian, evaluated at its mean)

Actions are in the unit box; the outputs are unbounded, as both references' (MBRCSL's MLP and RvS's Gaussian
mean have linear outputs), and clipped to the box when acting. A `holdout_ratio` of the transitions is held
out; every `holdout_every` steps the hold-out loss is measured, the best weights are kept when it improves
by more than 1% (relative) and training stops after `patience` checks without improvement (MBRCSL's rule).
At evaluation omega starts from a target return and, for RCSL, the return received so far is subtracted step
by step; RvS-R keeps its goal omega = target / H fixed for the episode, as RvS does (`--average-goal
updated` recomputes it each step; H is the data's longest episode, in training as in RvS, where RvS's
evaluation divides by the env's time limit: the same when some episode of the data runs to the limit);
`--eval-targets` sweeps several targets and reports the score of each.
With no hold-out (`--holdout-ratio 0`, or too few transitions for one row) there is no early stopping and
the last weights are the policy, as in MBRCSL's trainer.

Defaults: RvS-R's 2x1024 ReLU MLP and Adam 1e-3 (batch 256 instead of RvS's 16384, sized for CPUs), states
normalized, rtg_scale 1000, and MBRCSL's conditioning and loss (`--conditioning rtg --head deterministic`;
MBRCSL feeds raw states and raw returns-to-go, RvS raw states: the normalization and the scale are this
module's, so the network's inputs lie near unit scale on any env; `--data.no-normalize-states --rtg-scale 1`
gives the references' raw inputs);
RvS-R itself is `--conditioning average --head gaussian` (its loss is the Gaussian's negative
log-likelihood). Deviations: PyTorch's default initialization (MBRCSL draws its last layer with
xavier_uniform, gain 1e-2, bias 0; RvS, on Stable-Baselines3's policy, draws orthogonal weights, gain sqrt(2)
on hidden layers and 0.01 on the action layer, with its log-std starting at 0); the Gaussian head's log-std
depends on the input (RvS's is one parameter per action dimension); the best hold-out weights are kept also when training runs to --steps
without stopping early (MBRCSL's trainer then keeps the last); early stopping applies from the first check,
where MBRCSL's maze runs start it at epoch 80 (algos/mbrcsl.py too checks from the start) and its other runs, and RvS
(no validation split, 2000 epochs at batch 16384), train their whole budget. The default target is the
dataset's best episode return (MBRCSL conditions on the best return of its data).

`train_policy(dataset, cfg, ...)` trains on any Dataset and returns an `RCSLPolicy` (algos/mbrcsl.py drives
`RCSL` and `run_step` itself on its model rollouts).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import torch
from torch import nn

from offrl import checkpoint as ckpt
from offrl.config import DataConfig, EvalConfig, TrainConfig
from offrl.data import Dataset, TrainingData, load_for_training
from offrl.data.preprocess import (StateNormalizer, refuse_reward_transform, refuse_unread_corruption,
                                    refuse_weighted_sampling)
from offrl.data.sequences import episode_timesteps, returns_to_go
from offrl.errors import CheckpointError, OffrlError
from offrl.eval_run import target_policies
from offrl.nets import autocast, mlp, seeded_cpu_init
from offrl.optim import Adam, AdamW
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    steps: int = 200_000
    """Most gradient steps (early stopping usually ends sooner)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    hidden: tuple[int, ...] = (1024, 1024)
    """Hidden layer widths."""
    lr: float = 1e-3
    """Adam learning rate."""
    weight_decay: float = 0.0
    """Weight decay (MBRCSL's point maze: 0.1 with lr 5e-5)."""
    decoupled_weight_decay: bool = True
    """AdamW's decoupled decay (w <- w - lr * weight_decay * w beside the Adam step); --no-decoupled-weight-decay
    adds weight_decay * w to the gradient before Adam normalizes it, as torch.optim.Adam(weight_decay=...) and
    MBRCSL's reference do (a far stronger pull toward 0 at a small learning rate)."""
    conditioning: Literal["rtg", "average"] = "rtg"
    """Condition on the return-to-go (RCSL) or the average reward-to-go (RvS-R)."""
    average_goal: Literal["fixed", "updated"] = "fixed"
    """RvS-R at evaluation: the goal target/H fixed for the whole episode, as RvS does, or recomputed every step
    as (target - return received) / (H - t)."""
    head: Literal["deterministic", "gaussian"] = "deterministic"
    """MSE to the dataset action, or Gaussian negative log-likelihood."""
    rtg_scale: float = 1000.0
    """Returns-to-go are divided by this (rtg conditioning only)."""
    holdout_ratio: float = 0.1
    """Fraction of transitions held out for early stopping."""
    holdout_every: int = 2000
    """Measure the hold-out loss every this many steps."""
    patience: int = 5
    """Stop after this many hold-out checks without a > 1% improvement."""
    eval_targets: Optional[tuple[float, ...]] = None
    """Target returns to condition on at evaluation (default: the dataset's best episode return)."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=0, episodes=10))
    """Evaluation only at the end, of the kept (best hold-out) weights."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_states=True, d4rl_trajectories=True))
    """Preprocessing: states standardized (this module's; see above); D4RL .hdf5 files read as recorded episodes."""


class RCSLPolicy(nn.Module):
    """The conditioned MLP plus everything needed to act: state normalization, conditioning, action box."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: Config, horizon: int, normalizer: StateNormalizer,
                 action_low, action_high):
        super().__init__()
        out = 2 * act_dim if cfg.head == "gaussian" else act_dim
        self.net = mlp(obs_dim + 1, out, cfg.hidden)
        self.head, self.conditioning, self.rtg_scale, self.horizon = cfg.head, cfg.conditioning, cfg.rtg_scale, horizon
        self.fixed_goal = cfg.conditioning == "average" and cfg.average_goal == "fixed"
        self.normalizer = normalizer
        low, high = (torch.as_tensor(np.asarray(x, np.float32)) for x in (action_low, action_high))
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def condition(self, return_to_go: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        if self.conditioning == "rtg":
            return return_to_go / self.rtg_scale
        return return_to_go / (self.horizon - timestep).clamp(min=1)

    def distribution(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The unit-box action (unbounded, as both references' linear outputs; `act` clips it) and, for the
        Gaussian head, its log-std."""
        out = self.net(inputs)
        if self.head == "deterministic":
            return out, None
        mean, log_std = out.chunk(2, dim=-1)
        return mean, log_std.clamp(-5.0, 2.0)

    def loss(self, inputs: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.distribution(inputs)
        if log_std is None:
            return ((mean - unit_actions) ** 2).mean()
        return (0.5 * ((unit_actions - mean) / log_std.exp()) ** 2 + log_std).sum(-1).mean()

    @torch.no_grad()
    def act(self, obs: torch.Tensor, return_to_go: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([self.normalizer(obs), self.condition(return_to_go, timestep).unsqueeze(-1)], -1)
        return self.distribution(inputs)[0].clamp(-1.0, 1.0) * self.action_scale + self.action_bias

    def actor(self, target_return: float) -> "ConditionedActor":
        return ConditionedActor(self, target_return)


class ConditionedActor:
    """Evaluation-time RCSL: the return still to come starts at the target and loses each reward. RvS-R's
    goal stays target / H for the whole episode (unless --average-goal updated)."""

    def __init__(self, policy: RCSLPolicy, target_return: float):
        self.policy, self.target = policy, float(target_return)

    def reset(self, n: int) -> None:
        device = self.policy.action_scale.device
        self.return_to_go = torch.full((n,), self.target, device=device)
        self.timestep = torch.zeros(n, device=device)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.act(obs, self.return_to_go, self.timestep)

    def observe(self, rewards: torch.Tensor) -> None:
        if self.policy.fixed_goal:  # condition(target, t = 0) = target / H at every step
            return
        self.return_to_go = self.return_to_go - rewards
        self.timestep = self.timestep + 1


def check_patience(patience: int, option: str = "--patience") -> None:
    """Refused before the data loads and a run folder is made (MBRCSL: before its rollouts): 0 would stop before
    the first hold-out check, with an untrained network."""
    if patience < 1:
        raise OffrlError(f"{option} {patience}: must be at least 1 (hold-out checks without improvement)")


def warn_eval_every(every: int, algo: str) -> None:
    """RCSL and MBRCSL evaluate once, at the end: a sweep's shared --eval.every (e.g. benchmarks/grid.sh's fast
    class) is recorded in their config.json but not used, which the run's log says."""
    if every:
        import sys

        print(f"warning: {algo} evaluates once, at the end (the policy of its best hold-out loss): --eval.every "
              f"{every} is not used", file=sys.stderr)


class RCSL:
    """Training state: the policy, its optimizer, the train/hold-out split and early stopping."""

    def __init__(self, cfg: Config, dataset: Dataset, normalizer: StateNormalizer, action_low, action_high,
                 device: torch.device, seed: int = 0):
        check_patience(cfg.patience)
        self.cfg = cfg
        horizon = int(dataset.episode_lengths().max())
        self.policy = RCSLPolicy(dataset.obs_dim, dataset.act_dim, cfg, horizon, normalizer, action_low, action_high).to(device)
        rtg = torch.as_tensor(returns_to_go(dataset), device=device)
        timestep = torch.as_tensor(episode_timesteps(dataset), dtype=torch.float32, device=device)
        obs = torch.as_tensor(dataset.observations, device=device)  # already normalized by the data pipeline
        self.inputs = torch.cat([obs, self.policy.condition(rtg, timestep).unsqueeze(-1)], dim=1)
        self.targets = (torch.as_tensor(dataset.actions, device=device) - self.policy.action_bias) / self.policy.action_scale
        order = np.random.default_rng(seed).permutation(len(dataset))
        n_holdout = int(round(cfg.holdout_ratio * len(dataset)))
        self.holdout = torch.as_tensor(order[:n_holdout], device=device)
        self.train_rows = torch.as_tensor(order[n_holdout:], device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        optimizer = AdamW if cfg.decoupled_weight_decay else Adam
        self.optimizer = optimizer(self.policy.net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                   fused=torch.device(device).type in ("cpu", "cuda"))
        self.best_loss, self.best_state, self.checks_without_improvement = float("inf"), None, 0

    def update(self, batch_size: int) -> dict[str, torch.Tensor]:
        pick = torch.randint(len(self.train_rows), (batch_size,), device=self.train_rows.device, generator=self.generator)
        rows = self.train_rows[pick]
        loss = self.policy.loss(self.inputs[rows], self.targets[rows])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach()}

    @torch.no_grad()
    def holdout_loss(self, chunk: int = 65536) -> float:
        if len(self.holdout) == 0:
            return float("nan")
        total = 0.0
        for start in range(0, len(self.holdout), chunk):
            rows = self.holdout[start:start + chunk]
            total += float(self.policy.loss(self.inputs[rows], self.targets[rows])) * len(rows)
        return total / len(self.holdout)

    def check(self) -> bool:
        """Measure the hold-out loss, keep the best weights; return True when training should stop. Without
        a hold-out nothing is kept (the last weights stay the policy) and training never stops early."""
        loss = self.holdout_loss()
        self.last_holdout = loss
        if len(self.holdout) == 0:
            return False
        improved = loss < self.best_loss - 0.01 * abs(self.best_loss) or self.best_state is None
        if improved:
            self.best_loss, self.checks_without_improvement = loss, 0
            self.best_state = copy.deepcopy(self.policy.net.state_dict())
        else:
            self.checks_without_improvement += 1
        return self.stopped

    @property
    def stopped(self) -> bool:
        """Early stopping has ended training (also true of a checkpoint written at that check)."""
        return len(self.holdout) > 0 and self.checks_without_improvement >= self.cfg.patience

    @property
    def best_holdout_loss(self) -> float | None:
        """The best hold-out loss so far; None without a hold-out."""
        return self.best_loss if len(self.holdout) else None

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.policy.net.load_state_dict(self.best_state)

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "best_loss": self.best_loss,
                "best_state": self.best_state or {}, "checks_without_improvement": self.checks_without_improvement,
                "head": "linear"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("head") != "linear":
            raise CheckpointError("an RCSL policy saved before its action head lost its tanh: this version computes "
                                  "another policy from its weights, so it cannot resume or evaluate it; train it again")
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.restore_generator(self.generator, state["generator"])
        self.best_loss, self.best_state = float(state["best_loss"]), state["best_state"] or None
        self.checks_without_improvement = int(state["checks_without_improvement"])


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One training step as `train` runs it (for benchmarks/speed.py)."""
    agent = RCSL(cfg, data.dataset, data.preprocessing.state_normalizer(device), data.action_low, data.action_high, device)
    return lambda: agent.update(cfg.batch_size)


def run_step(run: Run, agent: RCSL, step: int, rcsl_step: int, state: dict) -> bool:
    """One gradient step inside a run: log, the hold-out check every `holdout_every` RCSL steps (with a
    checkpoint), else the periodic checkpoint. Returns True when early stopping says to stop."""
    with run.precision():
        metrics = agent.update(agent.cfg.batch_size)
    run.log(step, metrics)
    if rcsl_step % agent.cfg.holdout_every == 0:
        stop = agent.check()
        if agent.best_holdout_loss is not None:
            run.log_values(step, {"holdout_loss": agent.last_holdout, "best_holdout_loss": agent.best_holdout_loss})
        run.checkpoint(step, state, force=True)
        return stop
    run.checkpoint(step, state)
    return False


def train_policy(dataset: Dataset, cfg: Config, device: torch.device | str = "cpu", seed: int = 0,
                 normalizer: StateNormalizer | None = None, action_low=None, action_high=None) -> RCSLPolicy:
    """Train an RCSL policy on any dataset (e.g. model rollouts) with hold-out early stopping; returns
    the best policy (the last one when nothing is held out). `dataset` observations must already be normalized by `normalizer` (if any).
    `cfg.run.precision` applies to the gradient steps as in `train`. `seed` fixes everything random:
    the network's initialization (drawn from a forked RNG, so the caller's global RNG is left as it
    was), the hold-out split and the batches; one seed gives one policy."""
    device = torch.device(device)
    normalizer = normalizer or StateNormalizer(None, None, device)
    low = action_low if action_low is not None else dataset.actions.min(0)
    high = action_high if action_high is not None else dataset.actions.max(0)
    with seeded_cpu_init(seed):
        agent = RCSL(cfg, dataset, normalizer, low, high, device, seed)
    for step in range(1, cfg.steps + 1):
        with autocast(device, cfg.run.precision):
            agent.update(cfg.batch_size)
        if step % cfg.holdout_every == 0 and agent.check():
            break
    agent.restore_best()
    return agent.policy


def eval_setup(cfg: Config, device: torch.device) -> tuple[RCSL, dict]:
    """For `offrl eval`: the agent as `train` builds it; pins the default target (the data's best return)."""
    data: TrainingData = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed, check_options=False)
    if not cfg.eval_targets:
        cfg.eval_targets = (float(data.dataset.episode_returns().max()),)
    return RCSL(cfg, data.dataset, data.preprocessing.state_normalizer(device), data.action_low, data.action_high,
                device, cfg.seed), data.metadata


def eval_policies(cfg: Config, agent: RCSL, metadata: dict, targets=None) -> dict[str, ConditionedActor]:
    """The best hold-out weights, conditioned on each target (`targets`, else --eval-targets); the
    first target's score is the run's."""
    agent.restore_best()
    return target_policies(targets or cfg.eval_targets, agent.policy.actor)


def train(cfg: Config) -> dict:
    check_patience(cfg.patience)
    refuse_reward_transform(cfg.data, "rcsl")
    refuse_weighted_sampling(cfg.data, "rcsl", "uniformly drawn rows of its training split")
    refuse_unread_corruption(cfg.data, "rcsl", {"observations", "actions", "rewards"})
    warn_eval_every(cfg.eval.every, "rcsl")
    data: TrainingData = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("rcsl", cfg, data)
    agent = RCSL(cfg, data.dataset, data.preprocessing.state_normalizer(run.device), data.action_low,
                 data.action_high, run.device, cfg.seed)
    targets = list(cfg.eval_targets) if cfg.eval_targets else [float(data.dataset.episode_returns().max())]
    state = {"agent": agent}
    step = run.start_step
    for step in run.steps(state):
        if agent.stopped:  # the checkpoint resumed was written at the early stop: nothing more to train
            step -= 1
            break
        if run_step(run, agent, step, step, state):
            break
    per_target = {}
    for name, policy in eval_policies(cfg, agent, data.metadata, targets).items():
        summary = run.evaluate(step, policy, data.metadata, force=True, prefix=None if name == "eval" else name)
        per_target[f"{policy.target:g}"] = summary.get(f"{name}/normalized_score")
    for target, score in per_target.items():
        print(f"target return {target}: normalized score {score:.1f}" if score is not None else f"target {target}: -")
    return run.finish({"stopped_at_step": step, "best_holdout_loss": agent.best_holdout_loss,
                       "score_per_target": per_target})


if __name__ == "__main__":
    cli_main(Config, train)
