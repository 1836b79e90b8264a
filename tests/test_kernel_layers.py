"""The compiled kernel's per-layer pieces (hetrl/kernels/compiled/layers.py) against autograd: a network compiled
into a program gives torch's output, its parameters' gradients and its input's gradient, for each activation,
with and without LayerNorm, at several depths and widths; what the pieces cannot take is one line naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hetrl.algos.nets import flatten, mlp
from hetrl.kernels.compiled import available
from hetrl.kernels.compiled.layers import (
    Declined,
    compile_layers,
    compile_program,
    order_offsets,
    param_offsets,
)

pytestmark = pytest.mark.skipif(available() is not None, reason="numba/scipy not installed")


def _check(seq: nn.Sequential, rows: int = 5, seed: int = 0):
    """The program of `seq` against autograd on random rows and a random upstream gradient."""
    from hetrl.kernels.compiled import sgemm
    from hetrl.kernels.compiled.layers import value_and_grads

    sgemm.bind()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():   # LayerNorm's affine parameters away from their (1, 0) start
        for m in seq.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
    flat = flatten(seq)
    prog = compile_program(seq, param_offsets(flat), "the network")
    assert (prog.lo, prog.hi) == (0, flat.numel())
    x = torch.randn(rows, prog.n_in, generator=g, requires_grad=True)
    out = seq(x)
    up = torch.randn(out.shape, generator=g)
    (out * up).sum().backward()
    want_grad = torch.cat([p.grad.reshape(-1) for p in seq.parameters()])
    grad = np.full(flat.numel(), np.nan, np.float32)    # every entry must be written
    ws = np.zeros(prog.floats(rows) + rows * prog.n_out, np.float32)
    got_out, got_in = np.empty((rows, prog.n_out), np.float32), np.empty((rows, prog.n_in), np.float32)
    value_and_grads(prog.ops, prog.fc, flat.numpy(), grad, x.detach().numpy(), up.numpy(), ws, got_out, got_in,
                    flat.numpy(), False)
    torch.testing.assert_close(torch.from_numpy(got_out), out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(grad), want_grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(got_in), x.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden", [[7], [16, 9], [12, 10, 6]])
@pytest.mark.parametrize("activation", ["relu", "tanh", "elu"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_forward_and_gradients_equal_autograd(hidden, activation, layer_norm):
    torch.manual_seed(len(hidden))
    _check(mlp([5, *hidden, 3], activation, layer_norm))


@pytest.mark.parametrize("ending", ["out_act", "last_act"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_bodies_that_end_in_an_activation(ending, layer_norm):
    """The DDPG/TD3 actor (a Tanh after the last Linear) and SAC's body (the last Linear with its norm and
    activation, heads follow)."""
    torch.manual_seed(1)
    kw = {"out_act": nn.Tanh} if ending == "out_act" else {"last_act": True}
    _check(mlp([4, 11, 6], "relu", layer_norm, **kw))


def test_layers_in_any_order_and_nested():
    """Pieces compose beyond mlp's pattern: an activation first, two in a row (each its own op), a LayerNorm
    after an activation and without affine parameters, an ELU of another alpha, a Linear without bias, nested
    Sequentials and Identity."""
    torch.manual_seed(2)
    seq = nn.Sequential(nn.Tanh(), nn.Linear(6, 8), nn.ReLU(), nn.LayerNorm(8, elementwise_affine=False),
                        nn.Sequential(nn.Linear(8, 9, bias=False), nn.ELU(alpha=0.5), nn.Tanh()), nn.Identity(),
                        nn.LayerNorm(9, eps=1e-3), nn.Linear(9, 2))
    _check(seq, rows=7)


def test_the_program_reads_the_parameters_in_their_flat_buffer():
    """Offsets are where each parameter is in the optimizer's flat buffer (torch's parameters() order), and the
    same for a module flattened later (the acting copy)."""
    seq = mlp([3, 4, 2], "relu", True)
    ops = compile_program(seq, order_offsets(seq), "the network").ops
    flat = flatten(seq)
    assert (compile_program(seq, param_offsets(flat), "the network").ops == ops).all()
    lin0, norm0, lin1 = seq[0], seq[1], seq[3]
    starts = np.cumsum([0] + [p.numel() for p in seq.parameters()])[:-1]
    assert list(ops[0, 3:5]) == list(starts[0:2]) and list(ops[1, 3:5]) == list(starts[2:4])
    assert list(ops[2, 3:5]) == list(starts[4:6])
    assert ops[1, 5] == 1 and ops[0, 5] == 0   # the ReLU fused into the LayerNorm, none after the first Linear
    assert lin0.weight.data_ptr() == flat.data_ptr() and lin1.bias.numel() == 2 and norm0.weight.numel() == 4


@pytest.mark.parametrize("layer,says", [
    (nn.Dropout(0.1), "the critic's layer 2 is a Dropout, which the compiled kernel has no piece for"),
    (nn.BatchNorm1d(8), "the critic's layer 2 is a BatchNorm1d, which the compiled kernel has no piece for"),
    (nn.GELU(), "the critic's layer 2 is a GELU, which the compiled kernel has no piece for"),
    (nn.LayerNorm((2, 4)), "the critic's layer 2 is a LayerNorm over (2, 4), which the compiled kernel takes only"),
])
def test_a_layer_without_a_piece_is_one_line_naming_it(layer, says):
    seq = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), layer, nn.Linear(8, 1))
    with pytest.raises(Declined) as e:
        compile_program(seq, order_offsets(seq), "the critic")
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_other_networks_are_declined_with_a_line():
    conv = nn.Sequential(nn.Conv1d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2, 1))
    with pytest.raises(Declined, match="the actor's layer 0 is a Conv1d, which the compiled kernel has no piece for"):
        compile_program(conv, order_offsets(conv), "the actor")
    with pytest.raises(Declined, match="the actor is a Linear, not an nn.Sequential"):
        compile_program(nn.Linear(2, 2), order_offsets(nn.Linear(2, 2)), "the actor")
    seq = mlp([3, 4, 2])
    flat = torch.zeros(100)   # parameters that are not views of this buffer
    with pytest.raises(Declined, match="the actor's layer 0: its parameter is not a view of its optimizer's flat"):
        compile_program(seq, param_offsets(flat), "the actor")


def test_numbas_cache_of_the_kernel_is_keyed_to_all_of_its_sources():
    """A head's cached machine code contains the pieces it calls from other files: its cache entry is stamped with
    every source of the package, so an edit of any of them compiles the heads again."""
    from hetrl.kernels.compiled import cache, crossq

    locator = crossq.phase._cache._impl.locator
    assert locator.get_source_stamp() == cache.package_stamp()


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("warm", [False, True])
def test_batch_renormalisation_equals_autograd_and_moves_its_statistics_as_torch(train, warm):
    """CrossQ's BatchRenorm as a piece (layers.BRN): output, the parameters' and the input's gradients, and the
    running statistics and pass count after a training pass, before its warm-up ends (plain batch norm) and after
    it (r and d clipped: the running statistics are set far from the batch's)."""
    from hetrl.algos.crossq import BatchRenorm
    from hetrl.kernels.compiled import sgemm
    from hetrl.kernels.compiled.crossq import States
    from hetrl.kernels.compiled.layers import BRN, value_and_grads

    sgemm.bind()
    g = torch.Generator().manual_seed(3)
    norms = [BatchRenorm(5, 0.9, warmup_steps=0 if warm else 10), BatchRenorm(7, 0.99, warmup_steps=0 if warm else 10)]
    lin0, lin1 = nn.Linear(5, 7), nn.Linear(7, 3)
    with torch.no_grad():
        for n in norms:
            n.weight.copy_(1 + 0.5 * torch.randn(n.weight.shape, generator=g))
            n.bias.copy_(0.3 * torch.randn(n.bias.shape, generator=g))
            n.running_mean.copy_(2 * torch.randn(n.running_mean.shape, generator=g))
            n.running_var.copy_(0.05 + 3 * torch.rand(n.running_var.shape, generator=g))
    layers = [("n0", norms[0]), ("l0", lin0), ("act", nn.Tanh()), ("n1", norms[1]), ("l1", lin1)]
    holder = nn.ModuleList([m for _, m in layers])
    flat = flatten(holder)
    states = States()
    prog = compile_layers(layers, param_offsets(flat), "the critic", states.offset)
    assert list(prog.ops[:, 0]) == [BRN, 0, BRN, 0] and prog.count == flat.numel()
    state = states.array()
    states.load(state)
    x = torch.randn(9, 5, generator=g, requires_grad=True)
    h = lin0(norms[0](x, train))
    out = lin1(norms[1](torch.tanh(h), train))
    up = torch.randn(out.shape, generator=g)
    (out * up).sum().backward()
    want_grad = torch.cat([p.grad.reshape(-1) for p in holder.parameters()])
    grad = np.full(flat.numel(), np.nan, np.float32)
    ws = np.zeros(prog.floats(9) + 9 * prog.n_out, np.float32)
    got_out, got_in = np.empty((9, 3), np.float32), np.empty((9, 5), np.float32)
    value_and_grads(prog.ops, prog.fc, flat.detach().numpy(), grad, x.detach().numpy(), up.numpy(), ws, got_out,
                    got_in, state, train)
    torch.testing.assert_close(torch.from_numpy(got_out), out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(grad), want_grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(got_in), x.grad, rtol=1e-4, atol=1e-5)
    before = [(n.running_mean.clone(), int(n.steps)) for n in norms]
    states.store(state)   # the piece's statistics into the modules: torch's own pass moved them already
    for n, (mean, steps) in zip(norms, before):
        torch.testing.assert_close(n.running_mean, mean, rtol=1e-5, atol=1e-6)
        assert int(n.steps) == steps == (1 if train else 0)


def test_batch_renormalisation_needs_a_head_that_keeps_its_statistics():
    from hetrl.algos.crossq import BatchRenorm

    seq = nn.Sequential(nn.Linear(3, 4), BatchRenorm(4), nn.Linear(4, 1))
    with pytest.raises(Declined, match="the critic's layer 1 is a batch renormalisation, whose running statistics"):
        compile_program(seq, order_offsets(seq), "the critic")
