"""Decision Transformer and RCSL: causal masking, returns-to-go, padding, conditioning, CLI."""

import json

import numpy as np
import pytest
import torch

from algos.dt import Config as DTConfig, DecisionTransformer, dt_loss
from algos.rcsl import Config as RCSLConfig, RCSLPolicy, train_policy
from offrl.data.dataset import Dataset
from offrl.data.preprocess import StateNormalizer
from offrl.data.sequences import SequenceBuffer, episode_timesteps, returns_to_go
from offrl.errors import CheckpointError

from conftest import PYTHON, assert_reevaluation_reproduces, run_cli, two_behaviours


def three_episodes():
    """Episodes of lengths 3 (terminated), 4 (truncated by a time limit), 2 (cut at the end of the data)."""
    rewards = np.array([1, 2, 3, 10, 20, 30, 40, 5, 6], np.float32)
    n = len(rewards)
    terminals = np.zeros(n, np.float32)
    terminals[2] = 1
    timeouts = np.zeros(n, np.float32)
    timeouts[[6, 8]] = 1
    obs = np.arange(n, dtype=np.float32)[:, None].repeat(2, 1)
    return Dataset(obs, np.full((n, 1), 0.5, np.float32), rewards, obs + 1, terminals, timeouts,
                   np.array([0, 3, 7]), {"name": "three"}).validate()


def test_returns_to_go_and_timesteps_per_episode():
    ds = three_episodes()
    assert returns_to_go(ds).tolist() == [6, 5, 3, 100, 90, 70, 40, 11, 6]
    assert episode_timesteps(ds).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1]
    np.testing.assert_allclose(returns_to_go(ds, gamma=0.5)[3:7], [10 + 10 + 7.5 + 5, 20 + 15 + 10, 30 + 20, 40])


def test_segments_are_left_padded_and_never_cross_episodes():
    ds = three_episodes()
    buffer = SequenceBuffer(ds, context=3, rtg_scale=10.0)
    seg = buffer.segments(torch.tensor([4, 6, 0]))
    # row 4: rows 4, 5, 6 (episode 2 ends at 7) -> full
    assert seg.states[0, :, 0].tolist() == [4, 5, 6] and seg.mask[0].tolist() == [True, True, True]
    # row 6: only row 6 is left in its episode -> two pads on the left
    assert seg.mask[1].tolist() == [False, False, True]
    assert seg.states[1, :, 0].tolist() == [0, 0, 6]
    assert seg.actions[1, :2, 0].tolist() == [-10, -10]
    assert seg.returns_to_go[1, :, 0].tolist() == [0, 0, 4.0]
    assert seg.timesteps[1].tolist() == [0, 0, 3]
    assert seg.timesteps[0].tolist() == [1, 2, 3]
    for batch in (buffer.sample(64) for _ in range(5)):  # sampled segments stay inside one episode
        for states, mask in zip(batch.states[..., 0], batch.mask):
            rows = states[mask].long().tolist()
            episode = np.searchsorted([0, 3, 7], rows, side="right")
            assert len(set(episode)) == 1 and rows == list(range(rows[0], rows[0] + len(rows)))


def small_dt(K=5):
    torch.manual_seed(0)
    cfg = DTConfig(context=K, embed_dim=32, layers=2, heads=2, dropout=0.0, max_timestep=50)
    return DecisionTransformer(3, 2, cfg).eval(), K


def random_inputs(B, K):
    return (torch.randn(B, K, 1), torch.randn(B, K, 3), torch.randn(B, K, 2).tanh(),
            torch.arange(K).expand(B, K).clone(), torch.ones(B, K, dtype=torch.bool))


def test_dt_is_causal():
    model, K = small_dt()
    rtg, states, actions, steps, mask = random_inputs(4, K)
    base = model(rtg, states, actions, steps, mask)
    t = 2
    changed = [x.clone() for x in (rtg, states, actions)]
    for x in changed:
        x[:, t + 1:] = torch.randn_like(x[:, t + 1:]) * 5
    changed[2][:, t] = -changed[2][:, t]  # the action at t itself is not an input to its prediction
    out = model(*changed, steps, mask)
    torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1])
    assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])


def test_dt_written_out_cpu_attention_equals_sdpa_and_drops_attention_weights(monkeypatch):
    """In CPU training with dropout the blocks write their attention out (offrl.nets.Dropout on the weights):
    with every dropout layer passing its input through it is SDPA's attention, left padding included, values and
    gradients; with dropout it draws from offrl's Dropout, not SDPA's."""
    import torch.nn.functional as F

    import algos.dt as dt

    torch.manual_seed(0)
    cfg = DTConfig(context=5, embed_dim=32, layers=2, heads=2, dropout=0.1, max_timestep=50)
    model = DecisionTransformer(3, 2, cfg).train()
    rtg, states, actions, steps, mask = random_inputs(4, 5)
    mask[:2, :2] = False  # left padding, as SequenceBuffer pads episode starts
    for module in model.modules():
        if isinstance(module, dt.Dropout):
            module.eval()  # passes its input through
    assert all(dt.written_out_attention(block, states) for block in model.blocks)
    written = model(rtg, states, actions, steps, mask)
    grads = torch.autograd.grad(written.square().sum(), list(model.parameters()))
    for block in model.blocks:
        block.attn_drop.p = 0.0  # the SDPA path, without its dropout
    reference = model(rtg, states, actions, steps, mask)
    torch.testing.assert_close(written, reference)
    for got, want in zip(grads, torch.autograd.grad(reference.square().sum(), list(model.parameters()))):
        torch.testing.assert_close(got, want)
    # under bf16 autocast the written-out products run in bf16 where SDPA's math path computes in float32: close
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(rtg, states, actions, steps, mask)
        for block in model.blocks:
            block.attn_drop.p = 0.1
        written = model(rtg, states, actions, steps, mask)
    torch.testing.assert_close(written, reference, atol=0.01, rtol=0.01)  # measured 0.002, as far as fp32 is
    model.train()
    calls = []
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k))
    drawn = []
    original = dt.Dropout.forward
    monkeypatch.setattr(dt.Dropout, "forward", lambda self, x: (drawn.append(tuple(x.shape)), original(self, x))[1])
    out = model(rtg, states, actions, steps, mask)
    assert not calls and torch.isfinite(out).all()
    assert drawn.count((4 * 2, 15, 15)) == 2  # each block's attention weights, [batch x heads, 3K, 3K]


def test_dt_compiled_takes_the_eager_updates(tiny):
    """DT under --run.compile (one graph: written-out CPU attention, offrl's dropout words as an op of their own):
    from the same seed, the same dropout masks and so the same updates as eager, up to float rounding."""
    from algos.dt import DT, Config
    from offrl.data import load_for_training
    from offrl.data.sequences import SequenceBuffer

    results = []
    for compile in (False, True):
        cfg = Config(dataset=tiny, layers=2, embed_dim=32, heads=2, context=4, batch_size=8, warmup_steps=1)
        cfg.run.compile = compile
        data = load_for_training(tiny, cfg.data)
        torch.manual_seed(0)
        agent = DT(cfg, data, torch.device("cpu"))
        buffer = SequenceBuffer(data.dataset, cfg.context, "cpu", rtg_scale=cfg.rtg_scale,
                                max_timestep=cfg.max_timestep)
        batches = [buffer.sample(cfg.batch_size) for _ in range(3)]
        torch.manual_seed(1)
        metrics = [agent.update(batch) for batch in batches]
        results.append((agent, metrics))
    (eager, eager_metrics), (compiled, compiled_metrics) = results
    assert eager._loss == eager.loss and compiled._loss != compiled.loss  # the compiled run did compile its loss
    explained = torch._dynamo.explain(eager.loss)(batches[0])
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert eager_metrics[0]["action_loss"] != eager_metrics[1]["action_loss"]
    for got, want in zip(compiled_metrics, eager_metrics):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for got, want in zip(compiled.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dt_last_state_only_is_the_full_forwards_last_prediction():
    """Evaluation's forward (`last_state_only`: the last block for the last state token alone) gives the full
    forward's last prediction, with several heads and layers and a window shorter than the context."""
    torch.manual_seed(0)
    cfg = DTConfig(context=6, embed_dim=32, layers=3, heads=4, dropout=0.1, max_timestep=50)
    model = DecisionTransformer(3, 2, cfg).eval()
    for K in (6, 2):
        rtg, states, actions, steps, mask = random_inputs(5, K)
        full = model(rtg, states, actions, steps, mask)
        last = model(rtg, states, actions, steps, mask, last_state_only=True)
        assert last.shape == (5, 1, 2)
        torch.testing.assert_close(last[:, 0], full[:, -1])
    model.train()  # (in training the full forward runs, its dropout included)
    assert model(rtg, states, actions, steps, mask, last_state_only=True).shape == (5, 1, 2)


class RecordingModel(torch.nn.Module):
    """Stands in for the transformer: records each call's inputs, predicts a known action per call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, rtg, states, actions, timesteps, mask, last_state_only=False):
        assert last_state_only  # evaluation asks for the last state's prediction only
        self.calls.append([x.clone() for x in (rtg, states, actions, timesteps, mask)])
        B, L = timesteps.shape
        return torch.full((B, L, 2), 0.1 * len(self.calls)) + torch.arange(B).view(B, 1, 1) * 0.01


def test_dt_evaluation_keeps_per_env_windows_and_decrements_the_target_by_each_reward():
    from algos.dt import DT, ReturnConditionedActor

    K, n, scale = 3, 2, 10.0
    cfg = DTConfig(context=K, embed_dim=16, layers=1, rtg_scale=scale)
    agent = DT.__new__(DT)  # only what evaluation reads: the model, normalizer, action box, config
    agent.cfg, agent.model = cfg, RecordingModel()
    agent.normalizer = lambda obs: obs * 2.0
    agent.action_scale, agent.action_bias = torch.full((2,), 2.0), torch.zeros(2)
    actor = ReturnConditionedActor(agent, target_return=100.0)
    actor.reset(n)
    observations = [torch.tensor([[t, 0.0, 0.0], [t, 1.0, 1.0]]) + 0.5 for t in range(5)]
    rewards = [torch.tensor([1.0, 3.0]) * (t + 1) for t in range(5)]
    executed = []
    for obs, reward in zip(observations, rewards):
        executed.append(actor(obs))
        actor.observe(reward)
    # step 5 (t = 4): the window holds steps 2, 3, 4 of each env
    rtg, states, actions, timesteps, mask = agent.model.calls[-1]
    assert timesteps.tolist() == [[2, 3, 4], [2, 3, 4]] and mask.all()
    torch.testing.assert_close(states, torch.stack([o * 2.0 for o in observations[2:]], 1))
    received = torch.cumsum(torch.stack(rewards), 0)  # [step, env]: rewards received after each step
    expected_rtg = torch.stack([100.0 - received[t - 1] for t in (2, 3, 4)], 1) / scale
    torch.testing.assert_close(rtg.squeeze(-1), expected_rtg)
    # past actions are the unit-box predictions of calls 3 and 4; the current slot is zero
    torch.testing.assert_close(actions[:, :2], torch.stack([executed[2], executed[3]], 1) / 2.0)
    assert (actions[:, 2] == 0).all()
    # before the window fills it grows from one step
    assert agent.model.calls[0][3].tolist() == [[0], [0]] and agent.model.calls[1][3].tolist() == [[0, 1], [0, 1]]
    torch.testing.assert_close(agent.model.calls[0][0].squeeze(-1), torch.full((n, 1), 100.0 / scale))


def test_padded_positions_do_not_contribute_to_the_loss():
    predicted = torch.tensor([[[0.5], [9.0], [0.1]]], requires_grad=True)
    target = torch.tensor([[[0.0], [-9.0], [0.1]]])
    mask = torch.tensor([[True, False, True]])
    loss = dt_loss(predicted, target, mask)
    assert loss.item() == pytest.approx(0.25 / 2)
    loss.backward()
    assert predicted.grad[0, 1].item() == 0.0
    # in the model: what sits in padded slots changes nothing at unpadded ones
    model, K = small_dt()
    rtg, states, actions, steps, mask = random_inputs(2, K)
    mask[:, :2] = False
    base = model(rtg, states, actions, steps, mask)
    for x in (rtg, states, actions):
        x[:, :2] = torch.randn_like(x[:, :2]) * 7
    torch.testing.assert_close(model(rtg, states, actions, steps, mask)[:, 2:], base[:, 2:])


def test_rcsl_target_return_is_decremented_by_the_rewards_received():
    for conditioning in ("rtg", "average"):
        cfg = RCSLConfig(hidden=(8,), conditioning=conditioning, rtg_scale=100.0, average_goal="updated")
        policy = RCSLPolicy(3, 1, cfg, horizon=10, normalizer=StateNormalizer(None, None), action_low=[-1.0],
                            action_high=[1.0])
        actor = policy.actor(target_return=50.0)
        actor.reset(2)
        actor(torch.zeros(2, 3))
        actor.observe(torch.tensor([5.0, 20.0]))
        actor.observe(torch.tensor([1.0, 1.0]))
        torch.testing.assert_close(actor.return_to_go, torch.tensor([44.0, 29.0]))
        expected = torch.tensor([44.0, 29.0]) / (100.0 if conditioning == "rtg" else 10 - 2)
        torch.testing.assert_close(policy.condition(actor.return_to_go, actor.timestep), expected)


def test_rvs_goal_stays_fixed_for_the_episode_by_default():
    """RvS-R conditions on target / H at every step of an episode, whatever rewards come (RvS's eval)."""
    cfg = RCSLConfig(hidden=(8,), conditioning="average")
    policy = RCSLPolicy(3, 1, cfg, horizon=10, normalizer=StateNormalizer(None, None), action_low=[-1.0],
                        action_high=[1.0])
    seen = []
    policy.net.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0][:, -1].clone()))
    actor = policy.actor(target_return=50.0)
    actor.reset(2)
    for rewards in ([5.0, 20.0], [1.0, 1.0], [0.0, 3.0]):
        actor(torch.zeros(2, 3))
        actor.observe(torch.tensor(rewards))
    assert len(seen) == 3
    for goal in seen:
        torch.testing.assert_close(goal, torch.full((2,), 5.0))  # 50 / 10


def test_rcsl_train_policy_learns_the_action_that_goes_with_each_return():
    """Episodes of return 10 took action +0.8 at every step, episodes of return 0 took -0.8, from the
    same random states: conditioned on return 10 the policy should act +0.8, on return 0 -0.8. RvS-R's
    average conditioning makes the two behaviours' inputs 1 and 0 at every step of an episode. Trained
    in fp32 and under bf16 autocast, which must have changed the (otherwise seeded, identical) training."""
    rng = np.random.default_rng(0)
    dataset = two_behaviours(rng, 3, {"name": "two-behaviours"})
    states = torch.as_tensor(rng.normal(size=(50, 3)).astype(np.float32))
    start = torch.zeros(50)
    actions = {}
    for precision in ("fp32", "bf16"):
        cfg = RCSLConfig(hidden=(64, 64), conditioning="average", steps=1500, batch_size=64, holdout_every=100,
                         patience=3)
        cfg.run.precision = precision
        policy = train_policy(dataset, cfg, seed=0, action_low=[-1.0], action_high=[1.0])
        high = policy.act(states, torch.full((50,), 10.0), start)
        low = policy.act(states, torch.zeros(50), start)
        assert high.dtype == torch.float32 and high.shape == (50, 1)
        # on average within 0.1 of each behaviour's action; every state on the right side (a net can
        # overfit a few unseen random states, so not every one is within 0.1)
        assert abs(high.mean().item() - 0.8) < 0.1 and abs(low.mean().item() + 0.8) < 0.1
        assert (high > 0.3).all() and (low < -0.3).all()
        actions[precision] = high
    assert not torch.equal(actions["fp32"], actions["bf16"])


def test_rcsl_train_policy_seed_fixes_the_policy_and_leaves_the_global_rng_alone():
    """MBRCSL trains one policy per seed on rollouts: the same seed must give the same weights,
    whatever the caller's global RNG did before, and the call must not move that RNG."""
    rng = np.random.default_rng(1)
    n, length = 60, 10
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    timeouts = np.zeros(n, np.float32)
    timeouts[length - 1::length] = 1
    dataset = Dataset(obs, rng.uniform(-1, 1, size=(n, 2)).astype(np.float32), rng.normal(size=n).astype(np.float32),
                      obs, np.zeros(n, np.float32), timeouts, np.arange(0, n, length), {"name": "random"}).validate()
    cfg = RCSLConfig(hidden=(16, 16), steps=20, batch_size=8, holdout_every=10, patience=5)

    def weights(seed, global_seed):
        torch.manual_seed(global_seed)
        before = torch.random.get_rng_state()
        policy = train_policy(dataset, cfg, seed=seed, action_low=[-1.0, -1.0], action_high=[1.0, 1.0])
        assert torch.equal(torch.random.get_rng_state(), before)
        return torch.cat([p.detach().flatten() for p in policy.parameters()])

    first = weights(seed=3, global_seed=0)
    assert torch.equal(first, weights(seed=3, global_seed=123))
    assert not torch.equal(first, weights(seed=4, global_seed=0))


def test_rcsl_without_a_holdout_trains_every_step_and_keeps_its_last_weights():
    """--holdout-ratio 0: no hold-out loss to stop on, so training runs all its steps and the policy is the last
    weights (MBRCSL's trainer); it used to stop after `patience` checks and return the first check's weights.
    The output is unbounded (both references' linear heads), acting clips it to the box; a checkpoint saved
    with the old tanh head is refused."""
    from algos.rcsl import RCSL
    from offrl.data.preprocess import StateNormalizer

    n, length = 40, 10
    obs = np.random.default_rng(2).normal(size=(n, 3)).astype(np.float32)
    timeouts = np.zeros(n, np.float32)
    timeouts[length - 1::length] = 1
    dataset = Dataset(obs, np.ones((n, 1), np.float32), np.ones(n, np.float32), obs, np.zeros(n, np.float32),
                      timeouts, np.arange(0, n, length), {"name": "ones"}).validate()
    cfg = RCSLConfig(hidden=(16, 16), steps=300, batch_size=8, holdout_every=10, patience=2, holdout_ratio=0.0, lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        agent = RCSL(cfg, dataset, StateNormalizer(None, None, torch.device("cpu")), [-1.0], [1.0], "cpu", 0)
    checks = []
    for step in range(1, cfg.steps + 1):
        agent.update(cfg.batch_size)
        if step % cfg.holdout_every == 0:
            checks.append(agent.check())
    assert len(checks) == 30 and not any(checks) and agent.best_state is None
    last = [p.detach().clone() for p in agent.policy.net.parameters()]
    agent.restore_best()
    assert all(torch.equal(a, b) for a, b in zip(last, agent.policy.net.parameters()))
    inputs = agent.inputs[:8]
    assert torch.equal(agent.policy.distribution(inputs)[0], agent.policy.net(inputs))  # no tanh in the way
    assert torch.allclose(agent.policy.distribution(inputs)[0], torch.ones(8, 1), atol=0.05)
    action = agent.policy.act(torch.as_tensor(obs[:8]), torch.full((8,), 1e6), torch.zeros(8))
    assert action.abs().max() <= 1.0  # a far-out condition still acts inside the box
    saved = agent.state_dict()
    agent.load_state_dict(saved)
    with pytest.raises(CheckpointError, match="before its action head lost its tanh"):
        agent.load_state_dict({k: v for k, v in saved.items() if k != "head"})


@pytest.mark.parametrize("decoupled, reference", [(True, torch.optim.AdamW), (False, torch.optim.Adam)])
def test_rcsl_weight_decay_is_adamws_or_the_gradients_l2(decoupled, reference):
    """--decoupled-weight-decay (default) steps as torch's AdamW; --no-decoupled-weight-decay as torch's Adam with
    weight_decay, the decay added to the gradient (MBRCSL's reference: Adam, weight decay 0.1)."""
    from algos.mbrcsl import Config as MBRCSLConfig, rcsl_config
    from algos.rcsl import RCSL

    n = 32
    rng = np.random.default_rng(5)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    dataset = Dataset(obs, rng.uniform(-1, 1, size=(n, 2)).astype(np.float32), np.ones(n, np.float32), obs,
                      np.zeros(n, np.float32), np.eye(1, n, n - 1, dtype=np.float32)[0], np.array([0]),
                      {"name": "decay"}).validate()
    cfg = RCSLConfig(hidden=(16,), steps=5, batch_size=8, lr=1e-2, weight_decay=0.1, holdout_ratio=0.0,
                     decoupled_weight_decay=decoupled)
    agent = RCSL(cfg, dataset, StateNormalizer(None, None, torch.device("cpu")), [-1.0] * 2, [1.0] * 2, "cpu", 0)
    copy = [p.detach().clone().requires_grad_(True) for p in agent.policy.net.parameters()]
    expected = reference(copy, lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        agent.update(cfg.batch_size)
        for p, q in zip(copy, agent.policy.net.parameters()):
            p.grad = q.grad.clone()
        expected.step()
        for p, q in zip(copy, agent.policy.net.parameters()):
            torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)
    mb = MBRCSLConfig()
    assert rcsl_config(mb, 1.0).decoupled_weight_decay is True
    mb.rcsl.decoupled_weight_decay = False
    assert rcsl_config(mb, 1.0).decoupled_weight_decay is False


@pytest.mark.parametrize("algo, extra", [
    ("dt", ["--context", "5", "--embed-dim", "32", "--batch-size", "8", "--warmup-steps", "10", "--eval.episodes", "3"]),
    ("rcsl", ["--hidden", "32", "--holdout-every", "40", "--eval-targets", "200", "100", "--eval.episodes", "2"]),
    ("rcsl", ["--hidden", "32", "--holdout-every", "40", "--conditioning", "average", "--head", "gaussian",
              "--eval.episodes", "2"]),
])
def test_cli_smoke(tiny, tmp_path, algo, extra, capsys):
    result = run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "120", "--log.every", "40", "--log.wandb", "disabled",
                     *extra, "--run.out-dir", str(tmp_path))
    assert "final normalized score" in result.stdout
    (run_dir,) = tmp_path.glob(f"{algo}/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert np.isfinite(final["eval/normalized_score"])
    if algo == "dt":
        assert "eval_half_target/normalized_score" in final and final["target_return"] == 200.0
    if "--eval-targets" in extra:
        assert set(final["score_per_target"]) == {"200", "100"}
        assert "target return 100: normalized score" in result.stdout
    if algo == "dt":  # the diagnostics of results/README run on any finished DT run
        from benchmarks import dt_diagnostics

        dt_diagnostics.main(["--dt", str(run_dir), "--episodes", "2"])
        printed = capsys.readouterr().out
        assert "eval-mode action MSE" in printed and all(f"  {v}: normalized score" in printed
                                                         for v in ("clean", "noisy-context", "noisy-both"))
    report = assert_reevaluation_reproduces(run_dir)
    expected = {"dt": {"eval", "eval_half_target"}, "rcsl": {"eval", "eval_target_100"} if "--eval-targets" in extra else {"eval"}}
    assert set(report["results"]) == expected[algo]


def test_dt_targets_follow_the_paper_on_d4rl_files_and_the_reference_elsewhere():
    from algos.dt import Config, expert_target

    cfg = Config()
    assert expert_target(cfg, {"d4rl_env": "hopper", "ref_max_score": 3234.3}) == 3600
    assert expert_target(cfg, {"d4rl_env": "walker2d", "ref_max_score": 4592.3}) == 5000
    assert expert_target(cfg, {"d4rl_env": "halfcheetah", "ref_max_score": 12135.0}) == 12000
    assert expert_target(cfg, {"d4rl_env": "ant", "ref_max_score": 3879.7}) == 3879.7  # no published DT target
    assert expert_target(cfg, {"ref_max_score": 3164.1}) == 3164.1  # the offrl suite, Minari, user data
    assert expert_target(Config(target_return=2000.0), {"d4rl_env": "hopper"}) == 2000.0
    given = Config()
    given.data.ref_max_score = 2500.0  # the user's reference wins over the paper's target for a D4RL-named file
    assert expert_target(given, {"d4rl_env": "hopper", "ref_max_score": 2500.0}) == 2500.0


def test_d4rl_files_are_marked_for_published_settings(tmp_path):
    import h5py
    import numpy as np

    from offrl.data import load_dataset

    n = 20
    with h5py.File(tmp_path / "walker2d-medium-v2.hdf5", "w") as f:
        f["observations"] = np.zeros((n, 17), np.float32)
        f["actions"] = np.zeros((n, 6), np.float32)
        f["rewards"] = np.ones(n, np.float32)
        f["terminals"] = np.zeros(n, bool)
    assert load_dataset(str(tmp_path / "walker2d-medium-v2.hdf5")).metadata["d4rl_env"] == "walker2d"


def test_dt_reference_init_and_decay_options(tiny):
    from algos.dt import DT, Config
    from offrl.data import load_for_training

    data = load_for_training(tiny, Config().data)
    default = DT(Config(dataset=tiny, layers=1, embed_dim=32), data, torch.device("cpu"))
    groups = default.optimizer.param_groups
    assert groups[0]["weight_decay"] == 1e-4 and groups[1]["weight_decay"] == 0.0 and groups[1]["params"]
    torch.manual_seed(0)
    ref = DT(Config(dataset=tiny, layers=2, embed_dim=256, reference_init=True, decay_all=True), data, torch.device("cpu"))
    assert sum(len(g["params"]) for g in ref.optimizer.param_groups if g["weight_decay"] == 1e-4) == \
        len(list(ref.model.parameters()))
    block = ref.model.blocks[0]
    for linear in (block.qkv, block.proj, block.mlp[0], block.mlp[2]):
        assert abs(linear.weight.std().item() - 0.02) < 0.002 and linear.bias.abs().max() == 0
    # embeddings and the action head keep PyTorch's init, as in the official code
    assert ref.model.embed_state.bias.abs().max() > 0
    # the optimizer is AdamW (decoupled decay) in torch's fused kernel: its steps are torch.optim.AdamW's
    assert all(g["fused"] and g["decoupled_weight_decay"] for g in groups)
    for g in groups:  # a step and a decay large enough to tell AdamW from Adam's L2 decay
        g["lr"] = 1e-2  # (the warm-up schedule starts at lr / 10000)
        g["weight_decay"] = 0.1 if g["weight_decay"] else 0.0
    params = [p for g in groups for p in g["params"]]
    copies = [p.detach().clone().requires_grad_() for p in params]
    by_param = dict(zip(map(id, params), copies))
    reference = torch.optim.AdamW([{"params": [by_param[id(p)] for p in g["params"]], "weight_decay": g["weight_decay"]}
                                   for g in groups], lr=1e-2)
    torch.manual_seed(1)
    for _ in range(3):
        for p, c in zip(params, copies):
            p.grad = torch.randn_like(p)
            c.grad = p.grad.clone()
        default.optimizer.step()
        reference.step()
    for p, c in zip(params, copies):
        torch.testing.assert_close(p, c, rtol=1e-6, atol=1e-7)


def test_rcsl_and_mbrcsl_refuse_a_patience_of_zero_before_a_run_folder_is_made(tiny, tmp_path):
    """It would stop before the first hold-out check and evaluate an untrained network (MBRCSL's: after its
    rollouts). Refused up front: RCSL's check came after its run folder was made, MBRCSL's after the rollouts."""
    for algo, option in (("rcsl", "--patience"), ("mbrcsl", "--rcsl.patience")):
        result = run_cli(PYTHON, "-m", f"algos.{algo}", option, "0", "--steps", "10", "--dataset", tiny,
                         "--run.out-dir", str(tmp_path / algo), check=False)
        assert result.returncode == 1 and f"{option} 0: must be at least 1" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / algo).exists()


def test_rcsl_killed_after_its_early_stop_resumes_to_the_same_stop(tiny, tmp_path):
    """Early stopping writes a checkpoint, then the final evaluation and final.json follow; a process killed in
    between is resumed to the same stop (the same step, best hold-out loss and weights), not trained past it."""
    args = ["--steps", "3000", "--hidden", "32", "--holdout-every", "20", "--patience", "1", "--eval.episodes", "2",
            "--eval.every", "20", "--log.wandb", "disabled", "--run.out-dir", str(tmp_path)]
    # --eval.every is not used (one evaluation, at the end), and the log says so
    assert "warning: rcsl evaluates once, at the end (the policy of its best hold-out loss): --eval.every 20 is not " \
        "used" in run_cli(PYTHON, "-m", "algos.rcsl", *args).stderr
    (run_dir,) = [p for p in tmp_path.glob("rcsl/*/*") if p.is_dir()]
    first = json.loads((run_dir / "final.json").read_text())
    assert first["stopped_at_step"] < 3000  # it did stop early
    def rows():  # without the wall-clock time
        return [{k: v for k, v in json.loads(line).items() if k != "time"}
                for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    first_rows = rows()
    assert [r["step"] for r in first_rows if "eval/normalized_score" in r] == [first["stopped_at_step"]]
    (run_dir / "final.json").unlink()  # as if killed before writing it
    resumed = run_cli(PYTHON, "-m", "algos.rcsl", *args, "--resume", "latest")
    assert f"at step {first['stopped_at_step']}" in resumed.stderr
    again = json.loads((run_dir / "final.json").read_text())
    for key in ("stopped_at_step", "best_holdout_loss"):
        assert again[key] == first[key], key
    assert again["eval/normalized_score"] == first["eval/normalized_score"]
    # the final evaluation's rows, logged after the checkpoint at the same step, are dropped and logged again once
    assert rows() == first_rows


@pytest.mark.parametrize("algo, flag", [("dt", ["--data.normalize-reward"]), ("rcsl", ["--data.reward-scale", "0.1"]),
                                        ("rcsl", ["--data.reward-bias", "-1"])])
def test_return_conditioning_refuses_scaled_rewards(tmp_path, algo, flag):
    """Training returns in scaled units, evaluation targets and decrements in the env's: refused, before any work."""
    result = run_cli(PYTHON, "-m", f"algos.{algo}", *flag, "--run.out-dir", str(tmp_path), check=False)
    assert result.returncode == 1 and f"drop {flag[0]}" in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())  # no run folder


@pytest.mark.parametrize("algo", ["dt", "rcsl", "mbrcsl"])
def test_return_conditioning_refuses_return_weighted_sampling(tmp_path, algo):
    """Their batches do not come from the weighted transition buffer: the option would be ignored while the run
    record said it was applied. Refused, before any work."""
    result = run_cli(PYTHON, "-m", f"algos.{algo}", "--data.sampling", "return-weighted", "--run.out-dir",
                     str(tmp_path), check=False)
    assert result.returncode == 1 and "--data.sampling return-weighted weights: drop that option" in result.stderr
    assert "Traceback" not in result.stderr and not any(tmp_path.iterdir())
