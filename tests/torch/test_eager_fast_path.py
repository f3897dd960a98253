"""The fast paths against the definition they stand in for, the ordinary ops, bit for bit: over a grid of ±0,
subnormal, huge, ±inf and NaN cotangents and tangents, in each mode where a path is taken, and the routes where it
is not. The identity form's (an autograd.Function eagerly, and one under torch.compile); the decorator's in
forward mode alone (its J·v applied to the tangents, made dual), with the table of ops it rests on."""

import math
import threading
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch.utils._pytree import tree_leaves as pytree_leaves  # noqa: E402
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
    with mock.patch.object(identity, "eagerly_finite", lambda t: False):
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
    inf g's derivative is inf; a non-finite x's is g, through the carrier)."""
    x0 = torch.tensor([1.0, math.inf, 2.0, 3.0])
    g = torch.tensor([2.0, 5.0, math.inf, math.nan])
    fx = torch.zeros(4)
    x = x0.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(sgm.custom_gradient(fx, g, x), x, torch.ones(4))
    assert got.tolist()[:3] == [2.0, 5.0, math.inf] and math.isnan(got[3])


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


def test_compilation_runs_the_ordinary_ops_and_not_the_eager_function(monkeypatch):
    """Inside torch.compile the eager path's Function is never applied (the compiled path's Function serves,
    below)."""
    from stopgrad_math.torch import eager_fast_path

    def refuse(*args):
        raise AssertionError("the fast path ran")

    monkeypatch.setattr(eager_fast_path._FiniteIdentity, "apply", refuse)
    f = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa: E731
    x = torch.tensor([0.0, 100.0])
    torch._dynamo.reset()
    leaf = x.clone().requires_grad_(True)
    torch.compile(f, fullgraph=True)(leaf).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.sigmoid(x))


def _identity_spied(monkeypatch):
    """Records whether each call of the identity's fast path gave its result; every size takes it in reverse mode
    under a transform (where x of fewer than ``_REVERSE_TRANSFORM_SIZE`` elements takes the ordinary ops, the
    cheaper there)."""
    from stopgrad_math.torch import eager_fast_path

    monkeypatch.setattr(eager_fast_path, "_REVERSE_TRANSFORM_SIZE", 0)
    return _spied(monkeypatch, "finite_identity")


def _vjp_of(fn, x, c):
    out, pull = torch.func.vjp(fn, x)
    return out, pull(c)[0]


_IDENTITY_TRANSFORMS = {
    "func.vjp": _vjp_of,
    "func.jvp": lambda fn, x, t: torch.func.jvp(fn, (x,), (t,)),
    "jacrev": lambda fn, x, _: torch.func.jacrev(fn)(x[:64]),  # (its backward under vmap, g unbatched)
    "jacfwd": lambda fn, x, _: torch.func.jacfwd(fn)(x[:64]),
}


def _identity_under(transform, fx, g, x, c):
    """``transform`` of x ↦ custom_gradient(fx, g, x) at x, with the cotangent or tangent c; ``vmap(…)``: over rows
    of fx, g, x and c, each row's own."""
    inner = transform.removeprefix("vmap(").removesuffix(")")

    def one(fx, g, x, c):
        return _IDENTITY_TRANSFORMS[inner](lambda x: sgm.custom_gradient(fx[:x.numel()], g[:x.numel()], x), x, c)

    if transform.startswith("vmap"):
        return torch.func.vmap(one)(*(t.reshape(-1, 16) for t in (fx, g, x, c)))
    return one(fx, g, x, c)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transform", [*_IDENTITY_TRANSFORMS, "vmap(func.vjp)", "vmap(func.jvp)"])
def test_under_transforms_alone_the_identitys_function_is_its_ordinary_ops_bit_for_bit(transform, dtype,
                                                                                       monkeypatch):
    """Issue 56: under one grad, vjp or jvp transform (vmaps around or inside it) the identity takes its Function,
    whose backward or jvp is then the whole derivative: values and derivatives against the ordinary ops under
    the same transform (the path refused), bit for bit, x and g finite, cotangents and tangents anything."""
    x, g, c = grid(dtype)
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)
    taken = _identity_spied(monkeypatch)
    fast = _identity_under(transform, fx, g, x, c)
    assert taken and all(taken)
    _refused(monkeypatch, "finite_identity")
    monkeypatch.setattr(identity, "eagerly_finite", lambda t: False)  # every select of the definition kept
    for got, want in zip(pytree_leaves(fast), pytree_leaves(_identity_under(transform, fx, g, x, c)), strict=True):
        same_bits(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transform", ["func.vjp", "vmap(func.vjp)", "func.jvp", "vmap(func.jvp)"])
def test_a_cotangent_or_tangent_requiring_grad_is_differentiated_as_the_ordinary_ops(transform, dtype,
                                                                                     monkeypatch):
    """A cotangent given to func.vjp's pullback, or a tangent to func.jvp, that requires grad: the derivative is
    differentiated w.r.t. it, which the Function's formula would do in its own bits; so its backward runs the
    ordinary ops' pullback there, and forward mode takes the ordinary ops. The derivative w.r.t. it, bit for bit."""
    x, g, c0 = grid(dtype)
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)
    u = c0.flip(0).contiguous()
    results = []
    for refused in (False, True):
        _identity_spied(monkeypatch)
        if refused:
            _refused(monkeypatch, "finite_identity")
            monkeypatch.setattr(identity, "eagerly_finite", lambda t: False)
        c = c0.clone().requires_grad_(True)
        first = pytree_leaves(_identity_under(transform, fx, g, x, c))[-1].reshape(-1)
        results.append([first, *torch.autograd.grad(first, c, u)])
    for got, want in zip(*results, strict=True):
        same_bits(got, want)


def test_under_transforms_the_identitys_function_is_taken_only_where_one_derivative_is_taken_alone(monkeypatch):
    """Refused under two derivatives (grad of grad, forward over reverse, a leaf requiring grad under the
    wrappers), for an x without a tangent, a non-finite x, and in reverse mode for x under the size where the
    ordinary ops are the cheaper; each call gets the analytic derivative: σ(x), 0 for the second."""
    from stopgrad_math.torch import eager_fast_path

    taken = _spied(monkeypatch, "finite_identity")
    f = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa: E731
    total = lambda x: f(x).sum()  # noqa: E731
    large = torch.linspace(-30.0, 30.0, eager_fast_path._REVERSE_TRANSFORM_SIZE)
    small = large[::1024].contiguous()

    def route(derivative, want):
        taken.clear()
        torch.testing.assert_close(derivative(), want)
        return taken

    assert route(lambda: torch.func.grad(total)(large), torch.sigmoid(large)) == [True]
    assert route(lambda: torch.func.grad(total)(small), torch.sigmoid(small)) == [False]
    assert route(lambda: torch.func.jvp(f, (small,), (torch.ones_like(small),))[1], torch.sigmoid(small)) == [True]
    assert route(lambda: torch.func.jacfwd(f)(small[:8]), torch.diag(torch.sigmoid(small[:8]))) == [True]
    assert route(lambda: torch.func.grad(torch.func.grad(total))(torch.tensor(0.5)), torch.tensor(0.0)) == [False]
    assert route(lambda: torch.func.hessian(total)(small[:8]), torch.zeros(8, 8)) == [False]
    assert route(lambda: torch.func.jvp(torch.func.grad(total), (small,), (torch.ones_like(small),))[1],
                 torch.zeros_like(small)) == [False]
    leaf = large.clone().requires_grad_(True)
    assert route(lambda: torch.func.grad(total)(leaf).detach(), torch.sigmoid(large)) == [False]
    with_inf = large.clone()
    with_inf[3] = math.inf
    assert route(lambda: torch.func.grad(total)(with_inf), torch.sigmoid(with_inf)) == [False]
    other = lambda x, y: sgm.custom_gradient(x * 2.0, torch.sigmoid(y), y)  # noqa: E731  # (no tangent for y)
    assert route(lambda: torch.func.jacfwd(other, argnums=0)(small[:8], small[:8]), torch.zeros(8, 8)) == [False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_compiled_the_identity_gives_the_eager_identitys_bits_over_the_grid(dtype):
    """Under torch.compile (the compiled fast path's Function, below), the value and the gradient are the eager
    ordinary ops' bits, non-finite x and g included."""
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


def _compiled_keeping_graphs(fn, **options):
    """fn under torch.compile(fullgraph=True, **options) with Inductor, and the set of op targets of each graph
    Dynamo traced (an autograd.Function applied is the ``autograd_function_apply`` higher-order op)."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def backend(gm, inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes})
        return compile_fx(gm, inputs)

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend, **options), graphs


def _fast(graph):
    """Whether a graph's op targets are the fast path's: its Function applied (``autograd_function_apply``, the
    higher-order op), and not the ordinary ops, whose product is an addcmul (they apply a Function too, the
    carrier of a non-finite x)."""
    return "autograd_function_apply" in graph and not any("addcmul" in target for target in graph)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_the_function_gives_the_compiled_ordinary_ops_bits_over_the_grid(dtype, monkeypatch):
    """The compiled fast path (an autograd.Function whose backward is the identity's derivative for every value)
    against the ordinary ops compiled, x, g and the cotangent each over every corner, inf and NaN included. (On
    float16 both differ from the eager ops in the sign of some zero gradients: Inductor computes float16 in
    float32.)"""
    from stopgrad_math.torch import compiled_fast_path

    every = corners(dtype, False)
    x, g, c = (t.reshape(-1).contiguous() for t in torch.meshgrid(every, every, every, indexing="ij"))
    fx = torch.linspace(-3, 3, x.numel(), dtype=dtype)

    def value_and_grad():
        embed, graphs = _compiled_keeping_graphs(sgm.custom_gradient)
        leaf = x.clone().requires_grad_(True)
        out = embed(fx, g, leaf)
        return (out.detach(), torch.autograd.grad(out, leaf, c)[0]), graphs

    fast, graphs = value_and_grad()
    assert _fast(graphs[0])
    monkeypatch.setattr(compiled_fast_path, "identity", lambda fx, planned: None)
    want, graphs = value_and_grad()
    assert not _fast(graphs[0])
    for got, expected in zip(fast, want, strict=True):
        same_bits(got, expected)


_LOG1PEXP = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa: E731
_COMPILED_ROUTES = {
    "func.grad": torch.func.grad(lambda x: _LOG1PEXP(x).sum()),
    "func.vjp": lambda x: torch.func.vjp(_LOG1PEXP, x)[1](torch.ones_like(x))[0],
    "func.jvp": lambda x: torch.func.jvp(_LOG1PEXP, (x,), (torch.ones_like(x),))[1],
    "jacrev": lambda x: torch.func.jacrev(_LOG1PEXP)(x).diagonal(),
    "vmap of grad": lambda x: torch.func.vmap(torch.func.grad(lambda x: _LOG1PEXP(x).sum()))(x[None])[0],
    "no_grad (the value)": torch.no_grad()(_LOG1PEXP),
}


@pytest.mark.parametrize("mode", ["backward", *_COMPILED_ROUTES])
def test_compiled_the_function_serves_reverse_mode_alone_and_each_transform_gets_the_ordinary_ops(mode):
    """Compiled, the Function stands in where Dynamo traces a backward of plain tensors, and nowhere else: inside
    torch.func transforms (where the Function, without functorch rules, read zeros for func.grad) and without grad
    the ordinary ops run. Each against the analytic derivative σ(x) (the value log(1 + eˣ) without grad)."""
    x = torch.tensor([0.0, 100.0, -3.0, 1e-3])
    if mode == "backward":
        compiled, graphs = _compiled_keeping_graphs(_LOG1PEXP)
        leaf = x.clone().requires_grad_(True)
        got = torch.autograd.grad(compiled(leaf).sum(), leaf)[0]
    else:
        compiled, graphs = _compiled_keeping_graphs(_COMPILED_ROUTES[mode])
        got = compiled(x.clone())
    truth = torch.logaddexp(x, torch.zeros(())) if mode.startswith("no_grad") else torch.sigmoid(x)
    torch.testing.assert_close(got, truth)
    assert any(_fast(graph) for graph in graphs) == (mode == "backward")


@pytest.mark.parametrize("setting", ["dynamic shapes", "autocast to bfloat16"])
def test_compiled_the_function_serves_dynamic_shapes_and_autocast(setting):
    """With symbolic sizes (three sizes, one graph for all) and under CPU autocast (where logaddexp and sigmoid
    stay float32), the Function stands in, in every graph Dynamo makes, and the gradient is σ(x), the analytic
    derivative."""
    compiled, graphs = _compiled_keeping_graphs(_LOG1PEXP, dynamic=setting == "dynamic shapes")
    for n in (3, 5, 7):
        leaf = torch.linspace(-4.0, 4.0, n).requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting == "autocast to bfloat16"):
            out = compiled(leaf)
        (got,) = torch.autograd.grad(out.sum(), leaf)
        torch.testing.assert_close(got, torch.sigmoid(leaf.detach()))
    assert all(_fast(graph) for graph in graphs)
    if setting == "dynamic shapes":
        assert len(graphs) == 1


@pytest.mark.parametrize("use", ["the output changed in place", "x changed in place before backward"])
def test_compiled_in_place_use_meets_what_the_compiled_ordinary_ops_meet(use, monkeypatch):
    """In place after the call: the output scaled (its gradient scaled), or x changed before the backward (both
    refuse it: AOTAutograd saves x, as the Function does)."""
    from stopgrad_math.torch import compiled_fast_path

    def run():
        compiled, _ = _compiled_keeping_graphs(_LOG1PEXP)
        x = torch.tensor([0.0, 100.0, -3.0], requires_grad=True)
        inner = x * 1.0
        out = compiled(inner)
        if use == "the output changed in place":
            out.mul_(3.0)  # recorded: the gradient is scaled
        else:
            with torch.no_grad():
                inner.mul_(3.0)
        try:
            return torch.autograd.grad(out.sum(), x)[0]
        except RuntimeError as error:
            return "modified by an inplace operation" in str(error)

    fast = run()
    monkeypatch.setattr(compiled_fast_path, "identity", lambda fx, planned: None)
    want = run()
    if use == "the output changed in place":
        torch.testing.assert_close(fast, 3.0 * torch.sigmoid(torch.tensor([0.0, 100.0, -3.0])))
        same_bits(fast, want)
    else:
        assert fast is True and want is True


@sgm.custom_gradient
def _scaled(x, w):
    return x * w, lambda ct: (ct * w, None)


SELECTS_LEFT_OUT_MODES = ["backward", "forward_ad", "func.vjp", "func.jvp", "func.vmap(func.vjp)"]
"""Where the selects are left out for finite values: eagerly, and under torch.func (issue 56), whose transforms run
each op as it comes, so the elements the wrappers hold are asked."""


def _value_and_derivative(mode, fn, x0, w, c):
    """fn(x, w)'s value at x0 and its derivative w.r.t. x applied to c (a cotangent, or a tangent), in ``mode``;
    under vmap, four samples of a quarter of the grid each."""
    if mode == "backward":
        x = x0.clone().requires_grad_(True)
        out = fn(x, w)
        return out.detach(), torch.autograd.grad(out, x, c)[0]
    if mode == "forward_ad":
        with forward_ad.dual_level():
            return tuple(forward_ad.unpack_dual(fn(forward_ad.make_dual(x0, c), w)))
    if mode == "func.vjp":
        out, pullback = torch.func.vjp(lambda x: fn(x, w), x0)
        return out, pullback(c)[0]
    if mode == "func.jvp":
        return torch.func.jvp(lambda x: fn(x, w), (x0,), (c,))
    x0, w, c = (t.reshape(4, -1) for t in (x0, w, c))
    out, derivative = torch.func.vmap(lambda x, w, c: (lambda o, p: (o, p(c)[0]))(
        *torch.func.vjp(lambda v: fn(v, w), x)))(x0, w, c)
    return out.reshape(-1), derivative.reshape(-1)


@pytest.mark.parametrize("mode", SELECTS_LEFT_OUT_MODES)
def test_the_decorators_selects_left_out_for_finite_values_change_no_bit(mode, monkeypatch):
    """Where x and J·v are finite, the selects that keep +0.0 at a non-finite element are left out (they would
    pass every value and derivative as they are): the same bits as with them, over the grid's weights and
    cotangents or tangents."""
    x0, w, c = grid(torch.float64)

    def run():
        return _value_and_derivative(mode, _scaled, x0, w, c)

    carried = []
    original = identity.carried_zero
    monkeypatch.setattr(identity, "carried_zero", lambda a: carried.append(a) or original(a))
    shortened = run()
    assert carried == []  # (left out, in every mode here)
    monkeypatch.setattr(identity, "all_finite", lambda *tensors: False)
    for got, want in zip(shortened, run(), strict=True):
        same_bits(got, want)


def test_a_jit_trace_records_the_ordinary_ops_so_a_later_inf_keeps_its_meaning():
    """Under torch.jit.trace no branch on the elements is taken (it would be baked into the trace): a trace made
    on finite x gives an inf x of a later call its gx through the carrier, and an inf gx its infinite one."""
    g = torch.tensor([2.0, math.inf, 3.0])
    fn = lambda x, g: sgm.custom_gradient(torch.zeros(3), g, x)  # noqa: E731
    with torch.jit.optimized_execution(False):
        traced = torch.jit.trace(fn, (torch.ones(3, requires_grad=True), torch.ones(3)), check_trace=False)
        x = torch.tensor([1.0, 1.0, math.inf], requires_grad=True)
        traced(x, g).backward(torch.ones(3))
    assert x.grad.tolist() == [2.0, math.inf, 3.0]


@pytest.mark.parametrize("mode", SELECTS_LEFT_OUT_MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_where_the_fast_path_is_not_taken_the_selects_left_out_change_no_bit(mode, dtype):
    """The identity form with finite x where its fast path is not taken (bfloat16; any dtype under torch.func):
    the ordinary ops without the select that keeps +0.0 at a non-finite x, against them with it, over the
    grid."""
    x0, g, c = (t.to(dtype) for t in grid(torch.float32))

    def run(embed):
        if mode == "backward":
            x = x0.clone().requires_grad_(True)
            assert type(embed(torch.zeros_like(x), g, x).grad_fn).__name__ != FAST or dtype != torch.bfloat16
        return _value_and_derivative(mode, lambda x, g: embed(torch.zeros_like(x), g, x), x0, g, c)

    for got, want in zip(run(sgm.custom_gradient), run(ordinary), strict=True):
        same_bits(got, want)


# ---------------------------------------------------------------- the decorator's J·v in forward mode alone

aten = torch.ops.aten


def _pairs(dtype):
    """(a, b): every pair of the grid's values, a anything (a tangent), b anything (a constant)."""
    every = corners(dtype, False)
    a, b = torch.meshgrid(every, every, indexing="ij")
    return a.reshape(-1).contiguous(), b.reshape(-1).contiguous()


def _row_calls(dtype):
    """One call of each row of ``_OPS_OF_TANGENTS``: (op, the op on (live operands, constants), live shapes)."""
    a, b = _pairs(dtype)
    n = a.numel()
    finite = torch.where(b.isfinite(), b, 3.0)  # where J·v is finite, so is each constant v meets (below)
    square = finite[:16 * 8].reshape(16, 8)
    return {
        aten.neg.default: (lambda v: aten.neg.default(v), [a]),
        aten.clone.default: (lambda v: aten.clone.default(v), [a]),
        aten.alias.default: (lambda v: aten.alias.default(v), [a]),
        aten.view.default: (lambda v: aten.view.default(v, [16, -1]), [a]),
        aten._unsafe_view.default: (lambda v: aten._unsafe_view.default(v, [-1, 16]), [a]),
        aten.expand.default: (lambda v: aten.expand.default(v, [3, n]), [a.reshape(1, n)]),
        aten.permute.default: (lambda v: aten.permute.default(v, [1, 0]), [a.reshape(16, -1)]),
        aten.t.default: (lambda v: aten.t.default(v), [a.reshape(16, -1)]),
        aten.transpose.int: (lambda v: aten.transpose.int(v, 0, 1), [a.reshape(16, -1)]),
        aten.squeeze.dim: (lambda v: aten.squeeze.dim(v, 0), [a.reshape(1, n)]),
        aten.squeeze.dims: (lambda v: aten.squeeze.dims(v, [0]), [a.reshape(1, n)]),
        aten.unsqueeze.default: (lambda v: aten.unsqueeze.default(v, 1), [a]),
        aten.sum.dim_IntList: (lambda v: aten.sum.dim_IntList(v, [0], True), [a.reshape(16, -1)]),
        aten.sum.default: (lambda v: aten.sum.default(v), [a[:16]]),
        aten.add.Tensor: (lambda v, w: aten.add.Tensor(v, w), [a, b]),
        aten.sub.Tensor: (lambda v, w: aten.sub.Tensor(v, w), [a, b]),
        aten.mul.Tensor: (lambda v: (aten.mul.Tensor(v, finite), aten.mul.Tensor(finite, v), aten.mul.Tensor(v, 2.5)),
                           [a]),
        aten.mm.default: (lambda v: (aten.mm.default(v, square.T), aten.mm.default(square.T, v)),
                          [a[:16 * 8].reshape(16, 8)]),
        aten.div.Tensor: (lambda v: aten.div.Tensor(v, b), [a]),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_op_of_tangents_is_its_own_forward_derivative_bit_for_bit_over_the_grid(dtype):
    """The table the decorator's forward fast path rests on: forward mode's tangent of each op, its live operands
    ±0.0 in value (v = stop(x) − x) with any tangent, is the op applied to those tangents, constants as they are."""
    from stopgrad_math.torch.eager_fast_path import _OPS_OF_TANGENTS

    calls = _row_calls(dtype)
    assert set(calls) == set(_OPS_OF_TANGENTS)
    for op, (call, tangents) in calls.items():
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(torch.zeros_like(t) * torch.sign(t).nan_to_num(), t) for t in tangents]
            outs = call(*duals)
            got = [forward_ad.unpack_dual(o).tangent for o in (outs if isinstance(outs, tuple) else (outs,))]
        want = call(*tangents)
        for g, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
            assert g is not None, op
            assert np.array_equal(bits(g.contiguous()), bits(w.contiguous())), op


def test_an_add_with_a_constant_is_not_its_own_forward_derivative_so_its_row_asks_for_both_operands_live():
    """Why add and sub need both operands live: with a constant zero, forward mode passes a −0.0 tangent as it is,
    where the op would add +0.0 and make it +0.0."""
    tangent = torch.tensor([-0.0, 1.0])
    with forward_ad.dual_level():
        got = forward_ad.unpack_dual(forward_ad.make_dual(torch.zeros(2), tangent) + torch.zeros(2)).tangent
    assert math.copysign(1, float(got[0])) == -1
    assert math.copysign(1, float(tangent[0] + torch.zeros(1)[0])) == 1


def _graph(fn, *examples):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn)(*examples)


def test_maps_tangents_reads_each_ops_row_and_where_it_is_live():
    from stopgrad_math.torch.eager_fast_path import maps_tangents

    v, c = torch.ones(3), torch.ones(3)
    assert maps_tangents(_graph(lambda v, c: (v * torch.sigmoid(c) / c).sum(0), v, c), 1)
    assert maps_tangents(_graph(lambda v, c: v.neg() + v * 2.0, v, c), 1)
    assert not maps_tangents(_graph(lambda v, c: v + c, v, c), 1)  # a constant added
    assert not maps_tangents(_graph(lambda v, c: v + 0.0, v, c), 1)
    assert not maps_tangents(_graph(lambda v, c: c / v, v, c), 1)  # the live operand second
    assert not maps_tangents(_graph(lambda v, c: torch.cumsum(v, 0), v, c), 1)  # not in the table
    assert not maps_tangents(_graph(lambda v, c: torch.where(c > 0, v, 0.0), v, c), 1)
    assert not maps_tangents(_graph(lambda v, c: torch.add(v, v, alpha=2.0), v, c), 1)  # an alpha
    assert not maps_tangents(_graph(lambda v, c: (v * 2.0, c * 2.0), v, c), 1)  # an output reads no v
    assert not maps_tangents(_graph(lambda v, c: v * c, v, c), 2)  # both live: quadratic


def _decorated_cases(dtype):
    """Decorated functions whose proven J·v is in the table: an activation, a mix of its ops, a reduction, a
    matrix closed over, two arguments and two outputs."""
    w = torch.tensor([[0.5, -2.0, 0.0], [-0.0, 3e4, 1e-3], [-7.0, 1.0, 2.0]], dtype=dtype)

    @sgm.custom_gradient
    def activation(x):
        return torch.logaddexp(x, torch.zeros((), dtype=dtype)), lambda ct: ct * torch.sigmoid(x)

    @sgm.custom_gradient
    def mixed(x):
        return x / 3, lambda ct: ct / 3.0 - ct * 0.5

    @sgm.custom_gradient
    def rows(x):
        return x.sum(0), lambda ct: ct.expand(x.shape) * 2.0

    @sgm.custom_gradient
    def matrix(x):
        return x @ w, lambda ct: ct @ w.T

    @sgm.custom_gradient
    def two(x, u):
        return (x * u, x - u), lambda cts: (cts[0] * u + cts[1], cts[0] * x - cts[1])

    @sgm.custom_gradient
    def scaled(x):
        return x * 2.5, lambda ct: ct * 2.5

    return {"activation": (activation, 1), "mixed": (mixed, 1), "rows": (rows, 1), "matrix": (matrix, 1),
            "two": (two, 2), "scaled": (scaled, 1)}


def _spied(monkeypatch, path="dual_of_map"):
    """Records whether each call of the decorator's fast path ``path`` (``dual_of_map``, ``product_of_map``) gave
    its result."""
    from stopgrad_math.torch import eager_fast_path

    taken, real = [], getattr(eager_fast_path, path)

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(eager_fast_path, path, spy)
    return taken


def _refused(monkeypatch, path="dual_of_map"):
    """The decorator's fast path ``path`` never taken: the ordinary ops run."""
    from stopgrad_math.torch import eager_fast_path

    monkeypatch.setattr(eager_fast_path, path, lambda *args, **kwargs: None)


def _primals_and_tangents(fn, xs, tangents):
    with forward_ad.dual_level():
        out = fn(*[forward_ad.make_dual(x, t) for x, t in zip(xs, tangents, strict=True)])
        return [tuple(forward_ad.unpack_dual(o)) for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["activation", "mixed", "rows", "matrix", "two"])
def test_the_decorators_forward_mode_is_its_ordinary_ops_bit_for_bit_over_the_grid(case, dtype, monkeypatch):
    """x finite, tangents anything: the fast path (taken) against the ordinary ops (the path refused), value and
    tangent, and the analytic derivative where the tangent is finite."""

    fn, count = _decorated_cases(dtype)[case]
    x, tangent = (t.reshape(-1, 3).contiguous()
                  for t in torch.meshgrid(corners(dtype, True), corners(dtype, False), indexing="ij"))
    xs = [x, x.flip(0).contiguous()][:count]
    tangents = [tangent, tangent.flip(1).contiguous()][:count]
    taken = _spied(monkeypatch)
    fast = _primals_and_tangents(fn, xs, tangents)
    assert taken and all(taken)
    _refused(monkeypatch)
    for (got_value, got_tangent), (want_value, want_tangent) in zip(
            fast, _primals_and_tangents(fn, xs, tangents), strict=True):
        same_bits(got_value, want_value)
        same_bits(got_tangent, want_tangent)
    if case == "activation":
        finite = tangent.isfinite()
        torch.testing.assert_close(fast[0][1][finite], (torch.sigmoid(x) * tangent)[finite])


_FORWARD_TRANSFORMS = {
    "func.jvp": lambda fn, xs, tangents: [torch.func.jvp(fn, tuple(xs), tuple(tangents))],
    "vmap(func.jvp)": lambda fn, xs, tangents: [torch.func.vmap(  # (rows of the grid as the batch)
        lambda *a: torch.func.jvp(fn, a[:len(xs)], a[len(xs):]), in_dims=0)(*xs, *tangents)],
}


_X_GRIDS = [(kind, dtype) for kind in ("finite", "±inf", "±inf and NaN") for dtype in DTYPES
            if kind == "finite" or dtype == torch.float32]


@pytest.mark.parametrize("x_grid, dtype", _X_GRIDS, ids=str)
@pytest.mark.parametrize("case", ["activation", "mixed", "rows", "matrix", "two", "scaled"])
@pytest.mark.parametrize("transform", list(_FORWARD_TRANSFORMS))
@pytest.mark.parametrize("order", [1, 2])
def test_under_forward_transforms_the_decorators_fast_path_is_its_ordinary_ops_bit_for_bit(order, transform, case,
                                                                                          x_grid, dtype,
                                                                                          monkeypatch):
    """Issue 56: under torch.func.jvp (and vmap of it, as jacfwd runs it) the fast path is a Function whose jvp
    gives the ordinary ops' tangent: its values and tangents against the ordinary ops' (the path refused), bit for
    bit, x finite and tangents anything, or x with ±inf (and NaN) and finite tangents. At order 1 it is taken
    wherever J·v at +0.0 is finite, whatever x is: the ordinary ops' carrier at a non-finite x passes the tangent
    as the plain ops do (two's J reads x, infinite at an inf); at order 2 everywhere, as mapped_zero's jvp applies
    J·v's graph itself to the tangents. (activation and scaled: J·v is v times a tensor or a number.)"""
    fn, count = _decorated_cases(dtype)[case]
    fn = fn if order == 1 else sgm.custom_gradient(order=2)(fn.undecorated)
    values = corners(dtype, x_grid == "finite")
    values = values[~values.isnan()] if x_grid == "±inf" else values
    x, tangent = (t.reshape(-1, 3).contiguous()
                  for t in torch.meshgrid(values, corners(dtype, x_grid != "finite"), indexing="ij"))
    xs = [x, x.flip(0).contiguous()][:count]
    tangents = [tangent, tangent.flip(1).contiguous()][:count]
    if transform.startswith("vmap") and case == "rows":  # (one row: its sum over rows is of one element)
        xs, tangents = [x.reshape(-1, 2, 3) for x in xs[:1]], [t.reshape(-1, 2, 3) for t in tangents[:1]]
    taken = _spied(monkeypatch)
    run = _FORWARD_TRANSFORMS[transform]
    fast = run(fn, xs, tangents)
    if order == 2 or x_grid == "finite" or (x_grid == "±inf" and case != "two"):
        assert taken and all(taken)
    _refused(monkeypatch)
    for got, want in zip(pytree_leaves(fast), pytree_leaves(run(fn, xs, tangents)), strict=True):
        same_bits(got, want)


def test_under_forward_transforms_the_fast_path_is_taken_only_in_forward_mode_alone(monkeypatch):
    """Refused where a tensor requiring grad could differentiate it in reverse mode, and where J·v at +0.0 is not
    finite (taken at an inf x where it is); each call gets the analytic derivative. (A grad transform with a jvp,
    at order 1, meets the second-derivative guard first; PyTorch refuses a jvp transform inside an eager dual
    level.)"""
    taken = _spied(monkeypatch)
    scaled, by_w, _ = _route_cases()
    x, ones = torch.tensor([1.0, 2.0, 3.0]), torch.ones(3)

    def jvp(fn, x=x):
        return torch.func.jvp(fn, (x,), (ones,))[1]

    assert jvp(scaled).tolist() == [2.0, 2.0, 2.0] and taken == [True]
    taken.clear()
    assert jvp(scaled, torch.tensor([1.0, math.inf, 3.0])).tolist() == [2.0, 2.0, 2.0] and taken == [True]
    taken.clear()
    assert jvp(by_w).tolist() == [1.0, math.inf, 2.0] and taken == [False]
    taken.clear()
    leaf = x.clone().requires_grad_(True)
    tangent = torch.func.jvp(scaled, (leaf,), (ones,))[1]
    assert tangent.tolist() == [2.0, 2.0, 2.0] and taken == [False]
    taken.clear()
    moving = ones.clone().requires_grad_(True)  # a tangent a derivative is taken w.r.t.: the ordinary ops
    tangent = torch.func.jvp(scaled, (x,), (moving,))[1]
    assert tangent.tolist() == [2.0, 2.0, 2.0] and taken == [False]
    assert torch.autograd.grad(tangent.sum(), moving)[0].tolist() == [2.0, 2.0, 2.0]


def _route_cases():
    """The decorated functions both fast paths' route tests call: x·2 (plus a shift passed by keyword), x·w with
    an inf in w (J infinite there), and x·2 at order 2."""
    w = torch.tensor([1.0, math.inf, 2.0])

    @sgm.custom_gradient
    def scaled(x, *, shift=None):
        return x * 2.0 + (0.0 if shift is None else shift), lambda ct: ct * 2.0

    @sgm.custom_gradient
    def by_w(x):
        return x * w, lambda ct: ct * w

    return scaled, by_w, sgm.custom_gradient(lambda x: (x * 2.0, lambda ct: ct * 2.0), order=2)


def test_the_decorators_forward_fast_path_is_taken_only_where_it_is_the_ordinary_ops(monkeypatch):
    """Refused (and the ordinary ops' derivative given): a non-finite x, an infinite J (J·v NaN, its derivative
    inf), y moving through a keyword argument, reverse and forward mode at once, an op outside the table, order 2,
    bfloat16."""
    taken = _spied(monkeypatch)
    scaled, by_w, scaled_2 = _route_cases()

    @sgm.custom_gradient
    def running(x):
        return torch.cumsum(x, 0), lambda ct: ct.flip(0).cumsum(0).flip(0)

    x, ones = torch.tensor([1.0, 2.0, 3.0]), torch.ones(3)

    def tangent_of(fn, x=x, **kwargs):
        taken.clear()
        with forward_ad.dual_level():
            out = fn(forward_ad.make_dual(x, ones), **kwargs)
            return forward_ad.unpack_dual(out).tangent, taken[-1] if taken else None

    got, fast = tangent_of(scaled)
    assert fast and got.tolist() == [2.0, 2.0, 2.0]
    got, fast = tangent_of(scaled, x=torch.tensor([1.0, math.inf, 3.0]))
    assert not fast and got.tolist() == [2.0, 2.0, 2.0]  # an inf x: the rule's derivative, through the carrier
    got, fast = tangent_of(by_w)
    assert not fast and got.tolist() == [1.0, math.inf, 2.0]  # J infinite: inf, as autodiff of x·w gives
    with forward_ad.dual_level():
        shift = forward_ad.make_dual(torch.zeros(3), torch.full((3,), 5.0))
        taken.clear()
        out = scaled(forward_ad.make_dual(x, ones), shift=shift)
        assert taken == [False] and forward_ad.unpack_dual(out).tangent.tolist() == [7.0, 7.0, 7.0]
    with forward_ad.dual_level():
        leaf = x.clone().requires_grad_(True)
        taken.clear()
        scaled(forward_ad.make_dual(leaf, ones))
        assert taken == [False]
    got, fast = tangent_of(running)
    assert fast is None and got.tolist() == [1.0, 2.0, 3.0]
    got, fast = tangent_of(scaled_2)
    assert not fast and got.tolist() == [2.0, 2.0, 2.0]  # (order 2 eagerly: its ordinary ops)
    taken.clear()
    assert torch.func.jvp(scaled, (x,), (ones,))[1].tolist() == [2.0, 2.0, 2.0] and taken == [True]  # (its
    # Function under the transform: ``test_under_forward_transforms_...``)
    got, fast = tangent_of(scaled, x=x.bfloat16())
    assert not fast and got.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("case", ["activation", "matrix"])
def test_the_decorators_forward_mode_under_autocast_is_its_ordinary_ops(case, monkeypatch):
    """Under autocast the path gives the ordinary ops' bits: taken for the activation (float32 throughout), not for
    the matrix product, whose J·v autocast traces with casts (not in the table)."""

    fn, _ = _decorated_cases(torch.float32)[case]
    x, tangent = (t.reshape(-1, 3).contiguous()
                  for t in torch.meshgrid(corners(torch.float32, True), corners(torch.float32, False), indexing="ij"))
    taken = _spied(monkeypatch)
    results = []
    for path in ("fast", "ordinary"):
        if path == "ordinary":
            _refused(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_primals_and_tangents(fn, [x], [tangent]))
    assert any(taken) == (case == "activation")
    for (got_value, got_tangent), (want_value, want_tangent) in zip(*results, strict=True):
        same_bits(got_value, want_value)
        same_bits(got_tangent, want_tangent)


# ---------------------------------------------------------------- the decorator's reverse mode


def _product_cases(dtype, w):
    """Decorated functions whose proven J·v is v times a tensor of the constants (an activation, a weight closed
    over, on either side of the product) or a number (one a float16 cannot hold), and one whose is not (a
    difference of two products)."""
    @sgm.custom_gradient
    def activation(x):
        return torch.logaddexp(x, torch.zeros((), dtype=dtype)), lambda ct: ct * torch.sigmoid(x)

    @sgm.custom_gradient
    def weighted(x):
        return x * w, lambda ct: ct * w

    @sgm.custom_gradient
    def weighted_first(x):
        return w * x, lambda ct: w * ct

    @sgm.custom_gradient
    def tenth(x):
        return x * 0.1, lambda ct: ct * 0.1

    @sgm.custom_gradient
    def mixed(x):
        return x / 3, lambda ct: ct / 3.0 - ct * 0.5

    return {"activation": activation, "weighted": weighted, "weighted_first": weighted_first, "tenth": tenth,
            "mixed": mixed}


def _value_and_gradient(fn, x, cotangent, **kwargs):
    x = x.clone().requires_grad_(True)
    y = fn(x, **kwargs)
    (gradient,) = torch.autograd.grad(y, x, cotangent)
    return y.detach(), gradient


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["activation", "weighted", "weighted_first", "tenth", "mixed"])
def test_the_decorators_reverse_mode_is_its_ordinary_ops_bit_for_bit_over_the_grid(case, dtype, monkeypatch):
    """x and the weight finite, cotangents anything: the fast path (taken where J·v is a product) against the
    ordinary ops (the path refused), value and gradient, and the analytic gradient where the cotangent is
    finite."""
    x, w, cotangent = (t.reshape(-1).contiguous() for t in torch.meshgrid(
        corners(dtype, True), corners(dtype, True), corners(dtype, False), indexing="ij"))
    fn = _product_cases(dtype, w)[case]
    taken = _spied(monkeypatch, "product_of_map")
    fast = _value_and_gradient(fn, x, cotangent)
    assert taken == ([] if case == "mixed" else [True])
    _refused(monkeypatch, "product_of_map")
    ordinary = _value_and_gradient(fn, x, cotangent)
    same_bits(fast[0], ordinary[0])
    same_bits(fast[1], ordinary[1])
    finite = cotangent.isfinite()
    want = {"activation": cotangent * torch.sigmoid(x), "tenth": cotangent * 0.1,
            "mixed": cotangent / 3.0 - cotangent * 0.5}.get(case, cotangent * w)
    torch.testing.assert_close(fast[1][finite], want[finite])


def test_the_decorators_reverse_fast_path_is_taken_only_where_it_is_the_ordinary_ops(monkeypatch):
    """Refused (and the ordinary ops' gradient given): a non-finite x, an infinite J, a forward-mode level, order 2,
    torch.func, a one-element y (the identity form's), a strided x, bfloat16, autocast. Taken where y also moves
    through a keyword argument, whose cotangent passes as it is."""
    taken = _spied(monkeypatch, "product_of_map")
    scaled, by_w, scaled_2 = _route_cases()
    x = torch.tensor([1.0, 2.0, 3.0])

    def gradient_of(fn, x=x, **kwargs):
        taken.clear()
        gradient = _value_and_gradient(fn, x, torch.ones_like(x), **kwargs)[1]
        return gradient.tolist(), taken[-1] if taken else None

    assert gradient_of(scaled) == ([2.0, 2.0, 2.0], True)
    assert gradient_of(scaled, x=torch.tensor([1.0, math.inf, 3.0])) == ([2.0, 2.0, 2.0], False)  # inf x: the rule
    got, fast = gradient_of(by_w)
    assert not fast and got == [1.0, math.inf, 2.0]  # J infinite: inf, as autodiff of x·w gives
    with forward_ad.dual_level():
        assert gradient_of(scaled) == ([2.0, 2.0, 2.0], False)
    assert gradient_of(scaled_2) == ([2.0, 2.0, 2.0], None)
    taken.clear()
    assert torch.func.grad(lambda x: scaled(x).sum())(x).tolist() == [2.0, 2.0, 2.0] and not any(taken)
    assert gradient_of(scaled, x=torch.tensor([4.0])) == ([2.0], None)
    strided = torch.arange(6.0).reshape(2, 3).t()
    assert gradient_of(scaled, x=strided)[1] is False
    assert gradient_of(scaled, x=x.bfloat16()) == ([2.0, 2.0, 2.0], False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gradient_of(scaled) == ([2.0, 2.0, 2.0], False)
    shift = torch.zeros(3, requires_grad=True)
    taken.clear()
    y = scaled(x.clone().requires_grad_(True), shift=shift)
    cotangent = torch.tensor([-0.0, math.nan, 5.0])
    (shift_gradient,) = torch.autograd.grad(y, shift, cotangent)
    assert taken == [True]
    np.testing.assert_array_equal(bits(shift_gradient), bits(cotangent))


def test_the_decorators_reverse_fast_path_guards_second_derivatives_as_the_ordinary_ops(monkeypatch):
    """create_graph: a second derivative through the cotangent (a weight after f) is the ordinary ops' bit for bit
    and the closed form's; one that reaches x raises naming order 2; a dual cotangent (forward mode over the
    backward pass) raises."""
    x, _, _ = grid(torch.float64)
    a = torch.linspace(-2.0, 2.0, x.numel(), dtype=torch.float64)
    fn = _product_cases(torch.float64, None)["activation"]
    taken = _spied(monkeypatch, "product_of_map")

    def through_the_cotangent():
        xr, ar = x.clone().requires_grad_(True), a.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad((fn(xr) * ar).sum(), xr, create_graph=True)
        (second,) = torch.autograd.grad((gradient * gradient).sum(), ar)
        return gradient.detach(), second

    fast = through_the_cotangent()
    assert taken == [True]
    torch.testing.assert_close(fast[1], 2 * a * torch.sigmoid(x) ** 2)
    xr = x.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(fn(xr).sum(), xr, create_graph=True)
    with pytest.raises(LookupError, match=r"order=1.*custom_gradient\(order=2\)"):
        torch.autograd.grad(gradient.sum(), xr)
    y = fn(xr)
    with forward_ad.dual_level(), pytest.raises(LookupError, match="order=2"):
        torch.autograd.grad(y, xr, forward_ad.make_dual(torch.ones_like(x), torch.ones_like(x)))
    _refused(monkeypatch, "product_of_map")
    ordinary = through_the_cotangent()
    same_bits(fast[0], ordinary[0])
    same_bits(fast[1], ordinary[1])


@pytest.mark.parametrize("case", ["activation", "weighted"])
def test_an_in_place_change_after_the_call_behaves_as_with_the_ordinary_ops(case, monkeypatch):
    """The factor is saved as the ordinary ops' product saves it: a weight closed over and changed in place raises
    in the backward pass on both paths; x changed in place changes neither gradient (sigmoid(x) was computed)."""
    results = []
    for path in ("fast", "ordinary"):
        if path == "ordinary":
            _refused(monkeypatch, "product_of_map")
        x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
        w = torch.tensor([3.0, -2.0, 0.5])
        fn = _product_cases(torch.float32, w)[case]
        y = fn(x)
        if case == "weighted":
            w.mul_(2.0)
            with pytest.raises(RuntimeError, match="inplace"):
                y.sum().backward()
            continue
        with torch.no_grad():
            x.mul_(2.0)
        y.sum().backward()
        results.append(x.grad)
    if results:
        same_bits(*results)
        torch.testing.assert_close(results[0], torch.sigmoid(torch.tensor([0.5, -1.0, 2.0])))
