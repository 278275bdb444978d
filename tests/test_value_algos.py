"""IQL, CQL, RIQL: the CQL penalty by hand, data corruption, and command-line smoke tests."""

import json
import math

import numpy as np
import pytest
import torch

from algos.cql import cql_gap
from offrl.data import load_dataset
from offrl.data.dataset import Dataset
from offrl.data.corruption import AttackCritic, corrupt

from conftest import PYTHON, assert_compiled_critics_train_as_eager, run_cli, tiny_model

FAST = ["--eval.episodes", "2", "--log.every", "50", "--log.wandb", "disabled", "--hidden", "32", "32"]


def test_cql_gap_by_hand():
    # one critic, one state, N = 1 action per proposal, |A| = 1 on [-1, 1] -> log U = log 0.5
    q_data = torch.tensor([[0.5]])
    q_uniform, q_pi, q_next = torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]]), torch.tensor([[[0.0]]])
    log_pi, log_next_pi = torch.tensor([[-1.0]]), torch.tensor([[0.5]])
    gap = cql_gap(q_data, q_uniform, q_pi, q_next, math.log(0.5), log_pi, log_next_pi, temperature=1.0)
    expected = math.log(math.exp(1 - math.log(0.5)) + math.exp(2 + 1) + math.exp(0 - 0.5)) - 0.5
    assert gap.item() == pytest.approx(expected)
    # temperature T: T * logsumexp(X / T)
    gap_t = cql_gap(q_data, q_uniform, q_pi, q_next, math.log(0.5), log_pi, log_next_pi, temperature=2.0)
    xs = [1 - math.log(0.5), 3.0, -0.5]
    assert gap_t.item() == pytest.approx(2 * math.log(sum(math.exp(x / 2) for x in xs)) - 0.5)
    # gradients do not flow into the (detached) log-probabilities
    log_pi.requires_grad_(True)
    q_pi.requires_grad_(True)
    cql_gap(q_data, q_uniform, q_pi, q_next, 0.0, log_pi, log_next_pi).sum().backward()
    assert log_pi.grad is None and q_pi.grad is not None


@pytest.mark.parametrize("field", ["observations", "actions", "rewards", "next_observations"])
def test_random_corruption_hits_about_c_n_rows_of_one_field_reproducibly(tiny, field):
    clean = load_dataset(tiny)
    dirty, info = corrupt(clean, field, "random", rate=0.3, scale=1.0, seed=5)
    n = len(clean)
    assert abs(len(info.rows) - 0.3 * n) < 4 * math.sqrt(n * 0.3 * 0.7)
    changed = np.flatnonzero(np.any((getattr(dirty, field) != getattr(clean, field)).reshape(n, -1), axis=1))
    np.testing.assert_array_equal(changed, info.rows)
    for other in {"observations", "actions", "rewards", "next_observations", "terminals", "timeouts"} - {field}:
        np.testing.assert_array_equal(getattr(dirty, other), getattr(clean, other))
    np.testing.assert_array_equal(info.original, getattr(clean, field)[info.rows])
    again, _ = corrupt(clean, field, "random", rate=0.3, scale=1.0, seed=5)
    np.testing.assert_array_equal(getattr(again, field), getattr(dirty, field))
    other_seed, _ = corrupt(clean, field, "random", rate=0.3, scale=1.0, seed=6)
    assert not np.array_equal(getattr(other_seed, field), getattr(dirty, field))
    if field == "rewards":
        assert np.abs(dirty.rewards[info.rows]).max() <= 30.0
    else:
        std = getattr(clean, field).std(0)
        assert (np.abs(getattr(dirty, field) - getattr(clean, field)) <= std * 1.0 + 1e-5).all()


def test_adversarial_corruption_lowers_the_critics_q(tiny, tmp_path):
    run_cli(PYTHON, "-m", "algos.td3_bc", "--steps", "300", "--eval.every", "0", *FAST, "--run.out-dir", str(tmp_path))
    (checkpoint,) = tmp_path.glob("td3_bc/*/*/checkpoints/last.pt")
    clean = load_dataset(tiny)
    for field in ("observations", "actions"):
        dirty, info = corrupt(clean, field, "adversarial", rate=0.05, scale=1.0, seed=0,
                              critic_checkpoint=str(checkpoint), attack_steps=100)
        attacker = AttackCritic(str(checkpoint))
        rows = info.rows
        obs, act = (torch.as_tensor(getattr(d, k)[rows]) for d, k in ((clean, "observations"), (clean, "actions")))
        adv_obs = torch.as_tensor(dirty.observations[rows])
        adv_act = torch.as_tensor(dirty.actions[rows])
        assert attacker.q(adv_obs, adv_act).mean() < attacker.q(obs, act).mean() - 1e-3
        assert attacker.q(obs, act).shape == (2, len(rows))  # every critic: RIQL averages over the ensemble
        std = getattr(clean, field).std(0)
        assert (np.abs(getattr(dirty, field)[rows] - getattr(clean, field)[rows]) <= std + 1e-4).all()
    dirty, info = corrupt(clean, "rewards", "adversarial", rate=0.1, scale=0.5, seed=0)
    np.testing.assert_allclose(dirty.rewards[info.rows], -0.5 * clean.rewards[info.rows])


def test_cql_refuses_options_that_act_only_under_a_switch_it_was_not_given(tmp_path):
    from algos import cql
    from offrl.errors import OffrlError

    for options, message in (({"lagrange_init": -1.0}, "--lagrange-init acts only with --lagrange"),
                             ({"target_gap": 5.0, "calql_sparse_failure": -1.0},
                              "--target-gap acts only with --lagrange; --calql-sparse-failure acts only with --calql")):
        cfg = cql.Config(**options)
        cfg.run.out_dir = str(tmp_path)
        with pytest.raises(OffrlError, match=message):
            cql.train(cfg)
    cql.check_config(cql.Config(lagrange=True, lagrange_init=-1.0, target_gap=5.0, calql=True, calql_sparse_failure=-1.0))
    assert not any(tmp_path.iterdir())


def test_the_attack_critic_takes_every_policy_checkpoint_with_a_critic():
    from offrl.policies import RUN_CHECKPOINT_KINDS

    assert sorted(AttackCritic.KINDS) == sorted(set(RUN_CHECKPOINT_KINDS) - {"bc"})  # BC has no critic


@pytest.mark.parametrize("algo, options", [
    ("riql", []),
    ("cql", ["--shared-critic-output", "--n-actions", "2"]),
    ("ravl", [*tiny_model(max_epochs=1), "--rollout-every", "10", "--rollout-batch", "50"])])
def test_attack_critics_of_other_algorithms_are_their_runs_critics(tiny, tmp_path, monkeypatch, algo, options):
    """RIQL's K critics with its state normalizer, CQL's critics sharing one output layer (refused before as 'needs
    a scalar Q'), RAVL's 10-critic EDAC ensemble (a model-based checkpoint): the attack reads Q as the run's own
    agent computes it."""
    from offrl.eval_run import load_saved_run

    monkeypatch.setenv("OFFRL_MODELS", str(tmp_path / "models"))
    run_cli(PYTHON, "-m", f"algos.{algo}", "--dataset", tiny, "--steps", "20", "--eval.every", "0", *FAST,
            "--run.out-dir", str(tmp_path), *options)
    (checkpoint,) = tmp_path.glob(f"{algo}/*/*/checkpoints/last.pt")
    attacker = AttackCritic(str(checkpoint))
    _, cfg, agent, *_ = load_saved_run(checkpoint, device="cpu")
    data = load_dataset(tiny)
    obs, actions = torch.as_tensor(data.observations[:7]), torch.as_tensor(data.actions[:7])
    normalize = getattr(agent, "normalizer", None) or (lambda x: x)
    with torch.no_grad():
        expected = agent.critic(normalize(obs), actions)
    assert attacker.q(obs, actions).shape == (cfg.num_critics if algo != "cql" else 2, 7)
    torch.testing.assert_close(attacker.q(obs, actions), expected.reshape(attacker.q(obs, actions).shape))
    assert attacker.q_of_policy(obs).shape == attacker.q(obs, actions).shape


def test_adversarial_attack_follows_riql_attack_py():
    """RIQL's loop, transcribed: p0 = 2 range std (U[0,1) - 0.5); 100 times a fresh Adam (lr 0.01 range)
    takes one step on mean Q(s, a + p std) over critics and rows, then p is clamped into the box."""
    from offrl.data.corruption import adversarial_perturbation

    rng = np.random.default_rng(3)
    n, obs_dim, act_dim, scale = 40, 3, 2, 0.7
    actions = rng.normal(size=(n, act_dim)).astype(np.float32) * np.array([0.5, 2.0], np.float32)
    data = Dataset(rng.normal(size=(n, obs_dim)).astype(np.float32), actions, np.zeros(n, np.float32),
                   np.zeros((n, obs_dim), np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                   np.array([0]), {"name": "attack"})
    weights = torch.tensor([[[1.0], [-2.0]], [[0.5], [3.0]]])  # two critics, Q_e = a @ w_e + tanh(a) @ w_e

    class LinearCritics:
        def q(self, obs, act):
            return (act @ weights + torch.tanh(act) @ weights).squeeze(-1)  # [E, B]

    rows = np.arange(0, n, 2)
    ours = adversarial_perturbation(data, "actions", rows, scale, LinearCritics(), np.random.default_rng(9), steps=100)

    generator = torch.Generator().manual_seed(int(np.random.default_rng(9).integers(2**31)))
    target = torch.as_tensor(actions[rows])
    std = torch.as_tensor(actions.std(0, dtype=np.float64), dtype=torch.float32)
    para = 2 * scale * std * (torch.rand(target.shape, generator=generator) - 0.5)
    for _ in range(100):
        para = torch.nn.Parameter(para.clone(), requires_grad=True)
        optimizer = torch.optim.Adam([para], lr=0.01 * scale)
        loss = LinearCritics().q(None, target + para * std).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        para = torch.clamp(para, -scale, scale).detach()
    torch.testing.assert_close(torch.as_tensor(ours), target + para * std, rtol=0, atol=1e-5)


def _pull_critics(device):
    """Q_e(s, a) = -(a - w_e)^2 summed over dims: every step moves each row's a away from w_e."""
    weights = torch.tensor([[0.3, -0.2], [-0.1, 0.4]], device=device)

    class PullCritics:
        def __init__(self):
            self.device = torch.device(device)

        def q(self, obs, act):
            return -((act[None] - weights[:, None]) ** 2).sum(-1)  # [E, B]

    return PullCritics()


def test_the_adversarial_attack_runs_on_the_attack_device(tiny, monkeypatch):
    """load_for_training hands --data.attack-device (resolved: 'auto' is cuda where there is one; the CPU by
    default, whatever the run's --device) to the attack critic, and the perturbation is computed where the
    critic lives."""
    from offrl.config import DataConfig
    from offrl.data import corruption, load_for_training

    seen = []

    def spy(path, device="cpu"):
        seen.append((path, device))
        return _pull_critics("cpu")  # computes on the CPU: the test checks what it was handed

    monkeypatch.setattr(corruption, "AttackCritic", spy)
    cfg = DataConfig(corrupt="actions", corruption_mode="adversarial", corruption_rate=0.02,
                     attack_critic="critic.pt")
    data = load_for_training(tiny, cfg)
    rows = data.corruption.rows
    assert len(rows) > 0 and not np.array_equal(data.dataset.actions[rows], load_dataset(tiny).actions[rows])
    for attack_device in ("meta", "auto"):
        cfg.attack_device = attack_device
        load_for_training(tiny, cfg)
    resolved = ["cpu", "meta", "cuda" if torch.cuda.is_available() else "cpu"]  # default, meta, auto
    assert seen == [("critic.pt", torch.device(d)) for d in resolved]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_adversarial_attack_on_cuda_matches_the_cpu():
    rng = np.random.default_rng(4)
    n = 64
    data = Dataset(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32),
                   np.zeros(n, np.float32), np.zeros((n, 3), np.float32), np.zeros(n, np.float32),
                   np.zeros(n, np.float32), np.array([0]), {"name": "attack"})
    from offrl.data.corruption import adversarial_perturbation

    rows = np.arange(0, n, 2)
    cpu, cuda = (adversarial_perturbation(data, "actions", rows, 0.5, _pull_critics(device), np.random.default_rng(1))
                 for device in ("cpu", "cuda"))
    np.testing.assert_allclose(cuda, cpu, rtol=0, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["td3_bc", "iql"])
def test_a_real_attack_critic_on_cuda_attacks_as_on_the_cpu(tiny, tmp_path, algo):
    """The whole AttackCritic on --data.attack-device cuda: a training checkpoint's critics, observation
    normalizer and actor (deterministic for TD3+BC, a Gaussian's mode for IQL) moved to the GPU, for each field.
    Sign-gradient steps may flip where a gradient is ~0, so the bytes need not match: nearly every entry does,
    and the attacked critics' mean Q agrees."""
    run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "200", "--eval.every", "0", *FAST, "--device", "cpu",
            "--run.out-dir", str(tmp_path))
    (checkpoint,) = tmp_path.glob(f"{algo}/*/*/checkpoints/last.pt")
    clean = load_dataset(tiny)
    judge = AttackCritic(str(checkpoint))
    for field in ("observations", "actions", "next_observations"):
        (cpu, info), (cuda, _) = (corrupt(clean, field, "adversarial", rate=0.05, scale=1.0, seed=0,
                                          critic_checkpoint=str(checkpoint), attack_steps=50, device=device)
                                  for device in ("cpu", "cuda"))
        rows = info.rows
        a, b = getattr(cpu, field)[rows], getattr(cuda, field)[rows]
        assert not np.array_equal(a, getattr(clean, field)[rows])
        assert np.mean(np.abs(a - b) > 1e-4) < 0.02, field
        q = {}
        for name, data in (("cpu", cpu), ("cuda", cuda)):
            obs, act = torch.as_tensor(data.observations[rows]), torch.as_tensor(data.actions[rows])
            q[name] = (judge.q_of_policy(torch.as_tensor(data.next_observations[rows])) if field == "next_observations"
                       else judge.q(obs, act)).mean().item()
        assert q["cuda"] == pytest.approx(q["cpu"], rel=1e-3, abs=1e-3), field


@pytest.mark.parametrize("algo, extra", [
    ("iql", []),
    ("iql", ["--critic-loss", "hl-gauss", "--actor", "deterministic", "--data.sampling", "return-weighted"]),
    ("cql", ["--n-actions", "4"]),
    ("cql", ["--n-actions", "2", "--lagrange", "--max-target-backup", "--bc-steps", "50", "--num-critics", "3",
             "--layer-norm"]),
    ("riql", []),
    ("riql", ["--data.corrupt", "next_observations", "--data.corruption-rate", "0.3"]),
])
def test_cli_smoke(tiny, tmp_path, algo, extra):
    result = run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "150", "--eval.every", "100", *FAST, *extra,
                     "--run.out-dir", str(tmp_path))
    assert "final normalized score" in result.stdout
    (run_dir,) = tmp_path.glob(f"{algo}/*/*")
    final = json.loads((run_dir / "final.json").read_text())
    assert np.isfinite(final["eval/normalized_score"]) and np.isfinite(final["train/critic_loss"])
    recorded = json.loads((run_dir / "dataset.json").read_text())
    if "--data.corrupt" in extra:
        assert recorded["corruption"]["field"] == "next_observations"
        hits = np.load(run_dir / "corruption.npz")["rows"]
        assert recorded["corruption"]["rows_hit"] == len(hits) > 0
        assert recorded["trained_checksum"] != recorded["checksum"]


def test_cql_bellman_term_is_plain_mse(tiny):
    """With gamma 0 the TD target is the reward, so with no penalty the critic loss is
    sum_i mean (Q_i(s, a) - r)^2: plain MSE as in the official code, CORL and OfflineRL-Kit (no 1/2)."""
    from algos.cql import CQL, Config
    from offrl.data import load_for_training

    cfg = Config(dataset=tiny, gamma=0.0, cql_alpha=0.0, hidden=(16, 16))
    data = load_for_training(tiny, cfg.data)
    agent = CQL(cfg, data, torch.device("cpu"))
    batch = data.buffer("cpu", seed=0).sample(32)
    loss, metrics = agent.critic_loss(batch)
    with torch.no_grad():
        q = agent.critic(batch.observations, batch.actions)  # [E, B]
        expected = ((q - batch.rewards) ** 2).mean(dim=1).sum()
    torch.testing.assert_close(loss.detach(), expected)
    torch.testing.assert_close(metrics["td_loss"], expected / cfg.num_critics)


def test_cql_compiled_critics_take_the_eager_update(tiny):
    """On the CPU, CQL's --run.compile compiles its critic modules (WSRL's pre-training ensemble here: drawn
    critics, LayerNorm, max-target backup): the same updates as eager up to float rounding, the same state_dict
    keys; the actor loss reads the critics frozen."""
    from algos.cql import CQL, Config
    from offrl.data import load_for_training

    results = []
    for compile in (False, True):
        cfg = Config(dataset=tiny, hidden=(16, 16), num_critics=4, critic_subsample=2, layer_norm=True,
                     actor_layer_norm=True, max_target_backup=True, batch_size=32, n_actions=3)
        cfg.run.compile = compile
        data = load_for_training(tiny, cfg.data)
        torch.manual_seed(0)
        agent = CQL(cfg, data, torch.device("cpu"))
        buffer = data.buffer("cpu", seed=0)
        metrics = [agent.update(buffer.sample(cfg.batch_size)) for _ in range(3)]
        results.append((agent, metrics))
    (eager, eager_metrics), (compiled, compiled_metrics) = results
    assert compiled.critic._compiled_call_impl is not None and eager.critic._compiled_call_impl is None
    assert_compiled_critics_train_as_eager(compiled, eager, compiled_metrics, eager_metrics)
    for agent in (eager, compiled):  # the actor loss's backward reaches the actor, not the critics' weights
        agent.updates = agent.cfg.bc_steps  # past behaviour cloning: the loss reads the critics
        for p in [*agent.critic.parameters(), *agent.actor.parameters()]:
            p.grad = None
        loss, _, _ = agent.actor_loss(buffer.sample(cfg.batch_size))
        loss.backward()
        assert all(p.grad is None for p in agent.critic.parameters())
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.actor.parameters())


def test_cql_defaults_follow_the_official_code():
    from algos.cql import Config

    cfg = Config()
    assert not cfg.data.normalize_states  # neither the official code nor OfflineRL-Kit normalizes states
    assert (cfg.cql_alpha, cfg.actor_lr, cfg.critic_lr, cfg.hidden) == (5.0, 1e-4, 3e-4, (256, 256, 256))


def test_cql_reference_init_is_rlkits(tiny):
    """--reference-init: rlkit's bounds (hidden weights within 1/sqrt(out), biases 0.1, Q heads within 3e-3, the
    policy's within 1e-3), the target critics a copy; by default PyTorch's (the first layer wider than 1/16)."""
    from algos.cql import CQL, Config
    from offrl.data import load_for_training
    from offrl.nets import EnsembleLinear

    data = load_for_training(tiny, Config().data)
    torch.manual_seed(0)
    agent = CQL(Config(dataset=tiny, reference_init=True), data, torch.device("cpu"))
    critic_layers = [m for m in agent.critic.modules() if isinstance(m, EnsembleLinear)]
    actor_layers = [m for m in agent.actor.modules() if isinstance(m, torch.nn.Linear)]
    for layer in critic_layers[:-1]:
        assert layer.weight.abs().max() <= 1 / 16 and torch.all(layer.bias == 0.1)
    assert critic_layers[-1].weight.abs().max() <= 3e-3 and critic_layers[-1].bias.abs().max() <= 3e-3
    for layer in actor_layers[:-1]:
        assert layer.weight.abs().max() <= 1 / 16 and torch.all(layer.bias == 0.1)
    assert actor_layers[-1].weight.abs().max() <= 1e-3 and actor_layers[-1].bias.abs().max() <= 1e-3
    for target, online in zip(agent.critic_target.parameters(), agent.critic.parameters()):
        assert torch.equal(target, online)
    default = CQL(Config(dataset=tiny), data, torch.device("cpu"))
    first = [m for m in default.actor.modules() if isinstance(m, torch.nn.Linear)][0]
    assert first.weight.abs().max() > 1 / 16 and not torch.all(first.bias == 0.1)


def test_td3_bc_compiled_actor_objective_differentiates_the_actor_alone():
    """Compiled (as --run.compile does), the actor objective's backward graph computes every gradient
    its forward was traced for: with the critic frozen around it, that is the actor's parameters and no critic
    weight (Q_1's would be computed and thrown away otherwise); the compiled update trains as the eager one."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import algos.td3_bc as td3_bc
    from benchmarks.speed import synthetic_data
    from offrl.data import ReplayBuffer

    gradient_shapes = []

    def record_backward(graph, inputs):
        out = next(node for node in graph.graph.nodes if node.op == "output")
        gradient_shapes.append([tuple(g.meta["val"].shape) for g in out.args[0] if g is not None])
        return make_boxed_func(graph.forward)

    backend = aot_autograd(fw_compiler=lambda graph, inputs: make_boxed_func(graph.forward), bw_compiler=record_backward)
    data = synthetic_data(rows=1000)
    agents = []
    for compiled in (False, True):
        torch.manual_seed(0)
        cfg = td3_bc.Config()
        cfg.policy_freq, cfg.hidden = 1, (16, 16)
        agent = td3_bc.Agent(cfg, data, torch.device("cpu"))
        if compiled:
            agent._actor_objective = torch.compile(agent.actor_objective, backend=backend)
        buffer = ReplayBuffer.from_dataset(data.dataset, torch.device("cpu"), seed=0)
        for _ in range(3):
            agent.update(buffer.sample(32))
        agents.append(agent)
    assert gradient_shapes == [[tuple(p.shape) for p in agents[1].actor.parameters()]]
    trained = []  # --run.compile as a run takes it (Inductor, offrl.compiling's mask pass) against eager
    for compiled in (False, True):
        torch.manual_seed(0)
        cfg = td3_bc.Config()
        cfg.policy_freq, cfg.hidden, cfg.run.compile = 1, (16, 16), compiled
        agent = td3_bc.Agent(cfg, data, torch.device("cpu"))
        assert (agent._actor_objective != agent.actor_objective) == compiled
        buffer = ReplayBuffer.from_dataset(data.dataset, torch.device("cpu"), seed=0)
        for _ in range(3):
            agent.update(buffer.sample(32))
        trained.append(agent)
    for net in ("actor", "critic"):
        for eager, compiled in zip(getattr(trained[0], net).parameters(), getattr(trained[1], net).parameters()):
            torch.testing.assert_close(compiled, eager)
    assert all(p.requires_grad for p in agents[1].critic.parameters())
    for eager, compiled in zip(agents[0].state_dict()["actor"].values(), agents[1].state_dict()["actor"].values()):
        torch.testing.assert_close(compiled, eager)
