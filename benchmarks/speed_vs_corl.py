"""offrl against CORL, side by side: time per training update of IQL, TD3+BC, BC and CQL on one CPU
(or one GPU, `--device cuda`).

CORL (github.com/corl-team/CORL) is the single-file PyTorch toolkit offrl measures itself against. This
benchmark runs **CORL's own training loops** (its `train()` from `algorithms/offline/{iql,td3_bc,
any_percent_bc,cql}.py`, with CORL's `TrainConfig` filled from CORL's hopper-medium-v2 YAML, only
`device` set, to --device) and **offrl's updates** (`benchmarks.speed.time_algorithm`: `ReplayBuffer.sample`
+ `Agent.update`, as the algorithms' `train` loops run them) on the same synthetic D4RL-shaped hopper
dataset (obs 11, act 3, ~0.95M transitions), interleaved in one invocation: for each round, for each
thread count, for each algorithm, CORL's measurement and offrl's back to back (which first alternates from round to
round), each in a fresh subprocess (so
`torch.set_num_threads`, OMP/MKL pools and the allocator start clean). It writes the offrl/CORL time
ratio per algorithm and thread count, with the per-round numbers, the command, CORL's commit, the
hardware and the versions, to `results/speed-vs-corl.md`. Nothing of CORL is stored in this repository.

Get CORL (tested at corl-team/CORL commit eeeeef2671235fcce3a3eb255576a207d78840e6, "Update cql.py (#15)";
the older copy tinkoff-ai/CORL has the same layout) into a folder outside the repository, and install
CORL's small Python dependency next to the torch you have (never let pip pull another torch):

    git clone https://github.com/corl-team/CORL ../corl
    git -C ../corl checkout eeeeef2671235fcce3a3eb255576a207d78840e6
    pip install pyrallis                       # CORL's config parser (+ pyyaml); gym and wandb are optional
    python -m benchmarks.speed_vs_corl --corl-dir ../corl

`--corl-dir` is either a CORL clone (`algorithms/offline/iql.py`, `configs/offline/iql/hopper/
medium_v2.yaml`, ...) or a flat folder with `iql.py td3_bc.py any_percent_bc.py cql.py` beside
`configs/offline/{iql,td3_bc,bc,cql}/hopper/medium_v2.yaml` (the layout of `../shared/anchors/README.md`).
CORL's commit is read from `--corl-commit`, else from a `COMMIT` file in that folder, else, for a clone
(a folder with `.git`), from `git -C <corl-dir> rev-parse HEAD`. `--corl-python` runs CORL's side with
another interpreter (a venv with CORL's dependencies; default: this one).

What runs without d4rl or mujoco-py (stubs, outside CORL's code; as in `../shared/anchors/corl_speed.py`):
`d4rl.qlearning_dataset(env)` returns the .npz arrays with D4RL's semantics (rows 0..N-2, time-limit rows
dropped); `gym.make` returns a hopper-shaped env (Box spaces 11/3, `get_dataset()` = the .npz; a minimal
`gym` module stands in when gym is not installed: `Env`, `spaces.Box`, `wrappers.TransformObservation/
TransformReward`); `wandb` runs with WANDB_MODE=disabled (CORL's per-step `wandb.log` call is made and is
a no-op; a no-op stand-in when wandb is not installed), and argument-less `wandb.run.save()` is a no-op as
in the wandb 0.12 CORL pins. CORL's `train()` is called undecorated (`train.__wrapped__`) with the config
from the same `pyrallis.parse(config_class=TrainConfig, config_path=<yaml>)` call its decorator makes.

What is timed. CORL: the time between consecutive per-step `wandb.log` calls of CORL's loop, i.e.
`replay_buffer.sample(batch_size)`, `.to(device)`, `trainer.train(batch)`, `wandb.log(...)`; the run is
stopped by an exception from the wrapped `wandb.log` after --warmup + --steps steps, long before CORL's first
evaluation (eval_freq 5000). offrl: `benchmarks.speed.time_algorithm` on the same .npz: --warmup steps,
then --steps steps in blocks of --block (then two more for its FLOP count). Both sides use the same estimator, the
median over blocks of --block consecutive steps of the mean time per step (an even block averages TD3+BC's
actor-every-2nd-step pattern); offrl's steps flush subnormal floats as its runs do (`--run.flush-denormal`),
CORL's do not (a difference that showed only after hundreds of steps, in RCSL's larger MLP); CORL's plain
per-step median (TD3+BC: the median of the means of 2-step
pairs) is reported beside it. Ratio = the median over rounds of each round's offrl / CORL (< 1: offrl is
faster; the sides of a round run back to back, first one then the other, alternating from round to round);
the per-round ratios are listed too. Parts of results/speed-vs-corl.md made before this estimator give the
ratio of the two sides' medians over rounds instead (their captions say so). Each side's update FLOPs are
counted too (torch's FlopCounterMode, untimed: CORL's 2nd
and 3rd `trainer.train` calls, offrl's two extra steps): their ratio is the time ratio at equal GFLOP/s, the
floor a goal is measured against. Each measurement records how many cores other processes used meanwhile
(/proc/stat, less the measuring process); values above 0.15 are flagged in the table.

Sizes. CORL's hopper configs: batch 256 everywhere; IQL deterministic actor (`iql_deterministic: true`),
actor, twin Q and V 256x256; TD3+BC and BC 256x256; CQL actor and both critics 256x256x256, 10 sampled
actions, importance sampling, automatic entropy tuning. offrl's defaults match except IQL's actor
(Gaussian by default): offrl's side runs `--actor deterministic` for IQL (`OFFRL_OVERRIDES`). The table
lists each side's trained parameters (the parameters in its optimizers) as a check.

    python -m benchmarks.speed_vs_corl --corl-dir ../corl                       # 3 rounds, 1 and 2 threads
    python -m benchmarks.speed_vs_corl --corl-dir ../corl --algos iql cql --threads 1 --rounds 1
    python -m benchmarks.speed_vs_corl --corl-dir ../corl --compile --section compiled   # offrl --run.compile
    python -m benchmarks.speed_vs_corl --corl-dir ../corl --device cuda --threads 1 --section gpu

At the defaults (3 rounds x threads 1 and 2 x 4 algorithms x 2 sides = 48 processes, each --warmup 200 +
--steps 1000 steps) a run takes about an hour on an idle 2-core CPU, most of it CQL (~0.1 s per update on
each side; scaled by the steps from 15 minutes with `--warmup 60 --steps 260` on a 2-core Xeon); `--json-dir DIR` keeps each measurement's JSON and log. Nothing else should run on the
machine meanwhile: 2-thread measurements on a 2-core machine are disturbed by any other load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

# Only the standard library at module level: the CORL worker may run under another interpreter (--corl-python)
# that has CORL's dependencies but not offrl.

ROOT = Path(__file__).resolve().parent.parent
TESTED_CORL_COMMIT = "eeeeef2671235fcce3a3eb255576a207d78840e6"
ALGOS = ("iql", "td3_bc", "bc", "cql")
CORL = {
    # algo: (CORL module stem, CORL config folder, trainer class whose .train(batch) is one update)
    "iql": ("iql", "iql", "ImplicitQLearning"),
    "td3_bc": ("td3_bc", "td3_bc", "TD3_BC"),
    "bc": ("any_percent_bc", "bc", "BC"),
    "cql": ("cql", "cql", "ContinuousCQL"),
}
NAMES = {"iql": "IQL", "td3_bc": "TD3+BC", "bc": "BC", "cql": "CQL"}
GOALS = {"iql": 0.8, "td3_bc": 0.8, "cql": 0.8, "bc": 1.0}
"""Issue #20's goal for offrl / CORL time per update."""
OFFRL_OVERRIDES = {"iql": {"actor": "deterministic"}}
"""offrl `Config` fields set to CORL's hopper-medium-v2 sizes where offrl's defaults differ (IQL: CORL's hopper
YAML has `iql_deterministic: true`; offrl's default actor is Gaussian). Batch 256 and the hidden sizes
(256x2; CQL 256x3) are offrl's defaults already."""
CORL_CONFIG = "hopper/medium_v2.yaml"
OTHER_CORES_FLAG = 0.15


class UsageError(SystemExit):
    """A one-line error for the command line: exit status 1, no traceback."""

    def __init__(self, message: str):
        super().__init__(f"speed_vs_corl: error: {message}")


# ------------------------------------------------------------------------------------------ CPU of others
def read_proc_cpu() -> dict:
    """Snapshot of /proc: per process (ppid, CPU ticks) and the system's busy ticks. A process's ticks include its
    waited-for children's (cutime + cstime), so work that a measured process hands to short-lived children (the
    C++ compiler that --run.compile runs) counts as its own, not as another process's."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_bytes().decode("utf-8", "replace")
            fields = raw[raw.rfind(")") + 2:].split()
            procs[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
        except (OSError, IndexError, ValueError):
            continue
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]]
                busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
                break
    return {"procs": procs, "busy": busy}


def other_cores(before: dict | None, after: dict | None, seconds: float) -> float | None:
    """Cores used by processes other than this one and its children between two snapshots."""
    if before is None or after is None or seconds <= 0:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in after["procs"].items():
        children.setdefault(ppid, []).append(pid)
    mine, todo = {os.getpid()}, [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in mine:
                mine.add(c)
                todo.append(c)
    own = sum(max(0, t - before["procs"].get(pid, (0, 0))[1]) for pid, (_, t) in after["procs"].items() if pid in mine)
    return max(0.0, (after["busy"] - before["busy"] - own) / os.sysconf("SC_CLK_TCK") / seconds)


def snapshot() -> dict | None:
    try:
        return read_proc_cpu()
    except OSError:  # no /proc (not Linux)
        return None


# ------------------------------------------------------------------------------------------ data
def make_synth_hopper(path: Path, episodes: int = 1000, min_len: int = 900, max_len: int = 1000,
                      obs_dim: int = 11, act_dim: int = 3, seed: int = 0) -> None:
    """A random, D4RL-shaped hopper dataset (.npz with D4RL's keys): `episodes` episodes of min_len..max_len
    steps (~0.95M transitions by default), next_observations = observations shifted inside each episode,
    `timeouts` on episodes that reach max_len, `terminals` on the others. Only shapes matter for timing."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=episodes)
    n = int(lengths.sum())
    obs = np.empty((n, obs_dim), np.float32)
    next_obs = np.empty((n, obs_dim), np.float32)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    pos = 0
    for length in map(int, lengths):
        traj = rng.standard_normal((length + 1, obs_dim), dtype=np.float32)
        obs[pos:pos + length], next_obs[pos:pos + length] = traj[:-1], traj[1:]
        (timeouts if length >= max_len else terminals)[pos + length - 1] = True
        pos += length
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to a name without it
        np.savez(f, observations=obs, actions=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
                 rewards=(3.0 + rng.standard_normal(n, dtype=np.float32)).astype(np.float32),
                 next_observations=next_obs, terminals=terminals, timeouts=timeouts)


NPZ_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")


def load_npz(path: str | Path) -> dict:
    import numpy as np

    with np.load(path) as raw:
        missing = [k for k in NPZ_KEYS if k not in raw.files]
        if missing:
            raise UsageError(f"{path} lacks the keys {' '.join(missing)} (a D4RL-format .npz is needed)")
        return {k: raw[k] for k in NPZ_KEYS}


def offrl_training_data(path: str | Path):
    """The .npz as offrl's `TrainingData` (as `benchmarks.speed.synthetic_data` builds it): episodes end at
    each terminal or timeout row."""
    import numpy as np

    from offrl.data import TrainingData
    from offrl.data.dataset import Dataset
    from offrl.data.preprocess import Preprocessing

    d = load_npz(path)
    n, obs_dim, act_dim = len(d["rewards"]), d["observations"].shape[1], d["actions"].shape[1]
    ends = np.flatnonzero(d["terminals"] | d["timeouts"])
    timeouts = d["timeouts"].astype(np.float32)
    timeouts[-1] = max(timeouts[-1], 1.0 - float(d["terminals"][-1]))  # the data's last row ends an episode
    dataset = Dataset(
        observations=d["observations"].astype(np.float32), actions=d["actions"].astype(np.float32),
        rewards=d["rewards"].astype(np.float32), next_observations=d["next_observations"].astype(np.float32),
        terminals=d["terminals"].astype(np.float32), timeouts=timeouts,
        episode_starts=np.concatenate([[0], ends[ends < n - 1] + 1]).astype(np.int64),
        metadata={"name": Path(path).name, "env_id": "Hopper-v5"},
    ).validate()
    pre = Preprocessing(obs_mean=np.zeros(obs_dim, np.float32), obs_std=np.ones(obs_dim, np.float32))
    return TrainingData(dataset, pre, obs_dim, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32))


# ------------------------------------------------------------------------------------------ statistics
def block_median_ms(step_seconds: list[float], block: int) -> float:
    """Median over consecutive blocks of `block` steps of the mean time per step, in ms (benchmarks.speed's
    estimator); a trailing partial block is dropped."""
    blocks = [sum(step_seconds[i:i + block]) / block for i in range(0, len(step_seconds) - block + 1, block)]
    return 1000 * statistics.median(blocks)


def trained_parameters(obj) -> int:
    """Parameters in the torch optimizers among `obj`'s attributes (each parameter counted once)."""
    import torch

    seen: dict[int, int] = {}
    for value in vars(obj).values():
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                for p in group["params"]:
                    seen[id(p)] = p.numel()
    return sum(seen.values())


def summarize(measurements: list[dict]) -> list[dict]:
    """Per (algo, threads): CORL's and offrl's ms per update per round and their medians over rounds, the ratio
    offrl / CORL per round and its median over rounds (the headline: a round times both sides back to back, so a
    slow spell of the machine cancels in its ratio, where a ratio of the two sides' medians can pair numbers from
    different rounds). `measurements`: dicts with side ('corl' or 'offrl'), algo, threads, round and ms (plus
    optional corl_step_median_ms, other_cores, params)."""
    table: dict[tuple[str, int], dict] = {}
    for m in sorted(measurements, key=lambda m: m["round"]):
        row = table.setdefault((m["algo"], m["threads"]), {"algo": m["algo"], "threads": m["threads"],
                                                           "corl": {}, "offrl": {}, "other_cores": [], "params": {}})
        row[m["side"]][m["round"]] = m["ms"]
        if m.get("other_cores") is not None:
            row["other_cores"].append(m["other_cores"])
        if m.get("params"):
            row["params"][m["side"]] = m["params"]
        if m.get("gflop") is not None:
            row.setdefault("gflop", {})[m["side"]] = m["gflop"]  # the same in every round
        if m["side"] == "offrl" and m.get("warmup_s") is not None:
            row.setdefault("offrl_warmup_s", {})[m["round"]] = m["warmup_s"]
        if m["side"] == "corl" and m.get("corl_step_median_ms") is not None:
            row.setdefault("corl_step_median", {})[m["round"]] = m["corl_step_median_ms"]
    rows = []
    order = {a: i for i, a in enumerate(ALGOS)}
    for (algo, threads), row in sorted(table.items(), key=lambda kv: (kv[0][1], order.get(kv[0][0], 99), kv[0][0])):
        rounds = sorted(set(row["corl"]) & set(row["offrl"]))
        if not rounds:
            continue
        corl = statistics.median(row["corl"][r] for r in rounds)
        offrl = statistics.median(row["offrl"][r] for r in rounds)
        rows.append({
            "algo": algo, "threads": threads, "rounds": rounds,
            "corl_ms": corl, "offrl_ms": offrl,
            "ratio": statistics.median(row["offrl"][r] / row["corl"][r] for r in rounds),
            "corl_round_ms": [row["corl"][r] for r in rounds], "offrl_round_ms": [row["offrl"][r] for r in rounds],
            "round_ratios": [row["offrl"][r] / row["corl"][r] for r in rounds],
            "corl_step_median_ms": (statistics.median(row["corl_step_median"][r] for r in rounds)
                                    if set(rounds) <= set(row.get("corl_step_median", {})) else None),
            "offrl_warmup_s": (statistics.median(row["offrl_warmup_s"][r] for r in rounds)
                               if set(rounds) <= set(row.get("offrl_warmup_s", {})) else None),
            "goal": GOALS.get(algo), "max_other_cores": max(row["other_cores"], default=None),
            "params": row["params"], "gflop": row.get("gflop", {}),
        })
    return rows


def _gflop(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def render_markdown(meta: dict, rows: list[dict]) -> str:
    """The results section: the ratio table, the sizes, the per-round numbers, how it was measured."""
    corl_commit = meta["corl_commit"]
    compiled = " (offrl compiled)" if meta.get("compile") else ""
    device = meta.get("device", "cpu")
    on_gpu = device != "cpu"
    where = (f"{meta['gpu']}, host CPU {meta['cpu']}, {meta['cores']} cores" if on_gpu
             else f"{meta['cpu']}, {meta['cores']} cores")
    lines = [f"# offrl vs CORL: time per training update{compiled} ({where})", "",
             f"Generated by `{meta['command']}` on {meta['date']}, {meta['rounds']} interleaved round(s) "
             f"({meta['warmup']} warm-up steps, then {meta['steps']} timed steps in blocks of {meta['block']}). "
             f"CORL: [corl-team/CORL](https://github.com/corl-team/CORL) at commit `{corl_commit}`"
             + (" (the tested one)" if corl_commit == TESTED_CORL_COMMIT else "") +
             f", its own `train()` loops with its hopper-medium-v2 YAML (only `device={device}`), "
             f"{meta['corl_versions']}. offrl: `benchmarks.speed.time_algorithm` "
             f"({meta.get('offrl_step', '`ReplayBuffer.sample` + `Agent.update`')})"
             f"{', compiled (`--run.compile`)' if meta.get('compile') else ''}, "
             f"{meta['offrl_versions']}. Both on the same synthetic D4RL-shaped hopper data ({meta['data']}).", "",
             "**Ratio = offrl / CORL** time per update, the median over rounds of each round's ratio (the two sides "
             "of a round run back to back, in alternating order from round to round; below 1 offrl is faster); the "
             "ms columns are each side's median over rounds. Each side's ms per update is the median over blocks of "
             "consecutive steps of the "
             "mean time per step; CORL's step is one iteration of its loop (`replay_buffer.sample`, `.to(device)`, "
             "`trainer.train(batch)`, a disabled `wandb.log`), offrl's one sample and update as its `train` loop runs "
             "them (without that loop's own logging and schedule checks, which `benchmarks.speed --end-to-end` "
             "measures: about 2% of BC's step). "
             "Goal (issue #20): IQL, TD3+BC and CQL ≤ 0.8, BC ≤ 1.0."
             + (" On the GPU, CORL's loop reads its losses with `.item()` every step (for its per-step `wandb.log`), "
                "so each of its steps waits for the GPU; offrl's step is its default on CUDA, recorded once as a CUDA "
                "graph and replayed (`--run.cuda-graph`), with the device synchronized only around timing blocks. "
                "*threads* is torch's CPU thread count of the host side." if on_gpu else "")
             + (" *offrl warm-up s*: the wall time of offrl's warm-up steps, which with `--run.compile` is mostly "
                "compiling (median over rounds; compiled in the measuring process, one compile thread, from an empty "
                "inductor cache, as a first run compiles); the compiled step is timed after it." if compiled else ""),
             "",
             "| algorithm | threads | CORL ms/update | offrl ms/update | **offrl / CORL** | goal | ratio per round "
             "| CORL per round | offrl per round | CORL per-step median |" + (" offrl warm-up s |" if compiled else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if compiled else "")]
    for r in rows:
        goal = r["goal"]
        met = "" if goal is None else f"≤ {goal:.2f} {'✓' if r['ratio'] <= goal else '✗'}"
        lines.append(
            f"| {NAMES.get(r['algo'], r['algo'])} | {r['threads']} | {_ms(r['corl_ms'])} | {_ms(r['offrl_ms'])} | "
            f"**{r['ratio']:.3f}** | {met} | {', '.join(f'{x:.3f}' for x in r['round_ratios'])} | "
            f"{', '.join(_ms(x) for x in r['corl_round_ms'])} | {', '.join(_ms(x) for x in r['offrl_round_ms'])} | "
            f"{_ms(r['corl_step_median_ms']) if r['corl_step_median_ms'] is not None else '-'} |"
            + ((f" {r['offrl_warmup_s']:.1f} |" if r.get("offrl_warmup_s") is not None else " - |") if compiled else ""))
    lines += ["", "Sizes (CORL's hopper-medium-v2 configs; offrl's side set to them where its defaults differ). "
              "Trained parameters = the parameters in each side's optimizers. GFLOP/update: each side's update "
              "counted by torch's FlopCounterMode (matmuls, forward and backward; CORL: the mean of its 2nd and 3rd "
              "`trainer.train` calls, offrl: of two updates, both untimed). *FLOPs offrl / CORL* is the time ratio "
              "the two would have at the same GFLOP/s: a goal below it needs offrl's update to run at a higher "
              "share of the machine's matmul rate than CORL's.", "",
              "| algorithm | batch | networks | offrl options set to CORL's | trained parameters CORL / offrl "
              "| GFLOP/update CORL / offrl | FLOPs offrl / CORL |",
              "|---|---|---|---|---|---|---|"]
    for algo in dict.fromkeys(r["algo"] for r in rows):
        params = next((r["params"] for r in rows if r["algo"] == algo and r["params"]), {})
        gflop = next((r["gflop"] for r in rows if r["algo"] == algo and r.get("gflop")), {})
        overrides = " ".join(f"`--{k.replace('_', '-')} {v}`" for k, v in OFFRL_OVERRIDES.get(algo, {}).items())
        flop_ratio = f"{gflop['offrl'] / gflop['corl']:.3f}" if gflop.get("corl") and gflop.get("offrl") else "-"
        lines.append(f"| {NAMES.get(algo, algo)} | {meta.get('batch', {}).get(algo, 256)} | {NETWORKS.get(algo, '')} | "
                     f"{overrides or 'none (defaults match)'} | "
                     f"{params.get('corl', '-')} / {params.get('offrl', '-')} | "
                     f"{_gflop(gflop.get('corl'))} / {_gflop(gflop.get('offrl'))} | "
                     f"{flop_ratio} |")
    flagged = [r for r in rows if r["max_other_cores"] is not None and r["max_other_cores"] > OTHER_CORES_FLAG]
    lines += ["", "Other processes' CPU during the measurements (cores, /proc/stat less the measuring process): "
              + ("at most " + ", ".join(f"{NAMES.get(r['algo'], r['algo'])} {r['threads']} thread(s) "
                                        f"{r['max_other_cores']:.2f}" for r in flagged)
                 + f" — above {OTHER_CORES_FLAG}, those rows were disturbed; rerun on an idle machine."
                 if flagged else f"below {OTHER_CORES_FLAG} in every measurement."
                 if any(r["max_other_cores"] is not None for r in rows) else "not measured (no /proc)."),
              "", "Deviations from CORL's runs: `d4rl` and `gym.make` are stubbed (no MuJoCo; the data are random "
              "numbers with hopper-medium-v2's shapes), `wandb` runs disabled, no evaluation is timed, "
              "CORL's pinned torch 1.11 / numpy 1.23 / wandb 0.12 are replaced by the versions above. How to "
              "rerun: the docstring of `benchmarks/speed_vs_corl.py`."]
    return "\n".join(lines) + "\n"


NETWORKS = {"iql": "deterministic actor, twin Q, V: 256x256", "td3_bc": "actor, twin Q: 256x256",
            "bc": "actor 256x256", "cql": "Tanh-Gaussian actor, twin Q: 256x256x256; 10 sampled actions"}


# ------------------------------------------------------------------------------------------ CORL worker
def corl_files(corl_dir: Path, algo: str) -> tuple[Path, Path]:
    """CORL's module file and hopper-medium-v2 YAML of `algo` in a clone or a flat copy."""
    stem, config, _ = CORL[algo]
    for module in (corl_dir / "algorithms" / "offline" / f"{stem}.py", corl_dir / f"{stem}.py"):
        if module.is_file():
            break
    else:
        raise UsageError(f"{corl_dir} has no algorithms/offline/{stem}.py (nor {stem}.py): pass the folder of a "
                         "CORL clone as --corl-dir (git clone https://github.com/corl-team/CORL)")
    yaml = corl_dir / "configs" / "offline" / config / CORL_CONFIG
    if not yaml.is_file():
        raise UsageError(f"{corl_dir} has no configs/offline/{config}/{CORL_CONFIG}: pass a CORL clone as --corl-dir")
    return module, yaml


def corl_commit(corl_dir: Path, given: str | None) -> str:
    if given:
        return given.strip()
    commit_file = corl_dir / "COMMIT"
    if commit_file.is_file() and commit_file.read_text().strip():
        return commit_file.read_text().split()[0]
    if (corl_dir / ".git").exists():  # a clone's own HEAD only, never that of a repository the folder sits in
        try:
            out = subprocess.run(["git", "-C", str(corl_dir), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    raise UsageError(f"CORL's commit is unknown: pass --corl-commit SHA or write it into {commit_file}")


def _gym_stub():
    """A minimal `gym` for CORL's imports and its env wrappers, when gym is not installed."""
    import numpy as np

    gym = types.ModuleType("gym")
    spaces = types.ModuleType("gym.spaces")
    wrappers = types.ModuleType("gym.wrappers")

    class Env:
        metadata: dict = {}

    class Box:
        def __init__(self, low, high, shape, dtype=np.float32):
            self.shape, self.dtype = tuple(shape), dtype
            self.low, self.high = np.full(shape, low, dtype), np.full(shape, high, dtype)

        def seed(self, seed=None):
            return [seed]

    class _Wrapper(Env):
        def __init__(self, env, f):
            self.env, self.f = env, f

        def __getattr__(self, name):
            if name in ("env", "f"):
                raise AttributeError(name)
            return getattr(self.env, name)

    class TransformObservation(_Wrapper):
        def reset(self, **kwargs):
            return self.f(self.env.reset(**kwargs))

        def step(self, action):
            obs, reward, done, info = self.env.step(action)
            return self.f(obs), reward, done, info

    class TransformReward(_Wrapper):
        def reset(self, **kwargs):
            return self.env.reset(**kwargs)

        def step(self, action):
            obs, reward, done, info = self.env.step(action)
            return obs, self.f(reward), done, info

    gym.Env, gym.spaces, gym.wrappers, gym.__version__ = Env, spaces, wrappers, "stub"
    spaces.Box = Box
    wrappers.TransformObservation, wrappers.TransformReward = TransformObservation, TransformReward
    sys.modules.update({"gym": gym, "gym.spaces": spaces, "gym.wrappers": wrappers})
    return gym


def _wandb_stub():
    """A no-op `wandb` (what WANDB_MODE=disabled does), when wandb is not installed."""
    wandb = types.ModuleType("wandb")
    run = types.SimpleNamespace(save=lambda *a, **k: True, id="stub")
    wandb.__version__ = "stub"
    wandb.run = None

    def init(*args, **kwargs):
        wandb.run = run
        return run

    wandb.init, wandb.log, wandb.finish = init, lambda *a, **k: None, lambda *a, **k: None
    sys.modules["wandb"] = wandb
    return wandb


def install_stubs(data: dict):
    """`d4rl` and `gym.make` stand-ins serving `data` (as ../shared/anchors/corl_speed.py does)."""
    import numpy as np

    try:
        import gym
        from gym import spaces
    except ImportError:
        gym = _gym_stub()
        spaces = gym.spaces
    obs_dim, act_dim = data["observations"].shape[1], data["actions"].shape[1]

    class StubHopper(gym.Env):
        """Hopper-shaped: spaces and get_dataset(); an episode ends after one step (never reached here)."""

        def __init__(self, name):
            self.name, self._max_episode_steps = name, 1000
            self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), dtype=np.float32)
            self.action_space = spaces.Box(-1.0, 1.0, (act_dim,), dtype=np.float32)

        def get_dataset(self):
            return {k: v.copy() for k, v in data.items()}

        def seed(self, seed=None):
            return [seed]

        def reset(self, **kwargs):
            return np.zeros(obs_dim, np.float32)

        def step(self, action):
            return np.zeros(obs_dim, np.float32), 0.0, True, {}

        def get_normalized_score(self, score):
            return score

    gym.make = lambda name, **kwargs: StubHopper(name)

    def qlearning_dataset(env, dataset=None, terminate_on_end=False, **kwargs):
        dataset = env.get_dataset() if dataset is None else dataset
        keep = np.ones(len(dataset["rewards"]), bool)
        keep[-1] = False
        if not terminate_on_end:
            keep &= ~dataset["timeouts"].astype(bool)
        return {"observations": dataset["observations"][keep].astype(np.float32),
                "actions": dataset["actions"][keep].astype(np.float32),
                "next_observations": dataset["next_observations"][keep].astype(np.float32),
                "rewards": dataset["rewards"][keep].astype(np.float32),
                "terminals": dataset["terminals"][keep].astype(bool)}

    d4rl = types.ModuleType("d4rl")
    d4rl.qlearning_dataset, d4rl.__stub__ = qlearning_dataset, True
    sys.modules["d4rl"] = d4rl
    return gym


class _Done(Exception):
    """Raised from the wrapped wandb.log once enough steps are timed."""


class _RunProxy:
    def __init__(self, run):
        self._run = run

    def save(self, *args, **kwargs):
        return True if not args and not kwargs else self._run.save(*args, **kwargs)  # wandb 0.12: a no-op

    def __getattr__(self, name):
        return getattr(self._run, name)


class _WandbProxy:
    """The name `wandb` inside CORL's module: the real (disabled) wandb, with `log` timestamped."""

    def __init__(self, real, total: int, warmup: int):
        self._real, self._total, self._warmup = real, total, warmup
        self.stamps: list[float] = []
        self.window: list[dict | None] = [None, None]

    @property
    def run(self):
        return None if self._real.run is None else _RunProxy(self._real.run)

    def log(self, data, *args, **kwargs):
        if any(str(k).startswith("eval") or k == "d4rl_normalized_score" for k in data):
            return self._real.log(data, *args, **kwargs)
        n = len(self.stamps)
        if n == self._warmup:
            self.window[0] = snapshot()
        self.stamps.append(time.perf_counter())
        if n == self._total:
            self.window[1] = snapshot()
            raise _Done
        return self._real.log(data, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def count_flops_of_calls(cls: type, name: str, counted: list[int], flops: list[int], instances: list) -> None:
    """Wrap the method `cls.name`: the calls numbered in `counted` (1-based) run under torch's FlopCounterMode and
    append their FLOPs to `flops`; the first call's `self` is appended to `instances`."""
    from torch.utils.flop_counter import FlopCounterMode

    original, calls = getattr(cls, name), [0]

    def wrapper(self, *a, **k):
        if not instances:
            instances.append(self)
        calls[0] += 1
        if calls[0] not in counted:
            return original(self, *a, **k)
        with FlopCounterMode(display=False) as counter:
            out = original(self, *a, **k)
        flops.append(counter.get_total_flops())
        return out

    setattr(cls, name, wrapper)


def corl_worker(args) -> dict:
    """One CORL measurement in this process: CORL's train() until warmup + steps steps are timed."""
    corl_dir = Path(args.corl_dir).resolve()
    module_path, yaml_path = corl_files(corl_dir, args.algo)
    stem, _, trainer_class = CORL[args.algo]
    os.environ["WANDB_MODE"] = "disabled"
    os.environ.setdefault("WANDB_SILENT", "true")
    wandb_dir = tempfile.TemporaryDirectory(prefix="speed_vs_corl_wandb_")
    os.environ["WANDB_DIR"] = wandb_dir.name

    data = load_npz(args.data)
    gym = install_stubs(data)
    try:
        import wandb
    except ImportError:
        wandb = _wandb_stub()
    import importlib

    import numpy
    import pyrallis
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(module_path.parent))
    mod = importlib.import_module(stem)
    config = pyrallis.parse(config_class=mod.TrainConfig, config_path=str(yaml_path), args=["--device", args.device])
    total = args.warmup + args.steps
    if getattr(config, "eval_freq", None) is not None and total + 1 >= config.eval_freq:
        raise UsageError(f"--warmup + --steps must stay below CORL's eval_freq={config.eval_freq} (no evaluation "
                         "is timed)")
    proxy = _WandbProxy(wandb, total, args.warmup)
    mod.wandb = proxy
    trainers = []
    flops: list[int] = []  # of the 2nd and 3rd updates, in the untimed warm-up (TD3+BC: one with an actor step)
    count_flops_of_calls(getattr(mod, trainer_class), "train", [c for c in (2, 3) if c <= args.warmup], flops, trainers)
    train_fn = getattr(mod.train, "__wrapped__", mod.train)
    try:
        train_fn(config)
        raise RuntimeError("CORL's train() returned before the requested number of steps")
    except _Done:
        pass
    try:
        wandb.finish()
    except Exception:  # noqa: BLE001 - the measurement is done; a wandb shutdown hiccup does not matter
        pass

    stamps = proxy.stamps
    timed = [stamps[i] - stamps[i - 1] for i in range(args.warmup + 1, len(stamps))]
    assert len(timed) == args.steps, (len(timed), args.steps)
    pairs = [(timed[i] + timed[i + 1]) / 2 for i in range(0, len(timed) - 1, 2)]
    step_median = statistics.median(pairs if args.algo == "td3_bc" else timed) * 1000
    window = stamps[-1] - stamps[args.warmup]
    return {"side": "corl", "algo": args.algo, "threads": args.threads, "torch_threads": torch.get_num_threads(),
            "device": device_name(torch, args.device),
            "ms": block_median_ms(timed, args.block), "corl_step_median_ms": step_median,
            "mean_ms": 1000 * statistics.fmean(timed), "batch_size": config.batch_size,
            "params": trained_parameters(trainers[0]) if trainers else None,
            "gflop": sum(flops) / len(flops) / 1e9 if len(flops) == 2 else None,
            "other_cores": other_cores(proxy.window[0], proxy.window[1], window),
            "module": str(module_path.relative_to(corl_dir)), "config": str(yaml_path.relative_to(corl_dir)),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "numpy": numpy.__version__, "pyrallis": getattr(pyrallis, "__version__", "?"),
                         "gym": getattr(gym, "__version__", "?"), "wandb": getattr(wandb, "__version__", "?")}}


# ------------------------------------------------------------------------------------------ offrl worker
def device_name(torch, device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def offrl_config(algo: str, compile: bool = False):
    """offrl's `Config` of `algo` at CORL's hopper sizes (its defaults + `OFFRL_OVERRIDES`)."""
    import importlib

    cfg = importlib.import_module(f"algos.{algo}").Config()
    for key, value in OFFRL_OVERRIDES.get(algo, {}).items():
        setattr(cfg, key, value)
    cfg.run.compile = compile
    return cfg


def offrl_worker(args) -> dict:
    """One offrl measurement in this process: benchmarks.speed.time_algorithm at CORL's sizes on the .npz."""
    import importlib

    if args.compile:
        # Compile in this process (no worker pool, whose CPU would count as other processes' and flag the row)
        # and from an empty cache, so the warm-up time is a first run's compile time.
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="offrl-inductor-")
    import numpy
    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.speed import time_algorithm

    data = offrl_training_data(args.data)
    device = torch.device(args.device)
    cfg = offrl_config(args.algo, args.compile)
    torch.manual_seed(0)
    agent = getattr(importlib.import_module(f"algos.{args.algo}"), "Agent", None)
    params = trained_parameters(agent(offrl_config(args.algo), data, device)) if agent else None
    module = importlib.import_module(f"algos.{args.algo}")
    # what time_algorithm times: the module's benchmark_step when it has one, else ReplayBuffer.sample + Agent.update
    step = "benchmark_step" if hasattr(module, "benchmark_step") else "ReplayBuffer.sample + Agent.update"
    before, start = snapshot(), time.perf_counter()
    try:
        result = time_algorithm(args.algo, device, args.warmup, args.steps // args.block, args.block, cfg=cfg, data=data)
    finally:
        if args.compile:
            shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
    seconds, after = time.perf_counter() - start, snapshot()
    return {"side": "offrl", "algo": args.algo, "threads": args.threads, "torch_threads": torch.get_num_threads(),
            "device": device_name(torch, args.device),
            "ms": result["median_ms"], "min_ms": result["min_ms"], "max_ms": result["max_ms"],
            "batch_size": result["batch_size"], "params": params, "compile": args.compile, "step": step,
            "warmup_s": result["warmup_s"], "gflop": result["gflop_per_update"],
            "overrides": OFFRL_OVERRIDES.get(args.algo, {}), "other_cores": other_cores(before, after, seconds),
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}}


# ------------------------------------------------------------------------------------------ driver
def cpu_model() -> str:
    from offrl.nets import cpu_model as model_name

    return model_name() or platform.processor() or platform.machine()


def measure(side: str, args, algo: str, threads: int, data: Path, json_dir: Path, tag: str) -> dict:
    """One measurement in a fresh subprocess; its JSON (and log) are kept in json_dir."""
    out, log = json_dir / f"{tag}.json", json_dir / f"{tag}.log"
    python = args.corl_python if side == "corl" else sys.executable
    command = [python, "-m", "benchmarks.speed_vs_corl", "--worker", side, "--algo", algo, "--threads", str(threads),
               "--data", str(data), "--warmup", str(args.warmup), "--steps", str(args.steps),
               "--block", str(args.block), "--device", args.device, "--json-out", str(out)]
    if side == "corl":
        command += ["--corl-dir", str(args.corl_dir)]
    elif args.compile:
        command.append("--compile")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if code != 0 or not out.exists():
        tail = "\n    ".join(log.read_text().strip().splitlines()[-8:])
        raise SystemExit(f"speed_vs_corl: error: the {side} measurement of {algo} at {threads} thread(s) failed "
                         f"(exit {code}); log {log}:\n    {tail}")
    return json.loads(out.read_text())


def check_corl_python(python: str) -> None:
    try:
        probe = subprocess.run([python, "-c", "import torch, numpy, pyrallis, yaml"], capture_output=True, text=True)
    except OSError as e:  # no such file, not executable
        raise UsageError(f"--corl-python {python}: cannot run it ({e.strerror})") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"{python} cannot import CORL's dependencies ({last}); install them next to its torch: "
                         "pip install pyrallis")


def run(args, argv: list[str]) -> dict:
    if not args.corl_dir:
        raise UsageError("--corl-dir is required: the folder of a CORL clone (git clone "
                         "https://github.com/corl-team/CORL; see python -m benchmarks.speed_vs_corl --help)")
    args.corl_dir = Path(args.corl_dir).resolve()
    if not args.corl_dir.is_dir():
        raise UsageError(f"--corl-dir {args.corl_dir} is not a folder")
    if args.rounds < 1 or any(t < 1 for t in args.threads):
        raise UsageError(f"--rounds {args.rounds} and --threads {' '.join(map(str, args.threads))}: each at least 1")
    if args.steps % args.block or args.steps < args.block or args.block % 2:
        raise UsageError(f"--steps ({args.steps}) must be a positive multiple of --block ({args.block}), "
                         "an even number")
    from benchmarks.sections import check_section, write_section

    check_section(Path(args.markdown), args.section)  # before the measurements' hour, not after it
    for algo in args.algos:
        corl_files(args.corl_dir, algo)
    commit = corl_commit(args.corl_dir, args.corl_commit)
    check_corl_python(args.corl_python)

    with tempfile.TemporaryDirectory(prefix="speed_vs_corl_") as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "hopper_synth.npz"
        if not data.exists():
            print(f"writing the synthetic hopper dataset to {data}", file=sys.stderr, flush=True)
            make_synth_hopper(data)
        json_dir = Path(args.json_dir) if args.json_dir else Path(tmp) / "measurements"
        json_dir.mkdir(parents=True, exist_ok=True)
        measurements, start = [], time.perf_counter()
        for rnd in range(1, args.rounds + 1):
            for threads in args.threads:
                for algo in args.algos:
                    pair = {}
                    # alternating which side goes first, so neither always runs on the warmer (or cooler) machine
                    for side in ("corl", "offrl") if rnd % 2 else ("offrl", "corl"):
                        m = measure(side, args, algo, threads, data, json_dir, f"{side}_{algo}_t{threads}_r{rnd}")
                        pair[side] = m | {"round": rnd}
                        measurements.append(pair[side])
                    print(f"[{(time.perf_counter() - start) / 60:5.1f} min] round {rnd}/{args.rounds}, {threads} "
                          f"thread(s), {algo}: CORL {pair['corl']['ms']:.2f} ms, offrl {pair['offrl']['ms']:.2f} ms, "
                          f"offrl/CORL {pair['offrl']['ms'] / pair['corl']['ms']:.3f}", file=sys.stderr, flush=True)
        import numpy as np

        with np.load(data) as raw:
            n_rows, obs_dim = len(raw["rewards"]), raw["observations"].shape[1]
            act_dim = raw["actions"].shape[1]
    rows = summarize(measurements)
    corl_v = next(m["versions"] for m in measurements if m["side"] == "corl")
    offrl_v = next(m["versions"] for m in measurements if m["side"] == "offrl")
    meta = {"command": "python -m benchmarks.speed_vs_corl " + shlex.join(argv), "date": time.strftime("%Y-%m-%d"),
            "corl_commit": commit, "cpu": cpu_model(), "cores": os.cpu_count(), "rounds": args.rounds,
            "device": args.device, "gpu": next((m.get("device") for m in measurements if m.get("device") != "cpu"), None),
            "warmup": args.warmup, "steps": args.steps, "block": args.block, "compile": args.compile,
            "data": (f"{Path(args.data).name}, " if args.data else "")
                    + f"{n_rows:,} transitions, obs {obs_dim}, act {act_dim}",
            "batch": {m["algo"]: m["batch_size"] for m in measurements if m["side"] == "corl"},
            "corl_versions": "python {python}, torch {torch}, numpy {numpy}, pyrallis {pyrallis}, gym {gym}, "
                             "wandb {wandb}".format(**corl_v),
            "offrl_versions": "python {python}, torch {torch}, numpy {numpy}".format(**offrl_v),
            "offrl_step": offrl_steps({m["algo"]: m["step"] for m in measurements if m["side"] == "offrl"})}
    text = render_markdown(meta, rows)
    write_section(Path(args.markdown), args.section, text)
    print(text)
    print(f"wrote {args.markdown} (part '{args.section}')", file=sys.stderr)
    return {"meta": meta, "rows": rows, "measurements": measurements}


def offrl_steps(steps: dict[str, str]) -> str:
    """What offrl's side timed per algorithm, once when it is the same for all."""
    if len(set(steps.values())) == 1:
        return f"`{next(iter(steps.values()))}`"
    return "; ".join(f"{NAMES.get(algo, algo)}: `{step}`" for algo, step in steps.items())


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed_vs_corl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corl-dir", default=None, help="folder of a CORL clone (or a flat copy; see above); required")
    p.add_argument("--corl-commit", default=None, help="CORL's commit (default: <corl-dir>/COMMIT, else git rev-parse)")
    p.add_argument("--corl-python", default=sys.executable, help="interpreter for CORL's side (default: this one)")
    p.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians over rounds are reported")
    p.add_argument("--warmup", type=int, default=200, help="untimed steps first, on each side")
    p.add_argument("--steps", type=int, default=1000, help="timed steps on each side (a multiple of --block)")
    p.add_argument("--block", type=int, default=20, help="steps per timing block (even)")
    p.add_argument("--data", default=None, help="D4RL-format .npz (written here first if missing; default: a "
                                                "synthetic hopper dataset in a temporary folder)")
    p.add_argument("--device", default="cpu",
                   help="torch device of both sides (cpu, cuda, cuda:N); on CUDA offrl runs its default, the step "
                        "replayed as a CUDA graph, and CORL its own loop, which reads each step's losses with .item()")
    p.add_argument("--compile", action="store_true", help="offrl's side with --run.compile (warm-up must cover it)")
    p.add_argument("--markdown", default=str(ROOT / "results" / "speed-vs-corl.md"), help="result file")
    p.add_argument("--section", default="speed-vs-corl", help="the part of --markdown this table replaces "
                                                              "(benchmarks.sections); others are kept")
    p.add_argument("--json-dir", default=None, help="keep each measurement's JSON and log here (default: temporary)")
    p.add_argument("--worker", choices=("corl", "offrl"), help=argparse.SUPPRESS)
    p.add_argument("--algo", choices=ALGOS, help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        args.threads = args.threads[0]
        result = corl_worker(args) if args.worker == "corl" else offrl_worker(args)
        Path(args.json_out).write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
        return result
    return run(args, argv)


if __name__ == "__main__":
    main()
