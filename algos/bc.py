"""Behaviour cloning and %BC (CORL's `any_percent_bc.py`; the 10%BC baseline of Chen et al. 2021,
"Decision Transformer", and the IQL paper's tables).

A deterministic actor pi(s) = scale * tanh(f(s)) + bias regresses the dataset actions:

    L = mean || pi(s) - a ||^2          (MSE over batch and action dims)

With `--frac f` < 1 only the best round(f * n) of the n episodes by (discounted) return are kept (at
least one); the state statistics are then computed on the kept episodes, as CORL does.

Defaults (docs/FACTS.md section 1): 2x256 ReLU MLP with tanh output, Adam 3e-4, batch 256, 1M steps,
states normalized with std + 1e-3; `frac_discount` 1.0 as CORL's bc_10 configs.
Deviation from CORL's `keep_best_trajectories`, which runs on qlearning_dataset's rows (time-out rows
already dropped) and cuts a trajectory at a terminal or after every 1000 rows, keeping
max(1, int(f * n)) of them (floor; a trailing unfinished chunk is not a trajectory): here a trajectory
is one of the dataset's own episodes (ending at a terminal or where the recording cut it), so no
ranked unit straddles two episodes, and the count is rounded to the nearest episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from offrl.checkpoint import Stateful
from offrl.compiling import compiled
from offrl.config import DataConfig, TrainConfig
from offrl.data import Batch, TrainingData, load_for_training
from offrl.data.preprocess import refuse_unread_corruption, top_trajectories
from offrl.graphs import GraphedStep
from offrl.multiseed import SeedAgents
from offrl.nets import DeterministicActor
from offrl.optim import adam
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    batch_size: int = 256
    """Transitions per gradient step."""
    lr: float = 3e-4
    """Adam learning rate."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor."""
    frac: float = 1.0
    """Fraction of episodes kept, best first by return (0.1 = 10%BC; 1.0 = plain BC)."""
    frac_discount: float = 1.0
    """Discount used only to rank episodes for --frac."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_states=True))
    """Preprocessing: states standardized (as CORL's BC)."""


def bc_loss(predicted: torch.Tensor, data_actions: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(predicted, data_actions)


class BC(Stateful):
    STATE = ("actor", "optimizer", "normalizer")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.normalizer = data.preprocessing.state_normalizer(device)
        self.actor = DeterministicActor(data.obs_dim, data.act_dim, data.action_low, data.action_high, cfg.hidden).to(device)
        self.optimizer = adam([{"params": self.actor.parameters(), "lr": cfg.lr}], device)
        self._step = GraphedStep(compiled(self.step, cfg.run.compile), device,
                                 cfg.run.cuda_graph, optimizers=(self.optimizer,))

    def loss(self, batch: Batch) -> torch.Tensor:
        return bc_loss(self.actor(batch.observations), batch.actions)

    def step(self, batch: Batch) -> dict[str, torch.Tensor]:
        loss = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"actor_loss": loss.detach()}

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self._step(batch)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self.normalizer(obs))


Agent = BC


def selection(cfg: Config):
    """--frac's episode selection, applied as the dataset loads (the same for every seed)."""
    return partial(top_trajectories, frac=cfg.frac, discount=cfg.frac_discount)


def kept(data: TrainingData) -> dict:
    return {"train/kept_episodes": data.dataset.num_episodes, "train/kept_transitions": len(data.dataset)}


def check_data(cfg: Config) -> None:
    """BC reads states and actions, and returns only to rank episodes for --frac < 1."""
    refuse_unread_corruption(cfg.data, "bc" if cfg.frac >= 1.0 else f"bc with --frac {cfg.frac}",
                             {"observations", "actions"} | ({"rewards"} if cfg.frac < 1.0 else set()))


def train(cfg: Config) -> dict:
    check_data(cfg)
    data = load_for_training(cfg.dataset, cfg.data, select=selection(cfg), seed=cfg.seed)
    run = Run("bc", cfg, data)
    buffer = data.buffer(run.device, seed=cfg.seed, reads_next_observations=False)
    agent = BC(cfg, data, run.device)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        with run.precision():
            metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    return run.finish(kept(data))


class BCSeeds(SeedAgents):
    """The seeds of `--seeds` as one batched BC (offrl/multiseed.py): seed i draws its batches with a generator
    seeded as its single-seed run's; every seed steps at once (a CUDA graph on CUDA). --frac selects the same
    episodes for every seed."""

    READS_NEXT_OBSERVATIONS = False

    def __init__(self, cfgs: list[Config], data: TrainingData, device: torch.device):
        super().__init__(cfgs, data, device, lambda c: BC(c, data, device), ("actor",), ("optimizer",))
        self.optimizer = self.batch.batched_optimizers["optimizer"]
        self._gradient_step = GraphedStep(self.gradient_step, device, self.cfg.run.cuda_graph,
                                          optimizers=(self.optimizer,))

    def gradient_step(self, sample: Batch) -> dict[str, torch.Tensor]:
        loss = self.batch.vmap(self.agents[0].loss, sample)
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()  # each seed's weights get their own loss's gradient
        self.optimizer.step()
        return {"actor_loss": loss.detach()}

    def update(self) -> dict[str, torch.Tensor]:
        return self._gradient_step(self.samplers.sample(self.cfg.batch_size))


Seeds = BCSeeds


def train_seeds(cfg: Config) -> list[dict]:
    """`--seeds 0 1 2`: the seeds as one batched model in one process (offrl/multiseed.py), one run folder each."""
    from offrl import multiseed

    check_data(cfg)
    return multiseed.train("bc", BCSeeds, cfg, select=selection(cfg), extras=kept)


if __name__ == "__main__":
    cli_main(Config, train)
