"""Options every model-based algorithm shares: the dynamics model (also MBRCSL's), SAC's sizes, the rollout schedule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from offrl.config import EvalConfig, TrainConfig
from world_models.ensemble import EnsembleConfig


@dataclass
class DynamicsModelConfig(TrainConfig):
    """The dynamics ensemble an algorithm learns from its data, or reuses (`world_models.rollout.load_dynamics`)."""

    model: EnsembleConfig = field(default_factory=EnsembleConfig)
    """The dynamics ensemble's architecture and training (its cache key: a model trained with other values is not
    reused)."""
    model_seed: Optional[int] = None
    """Seed of the dynamics model's training (default: the run's --seed). One value for every seed shares
    one cached model across a sweep's seeds; the spread over seeds then excludes the model's."""
    model_path: Optional[str] = None
    """A trained dynamics model (python -m world_models.train); default: the cached one, trained if missing."""
    retrain_model: bool = False
    """Train the dynamics model anew even when one is cached."""


@dataclass
class ModelBasedConfig(DynamicsModelConfig):
    steps: int = 3_000_000
    """Gradient steps (3000 epochs of 1000)."""
    batch_size: int = 256
    """Transitions per gradient step (real and model)."""
    actor_lr: float = 1e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    alpha_lr: float = 1e-4
    """Adam learning rate of log alpha."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 5e-3
    """Polyak rate of the target critics."""
    rollout_length: Optional[int] = None
    """h: model steps per rollout (default: the dataset's entry in the algorithm's table, else 5)."""
    rollout_every: int = 1000
    """Gradient steps between rollout rounds."""
    rollout_batch: int = 50_000
    """Dataset states each rollout round starts from."""
    retain_epochs: int = 5
    """Rollout rounds the model buffer keeps."""
    real_ratio: float = 0.05
    """Fraction of each batch drawn from the dataset."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=10_000, episodes=10))
    """Evaluation every 10k steps, 10 episodes; the references evaluate 10 episodes every 1000-step epoch,
    which `--eval.every 1000` gives (ten times the evaluation cost)."""


def dataset_setting(name: str, table: dict[tuple[str, str], tuple], default: tuple) -> tuple:
    """An algorithm's per-dataset setting for a name such as offrl/hopper/medium-replay-v0, hopper-medium-replay-v2
    or a D4RL file's own name, hopper_medium_replay-v2.hdf5: any name that holds the env and level followed by a
    version (with '/' and '_' read as '-') takes D4RL's entry of that env and level, so the offrl suite's
    datasets, Minari's mujoco/hopper/medium-v0 and D4RL's older -v0/-v1 names do too."""
    text = name.lower().replace("/", "-").replace("_", "-")
    for (env, level), setting in table.items():
        if f"{env}-{level}-v" in text:
            return setting
    return default
