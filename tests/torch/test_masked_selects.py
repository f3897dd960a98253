"""Issue 77 on PyTorch: an element that the VJP's own ``where`` discards contributes exactly zero to forward mode,
whatever the discarded branch computes. The transpose of the VJP's map ran ``where``'s transpose before the
division's, so ``torch.where(r > 0, g / r, 0)`` gave ``0 / 0`` (NaN) under ``torch.func.jvp``, ``forward_ad`` and
``jacfwd`` at r = 0, where the declared Jacobian's element is 0 (``masked_selects``).

The truths are the declared Jacobians written out (analytic, float64), over grids that put the guarded point (0, a
zero row, ±inf, NaN) in one element at a time; reverse mode is held to the unmasked map's bits."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch_modes import bits  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.torch import masked_selects  # noqa: E402

ORDERS = [1, 2]
ROWS = torch.tensor([[3.0, 4.0], [1.0, -2.0], [0.5, 0.5]], dtype=torch.float64)


def _safe_norm(x):  # a safe norm's VJP: the quotient selected away on a zero row
    r = x.norm(dim=1, keepdim=True)
    return r, lambda g: torch.where(r > 0, g / r, 0.0) * x


def _safe_norm_jacobian(x):
    r = x.norm(dim=1, keepdim=True)
    return torch.where(r > 0, x / torch.where(r > 0, r, 1.0), 0.0)  # ∂r_i/∂x_ij, declared 0 on a zero row


def _reciprocal_slope(x):  # y = x, its gradient declared 2g / x, guarded at 0: two elementwise ops before the where
    return x * 1.0, lambda g: torch.where(x != 0, (2.0 * g) / x, torch.zeros_like(g))


def _finite_slope(x):  # y = x, its gradient declared g·x where x is finite, 0 at ±inf and NaN
    return x * 1.0, lambda g: torch.where(torch.isfinite(x), g * x, 0.0)


_POINTS = torch.tensor([0.5, -2.0, 4.0], dtype=torch.float64)
CASES = {
    "safe norm at a zero row": (_safe_norm, _safe_norm_jacobian, lambda k: ROWS * (torch.arange(3) != k)[:, None]),
    "2g / x at x = 0": (_reciprocal_slope, lambda x: torch.where(x != 0, 2.0 / torch.where(x != 0, x, 1.0), 0.0),
                        lambda k: _POINTS * (torch.arange(3) != k)),
    "g·x at a non-finite x": (_finite_slope, lambda x: torch.where(torch.isfinite(x), x, 0.0),
                              lambda k: torch.where(torch.arange(3) == k, [math.inf, -math.inf, math.nan][k],
                                                    _POINTS)),
}


def _tangent_truth(case, x, tangent):
    jacobian = CASES[case][1](x)
    product = torch.where(jacobian == 0, 0.0, jacobian * tangent)
    return product.sum(dim=1, keepdim=True) if case == "safe norm at a zero row" else product


def _forward_ad(f, x, tangent):
    with forward_ad.dual_level():
        return forward_ad.unpack_dual(f(forward_ad.make_dual(x, tangent))).tangent


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("guarded", range(3))
@pytest.mark.parametrize("mode", ["torch.func.jvp", "forward_ad", "vmap(jvp)"])
def test_forward_mode_gives_the_declared_jacobian_where_the_vjp_selects_away_a_division(order, case, guarded, mode):
    function, _, point = CASES[case]
    f = sgm.custom_gradient(function, order=order)
    x = point(guarded)
    tangent = torch.linspace(-1.0, 2.0, x.numel(), dtype=torch.float64).reshape(x.shape)
    if mode == "torch.func.jvp":
        got = torch.func.jvp(f, (x,), (tangent,))[1]
    elif mode == "forward_ad":
        got = _forward_ad(f, x, tangent)
    else:
        got = torch.func.vmap(lambda x, t: torch.func.jvp(f, (x,), (t,))[1])(
            torch.stack([x, x]), torch.stack([tangent, 2.0 * tangent]))[1]
        tangent = 2.0 * tangent
    torch.testing.assert_close(got, _tangent_truth(case, x, tangent), rtol=1e-14, atol=0)


@pytest.mark.parametrize("order", ORDERS)
def test_jacfwd_equals_jacrev_and_the_declared_jacobian_at_a_zero_row(order):
    f = sgm.custom_gradient(_safe_norm, order=order)
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    expected = torch.zeros(2, 1, 2, 2, dtype=torch.float64)
    for i in range(2):
        expected[i, 0, i] = _safe_norm_jacobian(x)[i]
    torch.testing.assert_close(torch.func.jacfwd(f)(x), expected, rtol=1e-15, atol=0)
    torch.testing.assert_close(torch.func.jacrev(f)(x), expected, rtol=1e-15, atol=0)


class SafeNorm(sgm.Function):
    """The safe norm as a Function, its backward the guarded division (the benchmarks' real-code case)."""

    @staticmethod
    def forward(ctx, x):
        r = x.norm(dim=1, keepdim=True)
        ctx.save_for_backward(x, r)
        return r

    @staticmethod
    def backward(ctx, grad):
        x, r = ctx.saved_tensors
        return torch.where(r > 0, grad / r, torch.zeros_like(r)) * x


def test_a_functions_guarded_backward_gives_the_declared_tangent_eagerly_and_compiled():
    x = ROWS * (torch.arange(3) != 1)[:, None]
    tangent = torch.linspace(-1.0, 2.0, 6, dtype=torch.float64).reshape(3, 2)
    expected = _tangent_truth("safe norm at a zero row", x, tangent)
    torch.testing.assert_close(torch.func.jvp(SafeNorm.apply, (x,), (tangent,))[1], expected, rtol=1e-14, atol=0)
    compiled = torch.compile(lambda x, t: _forward_ad(SafeNorm.apply, x, t), fullgraph=True)
    torch.testing.assert_close(compiled(x, tangent), expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_reverse_mode_is_the_unmasked_maps_bits(monkeypatch, order, case):
    """The where applied to its sources too keeps every value it keeps and discards the others again: the gradient
    is the map's own, bit for bit, at each guarded point."""
    function, _, point = CASES[case]
    results = []
    for masking in (True, False):
        if not masking:
            monkeypatch.setattr(masked_selects, "masked", lambda graph, cotangents: [])
        f = sgm.custom_gradient(function, order=order)
        gradients = []
        for k in range(3):
            x = point(k).clone().requires_grad_(True)
            y = f(x)
            gradients.append(bits(torch.autograd.grad(y, x, torch.arange(1.0, 1.0 + y.numel(),
                                                                          dtype=y.dtype).reshape(y.shape))[0]))
        results.append(gradients)
    for masked, unmasked in zip(*results, strict=True):
        np.testing.assert_array_equal(masked, unmasked)


def test_a_quotient_read_besides_the_where_is_not_masked():
    """A quotient read twice (selected away once, kept whole once) is left as it is: at x = 0 the tangent is the
    declared Jacobian's element, 0 + 0.5·(1/0) = inf."""
    def read_twice(x):
        def vjp(g):
            q = g / x
            return torch.where(x != 0, q, 0.0) + 0.5 * q
        return x * 1.0, vjp

    x = torch.tensor([2.0, 0.0], dtype=torch.float64)
    got = torch.func.jvp(sgm.custom_gradient(read_twice), (x,), (torch.ones_like(x),))[1]
    assert got[0] == 0.75 and got[1] == math.inf


def _declared_gradient_jacobian(case, x):
    """The Jacobian of the declared gradient of Σy (g = 1), flattened: (I − uuᵀ)/r on a row of norm r (u = x/r)
    for the safe norm, −2/x² on the diagonal for 2g / x; 0 at the guarded row or element, whose quotient the
    where discards."""
    if case == "2g / x at x = 0":
        return torch.diag(torch.where(x != 0, -2.0 / torch.where(x != 0, x, 1.0) ** 2, 0.0))
    blocks = []
    for row in x:
        r = row.norm()
        u = row / r if r > 0 else torch.zeros_like(row)
        blocks.append((torch.eye(2, dtype=x.dtype) - torch.outer(u, u)) / r if r > 0 else torch.zeros(2, 2,
                                                                                                      dtype=x.dtype))
    return torch.block_diag(*blocks)


def _second_derivative(f, x, mode):
    total = lambda x: f(x).sum()  # noqa: E731
    if mode == "create_graph":
        x = x.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(total(x), x, create_graph=True)
        rows = [torch.autograd.grad(g, x, retain_graph=True)[0].reshape(-1) for g in gradient.reshape(-1)]
        return torch.stack(rows)
    outer, inner = {"jacrev(jacrev)": (torch.func.jacrev, torch.func.jacrev),
                    "jacfwd(jacrev)": (torch.func.jacfwd, torch.func.jacrev),
                    "jacrev(jacfwd)": (torch.func.jacrev, torch.func.jacfwd)}[mode]
    if mode == "jacrev(jacfwd)":  # (the gradient of Σy as forward mode gives it: J's rows summed)
        return outer(lambda x: inner(f)(x).reshape(-1, x.numel()).sum(0))(x).reshape(x.numel(), x.numel())
    return outer(inner(total))(x).reshape(x.numel(), x.numel())


def _batched_second_derivative(f, x):
    """jacrev(jacrev) under vmap, over x and 2x: each the Jacobian of that point's declared gradient."""
    jacobians = torch.func.vmap(torch.func.jacrev(torch.func.jacrev(lambda x: f(x).sum())))(torch.stack([x, 2 * x]))
    return jacobians.reshape(2, x.numel(), x.numel())


@pytest.mark.parametrize("case", ["safe norm at a zero row", "2g / x at x = 0"])
@pytest.mark.parametrize("guarded", range(3))
@pytest.mark.parametrize("mode", ["create_graph", "jacrev(jacrev)", "jacfwd(jacrev)", "jacrev(jacfwd)",
                                  "vmap(jacrev(jacrev))"])
def test_second_derivatives_at_order_2_give_the_guarded_point_zero(case, guarded, mode):
    """At order 2 a second derivative differentiates the VJP through the divisor too (−g/r² at r = 0, times the
    where's zero: NaN). The divisor is given 1 where the quotient is discarded, so every mode gives the declared
    gradient's Jacobian, 0 at the guarded point, as ``func.hessian`` did. (For 2g / x, PyTorch's own double
    backward of the Function that saves x gives NaN there: the where NaN trap the issue's principle rules out.)"""
    function, _, point = CASES[case]
    x = point(guarded)
    f = sgm.custom_gradient(function, order=2)
    if mode == "vmap(jacrev(jacrev))":
        got, doubled = _batched_second_derivative(f, x)
        torch.testing.assert_close(doubled, _declared_gradient_jacobian(case, 2 * x), rtol=1e-13, atol=1e-15)
    else:
        got = _second_derivative(f, x, mode)
    torch.testing.assert_close(got, _declared_gradient_jacobian(case, x), rtol=1e-13, atol=1e-15)
    rows = got.reshape(3, -1, x.numel())[guarded]  # (a zero: its sign is not held here, forward mode's is −0.0)
    assert (rows == 0).all() and (got.reshape(x.numel(), *x.shape)[:, guarded] == 0).all()


def test_a_functions_double_backward_at_a_zero_row_is_the_mechanisms():
    """The safe norm as a Function saves its output r, whose derivative in PyTorch's double backward is the
    Function's own (0 on the zero row); the library at order 2 differentiates f's norm, whose share there the
    masked divisor makes 0: the two agree."""
    anchor = type("SafeNorm", (torch.autograd.Function,), {"forward": SafeNorm.forward,
                                                             "backward": SafeNorm.backward})
    x = ROWS * (torch.arange(3) != 1)[:, None]
    expected = _second_derivative(anchor.apply, x, "create_graph")
    torch.testing.assert_close(_second_derivative(SafeNorm.apply, x, "create_graph"), expected, rtol=1e-14,
                               atol=1e-15)
    assert not expected.isnan().any()


def _unit_rows(x):  # rows scaled to unit length: the where's condition (n, 1) broadcast over the quotient (n, d)
    r = x.norm(dim=-1, keepdim=True)
    y = torch.where(r > 0, x / torch.where(r > 0, r, 1.0), 0.0)
    return y, lambda g: torch.where(r > 0, (g - y * (g * y).sum(-1, keepdim=True)) / r, 0.0)


def _unit_rows_product(x, t):
    """J·t of ``_unit_rows``' declared Jacobian, (I − yyᵀ)/r on each row, 0 on a zero row."""
    r = x.norm(dim=-1, keepdim=True)
    y = x / torch.where(r > 0, r, 1.0)
    return torch.where(r > 0, (t - y * (t * y).sum(-1, keepdim=True)) / torch.where(r > 0, r, 1.0), 0.0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", ["torch.func.jvp", "forward_ad", "vmap(jvp)", "jacfwd"])
def test_a_condition_that_broadcasts_over_the_quotient_keeps_the_declared_zero(order, mode):
    """The where's condition has one element a row and the quotient it discards one a row's element (the shape of
    a row normalization's backward, which gave NaN at a zero row on TensorFlow and JAX)."""
    f = sgm.custom_gradient(_unit_rows, order=order)
    for k in range(3):
        x = ROWS * (torch.arange(3) != k)[:, None]
        t = torch.linspace(-1.0, 2.0, x.numel(), dtype=torch.float64).reshape(x.shape)
        if mode == "torch.func.jvp":
            got = torch.func.jvp(f, (x,), (t,))[1]
        elif mode == "forward_ad":
            got = _forward_ad(f, x, t)
        elif mode == "jacfwd":
            got = torch.einsum("ijkl,kl->ij", torch.func.jacfwd(f)(x), t)
        else:
            got = torch.func.vmap(lambda x, t: torch.func.jvp(f, (x,), (t,))[1])(
                torch.stack([x, x]), torch.stack([t, 2.0 * t]))[1] / 2
        torch.testing.assert_close(got, _unit_rows_product(x, t), rtol=1e-14, atol=1e-16, msg=f"zero row {k}")
        torch.testing.assert_close(torch.func.vjp(f, x)[1](t)[0], _unit_rows_product(x, t), rtol=1e-14, atol=1e-16)
