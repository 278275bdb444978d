"""offrl.optim.Adam: torch's fused Adam step, bit for bit, through its fast path and every way out of it."""

import copy

import pytest
import torch

from offrl.optim import Adam, constant, cosine_decay, graph_safe


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(2, 14, 256), (2, 1, 256), (256, 11), (256,), (3, 256), (3,)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def _grads(params, step):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _run(opt_class, steps=6, tensor_lr=False, schedule=True, skip_grad_at=None, reload_at=None, **kwargs):
    params = _params()
    opt = opt_class([{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 3e-4}], fused=True, **kwargs)
    if tensor_lr:
        graph_safe(opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [cosine_decay(steps), constant]) if schedule else None
    for step in range(steps):
        for i, (p, g) in enumerate(zip(params, _grads(params, step))):
            p.grad = None if (step == skip_grad_at and i == 3) else g
        opt.step()
        if sched is not None:
            sched.step()
        if step == reload_at:
            state = copy.deepcopy(opt.state_dict())
            opt.load_state_dict(state)
    return params, opt


@pytest.mark.parametrize("options", [
    {},
    {"tensor_lr": True},
    {"weight_decay": 0.1},
    {"weight_decay": 0.1, "decoupled_weight_decay": True},
    {"skip_grad_at": 3},
    {"reload_at": 2},
    {"amsgrad": True},
])
def test_fast_step_equals_torch_fused_adam_bit_for_bit(options):
    ours, our_opt = _run(Adam, **options)
    torchs, torch_opt = _run(torch.optim.Adam, **options)
    for a, b in zip(ours, torchs):
        assert torch.equal(a, b)
    ours_state, torch_state = our_opt.state_dict(), torch_opt.state_dict()
    assert ours_state["param_groups"] == torch_state["param_groups"]
    for i, entry in torch_state["state"].items():
        for key, value in entry.items():
            assert torch.equal(ours_state["state"][i][key], value), (i, key)


def test_fast_path_is_taken_after_the_first_step_and_left_for_hooks_and_the_profiler():
    params = _params()
    opt = Adam([{"params": params}], lr=1e-3, fused=True)
    for p, g in zip(params, _grads(params, 0)):
        p.grad = g
    calls = []
    torch_step = opt._torch_step
    opt._torch_step = lambda closure=None: calls.append("torch") or torch_step(closure)
    opt.step()
    assert calls == ["torch"]  # the first step creates the state
    opt.step()
    assert calls == ["torch"]  # fast path
    handle = opt.register_step_post_hook(lambda *args: calls.append("hook"))
    opt.step()
    assert calls == ["torch", "torch", "hook"]  # torch's step, which runs the hook
    handle.remove()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    assert calls == ["torch", "torch", "hook", "torch"]
    assert any("Optimizer.step#Adam.step" in event.name for event in prof.events())


def test_step_hooks_still_run():
    params = _params()
    opt = Adam([{"params": params}], lr=1e-3, fused=True)
    seen = []
    opt.register_step_pre_hook(lambda *args: seen.append("pre"))
    opt.register_step_post_hook(lambda *args: seen.append("post"))
    for step in range(3):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        opt.step()
    assert seen == ["pre", "post"] * 3


def test_unfused_adam_is_torch_adam():
    params = _params()
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt, torch_opt = Adam(params, lr=1e-3, fused=False), torch.optim.Adam(reference, lr=1e-3, fused=False)
    for step in range(3):
        for p, r, g in zip(params, reference, _grads(params, step)):
            p.grad, r.grad = g, g.clone()
        opt.step()
        torch_opt.step()
    assert opt._plan is None
    assert all(torch.equal(p, r) for p, r in zip(params, reference))
