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


def _count_torch_steps(opt):
    """opt.torch_steps counts the steps torch's own Adam step took (the others took the fast path)."""
    opt.torch_steps = 0
    torch_step = opt._torch_step

    def counted(closure=None):
        opt.torch_steps += 1
        return torch_step(closure)

    opt._torch_step = counted


def _run(opt_class, steps=6, tensor_lr=False, schedule=True, skip_grad_at=None, reload_at=None, **kwargs):
    params = _params()
    opt = opt_class([{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 3e-4}], fused=True, **kwargs)
    if tensor_lr:
        graph_safe(opt)
    if opt_class is Adam:
        _count_torch_steps(opt)
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


@pytest.mark.parametrize("options, torch_steps", [
    ({}, 1),  # of 6: the first step creates the state
    ({"tensor_lr": True}, 1),
    ({"weight_decay": 0.1}, 1),
    ({"weight_decay": 0.1, "decoupled_weight_decay": True}, 1),
    ({"skip_grad_at": 3}, 3),  # step 3 lacks a gradient; its plan is listed again at step 4
    ({"reload_at": 2}, 2),  # loaded state: new tensors, listed again at the next step
    ({"amsgrad": True}, 6),  # amsgrad's groups are sent to torch's step
])
def test_fast_step_equals_torch_fused_adam_bit_for_bit(options, torch_steps):
    ours, our_opt = _run(Adam, **options)
    torchs, torch_opt = _run(torch.optim.Adam, **options)
    assert our_opt.torch_steps == torch_steps  # the others took the fast path
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


def _stepped(opt_class=Adam, steps=2, **kwargs):
    params = _params()
    opt = opt_class([{"params": params}], lr=1e-3, fused=True, **kwargs)
    for step in range(steps):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        opt.step()
    return params, opt


def test_copied_and_pickled_optimizers_step_as_the_original():
    import pickle

    params, opt = _stepped()
    assert opt._plan is not None
    model = {"params": params, "opt": opt}
    reference, _ = _stepped(torch.optim.Adam, steps=4)
    for copy_of in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert copy_of["opt"]._plan is None  # its states are new tensors: listed again at its next step
        _count_torch_steps(copy_of["opt"])
        for step in (2, 3, 4):
            for p, q, g in zip(params, copy_of["params"], _grads(params, step)):
                p.grad, q.grad = g, g.clone()
            copy_of["opt"].step()
            if step == 3:
                assert all(torch.equal(q, r) for q, r in zip(copy_of["params"], reference))
        assert copy_of["opt"].torch_steps == 1  # the first step after the copy; then the fast path
    for step in (2, 3):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        opt.step()
    assert all(torch.equal(p, r) for p, r in zip(params, reference))


def test_a_grad_scaler_found_inf_skips_the_step_as_torch_does():
    params, opt = _stepped()
    before = [p.detach().clone() for p in params]
    opt.found_inf = torch.ones(())
    opt.step()  # torch's fused step with found_inf = 1 leaves the parameters as they are
    del opt.found_inf
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_an_added_param_group_is_stepped():
    params, opt = _stepped()
    extra = torch.nn.Parameter(torch.ones(4))
    opt.add_param_group({"params": [extra], "lr": 0.1})
    for step in (2, 3):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        extra.grad = torch.ones(4)
        opt.step()
    assert opt._plan is not None and len(opt._plan[0]) == 2
    assert torch.allclose(extra, torch.full((4,), 0.8))  # two Adam steps of lr 0.1 on a constant gradient


def test_switching_a_group_to_amsgrad_leaves_the_fast_path():
    params, opt = _stepped()
    reference, torch_opt = _stepped(torch.optim.Adam)
    plain, plain_opt = _stepped(torch.optim.Adam)  # what a step that ignored amsgrad would give
    opt.param_groups[0]["amsgrad"] = torch_opt.param_groups[0]["amsgrad"] = True
    for state in (opt.state, torch_opt.state):
        for entry in state.values():
            entry["max_exp_avg_sq"] = entry["exp_avg_sq"] * 4  # above the new second moment: amsgrad changes the step
    _count_torch_steps(opt)
    for p, r, a, g in zip(params, reference, plain, _grads(params, 5)):
        p.grad, r.grad, a.grad = g, g.clone(), g.clone()
    opt.step()
    torch_opt.step()
    plain_opt.step()
    assert opt.torch_steps == 1
    assert all(torch.equal(p, r) for p, r in zip(params, reference))
    assert not any(torch.equal(p, a) for p, a in zip(params, plain))
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert all(torch.equal(opt.state[p][key], torch_opt.state[r][key]) for p, r in zip(params, reference))


def test_adamw_keeps_decoupled_decay_and_its_fused_step_after_loading_older_state():
    """offrl.optim.AdamW: torch.optim.AdamW's steps; a state dict without the decoupled flag (an AdamW saved
    before torch made AdamW an Adam subclass) or with fused None (one made unfused) loads as decoupled and fused,
    and steps as torch's AdamW goes on stepping."""
    from offrl.optim import AdamW

    torch.manual_seed(0)
    mine = [torch.randn(6, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in mine]
    opt = AdamW([{"params": [mine[0]], "weight_decay": 0.1}, {"params": [mine[1]], "weight_decay": 0.0}], lr=1e-2,
                fused=True)
    reference = torch.optim.AdamW([{"params": [theirs[0]], "weight_decay": 0.1},
                                   {"params": [theirs[1]], "weight_decay": 0.0}], lr=1e-2)

    def steps(n):
        for _ in range(n):
            for p, q in zip(mine, theirs):
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
            opt.step()
            reference.step()
        for p, q in zip(mine, theirs):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)

    assert all(g["decoupled_weight_decay"] and g["fused"] for g in opt.param_groups)
    steps(3)
    older = copy.deepcopy(reference.state_dict())  # load_state_dict would share its tensors with the reference
    for group in older["param_groups"]:
        del group["decoupled_weight_decay"]
        group["fused"] = None
    opt.load_state_dict(older)
    assert all(g["decoupled_weight_decay"] and g["fused"] for g in opt.param_groups)
    steps(3)
    assert opt._plan is not None  # the fast path again
