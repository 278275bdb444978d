"""CQL: "Conservative Q-Learning for Offline Reinforcement Learning" (Kumar et al., NeurIPS 2020).

SAC whose critics are pushed down on actions the policy (and a uniform proposal) would take and
up on dataset actions. CQL(H) with importance sampling (the official `min_q_version=3`), per
critic i:

    y      = r + gamma * (1 - d) * min_j Q_targ_j(s', a'),  a' ~ pi(.|s')        (deterministic backup:
             no entropy term; `--max-target-backup`: max over N sampled a' of the min over critics)
    L_TD_i = mean (Q_i(s, a) - y)^2        (plain MSE as in every reference code; the paper's 1/2 is in no code)
    X      = { Q_i(s, u_k) - log U(u_k) } U { Q_i(s, a_k) - log pi(a_k|s) } U { Q_i(s, a'_k) - log pi(a'_k|s') },
             k = 1..N,  u_k ~ Uniform(action box),  a_k ~ pi(.|s),  a'_k ~ pi(.|s')   (log-probs detached)
    gap_i  = mean_s [ T * logsumexp(X / T) ] - mean_D Q_i(s, a)
    L_i    = L_TD_i + cql_alpha * gap_i                         (fixed alpha)
           = L_TD_i + alpha' * cql_alpha * (gap_i - target_gap)  (--lagrange; alpha' = clamp(exp(log alpha'), 0, 1e6)
                                                                  trained by ascent: loss -1/2 sum_i alpha' * ...)
Actor (SAC with auto-entropy, target -|A|): mean (alpha_ent * log pi(a~|s) - min_i Q_i(s, a~)); for the first
`bc_steps` steps mean (alpha_ent * log pi(a~|s) - log pi(a_D|s)) (official BC warm start).
Targets: Polyak tau every step.

Cal-QL (`--calql`; Nakamoto et al., NeurIPS 2023, "Cal-QL: Calibrated Offline RL Pre-Training for Efficient
Online Fine-Tuning"): the Q-values of the policy's actions in X are bounded below by the Monte-Carlo
return-to-go of the dataset's trajectory through s,
    Q_i(s, a_k) -> max(Q_i(s, a_k), V_mu(s)),  Q_i(s, a'_k) -> max(Q_i(s, a'_k), V_mu(s)),
    V_mu(s_t) = sum_{t' >= t} gamma^(t' - t) r_t'  (to the end of its episode, after reward preprocessing),
so the penalty stops pushing them below what the behaviour policy earned; the uniform actions are not
bounded (the reference's `calql_bound_random_actions=False`). The bound is applied before the importance
weights are subtracted, as in github.com/nakamotoo/Cal-QL (`conservative_sac.py`) and WSRL's `cql.py`.

Defaults (docs/FACTS.md sections 4 and 17): 3x256 Q and tanh-Gaussian policy, N = 10, T = 1, Q lr 3e-4,
policy lr 1e-4, cql_alpha 5.0, no Lagrange, deterministic backup, batch 256, gamma 0.99, tau 5e-3, raw
(unnormalized) states, as the official README's recommended command and OfflineRL-Kit, neither of which
normalizes states; no BC warm start (`--bc-steps 0`, as CORL and OfflineRL-Kit; the official code's
`policy_eval_start` is 40000). CORL's settings are one flag away: `--cql-alpha 10 --actor-lr 3e-5
--data.normalize-states` (std + 1e-3), and `--data.normalize-reward` on hopper-medium as its YAML; CORL's
critics' orthogonal initialization (gain sqrt(2), 1e-2 on the last layer; its actor keeps PyTorch's hidden
init with a xavier-uniform last layer of gain 1e-2) and its actor's log-std (multiplier 1, offset -1, clipped to
[-20, 2]) have no flag here. Initialization: PyTorch's default, as OfflineRL-Kit; the official code's (rlkit:
hidden weights uniform in +-1/sqrt(out), 1/16 at width 256 where PyTorch's first layer is 3-4x wider on the
MuJoCo tasks, hidden biases 0.1, output layers in +-3e-3 (Q) and +-1e-3 (policy)) is `--reference-init`.
WSRL's locomotion pre-training (docs/FACTS.md section 14, `--use_redq`) is
`--hidden 256 256 --num-critics 10 --critic-subsample 2 --layer-norm --actor-layer-norm --max-target-backup`
(250k steps; a step took ~175 ms at one thread on a 2-core AMD EPYC, float32, eager); algos/wsrl.py fine-tunes its
checkpoint. With `--critic-subsample k` the target's min and the conservative penalty each use k critics drawn
at random every step (with replacement, as WSRL draws them), the penalty of a drawn critic weighted E/k so each
critic's expected weight is cql_alpha; the TD term trains all E. Only the drawn critics are evaluated on the 3N
sampled actions: the reference evaluates all E on them and keeps the drawn k. The loss and gradients are the same
(tests/test_wsrl.py checks them against the all-critics formula) for a quarter of the critic work at 2 of 10
(8.9 instead of 34.0 GFLOP a step; ~175 ms instead of ~690 ms on that EPYC). The logged cql_gap, q_pi and
calql_bound_rate are then the drawn critics' (as the reference logs them).

Deviations: the critics are one batched ensemble and every Q evaluation of a step (dataset,
uniform, pi(s), pi(s') actions) is one forward pass (two with --critic-subsample: all critics on the data, the
drawn ones on the sampled actions); actor and critic losses are both computed with the networks as
they were before the step (as CORL does; rlkit steps the Q optimizer before the actor's backward pass,
which on the PyTorch it pinned let part of the actor's gradient see the updated critics); the uniform
proposal's density uses the env's box, -sum log(high - low), which is log(0.5^|A|) for [-1, 1]. `--max-target-backup` takes
the min over critics and then the max over the sampled next actions, with that action's log-prob for an
entropy backup (young-geng's and CORL's rule); the official code takes the max per critic, then the min, and
never backs up entropy there. `--lagrange` weights alpha' * cql_alpha * (gap - target_gap) (CORL's and
young-geng's form); the official code's alpha' * (cql_alpha * gap - target_gap) is the same at its Lagrange
default cql_alpha 1. Cal-QL: the reference's
return-to-go of a sparse-reward trajectory that never succeeds (AntMaze, Adroit-binary: every row gets
r_neg / (1 - gamma)) needs --calql-sparse-failure r_neg (the reference knows its tasks' r_neg; the
data here does not say it); without it every trajectory's return-to-go is its discounted sum. WSRL's
networks are initialized orthogonally (gain sqrt(2)) with the last hidden layer scaled by 1e-2 (which its
LayerNorm cancels), and its 10 critics share one output layer (algos/wsrl.py says more); offrl's use
PyTorch's default initialization and independent heads. WSRL's temperature is softplus-parameterized and
its entropy estimated from the 10 sampled actions at s'; ours is exp(log alpha) on one sample at s.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from offrl.checkpoint import Stateful
from offrl.compiling import compile_module, compiled
from offrl.config import TrainConfig, refuse_unused_options
from offrl.data import Batch, Dataset, ReplayBuffer, TrainingData, load_for_training
from offrl.graphs import GraphedStep
from offrl.losses import draw_members, subsampled_critic_min
from offrl.nets import EnsembleCritic, TanhGaussianActor, edac_critic_init, frozen, rlkit_layer_init, soft_update
from offrl.optim import adam
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    batch_size: int = 256
    """Transitions per gradient step."""
    actor_lr: float = 1e-4
    """Adam learning rate of the policy (and of the entropy temperature)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the Q ensemble (and of the Lagrange multiplier)."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden layer widths of policy and critics."""
    num_critics: int = 2
    """Q ensemble size (WSRL pre-trains with 10)."""
    layer_norm: bool = False
    """LayerNorm in the critics' hidden layers (WSRL)."""
    actor_layer_norm: bool = False
    """LayerNorm in the policy's hidden layers (WSRL)."""
    shared_critic_output: bool = False
    """The critics share one output layer, as in WSRL's JAX code (its paper describes independent critics)."""
    critic_subsample: int | None = None
    """Take the target's min, and apply the penalty, over this many critics drawn at random each step (REDQ;
    WSRL pre-trains with 2 of 10); default: all critics. Only the drawn critics are evaluated on the sampled
    actions."""
    calql: bool = False
    """Cal-QL: bound the policy actions' Q-values in the penalty below by the dataset's Monte-Carlo return-to-go.
    Only the bound (and --lagrange-init's default): Cal-QL's code also backs up the max over sampled next
    actions (pass --max-target-backup), and on AntMaze tunes the penalty (--lagrange --target-gap 0.8) with
    4x256 critics and rewards scaled by 10, shifted by -5."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 5e-3
    """Polyak rate of the target critics."""
    cql_alpha: float = 5.0
    """Weight of the conservative penalty (official README: 5 or 10; CORL: 10)."""
    n_actions: int = 10
    """Sampled actions per proposal (uniform, pi(s), pi(s')) in the logsumexp."""
    temperature: float = 1.0
    """Temperature T of the logsumexp."""
    lagrange: bool = False
    """Tune the penalty's weight so the gap approaches --target-gap."""
    target_gap: float = 10.0
    """Lagrange threshold tau on the gap."""
    calql_sparse_failure: float | None = None
    """Cal-QL on a sparse-reward task: the reward of a step without success, after the reward transform
    (AntMaze with scale 10 and bias -5: -5; Adroit-binary: -1 x scale + bias). An episode made only of it gets
    the return-to-go r / (1 - gamma) on every row, as Cal-QL's code; default: every episode's discounted sum."""
    lagrange_init: float | None = None
    """Initial log of the Lagrange multiplier (default: 1.0 with --calql, as Cal-QL's and CORL's code; 0.0
    otherwise, as the original CQL's)."""
    max_target_backup: bool = False
    """Back up the max over n_actions sampled next actions (of the min over critics)."""
    deterministic_backup: bool = True
    """Leave the entropy term out of the TD target (official default)."""
    bc_steps: int = 0
    """Policy steps of behaviour cloning (log-likelihood) before the SAC objective (official: 40000)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    target_entropy: float | None = None
    """Target entropy (default -action_dim)."""
    reference_init: bool = False
    """Initialize as the official code (rlkit): hidden weights uniform in +-1/sqrt(out), hidden biases 0.1, the
    critics' output layers uniform in +-3e-3 and the policy's in +-1e-3 (`rlkit_init`); default: PyTorch's, as
    OfflineRL-Kit."""


def mc_returns(dataset: Dataset, gamma: float, sparse_failure: float | None = None) -> np.ndarray:
    """Per row, its episode's discounted return from that row on: G_t = r_t + gamma * G_{t+1}, with G = 0
    after an episode's last row, terminal or cut (Cal-QL's `calc_return_to_go`, finite horizon). With
    `sparse_failure` r_neg (a sparse-reward task's reward for a step without success), an episode whose every
    reward equals r_neg gets r_neg / (1 - gamma) on every row, as Cal-QL's and WSRL's code do: a failure that
    would go on forever, where the finite sum would shrink toward 0 on its last rows."""
    rewards, out = dataset.rewards.astype(np.float64).tolist(), [0.0] * len(dataset)
    # the rewards are float32 (after any scale and bias): compare with r_neg rounded as they were
    failure = None if sparse_failure is None else float(np.float32(sparse_failure))
    for start, end in zip(dataset.episode_starts.tolist(), dataset.episode_ends().tolist()):
        if failure is not None and all(r == failure for r in rewards[start:end]):
            out[start:end] = [failure / (1.0 - gamma)] * (end - start)
            continue
        ret = 0.0
        for i in range(end - 1, start - 1, -1):
            ret = rewards[i] + gamma * ret
            out[i] = ret
    return np.asarray(out, dtype=np.float32)


def rlkit_init(actor: TanhGaussianActor, critic: EnsembleCritic) -> None:
    """The official CQL code's initialization (rlkit's `fanin_init` and `init_w`): the critics' as
    `offrl.nets.edac_critic_init` (hidden weights uniform in +-1/sqrt(out), biases 0.1, output layer in +-3e-3);
    the policy's hidden weights in +-1/sqrt(out) too (rlkit reads fan-in from an nn.Linear weight's first
    dimension, its output width), its hidden biases 0.1 and its output layer (mean and log-std) in +-1e-3."""
    edac_critic_init(critic)
    rlkit_layer_init([m for m in actor.modules() if isinstance(m, nn.Linear)], 1e-3)


def calql_bound(q_policy: torch.Tensor, lower_bound: torch.Tensor) -> torch.Tensor:
    """Cal-QL: max(Q(s, a), V_mu(s)) for policy-action Q-values q_policy [E, B, N] and lower_bound [B]
    (the Monte-Carlo return-to-go of s); the gradient reaches Q only where Q is above the bound."""
    return torch.maximum(q_policy, lower_bound[:, None])


def sample_rows(buffer: ReplayBuffer, batch_size: int,
                values: torch.Tensor | None) -> tuple[Batch, torch.Tensor | None]:
    """`buffer.sample(batch_size)`, the same draw, and the same rows of a per-transition tensor `values`
    (Cal-QL's return-to-go), or None when there is none."""
    if values is None:
        return buffer.sample(batch_size), None
    index = buffer.sample_index(batch_size)
    return buffer.gather(index), values[index]


def cql_gap(q_data: torch.Tensor, q_uniform: torch.Tensor, q_pi: torch.Tensor, q_next_pi: torch.Tensor,
            log_uniform: float, log_pi: torch.Tensor, log_next_pi: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """CQL(H) importance-sampled gap per critic: mean_s T*logsumexp(X/T) - mean_D Q.

    q_data [E, B]; q_uniform, q_pi, q_next_pi [E, B, N]; log_pi, log_next_pi [B, N] (detached);
    log_uniform: the uniform proposal's log-density (a constant). Returns [E]."""
    x = torch.cat([q_uniform - log_uniform, q_pi - log_pi.detach(), q_next_pi - log_next_pi.detach()], dim=-1)
    pushed_down = temperature * torch.logsumexp(x / temperature, dim=-1)
    return pushed_down.mean(dim=1) - q_data.mean(dim=1)


class CQL(Stateful):
    STATE = ("actor", "critic", "critic_target", "actor_opt", "critic_opt", "alpha_opt", "lagrange_opt", "normalizer")
    VALUES = ("log_alpha", "log_lagrange", "updates")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        obs_dim, act_dim = data.obs_dim, data.act_dim
        self.normalizer = data.preprocessing.state_normalizer(device)
        self.actor = TanhGaussianActor(obs_dim, act_dim, data.action_low, data.action_high, cfg.hidden,
                                       layer_norm=cfg.actor_layer_norm).to(device)
        self.critic = EnsembleCritic(obs_dim, act_dim, cfg.num_critics, cfg.hidden, layer_norm=cfg.layer_norm,
                                     shared_output=cfg.shared_critic_output).to(device)
        if cfg.reference_init:
            rlkit_init(self.actor, self.critic)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        lagrange_init = cfg.lagrange_init if cfg.lagrange_init is not None else (1.0 if cfg.calql else 0.0)
        self.log_lagrange = torch.tensor(float(lagrange_init), device=device, requires_grad=True)
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        low = torch.as_tensor(data.action_low, device=device)
        high = torch.as_tensor(data.action_high, device=device)
        self.action_low, self.action_range = low, high - low
        self.log_uniform = -float(torch.log(high - low).sum())
        self.actor_opt = adam([{"params": self.actor.parameters(), "lr": cfg.actor_lr}], device)
        self.critic_opt = adam([{"params": self.critic.parameters(), "lr": cfg.critic_lr}], device)
        self.alpha_opt = adam([{"params": [self.log_alpha], "lr": cfg.actor_lr}], device)
        self.lagrange_opt = adam([{"params": [self.log_lagrange], "lr": cfg.critic_lr}], device)
        self.updates = 0
        self._critic_loss = self.critic_loss
        if cfg.run.compile and device.type == "cpu":
            # On the CPU the critics are compiled, not the loss: their elementwise work (bias, LayerNorm, ReLU
            # and their gradients over CQL's 30 x 256 sampled actions) fuses, where the compiled loss was no
            # faster. One thread of a 2-core Xeon with AMX, WSRL's 10-critic pre-training in bf16: eager 108.7 ms
            # a step, compiled critics 61.9 ms (results/speed-bf16.md); the default 2 x 3x256 critics in fp32
            # hardly gain (123.5 ms eager, 123.4 compiled at one thread, 68.7 and 64.0 at two; results/
            # speed-vs-corl.md), and compiling the loss instead was no faster. Module.compile keeps the state-dict
            # keys.
            compile_module(self.critic)
            compile_module(self.critic_target)
        elif cfg.run.compile:
            self._critic_loss = compiled(self.critic_loss)
        self._gradient_step = GraphedStep(self.gradient_step, device, cfg.run.cuda_graph, optimizers=(
            self.actor_opt, self.critic_opt, self.alpha_opt, self.lagrange_opt))

    def critic_loss(self, batch: Batch,
                    lower_bound: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`lower_bound` [B]: Cal-QL's Monte-Carlo return-to-go of the batch's states (None: CQL)."""
        cfg, B, n = self.cfg, batch.observations.shape[0], self.cfg.n_actions
        k = cfg.critic_subsample
        alpha = self.log_alpha.detach().exp()
        obs_rep = batch.observations.repeat_interleave(n, dim=0)  # [B*N, obs]
        with torch.no_grad():
            if cfg.max_target_backup:
                next_obs_rep = batch.next_observations.repeat_interleave(n, dim=0)
                next_actions, next_log_prob = self.actor(batch.next_observations, repeat=n)
                next_q = subsampled_critic_min(self.critic_target, next_obs_rep, next_actions, k).view(B, n)
                best = next_q.argmax(dim=1, keepdim=True)
                next_q = next_q.gather(1, best).squeeze(1)
                next_log_prob = next_log_prob.view(B, n).gather(1, best).squeeze(1)
            else:
                next_actions, next_log_prob = self.actor(batch.next_observations)
                next_q = subsampled_critic_min(self.critic_target, batch.next_observations, next_actions, k)
            if not cfg.deterministic_backup:
                next_q = next_q - alpha * next_log_prob
            target = batch.rewards + cfg.gamma * (1.0 - batch.terminals) * next_q
            uniform = self.action_low + self.action_range * torch.rand(B * n, self.action_range.numel(), device=obs_rep.device)
            pi_actions, log_pi = self.actor(batch.observations, repeat=n)
            next_pi_actions, log_next_pi = self.actor(batch.next_observations, repeat=n)
        if k is None:  # one ensemble forward for every Q the loss needs: data, uniform, pi(s) and pi(s') actions at s
            all_obs = torch.cat([batch.observations, obs_rep, obs_rep, obs_rep])
            all_actions = torch.cat([batch.actions, uniform, pi_actions, next_pi_actions])
            q_all = self.critic(all_obs, all_actions)
            q_data = q_all[:, :B]
            q_sampled, q_penalized_data = q_all[:, B:], q_data
        else:  # every critic on the data (the TD term trains all E), only the k drawn ones on the sampled actions
            drawn = draw_members(cfg.num_critics, k, obs_rep.device)
            q_data = self.critic(batch.observations, batch.actions)
            q_sampled = self.critic(torch.cat([obs_rep, obs_rep, obs_rep]),
                                    torch.cat([uniform, pi_actions, next_pi_actions]), members=drawn)
            q_penalized_data = q_data.index_select(0, drawn)
        q_uniform, q_pi, q_next_pi = q_sampled.reshape(q_sampled.shape[0], 3, B, n).unbind(dim=1)
        td_loss = ((q_data - target) ** 2).mean(dim=1)
        extra = {"q_pi": q_pi.detach().mean()}
        if lower_bound is not None:
            below = torch.cat([q_pi, q_next_pi], dim=-1).detach() < lower_bound[:, None]
            extra["calql_bound_rate"] = below.float().mean()
            q_pi, q_next_pi = calql_bound(q_pi, lower_bound), calql_bound(q_next_pi, lower_bound)
        gap = cql_gap(q_penalized_data, q_uniform, q_pi, q_next_pi, self.log_uniform, log_pi.view(B, n),
                      log_next_pi.view(B, n), cfg.temperature)  # [E], or [k]: the drawn critics'
        if cfg.lagrange:
            multiplier = self.log_lagrange.exp().clamp(0.0, 1e6)
            penalty = multiplier.detach() * cfg.cql_alpha * (gap - cfg.target_gap)
            lagrange_terms = multiplier * cfg.cql_alpha * (gap.detach() - cfg.target_gap)
        else:
            penalty = cfg.cql_alpha * gap
            lagrange_terms = torch.zeros_like(gap)
        if k is not None:  # the penalty of k critics drawn at random, each weighted E / k
            penalty, lagrange_terms = penalty * (cfg.num_critics / k), lagrange_terms * (cfg.num_critics / k)
        lagrange_loss = -0.5 * lagrange_terms.sum() if cfg.lagrange else torch.zeros((), device=gap.device)
        loss = td_loss.sum() + penalty.sum()
        return loss, {"critic_loss": loss.detach(), "td_loss": td_loss.detach().mean(), "cql_gap": gap.detach().mean(),
                      "q_data": q_data.detach().mean(), **extra, "lagrange_loss": lagrange_loss}

    def actor_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        alpha = self.log_alpha.detach().exp()
        actions, log_prob = self.actor(batch.observations)
        if self.updates < self.cfg.bc_steps:
            objective = self.actor.log_prob(batch.observations, batch.actions)
        else:
            with frozen(self.critic):  # no critic weight gradients, also when the critic is compiled
                objective = self.critic(batch.observations, actions).min(dim=0).values
        loss = (alpha * log_prob - objective).mean()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        return loss, alpha_loss, {"actor_loss": loss.detach(), "alpha": alpha, "entropy": -log_prob.detach().mean()}

    def update(self, batch: Batch, lower_bound: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        cloning = self.updates < self.cfg.bc_steps  # the actor's objective: a variant of the graph each
        metrics = self._gradient_step(batch, lower_bound, key=cloning)
        self.updates += 1
        return metrics

    def gradient_step(self, batch: Batch, lower_bound: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The step's device work (a CUDA graph on CUDA, offrl/graphs.py)."""
        actor_loss, alpha_loss, actor_metrics = self.actor_loss(batch)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=list(self.actor.parameters()))
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        critic_loss, metrics = self._critic_loss(batch, lower_bound)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward(inputs=list(self.critic.parameters()))
        if self.cfg.lagrange:
            self.lagrange_opt.zero_grad(set_to_none=True)
            metrics["lagrange_loss"].backward()
            self.lagrange_opt.step()
            metrics["lagrange_loss"] = metrics["lagrange_loss"].detach()
            metrics["lagrange_multiplier"] = self.log_lagrange.detach().exp()
        self.actor_opt.step()
        self.alpha_opt.step()
        self.critic_opt.step()
        soft_update(self.critic_target, self.critic, self.cfg.tau)
        return {**metrics, **actor_metrics}

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(self.normalizer(obs))


Agent = CQL


def check_config(cfg: Config) -> None:
    """Options that act only under another one, given without it (the run would record them as applied)."""
    default = Config()
    refuse_unused_options([(option, f"acts only with {switch}") for option, switch, given, on in (
        ("--lagrange-init", "--lagrange", cfg.lagrange_init is not None, cfg.lagrange),
        ("--target-gap", "--lagrange", cfg.target_gap != default.target_gap, cfg.lagrange),
        ("--calql-sparse-failure", "--calql", cfg.calql_sparse_failure is not None, cfg.calql)) if given and not on])


def train(cfg: Config) -> dict:
    check_config(cfg)
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("cql", cfg, data)
    buffer = data.buffer(run.device, seed=cfg.seed)
    returns_to_go = torch.as_tensor(mc_returns(data.dataset, cfg.gamma, cfg.calql_sparse_failure), device=run.device) if cfg.calql else None
    agent = CQL(cfg, data, run.device)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        batch, lower_bound = sample_rows(buffer, cfg.batch_size, returns_to_go)
        with run.precision():
            metrics = agent.update(batch, lower_bound)
        run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish()


if __name__ == "__main__":
    cli_main(Config, train)
