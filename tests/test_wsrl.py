"""WSRL (algos/wsrl.py), its baselines and plot, and Cal-QL pre-training (algos/cql.py --calql): the warm-up,
the batches, the update count, Cal-QL's bound by hand, exact resume, and the command line on the tiny dataset."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from algos import wsrl
from algos.cql import CQL, Config as CQLConfig, calql_bound, cql_gap, mc_returns, sample_rows
from benchmarks import wsrl_plot
from offrl import checkpoint as ckpt
from offrl.config import DataConfig
from offrl.data import Batch, ReplayBuffer, load_for_training
from offrl.data.dataset import Dataset
from offrl.errors import CheckpointError, OffrlError
from offrl.losses import subsampled_critic_min, subsampled_min
from offrl.nets import EnsembleCritic
from offrl.sac import SACAgent

from conftest import PYTHON, VOLATILE, assert_compiled_critics_train_as_eager, assert_reevaluation_reproduces, run_cli

QUIET = ["--eval.episodes", "2", "--log.wandb", "disabled", "--log.no-progress"]


@pytest.fixture(scope="module")
def pretrained(tiny, tmp_path_factory):
    """A few dozen steps of Cal-QL pre-training with WSRL's ensemble (10 LayerNorm critics, subsample 2,
    LayerNorm policy, max-target backup), through the command line."""
    out = tmp_path_factory.mktemp("pretrain")
    run_cli(PYTHON, "-m", "algos.cql", "--steps", "40", "--hidden", "32", "32", "--num-critics", "10",
            "--critic-subsample", "2", "--layer-norm", "--actor-layer-norm", "--max-target-backup", "--calql",
            "--n-actions", "2", "--batch-size", "64", "--eval.every", "0", "--log.every", "20", *QUIET,
            "--run.out-dir", str(out))
    (run_dir,) = out.glob("cql/*/*")
    return run_dir


def config(out, checkpoint, **changes):
    cfg = wsrl.Config(dataset="offrl/tiny-v0", checkpoint=checkpoint and str(checkpoint), steps=160, warmup_steps=60,
                      batch_size=32, hidden=(32, 32), buffer_size=1000)
    cfg.eval.every, cfg.eval.episodes = 40, 2
    cfg.log.every, cfg.log.wandb, cfg.log.progress = 20, "disabled", False
    cfg.run.out_dir, cfg.run.checkpoint_every = str(out), 100_000
    for name, value in changes.items():
        setattr(cfg, name, value)
    return cfg


def only_run(base):
    (run_dir,) = base.glob("wsrl/*/*")
    return run_dir


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    else:
        assert a == b, where


def test_cli_pretrain_calql_then_finetune_and_reevaluate(pretrained, tmp_path):
    pre_rows = [json.loads(line) for line in (pretrained / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["calql_bound_rate"] <= 1.0 for r in pre_rows if "critic_loss" in r)
    result = run_cli("offrl", "train", "wsrl", "--checkpoint", str(pretrained), "--steps", "300", "--warmup-steps",
                     "100", "--batch-size", "32", "--hidden", "32", "32", "--buffer-size", "1000", "--eval.every",
                     "100", "--log.every", "50", *QUIET, "--run.out-dir", str(tmp_path))
    assert "final normalized score" in result.stdout
    run_dir = only_run(tmp_path)
    final = json.loads((run_dir / "final.json").read_text())
    assert final["pretrained"]["algo"] == "cql" and final["pretrained"]["step"] == 40
    assert (final["learning_starts"], final["critic_updates"], final["actor_updates"]) == (100, 4 * 200, 200)
    logged = rows(run_dir)
    assert [r["step"] for r in logged if "eval/normalized_score" in r] == [0, 100, 200, 300]  # 0: the pre-trained
    assert [r["step"] for r in logged if "critic_loss" in r] == [150, 200, 250, 300]  # none during the warm-up
    assert any("train/episode_return" in r for r in logged)
    objects = ckpt.load(run_dir / "checkpoints" / "last.pt")["objects"]
    assert "offline_buffer" not in objects and objects["buffer"]["size"] == 300
    assert_reevaluation_reproduces(run_dir)  # `offrl eval` rebuilds a wsrl run


def test_warm_up_takes_no_gradient_step_and_acts_with_the_pretrained_policy(pretrained, tmp_path, monkeypatch):
    # on the CPU: the reference acts on the CPU with the CPU random state this test saves and restores
    cfg = config(tmp_path, pretrained, steps=100, warmup_steps=60, device="cpu")
    saved = ckpt.load(pretrained / "checkpoints" / "last.pt")["objects"]["agent"]
    reference = wsrl.WSRL(cfg, load_for_training(cfg.dataset, cfg.data), torch.device("cpu"))
    wsrl.load_pretrained(reference, str(pretrained), cfg)
    explore, update = wsrl.WSRL.explore, wsrl.WSRL.update
    actions, first_update = [], []

    def recording_explore(self, obs):
        before = torch.get_rng_state()
        action = explore(self, obs)
        after = torch.get_rng_state()
        torch.set_rng_state(before)  # the pre-trained policy's action for the same noise
        expected = explore(reference, obs)
        torch.set_rng_state(after)
        actions.append((self.critic_updates, action.clone(), expected))
        return action

    def recording_update(self, slices):
        if not first_update:  # the networks and Adam states are still the pre-trained ones
            first_update.append(len(actions))
            for name in ("actor", "critic", "critic_target"):
                assert_same(getattr(self, name).state_dict(), saved[name], name)
            for name in ("actor_opt", "critic_opt", "alpha_opt"):
                assert_same(getattr(self, name).state_dict()["state"], saved[name]["state"], name)
            assert torch.equal(self.log_alpha, saved["log_alpha"])
        return update(self, slices)

    monkeypatch.setattr(wsrl.WSRL, "explore", recording_explore)
    monkeypatch.setattr(wsrl.WSRL, "update", recording_update)
    final = wsrl.train(cfg)
    assert len(actions) == 100 and first_update == [61]  # first update after env step 61
    assert all(updates == 0 and torch.equal(action, expected) for updates, action, expected in actions[:60])
    assert not all(torch.equal(action, expected) for _, action, expected in actions[61:])  # fine-tuning changed it
    # the update counter: UTD x env steps after the warm-up
    objects = ckpt.load(only_run(tmp_path) / "checkpoints" / "last.pt")["objects"]
    assert objects["agent"]["critic_updates"] == final["critic_updates"] == 4 * 40
    assert objects["agent"]["actor_updates"] == 40
    stored = objects["buffer"]["rows"][:, 4:5]  # InvertedPendulum: 4 observation numbers, then the action
    assert torch.equal(stored, torch.cat([action for _, action, _ in actions]))


def test_offline_ratio_zero_never_reads_offline_data():
    online, offline = ReplayBuffer(2, 1, 100, seed=0), ReplayBuffer(2, 1, 100, seed=1)
    online.add(np.zeros((100, 2)), np.zeros((100, 1)), np.ones(100), np.zeros((100, 2)), np.zeros(100))
    offline.add(np.zeros((100, 2)), np.zeros((100, 1)), -np.ones(100), np.zeros((100, 2)), np.zeros(100))

    class Untouchable:
        def sample(self, n):
            raise AssertionError("the offline buffer was read")

    cfg = wsrl.Config(batch_size=32, utd=4, offline_ratio=0.0)
    slices = wsrl.sample_slices(online, Untouchable(), cfg)
    assert len(slices) == 4 and all(s.rewards.shape == (8,) and (s.rewards == 1).all() for s in slices)
    cfg.offline_ratio = 0.5  # every critic slice half offline; the actor batch is their union
    slices = wsrl.sample_slices(online, offline, cfg)
    assert [int((s.rewards == -1).sum()) for s in slices] == [4, 4, 4, 4]
    assert wsrl.concat(slices).rewards.shape == (32,)
    # updates start after the warm-up, and no sooner than one batch's online rows exist (the reference's rule)
    assert wsrl.learning_starts(wsrl.Config()) == 5000
    assert wsrl.learning_starts(wsrl.Config(warmup_steps=0)) == 1024
    assert wsrl.learning_starts(wsrl.Config(warmup_steps=0, offline_ratio=0.5)) == 512


def test_reference_optimizer_steps_add_the_references_momentum_only_steps(tiny):
    """--reference-optimizer-steps: per env step (UTD 4) the actor and temperature take 4 momentum-only Adam steps
    beside the critic's 4 and their own real one, the critics one beside the actor's, as the reference's
    update_high_utd computes; off, each optimizer takes exactly its own steps."""
    data = load_for_training("offrl/tiny-v0", DataConfig())
    out = {}
    for reference in (False, True):
        cfg = wsrl.Config(batch_size=64, hidden=(32, 32), reference_optimizer_steps=reference)
        torch.manual_seed(0)
        agent = wsrl.WSRL(cfg, data, torch.device("cpu"))
        buffer = ReplayBuffer.from_dataset(data.dataset, torch.device("cpu"), seed=0)
        torch.manual_seed(1)
        for _ in range(2):
            agent.update(wsrl.sample_slices(buffer, None, cfg))

        def steps(opt):
            return {int(st["step"]) for st in opt.state.values()}
        out[reference] = (steps(agent.actor_opt), steps(agent.alpha_opt), steps(agent.critic_opt),
                          [p.detach().clone() for p in agent.actor.parameters()])
    assert out[False][:3] == ({2}, {2}, {8})
    assert out[True][:3] == ({10}, {10}, {10})
    # the momentum-only steps moved the actor: its weights differ from the plain run's after the same batches
    assert any(not torch.equal(a, b) for a, b in zip(out[False][3], out[True][3]))


def test_shared_critic_output_as_the_references_code_builds_its_ensemble(tiny, tmp_path):
    """--shared-critic-output: the 10 critics keep their own hidden layers and LayerNorms but share one output
    layer (WSRL's ensemblize wraps only the hidden layers); a pre-training made so fine-tunes only so."""
    out = tmp_path / "pre"
    run_cli(PYTHON, "-m", "algos.cql", "--steps", "4", "--hidden", "32", "32", "--num-critics", "10",
            "--critic-subsample", "2", "--layer-norm", "--actor-layer-norm", "--max-target-backup",
            "--shared-critic-output", "--n-actions", "2", "--batch-size", "16", "--eval.every", "0", *QUIET,
            "--run.out-dir", str(out))
    (run_dir,) = out.glob("cql/*/*")
    cfg = config(tmp_path, run_dir, shared_critic_output=True)
    agent = wsrl.WSRL(cfg, load_for_training(cfg.dataset, cfg.data), torch.device("cpu"))
    head = agent.critic.net.net[-1]
    assert isinstance(head, torch.nn.Linear) and head.weight.shape == (1, 32)  # one output layer for all 10
    wsrl.load_pretrained(agent, str(run_dir), cfg)
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")["objects"]["agent"]["critic"]
    assert torch.equal(agent.critic.state_dict()["net.net.6.weight"], saved["net.net.6.weight"])
    q = agent.critic(torch.zeros(3, 4), torch.zeros(3, 1))
    assert q.shape == (10, 3) and len(set(q[:, 0].tolist())) == 10  # the members still differ (their hidden layers)
    separate = config(tmp_path, run_dir)
    with pytest.raises(CheckpointError, match="shared_critic_output"):
        wsrl.load_pretrained(wsrl.WSRL(separate, load_for_training(cfg.dataset, cfg.data), torch.device("cpu")),
                             str(run_dir), separate)


def test_compiled_critics_take_the_eager_update(tiny):
    """--run.compile compiles the LayerNorm critics and their targets (the elementwise work fuses on the CPU):
    the same updates as eager up to float rounding; the state_dict keys stay those checkpoints hold."""
    data = load_for_training("offrl/tiny-v0", DataConfig())
    results = []
    for compile in (False, True):
        cfg = wsrl.Config(batch_size=64, hidden=(32, 32))
        cfg.run.compile = compile
        torch.manual_seed(0)
        agent = wsrl.WSRL(cfg, data, torch.device("cpu"))
        buffer = ReplayBuffer.from_dataset(data.dataset, torch.device("cpu"), seed=0)
        torch.manual_seed(1)
        metrics = [agent.update(wsrl.sample_slices(buffer, None, cfg)) for _ in range(3)]
        results.append((agent, metrics))
    (eager, eager_metrics), (compiled, compiled_metrics) = results
    for name in ("critic", "critic_target"):
        assert getattr(compiled, name)._compiled_call_impl is not None and getattr(eager, name)._compiled_call_impl is None
    assert_compiled_critics_train_as_eager(compiled, eager, compiled_metrics, eager_metrics)
    # the step benchmarks/speed.py times: one UTD update from the dataset
    cfg = wsrl.Config(batch_size=64, hidden=(32, 32), offline_ratio=0.5)
    assert set(wsrl.benchmark_step(cfg, data, torch.device("cpu"))()) >= {"critic_loss", "actor_loss"}


def test_a_resumed_finetuning_run_continues_the_same_curve(pretrained, tmp_path):
    """Stopped during the warm-up and again during fine-tuning (with offline data retained, so both replay
    buffers are restored), the run ends with the same metrics rows and state as one never stopped."""
    straight = wsrl.train(config(tmp_path / "straight", pretrained, offline_ratio=0.5))
    for steps, resume in ((40, None), (120, "latest"), (160, "latest")):
        resumed = wsrl.train(config(tmp_path / "stopped", pretrained, offline_ratio=0.5, steps=steps, resume=resume))
    a, b = only_run(tmp_path / "straight"), only_run(tmp_path / "stopped")
    assert rows(a) == rows(b) and any("critic_loss" in r for r in rows(a))
    assert ({k: v for k, v in straight.items() if k not in VOLATILE}
            == {k: v for k, v in resumed.items() if k not in VOLATILE})
    assert resumed["resumes"] == 2
    first, second = (ckpt.load(d / "checkpoints" / "last.pt") for d in (a, b))
    assert "offline_buffer" in first["objects"]
    assert_same(first["objects"], second["objects"], "objects")


def test_baselines_through_the_same_entry_point_and_their_plot(pretrained, tmp_path, monkeypatch):
    explore = wsrl.WSRL.explore
    calls = []
    monkeypatch.setattr(wsrl.WSRL, "explore", lambda self, obs: calls.append(1) or explore(self, obs))
    variants = {"WSRL": {}, "retain offline data 0.5": {"offline_ratio": 0.5}, "no warm-up": {"warmup_steps": 0},
                "SAC from scratch": {"checkpoint": "none"}}
    (tmp_path / "pre" / "0").mkdir(parents=True)  # a checkpoint file (not a folder), '{seed}' as a sweep names it
    shutil.copy(pretrained / "checkpoints" / "last.pt", tmp_path / "pre" / "0" / "last.pt")
    templated = str(tmp_path / "pre" / "{seed}" / "last.pt")
    for name, changes in variants.items():
        calls.clear()
        changes = {"steps": 80, "warmup_steps": 40, **changes}
        checkpoint = changes.pop("checkpoint", templated)
        final = wsrl.train(config(tmp_path / "runs" / name, checkpoint, **changes))
        starts = 32 if name == "no warm-up" else 40  # no warm-up: as soon as one batch's online rows exist
        assert final["critic_updates"] == 4 * (80 - starts), name
        assert (final["pretrained"] is None) == (name == "SAC from scratch")
        # from scratch: uniform-random warm-up actions, the policy's afterwards
        assert len(calls) == (40 if name == "SAC from scratch" else 80), name
    data = wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "curves.png"), "--title", "tiny"])
    curves = data["offrl/tiny-v0"]
    assert set(curves) == set(variants)
    assert all(c["steps"] == [0, 40, 80] and c["seeds"] == [1, 1, 1] for c in curves.values())
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "curves.json").read_text()) == data
    labelled = wsrl_plot.main([f"mine={tmp_path / 'runs' / 'WSRL'}", "--out", str(tmp_path / "one.png")])
    assert list(labelled["offrl/tiny-v0"]) == ["mine"]


def fake_run(folder, scores, **config):
    """A wsrl run folder with the given evaluations ({env step: normalized score})."""
    folder.mkdir(parents=True)
    config = {"dataset": "offrl/tiny-v0", "checkpoint": "pre/{seed}", "warmup_steps": 100, "batch_size": 64, "utd": 4,
              "offline_ratio": 0.0, "steps": 400, **config}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "eval/return_mean": 10 * score, "eval/normalized_score": score}) + "\n"
        for step, score in scores.items()))


def two_seeds_of_three_variants(folder):
    """WSRL, no warm-up and SAC from scratch, seeds 0 and 1, with evaluations every 100 of 400 env steps."""
    fake_run(folder / "w0", {0: 50, 100: 20, 200: 40, 300: 70, 400: 60}, seed=0)  # updates begin at 100
    fake_run(folder / "w1", {0: 30, 100: 30, 200: 10, 300: 50, 400: 80}, seed=1)
    fake_run(folder / "nw0", {0: 50, 100: 0, 200: 5, 300: 30, 400: 50}, warmup_steps=0, seed=0)  # begin at 64
    fake_run(folder / "nw1", {0: 30, 100: 25, 200: 20, 300: 50, 400: 60}, warmup_steps=0, seed=1)
    fake_run(folder / "sc0", {0: 1, 100: 2, 200: 3, 300: 4, 400: 75}, checkpoint="none", seed=0)
    fake_run(folder / "sc1", {0: 1, 100: 2, 200: 3, 300: 4, 400: 55}, checkpoint="none", seed=1)


def test_start_dip_and_last_by_hand(tmp_path):
    """The claims table: start at step 0, the lowest evaluation in the window after updates begin (the step they
    begin at is still the frozen policy's), the last, mean over seeds, and the checks' verdicts, each with the
    seeds it holds in."""
    two_seeds_of_three_variants(tmp_path)
    out = tmp_path / "claims.md"
    wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "100",
                    "--command", "make it"])
    text = out.read_text()
    # WSRL: starts 50, 30; lowest in (100, 200]: 40, 10; dips 10, 20; last 60, 80
    assert "| WSRL | 2 | 100 | 40.0 ± 10.0 | 25.0 ± 15.0 | 15.0 ± 5.0 | 70.0 ± 10.0 | 400 |" in text
    # no warm-up: lowest in (64, 164]: 0, 25; dips 50, 5
    assert "| no warm-up | 2 | 64 | 40.0 ± 10.0 | 12.5 ± 12.5 | 27.5 ± 22.5 | 55.0 ± 5.0 | 400 |" in text
    assert "WSRL's last score 70.0 vs its start 40.0: met (last >= start; in 2 of 2 seeds)" in text
    assert "WSRL's last score 70.0 vs SAC from scratch's 65.0: met (WSRL >= scratch; in 1 of 2 seeds)" in text
    # smaller for the mean (15 < 27.5) but not in seed 1 (20 against 5)
    assert "dip with warm-up 15.0 vs without 27.5: NOT met (with < without, for the mean and in every seed: in 1 of 2)" in text
    assert "make it" in text


def test_last_as_a_mean_of_the_last_evaluations_and_a_context_dip_window(tmp_path):
    """--last-evals K: 'last' (and the claims on it) is the mean of each run's last K evaluations, the final one
    shown beside it; --context-dip-window adds the dips over a longer window as context, not as a claim."""
    two_seeds_of_three_variants(tmp_path)
    out = tmp_path / "claims.md"
    wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "100",
                    "--last-evals", "2", "--context-dip-window", "300"])
    text = out.read_text()
    assert "| last 2 (mean) | final |" in text and "last = the mean of the last 2 evaluations" in text
    # WSRL's last two: (70, 60) and (50, 80): 65 and 65; finals 60 and 80
    assert "| WSRL | 2 | 100 | 40.0 ± 10.0 | 25.0 ± 15.0 | 15.0 ± 5.0 | 65.0 ± 0.0 | 70.0 ± 10.0 | 400 |" in text
    assert "WSRL's last-2 mean 65.0 vs its start 40.0: met (last >= start; in 2 of 2 seeds)" in text
    # scratch's last two: (4, 75) and (4, 55): 39.5 and 29.5
    assert "WSRL's last-2 mean 65.0 vs SAC from scratch's 34.5: met (WSRL >= scratch; in 2 of 2 seeds)" in text
    # within 300 steps: WSRL's lowest 40 and 10 (dips 10, 20), no warm-up's 0 and 20 (dips 50, 10)
    assert "within 300 env steps after the updates begin, the dip with warm-up 15.0 vs without 30.0" in text
    # a context window the runs do not get past gives no dip over part of it
    wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "100",
                    "--context-dip-window", "1000"])
    text = out.read_text()
    assert "the 1000-step context window is not past in seeds [0, 1]" in text and "within 1000 env steps" not in text


def test_claims_are_not_assessed_on_unfinished_runs_or_unmatched_seeds(tmp_path):
    fake_run(tmp_path / "w0", {0: 50, 100: 20, 200: 40, 300: 70, 400: 60}, seed=0)
    fake_run(tmp_path / "w1", {0: 30, 100: 30, 200: 10}, seed=1)  # stopped at 200 of its 400 steps
    fake_run(tmp_path / "sc0", {0: 1, 400: 75}, checkpoint="none", seed=0)
    fake_run(tmp_path / "nw0", {0: 50, 100: 0, 200: 5, 300: 30, 400: 50}, warmup_steps=0, seed=0)
    fake_run(tmp_path / "nw1", {0: 30, 100: 25}, warmup_steps=0, seed=1)  # not past its window (64, 164]
    out = tmp_path / "claims.md"
    wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "100"])
    text = out.read_text()
    assert "last >= start: not assessed (WSRL's seeds [1] are short of their budget)" in text
    assert ("WSRL >= scratch: not assessed (WSRL's seeds [1] are short of their budget; the seeds differ "
            "(WSRL: [0, 1], SAC from scratch: [0]))") in text
    assert "dip with warm-up < without: not assessed (no warm-up's seeds [1] are not past the dip window)" in text


def test_scratch_comparison_needs_one_last_step_and_curves_only_steps_every_seed_evaluated(tmp_path):
    """WSRL against SAC from scratch "at the same env steps": finished runs of other budgets are not compared; a
    curve holds only the steps every seed of its variant evaluated (not a mean over fewer seeds past one's end)."""
    fake_run(tmp_path / "w0", {0: 50, 100: 20, 200: 40, 300: 70, 400: 60}, seed=0)
    fake_run(tmp_path / "w1", {0: 30, 100: 30, 200: 10, 300: 50, 400: 80}, seed=1)
    fake_run(tmp_path / "sc0", {0: 1, 200: 75}, checkpoint="none", seed=0, steps=200)
    fake_run(tmp_path / "sc1", {0: 1, 200: 55}, checkpoint="none", seed=1, steps=200)
    fake_run(tmp_path / "r0", {0: 50, 200: 60, 400: 70}, seed=0, offline_ratio=0.5)
    fake_run(tmp_path / "r1", {0: 30, 200: 40}, seed=1, offline_ratio=0.5)
    out = tmp_path / "claims.md"
    data = wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png"), "--markdown", str(out),
                           "--dip-window", "100"])
    assert "WSRL >= scratch: not assessed (their last evaluations are at different env steps ([200, 400]))" in \
        out.read_text()
    curve = data["offrl/tiny-v0"]["retain offline data 0.5"]
    assert curve["steps"] == [0, 200] and curve["mean"] == [40.0, 50.0] and curve["seeds"] == [2, 2]


def test_claims_skip_set_aside_folders_and_refuse_a_seed_twice_or_an_empty_dip_window(tmp_path):
    """A folder a sweep set aside (`<run>.unstarted-<k>`, a restart before the first checkpoint) is not a run;
    a seed in two folders of one variant is an error; a dip window without an evaluation leaves the dip claim
    not assessed, saying why (it was 'NOT met' on NaN)."""
    fake_run(tmp_path / "runs" / "0-sweep", {0: 50, 100: 20, 200: 40, 300: 70, 400: 60}, seed=0)
    fake_run(tmp_path / "runs" / "0-sweep.unstarted-1", {0: 50}, seed=0)
    fake_run(tmp_path / "runs" / "sc", {0: 1, 400: 75}, checkpoint="none", seed=0)
    out = tmp_path / "claims.md"
    wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "100"])
    assert "| WSRL | 1 |" in out.read_text() and "(last >= start; in 1 of 1 seeds)" in out.read_text()
    fake_run(tmp_path / "runs" / "nw", {0: 50, 100: 0, 200: 5, 300: 30, 400: 50}, warmup_steps=0, seed=0)  # begin at 64
    wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png"), "--markdown", str(out), "--dip-window", "20"])
    assert ("dip with warm-up < without: not assessed (WSRL's seeds [0] have no evaluation in the dip window "
            "(--dip-window shorter than the runs' evaluation period)") in out.read_text()
    fake_run(tmp_path / "runs" / "again", {0: 50, 100: 20}, seed=0)
    with pytest.raises(SystemExit, match="seed 0 of WSRL on offrl/tiny-v0 has two run folders"):
        wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png")])
    # a negative dip window (it gave a table of nan), a run folder whose config.json is damaged (a traceback)
    with pytest.raises(SystemExit, match="^2$"):  # argparse's exit status, before the runs are read
        wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png"), "--dip-window", "-5"])
    (tmp_path / "runs" / "again" / "config.json").write_text("{")
    with pytest.raises(SystemExit, match="run folder .*again: cannot read its config.json"):
        wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png")])


def test_pretraining_level_is_the_mean_of_its_last_ten_evaluations_up_to_the_checkpoint(tmp_path):
    """Context beside the claims: per run, the mean of the pre-training run's last 10 evaluations at or before the
    step of the checkpoint fine-tuned (final.json's `pretrained`), read from the folder --checkpoint names ({seed}
    filled in, or a checkpoint file in it); '-' for SAC from scratch."""
    for seed, offset in ((0, 0.0), (1, 100.0)):
        pre = tmp_path / "pre" / f"{seed}-sweep"
        pre.mkdir(parents=True)
        (pre / "checkpoints").mkdir()
        (pre / "checkpoints" / "last.pt").write_bytes(b"")
        # evaluations 1..12 at steps 1000..12000; the checkpoint is at 11000: the mean of 2..11 is 6.5
        (pre / "metrics.jsonl").write_text("".join(
            json.dumps({"step": 1000 * k, "eval/return_mean": k + offset, "eval/normalized_score": k + offset}) + "\n"
            for k in range(1, 13)))
    checkpoints = {0: str(tmp_path / "pre" / "{seed}-sweep"), 1: str(tmp_path / "pre" / "1-sweep" / "checkpoints" / "last.pt")}
    for seed in (0, 1):
        run = tmp_path / "runs" / f"w{seed}"
        fake_run(run, {0: 50, 100: 20, 200: 40}, checkpoint=checkpoints[seed], seed=seed)
        (run / "final.json").write_text(json.dumps({"pretrained": {"file": "x", "algo": "cql", "step": 11000}}))
    fake_run(tmp_path / "runs" / "sc", {0: 1, 100: 2, 200: 3}, checkpoint="none")
    out = tmp_path / "claims.md"
    wsrl_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "c.png"), "--markdown", str(out)])
    text = out.read_text()
    assert "| 200 | 56.5 ± 50.0 |" in text  # seeds 0 and 1: 6.5 and 106.5
    assert "| SAC from scratch | 1 |" in text and text.split("| SAC from scratch |")[1].split("\n")[0].endswith("| - |")
    assert "context, not a claim: WSRL's last score 40.0 vs the pre-training's level 56.5" in text


def test_clear_errors_for_checkpoints_and_options_that_do_not_fit(pretrained, tmp_path):
    with pytest.raises(OffrlError, match="needs --checkpoint"):
        wsrl.train(config(tmp_path, None))
    with pytest.raises(OffrlError, match="multiple of --utd"):
        wsrl.train(config(tmp_path, pretrained, batch_size=30))
    with pytest.raises(OffrlError, match="at least one offline row in each critic slice of 8"):
        wsrl.train(config(tmp_path, pretrained, offline_ratio=0.1))
    with pytest.raises(OffrlError, match="raw states"):
        wsrl.train(config(tmp_path, pretrained, data=DataConfig(normalize_states=True)))
    # --offline-ratio 0 reads no dataset row: options on the rows would be recorded as applied and do nothing
    with pytest.raises(OffrlError, match=r"online rows only \(--offline-ratio 0\).*--data.sampling return-weighted"):
        wsrl.train(config(tmp_path / "weighted", pretrained, data=DataConfig(sampling="return-weighted")))
    with pytest.raises(OffrlError, match="--data.corrupt rewards: wsrl reads no dataset rows at --offline-ratio 0"):
        wsrl.train(config(tmp_path / "corrupt", pretrained, data=DataConfig(corrupt="rewards")))
    with pytest.raises(OffrlError, match="--data.clip-actions: wsrl reads no dataset rows at --offline-ratio 0"):
        wsrl.train(config(tmp_path / "corrupt", pretrained, data=DataConfig(clip_actions=True)))
    assert not (tmp_path / "weighted").exists() and not (tmp_path / "corrupt").exists()
    # corrupted rewards still set --data.normalize-reward's scale of the online rewards: accepted there
    wsrl.check_config(config(tmp_path, pretrained, data=DataConfig(corrupt="rewards", normalize_reward=True)))
    with pytest.raises(CheckpointError, match="its actor does not fit"):  # refused before a run folder is made
        wsrl.train(config(tmp_path / "unfit", pretrained, hidden=(16, 16)))
    assert not (tmp_path / "unfit").exists()
    cfg = config(tmp_path, pretrained, hidden=(16, 16))
    agent = wsrl.WSRL(cfg, load_for_training(cfg.dataset, cfg.data), torch.device("cpu"))
    with pytest.raises(CheckpointError, match=r"its actor does not fit.*'hidden': \[32, 32\], 'num_critics': 10"):
        wsrl.load_pretrained(agent, str(pretrained), cfg)
    saved = json.loads(ckpt.load(pretrained / "checkpoints" / "last.pt")["config"])
    with pytest.raises(CheckpointError, match="pre-trained on offrl/tiny-v0"):
        wsrl.check_pretraining(saved, config(tmp_path, pretrained, dataset="other"), None, "x")
    cfg = config(tmp_path, pretrained)
    cfg.data.reward_scale = 2.0
    with pytest.raises(CheckpointError, match="reward-scale 1.0, this run has 2.0"):
        wsrl.check_pretraining(saved, cfg, None, "x")
    with pytest.raises(CheckpointError, match="normalize-states"):
        wsrl.check_pretraining({**saved, "data": {"normalize_states": True}}, config(tmp_path, pretrained), None, "x")
    with pytest.raises(CheckpointError, match="trained in Hopper-v5"):
        wsrl.check_pretraining({"env_id": "Hopper-v5"}, config(tmp_path, pretrained), "InvertedPendulum-v5", "x")


def test_calql_bound_by_hand():
    # two episodes: rewards 1, 2, 3 (cut by a time limit) and 4, 5 (terminal); gamma 0.5
    n = 5
    data = Dataset(np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32), np.array([1, 2, 3, 4, 5], np.float32),
                   np.zeros((n, 1), np.float32), np.array([0, 0, 0, 0, 1], np.float32),
                   np.array([0, 0, 1, 0, 0], np.float32), np.array([0, 3]))
    np.testing.assert_allclose(mc_returns(data, 0.5), [1 + 0.5 * (2 + 0.5 * 3), 2 + 0.5 * 3, 3, 4 + 0.5 * 5, 5])
    # sparse rewards: the episode that never left the failure reward (-1) gets -1 / (1 - gamma) on every row
    failed = Dataset(data.observations, data.actions, np.array([-1, -1, -1, -1, 0], np.float32),
                     data.next_observations, data.terminals, data.timeouts, data.episode_starts)
    np.testing.assert_allclose(mc_returns(failed, 0.5, sparse_failure=-1.0), [-2, -2, -2, -1 + 0.5 * 0, 0])
    np.testing.assert_allclose(mc_returns(failed, 0.5), [-1 - 0.5 - 0.25, -1 - 0.5, -1, -1, 0])
    # rewards after a transform are float32: r_neg = -1 * 1.0 + 0.1 matches the flag -0.9, not only exact values
    shifted = Dataset(data.observations, data.actions, np.array([-0.9, -0.9, -0.9, -0.9, 0], np.float32),
                      data.next_observations, data.terminals, data.timeouts, data.episode_starts)
    assert mc_returns(shifted, 0.5, sparse_failure=-1 * 1.0 + 0.1)[0] == pytest.approx(-1.8)
    # max(Q, V) per state, for every critic and sampled action; the gradient reaches Q only above the bound
    q = torch.tensor([[[0.0, 5.0], [3.0, 1.0]]], requires_grad=True)  # [E=1, B=2, N=2]
    bounded = calql_bound(q, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(bounded, torch.tensor([[[1.0, 5.0], [3.0, 2.0]]]))
    bounded.sum().backward()
    torch.testing.assert_close(q.grad, torch.tensor([[[0.0, 1.0], [1.0, 0.0]]]))
    # the case of test_cql_gap_by_hand with V(s) = 1: Q(s, a'~pi(s')) = 0 is lifted to 1 before -log pi(a'|s')
    q_data, q_uniform = torch.tensor([[0.5]]), torch.tensor([[[1.0]]])
    q_pi, q_next = torch.tensor([[[2.0]]]), torch.tensor([[[0.0]]])
    v = torch.tensor([1.0])
    gap = cql_gap(q_data, q_uniform, calql_bound(q_pi, v), calql_bound(q_next, v), math.log(0.5),
                  torch.tensor([[-1.0]]), torch.tensor([[0.5]]))
    expected = math.log(math.exp(1 - math.log(0.5)) + math.exp(2 + 1) + math.exp(1 - 0.5)) - 0.5
    assert gap.item() == pytest.approx(expected)


def test_the_lagrange_multiplier_starts_at_e_for_calql_and_at_1_for_cql(tiny):
    """Cal-QL's and CORL's code start log alpha' at 1, the original CQL at 0; --lagrange-init overrides both."""
    data = load_for_training(tiny, CQLConfig(dataset=tiny).data)
    start = {}
    for name, options in (("cql", {}), ("calql", {"calql": True}), ("set", {"calql": True, "lagrange_init": -2.0})):
        cfg = CQLConfig(dataset=tiny, hidden=(8, 8), lagrange=True, **options)
        start[name] = CQL(cfg, data, torch.device("cpu")).log_lagrange.item()
    assert start == {"cql": 0.0, "calql": 1.0, "set": -2.0}


def test_calql_in_the_cql_critic_loss(tiny):
    cfg = CQLConfig(dataset=tiny, hidden=(16, 16), n_actions=3, calql=True, num_critics=4, critic_subsample=2)
    data = load_for_training(tiny, cfg.data)
    agent = CQL(cfg, data, torch.device("cpu"))
    buffer = data.buffer("cpu", seed=0)
    returns = torch.as_tensor(mc_returns(data.dataset, cfg.gamma))
    batch, bound = sample_rows(buffer, 32, returns)
    assert_same(batch._asdict(), data.buffer("cpu", seed=0).sample(32)._asdict())  # the draw buffer.sample makes
    _, index = sample_rows(data.buffer("cpu", seed=0), 32, torch.arange(len(returns)))
    assert torch.equal(bound, returns[index]) and (bound > 0).all()  # the rows' own returns (tiny's rewards are > 0)
    losses = {}
    for name, lower in (("none", None), ("below", torch.full((32,), -1e6)), ("above", torch.full((32,), 1e6))):
        torch.manual_seed(0)
        losses[name] = agent.critic_loss(batch, lower)
    assert losses["below"][0].item() == pytest.approx(losses["none"][0].item())  # a bound below every Q: plain CQL
    assert losses["below"][1]["calql_bound_rate"].item() == 0.0 and losses["above"][1]["calql_bound_rate"].item() == 1.0
    assert losses["above"][1]["cql_gap"].item() > 1e5
    metrics = agent.update(batch, bound)
    assert torch.isfinite(metrics["critic_loss"]) and 0 <= metrics["calql_bound_rate"].item() <= 1


@pytest.mark.parametrize("options", [{}, {"calql": True, "lagrange": True},
                                     {"shared_critic_output": True, "layer_norm": True}])
def test_subsampled_penalty_evaluates_only_the_drawn_critics_with_the_all_critics_result(tiny, options):
    """With --critic-subsample k the penalty's sampled actions go through the k drawn critics only, not all E (the
    reference evaluates all E and discards the rest): the loss, the Lagrange loss and every gradient equal the
    all-critics formula with the same draw, each drawn critic's penalty weighted E / k, a repeated draw twice.
    With WSRL's shared output layer the drawn members' activations go through the one shared head."""
    cfg = CQLConfig(dataset=tiny, hidden=(16, 16), n_actions=3, num_critics=5, critic_subsample=2,
                    max_target_backup=True, **options)
    data = load_for_training(tiny, cfg.data)
    agent = CQL(cfg, data, torch.device("cpu"))
    batch = data.buffer("cpu", seed=0).sample(32)
    lower = torch.zeros(32) if cfg.calql else None
    B, n, E, k = 32, 3, 5, 2

    def all_critics_loss():  # every critic on every row; the drawn ones' penalties as weights on all E
        obs_rep = batch.observations.repeat_interleave(n, dim=0)
        with torch.no_grad():
            next_obs_rep = batch.next_observations.repeat_interleave(n, dim=0)
            next_actions, _ = agent.actor(batch.next_observations, repeat=n)
            next_q = subsampled_critic_min(agent.critic_target, next_obs_rep, next_actions, k).view(B, n)
            target = batch.rewards + cfg.gamma * (1.0 - batch.terminals) * next_q.max(dim=1).values
            uniform = agent.action_low + agent.action_range * torch.rand(B * n, agent.action_range.numel())
            pi_actions, log_pi = agent.actor(batch.observations, repeat=n)
            next_pi_actions, log_next_pi = agent.actor(batch.next_observations, repeat=n)
        drawn = torch.randint(E, (k,))
        q_all = agent.critic(torch.cat([batch.observations, obs_rep, obs_rep, obs_rep]),
                             torch.cat([batch.actions, uniform, pi_actions, next_pi_actions]))
        q_data = q_all[:, :B]
        q_uniform, q_pi, q_next_pi = q_all[:, B:].reshape(E, 3, B, n).unbind(dim=1)
        if lower is not None:
            q_pi, q_next_pi = calql_bound(q_pi, lower), calql_bound(q_next_pi, lower)
        gap = cql_gap(q_data, q_uniform, q_pi, q_next_pi, agent.log_uniform, log_pi.view(B, n),
                      log_next_pi.view(B, n))
        weights = torch.nn.functional.one_hot(drawn, E).sum(0).float() * (E / k)
        multiplier = agent.log_lagrange.exp().clamp(0.0, 1e6) if cfg.lagrange else 1.0
        penalty = (multiplier.detach() if cfg.lagrange else 1.0) * cfg.cql_alpha * (gap - cfg.target_gap * cfg.lagrange)
        loss = (((q_data - target) ** 2).mean(dim=1) + penalty * weights).sum()
        lagrange = -0.5 * (multiplier * cfg.cql_alpha * (gap.detach() - cfg.target_gap) * weights).sum() \
            if cfg.lagrange else torch.zeros(())
        return loss, lagrange, drawn

    draws = []
    for seed in range(4):  # seeds 0..3 draw distinct and repeated pairs of the 5 critics (checked below)
        results = []
        for compute in (lambda: agent.critic_loss(batch, lower), all_critics_loss):
            torch.manual_seed(seed)
            out = compute()
            loss, lagrange = (out[0], out[1]["lagrange_loss"]) if isinstance(out[1], dict) else out[:2]
            if not isinstance(out[1], dict):
                draws.append(len(set(out[2].tolist())))
            params = list(agent.critic.parameters()) + [agent.log_lagrange]
            grads = torch.autograd.grad(loss + lagrange, params, allow_unused=True)
            results.append((loss.detach(), lagrange.detach(), [g if g is not None else torch.zeros_like(p)
                                                               for g, p in zip(grads, params)]))
        (loss, lagrange, grads), (loss_all, lagrange_all, grads_all) = results
        assert loss.item() == pytest.approx(loss_all.item(), rel=1e-5)
        assert lagrange.item() == pytest.approx(lagrange_all.item(), rel=1e-5, abs=1e-6)
        for g, g_all in zip(grads, grads_all):
            torch.testing.assert_close(g, g_all, rtol=1e-4, atol=1e-5)
    assert 1 in draws and 2 in draws, draws  # a critic drawn twice (its penalty weighted twice) and two distinct


def test_subsampled_target_without_entropy_backup():
    """SACAgent's WSRL options: y = r + gamma (1 - d) min over 2 critics drawn at random, no -alpha log pi."""
    values = torch.arange(12.0).view(4, 3).flip(0)  # member i's values are 9 - 3 i, ..
    torch.testing.assert_close(subsampled_min(values, None), values.min(dim=0).values)
    torch.manual_seed(1)
    drawn = torch.randint(4, (2,))
    torch.manual_seed(1)
    torch.testing.assert_close(subsampled_min(values, 2), values[drawn].min(dim=0).values)
    assert any(torch.equal(subsampled_min(values, 1), member) for member in values)
    # evaluating only the drawn members gives the same draw and values as the full pass, and runs k members
    critic = EnsembleCritic(3, 1, 5, hidden=(8,), layer_norm=True)
    obs, actions = torch.randn(6, 3), torch.randn(6, 1)
    members_run = []
    critic.net.net[0].register_forward_hook(lambda module, args, out: members_run.append(out.shape[0]))
    for k in (None, 1, 2, 7):
        torch.manual_seed(3)
        want = subsampled_min(critic(obs, actions), k)
        torch.manual_seed(3)
        torch.testing.assert_close(subsampled_critic_min(critic, obs, actions, k), want)
        assert members_run[-1] == (5 if k is None else k)

    torch.manual_seed(0)
    agent = SACAgent(3, 1, np.array([-1.0]), np.array([1.0]), torch.device("cpu"), hidden=(8,), num_critics=5,
                     layer_norm=True, actor_layer_norm=True, critic_subsample=2, backup_entropy=False, gamma=0.9)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in agent.actor.modules())
    batch = Batch(torch.randn(6, 3), torch.rand(6, 1) * 2 - 1, torch.randn(6), torch.randn(6, 3),
                  torch.tensor([0.0, 1, 0, 0, 0, 0]))
    torch.manual_seed(7)
    with torch.no_grad():
        next_actions, _ = agent.actor(batch.next_observations)
        index = torch.randint(5, (2,))
        next_q = agent.critic_target(batch.next_observations, next_actions)[index].min(0).values
        target = batch.rewards + 0.9 * (1 - batch.terminals) * next_q
        expected = ((agent.critic(batch.observations, batch.actions) - target) ** 2).mean(dim=1).sum()
    torch.manual_seed(7)
    torch.testing.assert_close(agent.critic_step(batch)["critic_loss"], expected)


def test_online_rewards_get_the_datasets_transform():
    """EnvLoop.step stores r * scale + bias (as the pre-training data was transformed) and logs raw returns."""
    from offrl.online import EnvLoop

    loop, buffer = EnvLoop("InvertedPendulum-v5", seed=0), ReplayBuffer(4, 1, 100, seed=0)
    finished = None
    while finished is None:
        finished = loop.step(np.zeros(1, np.float32) + 3.0, buffer, reward_scale=2.0, reward_bias=-1.0)  # falls over
    n = finished["train/episode_length"]
    # InvertedPendulum-v5 pays 1 per step and 0 for the step that ends it: raw return n - 1, stored 2 r - 1
    assert buffer.size == n and finished["train/episode_return"] == n - 1
    assert buffer.storage[:n, 5].tolist() == [1.0] * (n - 1) + [-1.0]
    assert buffer.storage[n - 1, -1] == 1.0 and loop.episode_length == 0  # terminal stored, a new episode begun
    loop.env.close()


def test_plot_leaves_out_a_cut_off_last_line_and_names_a_damaged_one(tmp_path):
    """A killed process can cut the last metrics line short: left out. A damaged line before the last means a
    damaged record: one line naming it, no traceback, rather than a curve silently missing an evaluation."""
    two_seeds_of_three_variants(tmp_path)
    metrics = tmp_path / "w0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 500, "eval/ret')
    data = wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png")])
    (curves,) = data.values()
    assert curves["WSRL"]["steps"][-1] == 400
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines[:2], "{not json", *lines[2:]]))
    with pytest.raises(SystemExit, match=r"metrics.jsonl: line 3 is not JSON .*mend or move the run folder aside"):
        wsrl_plot.main([str(tmp_path), "--out", str(tmp_path / "c.png")])


def test_a_pretrained_checkpoint_brings_its_optimizer_states_not_its_devices_flags(pretrained, tmp_path):
    """A checkpoint pre-trained on CUDA records capturable optimizers; loaded as it is into a CPU fine-tuning run,
    a non-fused Adam's next step failed on torch's device assertion."""
    state = ckpt.load(pretrained / "checkpoints" / "last.pt")
    for name in ("actor_opt", "critic_opt", "alpha_opt"):
        for group in state["objects"]["agent"][name]["param_groups"]:
            group["capturable"] = True  # as a CUDA run wrote them
    run_dir = tmp_path / "cuda-run"
    shutil.copytree(pretrained, run_dir)
    ckpt.save(run_dir / "checkpoints" / "last.pt", state)
    cfg = config(tmp_path, run_dir)
    agent = wsrl.WSRL(cfg, load_for_training(cfg.dataset, cfg.data), torch.device("cpu"))
    wsrl.load_pretrained(agent, str(run_dir), cfg)
    assert not any(g["capturable"] for opt in (agent.actor_opt, agent.critic_opt, agent.alpha_opt) for g in opt.param_groups)
