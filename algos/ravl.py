"""RAVL: "The Edge-of-Reach Problem in Offline Model-Based Reinforcement Learning" (Sims, Lu, Foerster,
Teh, NeurIPS 2024).

Model rollouts are short and start from dataset states, so states at their edge are reached but never
updated from, and their Q-values are never corrected. RAVL keeps MBPO's rollouts and no dynamics
penalty, and trains EDAC on them: an ensemble of N critics whose minimum is pessimistic exactly where
the critics disagree, with EDAC's gradient-diversity term:

    y       = r + gamma (1 - d) (min_j Q_targ_j(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
    L_Q     = sum_i mean (Q_i(s, a) - y)^2 + eta * L_div,
    L_div   = 1/(N - 1) mean_batch sum_{i != j} <g_i, g_j>,  g_i = grad_a Q_i(s, a) / (||grad_a Q_i(s, a)|| + 1e-10)
    L_pi    = mean (alpha log pi(a~|s) - min_i Q_i(s, a~));  L_alpha toward -|A|
each step in the official order: alpha, then actor, then critics (their target uses the updated actor),
then the Polyak update. Batches mix 5% dataset rows with model rows.

Defaults (the official `train_ravl_agent.py` and `agent_training/agent.py`, docs/FACTS.md section 12): N =
10 critics and a tanh-Gaussian actor with 3 hidden layers of 256, EDAC's init (hidden biases 0.1, the
critics' output layer and the actor's heads uniform in +-3e-3 and +-1e-3, the critics' hidden weights in
+-1/sqrt(out) as `offrl.nets.edac_critic_init` explains), Adam 3e-4 for actor, critics and alpha, alpha
starting at 1 (log alpha = 0; the config's alpha 0.1 is used only without tuning), eta 1, rollout length 5
from 50k states per 1000 steps kept for 5 rounds, batch 256, 3M steps. The paper tunes N, eta, h and the
real-data ratio per task; those values are not in the code, so every dataset gets these defaults.

Deviations: the actor's mean and log-std come from one output layer (two in the official code; the same
function class and init range). The dynamics model is `world_models.ensemble`, OfflineRL-Kit's training of
the same MBPO ensemble; the official RAVL code trains it otherwise: a 20% holdout without the cap of 1000,
at least 350 and at most 2000 epochs with the learning rate cut by 0.3 at the first plateau before 350,
separate state and action scalers (statistics over the holdout too; the states' from the first observation
and all next observations) with inputs clipped to +-10, members reshuffled over the bootstrap samples every
epoch, and weights initialized from a normal truncated at 2 std; and it trains on d4rl.qlearning_dataset's
rows, whose s' on a terminal row is the next episode's first state, where this one uses the recorded s'
(OfflineRL-Kit's qlearning_dataset). Batches and rollout starts are drawn with
replacement (the official buffer draws without).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from offrl.data import Batch, TrainingData, load_for_training
from offrl.nets import EnsembleCritic, TanhGaussianActor, edac_critic_init, soft_update
from offrl.run import Run, cli_main
from offrl.sac import SACAgent
from world_models.config import ModelBasedConfig
from world_models.rollout import ModelData, model_summary, benchmark_model_data, check_mixing


@dataclass
class Config(ModelBasedConfig):
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    alpha_lr: float = 3e-4
    """Adam learning rate of log alpha."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden layer widths of actor and critics."""
    num_critics: int = 10
    """N: Q ensemble size."""
    eta: float = 1.0
    """Weight of EDAC's gradient-diversity term."""

    def option_problems(self) -> list[str]:
        """Beyond offrl.config.OPTION_RANGES (offrl.run.check_run_options asks): the diversity term compares
        critics in pairs (one critic gave NaN losses)."""
        return [f"--num-critics {self.num_critics}: at least 2"] if self.num_critics < 2 else []


def diversity_loss(critic: EnsembleCritic, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """EDAC: 1/(N - 1) mean over the batch of sum_{i != j} <g_i, g_j> of the critics' normalized action
    gradients (built with create_graph, so it trains the critics)."""
    n = critic.ensemble_size
    actions = actions.unsqueeze(0).expand(n, -1, -1).clone().requires_grad_(True)
    q = critic(obs.unsqueeze(0).expand(n, -1, -1), actions)
    (grad,) = torch.autograd.grad(q.sum(), actions, create_graph=True)
    grad = grad / (grad.norm(dim=-1, keepdim=True) + 1e-10)  # [N, B, A]
    grad = grad.transpose(0, 1)  # [B, N, A]
    gram = grad @ grad.transpose(1, 2)  # [B, N, N]
    off_diagonal = gram.sum(dim=(1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    return off_diagonal.mean() / (n - 1)


def edac_init(actor: TanhGaussianActor, critic: EnsembleCritic) -> None:
    """EDAC's initialization: the critics' (`offrl.nets.edac_critic_init`); the actor's hidden biases 0.1 and
    its output layer (mean and log-std) uniform in +-1e-3."""
    edac_critic_init(critic)
    actor_layers = [m for m in actor.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for layer in actor_layers[:-1]:
            layer.bias.fill_(0.1)
        actor_layers[-1].weight.uniform_(-1e-3, 1e-3)
        actor_layers[-1].bias.uniform_(-1e-3, 1e-3)


class RAVL(SACAgent):
    """SAC's networks and optimizers (`offrl.sac`) with N critics, EDAC's init and EDAC's update."""

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        super().__init__(data.obs_dim, data.act_dim, data.action_low, data.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, init_alpha=1.0, gamma=cfg.gamma, tau=cfg.tau,
                         num_critics=cfg.num_critics)
        edac_init(self.actor, self.critic)
        self.critic_target.load_state_dict(self.critic.state_dict())

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        with torch.no_grad():
            _, log_prob = self.actor(batch.observations)
        alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        alpha = self.log_alpha.detach().exp()

        actions, log_prob = self.actor(batch.observations)
        q_pi = self.critic(batch.observations, actions)
        actor_loss = (alpha * log_prob - q_pi.min(dim=0).values).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=list(self.actor.parameters()))
        self.actor_opt.step()

        with torch.no_grad():
            next_actions, next_log_prob = self.actor(batch.next_observations)
            next_q = self.critic_target(batch.next_observations, next_actions).min(dim=0).values - alpha * next_log_prob
            target = batch.rewards + cfg.gamma * (1.0 - batch.terminals) * next_q
        q = self.critic(batch.observations, batch.actions)
        td_loss = ((q - target) ** 2).mean(dim=1).sum()
        diversity = diversity_loss(self.critic, batch.observations, batch.actions) if cfg.eta else td_loss.new_zeros(())
        critic_loss = td_loss + cfg.eta * diversity
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        soft_update(self.critic_target, self.critic, cfg.tau)
        return {"critic_loss": critic_loss.detach(), "td_loss": td_loss.detach(), "diversity_loss": diversity.detach(),
                "actor_loss": actor_loss.detach(), "q_policy_std": q_pi.detach().std(dim=0).mean(), "alpha": alpha,
                "entropy": -log_prob.detach().mean()}


Agent = RAVL


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One gradient step on a mixed batch, as `train` runs it (for benchmarks/speed.py; no model training)."""
    agent = RAVL(cfg, data, device)
    model_data = benchmark_model_data(data, cfg, cfg.rollout_length or 5, device, agent.explore)
    return lambda: agent.update(model_data.batch(cfg.batch_size, cfg.real_ratio))


def train(cfg: Config) -> dict:
    check_mixing(cfg.data, cfg.batch_size, cfg.real_ratio, "ravl")  # before the data load (an attack can take minutes)
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    ModelData.check_raw(data, "ravl", cfg)
    horizon = cfg.rollout_length or 5
    run = Run("ravl", cfg, data)
    model_data, model_file = ModelData.create(data, cfg, horizon, run)
    agent = RAVL(cfg, data, run.device)
    state = {"agent": agent, **model_data.objects()}
    print(f"ravl: rollout length {horizon}, {cfg.num_critics} critics, eta {cfg.eta}, elites {model_data.model.elites}")
    for step in run.steps(state):
        if (step - 1) % cfg.rollout_every == 0:
            model_data.rollout(agent.explore)
        with run.precision():
            metrics = agent.update(model_data.batch(cfg.batch_size, cfg.real_ratio))
        run.log(step, {**metrics, **model_data.last_rollout.metrics})
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish({**model_summary(model_file, model_data.model), "rollout_length": horizon})


if __name__ == "__main__":
    cli_main(Config, train)
