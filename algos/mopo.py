"""MOPO: "Model-based Offline Policy Optimization" (Yu et al., NeurIPS 2020).

SAC trained on a mix of dataset transitions and short rollouts of a learned dynamics ensemble, whose
rewards are lowered by the model's uncertainty:

    r~(s, a) = r^(s, a) - lambda * max_i ||sigma_i(s, a)||_2      (every member's predicted std of [s' - s, r])
    every `rollout_every` steps: `rollout_batch` dataset states, h steps of the current policy in the model
        (a random elite per row, sampled next state and reward, rows stop at terminals), into a model
        buffer keeping the last `retain_epochs` rounds
    batch = `real_ratio` dataset rows + model rows;  SAC (auto-entropy) on it:
    y = r + gamma (1 - d) (min_j Q_targ_j(s', a') - alpha log pi(a'|s')),  L_Q = sum_j mean (Q_j - y)^2
    L_pi = mean (alpha log pi(a~|s) - min_j Q_j(s, a~))

The dynamics model is `world_models.ensemble` (7 members, 5 elites, 4 x 200; docs/FACTS.md section 13),
trained on the raw dataset and cached by dataset checksum and config (`--model-path` to pass one).
Terminations come from `world_models.termination` (the Gymnasium v5 env's own rule).

Defaults (docs/FACTS.md section 9, OfflineRL-Kit's `run_mopo.py`): SAC 2 x 256, actor lr 1e-4, critic lr
3e-4, alpha lr 1e-4 from alpha 1 with target entropy -|A|, batch 256, gamma 0.99, tau 5e-3, real
ratio 0.05, rollouts of 50k states every 1000 steps kept for 5 rounds, 3M steps. (h, lambda) per
dataset from OfflineRL-Kit's v2 table (hopper medium-replay: 5, 2.5), and for the random level, which that
table lacks, the official configs' (halfcheetah 5, 0.5; hopper 5, 1.0; walker2d 1, 1.0); also used for any
other dataset named by the same env and level (the offrl suite's, Minari's mujoco/hopper/medium-v0, D4RL
-v0/-v1: `world_models.config.dataset_setting`); on any other data h = 5, lambda = 1.0 unless given. The
official code trains 1M steps (its per-env epoch table is never read, see docs/FACTS.md section 9),
OfflineRL-Kit and this one 3M.

Deviations: the official code is TensorFlow (MBPO-based); this follows OfflineRL-Kit's PyTorch port
for losses and defaults, except two additions of that port that the official code does not have: a
cosine decay of the actor's learning rate over 3000 epochs and alpha clamped to at most 1 (both left
out here, as in the official code). The official code's target entropy is -3, OfflineRL-Kit's and
this one's -|A| (the same on Hopper). The penalty takes the max over all members, as both do. Checkpoints hold the model buffer, so a
resumed run continues exactly (they are correspondingly large: 50k x 5 x 5 rows by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from offrl.data import TrainingData, load_for_training
from offrl.run import Run, cli_main
from offrl.sac import SACAgent
from world_models.config import ModelBasedConfig, dataset_setting
from world_models.rollout import ModelData, model_summary, aleatoric_penalty, benchmark_model_data, check_mixing

# (rollout length h, penalty lambda) per (env, level): OfflineRL-Kit's suggestions for D4RL v2 (docs/FACTS.md section 9).
SETTINGS = {("halfcheetah", "medium"): (5, 0.5), ("hopper", "medium"): (5, 5.0), ("walker2d", "medium"): (5, 0.5),
            ("halfcheetah", "medium-replay"): (5, 0.5), ("hopper", "medium-replay"): (5, 2.5),
            ("walker2d", "medium-replay"): (1, 2.5), ("halfcheetah", "medium-expert"): (5, 2.5),
            ("hopper", "medium-expert"): (5, 5.0), ("walker2d", "medium-expert"): (1, 2.5),
            # OfflineRL-Kit gives none for the random level: the official configs' (D4RL v0)
            ("halfcheetah", "random"): (5, 0.5), ("hopper", "random"): (5, 1.0), ("walker2d", "random"): (1, 1.0)}
DEFAULT_SETTING = (5, 1.0)


@dataclass
class Config(ModelBasedConfig):
    penalty_coef: Optional[float] = None
    """lambda: weight of the uncertainty penalty (default: the dataset's entry, else 1.0)."""


class MOPO(SACAgent):
    """SAC (`offrl.sac`) with MOPO's learning rates, alpha starting at 1 and tuned toward -|A|."""

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        super().__init__(data.obs_dim, data.act_dim, data.action_low, data.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, init_alpha=1.0, autotune=True, gamma=cfg.gamma,
                         tau=cfg.tau, cuda_graph=cfg.run.cuda_graph)


Agent = MOPO


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One gradient step on a mixed batch, as `train` runs it (for benchmarks/speed.py; no model training)."""
    agent = MOPO(cfg, data, device)
    model_data = benchmark_model_data(data, cfg, cfg.rollout_length or 5, device, agent.explore)
    return lambda: agent.update(model_data.batch(cfg.batch_size, cfg.real_ratio))


def train(cfg: Config) -> dict:
    check_mixing(cfg.data, cfg.batch_size, cfg.real_ratio, "mopo")  # before the data load (an attack can take minutes)
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    ModelData.check_raw(data, "mopo", cfg)
    horizon, penalty_coef = dataset_setting(cfg.dataset, SETTINGS, DEFAULT_SETTING)
    horizon = cfg.rollout_length or horizon
    penalty_coef = cfg.penalty_coef if cfg.penalty_coef is not None else penalty_coef
    run = Run("mopo", cfg, data)
    model_data, model_file = ModelData.create(data, cfg, horizon, run)
    agent = MOPO(cfg, data, run.device)
    state = {"agent": agent, **model_data.objects()}
    print(f"mopo: rollout length {horizon}, penalty coefficient {penalty_coef}, elites {model_data.model.elites}")
    for step in run.steps(state):
        if (step - 1) % cfg.rollout_every == 0:
            model_data.rollout(agent.explore, lambda s, o, a: aleatoric_penalty(s.std), penalty_coef)
        with run.precision():
            metrics = agent.update(model_data.batch(cfg.batch_size, cfg.real_ratio))
        run.log(step, {**metrics, **model_data.last_rollout.metrics})
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish({**model_summary(model_file, model_data.model), "rollout_length": horizon, "penalty_coef": penalty_coef})


if __name__ == "__main__":
    cli_main(Config, train)
