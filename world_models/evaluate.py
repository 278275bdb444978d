"""Model error against the true simulator: `python -m world_models.evaluate`.

    python -m world_models.evaluate --dataset offrl/hopper/medium-replay-v0 --model <model.pt> --out results/model-error-hopper-mr

For Hopper, Walker2d and HalfCheetah (Gymnasium v5) an observation is qpos without the x coordinate
followed by qvel, and the dynamics do not depend on x, so the simulator's exact state can be restored
from a dataset observation (x = 0). From each of `--starts` dataset states that have `--horizon` more
steps in their episode, the dataset's own actions are replayed for k = 1..H steps in the real env and
in the model: each member rolled forward on its own mean prediction, and the elite mean (the mean of
the elites' predicted changes at every step). The error at step k is the Euclidean distance between the
predicted and the true observation (and the absolute reward error), averaged over the starts whose true
episode is still running at k.

Hopper and Walker2d clip the velocities in their observations to [-10, 10]; a state whose observation
holds a clipped velocity cannot be restored exactly, so such starts are skipped (their number is
reported). The output folder gets `model-error.md` (a table per member and for the elite mean),
`model-error.json` and, with matplotlib installed, `model-error.png`.

`--precision bf16` runs the model under bfloat16 autocast, as `--run.precision bf16` runs it in MOBILE's
Bellman penalty, inside its update: comparing its report with the fp32 one of the same model and starts
says what bf16 does to the predictions against the model's own error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from offrl.nets import autocast
from world_models.ensemble import DynamicsEnsemble

RESTORABLE = ("HopperEnv", "Walker2dEnv", "HalfCheetahEnv")
CLIPPED_VELOCITIES = ("HopperEnv", "Walker2dEnv")


def restore_state(env, obs: np.ndarray) -> None:
    """Set the simulator to the state `obs` observes (x = 0)."""
    base = env.unwrapped
    name = type(base).__name__
    if name not in RESTORABLE or not base._exclude_current_positions_from_observation:
        raise ValueError(f"cannot restore a simulator state of {name} from its observation "
                         f"(supported: Hopper, Walker2d, HalfCheetah v5 with x excluded)")
    nq, nv = base.model.nq, base.model.nv
    base.set_state(np.concatenate([[0.0], obs[:nq - 1]]), obs[nq - 1:nq - 1 + nv])


def restorable(env, obs: np.ndarray) -> bool:
    """False when the observation holds a velocity the env clipped (the true one is unknown)."""
    base = env.unwrapped
    if type(base).__name__ not in CLIPPED_VELOCITIES:
        return True
    velocities = obs[base.model.nq - 1:]
    return bool((np.abs(velocities) < 10.0 - 1e-6).all())


def start_rows(dataset, horizon: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Rows whose next `horizon` steps (inclusive) are in their episode and end before its last row.
    Windows that may hold the episode's last transition would put every terminal one at k = H (an
    episode ends only there), which biases the error at that k alone; so none is drawn, and all k are
    measured on the same kind of transitions (terminations are decided by `world_models.termination`)."""
    ends = np.append(dataset.episode_starts[1:], len(dataset))
    candidates = np.concatenate([np.arange(s, e - horizon) for s, e in zip(dataset.episode_starts, ends) if e - s > horizon]
                                or [np.zeros(0, dtype=np.int64)])
    if len(candidates) == 0:
        raise ValueError(f"no episode has {horizon} steps")
    return np.sort(rng.choice(candidates, size=min(count, len(candidates)), replace=False))


@torch.no_grad()
def model_rollouts(model: DynamicsEnsemble, obs: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean-prediction rollouts of every member and of the elite mean from obs [N, o] under actions [N, H, a]:
    observations [E + 1, N, H, o] and rewards [E + 1, N, H] (index E = the elite mean)."""
    device = model.input_mean.device
    n, horizon = actions.shape[:2]
    members = model.members
    state = torch.as_tensor(obs, dtype=torch.float32, device=device).expand(members + 1, -1, -1).clone()
    acts = torch.as_tensor(actions, dtype=torch.float32, device=device)
    out_obs = torch.empty(members + 1, n, horizon, obs.shape[1], device=device)
    out_rew = torch.empty(members + 1, n, horizon, device=device)
    elites = model.elite_index
    for k in range(horizon):
        inputs = model.standardize(torch.cat([state, acts[:, k].expand(members + 1, -1, -1)], dim=-1))
        mean, _ = model.forward_normalized(inputs[:members])  # member i on its own state
        elite_mean, _ = model.forward_normalized(inputs[members])  # every member on the elite-mean state
        delta = torch.cat([mean, elite_mean[elites].mean(0, keepdim=True)])
        state = state + delta[..., :-1]
        out_obs[:, :, k], out_rew[:, :, k] = state, delta[..., -1]
    return out_obs.cpu().numpy(), out_rew.cpu().numpy()


def evaluate_model(model: DynamicsEnsemble, dataset, env_spec, horizon: int = 10, starts: int = 200,
                   seed: int = 0, precision: str = "fp32") -> dict:
    import gymnasium as gym

    env = gym.make(env_spec)
    rng = np.random.default_rng(seed)
    candidates = start_rows(dataset, horizon, 4 * starts, rng)
    exact = [r for r in candidates if restorable(env, dataset.observations[r])]
    rows = exact[:starts]
    if not rows:
        raise ValueError("no start state can be restored exactly (all hold clipped velocities)")
    true_obs = np.full((len(rows), horizon, dataset.obs_dim), np.nan)
    true_rew = np.full((len(rows), horizon), np.nan)
    actions = np.stack([dataset.actions[r:r + horizon] for r in rows])
    for i, r in enumerate(rows):
        env.reset(seed=0)
        restore_state(env, dataset.observations[r].astype(np.float64))
        for k in range(horizon):
            obs, reward, terminated, _, _ = env.step(actions[i, k])
            true_obs[i, k], true_rew[i, k] = obs, reward
            if terminated:
                break
    env.close()
    with autocast(model.input_mean.device, precision):
        pred_obs, pred_rew = model_rollouts(model, dataset.observations[rows], actions)
    running = ~np.isnan(true_rew)  # [N, H]
    obs_error = np.linalg.norm(pred_obs - true_obs[None], axis=-1)  # [E + 1, N, H]
    rew_error = np.abs(pred_rew - true_rew[None])
    per_k = lambda x: [float(np.nanmean(np.where(running, x, np.nan)[:, k])) for k in range(horizon)]  # noqa: E731
    names = [f"member {i}{' (elite)' if i in model.elites else ''}" for i in range(model.members)] + ["elite mean"]
    return {"horizon": horizon, "precision": precision, "starts": len(rows), "candidates": len(candidates),
            "candidates_with_clipped_velocity": len(candidates) - len(exact), "running_per_k": running.sum(0).tolist(),
            "obs_error": {name: per_k(obs_error[j]) for j, name in enumerate(names)},
            "reward_error": {name: per_k(rew_error[j]) for j, name in enumerate(names)},
            "data_obs_scale": float(np.linalg.norm(dataset.observations[rows] - dataset.observations.mean(0), axis=1).mean())}


def describe_model(path: str | Path, model: DynamicsEnsemble) -> str:
    """One sentence on which model was measured: size, training, elites and holdout error."""
    from offrl import checkpoint as ckpt

    saved = ckpt.load(path)
    cfg = model.cfg
    epochs = f", trained {saved['epochs']} epochs" if saved.get("epochs") is not None else ""
    cap = f" (capped at {cfg.max_epochs})" if cfg.max_epochs is not None else " (early stopping)"
    holdout = ", ".join(f"{x:.3g}" for x in model.holdout_mse.tolist())
    precision = ", its training steps under bf16 autocast" if cfg.precision == "bf16" else ""
    return (f"Model: {model.members} members of {' x '.join(map(str, cfg.hidden))}{epochs}{cap if epochs else ''}"
            f"{precision}, seed {saved.get('seed')}, elites {model.elites}, holdout MSE per member {holdout}.")


def write_report(report: dict, out: Path, title: str, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "model-error.json").write_text(json.dumps(report, indent=2))
    ks = range(1, report["horizon"] + 1)
    lines = [f"# {title}", "",
             f"Generated by `{command}` on {time.strftime('%Y-%m-%d')}. {report['starts']} dataset states restored "
             f"exactly (of {report['candidates']} drawn, {report['candidates_with_clipped_velocity']} held a clipped "
             "velocity and could not be) "
             "in the simulator (x = 0), the dataset's actions replayed for k steps in the real env and in "
             "the model (each member on its own mean predictions; the elite mean averages the elites' predicted "
             "changes each step). Error = mean Euclidean distance between predicted and true observation over the "
             f"starts whose true episode still runs at k (counts per k: {report['running_per_k']}); for scale, "
             f"a start state lies {report['data_obs_scale']:.3g} from the data's mean state on average. Starts are "
             "drawn among rows whose k steps stay inside their episode and end before its last row, so no "
             "window holds a terminal transition. " + report.get("model", ""), "",
             "| observation error | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, values in report["obs_error"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3g}" for v in values) + " |")
    lines += ["", "| reward error | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, values in report["reward_error"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3g}" for v in values) + " |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        lines += ["", "(no plot: matplotlib is not installed; `pip install matplotlib`)"]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for name, values in report["obs_error"].items():
            style = dict(color="black", linewidth=2.5) if name == "elite mean" else dict(alpha=0.7)
            axes[0].plot(list(ks), values, label=name, **style)
            axes[1].plot(list(ks), report["reward_error"][name], label=name, **style)
        for ax, what in zip(axes, ("observation error (L2)", "reward error (abs)")):
            ax.set_xlabel("steps k")
            ax.set_ylabel(what)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "model-error.png", dpi=120)
        plt.close(fig)
        lines += ["", "![model error against k](model-error.png)"]
    (out / "model-error.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--model", required=True, help="a model file (python -m world_models.train prints its path)")
    parser.add_argument("--out", required=True, help="folder for model-error.md, .json and .png")
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="the model's forward passes in float32 or under bfloat16 autocast")
    args = parser.parse_args(argv)
    from offrl.data import load_dataset, suite
    from offrl.evaluation import env_spec_from_metadata
    from world_models.train import load_model

    suite.ensure(args.dataset)
    dataset = load_dataset(args.dataset)
    model = load_model(args.model, "cpu", dataset.obs_dim, dataset.act_dim)
    report = evaluate_model(model, dataset, env_spec_from_metadata(dataset.metadata), args.horizon, args.starts, args.seed,
                            args.precision)
    report["model"] = describe_model(args.model, model)
    command = "python -m world_models.evaluate " + " ".join(argv if argv is not None else sys.argv[1:])
    write_report(report, Path(args.out), f"Dynamics model error against the simulator on {args.dataset}"
                 + (" (bf16 autocast)" if args.precision == "bf16" else ""), command)
    print(f"wrote {Path(args.out) / 'model-error.md'}")
    return report


if __name__ == "__main__":
    main()
