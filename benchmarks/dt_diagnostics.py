"""Why does DT score below BC on a dataset? Checks on finished DT and BC runs (results/README.md).

    python -m benchmarks.dt_diagnostics --dt RUN [RUN ...] --bc RUN [RUN ...] [--episodes 100] [--noise 0.14] \
        [--behaviour-policy offrl/assets/policies/walker2d/actor_0150000.pt --dataset offrl/walker2d/medium-v0]

1. Fit: the eval-mode mean squared action error on the training data, DT over every position of 60
   batches of 64 sampled segments (unit action box), BC over 20k sampled transitions (env action units, as BC's loss;
   the same for [-1, 1] boxes); fixed seeds. Equal fits point
   at closed-loop behaviour, not at underfitting.
2. Past actions: DT's context holds its own past actions, which in the data were sampled (noisy) and at
   evaluation are its own deterministic ones. It is evaluated as usual ("clean"), with its past actions
   plus N(0, noise^2) in its context while executing the clean ones ("noisy-context"), and acting with
   the noisy actions too ("noisy-both"), from reset seed 1000.
3. With --behaviour-policy (the policy file that made the dataset): the floor of any action MSE, the
   mean squared distance between the data's actions and the policy's mean action (the average of 32
   samples at 5000 dataset states), and the average per-state standard deviation of its samples.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from offrl.data import load_for_training
from offrl.data.sequences import SequenceBuffer
from offrl.eval_run import load_saved_run
from offrl.evaluation import evaluate


def load_agent(run_dir: Path):
    """A finished run's agent and config (as `offrl eval` rebuilds it) and its training data."""
    _, cfg, agent, _, _, _ = load_saved_run(run_dir, device="cpu", threads=1)
    return agent, cfg, load_for_training(cfg.dataset, cfg.data, seed=cfg.seed, check_options=False)


class NoisyContextActor:
    """DT's evaluation actor whose context (and optionally executed) actions get Gaussian noise."""

    def __init__(self, actor, noise: float, execute_noisy: bool):
        self.actor, self.noise, self.execute_noisy = actor, noise, execute_noisy

    def reset(self, n: int) -> None:
        self.actor.reset(n)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        self.actor(obs)
        slot, agent = self.actor.last_slot, self.actor.agent
        clean = self.actor.actions[:, slot].clone()
        noisy = (clean + self.noise * torch.randn_like(clean)).clamp(-1, 1)
        self.actor.actions[:, slot] = noisy
        return (noisy if self.execute_noisy else clean) * agent.action_scale + agent.action_bias

    def observe(self, rewards: torch.Tensor) -> None:
        self.actor.observe(rewards)


@torch.no_grad()
def dt_fit(agent, cfg, data) -> float:
    buffer = SequenceBuffer(data.dataset, cfg.context, torch.device("cpu"), seed=123, rtg_scale=cfg.rtg_scale,
                            max_timestep=cfg.max_timestep)
    torch.manual_seed(0)
    agent.model.eval()
    return float(sum(agent.loss(buffer.sample(64)) for _ in range(60)) / 60)


@torch.no_grad()
def bc_fit(agent, data) -> float:
    rows = torch.randint(len(data.dataset), (20_000,), generator=torch.Generator().manual_seed(0))
    observations = torch.as_tensor(data.dataset.observations[rows])  # already normalized by the pipeline
    return float(((agent.actor(observations) - torch.as_tensor(data.dataset.actions[rows])) ** 2).mean())


def noise_floor(policy_file: Path, dataset_id: str) -> tuple[float, float]:
    import numpy as np

    from offrl.data import load_dataset
    from offrl.policies import load_policy

    dataset, policy = load_dataset(dataset_id), load_policy(policy_file)
    rows = np.random.default_rng(0).choice(len(dataset), 5000, replace=False)
    generator = torch.Generator().manual_seed(0)
    samples = np.stack([policy.act(dataset.observations[rows], deterministic=False, generator=generator) for _ in range(32)])
    return float(((dataset.actions[rows] - samples.mean(0)) ** 2).mean()), float(samples.std(0).mean())


def main(argv: list[str] | None = None) -> None:
    from algos import dt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dt", type=Path, nargs="+", required=True, help="finished DT run folders")
    parser.add_argument("--bc", type=Path, nargs="*", default=[], help="finished BC run folders")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--noise", type=float, default=0.14, help="std of the noise added to context actions")
    parser.add_argument("--behaviour-policy", type=Path, help="the policy file that generated the dataset")
    parser.add_argument("--dataset", help="with --behaviour-policy: the dataset it generated")
    args = parser.parse_args(argv)
    if args.behaviour_policy and not args.dataset:
        parser.error("--behaviour-policy needs --dataset (the dataset it generated)")
    torch.set_num_threads(1)
    if args.behaviour_policy:
        floor, std = noise_floor(args.behaviour_policy, args.dataset)
        print(f"behaviour policy: data-to-mean-action MSE {floor:.4f}, per-state sample std {std:.3f}", flush=True)
    for run_dir in args.bc:
        agent, _, data = load_agent(run_dir)
        print(f"bc {run_dir}: eval-mode action MSE {bc_fit(agent, data):.4f}", flush=True)
    for run_dir in args.dt:
        agent, cfg, data = load_agent(run_dir)
        print(f"dt {run_dir}: eval-mode action MSE {dt_fit(agent, cfg, data):.4f}", flush=True)
        target = dt.expert_target(cfg, data.metadata)
        torch.manual_seed(0)
        for name, actor in [("clean", dt.ReturnConditionedActor(agent, target)),
                            ("noisy-context", NoisyContextActor(dt.ReturnConditionedActor(agent, target), args.noise, False)),
                            ("noisy-both", NoisyContextActor(dt.ReturnConditionedActor(agent, target), args.noise, True))]:
            result = evaluate(actor, data.metadata, args.episodes, 1000, "cpu")
            stderr = result.normalized.std() / len(result.normalized) ** 0.5
            print(f"  {name}: normalized score {result.normalized.mean():.1f} ± {stderr:.1f} (standard error), "
                  f"length {result.lengths.mean():.0f}", flush=True)


if __name__ == "__main__":
    main()
