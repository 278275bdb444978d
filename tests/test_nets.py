"""Network building blocks against their per-member / textbook definitions."""

import copy
import math
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from offrl.nets import (DeterministicActor, Dropout, EnsembleCritic, EnsembleLinear, EnsembleMLP, GaussianActor, Linear,
                        autocast, frozen, gradient_step, mlp, TanhGaussianActor, soft_update)


def test_ensemble_linear_equals_separate_linears():
    torch.manual_seed(0)
    layer = EnsembleLinear(3, 4, 5)
    x = torch.randn(3, 7, 4)
    out = layer(x)
    for e in range(3):
        torch.testing.assert_close(out[e], x[e] @ layer.weight[e] + layer.bias[e])
    shared = torch.randn(7, 4)
    torch.testing.assert_close(layer(shared), torch.stack([shared @ layer.weight[e] + layer.bias[e] for e in range(3)]))
    assert layer.weight.abs().max() <= 1 / math.sqrt(4)


def test_column_major_input_layer_is_nn_linear_in_values_gradients_and_checkpoints(tmp_path):
    torch.manual_seed(0)
    layer = Linear(11, 32)
    assert layer.weight.stride() == (1, 32) and Linear(32, 32).weight.is_contiguous()  # only narrow inputs
    plain = nn.Linear(11, 32)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(64, 11, requires_grad=True)
    g = torch.randn(64, 32)
    layer(x).backward(g)
    grad_x = x.grad.clone()
    x.grad = None
    plain(x).backward(g)
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(layer.weight.grad, plain.weight.grad)
    assert layer.weight.grad.stride() == layer.weight.stride()  # Adam's state and the gradient share the layout
    torch.testing.assert_close(layer.bias.grad, plain.bias.grad)
    # A checkpoint round trip keeps values and layout, and so does deepcopy (target networks).
    torch.save(layer.state_dict(), tmp_path / "layer.pt")
    loaded = Linear(11, 32)
    loaded.load_state_dict(torch.load(tmp_path / "layer.pt", weights_only=True))
    torch.testing.assert_close(loaded.weight, layer.weight)
    assert loaded.weight.stride() == (1, 32)
    assert copy.deepcopy(layer).weight.stride() == (1, 32)


@pytest.mark.parametrize("shared_input", [False, True])
def test_ensemble_output_unit_equals_the_batched_product(shared_input):
    """EnsembleLinear's 1-unit CPU path (multiply and sum) against baddbmm, forward and backward."""
    torch.manual_seed(0)
    layer = EnsembleLinear(3, 16, 1)
    x = torch.randn(*(() if shared_input else (3,)), 40, 16, requires_grad=True)
    out = layer(x)
    assert "Baddbmm" not in type(out.grad_fn).__name__  # the multiply-and-sum path ran, not the product
    expanded = x if not shared_input else x.unsqueeze(0).expand(3, -1, -1)
    reference = torch.baddbmm(layer.bias, expanded, layer.weight)
    torch.testing.assert_close(out, reference)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, layer.weight, layer.bias), g)
    expected = torch.autograd.grad(reference, (x, layer.weight, layer.bias), g)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("members", [None, torch.tensor([2, 0, 2])])
def test_ensemble_output_unit_per_member_products_equal_the_batched_product(members):
    """Above CPU_MV_ABOVE_MEMBER_ROWS member-rows the 1-unit layer runs one matrix-vector product per member
    (_MemberColumn): values, first and second derivatives as baddbmm's, with a members subset too."""
    torch.manual_seed(0)
    layer = EnsembleLinear(3, 16, 1).double()
    x = torch.randn(3, 400, 16, dtype=torch.float64, requires_grad=True)
    out = layer(x, members)
    assert "MemberColumn" in type(out.grad_fn).__name__
    weight, bias = layer.member_params(members)
    reference = torch.baddbmm(bias, x, weight)
    torch.testing.assert_close(out, reference)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, layer.weight, layer.bias), g, create_graph=True)
    expected = torch.autograd.grad(reference, (x, layer.weight, layer.bias), g, create_graph=True)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    # a gradient penalty's second derivative, d/dW of |dQ/dx|^2, as the product's
    second = torch.autograd.grad(grads[0].square().sum(), layer.weight)[0]
    torch.testing.assert_close(second, torch.autograd.grad(expected[0].square().sum(), layer.weight)[0])
    small = layer(x[:, :300], members)  # 900 member-rows: the multiply and sum
    assert "MemberColumn" not in type(small.grad_fn).__name__
    torch.testing.assert_close(small, reference[:, :300])


def test_ensemble_output_unit_per_member_products_under_vmap(monkeypatch):
    """offrl.multiseed vmaps the losses over seeds: the per-member path's generated vmap rule gives each
    seed what its own call gives, forward and gradients."""
    from offrl import nets

    calls = []
    forward = nets._MemberColumn.forward
    monkeypatch.setattr(nets._MemberColumn, "forward", staticmethod(lambda *a: (calls.append(1), forward(*a))[1]))
    torch.manual_seed(0)
    seeds = [EnsembleLinear(2, 8, 1) for _ in range(3)]
    weights = torch.stack([s.weight.detach() for s in seeds]).requires_grad_()
    biases = torch.stack([s.bias.detach() for s in seeds]).requires_grad_()
    x = torch.randn(3, 2, 600, 8)
    template = EnsembleLinear(2, 8, 1)

    def one(w, b, xs):
        return torch.func.functional_call(template, {"weight": w, "bias": b}, (xs,))

    out = torch.func.vmap(one)(weights, biases, x)
    assert calls  # the vmapped call went through _MemberColumn
    out.square().sum().backward()
    for i, layer in enumerate(seeds):
        own = layer(x[i])
        assert "MemberColumn" in type(own.grad_fn).__name__
        torch.testing.assert_close(out[i], own)
        own.square().sum().backward()
        torch.testing.assert_close(weights.grad[i], layer.weight.grad)
        torch.testing.assert_close(biases.grad[i], layer.bias.grad)


def test_in_place_relu_mlp_has_the_gradients_of_an_out_of_place_one():
    torch.manual_seed(0)
    net = mlp(5, 2, (16, 16))
    assert all(m.inplace for m in net if isinstance(m, nn.ReLU))
    reference = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    reference.load_state_dict(net.state_dict())
    x = torch.randn(9, 5)
    net(x).square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_ensemble_members_train_independently():
    torch.manual_seed(0)
    net = EnsembleMLP(2, 3, 1, hidden=(8,))
    x = torch.randn(2, 5, 3)
    net(x)[0].sum().backward()  # loss of member 0 only
    assert all(p.grad[1].abs().sum() == 0 for p in net.parameters())


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("members", [slice(0, 1), slice(1, 3), torch.tensor([2, 0, 2])])
def test_critic_member_subset_equals_those_members_of_the_full_pass(layer_norm, members):
    """`members=` runs only those members (TD3+BC's actor loss reads Q_1 alone; a subsampled target draws an
    index tensor, repeats allowed): outputs and the gradients into the members' weights and into the actions
    are those the full ensemble gives them, and the other members' weights get no gradient."""
    torch.manual_seed(0)
    critic = EnsembleCritic(5, 2, 3, hidden=(16, 16), layer_norm=layer_norm)
    obs, act = torch.randn(7, 5), torch.randn(7, 2, requires_grad=True)
    full = critic(obs, act)[members]
    full_grads = torch.autograd.grad(full.sum(), [act, *critic.parameters()])
    part = critic(obs, act, members=members)
    assert part.shape == full.shape
    part_grads = torch.autograd.grad(part.sum(), [act, *critic.parameters()], allow_unused=True)
    torch.testing.assert_close(part, full)
    torch.testing.assert_close(part_grads[0], full_grads[0])
    for got, want in zip(part_grads[1:], full_grads[1:]):
        got = torch.zeros_like(want) if got is None else got
        torch.testing.assert_close(got, want)
        outside = torch.ones(want.shape[0], dtype=torch.bool)
        outside[members] = False
        assert got[outside].abs().sum() == 0


@pytest.mark.parametrize("members, rows_per_pass", [(2, 1024), (7, 256), (10, 256), (64, 256)])
def test_critic_row_blocks_give_one_pass_outputs_and_gradients(members, rows_per_pass):
    """On the CPU a batch larger than a block goes through the critic in row blocks sized to the ensemble
    (E x rows <= 2048, at least 256 rows): the outputs and weight gradients of one pass, up to float summation
    order."""
    torch.manual_seed(0)
    critic = EnsembleCritic(5, 2, members, hidden=(16, 16), layer_norm=True)
    assert critic.net.net.rows_per_pass(members) == rows_per_pass
    obs, act = torch.randn(3 * rows_per_pass + 5, 5), torch.randn(3 * rows_per_pass + 5, 2)
    blocked = critic(obs, act)
    (blocked ** 2).sum().backward()
    blocked_grads = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()
    one_pass = critic.net.net.one_pass(torch.cat([obs, act], dim=-1)).squeeze(-1)
    (one_pass ** 2).sum().backward()
    torch.testing.assert_close(blocked, one_pass)
    for got, want in zip(blocked_grads, (p.grad for p in critic.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["actor", "dynamics", "critic members"])
def test_large_batches_run_in_row_blocks_with_one_pass_outputs(kind, monkeypatch):
    """A policy over rollout-sized batches (2048-row blocks) and a 7-member dynamics ensemble (256-row blocks)
    run in row blocks on the CPU, as do a critic's chosen members (blocks sized to their count), with the
    outputs of one pass."""
    from world_models.ensemble import DynamicsEnsemble

    torch.manual_seed(0)
    passes = []
    if kind == "actor":
        module = TanhGaussianActor(5, 2, [-1.0, -1.0], [1.0, 1.0], hidden=(16, 16))
        net, rows, x = module.trunk, 2048, torch.randn(2 * 2048 + 3, 5)
        run = lambda: module(x, deterministic=True)[0]  # noqa: E731
    elif kind == "dynamics":
        module = DynamicsEnsemble(5, 2)
        net, rows, x, a = module.net.net, 256, torch.randn(3 * 256 + 7, 5), torch.randn(3 * 256 + 7, 2)
        run = lambda: torch.cat(module(x, a), dim=-1)  # noqa: E731
    else:
        module = EnsembleCritic(5, 2, 10, hidden=(16, 16))
        net, rows, x, a = module.net.net, 512, torch.randn(3 * 512 + 7, 5), torch.randn(3 * 512 + 7, 2)
        run = lambda: module(x, a, members=torch.tensor([3, 7, 3, 1]))  # noqa: E731
    one_pass = net.one_pass
    monkeypatch.setattr(net, "one_pass", lambda inputs, *rest: passes.append(len(inputs)) or one_pass(inputs, *rest))
    blocked = run()
    assert passes == [rows] * (len(x) // rows) + [len(x) % rows]
    passes.clear()
    monkeypatch.setattr(net, "rows_per_pass", lambda members: 10**9)
    torch.testing.assert_close(blocked, run())
    assert passes == [len(x)]


def test_critic_and_actor_shapes_and_bounds():
    critic = EnsembleCritic(4, 2, ensemble_size=2, hidden=(16, 16), layer_norm=True)
    assert critic(torch.randn(9, 4), torch.randn(9, 2)).shape == (2, 9)
    actor = DeterministicActor(4, 2, [-1.0, 0.0], [1.0, 4.0], hidden=(16,))
    a = actor(torch.randn(100, 4) * 10)
    assert (a[:, 0].abs() <= 1).all() and (a[:, 1] >= 0).all() and (a[:, 1] <= 4).all()


@pytest.mark.parametrize("layer_norm", [False, True])
def test_tanh_gaussian_repeat_equals_sampling_at_repeated_states(layer_norm):
    """`actor(obs, repeat=n)` (CQL's n actions per state, one pass over the B states) draws the same noise
    and gives the same actions and log-probabilities as `actor(obs.repeat_interleave(n, 0))`."""
    torch.manual_seed(0)
    actor = TanhGaussianActor(5, 2, [-1.0, -2.0], [1.0, 3.0], hidden=(16, 16), layer_norm=layer_norm)
    obs = torch.randn(7, 5)
    torch.manual_seed(1)
    want = actor(obs.repeat_interleave(4, dim=0))
    torch.manual_seed(1)
    got = actor(obs, repeat=4)
    assert got[0].shape == (28, 2) and got[1].shape == (28,)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got[0][0], got[0][1])  # each repeat its own draw


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, [-2.0, -2.0], [2.0, 2.0], hidden=(16,))
    obs = torch.randn(6, 3)
    action, log_prob = actor(obs)
    mean, log_std = actor.distribution(obs)
    base = torch.distributions.Normal(mean, log_std.exp())
    u = torch.atanh(action / 2.0)
    expected = (base.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2) - math.log(2.0)).sum(-1)
    torch.testing.assert_close(log_prob, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(actor.log_prob(obs, action), expected, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(actor.act(obs), 2.0 * torch.tanh(mean))


def test_iql_gaussian_actor_log_prob():
    torch.manual_seed(0)
    actor = GaussianActor(3, 2, [-1.0, -1.0], [1.0, 1.0], hidden=(16,))
    with torch.no_grad():
        actor.log_std.fill_(-9.0)  # clipped to -5
    obs, act = torch.randn(4, 3), torch.rand(4, 2) * 2 - 1
    expected = torch.distributions.Normal(actor(obs), math.exp(-5.0)).log_prob(act).sum(-1)
    torch.testing.assert_close(actor.log_prob(obs, act), expected)


def test_soft_update():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    before = [p.clone() for p in a.parameters()]
    soft_update(a, b, 0.25)
    for old, new, src in zip(before, a.parameters(), b.parameters()):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * src)


def test_bf16_step_sees_weights_changed_earlier_in_the_same_step():
    """One update holds one autocast context across several optimizer steps (WSRL's UTD critic steps, IQL's
    V step before its actor and Q steps). With autocast's weight-cast cache on, a later forward pass reused the
    bf16 copy of the weights from before the earlier step: stale critics in WSRL's steps 2-4 made its eager
    bf16 fine-tuning collapse where fp32 and the compiled critics (no cache) did not."""
    torch.manual_seed(0)
    net = mlp(4, 1, (32, 32))
    x = torch.randn(16, 4)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    with gradient_step(torch.device("cpu"), "bf16"):
        net(x).square().mean().backward()
        optimizer.step()
        after_step = net(x)
    with gradient_step(torch.device("cpu"), "bf16"):
        fresh = net(x)
    torch.testing.assert_close(after_step, fresh, rtol=0, atol=0)


def test_bf16_autocast_keeps_the_output_layer_in_float32():
    torch.manual_seed(0)
    critic = EnsembleCritic(5, 2, ensemble_size=3, hidden=(64, 64))
    actor = TanhGaussianActor(5, 2, -np.ones(2), np.ones(2), hidden=(64, 64))
    obs, act = torch.randn(32, 5), torch.rand(32, 2) * 2 - 1
    hidden_dtypes = []
    critic.net.net[0].register_forward_hook(lambda m, i, out: hidden_dtypes.append(out.dtype))
    with autocast(torch.device("cpu"), "bf16"):
        q = critic(obs, act)
        mean, log_std = actor.distribution(obs)
    assert hidden_dtypes == [torch.bfloat16]  # the hidden matmuls did run in bf16
    assert q.dtype == mean.dtype == log_std.dtype == torch.float32
    # The float32 head sees the bf16 hidden activations: close to, not equal to, the fp32 forward.
    q32 = critic(obs, act)
    assert hidden_dtypes[-1] == torch.float32
    assert torch.allclose(q, q32, atol=0.05) and not torch.equal(q, q32)
    q.sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in critic.parameters())
    # State-dict keys are nn.Sequential's, so policies saved before the MLP class still load.
    assert "net.net.0.weight" in critic.state_dict() and "trunk.0.weight" in actor.state_dict()
    with pytest.raises(ValueError, match="precision"):
        autocast(torch.device("cpu"), "fp16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_rate_scale_and_gradient(dtype):
    torch.manual_seed(0)
    layer = Dropout(0.1)
    x = torch.rand(499, 1001).add(0.5).to(dtype).requires_grad_()  # odd size: the last word is partly used
    y = layer(x)
    dropped = y == 0
    drops = round(0.1 * 2**32)
    # drop rate drops / 2^32 (0.1 to within 2^-33); over 499,499 elements its standard error is 0.0004
    assert abs(dropped.float().mean().item() - drops / 2**32) < 0.002
    # the mask differs along both axes (no repeated pattern of a word's two draws)
    pairs = dropped.flatten()[:-1].view(-1, 2)
    assert dropped[:, :4].float().std(0).min() > 0 and pairs.float().mean(0).std() < 0.01
    # and a word's two halves drop independently: both in p^2 of the pairs (standard error 0.0002; equal halves 0.1)
    assert abs((pairs[:, 0] & pairs[:, 1]).float().mean().item() - 0.01) < 0.002
    scale = 2**32 / (2**32 - drops)
    torch.testing.assert_close(y[~dropped], (x.detach().float() * scale).to(dtype)[~dropped])
    y.float().sum().backward()
    expected_grad = torch.where(dropped, 0.0, scale).to(dtype)
    torch.testing.assert_close(x.grad, expected_grad)
    # a fresh mask each call, the same mask for the same seed
    torch.manual_seed(1)
    first = layer(x.detach()) == 0
    torch.manual_seed(1)
    assert torch.equal(layer(x.detach()) == 0, first) and not torch.equal(first, dropped)


def test_dropout_is_identity_in_eval_mode_and_exact_at_p_0_and_1():
    x = torch.randn(3, 7)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0)(x), x)
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))
    assert torch.equal(Dropout(1 - 2**-40)(x), torch.zeros_like(x))  # rounds to every draw dropped


def test_edac_critic_init_draws_every_hidden_weight_within_one_over_sqrt_out():
    """EDAC's init as RIQL's and RAVL's official codes run it: kaiming_uniform_ on an [in, out] slice reads `out`
    as the fan-in, so the first layer (14 inputs here) is drawn within +-1/16, not nn.Linear's +-1/sqrt(14)."""
    from offrl.nets import EnsembleCritic, EnsembleLinear, edac_critic_init

    torch.manual_seed(0)
    critic = EnsembleCritic(11, 3, 5, (256, 256))
    edac_critic_init(critic)
    first, hidden, last = [m for m in critic.modules() if isinstance(m, EnsembleLinear)]
    for layer in (first, hidden):
        assert 0.06 < layer.weight.abs().max().item() <= 1 / 16  # the whole range is used, and no more
        assert torch.all(layer.bias == 0.1)
    assert last.weight.abs().max().item() <= 3e-3 and last.bias.abs().max().item() <= 3e-3
    assert abs(first.weight.std().item() - (1 / 16) / 3**0.5) < 2e-3  # uniform: std = bound / sqrt(3)


def test_frozen_records_no_weight_gradient_and_restores_requires_grad():
    """An actor's loss through frozen critics reaches the actions only (no graph edge to the critics' weights,
    so a compiled critic's backward cannot compute them); afterwards, and after an error inside, every
    parameter that required gradients does again, and one that did not stays so."""
    critic = EnsembleCritic(3, 2, 4, (8, 8))
    fixed = critic.net.net[0].weight
    fixed.requires_grad_(False)
    actions = torch.randn(5, 2, requires_grad=True)
    with frozen(critic):
        assert not any(p.requires_grad for p in critic.parameters())
        q = critic(torch.randn(5, 3), actions).min(dim=0).values.sum()
    assert [p.requires_grad for p in critic.parameters()] == [p is not fixed for p in critic.parameters()]
    weights = [p for p in critic.parameters() if p is not fixed]  # requiring gradients again, yet off q's graph
    assert all(g is None for g in torch.autograd.grad(q, weights, allow_unused=True, retain_graph=True))
    assert torch.autograd.grad(q, actions)[0].abs().sum() > 0
    with pytest.raises(RuntimeError, match="inside"):
        with frozen(critic):
            raise RuntimeError("inside")
    assert [p.requires_grad for p in critic.parameters()] == [p is not fixed for p in critic.parameters()]


@pytest.mark.parametrize("members", [None, torch.tensor([2, 0, 2])])
@pytest.mark.parametrize("shared_input", [False, True])
def test_ensemble_layer_norm_per_member_calls_equal_the_batched_formula(members, shared_input):
    """On the CPU, EnsembleLayerNorm runs one fused F.layer_norm per member: outputs and gradients (inputs,
    weights, biases, repeated members included) are those of LayerNorm(x) * w + b over the whole ensemble,
    and under bf16 autocast (a bf16 input) the same in float32: the affine's gradients summed over 1024 rows in
    float32 (a bf16 input's own kernel sums them in bf16, 2-3% off)."""
    from offrl.nets import EnsembleLayerNorm

    torch.manual_seed(0)
    layer = EnsembleLayerNorm(3, 16)
    with torch.no_grad():
        layer.weight.normal_(1.0, 0.3)
        layer.bias.normal_(0.0, 0.3)
    e = 3 if members is None else len(members)
    x = torch.randn(*(() if shared_input else (e,)), 33, 16, requires_grad=True)

    def batched():
        weight, bias = layer.member_params(members)
        return torch.nn.functional.layer_norm(x, (16,), eps=layer.eps) * weight + bias

    out = layer(x, members)
    want = batched()
    torch.testing.assert_close(out, want)
    upstream = torch.randn_like(want)
    got_grads = torch.autograd.grad(out, [x, layer.weight, layer.bias], upstream)
    want_grads = torch.autograd.grad(want, [x, layer.weight, layer.bias], upstream)
    for got, expected in zip(got_grads, want_grads):
        torch.testing.assert_close(got, expected)
    rows = torch.randn(*(() if shared_input else (e,)), 1024, 16).bfloat16()  # a bf16 matmul's output
    upstream = torch.rand(e, 1024, 16)  # positive: a bf16 sum's rounding errors add up
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = layer(rows, members)
    assert low.dtype == torch.float32
    x = rows.float()
    want = batched()
    torch.testing.assert_close(low, want)
    got_grads = torch.autograd.grad(low, [layer.weight, layer.bias], upstream)
    want_grads = torch.autograd.grad(want, [layer.weight, layer.bias], upstream)
    for got, expected in zip(got_grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_ensemble_layer_norm_many_members_keep_one_batched_normalization(monkeypatch):
    """Past CPU_MAX_MEMBER_CALLS members the layer normalizes all members in one call (same values)."""
    from offrl.nets import EnsembleLayerNorm

    torch.manual_seed(0)
    layer = EnsembleLayerNorm(4, 8)
    x = torch.randn(4, 5, 8)
    per_member = layer(x)
    calls = []
    real = torch.nn.functional.layer_norm
    monkeypatch.setattr(torch.nn.functional, "layer_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(EnsembleLayerNorm, "CPU_MAX_MEMBER_CALLS", 3)
    torch.testing.assert_close(layer(x), per_member)
    assert len(calls) == 1
    monkeypatch.setattr(EnsembleLayerNorm, "CPU_MAX_MEMBER_CALLS", 16)
    layer(x)
    assert len(calls) == 1 + 4


def test_cpu_dropout_words_follow_torchs_seed_and_are_uniform_bits():
    """The CPU dropout words (numpy's PCG64 seeded from torch's generator): the same torch seed gives the same
    words, each call new ones, and each of the 64 bit positions is set in half the words (within 5 standard
    errors over 200,000 words)."""
    from offrl.nets import _random_words

    like = torch.empty(0)
    torch.manual_seed(3)
    first, second = _random_words(like, 200_000), _random_words(like, 200_000)
    torch.manual_seed(3)
    assert torch.equal(_random_words(like, 200_000), first)
    assert first.dtype == torch.int64 and not torch.equal(first, second)
    words = first.numpy().view(np.uint64)
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.abs(bits.mean(axis=0) - 0.5).max() < 5 * 0.5 / np.sqrt(len(words))


def test_compiled_dropout_draws_the_eager_masks_once_each(monkeypatch):
    """offrl.nets.Dropout under torch.compile: one graph (its random words are an op of their own, not a graph
    break), the same masks as eager from the same seed (values and gradients), and each layer's words drawn
    once: the backward reads the forward's mask, it does not draw again."""
    from offrl import compiling, nets

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 64), nets.Dropout(0.3), nn.ReLU(), nn.Linear(64, 64), nets.Dropout(0.3),
                        nn.Linear(64, 1))
    x = torch.randn(32, 8)

    def loss():
        return net(x).square().mean()

    draws = []
    real = np.random.PCG64

    class CountingPCG64:  # the CPU words' generator (offrl.nets._random_words), counting the words drawn
        def __init__(self, seed):
            self.generator = real(seed)

        def random_raw(self, count):
            draws.append(count)
            return self.generator.random_raw(count)

    torch.manual_seed(1)
    eager = loss()
    eager_grads = torch.autograd.grad(eager, list(net.parameters()))
    explained = torch._dynamo.explain(loss)()
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    fast = compiling.compiled(loss)
    fast()  # compiles
    monkeypatch.setattr(np.random, "PCG64", CountingPCG64)
    torch.manual_seed(1)
    value = fast()
    grads = torch.autograd.grad(value, list(net.parameters()))
    assert draws == [32 * 64 // 2, 32 * 64 // 2]  # two layers (a word per two elements), forward only
    torch.testing.assert_close(value, eager)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want)


FREED_BLOCKS_PROBE = """
import resource, sys
import torch
from offrl.nets import retain_freed_memory
torch.set_num_threads(1)
if sys.argv[1] == "retain":
    assert retain_freed_memory()
torch.manual_seed(0)
blocks = [torch.nn.Sequential(torch.nn.LayerNorm(128), torch.nn.Linear(128, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 128)) for _ in range(3)]
x = torch.randn(6000, 128)
def step():  # an eval-mode forward pass (DT's over 100 envs): each activation freed once the next layer read it
    with torch.no_grad():
        h = x
        for block in blocks:
            h = h + block(h)
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_retained_freed_memory_is_reused_without_page_faults():
    """With glibc's defaults, an eval-mode forward pass's 12 MiB activations go back to the OS when freed and
    come back as fresh pages that fault in one by one, every pass (about 6,000-18,000 faults a pass here); after
    retain_freed_memory() the freed blocks are reused."""
    faults = {mode: float(subprocess.run([sys.executable, "-c", FREED_BLOCKS_PROBE, mode], capture_output=True,
                                         text=True, check=True).stdout)
              for mode in ("default", "retain")}
    assert faults["retain"] <= 500 and faults["default"] >= 3000, faults
