"""offrl.compiling: the CPU mask pass keeps bool masks out of a compiled step's saved tensors, changes no
gradient, and is registered with Inductor once, beside any pass already there."""

import pytest
import torch

from offrl import compiling


def _frozen_mlp_loss(x, w1, b1, w2):
    """x needs a gradient, the weights do not: an actor's loss through a frozen critic."""
    return (torch.relu(x @ w1 + b1) @ w2).square().sum()


def _saved_and_grad(partition):
    """The dtypes of the tensors the forward saves for the backward when AOTAutograd partitions the joint graph
    with `partition` (Inductor's decompositions), and x's gradient there and in eager mode."""
    from functorch.compile import aot_function, make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    gen = torch.Generator().manual_seed(0)
    weights = (torch.randn(6, 16, generator=gen), torch.randn(16, generator=gen), torch.randn(16, 1, generator=gen))
    saved = {}

    def forward_compiler(graph, inputs):
        output = next(node for node in graph.graph.nodes if node.op == "output")
        saved["dtypes"] = [arg.meta["val"].dtype for arg in output.args[0]
                           if isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)]
        return make_boxed_func(graph.forward)

    fn = aot_function(_frozen_mlp_loss, fw_compiler=forward_compiler, partition_fn=partition,
                      bw_compiler=lambda graph, inputs: make_boxed_func(graph.forward),
                      decompositions=select_decomp_table())
    x = torch.randn(32, 6, generator=gen, requires_grad=True)
    fn(x, *weights).backward()
    eager_x = x.detach().clone().requires_grad_()
    _frozen_mlp_loss(eager_x, *weights).backward()
    return saved["dtypes"], x.grad, eager_x.grad


def _min_cut(with_pass: bool):
    from functorch.compile import min_cut_rematerialization_partition

    def partition(joint, inputs, **kwargs):  # as Inductor's partition_fn: joint-graph passes, then the min cut
        if with_pass:
            compiling._mask_pass()(joint.graph)
        return min_cut_rematerialization_partition(joint, inputs, **kwargs)

    return partition


def test_without_the_pass_a_bool_mask_is_saved_and_with_it_none_and_the_gradient_is_the_same():
    dtypes, grad, eager_grad = _saved_and_grad(_min_cut(with_pass=False))
    assert torch.bool in dtypes  # what the pass is for: the partitioner keeps the ReLU's mask as bool
    torch.testing.assert_close(grad, eager_grad)
    dtypes, grad, eager_grad = _saved_and_grad(_min_cut(with_pass=True))
    assert torch.bool not in dtypes and dtypes  # the activation is saved, the mask recomputed in the backward
    torch.testing.assert_close(grad, eager_grad)


def test_inductors_own_partition_runs_the_registered_pass():
    """Through Inductor's partition function (its joint-graph passes, then the min cut) the registered pass takes
    effect, and without it the mask is saved as bool: the pass runs before the partition, as registered."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import partition_fn

    with inductor_config.patch(joint_custom_post_pass=None):
        assert torch.bool in _saved_and_grad(partition_fn)[0]
        compiling.install_cpu_mask_pass()
        dtypes, grad, eager_grad = _saved_and_grad(partition_fn)
        assert torch.bool not in dtypes
        torch.testing.assert_close(grad, eager_grad)


def test_the_pass_is_registered_once_beside_a_pass_already_there():
    import torch._inductor.config as inductor_config

    def other_pass(graph):
        pass

    with inductor_config.patch(joint_custom_post_pass=other_pass):
        compiling.install_cpu_mask_pass()
        compiling.install_cpu_mask_pass()
        passes = inductor_config.joint_custom_post_pass
        assert passes[0] is other_pass and len(passes) == 2 and passes[1] is compiling._PASS
    with inductor_config.patch(joint_custom_post_pass=None):
        compiling.install_cpu_mask_pass()
        assert inductor_config.joint_custom_post_pass is compiling._PASS
    assert isinstance(compiling._PASS.uuid(), bytes)  # Inductor's cache can key on it


@pytest.mark.parametrize("build", ["compiled", "compile_module"])
def test_compile_helpers_register_the_pass(build):
    import torch._inductor.config as inductor_config

    with inductor_config.patch(joint_custom_post_pass=None):
        if build == "compiled":
            compiling.compiled(lambda x: x + 1)
        else:
            compiling.compile_module(torch.nn.Linear(2, 2))
        assert inductor_config.joint_custom_post_pass is compiling._PASS
