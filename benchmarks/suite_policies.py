"""Pick the dataset suite's behaviour policies from a SAC run and install them in the package.

    python -m benchmarks.suite_policies runs-behaviour/sac/Hopper-v5/0-<time> --env-key hopper

From the run's actor snapshots (`actors/actor_<step>.pt`, each with the evaluation at its step):
- expert: the `--expert-candidates` snapshots with the best logged evaluation are re-evaluated
  with sampled actions (as they act in the data) over `--episodes` episodes; the best one wins;
- medium: the earliest snapshot whose sampled-action return is within [1/3, 1/2] of the expert's
  (D4RL: "about a third of the expert"); snapshots are screened by their logged evaluation first;
- medium-replay needs every snapshot before the medium one.
The chosen files are copied to offrl/assets/policies/<env-key>/ with a manifest.json that records
the choice, the returns it was based on and the SAC run's config and commit.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from offrl import policies
from offrl.data import rollout

MEDIUM_RANGE = (1 / 3, 1 / 2)


def sampled_return(path: Path, env_id: str, episodes: int, seed: int = 777) -> float:
    policy = rollout.sampled_policy(policies.load_policy(path), seed)
    return rollout.average_return(env_id, policy, episodes, seed)


def select(run_dir: Path, episodes: int = 20, expert_candidates: int = 5, max_medium_checks: int = 12) -> dict:
    config = json.loads((run_dir / "config.json").read_text())
    env_id = config["env_id"]
    snapshots = []
    for path in sorted((run_dir / "actors").glob("actor_*.pt")):
        info = policies.describe(path)
        snapshots.append({"file": path.name, "path": path, "step": int(info["step"]),
                          "eval_return": info["last_eval"].get("eval/return_mean", float("nan"))})
    if not snapshots:
        raise SystemExit(f"no actor snapshots in {run_dir / 'actors'}")
    ranked = sorted((s for s in snapshots if np.isfinite(s["eval_return"])), key=lambda s: -s["eval_return"])
    for s in ranked[:expert_candidates]:
        s["sampled_return"] = sampled_return(s["path"], env_id, episodes)
        print(f"expert candidate step {s['step']}: eval {s['eval_return']:.0f}, sampled {s['sampled_return']:.0f}", flush=True)
    expert = max(ranked[:expert_candidates], key=lambda s: s["sampled_return"])
    target = expert["sampled_return"]
    low, high = (f * target for f in MEDIUM_RANGE)
    medium, checked = None, 0
    for s in snapshots:  # earliest first
        if s["step"] >= expert["step"] or not (0.8 * low <= s["eval_return"] <= 1.25 * high) or checked >= max_medium_checks:
            continue
        s["sampled_return"] = sampled_return(s["path"], env_id, episodes)
        checked += 1
        print(f"medium candidate step {s['step']}: eval {s['eval_return']:.0f}, sampled {s['sampled_return']:.0f} "
              f"(want {low:.0f}..{high:.0f})", flush=True)
        if low <= s["sampled_return"] <= high:
            medium = s
            break
    if medium is None:
        raise SystemExit(f"no snapshot's sampled return lies in [{low:.0f}, {high:.0f}]; lower actor_every or check the run")
    environment = json.loads((run_dir / "environment.json").read_text())
    return {
        "format": "offrl-suite-policies-v1", "env_id": env_id,
        "learning_starts": config["learning_starts"], "actor_every": config["actor_every"],
        "dataset_size": 1_000_000, "last_snapshot_step": max(s["step"] for s in snapshots),
        "expert": {"file": "expert.pt", "step": expert["step"], "eval_return": expert["eval_return"],
                   "sampled_return": expert["sampled_return"], "source_file": expert["file"]},
        "medium": {"file": medium["file"], "step": medium["step"], "eval_return": medium["eval_return"],
                   "sampled_return": medium["sampled_return"]},
        "replay": [{"file": s["file"], "step": s["step"], "eval_return": s["eval_return"]}
                   for s in snapshots if s["step"] <= medium["step"]],
        "selection": {"episodes": episodes, "medium_range": list(MEDIUM_RANGE), "actions": "sampled"},
        "source_run": {"algo": "sac", "run_dir": str(run_dir), "git_commit": environment.get("git_commit"),
                       "config": {k: config[k] for k in ("env_id", "steps", "seed", "learning_starts", "batch_size",
                                                         "hidden", "actor_lr", "critic_lr", "gamma", "tau")}},
        "_paths": {s["file"]: str(s["path"]) for s in snapshots if s["step"] <= medium["step"]} | {"expert.pt": str(expert["path"])},
    }


def install(manifest: dict, destination: Path) -> None:
    paths = manifest.pop("_paths")
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for name, source in paths.items():
        shutil.copyfile(source, destination / name)
    (destination / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--env-key", required=True, help="folder name and dataset id part, e.g. hopper")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--expert-candidates", type=int, default=5)
    parser.add_argument("--dest", type=Path, default=Path(policies.__file__).parent / "assets" / "policies")
    args = parser.parse_args(argv)
    # the key names the folder install() replaces: "" or a path would replace the whole policies folder or another
    if not args.env_key or Path(args.env_key).name != args.env_key or args.env_key in (".", ".."):
        parser.error(f"--env-key {args.env_key!r}: one folder name, e.g. hopper")
    if args.episodes < 1 or args.expert_candidates < 1:
        parser.error("--episodes and --expert-candidates: at least 1")
    manifest = select(args.run_dir, args.episodes, args.expert_candidates)
    install(manifest, args.dest / args.env_key)
    print(json.dumps({k: manifest[k] for k in ("env_id", "expert", "medium")}, indent=2))
    print(f"installed {len(manifest['replay']) + 1} policy files in {args.dest / args.env_key}")


if __name__ == "__main__":
    main()
