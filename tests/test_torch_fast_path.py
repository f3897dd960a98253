"""The identity form's eager fast path (an autograd.Function) against the definition it stands in for, the identity
of ordinary ops, bit for bit: over a grid of ±0, subnormal, huge, ±inf and NaN cotangents and tangents, in each
mode where the path is taken, and the routes where it is not."""

import math
import threading
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch_modes import bits  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.shared.layouts import Layout  # noqa: E402
from stopgrad_math.torch import identity  # noqa: E402

DTYPES = [torch.float16, torch.float32, torch.float64]
FAST = "_FiniteIdentityBackward"


def ordinary(fx, g, x):
    """The definition: the identity's ordinary ops, fx and g stopped, elementwise, every select kept (neither the
    fast path nor the eager shortcut that leaves a select out for finite values in between)."""
    fx, g = fx.detach(), g.detach()
    with mock.patch.object(identity, "_eagerly_finite", lambda t: False):
        return identity.attach(fx, [identity.zero_term(Layout.ELEMENTWISE, fx, x, g)])


def corners(dtype, finite):
    info = torch.finfo(dtype)
    values = [0.0, -0.0, info.tiny / 4, -info.tiny / 4, info.tiny, 1.0, -1.0, 2.5, -3.0, info.max / 2, info.max,
              -info.max]
    if not finite:
        values += [math.inf, -math.inf, math.nan, -math.nan]
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def grid(dtype):
    """(x, g, c) over every combination: x and g finite (where the path is taken), c anything."""
    x, g, c = torch.meshgrid(corners(dtype, True), corners(dtype, True), corners(dtype, False), indexing="ij")
    return x.reshape(-1).contiguous(), g.reshape(-1).contiguous(), c.reshape(-1).contiguous()


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reverse_mode_is_the_identitys_bit_for_bit_over_the_grid(dtype):
    x, g, c = grid(dtype)
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)
    fast_x, ordinary_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    fast = sgm.custom_gradient(fx, g, fast_x)
    assert type(fast.grad_fn).__name__ == FAST
    same_bits(fast, ordinary(fx, g, ordinary_x))
    (want,) = torch.autograd.grad(ordinary(fx, g, ordinary_x), ordinary_x, c)
    (got,) = torch.autograd.grad(fast, fast_x, c)
    same_bits(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_mode_is_the_identitys_bit_for_bit_over_the_grid(dtype):
    x, g, tangent = grid(dtype)
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)
    with forward_ad.dual_level():
        want = forward_ad.unpack_dual(ordinary(fx, g, forward_ad.make_dual(x, tangent)))
        got = forward_ad.unpack_dual(sgm.custom_gradient(fx, g, forward_ad.make_dual(x, tangent)))
    same_bits(got.primal, want.primal)
    same_bits(got.tangent, want.tangent)


def test_backward_accumulates_into_grad_as_the_identitys():
    x, g, c = grid(torch.float32)
    fx = torch.zeros_like(x)
    grads = []
    for embed in (sgm.custom_gradient, ordinary):
        leaf = x.clone().requires_grad_(True)
        (embed(fx, g, leaf) * 1.0).backward(c, retain_graph=True)
        (embed(fx, g, leaf) * 1.0).backward(c)
        grads.append(leaf.grad)
    same_bits(*grads)


def test_the_value_is_fx_minus_zero_as_the_identitys_last_op():
    """−0.0, subnormal, inf, NaN of both signs and a signalling NaN: the identity's f − (+0.0), whatever it makes
    of each, and a tensor of its own (writing into it leaves fx alone)."""
    quiet_and_signalling = torch.tensor([0x7FC00001, 0x7F800001, -0x00400001], dtype=torch.int32).view(torch.float32)
    fx = torch.cat([torch.tensor([-0.0, 1e-40, math.inf, -math.inf, math.nan, -3.0]), quiet_and_signalling])
    x = torch.ones_like(fx, requires_grad=True)
    got = sgm.custom_gradient(fx, torch.full_like(fx, 2.0), x)
    assert type(got.grad_fn).__name__ == FAST
    same_bits(got, ordinary(fx, torch.full_like(fx, 2.0), x))
    got.detach().add_(1.0)
    assert got.data_ptr() != fx.data_ptr() and float(fx[0]) == 0.0 and math.copysign(1, float(fx[0])) == -1


@pytest.mark.parametrize("wrt", ["x", "cotangent", "both"])
def test_create_graph_differentiates_the_identitys_ops(wrt):
    """A second derivative, w.r.t. x and w.r.t. a cotangent that has a derivative itself: the identity's own
    (the fast path recomputes its ops), and a live graph where the identity's is."""
    x0, g, c0 = grid(torch.float64)
    fx = torch.zeros_like(x0)
    results = []
    for embed in (sgm.custom_gradient, ordinary):
        x = x0.clone().requires_grad_(True)
        c = c0.clone().requires_grad_(wrt != "x")
        (first,) = torch.autograd.grad(embed(fx, g * x0.cos(), x), x, c, create_graph=True)
        inputs = {"x": [x], "cotangent": [c], "both": [x, c]}[wrt]
        results.append([first, *torch.autograd.grad(first.sum(), inputs, allow_unused=True, materialize_grads=True)])
    for got, want in zip(*results, strict=True):
        same_bits(got, want)


def test_the_path_is_taken_only_where_it_is_the_identitys():
    """Plain finite elementwise calls take it; everything else is the ordinary ops, its result the identity's."""
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    fx, g = torch.zeros(3), torch.tensor([1.0, 2.0, 3.0])

    def route(fn):
        out = fn()
        return "fast" if type(out.grad_fn).__name__ == FAST else "ordinary"

    assert route(lambda: sgm.custom_gradient(fx, g, x)) == "fast"
    assert route(lambda: sgm.custom_gradient(fx, g.clone().fill_(math.inf), x)) == "ordinary"
    assert route(lambda: sgm.custom_gradient(fx, g, torch.tensor([0.5, math.nan, 1.0], requires_grad=True))) \
        == "ordinary"
    assert route(lambda: sgm.custom_gradient(fx, torch.tensor(2.0), x)) == "ordinary"  # broadcast
    assert route(lambda: sgm.custom_gradient(fx, [g, g], [x, x.clone()])) == "ordinary"  # two leaves
    assert route(lambda: sgm.custom_gradient(fx.bfloat16(), g.bfloat16(), x.bfloat16())) == "ordinary"
    assert route(lambda: sgm.custom_gradient(fx, g, x, fx_gx_manually_stopped=True)) == "ordinary"
    with torch.device("cpu"):  # a torch function mode
        assert route(lambda: sgm.custom_gradient(fx, g, x)) == "ordinary"
    with forward_ad.dual_level():  # reverse and forward mode at once
        assert route(lambda: sgm.custom_gradient(fx, g, forward_ad.make_dual(x, torch.ones(3)))) == "ordinary"


def test_a_non_finite_element_takes_the_ordinary_ops_whose_derivative_it_keeps():
    """One inf or NaN in x or g: the whole call is the ordinary ops (the reduced formula would be wrong there: an
    inf g's derivative is inf, a non-finite x's is zero)."""
    x0 = torch.tensor([1.0, math.inf, 2.0, 3.0])
    g = torch.tensor([2.0, 5.0, math.inf, math.nan])
    fx = torch.zeros(4)
    x = x0.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(sgm.custom_gradient(fx, g, x), x, torch.ones(4))
    assert got.tolist()[:3] == [2.0, 0.0, math.inf] and math.isnan(got[3])


def test_mixed_modes_and_in_place_use_match_the_identity():
    """Reverse over forward mode (the ordinary ops), and the output changed in place before backward."""
    x0, g, c = grid(torch.float32)
    fx = torch.zeros_like(x0)
    results = []
    for embed in (sgm.custom_gradient, ordinary):
        x = x0.clone().requires_grad_(True)
        out = embed(fx, g, x)
        out.mul_(3.0)
        (in_place,) = torch.autograd.grad(out, x, c)
        tangent = torch.ones_like(x0, requires_grad=True)
        with forward_ad.dual_level():
            dual_out = embed(fx, g, forward_ad.make_dual(x, tangent))
            (over,) = torch.autograd.grad(forward_ad.unpack_dual(dual_out).tangent, tangent, c)
        results.append((in_place, over))
    for got, want in zip(*results, strict=True):
        same_bits(got, want)


def test_x_changed_in_place_after_the_call_behaves_as_with_the_identity():
    """The ordinary ops keep no reference to x that an in-place change invalidates; neither does the fast path."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    base = x * 1.0
    out = sgm.custom_gradient(torch.zeros(2), torch.tensor([3.0, 4.0]), base)
    base.add_(1.0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.tolist() == [3.0, 4.0]


def test_under_autocast_the_results_are_the_identitys():
    x0, g, c = grid(torch.float32)
    results = []
    for embed in (sgm.custom_gradient, ordinary):
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = embed(torch.zeros_like(x0), g, x)
        results.append(torch.autograd.grad(out, x, c)[0])
    same_bits(*results)


def test_threads_each_get_the_identitys_gradient():
    x0, g, c = grid(torch.float32)
    leaf = x0.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(ordinary(torch.zeros_like(x0), g, leaf), leaf, c)
    failures = []

    def work():
        for _ in range(20):
            x = x0.clone().requires_grad_(True)
            (got,) = torch.autograd.grad(sgm.custom_gradient(torch.zeros_like(x0), g, x), x, c)
            if not np.array_equal(bits(got), bits(want)):
                failures.append(got)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.mark.parametrize("mode", ["func.grad", "func.jvp", "compile"])
def test_transforms_and_compilation_run_the_ordinary_ops(mode, monkeypatch):
    """Inside torch.func and torch.compile the Function is never applied (its backward and jvp are ours only in
    plain eager calls)."""
    from stopgrad_math.torch import eager_fast_path

    def refuse(*args):
        raise AssertionError("the fast path ran")

    monkeypatch.setattr(eager_fast_path._FiniteIdentity, "apply", refuse)
    f = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa: E731
    x = torch.tensor([0.0, 100.0])
    if mode == "func.grad":
        got = torch.func.grad(lambda x: f(x).sum())(x)
    elif mode == "func.jvp":
        got = torch.func.jvp(f, (x,), (torch.ones(2),))[1]
    else:
        torch._dynamo.reset()
        leaf = x.clone().requires_grad_(True)
        torch.compile(f, fullgraph=True)(leaf).sum().backward()
        got = leaf.grad
    torch.testing.assert_close(got, torch.sigmoid(x))



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_compiled_the_identity_gives_the_eager_identitys_bits_over_the_grid(dtype):
    """Under torch.compile (Inductor's fused kernels, masks recomputed in the backward rather than kept), the
    value and the gradient are the eager ordinary ops' bits, non-finite x and g included."""
    every = corners(dtype, False)
    x, g, c = (t.reshape(-1).contiguous() for t in torch.meshgrid(every, every, every, indexing="ij"))
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)

    def value_and_grad(embed):
        leaf = x.clone().requires_grad_(True)
        out = embed(fx, g, leaf)
        return out.detach(), torch.autograd.grad(out, leaf, c)[0]

    torch._dynamo.reset()
    compiled = value_and_grad(torch.compile(sgm.custom_gradient, fullgraph=True))
    for got, want in zip(compiled, value_and_grad(ordinary), strict=True):
        same_bits(got, want)


@sgm.custom_gradient
def _scaled(x, w):
    return x * w, lambda ct: (ct * w, None)


@pytest.mark.parametrize("mode", ["backward", "forward_ad"])
def test_the_decorators_selects_left_out_for_finite_values_change_no_bit(mode, monkeypatch):
    """Eagerly, where x and J·v are finite, the selects that keep +0.0 at a non-finite element are left out (they
    would pass every value and derivative as they are): the same bits as with them, over the grid's weights and
    cotangents or tangents."""
    x0, w, c = grid(torch.float64)

    def run():
        if mode == "backward":
            x = x0.clone().requires_grad_(True)
            out = _scaled(x, w)
            return out.detach(), torch.autograd.grad(out, x, c)[0]
        with forward_ad.dual_level():
            return tuple(forward_ad.unpack_dual(_scaled(forward_ad.make_dual(x0, c), w)))

    shortened = run()
    monkeypatch.setattr(identity, "all_finite", lambda *tensors: False)
    for got, want in zip(shortened, run(), strict=True):
        same_bits(got, want)


def test_a_jit_trace_records_the_ordinary_ops_so_a_later_inf_keeps_its_meaning():
    """Under torch.jit.trace no branch on the elements is taken (it would be baked into the trace): a trace made
    on finite x gives an inf x of a later call no derivative, and an inf gx its infinite one."""
    g = torch.tensor([2.0, math.inf, 3.0])
    fn = lambda x, g: sgm.custom_gradient(torch.zeros(3), g, x)  # noqa: E731
    with torch.jit.optimized_execution(False):
        traced = torch.jit.trace(fn, (torch.ones(3, requires_grad=True), torch.ones(3)), check_trace=False)
        x = torch.tensor([1.0, 1.0, math.inf], requires_grad=True)
        traced(x, g).backward(torch.ones(3))
    assert x.grad.tolist() == [2.0, math.inf, 0.0]


@pytest.mark.parametrize("mode", ["backward", "forward_ad"])
def test_where_the_fast_path_is_not_taken_the_selects_left_out_change_no_bit(mode):
    """bfloat16 (no fast path) with finite x: the ordinary ops without the select that keeps +0.0 at a non-finite
    x, against them with it, over the grid."""
    x0, g, c = (t.to(torch.bfloat16) for t in grid(torch.float32))
    fx = torch.zeros_like(x0)

    def run(embed):
        if mode == "backward":
            x = x0.clone().requires_grad_(True)
            out = embed(fx, g, x)
            assert type(out.grad_fn).__name__ != FAST
            return out.detach(), torch.autograd.grad(out, x, c)[0]
        with forward_ad.dual_level():
            return tuple(forward_ad.unpack_dual(embed(fx, g, forward_ad.make_dual(x0, c))))

    for got, want in zip(run(sgm.custom_gradient), run(ordinary), strict=True):
        same_bits(got, want)
