"""The CUDA-graph training step (offrl/graphs.py): the graphed agent trains like the eager one.

The comparisons need a GPU and are skipped without one (they ran on an H100; results/speed-gpu.md);
on the CPU the graph is off and the step is the plain function, which the CPU tests check."""

import importlib
import json

import pytest
import torch

from benchmarks.speed import synthetic_data
from offrl.data import ReplayBuffer
from offrl.graphs import GraphedStep
from offrl.optim import adam, graph_safe

from conftest import PYTHON, VOLATILE, run_cli

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_on_the_cpu_a_graphed_step_is_the_plain_call():
    calls = []

    def fn(x, flag):
        calls.append(flag)
        return {"y": x * 2}

    step = GraphedStep(fn, torch.device("cpu"))
    out = step(torch.ones(3), True, key=True)
    assert not step.enabled and step.recorded == 0 and calls == [True]
    assert torch.equal(out["y"], torch.full((3,), 2.0))


def test_graph_safe_optimizers_keep_their_rate_and_follow_a_schedule():
    w = torch.nn.Parameter(torch.ones(2))
    opt = adam([{"params": [w], "lr": 1e-3}], torch.device("cpu"))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    graph_safe(opt)
    rate = opt.param_groups[0]["lr"]
    assert isinstance(rate, torch.Tensor) and rate.item() == pytest.approx(1e-3)
    w.grad = torch.ones(2)
    opt.step()
    schedule.step()
    assert opt.param_groups[0]["lr"] is rate  # filled in place: what a recorded graph reads
    assert rate.item() == pytest.approx(5e-4)


def agent_after(algo: str, cuda_graph: bool, steps: int, compile: bool = False, **overrides):
    module = importlib.import_module(f"algos.{algo}")
    cfg = module.Config(steps=steps)
    cfg.run.cuda_graph = cuda_graph
    cfg.run.compile = compile
    for name, value in overrides.items():
        setattr(cfg, name, value)
    device = torch.device("cuda")
    data = synthetic_data(rows=5000)
    torch.manual_seed(0)
    agent = module.Agent(cfg, data, device)
    buffer = ReplayBuffer.from_dataset(data.dataset, device, seed=0)
    torch.manual_seed(1)  # the draws inside the step (CQL's actions) from the same default-generator state
    for _ in range(steps):
        metrics = agent.update(buffer.sample(cfg.batch_size))
    torch.cuda.synchronize()
    return agent, metrics


def parameters(agent) -> dict[str, torch.Tensor]:
    out = {}
    for name in agent.STATE:
        module = getattr(agent, name)
        if isinstance(module, torch.nn.Module):
            out.update({f"{name}.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    return out


@cuda
@pytest.mark.parametrize("algo,overrides", [("bc", {}), ("td3_bc", {}), ("iql", {}), ("cql", {}),
                                            ("cql", {"bc_steps": 6})])
def test_graphed_step_trains_as_the_eager_step(algo, overrides):
    """20 steps (3 eager warm-ups, then replays; IQL's cosine schedule over those 20 steps, CQL's BC
    warm start switching graphs at step 6): same weights and metrics as the eager agent's."""
    eager, eager_metrics = agent_after(algo, False, 20, **overrides)
    graphed, graphed_metrics = agent_after(algo, True, 20, **overrides)
    assert graphed._gradient_step.recorded >= 1 if algo != "bc" else graphed._step.recorded == 1
    a, b = parameters(eager), parameters(graphed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6, msg=f"{algo}: {name}")
    for name, value in eager_metrics.items():
        torch.testing.assert_close(graphed_metrics[name], value, rtol=1e-4, atol=1e-6, msg=f"{algo}: {name}")


@cuda
@pytest.mark.parametrize("algo", ["iql", "td3_bc"])
def test_a_compiled_step_records_and_trains_as_the_eager_step(algo):
    """--run.compile inside the graph: compiled in the warm-up steps, recorded without recompiling; its fused
    kernels round differently, so the weights after 20 steps agree to 1e-3 rather than bit for bit."""
    eager, _ = agent_after(algo, False, 20)
    graphed, metrics = agent_after(algo, True, 20, compile=True)
    assert graphed._gradient_step.recorded >= 1
    assert all(torch.isfinite(v).all() for v in metrics.values())
    a, b = parameters(eager), parameters(graphed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=f"{algo}: {name}")


@cuda
def test_a_recorded_step_replays_fresh_inputs_and_random_draws():
    device = torch.device("cuda")
    w = torch.zeros(4, device=device, requires_grad=True)
    opt = adam([{"params": [w], "lr": 0.1}], device)

    def fn(x):
        loss = ((w - x) ** 2).sum() + 0 * torch.rand((), device=device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"loss": loss.detach(), "noise": torch.rand(3, device=device)}

    step = GraphedStep(fn, device, optimizers=(opt,), warmup=1)
    outs = [{k: v.clone() for k, v in step(torch.full((4,), float(i), device=device)).items()} for i in range(4)]
    assert step.recorded == 1
    # the loss reads each call's input, not the one recorded; the noise differs between replays
    assert outs[3]["loss"].item() > outs[2]["loss"].item() > 0
    assert not torch.equal(outs[2]["noise"], outs[3]["noise"])


def _rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@cuda
@pytest.mark.parametrize("algo,seeds", [("iql", ()), ("td3_bc", ()), ("cql", ()), ("iql", (0, 1)), ("bc", (0, 1))])
def test_a_graphed_cuda_run_resumed_ends_as_one_that_was_not(tiny, tmp_path, algo, seeds):
    """The real loop on CUDA (graphs on, evaluation, checkpoints): 800 steps straight against 400 steps,
    then a resume to 800, whose first steps are eager warm-ups again. Same logged rows and final scores.
    IQL's actor learning rate decays over --steps, which differs between the two runs here, so it runs
    without the decay (the schedule's path through the graph is the unit test's above)."""
    common = ["--eval.every", "400", "--eval.episodes", "3", "--log.every", "100", "--run.checkpoint-every", "100",
              "--log.wandb", "disabled", "--log.no-progress", "--hidden", "64", "64", "--device", "cuda"]
    if algo == "iql":
        common.append("--no-cosine-actor-lr")
    if seeds:
        common += ["--seeds", *map(str, seeds)]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "800", "--run.out-dir", str(straight), *common)
    run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "400", "--run.out-dir", str(split), *common)
    resumed = run_cli(PYTHON, "-m", f"algos.{algo}", "--steps", "800", "--run.out-dir", str(split), "--resume", "latest",
                      *common)
    assert "resumed" in resumed.stderr
    expected_dirs = sorted(p for p in straight.glob(f"{algo}/*/*") if p.is_dir())
    split_dirs = sorted(p for p in split.glob(f"{algo}/*/*") if p.is_dir())
    assert len(expected_dirs) == len(split_dirs) == max(1, len(seeds))
    for expected, got in zip(expected_dirs, split_dirs):
        a, b = _rows(expected), _rows(got)
        assert [r["step"] for r in a] == [r["step"] for r in b] and a[-1]["step"] == 800
        for ra, rb in zip(a, b):
            for key, value in ra.items():
                if isinstance(value, float):
                    assert rb[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (got, ra["step"], key)
        final = json.loads((got / "final.json").read_text())
        assert final["eval/normalized_score"] == pytest.approx(
            json.loads((expected / "final.json").read_text())["eval/normalized_score"], rel=1e-4, abs=1e-6)


def soft_actor_critic_after(algo: str, cuda_graph: bool, steps: int, device: str = "cuda"):
    """SAC, WSRL (its UTD slices) or MOPO (the agent's update on dataset batches; the model's rollouts are not
    part of the step) after `steps` updates from the same seeds."""
    from algos.wsrl import sample_slices

    module = importlib.import_module(f"algos.{algo}")
    cfg = module.Config()
    cfg.run.cuda_graph = cuda_graph
    device = torch.device(device)
    data = synthetic_data(rows=5000)
    torch.manual_seed(0)
    agent = module.Agent(cfg, data, device)
    buffer = ReplayBuffer.from_dataset(data.dataset, device, seed=0)
    torch.manual_seed(1)  # the actor's draws and WSRL's target subsample from the same default-generator state
    for _ in range(steps):
        metrics = agent.update(sample_slices(buffer, None, cfg) if algo == "wsrl" else buffer.sample(cfg.batch_size))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return agent, {name: value.clone() for name, value in metrics.items()}


@cuda
@pytest.mark.parametrize("algo", ["sac", "wsrl", "mopo"])
def test_graphed_soft_actor_critic_steps_train_as_the_eager_ones(algo):
    """offrl/sac.py's critic and actor steps, each its own graph (WSRL: four critic steps on 256-row slices per
    actor step on all 1024 rows, whose metrics must not be the last slice's four times): 20 updates give the
    eager agent's weights, temperature and metrics."""
    eager, eager_metrics = soft_actor_critic_after(algo, False, 20)
    graphed, graphed_metrics = soft_actor_critic_after(algo, True, 20)
    assert graphed._critic_step.recorded == 1 and graphed._actor_step.recorded == 1
    assert eager._critic_step.recorded == 0
    a, b = parameters(eager), parameters(graphed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6, msg=f"{algo}: {name}")
    torch.testing.assert_close(graphed.log_alpha, eager.log_alpha, rtol=1e-4, atol=1e-6)
    for name, value in eager_metrics.items():
        torch.testing.assert_close(graphed_metrics[name], value, rtol=1e-4, atol=1e-6, msg=f"{algo}: {name}")


def test_soft_actor_critic_steps_on_the_cpu_are_plain_calls():
    """The helper above on the CPU, where the graph is off: the steps run eagerly and record nothing."""
    agent, metrics = soft_actor_critic_after("wsrl", True, 2, device="cpu")
    assert agent._critic_step.recorded == 0 and not agent._critic_step.enabled
    assert agent.critic_updates == 2 * agent.cfg.utd and all(torch.isfinite(v).all() for v in metrics.values())
