"""Datasets the project makes itself, written as real local Minari datasets.

`write_minari_dataset` builds a dataset under a temporary Minari root and moves the finished folder
into place, so a failed or interrupted write never leaves a half-written dataset behind (one of those
makes `minari.list_local_datasets()` crash). The checksum stored in the metadata is computed from
the dataset as `load_minari` reads it back, so `verify` can compare regenerations exactly.

Makeable ids: `offrl/tiny-v0` (tests and quickstart), `offrl/pointmaze/umaze-stitch-v0` (MBRCSL's stitching
task; needs gymnasium-robotics) and `offrl/<env>/<level>-v0` for every env whose behaviour policies (a `manifest.json` and actor files) are in `policies_root()`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from offrl.errors import DatasetError, OffrlError


@dataclass
class Episode:
    observations: np.ndarray  # [T + 1, obs_dim]
    actions: np.ndarray  # [T, act_dim]
    rewards: np.ndarray  # [T]
    terminations: np.ndarray  # [T] bool
    truncations: np.ndarray  # [T] bool
    seed: int | None = None

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class MadeDataset:
    episodes: list[Episode]
    env_spec: object  # gymnasium EnvSpec
    ref_min_score: float | None
    ref_max_score: float | None
    description: str
    algorithm_name: str
    info: dict = field(default_factory=dict)


def datasets_root() -> Path:
    """Minari's local datasets folder (MINARI_DATASETS_PATH, else ~/.minari/datasets); a file there is refused
    before a dataset is made or read, not when it is written."""
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    if root.exists() and not root.is_dir():
        raise OffrlError(f"the datasets folder {root} (MINARI_DATASETS_PATH, else ~/.minari/datasets) is a file")
    return root


def local_path(dataset_id: str) -> Path:
    return datasets_root() / dataset_id


def exists(dataset_id: str) -> bool:
    return (local_path(dataset_id) / "data" / "metadata.json").exists()


@contextlib.contextmanager
def _minari_root(path: Path):
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def write_minari_dataset(dataset_id: str, made: MadeDataset, overwrite: bool = False) -> str:
    """Write episodes as a local Minari dataset (hdf5 format); return the dataset's checksum."""
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    from offrl.data.sources import load_minari

    final = local_path(dataset_id)
    if exists(dataset_id) and not overwrite:
        raise DatasetError(dataset_id, f"already exists at {final} (use --force to replace it)")
    root = datasets_root()
    root.mkdir(parents=True, exist_ok=True)
    buffers = [
        EpisodeBuffer(id=i, seed=ep.seed, observations=np.asarray(ep.observations),
                      actions=np.asarray(ep.actions), rewards=list(map(float, ep.rewards)),
                      terminations=list(map(bool, ep.terminations)), truncations=list(map(bool, ep.truncations)))
        for i, ep in enumerate(made.episodes)
    ]
    with tempfile.TemporaryDirectory(dir=root, prefix=".tmp-") as tmp:
        with _minari_root(Path(tmp)):
            mdata = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=made.env_spec, eval_env=made.env_spec,
                algorithm_name=made.algorithm_name, author="offrl", author_email="offrl@users.noreply.invalid",
                code_permalink="offrl/data/suite.py",
                ref_min_score=None if made.ref_min_score is None else float(made.ref_min_score),
                ref_max_score=None if made.ref_max_score is None else float(made.ref_max_score),
                description=made.description, data_format="hdf5",
            )
            checksum = load_minari(dataset_id).checksum()
            mdata.storage.update_metadata({"offrl": json.dumps({**made.info, "checksum": checksum})})
        staged = Path(tmp) / dataset_id
        final.parent.mkdir(parents=True, exist_ok=True)
        namespace_file = Path(tmp) / dataset_id.split("/")[0] / "namespace_metadata.json"
        if "/" in dataset_id and namespace_file.exists() and not (root / dataset_id.split("/")[0] / namespace_file.name).exists():
            shutil.copy(namespace_file, root / dataset_id.split("/")[0] / namespace_file.name)
        old = None
        if final.exists():
            old = final.with_name(f".old-{final.name}-{os.getpid()}")
            final.rename(old)
        staged.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return checksum


# ------------------------------------------------------------------------------- the tiny dataset
TINY_ENV = "InvertedPendulum-v5"
TINY_MAX_STEPS = 200
TINY_GAINS = np.array([1.0, 10.0, 1.0, 1.0])  # linear state feedback that balances the pole
TINY_NOISE = (0.5, 1.0, 1.5)  # per-episode action-noise std, cycled: mixes terminated and truncated episodes


def make_tiny(seed: int = 0, transitions: int = 10_000) -> MadeDataset:
    """InvertedPendulum-v5 (200-step limit) under a noisy linear controller, about 10k transitions.

    Actions: clip(K @ obs + sigma * N(0, 1), -3, 3) with sigma cycling through 0.5, 1.0, 1.5 per
    episode; resets seeded seed, seed + 1, ...; the last episode is cut at `transitions` rows."""
    import gymnasium as gym

    env = gym.make(TINY_ENV, max_episode_steps=TINY_MAX_STEPS)
    rng = np.random.default_rng(seed)
    episodes, total, index = [], 0, 0
    while total < transitions:
        noise = TINY_NOISE[index % len(TINY_NOISE)]
        episode = rollout(env, lambda o: np.clip(TINY_GAINS @ o + noise * rng.standard_normal(1), -3.0, 3.0),
                          seed=seed + index, max_steps=transitions - total)
        episodes.append(episode)
        total += len(episode)
        index += 1
    ref_min = float(np.mean([rollout(env, lambda o: env.action_space.sample(), seed=10_000 + i).rewards.sum()
                             for i in range(100)]))
    ref_max = float(np.mean([rollout(env, lambda o: np.clip(TINY_GAINS @ o, -3.0, 3.0).reshape(1), seed=20_000 + i).rewards.sum()
                             for i in range(100)]))
    env.close()
    return MadeDataset(
        episodes=episodes, env_spec=env.spec, ref_min_score=ref_min, ref_max_score=ref_max,
        algorithm_name="noisy-linear-controller",
        description=("offrl tiny test dataset: InvertedPendulum-v5 with a 200-step limit, a linear controller "
                     f"K={TINY_GAINS.tolist()} with Gaussian action noise std cycling {list(TINY_NOISE)} per episode. "
                     "ref_min: uniform random policy, 100 episodes; ref_max: the noise-free controller, 100 episodes."),
        info={"recipe": "tiny", "seed": seed, "transitions": transitions},
    )


def rollout(env, policy: Callable[[np.ndarray], np.ndarray], seed: int, max_steps: int | None = None) -> Episode:
    """One episode in a single env; stops early (truncated) after `max_steps`."""
    obs, _ = env.reset(seed=seed)
    if seed is not None:
        env.action_space.seed(seed)
    observations, actions, rewards, terms, truncs = [obs], [], [], [], []
    while True:
        action = np.asarray(policy(obs), dtype=np.float32).reshape(env.action_space.shape)
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
        terms.append(terminated)
        cut = max_steps is not None and len(actions) >= max_steps
        truncs.append(truncated or (cut and not terminated))
        if terminated or truncated or cut:
            break
    return Episode(np.asarray(observations), np.asarray(actions), np.asarray(rewards, dtype=np.float64),
                   np.asarray(terms), np.asarray(truncs), seed)


# ------------------------------------------------------------------------- the D4RL-style suite
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
LEVEL_SEEDS = {"random": 1_000_000, "medium": 2_000_000, "medium-replay": 3_000_000, "expert": 4_000_000}
REF_SEED = 123  # reference-score episodes reset with 123, 124, ... (Minari seeds its first reset with 123 and
# leaves the later ones unseeded: the same statistics, not the same episodes)
REF_EPISODES = 100
DATASET_SIZE = 1_000_000


def policies_root() -> Path:
    """Where the behaviour-policy manifests live: the package's data folder, or $OFFRL_POLICIES_PATH."""
    return Path(os.environ.get("OFFRL_POLICIES_PATH") or Path(__file__).resolve().parent.parent / "assets" / "policies")


def manifests() -> dict[str, dict]:
    """{env key (e.g. 'hopper'): manifest} for every policy folder with a manifest.json."""
    found = {}
    root = policies_root()
    if root.is_dir():
        for path in sorted(root.glob("*/manifest.json")):
            manifest = json.loads(path.read_text())
            manifest["dir"] = str(path.parent)
            found[path.parent.name] = manifest
    return found


def suite_ids() -> list[str]:
    return [f"offrl/{env}/{level}-v0" for env in manifests() for level in LEVELS]


def parse_suite_id(dataset_id: str) -> tuple[str, str] | None:
    parts = dataset_id.split("/")
    if len(parts) == 3 and parts[0] == "offrl" and parts[2].endswith("-v0") and parts[2][:-3] in LEVELS:
        return parts[1], parts[2][:-3]
    return None


def file_sha256(path: str | Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


class SuiteBuilder:
    """Makes suite datasets, sharing reference scores and the medium/expert episodes between
    levels of one env (medium-expert = medium + expert)."""

    def __init__(self, show_progress: bool = True):
        self._refs: dict[str, tuple[float, float]] = {}
        self._episodes: dict[tuple[str, str], list[Episode]] = {}
        self.show_progress = show_progress

    def _transitions_progress(self, label: str, total: int):
        """A progress line for `rollout.collect`: transitions, finished episodes, rate and ETA."""
        from offrl.logging import Progress

        bar = Progress(total, label, self.show_progress, min_interval=5.0, unit="transition")

        def report(collected: int, episodes: int) -> None:
            bar.update(collected, extra=f"{episodes} episodes", force=collected == total)
            if collected == total:
                bar.close()
        return report

    def _episodes_progress(self, label: str, episodes: int, horizon: int):
        """A progress line for `rollout.average_return`, in env steps out of the most there can be
        (every episode running to the time limit), with the episodes finished so far."""
        from offrl.logging import Progress

        bar = Progress(episodes * horizon, label, self.show_progress, min_interval=5.0, unit="env step")
        done = [False]

        def report(finished: int, steps: int) -> None:
            if not done[0]:
                bar.update(steps, extra=f"{finished}/{episodes} episodes done", force=finished == episodes)
                if finished == episodes:
                    done[0] = True
                    bar.close()
        return report

    def policy(self, manifest: dict, name: str):
        from offrl.policies import load_policy

        return load_policy(Path(manifest["dir"]) / name)

    def reference_scores(self, env: str, manifest: dict) -> tuple[float, float]:
        """ref_min: uniform random policy; ref_max: the expert policy with sampled actions, as it
        acts in the data; 100 episodes each, resets seeded 123, 124, ..."""
        from offrl.data import rollout

        if env not in self._refs:
            spec = manifest["env_id"]
            space = _action_space(spec)
            horizon = gym_spec(spec).max_episode_steps or 1000
            ref_min = rollout.average_return(spec, rollout.uniform_policy(space, REF_SEED), REF_EPISODES, REF_SEED,
                                             self._episodes_progress(f"{env} reference score, random policy",
                                                                     REF_EPISODES, horizon))
            expert = rollout.sampled_policy(self.policy(manifest, manifest["expert"]["file"]), REF_SEED)
            ref_max = rollout.average_return(spec, expert, REF_EPISODES, REF_SEED,
                                             self._episodes_progress(f"{env} reference score, expert policy",
                                                                     REF_EPISODES, horizon))
            self._refs[env] = (ref_min, ref_max)
        return self._refs[env]

    def episodes(self, env: str, level: str, manifest: dict) -> list[Episode]:
        from offrl.data import rollout

        key = (env, level)
        if key in self._episodes:
            return self._episodes[key]
        spec, seed = manifest["env_id"], LEVEL_SEEDS.get(level, 0)
        size = int(manifest.get("dataset_size", DATASET_SIZE))
        label = f"offrl/{env}/{level}-v0: rollouts"
        if level == "random":
            episodes = rollout.collect(spec, rollout.uniform_policy(_action_space(spec), seed), size, seed,
                                       progress=self._transitions_progress(label, size))
        elif level in ("medium", "expert"):
            policy = rollout.sampled_policy(self.policy(manifest, manifest[level]["file"]), seed)
            episodes = rollout.collect(spec, policy, size, seed, progress=self._transitions_progress(label, size))
        elif level == "medium-replay":
            size = int(manifest["medium"]["step"])
            episodes = rollout.collect(spec, self.replay_schedule(manifest, seed), size, seed,
                                       progress=self._transitions_progress(label, size))
        elif level == "medium-expert":
            episodes = self.episodes(env, "medium", manifest) + self.episodes(env, "expert", manifest)
        else:
            raise ValueError(level)
        if level in ("medium", "expert"):
            self._episodes[key] = episodes
        return episodes

    def replay_schedule(self, manifest: dict, seed: int):
        """What the SAC learner acted with until it reached medium: uniform actions for its first
        `learning_starts` steps, then snapshot k from its step on (snapshot 1 from learning_starts)."""
        from offrl.data import rollout

        schedule = [(0, rollout.uniform_policy(_action_space(manifest["env_id"]), seed))]
        snapshots = [s for s in manifest["replay"] if s["step"] < manifest["medium"]["step"]]
        for k, snapshot in enumerate(snapshots):
            start = int(manifest["learning_starts"]) if k == 0 else int(snapshot["step"])
            schedule.append((start, rollout.sampled_policy(self.policy(manifest, snapshot["file"]), seed + 1 + k)))
        return rollout.scheduled_policy(schedule)

    def made(self, dataset_id: str) -> MadeDataset:
        parsed = parse_suite_id(dataset_id)
        all_manifests = manifests()
        if parsed is None or parsed[0] not in all_manifests:
            known = ", ".join(["offrl/tiny-v0", *suite_ids()])
            raise DatasetError(dataset_id, f"no recipe to make it (known: {known})")
        env, level = parsed
        manifest = all_manifests[env]
        start = time.perf_counter()
        ref_min, ref_max = self.reference_scores(env, manifest)
        episodes = self.episodes(env, level, manifest)
        used = {"random": [], "medium": [manifest["medium"]["file"]], "expert": [manifest["expert"]["file"]],
                "medium-expert": [manifest["medium"]["file"], manifest["expert"]["file"]],
                "medium-replay": [s["file"] for s in manifest["replay"] if s["step"] < manifest["medium"]["step"]]}[level]
        return MadeDataset(
            episodes=episodes, env_spec=gym_spec(manifest["env_id"]), ref_min_score=ref_min, ref_max_score=ref_max,
            algorithm_name="sac" if level != "random" else "uniform-random",
            description=LEVEL_DESCRIPTIONS[level].format(env_id=manifest["env_id"], **_level_facts(manifest)),
            info={"recipe": "suite", "env": env, "level": level, "actions": "sampled", "seed": LEVEL_SEEDS.get(level),
                  "policies": {name: file_sha256(Path(manifest["dir"]) / name) for name in used},
                  "reference": {"episodes": REF_EPISODES, "seed": REF_SEED}, "seconds": time.perf_counter() - start},
        )


LEVEL_DESCRIPTIONS = {
    "random": "{env_id}, uniform random actions; episodes reset with seeds from the level seed up.",
    "medium": "{env_id}, SAC snapshot at env step {medium_step} (eval return {medium_return:.0f}; its sampled "
              "return about a third to a half of the expert's), actions sampled from the policy.",
    "medium-replay": "{env_id}, the SAC learner's experience until medium (env step {medium_step}): uniform actions "
                     "for {learning_starts} steps, then each saved snapshot in turn (the first from there, each "
                     "later one from its step), actions sampled.",
    "expert": "{env_id}, final SAC policy (env step {expert_step}, eval return {expert_return:.0f}), actions sampled.",
    "medium-expert": "{env_id}, the medium and expert datasets concatenated.",
}


def _level_facts(manifest: dict) -> dict:
    return {"medium_step": manifest["medium"]["step"], "medium_return": manifest["medium"].get("eval_return", float("nan")),
            "expert_step": manifest["expert"]["step"], "expert_return": manifest["expert"].get("eval_return", float("nan")),
            "learning_starts": manifest["learning_starts"]}


def gym_spec(env_id: str):
    import gymnasium as gym

    try:
        return gym.spec(env_id)
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, ...
        raise DatasetError(env_id, f"not a registered Gymnasium env ({e})") from None


def check_dataset_id(dataset_id: str) -> None:
    """A Minari id, (namespace/)name-v<version> (minari's own rule), before anything is made under it."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except (TypeError, ValueError):  # minari's TypeError: an id without -v<version>
        raise DatasetError(dataset_id, "not a dataset id of the form (namespace/)name-v<version>, e.g. "
                                       "my/hopper/custom-v0") from None


def _spaces(env_spec):
    """(action space, observation space) of an env."""
    import gymnasium as gym

    env = gym.make(env_spec)
    spaces = env.action_space, env.observation_space
    env.close()
    return spaces


def _action_space(env_spec):
    return _spaces(env_spec)[0]


STITCH_ID = "offrl/pointmaze/umaze-stitch-v0"  # offrl.data.maze


def known_ids() -> list[str]:
    return ["offrl/tiny-v0", STITCH_ID, *suite_ids()]


def _recipe(dataset_id: str, info: dict | None = None, builder: "SuiteBuilder | None" = None) -> MadeDataset:
    """The MadeDataset of an offrl id (`info`: the stored recipe arguments, when regenerating)."""
    info = info or {}
    if dataset_id == "offrl/tiny-v0":
        return make_tiny(seed=info.get("seed", 0), transitions=info.get("transitions", 10_000))
    if dataset_id == STITCH_ID:
        from offrl.data.maze import make_stitch

        return make_stitch(seed=info.get("seed", 0), episodes_per_group=info.get("episodes_per_group", 250))
    return (builder or SuiteBuilder()).made(dataset_id)


def make(dataset_id: str, overwrite: bool = False, builder: SuiteBuilder | None = None) -> dict:
    """Make an offrl dataset; returns its id, checksum, size and generation time in seconds."""
    start = time.perf_counter()
    if dataset_id in known_ids() and dataset_id not in ("offrl/tiny-v0", STITCH_ID):  # an unknown id: _recipe's error
        print(f"making {dataset_id} from the committed behaviour policies (reference scores, then the rollouts)",
              file=sys.stderr, flush=True)
    made = _recipe(dataset_id, builder=builder)
    made.info["seconds"] = round(time.perf_counter() - start, 1)
    checksum = write_minari_dataset(dataset_id, made, overwrite=overwrite)
    reference = reference_checksums().get(dataset_id)
    if reference is not None and reference != checksum:
        # seen on a 2-core Xeon with AMX: halfcheetah medium and medium-expert, hopper medium-expert (float
        # differences in the rollouts, over long chaotic episodes); the data are of the same recipe, not the
        # reference's bytes
        print(f"warning: {dataset_id} made here has checksum {checksum}, the committed reference {reference} "
              f"({reference_checksums_path()}): this machine does not regenerate it exactly (floating-point "
              "differences in the rollouts), so runs on it are not comparable bit for bit with runs on the "
              "reference data; each run records the checksum it trained on (dataset.json)"
              + ("" if os.environ.get("MKL_CBWR") else "; on an Intel CPU, MKL_CBWR=SSE4_2 in the environment has "
                 "made some of them with the reference bytes (README, 'The offrl dataset suite')"), file=sys.stderr)
    return {"id": dataset_id, "checksum": checksum, "seconds": time.perf_counter() - start,
            "episodes": len(made.episodes), "transitions": int(sum(len(e) for e in made.episodes))}


def regenerate_checksum(dataset_id: str) -> str:
    """Regenerate a dataset in a scratch folder and return the checksum it gets."""
    return regenerate(dataset_id)[0]


def regenerate(dataset_id: str) -> tuple[str, tuple[float, float]]:
    """Regenerate a dataset in a scratch folder: the checksum it gets (of its arrays) and its reference scores,
    which the checksum does not cover (100 rollouts of the random and expert policies)."""
    if dataset_id in suite_ids():
        made = SuiteBuilder().made(dataset_id)  # needs only the committed policies, not a local copy
    elif dataset_id == STITCH_ID and not exists(dataset_id):
        made = _recipe(dataset_id)  # checked against the committed reference checksum
    else:
        info = stored_info(dataset_id)
        made = make_custom_from_info(info) if info.get("recipe") == "custom" else _recipe(dataset_id, info)
    with tempfile.TemporaryDirectory() as scratch, _minari_root(Path(scratch)):
        return write_minari_dataset(dataset_id, made), (made.ref_min_score, made.ref_max_score)


def local_metadata(dataset_id: str) -> dict:
    """The local copy's Minari metadata.json."""
    path = local_path(dataset_id) / "data" / "metadata.json"
    if not path.exists():
        raise DatasetError(dataset_id, "not on this machine (make it first with `offrl datasets make`)")
    try:
        meta = json.loads(path.read_text())
        raw = meta.get("offrl")
        if isinstance(raw, str):
            json.loads(raw)
        return meta
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        raise DatasetError(dataset_id, f"its {path} cannot be read ({type(exc).__name__}: {exc}); make it again "
                                       "(`offrl datasets make`) or remove the folder") from None


def stored_info(dataset_id: str) -> dict:
    raw = local_metadata(dataset_id).get("offrl")
    return json.loads(raw) if isinstance(raw, str) else (raw or {})


def differs_from_reference(dataset_id: str) -> tuple[str, str] | None:
    """(local checksum, committed reference) when this machine's copy of a suite dataset has other bytes than
    the reference; None when they match, or when either is missing."""
    reference = reference_checksums().get(dataset_id)
    local = stored_info(dataset_id).get("checksum") if exists(dataset_id) else None
    return (local, reference) if None not in (local, reference) and local != reference else None


def reference_checksums_path() -> Path:
    return policies_root() / "checksums.json"


def reference_checksums() -> dict[str, str]:
    """{suite id: checksum} of the datasets made where the policies were committed, so that any other
    machine can check that it regenerates the same data (`offrl datasets verify`)."""
    path = reference_checksums_path()
    return json.loads(path.read_text()) if path.exists() else {}


def record_reference_checksums() -> dict[str, str]:
    """Write the checksums of the suite datasets on this machine into the policies folder (kept for ids
    not on this machine)."""
    checksums = reference_checksums()
    for dataset_id in [STITCH_ID, *suite_ids()]:
        if exists(dataset_id):
            checksums[dataset_id] = stored_info(dataset_id)["checksum"]
    path = reference_checksums_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(checksums.items())), indent=2) + "\n")
    return checksums


def verify(dataset_id: str) -> dict:
    """Regenerate a dataset and compare its checksum with the local copy's (when on this machine) and
    with the committed reference (for suite datasets): both must match."""
    stored = stored_info(dataset_id).get("checksum") if exists(dataset_id) else None
    reference = reference_checksums().get(dataset_id)
    if stored is None and reference is None:
        if not exists(dataset_id):
            raise DatasetError(dataset_id, "not on this machine and no reference checksum for it")
        raise DatasetError(dataset_id, "has no offrl checksum in its metadata: it was not made by offrl")
    start = time.perf_counter()
    fresh, fresh_refs = regenerate(dataset_id)
    # the local copy's reference scores too: a machine whose rollouts differ can match the arrays' checksum and
    # still compute other scores (normalized scores would move with them)
    stored_refs = _stored_reference_scores(dataset_id) if stored is not None else None
    refs_ok = stored_refs is None or stored_refs == fresh_refs
    return {"id": dataset_id, "stored": stored, "reference": reference, "regenerated": fresh,
            "reference_scores": {"stored": stored_refs, "regenerated": fresh_refs},
            "ok": refs_ok and all(c == fresh for c in (stored, reference) if c is not None),
            "seconds": time.perf_counter() - start}


def _stored_reference_scores(dataset_id: str) -> tuple[float, float] | None:
    meta = local_metadata(dataset_id)
    low, high = meta.get("ref_min_score"), meta.get("ref_max_score")
    return None if low is None or high is None else (float(low), float(high))


def ensure(dataset_id: str) -> None:
    """Make an offrl dataset when it is not on disk yet (no-op for other ids)."""
    if dataset_id in known_ids() and not exists(dataset_id):
        result = make(dataset_id)
        print(f"made {dataset_id}: {result['transitions']} transitions, {result['episodes']} episodes in "
              f"{result['seconds']:.0f} s -> {local_path(dataset_id)}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- bring your own policy
def make_custom(env_id: str, policy_path: str, steps: int, seed: int = 0, deterministic: bool = False,
                ref_min_score: float | None = None, ref_max_score: float | None = None) -> MadeDataset:
    """A dataset from any policy file `offrl.policies.load_policy` reads. Reference scores: the
    ones given (both), else the suite's for the same env (so scores compare), else none."""
    from offrl.data import rollout
    from offrl.policies import load_policy

    if (ref_min_score is None) != (ref_max_score is None):  # before minutes of rollouts; one alone was dropped
        raise OffrlError("give both reference scores (--ref-min-score and --ref-max-score) or neither")
    if ref_min_score is not None and not (math.isfinite(ref_min_score) and math.isfinite(ref_max_score)
                                          and ref_min_score != ref_max_score):
        # what the loader refuses, refused before the rollouts, not after them
        raise OffrlError(f"--ref-min-score {ref_min_score} --ref-max-score {ref_max_score}: two finite, different "
                         "returns")
    if ref_min_score is not None and ref_min_score > ref_max_score:
        print(f"warning: --ref-min-score {ref_min_score} is above --ref-max-score {ref_max_score}: normalized scores "
              "will fall as returns rise", file=sys.stderr)

    policy = load_policy(policy_path)
    env = gym_spec(env_id)
    space, observation_space = _spaces(env)
    if policy.actor.action_scale.numel() != int(np.prod(space.shape)):
        raise DatasetError(policy_path, f"policy acts in {policy.actor.action_scale.numel()} dims, env {env_id} in "
                           f"{int(np.prod(space.shape))}")
    obs_dim = policy.obs_dim()
    if obs_dim is not None and obs_dim != int(np.prod(observation_space.shape)):
        raise DatasetError(policy_path, f"policy reads {obs_dim} observation dims, env {env_id} gives "
                           f"{int(np.prod(observation_space.shape))}")
    episodes = rollout.collect(env, rollout.sampled_policy(policy, seed, deterministic), steps, seed)
    ref_source = "given"
    if ref_min_score is None or ref_max_score is None:
        suite_env = next((k for k, m in manifests().items() if m["env_id"] == env_id), None)
        if suite_env is not None:
            ref_min_score, ref_max_score = SuiteBuilder().reference_scores(suite_env, manifests()[suite_env])
            ref_source = f"offrl suite ({suite_env})"
        else:
            ref_min_score = ref_max_score = None
            ref_source = None
    return MadeDataset(
        episodes=episodes, env_spec=env, ref_min_score=ref_min_score, ref_max_score=ref_max_score,
        algorithm_name=f"policy:{Path(policy_path).name}",
        description=f"{env_id}, {steps} steps of policy {Path(policy_path).name} "
                    f"({'deterministic' if deterministic else 'sampled'} actions), seed {seed}.",
        info={"recipe": "custom", "env_id": env_id, "policy": str(Path(policy_path).resolve()),
              "policy_sha256": file_sha256(policy_path), "steps": steps, "seed": seed,
              "deterministic": deterministic, "ref_min_score": ref_min_score, "ref_max_score": ref_max_score,
              "ref_source": ref_source},
    )


def make_custom_from_info(info: dict) -> MadeDataset:
    if not Path(info["policy"]).exists():
        raise DatasetError(info["policy"], "the policy file this dataset was made from is gone; cannot regenerate")
    if file_sha256(info["policy"]) != info["policy_sha256"]:
        raise DatasetError(info["policy"], "the policy file changed since the dataset was made")
    return make_custom(info["env_id"], info["policy"], info["steps"], info["seed"], info["deterministic"],
                       info["ref_min_score"], info["ref_max_score"])
