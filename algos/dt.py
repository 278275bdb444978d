"""Decision Transformer: "Reinforcement Learning via Sequence Modeling" (Chen et al., NeurIPS 2021).

A causal transformer over the last K steps' (return-to-go, state, action) tokens predicts each
action from its state token; at evaluation it is conditioned on a target return, decremented by
each reward received.

    tokens  = (R_1, s_1, a_1, ..., R_K, s_K, a_K),  each modality its own linear embedding, plus a learned
              timestep embedding, then LayerNorm
    a_hat_t = tanh(W h(s_t))                          (h: the transformer output at s_t's token)
    L       = mean over unpadded t and action dims of (a_hat_t - a_t)^2    (in the unit action box [-1, 1])

Defaults (docs/FACTS.md section 6, official code): 3 layers, 1 head, width 128, context K = 20, dropout 0.1,
ReLU MLPs of width 4*128, AdamW lr 1e-4 with weight decay 1e-4, linear warm-up over 10k steps,
grad-norm clip 0.25, batch 64, 100k steps, returns-to-go undiscounted and divided by 1000, states
normalized with std + 1e-6, 100 evaluation episodes. Evaluation runs two targets, the first being the
run's score: on D4RL locomotion files the paper's (hopper 3600 and 1800, walker2d 5000 and 2500,
halfcheetah 12000 and 6000, as CORL); on data without published targets (the offrl suite, Minari, your
own) the dataset's expert reference return (ref_max_score) and half of it; --target-return X: X and X/2.

Deviations: a plain-PyTorch pre-LN transformer (GPT-2's layout: attention and MLP blocks with residual
dropout, final LayerNorm) instead of HuggingFace GPT-2 (padding is masked out of attention and the loss
in both); the loss is taken in the unit action box (identical for [-1, 1] boxes); on the CPU the
embedding, residual, MLP and attention dropout masks come from `offrl.nets.Dropout` (cheaper random draws, 32
bits each since commit 16ae801, 16 before: the masks changed there, so a DT run resumed across it is not
bit-identical with one that was not), for which training writes the attention out instead of calling SDPA (`Block.forward`; other
devices keep SDPA and its dropout; the DT runs in results/ predate this, commit fdfac43, and had SDPA's attention
dropout on the CPU too). Initialization and weight decay differ from the official code by default, and the DT
tables in results/ were made so: every layer keeps PyTorch's default init, where the official GPT-2 blocks draw
their linear weights from N(0, 0.02) with zero biases (`--reference-init`; the embeddings and the action head
keep PyTorch's init there too; CORL re-initializes every Linear and Embedding that way); and AdamW's decay skips
biases, LayerNorms and the timestep embedding (minGPT's grouping), where the official code and CORL decay every
parameter (`--decay-all`). From a D4RL file, a last episode the file cuts off unfinished is kept (its returns-to-go
sum only its recorded rewards), where the official code and CORL leave it out of training; its states enter the
state statistics, as in CORL (statistics over every row), where the official code's leave them out (at most one
episode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from offrl.checkpoint import Stateful
from offrl.compiling import compiled
from offrl.config import DataConfig, EvalConfig, TrainConfig
from offrl.data import TrainingData, load_for_training
from offrl.data.preprocess import refuse_reward_transform, refuse_unread_corruption, refuse_weighted_sampling
from offrl.data.sequences import Segments, SequenceBuffer
from offrl.errors import OffrlError
from offrl.eval_run import target_policies
from offrl.nets import MLP, Dropout
from offrl.optim import AdamW
from offrl.run import Run, cli_main


@dataclass
class Config(TrainConfig):
    steps: int = 100_000
    """Gradient steps."""
    batch_size: int = 64
    """Segments per gradient step."""
    context: int = 20
    """K: timesteps per segment (3K tokens)."""
    embed_dim: int = 128
    """Transformer width."""
    layers: int = 3
    """Transformer blocks."""
    heads: int = 1
    """Attention heads."""
    dropout: float = 0.1
    """Dropout on embeddings, attention and residuals (the official code sets attention and residual dropout from its
    option and leaves the embeddings' at GPT-2's 0.1: the same at the default)."""
    max_timestep: int = 1000
    """Size of the timestep embedding (later steps use the last entry)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay (not on biases, LayerNorms and the timestep embedding, unless --decay-all)."""
    decay_all: bool = False
    """Decay every parameter, as the official code's AdamW(model.parameters()) and CORL do."""
    reference_init: bool = False
    """The official code's init: the transformer blocks' linear weights N(0, 0.02), biases 0 (GPT-2's)."""
    warmup_steps: int = 10_000
    """Linear learning-rate warm-up."""
    grad_clip: float = 0.25
    """Gradient-norm clip."""
    rtg_scale: float = 1000.0
    """Returns-to-go are divided by this."""
    target_return: Optional[float] = None
    """Conditioning return of the run's score; half of it is evaluated too. Default: the paper's targets on D4RL
    locomotion files (hopper 3600/1800, walker2d 5000/2500, halfcheetah 12000/6000); on data without published
    targets, the dataset's ref_max_score and half of it."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=10_000, episodes=100))
    """Evaluation every 10k steps with 100 episodes at each target (the official code: 10 iterations of 10k steps;
    CORL's per-dataset configs evaluate every 5000)."""
    data: DataConfig = field(default_factory=lambda: DataConfig(normalize_states=True, state_norm_eps=1e-6,
                                                                d4rl_trajectories=True))
    """Preprocessing: states standardized (eps 1e-6; CORL's DT); D4RL .hdf5 files read as recorded episodes."""


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim), Dropout(dropout))
        self.heads = heads
        self.resid_drop = Dropout(dropout)
        self.attn_drop = Dropout(dropout)  # no parameters: checkpoints are unchanged

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """`attn_bias`: attn_mask as an additive float mask (0 or -inf), made once per forward for the written-out
        attention (`written_out_attention`)."""
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if attn_bias is not None and written_out_attention(self, x):
            # SDPA's CPU path draws its attention-dropout mask with torch's bernoulli, ~16 ns an element: at batch
            # 64 on one thread of a 2-core Xeon, 3.8 ms of a block's 5.4 ms attention forward. Written out, the
            # same softmax(q k^T / sqrt(d) + mask) v with offrl.nets.Dropout on the weights: a DT update 138.2 ->
            # 121.4 ms in bf16, 204.4 -> 196.9 in fp32 (medians of 4 interleaved rounds of 6 steps). Under bf16
            # autocast its two products run in bf16, as autocast runs baddbmm and bmm, and the softmax in float32,
            # where SDPA's math path computes all of it in float32 from the bf16 q, k, v. Against a float64
            # attention of unrounded q, k, v (scores within +-4): max error 0.017, SDPA's 0.012, and 0.008 from
            # rounding q, k, v to bf16 alone. Products in float32 cost 18 ms an update (143.2 against 125.5 ms,
            # SDPA 149.1; interleaved rounds in a slow hour of the machine).
            scale = (D // self.heads) ** -0.5
            scores = torch.baddbmm(attn_bias.expand(B, self.heads, T, T).reshape(B * self.heads, T, T),
                                   q.reshape(B * self.heads, T, -1), k.reshape(B * self.heads, T, -1).transpose(1, 2),
                                   alpha=scale)
            probabilities = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
            weights = self.attn_drop(probabilities)
            attended = torch.bmm(weights, v.reshape(B * self.heads, T, -1)).view(B, self.heads, T, -1)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                      dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x + self.resid_drop(self.proj(attended.transpose(1, 2).reshape(B, T, D)))
        return x + self.mlp(self.ln2(x))

    def one_token(self, x: torch.Tensor, attn_mask: torch.Tensor, index: int) -> torch.Tensor:
        """The block's output [B, 1, D] at token `index` alone, in evaluation (no dropout): that token's query
        against every key and value, then its projection and MLP. For the last block, whose other outputs
        nothing reads when only one prediction is wanted."""
        B, T, D = x.shape
        h = self.ln1(x)
        weight, bias = self.qkv.weight, self.qkv.bias  # rows: the query's D, then the key's and the value's
        q = F.linear(h[:, index:index + 1], weight[:D], bias[:D]).view(B, 1, self.heads, -1).transpose(1, 2)
        k, v = F.linear(h, weight[D:], bias[D:]).view(B, T, 2, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask[..., index:index + 1, :])
        x = x[:, index:index + 1] + self.resid_drop(self.proj(attended.transpose(1, 2).reshape(B, 1, D)))
        return x + self.mlp(self.ln2(x))


def written_out_attention(block: Block, x: torch.Tensor) -> bool:
    """Whether `block` computes its attention itself rather than through scaled_dot_product_attention: on the
    CPU, in training, with attention dropout (elsewhere SDPA's kernels, and their dropout, are the fast path)."""
    return x.device.type == "cpu" and block.training and block.attn_drop.p > 0


class DecisionTransformer(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, cfg: Config):
        super().__init__()
        d = cfg.embed_dim
        self.embed_timestep = nn.Embedding(cfg.max_timestep, d)
        self.embed_return, self.embed_state, self.embed_action = nn.Linear(1, d), nn.Linear(obs_dim, d), nn.Linear(act_dim, d)
        self.embed_ln, self.embed_drop = nn.LayerNorm(d), Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(d, cfg.heads, cfg.dropout) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(d)
        self.predict_action = MLP(nn.Linear(d, act_dim), nn.Tanh(), head_layers=2)
        self.max_timestep = cfg.max_timestep

    def forward(self, returns_to_go: torch.Tensor, states: torch.Tensor, actions: torch.Tensor,
                timesteps: torch.Tensor, mask: torch.Tensor, last_state_only: bool = False) -> torch.Tensor:
        """Unit-box action predictions [B, K, act_dim] from the state tokens; with `last_state_only` only the last
        state's, [B, 1, act_dim]. In eval mode the last block then runs for that token alone (`Block.one_token`):
        an evaluation step of 100 envs at a full 20-step window took 117-119 ms, 83-86 ms so (one thread of a
        2-core Xeon with AMX, float32, the envs' own stepping not counted)."""
        B, K = timesteps.shape
        time = self.embed_timestep(timesteps.clamp(max=self.max_timestep - 1))
        tokens = torch.stack([self.embed_return(returns_to_go) + time, self.embed_state(states) + time,
                              self.embed_action(actions) + time], dim=2).reshape(B, 3 * K, -1)
        x = self.embed_drop(self.embed_ln(tokens))
        token_mask = mask.repeat_interleave(3, dim=1)  # [B, 3K]
        causal = torch.ones(3 * K, 3 * K, dtype=torch.bool, device=x.device).tril()
        # Query i attends to key j when j <= i and j is not padding; a padded query attends to itself
        # so its (unused) row stays finite.
        attn_mask = (causal & token_mask.unsqueeze(1)) | torch.eye(3 * K, dtype=torch.bool, device=x.device)
        attn_mask = attn_mask.unsqueeze(1)  # [B, 1, 3K, 3K], broadcast over heads
        attn_bias = None
        if any(written_out_attention(block, x) for block in self.blocks):
            attn_bias = torch.zeros(attn_mask.shape, dtype=torch.promote_types(x.dtype, torch.float32),
                                    device=x.device).masked_fill_(~attn_mask, float("-inf"))
        if last_state_only and not self.training:
            for block in self.blocks[:-1]:
                x = block(x, attn_mask, attn_bias)
            return self.predict_action(self.ln_f(self.blocks[-1].one_token(x, attn_mask, 3 * K - 2)))
        for block in self.blocks:
            x = block(x, attn_mask, attn_bias)
        x = self.ln_f(x).reshape(B, K, 3, -1)
        return self.predict_action(x[:, -1:, 1] if last_state_only else x[:, :, 1])


def gpt2_init(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2's `_init_weights` as the official DT's trajectory_gpt2.py applies it to the transformer:
    linear weights N(0, std), biases 0, LayerNorms 1 and 0."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, 0.0, std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.LayerNorm):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)


def dt_loss(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over unpadded positions only (mean over positions and action dims)."""
    squared = ((predicted - target) ** 2).mean(-1)
    return (squared * mask).sum() / mask.sum().clamp(min=1)


class DT(Stateful):
    STATE = ("model", "optimizer", "schedule", "normalizer")

    def __init__(self, cfg: Config, data: TrainingData, device: torch.device):
        self.cfg = cfg
        self.model = DecisionTransformer(data.obs_dim, data.act_dim, cfg).to(device)
        self.normalizer = data.preprocessing.state_normalizer(device)
        low, high = (torch.as_tensor(x, device=device) for x in (data.action_low, data.action_high))
        self.action_scale, self.action_bias = (high - low) / 2, (high + low) / 2
        if cfg.reference_init:
            gpt2_init(self.model.blocks)
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            skip = not cfg.decay_all and (name.endswith("bias") or "ln" in name or "embed_timestep" in name)
            (no_decay if skip else decay).append(param)
        # torch's fused AdamW kernel through offrl.optim (its step without torch's per-call bookkeeping): torch's
        # CPU default loops over the 49 tensors, 3.59 ms a step against 0.81 on one thread of a 2-core Xeon with
        # AMX; tests/test_return_conditioned.py checks its steps against torch.optim.AdamW's. A checkpoint of the
        # earlier, unfused torch.optim.AdamW loads and then steps fused.
        self.optimizer = AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                               fused=device.type in ("cpu", "cuda"))
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min((s + 1) / max(cfg.warmup_steps, 1), 1.0))
        self._loss = compiled(self.loss, cfg.run.compile)

    def loss(self, batch: Segments) -> torch.Tensor:
        unit_actions = ((batch.actions - self.action_bias) / self.action_scale).masked_fill(~batch.mask.unsqueeze(-1), 0.0)
        predicted = self.model(batch.returns_to_go, batch.states, unit_actions, batch.timesteps, batch.mask)
        return dt_loss(predicted, unit_actions, batch.mask)

    def update(self, batch: Segments) -> dict[str, torch.Tensor]:
        loss = self._loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.schedule.step()
        return {"action_loss": loss.detach(), "grad_norm": grad_norm}


class ReturnConditionedActor:
    """Evaluation-time DT: per-env context windows of the last K steps, all envs in one forward.

    Envs step in lockstep, so every window has the same length; finished envs keep being fed (their
    actions are ignored by the evaluator). The windows live in fixed [n, K, .] buffers that shift by
    one step once full, so memory stays O(K) over an episode of any length."""

    def __init__(self, agent: DT, target_return: float):
        self.agent, self.target = agent, target_return / agent.cfg.rtg_scale
        self.K = agent.cfg.context

    def reset(self, n: int) -> None:
        self.n, self.steps, self.states = n, 0, None  # buffers are made at the first observation
        self.next_rtg = torch.full((n, 1), self.target, device=self.agent.action_bias.device)

    def _window_slot(self, obs_dim: int, device: torch.device) -> int:
        """Index of the current step in the window buffers, shifting them when full."""
        if self.states is None:
            self.states = torch.zeros(self.n, self.K, obs_dim, device=device)
            self.actions = torch.zeros(self.n, self.K, self.agent.action_scale.numel(), device=device)
            self.rtg = torch.zeros(self.n, self.K, 1, device=device)
        if self.steps < self.K:
            return self.steps
        for buffer in (self.states, self.actions, self.rtg):
            buffer[:, :-1] = buffer[:, 1:].clone()
        return self.K - 1

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        model, n = self.agent.model, obs.shape[0]
        i = self._window_slot(obs.shape[1], obs.device)
        self.states[:, i] = self.agent.normalizer(obs)
        self.rtg[:, i] = self.next_rtg
        self.actions[:, i] = 0.0
        self.steps += 1
        length = i + 1
        timesteps = torch.arange(self.steps - length, self.steps, device=obs.device).expand(n, -1)
        mask = torch.ones(timesteps.shape, dtype=torch.bool, device=obs.device)
        with torch.no_grad():
            unit = model(self.rtg[:, :length], self.states[:, :length], self.actions[:, :length], timesteps, mask,
                         last_state_only=True)[:, -1]
        self.actions[:, i] = unit
        self.last_slot = i
        return unit * self.agent.action_scale + self.agent.action_bias

    def observe(self, rewards: torch.Tensor) -> None:
        self.next_rtg = self.rtg[:, self.last_slot] - rewards.unsqueeze(-1) / self.agent.cfg.rtg_scale


Agent = DT


def benchmark_step(cfg: Config, data: TrainingData, device: torch.device):
    """One training step as `train` runs it (for benchmarks/speed.py)."""
    agent = DT(cfg, data, device)
    buffer = SequenceBuffer(data.dataset, cfg.context, device, rtg_scale=cfg.rtg_scale, max_timestep=cfg.max_timestep)
    return lambda: agent.update(buffer.sample(cfg.batch_size))


PAPER_TARGETS = {"hopper": 3600.0, "walker2d": 5000.0, "halfcheetah": 12000.0}
"""The DT paper's first evaluation target per D4RL env (the second is half of it; docs/FACTS.md section 6)."""


def expert_target(cfg: Config, metadata: dict) -> float:
    """--target-return, else a given --data.ref-max-score, else the paper's target on a D4RL locomotion file (one
    whose file or env name is a D4RL one), else the dataset's ref_max_score."""
    if cfg.target_return is not None:
        return float(cfg.target_return)
    if cfg.data.ref_max_score is not None:
        return float(cfg.data.ref_max_score)
    if metadata.get("d4rl_env") in PAPER_TARGETS:
        return PAPER_TARGETS[metadata["d4rl_env"]]
    target = metadata.get("ref_max_score")
    if target is None:
        raise OffrlError("the dataset has no published DT targets and no ref_max_score: pass --target-return "
                         "(or --data.ref-max-score)")
    return float(target)


def eval_policies(cfg: Config, agent: DT, metadata: dict, targets=None) -> dict[str, ReturnConditionedActor]:
    """The run's score conditions on the expert-level target, and half of it is evaluated too; given
    `targets` (offrl eval --targets), those instead, the first as the score."""
    if targets:
        return target_policies(targets, lambda t: ReturnConditionedActor(agent, t))
    target = expert_target(cfg, metadata)
    return {"eval": ReturnConditionedActor(agent, target), "eval_half_target": ReturnConditionedActor(agent, target / 2)}


def check_config(cfg: Config) -> None:
    """Shapes that would fail inside the model (or divide by zero), said before a run folder is made."""
    if cfg.context < 1 or cfg.layers < 1 or cfg.heads < 1 or cfg.embed_dim % cfg.heads:
        raise OffrlError(f"--context {cfg.context} --layers {cfg.layers} --heads {cfg.heads} --embed-dim "
                         f"{cfg.embed_dim}: context, layers and heads at least 1, and heads dividing the embedding")
    if not cfg.rtg_scale > 0:
        raise OffrlError(f"--rtg-scale {cfg.rtg_scale}: returns-to-go are divided by it; must be > 0")


def train(cfg: Config) -> dict:
    check_config(cfg)
    refuse_reward_transform(cfg.data, "dt")
    refuse_weighted_sampling(cfg.data, "dt", "segments from uniformly drawn start rows")
    refuse_unread_corruption(cfg.data, "dt", {"observations", "actions", "rewards"})
    data = load_for_training(cfg.dataset, cfg.data, seed=cfg.seed)
    run = Run("dt", cfg, data)
    target = expert_target(cfg, data.metadata)
    buffer = SequenceBuffer(data.dataset, cfg.context, run.device, seed=cfg.seed, rtg_scale=cfg.rtg_scale,
                            max_timestep=cfg.max_timestep)
    agent = DT(cfg, data, run.device)
    policies = eval_policies(cfg, agent, data.metadata)
    state = {"agent": agent, "buffer": buffer}
    for step in run.steps(state):
        with run.precision():
            metrics = agent.update(buffer.sample(cfg.batch_size))
        run.log(step, metrics)
        for name, policy in policies.items():
            run.evaluate(step, policy, data.metadata, prefix=None if name == "eval" else name)
        run.checkpoint(step, state)
    return run.finish({"target_return": target})


if __name__ == "__main__":
    cli_main(Config, train)
