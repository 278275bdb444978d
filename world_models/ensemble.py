"""Probabilistic dynamics ensemble: the MBPO / MOPO / OfflineRL-Kit model (docs/FACTS.md section 13).

E members (default 7) predict a Gaussian over [s' - s, r] from (s, a), all in one batched module
(`offrl.nets.EnsembleMLP`: one [E, in, out] weight per layer, no Python loop over members):

    inputs       x = ((s, a) - mu) / sigma           (mu, sigma: statistics of the training split only)
    member i     mean_i(x), logvar_i(x)               4 x 200 Swish (SiLU), output 2 (obs_dim + 1)
    bounds       logvar <- max - softplus(max - logvar);  logvar <- min + softplus(logvar - min)
                 (max, min: learned per output dimension, initialized to 0.5 and -10)
    loss         sum_i mean_{batch, dims} [ (mean_i - y)^2 exp(-logvar_i) + logvar_i ]
                 + sum_layers decay_l * 1/2 ||W_l||^2 + 0.01 (sum max - sum min)

Training (`fit`): the holdout is min(20% of the data, 1000) transitions drawn once; every member
trains on its own bootstrap resample of the rest (drawn with replacement, reshuffled every epoch).
After each epoch a member's weights are snapshotted when its holdout MSE (of the mean prediction)
improved by more than 1% relative to its best; training stops after 5 epochs without any member
improving (or at `max_epochs`); the members' snapshots are restored (the shared log-variance bounds
keep their last values) and the `elites` members with the lowest holdout MSE are the ones rollouts use. Training is resumable: `fit` can save its whole state every
epoch and continue from it.

Weights are drawn with `nn.init.trunc_normal_(std=1 / (2 sqrt(fan_in)))` and biases start at 0, as in
OfflineRL-Kit (its default bounds are +-2 absolute, so at these stds nothing is truncated; MOPO's TensorFlow
truncated normal cuts at 2 standard deviations, an effective std of about 0.88 of this one). Deviation: none
known in the model and its loss against OfflineRL-Kit; the optimizer is one Adam over all members
(per-parameter, so identical to separate ones); input standard deviations are torch's unbiased ones
(OfflineRL-Kit's and MOPO's np.std divide by N: a relative difference of about 1/(2N)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from offrl.compiling import compiled
from offrl.errors import OffrlError
from offrl.nets import EnsembleLinear, EnsembleMLP, autocast
from offrl.optim import adam


@dataclass
class EnsembleConfig:
    """The dynamics ensemble and how it is trained (docs/FACTS.md section 13)."""

    members: int = 7
    """Members trained."""
    elites: int = 5
    """Members with the lowest holdout error that rollouts use."""
    hidden: tuple[int, ...] = (200, 200, 200, 200)
    """Hidden layer widths (Swish activations)."""
    weight_decay: tuple[float, ...] = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
    """L2 decay per layer (hidden layers, then the output layer), added to the loss as decay * 1/2 ||W||^2."""
    lr: float = 1e-3
    """Adam learning rate."""
    batch_size: int = 256
    """Transitions per member per gradient step."""
    holdout_ratio: float = 0.2
    """Fraction of the transitions held out (at most `max_holdout`)."""
    max_holdout: int = 1000
    """Most transitions held out."""
    improvement: float = 0.01
    """Relative holdout improvement that counts (and snapshots the member)."""
    patience: int = 5
    """Stop after this many epochs in which no member improved."""
    max_epochs: int | None = None
    """Stop after this many epochs at the latest (None: only early stopping)."""
    logvar_loss_coef: float = 0.01
    """Weight of the log-variance bound term 0.01 (sum max_logvar - sum min_logvar)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Training steps in float32, or under bfloat16 autocast (hidden-layer matmuls in bf16; weights, optimizer
    state, the output layer and the holdout check stay float32; so do rollouts, except MOBILE's penalty under
    `--run.precision bf16`, which runs the model under the run's autocast: offrl/config.py). A deviation from
    the references, which train in float32; worth it only on a CPU with native bfloat16 or a GPU. It enters the
    model's cache key only as bf16, so float32 models keep the keys they had."""
    compile: bool = False
    """torch.compile the training loss (forward and backward; the optimizer step stays eager). The same model up
    to float rounding, which compiled kernels order differently, so it enters the cache key (only when on).
    Compiling takes ~15 s once; on one thread of a 2-core Xeon with AMX a bf16 training step of the default
    ensemble then took 7.69 ms against 10.12 eager (results/speed.md, parts dynamics-xeon-amx-bf16*)."""


def check_config(cfg: EnsembleConfig, training: bool = False) -> None:
    """Option values the ensemble cannot be built with, and with `training` also trained with (before anything
    is cached); a saved model loads whatever its training options were."""
    if len(cfg.weight_decay) != len(cfg.hidden) + 1:
        raise OffrlError(f"--model.weight-decay: one value per layer ({len(cfg.hidden) + 1}), got "
                         f"{len(cfg.weight_decay)}")
    if not 0 < cfg.elites <= cfg.members:
        raise OffrlError(f"--model.elites {cfg.elites}: must be in 1..--model.members ({cfg.members})")
    if not all(width >= 1 for width in cfg.hidden):
        raise OffrlError(f"--model.hidden {' '.join(map(str, cfg.hidden))}: every width at least 1")
    if training:  # each of these trained without an error into a useless model, cached as trained, or crashed
        from offrl.config import option_range_problems  # batch size, patience, learning rate: as every option's

        bad = option_range_problems(cfg, "model.") + [f"--model.{name} {value}: {why}" for name, value, ok, why in (
            ("weight-decay", " ".join(map(str, cfg.weight_decay)), all(math.isfinite(w) and w >= 0 for w in cfg.weight_decay),
             "each finite and not negative"),
            ("improvement", cfg.improvement, math.isfinite(cfg.improvement) and cfg.improvement >= 0,
             "finite and not negative"),
            ("logvar-loss-coef", cfg.logvar_loss_coef, math.isfinite(cfg.logvar_loss_coef), "finite")) if not ok]
        if bad:
            raise OffrlError("; ".join(bad))
    if training and cfg.max_epochs is not None and cfg.max_epochs < 1:
        # 0 would stop before the first epoch and pick elites from the initial weights (OfflineRL-Kit reads 0 as
        # no cap; here that is leaving the option out)
        raise OffrlError(f"--model.max-epochs {cfg.max_epochs}: at least 1 (leave it out for early stopping only)")
    if training and not (0 < cfg.holdout_ratio < 1 and cfg.max_holdout >= 1):
        # elites are picked, and training stops, on the hold-out error
        raise OffrlError(f"--model.holdout-ratio {cfg.holdout_ratio} --model.max-holdout {cfg.max_holdout}: a "
                         "hold-out of at least one row (a ratio in (0, 1))")


class DynamicsEnsemble(nn.Module):
    """E Gaussian models of [s' - s, r] given (s, a); `forward` returns means and bounded log-variances
    [E, B, obs_dim + 1] for raw (unnormalized) inputs."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: EnsembleConfig | None = None):
        super().__init__()
        cfg = cfg or EnsembleConfig()
        check_config(cfg)
        self.obs_dim, self.act_dim, self.cfg = obs_dim, act_dim, cfg
        self.out_dim = obs_dim + 1
        self.net = EnsembleMLP(cfg.members, obs_dim + act_dim, 2 * self.out_dim, cfg.hidden, activation=nn.SiLU)
        for layer in self.linear_layers():
            nn.init.trunc_normal_(layer.weight, std=1.0 / (2.0 * math.sqrt(layer.in_dim)))
            nn.init.zeros_(layer.bias)
        self.max_logvar = nn.Parameter(torch.full((self.out_dim,), 0.5))
        self.min_logvar = nn.Parameter(torch.full((self.out_dim,), -10.0))
        self.register_buffer("input_mean", torch.zeros(obs_dim + act_dim))
        self.register_buffer("input_std", torch.ones(obs_dim + act_dim))
        self.register_buffer("elite_index", torch.arange(cfg.elites))
        self.register_buffer("holdout_mse", torch.full((cfg.members,), float("nan")))

    @property
    def members(self) -> int:
        return self.cfg.members

    def linear_layers(self) -> list[EnsembleLinear]:
        return [m for m in self.net.modules() if isinstance(m, EnsembleLinear)]

    def set_input_statistics(self, inputs: torch.Tensor) -> None:
        """Standardize inputs with the mean and std of `inputs` (the training split); a constant
        dimension gets std 1."""
        std = inputs.std(0)
        self.input_mean.copy_(inputs.mean(0))
        self.input_std.copy_(torch.where(std < 1e-12, torch.ones_like(std), std))

    def forward_normalized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: standardized inputs [B, in] (shared by all members) or [E, B, in]."""
        mean, logvar = self.net(x).chunk(2, dim=-1)
        return mean, bound_logvar(logvar, self.min_logvar, self.max_logvar)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_normalized(self.standardize(torch.cat([obs, actions], dim=-1)))

    def standardize(self, inputs: torch.Tensor) -> torch.Tensor:
        """(s, a) rows -> the network's standardized inputs."""
        return (inputs - self.input_mean) / self.input_std

    def decay_loss(self) -> torch.Tensor:
        return sum(decay * 0.5 * (layer.weight ** 2).sum()
                   for decay, layer in zip(self.cfg.weight_decay, self.linear_layers()))

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training loss on standardized inputs x [E, B, in] and targets [E, B, out]; also returns the
        per-member Gaussian NLL [E] (without decay and bound terms)."""
        mean, logvar = self.forward_normalized(x)
        nll = gaussian_nll(mean, logvar, targets)
        bounds = self.cfg.logvar_loss_coef * (self.max_logvar.sum() - self.min_logvar.sum())
        return nll.sum() + self.decay_loss() + bounds, nll.detach()

    @torch.no_grad()
    def holdout_errors(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """MSE of each member's mean prediction, averaged over rows and dims: [E]."""
        mean, _ = self.forward_normalized(x)
        return ((mean - targets) ** 2).mean(dim=(1, 2))

    @property
    def elites(self) -> list[int]:
        return self.elite_index.tolist()


def bound_logvar(logvar: torch.Tensor, min_logvar: torch.Tensor, max_logvar: torch.Tensor) -> torch.Tensor:
    """Soft clamp into [min, max]: max - softplus(max - v), then min + softplus(v - min)."""
    logvar = max_logvar - F.softplus(max_logvar - logvar)
    return min_logvar + F.softplus(logvar - min_logvar)


def gaussian_nll(mean: torch.Tensor, logvar: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per member: mean over batch and dims of (mean - y)^2 exp(-logvar) + logvar (no 1/2, no log 2pi,
    as OfflineRL-Kit and MOPO). [E, B, D] -> [E]."""
    return (((mean - targets) ** 2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2))


def transitions_to_training(observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                            next_observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (s, a) and targets (s' - s, r), float32."""
    inputs = np.concatenate([observations, actions], axis=1).astype(np.float32)
    targets = np.concatenate([next_observations - observations, rewards.reshape(-1, 1)], axis=1).astype(np.float32)
    return inputs, targets


def _int32(rows: np.ndarray) -> torch.Tensor:
    """Row indices of a dataset (fewer than 2**31 rows) as a compact int32 tensor for a checkpoint."""
    return torch.as_tensor(rows.astype(np.int32))


def make_optimizer(model: nn.Module, cfg: "EnsembleConfig") -> torch.optim.Adam:
    """The ensemble's Adam, fused where the device supports it: CPU's default single-tensor path took 12%
    of a training step."""
    device = next(model.parameters()).device
    return adam([{"params": model.parameters(), "lr": cfg.lr}], device)

class EnsembleTrainer:
    """`fit`'s state between epochs: split, bootstrap indices, optimizer, best holdout errors and
    snapshots. `state_dict` / `load_state_dict` make model training resumable."""

    def __init__(self, model: DynamicsEnsemble, inputs: np.ndarray, targets: np.ndarray, seed: int = 0):
        cfg, device = model.cfg, model.input_mean.device
        self.model, self.cfg = model, cfg
        self.rng = np.random.default_rng(seed)
        n = len(inputs)
        holdout = min(int(n * cfg.holdout_ratio), cfg.max_holdout)
        if holdout < 1 or n - holdout < 1:  # elites and the stopping rule read the hold-out error
            raise OffrlError(f"too few transitions ({n}) to train a dynamics model with a hold-out "
                             f"(--model.holdout-ratio {cfg.holdout_ratio})")
        order = self.rng.permutation(n)
        self.holdout_rows, self.train_rows = order[:holdout], order[holdout:]
        self.inputs = torch.as_tensor(inputs, device=device)
        self.targets = torch.as_tensor(targets, device=device)
        model.set_input_statistics(self.inputs[torch.as_tensor(self.train_rows, device=device)])
        self.bootstrap = self.rng.integers(len(self.train_rows), size=(cfg.members, len(self.train_rows)))
        self.optimizer = make_optimizer(model, cfg)
        # static shapes: an epoch's full batches and its one shorter last batch, two graphs in all. Compiled code
        # is cached per code object with guards on this trainer, so a process compiles at most a few trainers
        # (torch._dynamo's recompile limit, 8 graphs) before later ones run eager: one per process, as
        # world_models.train and the model-based algorithms train.
        self._loss = compiled(self.training_loss, cfg.compile, dynamic=False)
        self.best = np.full(cfg.members, np.inf)
        self.snapshot = {k: v.detach().clone() for k, v in model.state_dict().items() if is_per_member(k, v, cfg.members)}
        self.epoch, self.epochs_without_improvement = 0, 0
        self.last_train_nll = np.full(cfg.members, np.nan)
        self.last_holdout = np.full(cfg.members, np.nan)

    def gradient_step(self, index: torch.Tensor) -> torch.Tensor:
        """One Adam step on rows `index` [E, B] of the training data (member i on its row i); returns each
        member's Gaussian NLL [E]."""
        loss, nll = self._loss(self.inputs[index], self.targets[index])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return nll

    def training_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`DynamicsEnsemble.loss` of raw (s, a) rows [E, B, in] under the configured precision."""
        with autocast(self.inputs.device, self.cfg.precision):
            return self.model.loss(self.model.standardize(inputs), targets)

    @property
    def done(self) -> bool:
        cfg = self.cfg
        return self.epochs_without_improvement >= cfg.patience or (cfg.max_epochs is not None and self.epoch >= cfg.max_epochs)

    def train_epoch(self) -> None:
        """One pass over each member's bootstrap sample, then the holdout check and snapshots."""
        model, cfg, device = self.model, self.cfg, self.inputs.device
        rows = torch.as_tensor(self.train_rows[self.bootstrap], device=device)  # [E, N_train]
        nll_sum, batches = torch.zeros(cfg.members, device=device), 0
        for start in range(0, rows.shape[1], cfg.batch_size):
            nll_sum += self.gradient_step(rows[:, start:start + cfg.batch_size])
            batches += 1
        self.last_train_nll = (nll_sum / max(batches, 1)).cpu().numpy()
        holdout = self.holdout_errors()
        self.last_holdout = holdout
        # reshuffle each member's bootstrap sample (the same rows, a new order), as OfflineRL-Kit does
        self.bootstrap = np.take_along_axis(self.bootstrap, np.argsort(self.rng.random(self.bootstrap.shape), axis=1), axis=1)
        improved = (self.best - holdout) / np.where(np.isinf(self.best), 1.0, self.best) > cfg.improvement
        improved |= np.isinf(self.best) & np.isfinite(holdout)
        if improved.any():
            self.best[improved] = holdout[improved]
            state = model.state_dict()
            for name in self.snapshot:
                self.snapshot[name][improved] = state[name].detach()[improved]
            self.epochs_without_improvement = 0
        else:
            self.epochs_without_improvement += 1
        self.epoch += 1

    def holdout_errors(self) -> np.ndarray:
        model = self.model
        if len(self.holdout_rows) == 0:
            return np.zeros(self.cfg.members)
        rows = torch.as_tensor(self.holdout_rows, device=self.inputs.device)
        x = model.standardize(self.inputs[rows])
        return model.holdout_errors(x, self.targets[rows].expand(self.cfg.members, -1, -1)).cpu().numpy()

    def finish(self) -> None:
        """Restore each member's snapshot and pick the elites (lowest holdout MSE). The log-variance bounds,
        shared by all members, keep their last values, as in OfflineRL-Kit, which snapshots only the
        members' layers."""
        model = self.model
        model.load_state_dict({**model.state_dict(), **self.snapshot})
        errors = self.holdout_errors()
        model.holdout_mse.copy_(torch.as_tensor(errors))
        model.elite_index.copy_(torch.as_tensor(np.sort(np.argsort(errors, kind="stable")[:self.cfg.elites])))

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "snapshot": self.snapshot,
                "best": torch.as_tensor(self.best), "epoch": self.epoch,
                "epochs_without_improvement": self.epochs_without_improvement,
                # row indices as int32 (held as int64): the bootstrap indices were 112 of a 2M-row training.pt's 143 MB
                "holdout_rows": _int32(self.holdout_rows), "train_rows": _int32(self.train_rows),
                "bootstrap": _int32(self.bootstrap), "rng": str(self.rng.bit_generator.state["state"]["state"]),
                "rng_inc": str(self.rng.bit_generator.state["state"]["inc"])}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.snapshot = {k: v.clone() for k, v in state["snapshot"].items()}
        # .cpu(): a checkpoint loaded with map_location=cuda puts these on the GPU
        self.best = state["best"].cpu().numpy().copy()
        self.epoch, self.epochs_without_improvement = int(state["epoch"]), int(state["epochs_without_improvement"])
        # int64 as drawn (a training.pt saved before the int32 files holds them so already)
        self.holdout_rows = state["holdout_rows"].cpu().numpy().astype(np.int64)
        self.train_rows = state["train_rows"].cpu().numpy().astype(np.int64)
        self.bootstrap = state["bootstrap"].cpu().numpy().astype(np.int64)
        bit = self.rng.bit_generator.state
        bit["state"] = {"state": int(state["rng"]), "inc": int(state["rng_inc"])}
        self.rng.bit_generator.state = bit


def is_per_member(name: str, value: torch.Tensor, members: int) -> bool:
    """Parameters with a leading member dimension (the EnsembleLinear weights and biases)."""
    return name.startswith("net.") and value.dim() == 3 and value.shape[0] == members


def fit(model: DynamicsEnsemble, inputs: np.ndarray, targets: np.ndarray, seed: int = 0,
        on_epoch: Callable[[EnsembleTrainer], None] | None = None, trainer: EnsembleTrainer | None = None) -> EnsembleTrainer:
    """Train until early stopping (see the module docstring); `on_epoch(trainer)` runs after every epoch
    (progress, checkpoints). Pass a restored `trainer` to continue a stopped training."""
    trainer = trainer or EnsembleTrainer(model, inputs, targets, seed)
    while not trainer.done:
        trainer.train_epoch()
        if on_epoch is not None:
            on_epoch(trainer)
    trainer.finish()
    return trainer
