"""WSRL: "Efficient Online Reinforcement Learning Fine-Tuning Need Not Retain Offline Data" (Zhou, Peng, Li,
Levine, Kumar; arXiv 2412.07762, 2024).

Offline-to-online fine-tuning that keeps no offline data. Start from an actor-critic pre-trained offline
(locomotion: CQL with a 10-critic LayerNorm ensemble; AntMaze, Kitchen, Adroit: Cal-QL; both are
algos/cql.py, see its docstring for the pre-training command; the online options here are the locomotion
recipe's: the reference's AntMaze fine-tuning also backs up the max over sampled actions, uses a
state-independent std and a 4x256 critic beside a 2x256 policy, which this file does not offer), then
  1. warm-up: `warmup_steps` env steps with the frozen pre-trained policy (actions sampled from it) and no
     gradient step; they fill a fresh online replay buffer, so the first updates see the pre-trained policy's
     own data rather than a handful of transitions (the paper's remedy for the collapse that fine-tuning
     without offline data otherwise suffers at its start);
  2. online SAC on that buffer alone (`offline_ratio` 0), at UTD 4: every env step one batch of B = 1024
     transitions is drawn; its `utd` slices of B / utd rows each take one critic step (and a Polyak update),
     then the whole batch one actor and one temperature step (the reference's `update_high_utd`).
Updates start after max(warmup_steps, the online rows of one batch) env steps (the reference's rule).

Critic (E = 10 critics with LayerNorm, target over a random draw J of 2 of them, no entropy in the target):
    y   = r + gamma * (1 - d) * min_{j in J} Q_targ_j(s', a'),   a' ~ pi(.|s')
    L_Q = sum_i mean (Q_i(s, a) - y)^2
Actor (tanh-Gaussian with LayerNorm): L_pi = mean (alpha * log pi(a~|s) - min_i Q_i(s, a~)), all E critics;
temperature: L_alpha = -mean log_alpha * (log pi(a~|s) - |A|).  (`offrl.sac.SACAgent` with WSRL's options.)

Baselines, through this same entry point with the same env-step budget and seeds:
    --offline-ratio 0.5     fine-tuning that retains the offline data: half of every critic slice and of the
                            actor batch comes from the dataset
    --warmup-steps 0        fine-tuning without warm-up (updates start once a batch's online rows exist)
    --checkpoint none       SAC from scratch: fresh networks, `warmup_steps` uniform-random actions first
                            (SAC's learning_starts), then the same updates
`python -m benchmarks.wsrl_plot <run folders>` draws their learning curves.

Defaults (docs/FACTS.md section 14; the reference's `locomotion_wsrl` config and `launch_wsrl_finetune.sh`):
2x256 ReLU networks with LayerNorm, 10 critics with subsample 2, actor lr 1e-4, critic lr 3e-4, temperature
lr 1e-4, gamma 0.99, tau 5e-3, target entropy -|A|, no entropy backup, UTD 4, batch 1024, warm-up 5000,
500k online env steps, deterministic evaluation of 20 episodes every 20k env steps. The pre-trained
checkpoint's actor, critics, target critics, temperature and Adam states are loaded (the reference restores
the whole train state); learning rates are this config's. The run also evaluates at step 0, before any
online step: the pre-trained policy's score starts the learning curve.

Deviations from the reference (github.com/zhouzypaul/wsrl, JAX):
- each critic has its own output layer; the reference's `ensemblize` wraps only the critics' hidden
  layers, so its 10 members share one 256 -> 1 output layer (each keeps its hidden layers and LayerNorm
  affine). Ours are independent critics, as REDQ and the paper describe them; the reference's members start
  more alike and its pessimism (the 2-of-10 target min, the actor's min over 10) may differ;
  `--shared-critic-output` (here and in the CQL pre-training) builds them as the reference's code does;
- the update is what the reference means, not what its optimizer computes: its `update_high_utd` calls
  the whole train state's update 5 times per env step, and optax's Adam still moves a network given a zero
  gradient (momentum); so per env step its actor and temperature take 4 momentum-only steps before their
  real one and its critics one more after their 4 (about 2.2x and 1.1x the effective step size, by a
  scalar Adam simulation). Here each takes exactly its own steps; `--reference-optimizer-steps` takes the
  reference's extra ones too;
- temperature: offrl's log-alpha loss on log pi(a~|s) at the batch's states; the reference trains a
  softplus-parameterized multiplier on alpha * (entropy - target) with the entropy of pi(.|s'); both move
  alpha the same way;
- critic loss summed over the E critics (the reference averages): E times the gradient, which Adam
  normalizes away up to its epsilon;
- exactly `warmup_steps` env steps go without an update (the reference's `<=` makes it warmup_steps + 1);
- with `--offline-ratio r`, every critic slice holds the fraction r of offline rows; the reference
  concatenates [online, offline] and slices that, so with UTD 4 and r = 0.5 two critic steps see only
  online rows and two only offline rows;
- PyTorch's default initialization (the reference scales the last hidden layer by 1e-2; only
  `--checkpoint none` starts from an initialization), log-std clamped to [-5, 2] (reference: std in
  [1e-5, 10]), actions not clipped to +-0.99999 (the tanh policy stays in the box);
- states raw and rewards transformed as the dataset was (`--data.*` must match the pre-training's,
  `--data.normalize-states` is refused); the reference's sparse-reward options are not here.
`--run.compile` compiles the critics and their targets (their LayerNorm, affine and ReLU work fuses;
`python -m benchmarks.speed --algos wsrl [--compile]` times yours). The actor step reads the critics frozen
(`offrl.nets.frozen`): a compiled critic's backward would otherwise compute the 10 critics' weight gradients
that the actor loss discards (on a 2-core AMD EPYC at one thread, bf16 and compiled, an update took 76-81 ms
with it against 111-147 ms without). Through the frozen critics Inductor saved every ReLU mask as a bool
tensor, which its CPU kernels store and load slowly; `offrl.compiling` has them recomputed instead. On one
thread of a 2-core Xeon with AMX, bf16, an update took 103.9 ms eager and 55.9 ms compiled
(results/speed-bf16.md; before that fix 114.7 ms eager and 130.6 compiled).
Resume restores networks, optimizers, both replay buffers' sampling state, the online rows, the env's
simulator state and RNGs, so a resumed run continues the same curve (CPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from offrl import checkpoint as ckpt
from offrl.compiling import compile_module
from offrl.config import EvalConfig, TrainConfig
from offrl.data import Batch, ReplayBuffer, Spaces, TrainingData, load_for_training
from offrl.data.preprocess import refuse_weighted_sampling
from offrl.errors import CheckpointError, OffrlError
from offrl.eval_run import checkpoint_of
from offrl.evaluation import make_env
from offrl.online import EnvLoop
from offrl.run import Run, cli_main
from offrl.sac import SACAgent

STEP_UNIT = "env steps"  # --steps counts env steps (what benchmarks.table and benchmarks.plots say)


@dataclass
class Config(TrainConfig):
    checkpoint: Optional[str] = None
    """Pre-trained offrl run to fine-tune (its folder or a checkpoint file: cql, Cal-QL, sac, any actor-critic whose
    networks fit the options below; '{seed}' in it becomes --seed, for sweeps), or 'none' for SAC from scratch.
    Must be given."""
    steps: int = 500_000
    """Online env steps, warm-up included."""
    warmup_steps: int = 5_000
    """Env steps with the frozen pre-trained policy (uniform-random actions with --checkpoint none) before updates."""
    offline_ratio: float = 0.0
    """Fraction of every batch drawn from the dataset (0: no offline data kept, WSRL; 0.5: the retaining baseline)."""
    utd: int = 4
    """Critic updates per env step: the batch is cut into this many slices, one critic step each."""
    batch_size: int = 1024
    """Transitions drawn per env step (one actor step on all of them; critic slices of batch_size / utd)."""
    buffer_size: int = 1_000_000
    """Online replay capacity (the reference's 2M never fills in 500k steps; any capacity >= --steps is the same)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics (must match the pre-trained checkpoint's)."""
    num_critics: int = 10
    """Q ensemble size (must match the checkpoint's)."""
    critic_subsample: Optional[int] = 2
    """Critics drawn at random (with replacement) for the target's min; None: all."""
    layer_norm: bool = True
    """LayerNorm in the critics' hidden layers (must match the checkpoint's)."""
    actor_layer_norm: bool = True
    """LayerNorm in the policy's hidden layers (must match the checkpoint's)."""
    shared_critic_output: bool = False
    """The critics share one output layer, as in the reference's code (must match the checkpoint's)."""
    actor_lr: float = 1e-4
    """Adam learning rate of the policy."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    alpha_lr: float = 1e-4
    """Adam learning rate of the entropy temperature."""
    init_alpha: float = 1.0
    """Initial temperature of fresh networks (a checkpoint's own temperature is kept)."""
    target_entropy: Optional[float] = None
    """Target entropy (default -action_dim)."""
    reference_optimizer_steps: bool = False
    """Step the optimizers as the reference's code does rather than as it means to: its `update_high_utd` updates
    the whole train state 5 times per env step and optax's Adam moves a network on a zero gradient, so the actor
    and temperature also take a momentum-only step beside each of the 4 critic steps, and the critics one beside
    the actor's (no Polyak update with it)."""
    backup_entropy: bool = False
    """Put -alpha log pi(a'|s') in the TD target (WSRL: no)."""
    gamma: float = 0.99
    """Discount."""
    tau: float = 5e-3
    """Polyak rate of the target critics."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=20_000, episodes=20))
    """Evaluation every 20k env steps with 20 episodes."""


def from_pretrained(cfg: Config) -> bool:
    return cfg.checkpoint is not None and cfg.checkpoint.lower() != "none"


def slice_sizes(cfg: Config) -> tuple[int, int]:
    """(online rows, offline rows) of one critic slice."""
    rows = cfg.batch_size // cfg.utd
    offline = int(rows * cfg.offline_ratio)
    return rows - offline, offline


def learning_starts(cfg: Config) -> int:
    """Env steps without updates: the warm-up, and at least one batch's online rows (the reference's rule)."""
    return max(cfg.warmup_steps, cfg.utd * slice_sizes(cfg)[0])


def concat(batches: list[Batch]) -> Batch:
    return Batch(*(torch.cat(rows) for rows in zip(*batches)))


def sample_slices(online: ReplayBuffer, offline: ReplayBuffer | None, cfg: Config) -> list[Batch]:
    """`utd` critic slices, each with its online rows followed by its offline rows; with no offline rows
    (offline_ratio 0) the offline buffer is never read."""
    sizes = zip(slice_sizes(cfg), (online, offline))
    parts = [[Batch(*rows) for rows in zip(*(t.chunk(cfg.utd) for t in buffer.sample(cfg.utd * n)))]
             for n, buffer in sizes if n > 0]
    return [slices[0] if len(slices) == 1 else concat(list(slices)) for slices in zip(*parts)]


class WSRL(SACAgent):
    """SAC (`offrl.sac`) with WSRL's ensemble, LayerNorm and target; `update` takes a UTD step."""

    VALUES = (*SACAgent.VALUES, "critic_updates", "actor_updates", "pretrained")

    def __init__(self, cfg: Config, spaces: Spaces | TrainingData, device: torch.device):
        self.cfg = cfg
        super().__init__(spaces.obs_dim, spaces.act_dim, spaces.action_low, spaces.action_high, device, cfg.hidden,
                         cfg.actor_lr, cfg.critic_lr, cfg.alpha_lr, cfg.init_alpha, True, cfg.target_entropy, cfg.gamma,
                         cfg.tau, cfg.num_critics, cfg.layer_norm, cfg.actor_layer_norm, cfg.critic_subsample,
                         cfg.backup_entropy, cfg.shared_critic_output, cuda_graph=cfg.run.cuda_graph)
        self.critic_updates, self.actor_updates = 0, 0
        self.pretrained = ""  # JSON: the checkpoint the networks came from
        if cfg.run.compile:
            # The 10 LayerNorm critics' elementwise work (LayerNorm, its affine, ReLU and their gradients) is
            # about half of an update on the CPU; compiled, it fuses. Module.compile keeps the state_dict keys.
            compile_module(self.critic)
            compile_module(self.critic_target)

    def update(self, slices: list[Batch]) -> dict[str, torch.Tensor]:
        """One critic step per slice, then one actor and temperature step on all of them (with
        --reference-optimizer-steps, the reference's momentum-only steps beside them)."""
        critic = []
        for batch in slices:
            # a clone: on CUDA the step's metrics are its graph's outputs, which the next slice's replay overwrites
            critic.append({name: value.clone() for name, value in self.critic_step(batch).items()})
            if self.cfg.reference_optimizer_steps:
                zero_gradient_step(self.actor_opt)
                zero_gradient_step(self.alpha_opt)
        metrics = {name: torch.stack([m[name] for m in critic]).mean() for name in critic[0]}
        metrics |= self.actor_step(concat(slices))
        if self.cfg.reference_optimizer_steps:
            zero_gradient_step(self.critic_opt)
        self.critic_updates += len(slices)
        self.actor_updates += 1
        return metrics


def zero_gradient_step(optimizer: torch.optim.Optimizer) -> None:
    """An Adam step on zero gradients, as optax takes for a network its loss does not reach: the moments decay
    and the parameters still move by the first moment."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


Agent = WSRL


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One fine-tuning update (UTD critic steps, one actor step) as `train` runs it after the warm-up, with the
    dataset standing in for the online buffer (for benchmarks/speed.py; no env steps)."""
    agent = WSRL(cfg, data, device)
    online = ReplayBuffer.from_dataset(data.dataset, device, seed=0)
    offline = ReplayBuffer.from_dataset(data.dataset, device, seed=1) if cfg.offline_ratio > 0 else None
    return lambda: agent.update(sample_slices(online, offline, cfg))


def check_pretraining(saved: dict, cfg: Config, env_id: str | None, file) -> None:
    """The checkpoint must come from this dataset (or env) with the same reward transform and raw states."""
    if saved.get("dataset") not in (None, cfg.dataset):
        raise CheckpointError(f"checkpoint {file} was pre-trained on {saved['dataset']}; fine-tune it with "
                              f"--dataset {saved['dataset']}")
    if saved.get("env_id") not in (None, env_id):
        raise CheckpointError(f"checkpoint {file} was trained in {saved['env_id']}, the dataset's env is {env_id}")
    data = saved.get("data", {})
    if data.get("normalize_states"):
        raise CheckpointError(f"checkpoint {file} was pre-trained with --data.normalize-states; wsrl fine-tunes on "
                              "raw states (as the reference): pre-train without it")
    for key in ("normalize_reward", "reward_scale", "reward_bias"):
        if key in data and data[key] != getattr(cfg.data, key):
            flag = f"--data.{key.replace('_', '-')}"
            raise CheckpointError(f"checkpoint {file} was pre-trained with {flag} {data[key]}, this run has "
                                  f"{getattr(cfg.data, key)}: the online rewards must be transformed alike")


def pretrained_path(checkpoint: str, seed: int) -> str:
    """--checkpoint for this seed: '{seed}' in it becomes the seed (a sweep's one template for all seeds)."""
    return checkpoint.replace("{seed}", str(seed))


def load_pretrained(agent: WSRL, path: str, cfg: Config, env_id: str | None = None) -> dict:
    """Load an offrl training checkpoint's actor, critics, target critics, temperature and Adam states into
    `agent` (learning rates stay this config's). Returns where they came from."""
    state, file = ckpt.load_or_previous(checkpoint_of(path), map_location=agent.log_alpha.device)
    algo, objects = state.get("algo"), state.get("objects", {}).get("agent")
    if not isinstance(objects, dict) or not {"actor", "critic"} <= set(objects):
        raise CheckpointError(f"checkpoint {file}: no actor and critics to fine-tune (algo {algo!r}); "
                              "wsrl starts from an actor-critic run such as cql or sac")
    saved = json.loads(state.get("config", "{}"))
    check_pretraining(saved, cfg, env_id, file)
    objects = {"critic_target": objects["critic"], **objects}
    names = [("actor", None), ("critic", None), ("critic_target", None), ("actor_opt", cfg.actor_lr),
             ("critic_opt", cfg.critic_lr), ("alpha_opt", cfg.alpha_lr)]
    for name, lr in names:
        if name not in objects:  # e.g. a checkpoint without optimizer states: fresh Adam
            continue
        target = getattr(agent, name)
        try:
            ckpt.load_state(target, objects[name])  # keeps the capturable flags this process built
        except (RuntimeError, ValueError, KeyError) as exc:
            arch = {k: saved[k] for k in ("hidden", "num_critics", "layer_norm", "actor_layer_norm",
                                          "shared_critic_output") if k in saved}
            raise CheckpointError(f"checkpoint {file} ({algo}): its {name} does not fit wsrl's networks "
                                  f"({str(exc).strip().splitlines()[0]}); give wsrl the pre-training's network "
                                  f"options (the checkpoint's: {arch or 'not recorded'})") from None
        if lr is not None:
            for group in target.param_groups:
                group["lr"] = lr
    if "log_alpha" in objects:
        with torch.no_grad():
            agent.log_alpha.copy_(objects["log_alpha"])
    info = {"file": str(file), "algo": algo, "step": int(state.get("step", 0))}
    agent.pretrained = json.dumps(info)
    return info


def check_config(cfg: Config) -> None:
    if cfg.checkpoint is None:
        raise OffrlError("wsrl needs --checkpoint: a pre-trained run folder or checkpoint file (e.g. of `offrl train "
                         "cql --num-critics 10 --layer-norm --actor-layer-norm ...`), or 'none' for SAC from scratch")
    if cfg.utd < 1 or cfg.batch_size % cfg.utd:
        raise OffrlError(f"--batch-size {cfg.batch_size} must be a multiple of --utd {cfg.utd} (>= 1)")
    if not 0.0 <= cfg.offline_ratio <= 1.0 or (cfg.offline_ratio > 0 and slice_sizes(cfg)[1] == 0):
        raise OffrlError(f"--offline-ratio {cfg.offline_ratio}: must lie in [0, 1] and give at least one offline row "
                         f"in each critic slice of {cfg.batch_size // cfg.utd}")
    if cfg.warmup_steps < 0:
        raise OffrlError(f"--warmup-steps {cfg.warmup_steps}: must be >= 0")
    if cfg.data.normalize_states:
        raise OffrlError("--data.normalize-states: wsrl fine-tunes on raw states (as the reference)")
    if slice_sizes(cfg)[1] == 0:  # --offline-ratio 0: no dataset row is read, so options on the rows would do nothing
        refuse_weighted_sampling(cfg.data, "wsrl", "online rows only (--offline-ratio 0)")
        if cfg.data.corrupt is not None and not (cfg.data.corrupt == "rewards" and cfg.data.normalize_reward):
            # (corrupted rewards still set --data.normalize-reward's scale of the online rewards)
            raise OffrlError(f"--data.corrupt {cfg.data.corrupt}: wsrl reads no dataset rows at --offline-ratio 0 "
                             "(online rows only): drop it, or mix the corrupted data in with --offline-ratio")
        if cfg.data.clip_actions:
            raise OffrlError("--data.clip-actions: wsrl reads no dataset rows at --offline-ratio 0 and does not clip "
                             "its online actions: drop it")


def train(cfg: Config) -> dict:
    check_config(cfg)
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    pretrained = from_pretrained(cfg)
    path = pretrained_path(cfg.checkpoint, cfg.seed) if pretrained else None
    # a checkpoint that does not fit is refused before a run folder is made (a resumed run restores its own
    # state, so there only a checkpoint still on disk is checked)
    if pretrained and (not cfg.resume or Path(path).exists()):
        load_pretrained(WSRL(cfg, data, torch.device("cpu")), path, cfg, data.metadata.get("env_id"))
    run = Run("wsrl", cfg, data)
    loop = EnvLoop(make_env(data.metadata), cfg.seed)
    agent = WSRL(cfg, data, run.device)
    if pretrained and run.start_step == 0:  # a resumed run restores its own state instead
        load_pretrained(agent, path, cfg, data.metadata.get("env_id"))
    online = ReplayBuffer(data.obs_dim, data.act_dim, cfg.buffer_size, run.device, seed=cfg.seed)
    state = {"agent": agent, "buffer": online, "loop": loop}
    offline = None
    if slice_sizes(cfg)[1] > 0:  # with offline_ratio 0 the dataset is only the env and its reference scores
        offline = state["offline_buffer"] = data.buffer(run.device, seed=cfg.seed + 1)
    scale, bias = data.preprocessing.reward_scale, data.preprocessing.reward_bias
    starts = learning_starts(cfg)
    steps = run.steps(state)
    if run.start_step > 0 and not loop.restored_exactly:
        loop.restart(run.start_step)
    if run.start_step == 0:  # the policy before any online step starts the curve
        run.evaluate(0, agent.act, data.metadata, force=True)
    for step in steps:
        if step <= cfg.warmup_steps and not pretrained:
            action = loop.env.action_space.sample()
        else:
            obs = torch.as_tensor(loop.obs, dtype=torch.float32, device=run.device).unsqueeze(0)
            action = agent.explore(obs)[0].cpu().numpy()
        finished = loop.step(action, online, scale, bias)
        if finished is not None:
            run.log_values(step, finished)
        if step > starts:
            with run.precision():
                metrics = agent.update(sample_slices(online, offline, cfg))
            run.log(step, metrics)
        run.evaluate(step, agent.act, data.metadata)
        run.checkpoint(step, state)
    loop.env.close()
    return run.finish({"pretrained": json.loads(agent.pretrained) if agent.pretrained else None,
                       "learning_starts": starts, "critic_updates": agent.critic_updates,
                       "actor_updates": agent.actor_updates})


if __name__ == "__main__":
    cli_main(Config, train)
