"""The soft actor-critic update that SAC (online), WSRL and the model-based algorithms (MOPO) share.

Critic (an ensemble of `num_critics` Q networks, MSE each, summed):
    a' ~ pi(.|s'),  y = r + gamma * (1 - d) * (min_i Q_targ_i(s', a') - alpha * log pi(a'|s'))
    L_Q = sum_i mean (Q_i(s, a) - y)^2
Actor (tanh-Gaussian, reparameterized):
    L_pi = mean (alpha * log pi(a~|s) - min_i Q_i(s, a~)),  a~ ~ pi(.|s)
Temperature (automatic entropy tuning toward `target_entropy`, default -|A|):
    L_alpha = -mean log_alpha * (log pi(a~|s) + target_entropy)      (log-probs detached)
then a Polyak update of the critics with tau.

On CUDA with `cuda_graph`, each half is replayed as a CUDA graph after 3 eager warm-ups (offrl/graphs.py):
the returned metrics are then the graph's output tensors, overwritten by the next call of the same half.

Options for WSRL (all off by default): `critic_subsample` k takes the target's min over k critics drawn
at random (REDQ), `backup_entropy=False` leaves -alpha log pi out of y, `layer_norm` / `actor_layer_norm`
put LayerNorm in the hidden layers. `critic_step` and `actor_step` are the two halves of `update`, so a
high-UTD loop can take several critic steps per actor step.
"""

from __future__ import annotations

import copy
import math
from typing import Sequence

import numpy as np
import torch

from offrl.checkpoint import Stateful
from offrl.data import Batch
from offrl.graphs import GraphedStep
from offrl.losses import subsampled_critic_min
from offrl.nets import EnsembleCritic, TanhGaussianActor, frozen, soft_update
from offrl.optim import adam


class SACAgent(Stateful):
    STATE = ("actor", "critic", "critic_target", "actor_opt", "critic_opt", "alpha_opt")
    VALUES = ("log_alpha",)

    def __init__(self, obs_dim: int, act_dim: int, action_low: np.ndarray, action_high: np.ndarray,
                 device: torch.device, hidden: Sequence[int] = (256, 256), actor_lr: float = 3e-4,
                 critic_lr: float = 3e-4, alpha_lr: float = 3e-4, init_alpha: float = 1.0, autotune: bool = True,
                 target_entropy: float | None = None, gamma: float = 0.99, tau: float = 0.005, num_critics: int = 2,
                 layer_norm: bool = False, actor_layer_norm: bool = False, critic_subsample: int | None = None,
                 backup_entropy: bool = True, shared_critic_output: bool = False, cuda_graph: bool = False):
        self.gamma, self.tau, self.autotune = gamma, tau, autotune
        self.critic_subsample, self.backup_entropy = critic_subsample, backup_entropy
        self.actor = TanhGaussianActor(obs_dim, act_dim, action_low, action_high, hidden,
                                       layer_norm=actor_layer_norm).to(device)
        self.critic = EnsembleCritic(obs_dim, act_dim, num_critics, hidden, layer_norm=layer_norm,
                                     shared_output=shared_critic_output).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(init_alpha), device=device, requires_grad=autotune)
        self.target_entropy = -float(act_dim) if target_entropy is None else target_entropy
        self.actor_opt = adam([{"params": self.actor.parameters(), "lr": actor_lr}], device)
        self.critic_opt = adam([{"params": self.critic.parameters(), "lr": critic_lr}], device)
        # capturable on CUDA: its step count stays on the device (a non-capturable Adam reads a step count that a
        # resume loaded onto the GPU with .item(), twice a step); the CPU path and its numbers are unchanged
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=alpha_lr, capturable=torch.device(device).type == "cuda")
        self._critic_step = GraphedStep(self.critic_gradient_step, device, cuda_graph, optimizers=(self.critic_opt,))
        self._actor_step = GraphedStep(self.actor_gradient_step, device, cuda_graph,
                                       optimizers=(self.actor_opt, self.alpha_opt))

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {**self.critic_step(batch), **self.actor_step(batch)}

    def critic_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step of the critics, then the Polyak update of their targets (a CUDA graph on CUDA)."""
        return self._critic_step(batch)

    def actor_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step of the actor against the min over all critics, and one of the temperature (a CUDA
        graph on CUDA)."""
        return self._actor_step(batch)

    def critic_gradient_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_log_prob = self.actor(batch.next_observations)
            next_q = subsampled_critic_min(self.critic_target, batch.next_observations, next_actions,
                                           self.critic_subsample)
            if self.backup_entropy:
                next_q = next_q - alpha * next_log_prob
            target = batch.rewards + self.gamma * (1.0 - batch.terminals) * next_q
        q = self.critic(batch.observations, batch.actions)
        critic_loss = ((q - target) ** 2).mean(dim=1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        soft_update(self.critic_target, self.critic, self.tau)
        return {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean()}

    def actor_gradient_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        alpha = self.log_alpha.detach().exp()
        actions, log_prob = self.actor(batch.observations)
        with frozen(self.critic):  # no critic weight gradients, also when the critic is compiled (WSRL)
            q_pi = self.critic(batch.observations, actions).min(dim=0).values
        actor_loss = (alpha * log_prob - q_pi).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=list(self.actor.parameters()))
        self.actor_opt.step()

        metrics = {"actor_loss": actor_loss.detach(), "entropy": -log_prob.detach().mean(), "alpha": alpha}
        if self.autotune:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_opt.step()
            metrics["alpha_loss"] = alpha_loss.detach()
        return metrics

    @torch.no_grad()
    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)[0]

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs)
