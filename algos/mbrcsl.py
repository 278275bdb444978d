"""MBRCSL: model-based return-conditioned supervised learning ("Free from Bellman Completeness: Trajectory
Stitching via Model-based Return-conditioned Supervised Learning", Zhou et al., ICLR 2024).

RCSL alone cannot stitch: it imitates the data's trajectories, so it cannot beat the best of them by
joining the good half of one to the good half of another. MBRCSL lets a model do the joining:

    1. a dynamics ensemble of the data (world_models, cached; 7 members, 5 elites, 4 x 200)
    2. a generative behaviour policy p(a | s) trained by behaviour cloning (offrl.generative: a small
       diffusion policy, or a Gaussian mixture), which in the model mixes the data's behaviours
    3. rollouts of that policy inside the model from the data's initial states, `rollout_batch` at a time
       for the full horizon (a random elite and a sampled Gaussian step per row and step; a row stops at a
       terminal state where the env has one); a rollout is kept when its return R > threshold (the data's
       best episode return unless --threshold), until `num_trajectories` are kept or `max_rollout_epochs`
       batches were made
    4. RCSL (algos.rcsl, MSE head) trained on the kept rollouts only, with returns-to-go computed inside each
       rollout (R_t = sum of its rewards from t on), and evaluated conditioned on the best kept return.

Defaults are the reference's point-maze settings (docs/FACTS.md section 8, `run_mbrcsl_maze.py`): 10 diffusion
steps, 200 rollouts a batch (each as long as the env's time limit), 100 trajectories kept, at most 1000
rollout batches; RCSL 1024-1024, lr 5e-5,
weight decay 0.1, batch 256, 10% hold-out. Deviations: the diffusion network is an eighth of the
reference's width and trains 20k steps at its stated learning rate (offrl.generative explains why);
RCSL uses AdamW (decoupled decay) where the reference adds 0.1 * w to Adam's gradient
(`--rcsl.no-decoupled-weight-decay` does as the reference; not a small
difference: at lr 5e-5 AdamW shrinks a weight by ~5% over 10k steps, while the reference's 0.1 * w, where it
outweighs the loss's gradient, moves a weight toward 0 by up to lr a step, so its fit to the kept rollouts is
far more regularized), states and
returns are normalized (the reference feeds raw ones), returns-to-go are divided by the kept returns' largest magnitude
(so conditioning lies in about [-1, 1]; `return_scale`) and early stopping (1% rule, patience 5) checks every 500 steps
from the start instead of every epoch from epoch 80. RCSL's budget is steps (10k), the reference's epochs
over the kept data (80-100): about the same on the point maze (~70 steps an epoch), but on 1000-step
rollouts the reference trains at least ~28k steps; raise --steps there.

Phases and resuming: the run counts behaviour.steps + steps gradient steps. The behaviour policy is
written to <run>/behaviour.pt when trained (pass it to another run with --behaviour-policy to skip
that phase) and evaluated in the env (`behaviour/...` in final.json: diffusion BC's score). Rollout
batches are checkpointed as they finish, so a stopped run resumes in the middle of them; the kept
rollouts are written to <run>/rollouts.npz, an offrl dataset any algorithm (or `offrl datasets
info`) reads. When no rollout passes the threshold the run says so, writes final.json with the
rollout statistics and exits with an error instead of training RCSL on nothing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np
import torch

from algos import rcsl
from offrl import checkpoint as ckpt, generative
from offrl.config import DataConfig, EvalConfig, refuse_unused_options
from offrl.data import Dataset, TrainingData, load_dataset, load_for_training
from offrl.data.preprocess import StateNormalizer, normalize_states, refuse_weighted_sampling, state_stats
from offrl.errors import OffrlError
from offrl.nets import seeded_cpu_init
from offrl.run import Run, cli_main
from world_models.ensemble import DynamicsEnsemble
from world_models.config import DynamicsModelConfig
from world_models.rollout import ModelData, load_dynamics, model_step, model_summary
from world_models.termination import TerminationFn


@dataclass
class RCSLOptions:
    """The RCSL policy trained on the kept rollouts (the reference's point-maze sizes)."""

    hidden: tuple[int, ...] = (1024, 1024)
    """Hidden layer widths."""
    lr: float = 5e-5
    """Adam learning rate."""
    weight_decay: float = 0.1
    """Weight decay (AdamW's, decoupled, unless --rcsl.no-decoupled-weight-decay)."""
    decoupled_weight_decay: bool = True
    """AdamW's decoupled decay; --rcsl.no-decoupled-weight-decay adds weight_decay * w to the gradient before Adam
    normalizes it, as the reference does (torch.optim.Adam with weight_decay 0.1)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    holdout_ratio: float = 0.1
    """Fraction of the rollout transitions held out for early stopping."""
    holdout_every: int = 500
    """Measure the hold-out loss every this many steps."""
    patience: int = 5
    """Stop after this many hold-out checks without a > 1% improvement."""
    rtg_scale: Optional[float] = None
    """Returns-to-go are divided by this (default: the largest absolute return of the kept rollouts; 1 if all
    are 0)."""


@dataclass
class Config(DynamicsModelConfig):
    steps: int = 10_000
    """Most RCSL gradient steps (early stopping usually ends sooner); the behaviour policy's come before them.
    0: train the behaviour policy and make the rollouts only (a resume with more steps trains RCSL on them)."""
    behaviour: generative.BehaviourConfig = field(default_factory=generative.BehaviourConfig)
    """Phase 1: the generative behaviour policy rolled out in the model."""
    behaviour_policy: Optional[str] = None
    """A behaviour-policy file (<run>/behaviour.pt of an earlier run) to roll out instead of training one; '{seed}'
    in it becomes --seed, for sweeps."""
    threshold: Optional[float] = None
    """Keep rollouts whose return exceeds this (default: the dataset's best episode return)."""
    num_trajectories: int = 100
    """Stop rolling out once this many rollouts are kept."""
    rollout_batch: int = 200
    """Rollouts made at once (one rollout epoch)."""
    max_rollout_epochs: int = 1000
    """Most rollout epochs."""
    horizon: Optional[int] = None
    """Rollout length (default: the env's time limit, else the longest episode in the data)."""
    rcsl: RCSLOptions = field(default_factory=RCSLOptions)
    """Phase 3: the RCSL policy trained on the kept rollouts."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=0, episodes=10))
    """The RCSL policy evaluated at the end only (the behaviour policy once, when trained)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The raw data, which the dynamics model learns (RCSL normalizes its own inputs)."""


# ------------------------------------------------------------------------------------ rollouts
@dataclass
class Rollouts:
    """Fixed-length rollouts [n, horizon, ...]; row i's transitions are its first lengths[i] steps."""

    observations: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_observations: torch.Tensor
    terminated: torch.Tensor  # [n] bool: the rollout ended in a terminal state
    lengths: torch.Tensor  # [n] long
    returns: torch.Tensor  # [n]: sum of its rewards

    def select(self, rows: torch.Tensor) -> "Rollouts":
        return Rollouts(*(x[rows] for x in vars(self).values()))

    @staticmethod
    def cat(parts: list["Rollouts"]) -> "Rollouts":
        return Rollouts(*(torch.cat(xs) for xs in zip(*(vars(p).values() for p in parts))))

    def __len__(self) -> int:
        return len(self.returns)


@torch.no_grad()
def rollout_full(model: DynamicsEnsemble, policy: generative.BehaviourPolicy, start_obs: torch.Tensor, horizon: int,
                 termination: TerminationFn, generator: torch.Generator | None = None) -> Rollouts:
    """Roll `policy` out in the model from `start_obs` for `horizon` steps. A row that reaches a terminal
    state stops there (its later steps are computed but not counted). No host sync."""
    n, device = start_obs.shape[0], start_obs.device
    obs = start_obs
    alive = torch.ones(n, dtype=torch.bool, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    observations, actions, rewards, next_observations = [], [], [], []
    for _ in range(horizon):
        action = policy.sample(obs, generator)
        step = model_step(model, obs, action, termination, generator)
        observations.append(obs)
        actions.append(action)
        rewards.append(torch.where(alive, step.rewards, 0.0))  # a model past a terminal state may give NaN
        next_observations.append(step.next_observations)
        lengths += alive
        alive = alive & ~step.terminals
        obs = step.next_observations
    rewards_t = torch.stack(rewards, dim=1)
    return Rollouts(torch.stack(observations, 1), torch.stack(actions, 1), rewards_t, torch.stack(next_observations, 1),
                    ~alive, lengths, rewards_t.sum(dim=1))


def above_threshold(returns: torch.Tensor, threshold: float) -> torch.Tensor:
    """Indices of the rollouts whose return is strictly greater than `threshold` (the reference's rule)."""
    return torch.nonzero(returns > threshold).squeeze(-1)


def to_dataset(rollouts: Rollouts, metadata: dict | None = None) -> Dataset:
    """The rollouts as an offrl Dataset: one episode per rollout, a terminal on the last row of one that
    reached a terminal state, a timeout on the last row of the others."""
    lengths = rollouts.lengths.cpu().numpy()
    horizon = rollouts.rewards.shape[1]
    mask = (np.arange(horizon)[None, :] < lengths[:, None]).reshape(-1)
    flat = lambda x: x.cpu().numpy().reshape(len(lengths) * horizon, *x.shape[2:])[mask].astype(np.float32)  # noqa: E731
    ends = np.cumsum(lengths) - 1
    terminals = np.zeros(int(lengths.sum()), np.float32)
    terminated = rollouts.terminated.cpu().numpy()
    terminals[ends[terminated]] = 1.0
    timeouts = np.zeros_like(terminals)
    timeouts[ends[~terminated]] = 1.0
    return Dataset(flat(rollouts.observations), flat(rollouts.actions), flat(rollouts.rewards),
                   flat(rollouts.next_observations), terminals, timeouts,
                   np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64), dict(metadata or {})).validate("rollouts")


class RolloutCollector:
    """Rollout epochs until enough rollouts pass the threshold; checkpointable between epochs."""

    def __init__(self, model: DynamicsEnsemble, termination: TerminationFn, start_obs: torch.Tensor, horizon: int,
                 threshold: float, cfg: Config, seed: int):
        self.model, self.termination, self.start_obs, self.horizon = model, termination, start_obs, horizon
        self.threshold, self.cfg = threshold, cfg
        self.generator = torch.Generator(device=start_obs.device).manual_seed(seed)
        self.kept: list[Rollouts] = []
        self.all_returns: list[torch.Tensor] = []
        self.epochs = 0

    @property
    def kept_count(self) -> int:
        return sum(len(k) for k in self.kept)

    @property
    def done(self) -> bool:
        return self.kept_count >= self.cfg.num_trajectories or self.epochs >= self.cfg.max_rollout_epochs

    def epoch(self, policy: generative.BehaviourPolicy) -> None:
        pick = torch.randint(len(self.start_obs), (self.cfg.rollout_batch,), device=self.start_obs.device,
                             generator=self.generator)
        batch = rollout_full(self.model, policy, self.start_obs[pick], self.horizon, self.termination, self.generator)
        self.all_returns.append(batch.returns)
        keep = above_threshold(batch.returns, self.threshold)
        if len(keep):
            self.kept.append(batch.select(keep))
        self.epochs += 1

    def kept_rollouts(self) -> Rollouts | None:
        return Rollouts.cat(self.kept) if self.kept else None

    def summary(self) -> dict[str, float]:
        returns = torch.cat(self.all_returns).cpu().numpy() if self.all_returns else np.zeros(0)
        kept = self.kept_rollouts()
        out = {"rollouts/epochs": self.epochs, "rollouts/made": len(returns), "rollouts/kept": self.kept_count,
               "rollouts/threshold": self.threshold}
        if len(returns):
            out |= {f"rollouts/return_{name}": float(f(returns)) for name, f in
                    (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max))}
            out |= {f"rollouts/return_q{q}": float(np.quantile(returns, q / 100)) for q in (50, 90, 99)}
        if kept is not None:
            kept_returns = kept.returns.cpu().numpy()
            out |= {"rollouts/kept_return_mean": float(kept_returns.mean()), "rollouts/kept_return_max": float(kept_returns.max())}
        return out

    def state_dict(self) -> dict:
        kept = self.kept_rollouts()
        return {"generator": self.generator.get_state(), "epochs": self.epochs,
                "all_returns": torch.cat(self.all_returns) if self.all_returns else torch.zeros(0),
                "epoch_sizes": torch.tensor([len(r) for r in self.all_returns], dtype=torch.long),
                "kept": {k: v for k, v in vars(kept).items()} if kept is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        ckpt.restore_generator(self.generator, state["generator"])
        self.epochs = int(state["epochs"])
        self.all_returns = list(torch.split(state["all_returns"], state["epoch_sizes"].tolist())) if self.epochs else []
        self.kept = [Rollouts(**state["kept"])] if state["kept"] else []


class RCSLSlot:
    """The RCSL agent, built once the rollouts are in (the checkpoint rebuilds it from them). Its state also
    holds the conditioning target and return scale, so that `offrl eval` can act without the rollouts."""

    def __init__(self, build):
        self.build, self.agent = build, None

    def state_dict(self) -> dict:
        if self.agent is None:
            return {}
        return {**self.agent.state_dict(), "target_return": self.agent.target_return,
                "rtg_scale": float(self.agent.policy.rtg_scale)}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.agent = self.build()
            self.agent.load_state_dict(state)


class EvalAgent:
    """For `offrl eval`: the RCSL policy of a saved run (its best hold-out weights) and its target."""

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg, self.data, self.device = cfg, data, device
        self.policy, self.target_return = None, None

    def load_state_dict(self, state: dict) -> None:
        if not state:
            raise OffrlError("mbrcsl: this checkpoint was saved before the RCSL phase; nothing to evaluate yet")
        dim = self.data.obs_dim
        normalizer = StateNormalizer(np.zeros(dim, np.float32), np.ones(dim, np.float32), self.device)
        self.policy = rcsl.RCSLPolicy(dim, self.data.act_dim, rcsl_config(self.cfg, float(state["rtg_scale"])), 1,
                                      normalizer, self.data.action_low, self.data.action_high).to(self.device)
        self.policy.load_state_dict(state["policy"])
        if state["best_state"]:
            self.policy.net.load_state_dict(state["best_state"])
        self.target_return = float(state["target_return"])


def eval_setup(cfg: Config, device: torch.device) -> tuple[EvalAgent, dict]:
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed, check_options=False)
    return EvalAgent(cfg, data, device), data.metadata


def eval_policies(cfg: Config, agent: EvalAgent, metadata: dict, targets=None) -> dict:
    """The RCSL policy conditioned on the best kept return (or on each of `targets`)."""
    from offrl.eval_run import target_policies

    return target_policies(targets or [agent.target_return], agent.policy.actor)


class FixedPolicy:
    """A loaded behaviour-policy file in the place of a trainer (nothing to checkpoint)."""

    def __init__(self, policy: generative.BehaviourPolicy):
        self.policy = policy

    def sampler(self) -> generative.BehaviourPolicy:
        return self.policy

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def return_scale(returns: np.ndarray) -> float:
    """RCSL's default return-to-go scale: the largest absolute return of the kept rollouts (1 if all are 0). The
    magnitude, not the best return: with mostly negative rewards that can be <= 0, and a scale floored at a tiny
    positive number blew the conditioning inputs up by ~1e6."""
    largest = float(np.abs(returns).max())
    return largest if largest > 0 else 1.0


def rcsl_config(cfg: Config, rtg_scale: float) -> rcsl.Config:
    o = cfg.rcsl
    return rcsl.Config(steps=cfg.steps, batch_size=o.batch_size, hidden=o.hidden, lr=o.lr, weight_decay=o.weight_decay,
                       decoupled_weight_decay=o.decoupled_weight_decay, conditioning="rtg", head="deterministic",
                       rtg_scale=rtg_scale, holdout_ratio=o.holdout_ratio, holdout_every=o.holdout_every,
                       patience=o.patience, run=cfg.run)


def best_episode_return(cfg: Config, data: TrainingData) -> float:
    """The default threshold: the data's best return over whole recorded episodes. A D4RL .hdf5 file read in
    Q-learning form (as MBRCSL trains its model on it) lacks each timed-out episode's last row and its
    reward, so there the file is read again as recorded; rollouts run the whole horizon and collect that
    reward too."""
    dataset = data.dataset
    if dataset.metadata.get("source", "").startswith("d4rl-hdf5:") and dataset.metadata.get("rows") != "trajectories":
        dataset = load_dataset(cfg.dataset, env_id=cfg.data.env_id, d4rl_trajectories=True)
    return float(dataset.episode_returns().max())


def rollout_horizon(cfg: Config, data: TrainingData) -> int:
    if cfg.horizon:
        return cfg.horizon
    from offrl.evaluation import make_env

    env = make_env(data.metadata)
    limit = env.spec.max_episode_steps if env.spec is not None else None
    env.close()
    return int(limit or data.dataset.episode_lengths().max())


def train(cfg: Config) -> dict:
    rcsl.check_patience(cfg.rcsl.patience, "--rcsl.patience")
    if cfg.behaviour_policy:  # the file's policy is rolled out: --behaviour.* would be recorded as applied
        default = generative.BehaviourConfig()
        refuse_unused_options([(f"--behaviour.{f.name.replace('_', '-')}", "acts only without --behaviour-policy")
                               for f in fields(default) if getattr(cfg.behaviour, f.name) != getattr(default, f.name)],
                              "the file's policy is rolled out, not trained: drop the --behaviour.* options")
    refuse_weighted_sampling(cfg.data, "mbrcsl", "uniformly drawn rollout starts and rows of its rollout data")
    rcsl.warn_eval_every(cfg.eval.every, "mbrcsl")
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    ModelData.check_raw(data, "mbrcsl", cfg)
    behaviour_steps = 0 if cfg.behaviour_policy else cfg.behaviour.steps
    run = Run("mbrcsl", cfg, data, total_steps=behaviour_steps + cfg.steps)
    device = run.device
    dataset = data.dataset

    model, model_file, termination = load_dynamics(data, cfg, run)

    observations = torch.as_tensor(dataset.observations, device=device)
    actions = torch.as_tensor(dataset.actions, device=device)
    if cfg.behaviour_policy:
        behaviour_file = cfg.behaviour_policy.replace("{seed}", str(cfg.seed))
        loaded, _, _ = generative.load(behaviour_file, device)
        if (loaded.obs_dim, loaded.act_dim) != (dataset.obs_dim, dataset.act_dim):
            raise OffrlError(f"--behaviour-policy {behaviour_file}: acts on {loaded.obs_dim}-dim states and "
                             f"{loaded.act_dim}-dim actions, the dataset has {dataset.obs_dim} and {dataset.act_dim}")
        behaviour = FixedPolicy(loaded)
    else:
        mean, std = state_stats(dataset.observations)
        with seeded_cpu_init(cfg.seed):
            policy = generative.build(cfg.behaviour, dataset.obs_dim, dataset.act_dim, mean, std, data.action_low,
                                      data.action_high).to(device)
        behaviour = generative.BehaviourTrainer(policy, cfg.behaviour, observations, actions, seed=cfg.seed)

    threshold = cfg.threshold if cfg.threshold is not None else best_episode_return(cfg, data)
    horizon = rollout_horizon(cfg, data)
    starts = observations[torch.as_tensor(dataset.episode_starts, device=device)]
    collector = RolloutCollector(model, termination, starts, horizon, threshold, cfg, seed=cfg.seed + 1)

    def build_rcsl() -> rcsl.RCSL:
        kept = to_dataset(collector.kept_rollouts(), data.metadata)
        rtg_scale = cfg.rcsl.rtg_scale or return_scale(kept.episode_returns())
        mean, std = state_stats(kept.observations)
        agent = rcsl.RCSL(rcsl_config(cfg, rtg_scale), normalize_states(kept, mean, std), StateNormalizer(mean, std, device),
                          data.action_low, data.action_high, device, cfg.seed)
        agent.target_return = float(collector.kept_rollouts().returns.max())
        return agent

    def collect_rollouts(done_step: int) -> dict:
        """Rollout epochs until the collector is done, checkpointed as step `done_step`; the kept rollouts
        go to <run>/rollouts.npz. No kept rollout ends the run with an error."""
        while not collector.done:
            collector.epoch(behaviour.sampler())
            if collector.epochs % 10 == 0 or collector.done:
                print(f"mbrcsl rollouts: epoch {collector.epochs}, {collector.kept_count} kept of "
                      f"{collector.epochs * cfg.rollout_batch}", file=sys.stderr, flush=True)
                run.checkpoint(done_step, force=True)
            run.stop_if_signalled(done_step)
        summary = collector.summary()
        run.log_values(done_step + 1, summary)
        if collector.kept_count == 0:  # the record of what was made, marked failed: a sweep runs it again
            run.finish({**summary, **model_summary(model_file, model), "failed": "no rollout passed the threshold"})
            raise OffrlError(f"mbrcsl: none of {summary['rollouts/made']} rollouts passed the threshold {threshold:.2f} "
                             f"(best rollout return {summary.get('rollouts/return_max', float('nan')):.2f}); RCSL was "
                             "not trained. Lower --threshold or raise --max-rollout-epochs")
        if collector.kept_count < cfg.num_trajectories:
            print(f"warning: only {collector.kept_count} of {cfg.num_trajectories} wanted rollouts passed the "
                  f"threshold in {collector.epochs} epochs; RCSL trains on those", file=sys.stderr)
        to_dataset(collector.kept_rollouts(), {**data.metadata, "name": f"{cfg.dataset} (MBRCSL rollouts)"}).save_npz(
            str(run.dir / "rollouts.npz"))
        return summary

    slot = RCSLSlot(build_rcsl)
    # the dynamics model too: a resume during the rollouts uses the model the run started with
    state = {"behaviour": behaviour, "rollouts": collector, "agent": slot, "dynamics_model": model}
    print(f"mbrcsl: threshold {threshold:.2f}, horizon {horizon}, rollouts of {cfg.rollout_batch} until "
          f"{cfg.num_trajectories} kept (at most {cfg.max_rollout_epochs} epochs), model {model_file}", file=sys.stderr)
    step = run.start_step
    for step in run.steps(state):
        if step <= behaviour_steps:  # phase 1: behaviour cloning
            with run.precision():
                metrics = behaviour.update()
            run.log(step, metrics)
            if step == behaviour_steps:
                generative.save(run.dir / "behaviour.pt", behaviour.sampler(), cfg.behaviour,
                                {"dataset": cfg.dataset, "seed": cfg.seed, "steps": behaviour_steps})
                run.evaluate(step, behaviour.sampler(), data.metadata, force=True, prefix="behaviour")
                run.checkpoint(step, force=True)
            else:
                run.checkpoint(step, state)
            continue
        if slot.agent is None:  # phase 2: rollouts in the model, resumable between epochs
            collect_rollouts(step - 1)
            slot.agent = build_rcsl()
        agent = slot.agent  # phase 3: RCSL on the kept rollouts
        if agent.stopped:  # the checkpoint resumed was written at the early stop: nothing more to train
            step -= 1
            break
        if rcsl.run_step(run, agent, step, step - behaviour_steps, state):
            break
    agent = slot.agent
    if agent is None:  # --steps 0: the behaviour policy and the rollouts only
        summary = collect_rollouts(behaviour_steps)
        run.checkpoint(behaviour_steps, state, force=True)  # a resume with more --steps trains RCSL on them
        print(f"mbrcsl: --steps 0, RCSL not trained; {collector.kept_count} kept rollouts in {run.dir / 'rollouts.npz'}")
        return run.finish({**summary, **model_summary(model_file, model)})
    agent.restore_best()
    target = agent.target_return
    run.evaluate(step, agent.policy.actor(target), data.metadata, force=True)
    return run.finish({**collector.summary(), "target_return": target, **model_summary(model_file, model),
                       "rcsl_steps": step - behaviour_steps, "best_holdout_loss": agent.best_holdout_loss})


if __name__ == "__main__":
    cli_main(Config, train)
