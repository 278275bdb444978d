"""The `offrl` command.

    offrl datasets list                       local Minari datasets and the ones offrl can make
    offrl datasets info <id-or-path>          size, returns, reference scores, checksum
    offrl datasets validate <id-or-path>      load, check every field and the env's spaces
    offrl datasets make <id> [--force]        generate an offrl dataset (e.g. offrl/tiny-v0)
    offrl datasets verify [<id>]              regenerate offrl datasets and compare their checksums
    offrl train <algo> [options]              same options as `python -m algos.<algo>`
    offrl eval <run> [--episodes N]           evaluate a saved run (folder or checkpoint) again

Input errors print one line (`error: ...`) and exit 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import warnings
from pathlib import Path

from offrl.errors import OffrlError

ALGORITHMS = ("bc", "td3_bc", "iql", "cql", "riql", "dt", "rcsl", "sac", "mopo", "mobile", "ravl", "mbrcsl", "wsrl")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        return train_command(argv[1:])
    parser = argparse.ArgumentParser(prog="offrl", description="Offline RL toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train an algorithm: offrl train <algo> [options] (see offrl train <algo> --help)")
    datasets = sub.add_parser("datasets", help="list, inspect, validate and make datasets")
    dsub = datasets.add_subparsers(dest="action", required=True)
    dsub.add_parser("list", help="local Minari datasets and the datasets offrl can make")
    info = dsub.add_parser("info", help="size, returns, reference scores and checksum of a dataset")
    info.add_argument("source", help="Minari id, .hdf5 (D4RL format) or .npz path")
    info.add_argument("--env-id", help="evaluation env id for files that do not record one")
    info.add_argument("--json", action="store_true", help="print JSON")
    validate = dsub.add_parser("validate", help="check a dataset's fields and its env's spaces")
    validate.add_argument("source", help="Minari id, .hdf5 (D4RL format) or .npz path")
    validate.add_argument("--env-id", help="evaluation env id for files that do not record one "
                                           "('module:EnvId' for an env another package registers)")
    validate.add_argument("--ref-min-score", type=float, help="reference random return (as --data.ref-min-score)")
    validate.add_argument("--ref-max-score", type=float, help="reference expert return (as --data.ref-max-score)")
    make = dsub.add_parser("make", help="generate an offrl dataset as a local Minari dataset",
                           description="Make a suite dataset by id, all of them (--all), or your own from a policy "
                                       "file (--env --policy --steps --id). Policy files: offrl-actor-v1 files "
                                       "(SAC snapshots, offrl.policies.save_actor) and offrl training checkpoints "
                                       "(runs/<algo>/.../checkpoints/last.pt of sac, cql, td3_bc, bc, iql, riql, mopo, "
                                       "mobile, ravl, wsrl).")
    make.add_argument("dataset_id", nargs="?", help="e.g. offrl/tiny-v0 or offrl/hopper/medium-v0")
    make.add_argument("--all", action="store_true", help="make every dataset the project defines that is not on disk "
                      "yet: the tiny one, the point-maze one (with gymnasium-robotics) and the MuJoCo suite")
    make.add_argument("--force", action="store_true", help="replace existing datasets")
    make.add_argument("--env", help="your own dataset: the Gymnasium env id, e.g. Hopper-v5")
    make.add_argument("--policy", help="your own dataset: a policy file or offrl training checkpoint")
    make.add_argument("--steps", type=int, help="your own dataset: number of transitions")
    make.add_argument("--id", dest="custom_id", help="your own dataset: its Minari id, e.g. my/hopper/custom-v0")
    make.add_argument("--seed", type=int, default=0, help="your own dataset: reset and action-sampling seed")
    make.add_argument("--deterministic", action="store_true", help="your own dataset: act with the policy's mode")
    make.add_argument("--ref-min-score", type=float, help="your own dataset: reference random return")
    make.add_argument("--ref-max-score", type=float, help="your own dataset: reference expert return")
    evaluate = sub.add_parser("eval", help="evaluate a saved run again, e.g. with more episodes",
                              description="Rebuild a run from its checkpoint and evaluate it. With the run's own "
                                          "episode count and seed (the defaults) it reproduces a finished run's final evaluation.")
    evaluate.add_argument("run", help="a run folder (runs/<algo>/<dataset>/<seed>-<time>) or a checkpoint file")
    evaluate.add_argument("--episodes", type=int, help="evaluation episodes (default: the run's eval.episodes)")
    evaluate.add_argument("--seed", type=int, help="first episode's reset seed (default: the run's seed + eval.seed_offset)")
    evaluate.add_argument("--targets", type=float, nargs="+",
                          help="conditioning returns for dt, rcsl and mbrcsl (default: the run's own targets)")
    evaluate.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    evaluate.add_argument("--threads", type=int, help="torch CPU threads (default: the run's run.threads)")
    evaluate.add_argument("--out", help="also write the results to this JSON file")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    verify = dsub.add_parser("verify", help="regenerate offrl datasets and compare checksums")
    verify.add_argument("dataset_id", nargs="?", help="one dataset (default: every local offrl dataset)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning, module="minari")
    try:
        if args.command == "eval":
            return eval_command(args)
        {"list": datasets_list, "info": datasets_info, "validate": datasets_validate, "make": datasets_make,
         "verify": datasets_verify}[args.action](args)
    except OffrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def train_command(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        print(f"usage: offrl train <algo> [options]   algorithms: {', '.join(ALGORITHMS)}", file=sys.stderr)
        raise SystemExit(2)
    algo, rest = argv[0], argv[1:]
    if algo not in ALGORITHMS:
        print(f"error: unknown algorithm '{algo}' (known: {', '.join(ALGORITHMS)})", file=sys.stderr)
        raise SystemExit(2)
    from offrl.run import cli_main

    # offrl/ never imports algos/ statically; the CLI dispatches by name, as `python -m algos.<algo>` would.
    module = importlib.import_module(f"algos.{algo}")
    cli_main(module.Config, module.train, argv=rest, prog=f"offrl train {algo}")


RUN_RECORDS = ("config.json", "final.json", "dataset.json", "environment.json", "metrics.jsonl")


def check_eval_out(out: Path, run: Path) -> None:
    """`offrl eval --out` must name a file it can write, and not one of the run's own records or checkpoints (a
    report written over checkpoints/last.pt left the run unusable)."""
    if out.is_dir() or not out.absolute().parent.is_dir():
        raise OffrlError(f"--out {out}: not a file in an existing folder")
    run_dir = run if run.is_dir() else run.parent.parent  # a checkpoint file: <run>/checkpoints/<name>.pt
    inside = out.resolve().is_relative_to(run_dir.resolve())
    if out.suffix == ".pt" or (inside and (out.name in RUN_RECORDS or "checkpoints" in out.resolve().parts)):
        raise OffrlError(f"--out {out}: a checkpoint or one of the run's records; name another file for the report")
    if not os.access(out.absolute().parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise OffrlError(f"--out {out}: cannot write there")


def eval_command(args) -> None:
    from offrl.eval_run import evaluate_saved_run

    if args.episodes is not None and args.episodes < 1:
        raise OffrlError(f"--episodes {args.episodes}: must be at least 1")
    if args.seed is not None and args.seed < 0 or args.threads is not None and args.threads < 0:
        raise OffrlError(f"--seed {args.seed} / --threads {args.threads}: neither may be negative")
    if args.targets is not None and not all(math.isfinite(t) for t in args.targets):
        raise OffrlError(f"--targets {' '.join(map(str, args.targets))}: returns to condition on must be finite")
    if args.out:  # before minutes of evaluation, not after
        check_eval_out(Path(args.out), Path(args.run))
    report = evaluate_saved_run(args.run, episodes=args.episodes, seed=args.seed, device=args.device,
                                targets=args.targets, threads=args.threads)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.tmp")
        try:  # atomically: a failed write leaves a file that was there as it was
            tmp.write_text(json.dumps(report, indent=2))
            tmp.replace(out)
        except OSError as exc:  # the evaluation is not lost: its report goes to stdout
            tmp.unlink(missing_ok=True)
            print(json.dumps(report, indent=2))
            raise OffrlError(f"--out {out}: cannot write it ({exc.strerror or exc}); the report is on stdout") from None
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['algo']} on {report['run_label']}, step {report['step']}, {report['episodes']} episodes "
          f"from seed {report['seed']} ({report['checkpoint']})")
    for name, result in report["results"].items():
        score = result.get("normalized_score")
        shown = (f"normalized score {score:.1f} ± {result['normalized_score_std']:.1f}, " if score is not None else "")
        print(f"  {name}: {shown}return {result['return_mean']:.1f} ± {result['return_std']:.1f}, "
              f"length {result['length_mean']:.0f}")


def describe(dataset) -> dict:
    from offrl.scores import normalized_score

    returns = dataset.episode_returns()
    meta = dataset.metadata
    norm = normalized_score(returns, meta.get("ref_min_score"), meta.get("ref_max_score"))
    return {
        "id": meta.get("name"), "source": meta.get("source"), "env_id": meta.get("env_id"),
        "transitions": len(dataset), "episodes": dataset.num_episodes,
        "terminals": int(dataset.terminals.sum()), "timeouts": int(dataset.timeouts.sum()),
        "obs_dim": dataset.obs_dim, "act_dim": dataset.act_dim,
        "return_mean": float(returns.mean()), "return_min": float(returns.min()), "return_max": float(returns.max()),
        "normalized_return_mean": None if norm is None else float(norm.mean()),
        "ref_min_score": meta.get("ref_min_score"), "ref_max_score": meta.get("ref_max_score"),
        "ref_source": meta.get("ref_source"), "checksum": meta.get("checksum"),
        "stored_checksum": meta.get("stored_checksum"), "description": meta.get("description"),
    }


def datasets_list(args) -> None:
    import minari

    from offrl.data import suite

    suite.datasets_root()  # a file there: one error line, not minari's FileExistsError
    local = minari.list_local_datasets()
    ids = sorted(set(local) | set(suite.known_ids()))
    print(f"{'id':40s} {'status':10s} {'episodes':>8s} {'steps':>9s}  env")
    for dataset_id in ids:
        if dataset_id in local:
            meta = local[dataset_id]
            env = json.loads(meta["env_spec"])["id"] if meta.get("env_spec") else "-"
            print(f"{dataset_id:40s} {'local':10s} {meta.get('total_episodes', '?'):>8} {meta.get('total_steps', '?'):>9}  {env}")
        else:
            print(f"{dataset_id:40s} {'makeable':10s} {'-':>8s} {'-':>9s}  (offrl datasets make {dataset_id})")
    print(f"datasets folder: {suite.datasets_root()}")


def datasets_info(args) -> None:
    from offrl.data import load_dataset

    info = describe(load_dataset(args.source, env_id=args.env_id))
    if args.json:
        print(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        print(f"{key:24s} {value}")


def datasets_validate(args) -> None:
    from offrl.data import check_env_compat, load_dataset
    from offrl.evaluation import make_env

    from offrl.data.sources import missing_reference_scores

    dataset = load_dataset(args.source, env_id=args.env_id, ref_min_score=args.ref_min_score,
                           ref_max_score=args.ref_max_score)
    env = make_env(dataset.metadata)
    try:
        check_env_compat(dataset, env.observation_space, env.action_space)
    finally:
        env.close()
    print(f"ok: {args.source}: {len(dataset)} transitions, {dataset.num_episodes} episodes, "
          f"env {dataset.metadata.get('env_id')}, checksum {dataset.metadata['checksum']}")
    meta = dataset.metadata
    warning = missing_reference_scores(meta)
    print(f"warning: {warning}" if warning else
          f"reference scores: min {meta['ref_min_score']:.6g}, max {meta['ref_max_score']:.6g} ({meta.get('ref_source')})")


def datasets_make(args) -> None:
    from offrl.data import suite

    custom = [args.env, args.policy, args.steps, args.custom_id]
    if any(v is not None for v in custom):
        if not all(v is not None for v in custom):
            raise OffrlError("your own dataset needs all of --env, --policy, --steps and --id")
        if args.steps < 1:
            raise OffrlError(f"--steps {args.steps}: a dataset needs at least one transition")
        suite.check_dataset_id(args.custom_id)  # before minutes of rollouts, not after
        if suite.exists(args.custom_id) and not args.force:  # refuse before minutes of rollouts, not after
            raise OffrlError(f"{args.custom_id} already exists at {suite.local_path(args.custom_id)} (use --force to replace it)")
        made = suite.make_custom(args.env, args.policy, args.steps, args.seed, args.deterministic,
                                 args.ref_min_score, args.ref_max_score)
        checksum = suite.write_minari_dataset(args.custom_id, made, overwrite=args.force)
        print(f"made {args.custom_id}: {args.steps} transitions, {len(made.episodes)} episodes, checksum {checksum} "
              f"-> {suite.local_path(args.custom_id)}")
        return
    if args.all == (args.dataset_id is not None):
        raise OffrlError("give a dataset id or --all (or --env/--policy/--steps/--id for your own)")
    ids = suite.known_ids() if args.all else [args.dataset_id]
    if args.all and importlib.util.find_spec("gymnasium_robotics") is None:  # an optional extra: make the rest
        print(f"{suite.STITCH_ID}: skipped, it needs gymnasium-robotics (pip install -e \".[maze]\")")
        ids.remove(suite.STITCH_ID)
    builder = suite.SuiteBuilder()
    for dataset_id in ids:
        if suite.exists(dataset_id) and not args.force:
            print(f"{dataset_id}: already made (--force makes it again)")
            continue
        result = suite.make(dataset_id, overwrite=args.force, builder=builder)
        print(f"made {result['id']}: {result['transitions']} transitions, {result['episodes']} episodes in "
              f"{result['seconds']:.1f} s, checksum {result['checksum']} -> {suite.local_path(result['id'])}", flush=True)


def datasets_verify(args) -> None:
    import minari

    from offrl.data import suite

    ids = [args.dataset_id] if args.dataset_id else [i for i in sorted(minari.list_local_datasets())
                                                     if suite.stored_info(i).get("checksum")]
    if not ids:
        raise OffrlError("no offrl-made datasets on this machine to verify; name one, e.g. offrl/hopper/medium-v0")
    failed = []
    for dataset_id in ids:
        result = suite.verify(dataset_id)
        status = "ok" if result["ok"] else "MISMATCH"
        compared = ", ".join(f"{name} {result[name]}" for name in ("stored", "reference") if result[name])
        refs = result["reference_scores"]
        if refs["stored"] is not None and refs["stored"] != refs["regenerated"]:
            compared += (f"; reference scores stored {refs['stored'][0]:.6g}/{refs['stored'][1]:.6g}, regenerated "
                         f"{refs['regenerated'][0]:.6g}/{refs['regenerated'][1]:.6g}")
        print(f"{dataset_id}: {status} (regenerated {result['regenerated']}; {compared}; {result['seconds']:.1f} s)",
              flush=True)
        if not result["ok"]:
            failed.append(dataset_id)
    if failed:
        raise OffrlError(f"{len(failed)} dataset(s) did not regenerate exactly: {', '.join(failed)}")


if __name__ == "__main__":
    main()
