"""The dataset suite's machinery on a small stand-in: random-init SAC-shaped actors for
InvertedPendulum-v5 with a manifest of the same format as the real behaviour policies."""

import importlib.util
import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from offrl import policies
from offrl.data import load_dataset, rollout, suite
from offrl.nets import TanhGaussianActor

from conftest import PYTHON, run_cli

ENV = "InvertedPendulum-v5"


@pytest.fixture(scope="module")
def policy_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    folder = root / "pendulum"
    folder.mkdir()
    for step, seed in [(1000, 1), (2000, 2), (5000, 3)]:
        torch.manual_seed(seed)
        actor = TanhGaussianActor(4, 1, [-3.0], [3.0], (32, 32))
        name = "expert.pt" if step == 5000 else f"actor_{step:07d}.pt"
        policies.save_actor(folder / name, actor, env_id=ENV, step=step, hidden=(32, 32))
    manifest = {"format": "offrl-suite-policies-v1", "env_id": ENV, "learning_starts": 500, "actor_every": 1000,
                "dataset_size": 1500, "expert": {"file": "expert.pt", "step": 5000, "eval_return": 30.0},
                "medium": {"file": "actor_0002000.pt", "step": 2000, "eval_return": 12.0},
                "replay": [{"file": "actor_0001000.pt", "step": 1000}, {"file": "actor_0002000.pt", "step": 2000}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    mp = pytest.MonkeyPatch()
    mp.setenv("OFFRL_POLICIES_PATH", str(root))
    yield root
    mp.undo()


def test_collect_is_exact_and_deterministic():
    space = gym.make(ENV).action_space
    runs = [rollout.collect(ENV, rollout.uniform_policy(space, 5), 1234, seed=40, num_envs=7) for _ in range(2)]
    assert sum(len(e) for e in runs[0]) == 1234
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
    seeds = [e.seed for e in runs[0]]
    assert len(set(seeds)) == len(seeds) and min(seeds) == 40
    assert all(e.terminations[-1] or e.truncations[-1] for e in runs[0])
    assert all(not (e.terminations[:-1].any() or e.truncations[:-1].any()) for e in runs[0])


def test_scheduled_policy_switches_at_the_given_steps():
    calls = []
    schedule = rollout.scheduled_policy([(0, lambda o, s: calls.append(("a", s)) or np.zeros((len(o), 1))),
                                         (10, lambda o, s: calls.append(("b", s)) or np.ones((len(o), 1)))])
    for step in (0, 9, 10, 25):
        schedule(np.zeros((1, 4)), step)
    assert calls == [("a", 0), ("a", 9), ("b", 10), ("b", 25)]
    with pytest.raises(ValueError):
        rollout.scheduled_policy([(5, None)])


def test_all_levels_made_listed_and_consistent(policy_root):
    out = run_cli("offrl", "datasets", "make", "--all").stdout
    ids = [f"offrl/pendulum/{level}-v0" for level in suite.LEVELS]
    for dataset_id in ids:
        assert f"made {dataset_id}" in out
    listed = run_cli("offrl", "datasets", "list").stdout
    assert all(f"{i} " in listed and "local" in listed for i in ids)
    data = {level: load_dataset(f"offrl/pendulum/{level}-v0") for level in suite.LEVELS}
    assert len(data["random"]) == len(data["medium"]) == len(data["expert"]) == 1500
    assert len(data["medium-replay"]) == 2000  # the learner's experience until the medium snapshot
    assert len(data["medium-expert"]) == 3000
    np.testing.assert_array_equal(data["medium-expert"].observations[:1500], data["medium"].observations)
    refs = {(d.metadata["ref_min_score"], d.metadata["ref_max_score"]) for d in data.values()}
    assert len(refs) == 1  # one pair of reference scores per env
    info = data["medium-replay"].metadata["offrl"]
    assert info["level"] == "medium-replay" and list(info["policies"]) == ["actor_0001000.pt"]
    assert info["actions"] == "sampled"
    again = run_cli("offrl", "datasets", "make", "--all").stdout
    assert "offrl/pendulum/random-v0: already made" in again
    # --all also made MBRCSL's point-maze stitching data (the optional extra installed): its recipe regenerates
    # the committed reference's bytes (the stand-in's checksums.json has none, so compare with the package's)
    if importlib.util.find_spec("gymnasium_robotics") is None:
        assert f"{suite.STITCH_ID}: skipped, it needs gymnasium-robotics" in out
    else:
        committed = json.loads((Path(suite.__file__).resolve().parents[1] / "assets" / "policies" / "checksums.json").read_text())
        assert suite.stored_info(suite.STITCH_ID)["checksum"] == committed[suite.STITCH_ID]


def test_make_warns_when_this_machine_does_not_regenerate_the_reference(policy_root, capsys, monkeypatch):
    """A suite dataset whose checksum here differs from the committed reference is made, with a warning naming
    both (the data are usable; they are not the reference's bytes) and MKL_CBWR's hint (README) where the
    variable is not set already."""
    monkeypatch.delenv("MKL_CBWR", raising=False)
    made = suite.make("offrl/pendulum/random-v0", overwrite=True)
    assert "warning" not in capsys.readouterr().err  # no reference recorded: nothing to compare
    reference = policy_root / "checksums.json"
    reference.write_text(json.dumps({"offrl/pendulum/random-v0": made["checksum"]}))
    try:
        suite.make("offrl/pendulum/random-v0", overwrite=True)
        assert "warning" not in capsys.readouterr().err  # regenerated exactly
        reference.write_text(json.dumps({"offrl/pendulum/random-v0": "0123456789abcdef"}))
        suite.make("offrl/pendulum/random-v0", overwrite=True)
        err = capsys.readouterr().err
        assert f"checksum {made['checksum']}, the committed reference 0123456789abcdef" in err
        assert "MKL_CBWR=SSE4_2 in the environment has made some of them" in err
        monkeypatch.setenv("MKL_CBWR", "SSE4_2")  # set too late for this process's MKL: the message is all it changes
        suite.make("offrl/pendulum/random-v0", overwrite=True)
        err = capsys.readouterr().err
        assert "the committed reference 0123456789abcdef" in err and "MKL_CBWR" not in err
    finally:
        reference.unlink()


def test_verify_regenerates_exactly_and_catches_a_mismatch(policy_root):
    suite.ensure("offrl/pendulum/medium-replay-v0")
    out = run_cli("offrl", "datasets", "verify", "offrl/pendulum/medium-replay-v0").stdout
    assert "offrl/pendulum/medium-replay-v0: ok" in out
    meta_path = suite.local_path("offrl/pendulum/medium-replay-v0") / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    info = json.loads(meta["offrl"])
    info["checksum"] = "0" * 16
    meta["offrl"] = json.dumps(info)
    meta_path.write_text(json.dumps(meta))
    bad = run_cli("offrl", "datasets", "verify", "offrl/pendulum/medium-replay-v0", check=False)
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout and "did not regenerate exactly" in bad.stderr
    # the same arrays with other reference scores (which the checksum does not cover) are a mismatch too
    good = json.loads(meta_path.read_text())
    good["offrl"] = json.dumps({**info, "checksum": suite.regenerate_checksum("offrl/pendulum/medium-replay-v0")})
    good["ref_max_score"] = good["ref_max_score"] + 1.0
    meta_path.write_text(json.dumps(good))
    result = suite.verify("offrl/pendulum/medium-replay-v0")
    assert result["regenerated"] == result["stored"] and not result["ok"]
    assert result["reference_scores"]["stored"][1] == result["reference_scores"]["regenerated"][1] + 1.0


def test_bring_your_own_policy(policy_root, tmp_path, tiny):
    # a policy file ...
    run_cli("offrl", "datasets", "make", "--env", ENV, "--policy", str(policy_root / "pendulum" / "expert.pt"),
            "--steps", "700", "--id", "my/pendulum/custom-v0")
    ds = load_dataset("my/pendulum/custom-v0")
    assert len(ds) == 700 and ds.metadata["offrl"]["ref_source"] == "offrl suite (pendulum)"
    assert "my/pendulum/custom-v0: ok" in run_cli("offrl", "datasets", "verify", "my/pendulum/custom-v0").stdout
    # ... or a training checkpoint, with its state normalization
    run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "50", "--eval.every", "0", "--eval.episodes", "2",
            "--log.wandb", "disabled", "--hidden", "32", "--run.out-dir", str(tmp_path))
    (checkpoint,) = tmp_path.glob("td3_bc/*/*/checkpoints/last.pt")
    policy = policies.load_policy(checkpoint)
    assert policy.kind == "deterministic" and policy.obs_mean is not None
    run_cli("offrl", "datasets", "make", "--env", ENV, "--policy", str(checkpoint), "--steps", "300",
            "--id", "my/pendulum/td3bc-v0", "--ref-min-score", "0", "--ref-max-score", "200")
    assert load_dataset("my/pendulum/td3bc-v0").metadata["ref_max_score"] == 200.0
    partial = run_cli("offrl", "datasets", "make", "--env", ENV, "--steps", "10", check=False)
    assert partial.returncode == 1 and "needs all of" in partial.stderr


def test_dataset_card_is_generated_from_the_made_datasets(policy_root, tmp_path):
    builder = suite.SuiteBuilder()  # the stand-in's levels only: `make --all` would also make the point maze (~30 s)
    for dataset_id in (f"offrl/pendulum/{level}-v0" for level in suite.LEVELS):
        if not suite.exists(dataset_id):
            suite.make(dataset_id, builder=builder)
    out = tmp_path / "datasets.md"
    run_cli(PYTHON, "-m", "benchmarks.dataset_card", "--out", str(out))
    assert not (policy_root / "checksums.json").exists()  # the committed reference is written only when asked
    run_cli(PYTHON, "-m", "benchmarks.dataset_card", "--out", str(out), "--record-checksums")
    text = out.read_text()
    for level in suite.LEVELS:
        dataset_id = f"offrl/pendulum/{level}-v0"
        row = next(line for line in text.splitlines() if line.startswith(f"| {dataset_id} |"))
        transitions = len(load_dataset(dataset_id))
        assert f"| {transitions:,} |" in row
        assert f"`{load_dataset(dataset_id).checksum()}`" in row
    assert "Generated by `python -m benchmarks.dataset_card`" in text
    # the card records reference checksums with the policies; a machine without the dataset verifies
    # against them (as a second machine's checkout would), and a wrong reference is caught
    references = json.loads((policy_root / "checksums.json").read_text())
    assert references["offrl/pendulum/medium-v0"] == load_dataset("offrl/pendulum/medium-v0").checksum()
    shutil.rmtree(suite.local_path("offrl/pendulum/medium-v0"))
    out = run_cli("offrl", "datasets", "verify", "offrl/pendulum/medium-v0").stdout
    assert "offrl/pendulum/medium-v0: ok" in out and "reference" in out and "stored" not in out
    references["offrl/pendulum/medium-v0"] = "0" * 16
    (policy_root / "checksums.json").write_text(json.dumps(references))
    bad = run_cli("offrl", "datasets", "verify", "offrl/pendulum/medium-v0", check=False)
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout
    # the card, run on a machine whose bytes differ from the reference, says so and leaves the reference alone
    references["offrl/pendulum/random-v0"] = "0" * 16
    (policy_root / "checksums.json").write_text(json.dumps(references))
    warned = run_cli(PYTHON, "-m", "benchmarks.dataset_card", "--out", str(tmp_path / "again.md")).stderr
    assert f"warning: offrl/pendulum/random-v0 here has checksum {load_dataset('offrl/pendulum/random-v0').checksum()}, " \
        "the committed reference 0000000000000000" in warned
    assert json.loads((policy_root / "checksums.json").read_text()) == references
    (policy_root / "checksums.json").unlink()


def test_behaviour_policy_selection_picks_expert_and_earliest_medium(tmp_path, monkeypatch):
    """Expert: the best sampled return among the best-evaluated snapshots; medium: the earliest snapshot
    whose sampled return lies within a third to a half of the expert's. Returns are stubbed by step."""
    from benchmarks import suite_policies

    run = tmp_path / "run"
    (run / "actors").mkdir(parents=True)
    evals = {10: 50.0, 20: 300.0, 30: 420.0, 40: 450.0, 50: 900.0, 60: 1000.0}
    sampled = {10: 40.0, 20: 250.0, 30: 380.0, 40: 430.0, 50: 1100.0, 60: 950.0}
    for step, value in evals.items():
        torch.manual_seed(step)
        actor = TanhGaussianActor(4, 1, [-3.0], [3.0], (8,))
        policies.save_actor(run / "actors" / f"actor_{step:07d}.pt", actor, env_id=ENV, step=step, hidden=(8,),
                            last_eval={"eval/return_mean": value})
    (run / "config.json").write_text(json.dumps({"env_id": ENV, "learning_starts": 5, "actor_every": 10, "steps": 60,
                                                 "seed": 0, "batch_size": 8, "hidden": [8], "actor_lr": 1e-3,
                                                 "critic_lr": 1e-3, "gamma": 0.99, "tau": 0.005}))
    (run / "environment.json").write_text(json.dumps({"git_commit": "abc"}))
    monkeypatch.setattr(suite_policies, "sampled_return", lambda path, env_id, episodes: sampled[policies.describe(path)["step"]])
    manifest = suite_policies.select(run, episodes=2, expert_candidates=3)
    assert manifest["expert"]["step"] == 50  # best sampled among the 3 best evaluated (60, 50, 40)
    # wanted: 1100/3 = 367 .. 550; step 20 (250) is too low, step 30 (380) is the earliest inside
    assert manifest["medium"]["step"] == 30 and manifest["medium"]["file"] == "actor_0000030.pt"
    assert [s["step"] for s in manifest["replay"]] == [10, 20, 30]
    suite_policies.install(manifest, tmp_path / "installed" / "pendulum")
    files = sorted(p.name for p in (tmp_path / "installed" / "pendulum").iterdir())
    assert files == ["actor_0000010.pt", "actor_0000020.pt", "actor_0000030.pt", "expert.pt", "manifest.json"]


def test_generation_is_the_same_with_other_cpu_kernels(policy_root, tmp_path, monkeypatch):
    """A second machine's CPU runs other SIMD kernels (or none); torch's scalar kernels stand in for it.
    Sampled rollouts computed in float32 differ in the last bits between them; generation must not."""
    checksums = set()
    for capability in ("default", None):  # scalar kernels, then this machine's best (AVX2/AVX512/NEON)
        if capability:
            monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        else:
            monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / f"datasets-{capability}"))
        out = run_cli("offrl", "datasets", "make", "--env", ENV, "--policy", str(policy_root / "pendulum" / "expert.pt"),
                      "--steps", "3000", "--id", "test/kernels-v0", "--ref-min-score", "0", "--ref-max-score", "1").stdout
        checksums.add(out.split("checksum ")[1].split()[0])
    assert len(checksums) == 1


def test_generation_shows_progress(capsys):
    """Dataset generation draws a progress line (transitions, episodes, rate, ETA) that ends at 100%."""
    import gymnasium as gym

    from offrl.data import rollout
    from offrl.data.suite import SuiteBuilder

    builder = SuiteBuilder()
    calls = []
    bar = builder._transitions_progress("offrl/test: rollouts", 500)
    space = gym.make("InvertedPendulum-v5").action_space
    rollout.collect("InvertedPendulum-v5", rollout.uniform_policy(space, 0), 500, seed=0, num_envs=4,
                    progress=lambda n, e: (calls.append(n), bar(n, e)))
    assert calls == sorted(calls) and calls[-1] == 500
    err = capsys.readouterr().err
    assert "offrl/test: rollouts | transition 500/500 (100%)" in err and "episodes" in err and "eta" in err
    quiet = SuiteBuilder(show_progress=False)._transitions_progress("quiet", 10)
    quiet(10, 1)
    assert capsys.readouterr().err == ""

