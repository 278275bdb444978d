"""Model rollouts on the training device, their uncertainty penalties, and real/model batch mixing.

A branched rollout (MBPO, MOPO, MOBILE, RAVL) starts from dataset states and runs the policy inside
the model for h steps: at each step every row asks a random elite member and samples its Gaussian,
s' = s + delta, r = reward sample, and a row that reaches a terminal state stops there. The
transitions go to a model replay buffer that keeps the last `retain_epochs` rollout rounds (a FIFO
of `rollout_batch * h * retain_epochs` rows, as OfflineRL-Kit sizes it), and a training batch mixes
`real_ratio` dataset transitions with model ones.

Uncertainty measures, per (s, a) row, from the ensemble's predictions:
    aleatoric (MOPO)       max over all members i of ||sigma_i(s, a)||_2 (every output, reward included)
    disagreement           max over all members i of ||mu_i(s, a) - mean_j mu_j(s, a)||_2 (state part)
    bellman (MOBILE)       std over elites i of mean_m min_j Q_targ_j(s'_{i,m}, a'_{i,m}),
                           s'_{i,m} ~ N(s + mu_i, sigma_i^2) (state part), a' ~ pi(s'), m = 1..M
as in OfflineRL-Kit's `EnsembleDynamics.step` and `MOBILEPolicy.compute_lcb` (std with Bessel's
correction, as torch's default there).
"""

from __future__ import annotations

import sys
from pathlib import Path
from dataclasses import dataclass, fields
from typing import Callable

import torch

from offrl.checkpoint import SeededGenerator, Stateful
from offrl.data.buffer import Batch, ReplayBuffer
from world_models.ensemble import DynamicsEnsemble, EnsembleConfig
from world_models.termination import TerminationFn


@dataclass
class Step:
    next_observations: torch.Tensor  # [N, obs_dim]
    rewards: torch.Tensor  # [N]
    terminals: torch.Tensor  # [N] bool
    mean: torch.Tensor  # [E, N, obs_dim + 1], every member's predicted mean of [delta s, r]
    std: torch.Tensor  # [E, N, obs_dim + 1]


@torch.no_grad()
def model_step(model: DynamicsEnsemble, obs: torch.Tensor, actions: torch.Tensor, termination: TerminationFn,
               generator: torch.Generator | None = None) -> Step:
    """One step of every row through a random elite's Gaussian."""
    mean, logvar = model(obs, actions)
    std = (0.5 * logvar).exp()
    n = obs.shape[0]
    elites = model.elite_index
    pick = elites[torch.randint(len(elites), (n,), device=obs.device, generator=generator)]
    rows = torch.arange(n, device=obs.device)
    noise = torch.randn(n, mean.shape[-1], device=obs.device, generator=generator)
    sample = mean[pick, rows] + std[pick, rows] * noise
    next_obs = obs + sample[:, :-1]
    return Step(next_obs, sample[:, -1], termination(next_obs), mean, std)


def aleatoric_penalty(std: torch.Tensor) -> torch.Tensor:
    """MOPO: max_i ||sigma_i||_2 over all members. [E, N, D] -> [N]."""
    return std.norm(dim=-1).amax(dim=0)


def disagreement_penalty(mean: torch.Tensor) -> torch.Tensor:
    """max_i ||mu_i - mean_j mu_j||_2 over the state part of all members. [E, N, D] -> [N]."""
    states = mean[..., :-1]
    return (states - states.mean(dim=0)).norm(dim=-1).amax(dim=0)


@torch.no_grad()
def bellman_penalty(model: DynamicsEnsemble, obs: torch.Tensor, actions: torch.Tensor,
                    policy: Callable[[torch.Tensor], torch.Tensor], target_q: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    samples: int = 10, generator: torch.Generator | None = None) -> torch.Tensor:
    """MOBILE: std over elites of the mean over `samples` next states of min_j Q_targ(s', pi(s')). [N].

    `policy(s)` samples a' (as SAC's actor does); `target_q(s, a)` is the min over target critics, [B]."""
    mean, logvar = model(obs, actions)
    elites = model.elite_index
    mean, std = mean[elites, :, :-1], (0.5 * logvar[elites, :, :-1]).exp()  # [K, N, obs]
    noise = torch.randn((samples, *mean.shape), device=obs.device, generator=generator)
    next_obs = (obs + mean + std * noise).reshape(-1, obs.shape[-1])  # [M * K * N, obs]
    q = target_q(next_obs, policy(next_obs)).reshape(samples, len(elites), obs.shape[0])
    return q.mean(dim=0).std(dim=0)


@dataclass
class RolloutStats:
    transitions: torch.Tensor  # scalar tensors, gathered by the caller when it logs
    reward_mean: torch.Tensor
    terminal_fraction: torch.Tensor
    penalty_mean: torch.Tensor


@torch.no_grad()
def rollout(model: DynamicsEnsemble, policy: Callable[[torch.Tensor], torch.Tensor], start_obs: torch.Tensor,
            horizon: int, termination: TerminationFn, buffer: ReplayBuffer,
            penalty: Callable[[Step, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
            penalty_coef: float = 0.0, generator: torch.Generator | None = None) -> RolloutStats:
    """Run `policy` in the model from `start_obs` for `horizon` steps and add each live row's transition
    to `buffer`, its reward lowered by `penalty_coef * penalty(step, obs, actions)` (MOPO). A row stops
    after the step that reaches a terminal state; the transitions of rows still running are kept
    in the buffer with terminal = 0. One host sync per step (the live rows' count)."""
    obs = start_obs
    device = start_obs.device
    count, reward_sum, terminal_sum, penalty_sum = (torch.zeros((), device=device) for _ in range(4))
    for _ in range(horizon):
        actions = policy(obs)
        step = model_step(model, obs, actions, termination, generator)
        rewards = step.rewards
        if penalty is not None and penalty_coef:
            value = penalty(step, obs, actions)
            penalty_sum += value.sum()
            rewards = rewards - penalty_coef * value
        terminals = step.terminals
        buffer.add(obs, actions, rewards, step.next_observations, terminals.float())
        count += obs.shape[0]
        reward_sum += rewards.sum()
        terminal_sum += terminals.sum()
        alive = (~terminals).nonzero().squeeze(1)  # the step's one host sync: how many rows live on
        if alive.numel() == 0:
            break
        obs = step.next_observations.index_select(0, alive)
    return RolloutStats(count, reward_sum / count, terminal_sum / count, penalty_sum / count)


def real_rows(batch_size: int, real_ratio: float) -> int:
    """Dataset rows in a mixed batch: int(batch_size * real_ratio), as OfflineRL-Kit and RAVL count them
    (12 of 256 at 0.05)."""
    return int(batch_size * real_ratio)


def check_mixing(data_cfg, batch_size: int, real_ratio: float, algo: str) -> None:
    """--real-ratio in [0, 1], before a run folder is made; a batch with no dataset row never reads the buffer
    that --data.sampling return-weighted weights, so that option is refused there."""
    from offrl.data.preprocess import refuse_weighted_sampling
    from offrl.errors import OffrlError

    if not 0.0 <= real_ratio <= 1.0:
        raise OffrlError(f"--real-ratio {real_ratio}: the fraction of dataset rows in a batch, in [0, 1]")
    if real_rows(batch_size, real_ratio) == 0:
        refuse_weighted_sampling(data_cfg, algo, f"model rows only (--real-ratio {real_ratio} gives no dataset row "
                                                 f"in a batch of {batch_size})")


def mixed_batch(real: ReplayBuffer, model: ReplayBuffer, batch_size: int, real_ratio: float) -> Batch:
    """`real_rows(batch_size, real_ratio)` dataset rows followed by model rows (MOPO, MOBILE, RAVL: 0.05)."""
    n_real = real_rows(batch_size, real_ratio)
    if n_real == batch_size or len(model) == 0:
        return real.sample(batch_size)
    if n_real == 0:
        return model.sample(batch_size)
    a, b = real.sample(n_real), model.sample(batch_size - n_real)
    return Batch(*(torch.cat([x, y]) for x, y in zip(a, b)))


def check_model_options(cfg) -> None:
    """With --model-path the file is the model: --model-seed and --retrain-model do nothing, and a --model.* option
    other than both its default and the file's value would be recorded as applied while the file's config builds
    the model (options at their default or at the file's value stay: they build the model when a resumed run finds
    the file gone). Refused before a run folder is made."""
    if cfg.model_seed is not None and cfg.model_seed < 0:
        from offrl.errors import OffrlError

        raise OffrlError(f"--model-seed {cfg.model_seed}: may not be negative")
    if cfg.model_path is None:
        return
    from offrl.config import refuse_unused_options
    from world_models.train import load_model

    unused = [(option, "does nothing with --model-path") for option, given in (
        ("--model-seed", cfg.model_seed is not None), ("--retrain-model", cfg.retrain_model)) if given]
    if Path(cfg.model_path).exists():  # a missing file is load_or_train's error, after this
        trained, default = load_model(cfg.model_path).cfg, EnsembleConfig()
        unused += [(f"--model.{f.name.replace('_', '-')} {getattr(cfg.model, f.name)}",
                    f"differs from the --model-path file's {getattr(trained, f.name)}") for f in fields(EnsembleConfig)
                   if getattr(cfg.model, f.name) not in (getattr(default, f.name), getattr(trained, f.name))]
    refuse_unused_options(unused, "the file's own config and weights are the model: drop those options")


def load_dynamics(data, cfg, run) -> tuple[DynamicsEnsemble, str, TerminationFn]:
    """From a `DynamicsModelConfig` (model, model_seed, model_path, retrain_model, seed): the cached or newly
    trained ensemble of `data` for `run` (an `offrl.run.Run`), its file, and the termination function of the
    data's env.

    A stop signal meanwhile ends the run after the training's current epoch, which is checkpointed, or at once
    while it waits for another process training the same model (`Run.before_first_step`). A resumed run rolls
    out the model its checkpoint holds (the cache entry may have been trained again since), so it takes that one
    and neither loads nor trains a cached model: resumed on a machine whose cache lacks it, it would otherwise
    train one for hours only to replace it. With --model-path the file is read for its config where it is
    still there."""
    from offrl.evaluation import env_spec_from_metadata
    from world_models.termination import termination_fn
    from world_models.train import cache_folder, load_or_train

    termination = termination_fn(env_spec_from_metadata(data.metadata))
    model_seed = cfg.seed if cfg.model_seed is None else cfg.model_seed
    resumed = run.restored_object("dynamics_model")
    if resumed is not None and (cfg.model_path is None or not Path(cfg.model_path).exists()):
        # a cache entry's config is --model's; a --model-path file gone since the run began is taken to have had
        # --model's too, which the checkpoint's weights must then fit
        with torch.random.fork_rng(devices=[]):  # the weights are the checkpoint's: leave the run's RNG alone
            model = DynamicsEnsemble(data.obs_dim, data.act_dim, cfg.model)
        try:
            model.load_state_dict(resumed)
        except RuntimeError as exc:
            from offrl.errors import CheckpointError

            lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]  # after torch's header line
            misfit = "the run's checkpoint holds a dynamics model that does not fit one built from the --model options"
            remedy = (f"--model-path {cfg.model_path} is gone: put it back (its config builds the model the "
                      "checkpoint's weights go into)" if cfg.model_path else "was the checkpoint written by another "
                      "offrl version?")
            raise CheckpointError(f"{misfit} ({lines[0] if lines else exc}); {remedy}") from None
        print("dynamics model: the run's checkpoint holds it; no model file is read", file=sys.stderr)
        model_file = Path(cfg.model_path) if cfg.model_path else cache_folder(data.dataset, cfg.model, model_seed) / "model.pt"
        return model.to(run.device), str(model_file), termination
    with run.before_first_step("getting its dynamics model", "after the dynamics model's current epoch, which is "
                               "checkpointed (at once while waiting for another process's training of it)"):
        model, model_file = load_or_train(data.dataset, cfg.model, model_seed, run.device, cfg.model_path,
                                          cfg.retrain_model, should_stop=run.stop_requested)
    return model, str(model_file), termination


def model_summary(model_file: str, model: DynamicsEnsemble) -> dict:
    """For a model-based run's final.json: the model file it started from and what it rolled out
    (`world_models.train.model_record`: hold-out errors, elites, the file's hash, epochs and training time)."""
    from world_models.train import model_record

    return {"model_file": model_file, "dynamics_model": model_record(model_file, model)}


class LastRollout(Stateful):
    """The latest rollout round's metrics, which every logged row repeats until the next round; checkpointed, so a
    run resumed between two rounds logs them as a straight run does."""

    VALUES = ("metrics",)

    def __init__(self):
        self.metrics: dict[str, torch.Tensor] = {}


class ModelData:
    """What a model-based run keeps beside its agent: the dataset buffer, the model buffer (FIFO of
    `rollout_batch * horizon * retain_epochs` rows), the start-state sampler and the rollout RNG. All of
    it goes into the run's checkpoint (`objects()`), the model rows included, so a resumed run is exact."""

    def __init__(self, data, model: DynamicsEnsemble, termination: TerminationFn, horizon: int, rollout_batch: int,
                 retain_epochs: int, device: torch.device, seed: int):
        self.model, self.termination, self.horizon, self.rollout_batch = model, termination, horizon, rollout_batch
        self.real = data.buffer(device, seed=seed)
        self.fake = ReplayBuffer(data.obs_dim, data.act_dim, rollout_batch * horizon * retain_epochs, device, seed=seed + 1)
        self.starts = ReplayBuffer.from_dataset(data.dataset, device, seed=seed + 2)
        self.rng = SeededGenerator(device, seed + 3)
        self.last_rollout = LastRollout()

    @staticmethod
    def check_raw(data, algo: str, cfg=None) -> None:
        """Model-based algorithms learn the dynamics of the raw data: refuse normalized states or scaled rewards
        (and, from the algorithm's `cfg`, a dynamics-model config that cannot train or options --model-path
        leaves unused: `check_model_options`), before a run folder is made."""
        if cfg is not None:
            from world_models.ensemble import check_config

            check_config(cfg.model, training=True)
            check_model_options(cfg)
            if cfg.data.corrupt is not None and cfg.data.corruption_seed is None and cfg.model_path is None:
                print(f"note: --data.corrupt without --data.corruption-seed corrupts each seed's data its own way, so "
                      f"each seed of {algo} trains (and caches) a dynamics model of its own; give "
                      "--data.corruption-seed to share one across seeds", file=sys.stderr)
        if data.preprocessing.obs_mean is not None or data.preprocessing.reward_scale != 1.0 or data.preprocessing.reward_bias:
            from offrl.errors import OffrlError

            raise OffrlError(f"{algo} learns a dynamics model of the raw data: drop --data.normalize-states and "
                             "reward scaling")
        data.refuse_unknown_next_observations()  # before a dynamics model trains (hours on a CPU), not after

    @classmethod
    def create(cls, data, cfg, horizon: int, run) -> tuple["ModelData", str]:
        """From an algorithm's config (model, model_seed, model_path, retrain_model, rollout_batch, retain_epochs,
        seed): the model (`load_dynamics`: cached, trained, or `run`'s checkpoint's), the env's termination
        function and the buffers on the run's device."""
        model, model_file, termination = load_dynamics(data, cfg, run)
        return cls(data, model, termination, horizon, cfg.rollout_batch, cfg.retain_epochs, run.device, cfg.seed), model_file

    def objects(self) -> dict:
        """The checkpointed state. The dynamics model is in it too: a resume then rolls out the model the run
        started with, even when the cache entry or --model-path file was trained again meanwhile."""
        return {"real": self.real, "model_buffer": self.fake, "starts": self.starts, "rollout_rng": self.rng,
                "dynamics_model": self.model, "last_rollout": self.last_rollout}

    def rollout(self, policy: Callable[[torch.Tensor], torch.Tensor],
                penalty: Callable[[Step, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                penalty_coef: float = 0.0) -> dict[str, torch.Tensor]:
        """One rollout round from `rollout_batch` dataset states; returns its metrics (tensors), kept in
        `last_rollout` too."""
        stats = rollout(self.model, policy, self.starts.sample(self.rollout_batch).observations, self.horizon,
                        self.termination, self.fake, penalty, penalty_coef, self.rng.generator)
        self.last_rollout.metrics = {
            "rollout/transitions": stats.transitions, "rollout/reward_mean": stats.reward_mean,
            "rollout/terminal_fraction": stats.terminal_fraction, "rollout/penalty_mean": stats.penalty_mean}
        return self.last_rollout.metrics

    def batch(self, batch_size: int, real_ratio: float) -> Batch:
        return mixed_batch(self.real, self.fake, batch_size, real_ratio)


def benchmark_model_data(data, cfg, horizon: int, device: torch.device, policy: Callable[[torch.Tensor], torch.Tensor],
                         rollout_rows: int = 10_000) -> ModelData:
    """What a model-based update reads, without training a model (for `benchmarks.speed`): an untrained
    ensemble standardizing the data's inputs, and a model buffer filled by one rollout round."""
    from world_models.termination import never

    model = DynamicsEnsemble(data.obs_dim, data.act_dim, cfg.model).to(device)
    inputs = torch.as_tensor(data.dataset.observations, device=device), torch.as_tensor(data.dataset.actions, device=device)
    model.set_input_statistics(torch.cat(inputs, dim=1))
    model_data = ModelData(data, model, never, horizon, rollout_rows, cfg.retain_epochs, device, seed=0)
    model_data.rollout(policy)
    return model_data
