"""Issue 77 on JAX: an element that the VJP's own select discards contributes exactly zero to forward mode, whatever
the discarded branch computes. ``jax.linear_transpose`` ran the select's transpose before the division's, so
``where(r > 0, g / r, 0)`` gave ``0 / 0`` (NaN) under ``jvp`` and ``jacfwd`` at r = 0, where the declared Jacobian's
element is 0 (``masked_selects``).

The truths are the declared Jacobians written out (analytic, float64), over grids that put the guarded point (0,
a zero row, ±inf, NaN) in one element at a time; reverse mode is held to the unmasked map's bits."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402
from jax import lax  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402
from stopgrad_math.jax import masked_selects  # noqa: E402

pytestmark = pytest.mark.usefixtures("float64")

ORDERS = [1, 2]


def _safe_norm(x):  # a safe norm's VJP: the guard by jnp.where (a jit call), its rows' norms as residuals
    r = jnp.linalg.norm(x, axis=1, keepdims=True)
    return r, lambda g: (jnp.where(r > 0, g / r, 0.0) * x,)


def _safe_norm_jacobian(x):
    r = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(r > 0, x / np.where(r > 0, r, 1.0), 0.0)  # ∂r_i/∂x_ij, declared 0 on a zero row


def _reciprocal_slope(x):  # y = x, its gradient declared g / x, guarded at 0 by lax.select (no jit call), after a
    # scaling: two elementwise ops between the cotangent and the select
    return x, lambda g: (lax.select(x != 0, (2.0 * g) / x, jnp.zeros_like(g)),)


def _finite_slope(x):  # y = x, its gradient declared g·x where x is finite and 0 at ±inf and NaN
    return x, lambda g: (jnp.where(jnp.isfinite(x), g * x, 0.0),)


ROWS = np.array([[3.0, 4.0], [1.0, -2.0], [0.5, 0.5]])

CASES = {
    "safe norm at a zero row": (_safe_norm, _safe_norm_jacobian, lambda k: ROWS * (np.arange(3) != k)[:, None]),
    "2g / x at x = 0": (_reciprocal_slope, lambda x: np.where(x != 0, 2.0 / np.where(x != 0, x, 1.0), 0.0),
                        lambda k: np.array([0.5, -2.0, 4.0]) * (np.arange(3) != k)),
    "g·x at a non-finite x": (_finite_slope, lambda x: np.where(np.isfinite(x), x, 0.0),
                              lambda k: np.where(np.arange(3) == k % 3, [np.inf, -np.inf, np.nan][k % 3],
                                                 [0.5, -2.0, 4.0])),
}


def _tangent_truth(case, x, tangent):
    jacobian = CASES[case][1](x)
    product = np.where(jacobian == 0, 0.0, jacobian * np.where(jacobian == 0, 0.0, tangent))
    return product.sum(axis=1, keepdims=True) if case == "safe norm at a zero row" else product


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("guarded", range(3))
@pytest.mark.parametrize("transform", ["jvp", "jit(jvp)", "vmap(jvp)"])
def test_forward_mode_gives_the_declared_jacobian_where_the_vjp_selects_away_a_division(order, case, guarded,
                                                                                          transform):
    function, _, point = CASES[case]
    f = sgm.custom_gradient(function, order=order)
    x = jnp.asarray(point(guarded))
    tangent = jnp.linspace(-1.0, 2.0, x.size).reshape(x.shape)

    def tangent_of(x, t):
        return jax.jvp(f, (x,), (t,))[1]

    if transform == "jit(jvp)":
        tangent_of = jax.jit(tangent_of)
    if transform == "vmap(jvp)":
        got = jax.vmap(tangent_of)(jnp.stack([x, x]), jnp.stack([tangent, 2.0 * tangent]))[1]
        tangent = 2.0 * tangent
    else:
        got = tangent_of(x, tangent)
    np.testing.assert_allclose(got, _tangent_truth(case, np.asarray(x), np.asarray(tangent)), rtol=1e-14, atol=0)


@pytest.mark.parametrize("order", ORDERS)
def test_jacfwd_equals_jacrev_and_the_declared_jacobian_at_a_zero_row(order):
    f = sgm.custom_gradient(_safe_norm, order=order)
    x = jnp.array([[0.0, 0.0], [3.0, 4.0]])
    by_rows = _safe_norm_jacobian(np.asarray(x))
    expected = np.zeros((2, 1, 2, 2))
    for i in range(2):
        expected[i, 0, i] = by_rows[i]
    np.testing.assert_allclose(jax.jacfwd(f)(x), expected, rtol=1e-15, atol=0)
    np.testing.assert_allclose(jax.jacrev(f)(x), expected, rtol=1e-15, atol=0)


def test_hessian_at_order_2_is_finite_at_a_zero_row_and_analytic_elsewhere():
    """∇Σrᵢ declared where(r > 0, x/r, 0): its Jacobian is (I − uuᵀ)/r on a row of norm r, u = x/r, and 0 on the
    zero row, where the declared gradient is 0 around it too."""
    f = sgm.custom_gradient(_safe_norm, order=2)
    x = jnp.array([[0.0, 0.0], [3.0, 4.0]])
    hessian = np.asarray(jax.hessian(lambda x: f(x).sum())(x))
    u = np.array([3.0, 4.0]) / 5.0
    np.testing.assert_allclose(hessian[1, :, 1, :], (np.eye(2) - np.outer(u, u)) / 5.0, rtol=1e-14)
    np.testing.assert_array_equal(np.abs(hessian[0]), 0.0)
    np.testing.assert_array_equal(np.abs(hessian[:, :, 0]), 0.0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_reverse_mode_is_the_unmasked_maps_bits(monkeypatch, order, case):
    """The select applied to its sources too keeps every value the select keeps and discards the others again:
    the gradient (and the value) is the map's own, bit for bit, at each guarded point."""
    function, _, point = CASES[case]
    results = []
    for masking in (True, False):
        if not masking:
            monkeypatch.setattr(masked_selects, "masked", lambda closed: None)
        f = sgm.custom_gradient(function, order=order)
        results.append([bits(jax.grad(lambda x, f=f: jnp.sum(f(x) * jnp.arange(1.0, 1.0 + f(x).size).reshape(
            f(x).shape)))(jnp.asarray(point(k)))) for k in range(3)])
    np.testing.assert_array_equal(*results)


def test_a_case_the_map_reads_besides_the_select_is_not_masked():
    """A quotient read twice (selected away once, kept whole once) cannot be masked at its source: the map is run
    as it is, and at x = 0 the tangent is the declared Jacobian's element, 0 + 0.5·(1/0) = inf (the transpose sums
    the two reads' cotangents before it divides)."""
    def read_twice(x):
        def vjp(g):
            q = g / x
            return (jnp.where(x != 0, q, 0.0) + 0.5 * q,)
        return x, vjp

    closed = jax.make_jaxpr(read_twice(jnp.array([1.0, 0.0]))[1])(jnp.ones(2))
    assert masked_selects.masked(closed) is None
    got = jax.jvp(sgm.custom_gradient(read_twice), (jnp.array([2.0, 0.0]),), (jnp.array([1.0, 1.0]),))[1]
    np.testing.assert_allclose(got[0], 0.75, rtol=1e-15)
    assert got[1] == np.inf


def _safe_norm_of_safe_sqrt(x):  # the safe norm with r's own derivative finite at a zero row (a double where)
    s = jnp.sum(x * x, axis=1, keepdims=True)
    r = jnp.where(s > 0, jnp.sqrt(jnp.where(s > 0, s, 1.0)), 0.0)
    return r, lambda g: (jnp.where(r > 0, g / r, 0.0) * x,)


def _reciprocal_slope_second(x):
    """The Jacobian of 2g / x's declared gradient of Σy (g = 1): −2/x² on the diagonal, 0 at x = 0, whose quotient the
    select discards."""
    return np.diag(np.where(x != 0, -2.0 / np.where(x != 0, x, 1.0) ** 2, 0.0))


def _safe_norm_second(x):
    """The Jacobian of the safe norm's declared gradient of Σr, flattened: (I − uuᵀ)/r on a row of norm r (u = x/r),
    0 on a zero row, whose quotient the select discards."""
    blocks = np.zeros((x.size, x.size))
    for i, row in enumerate(x):
        r = np.linalg.norm(row)
        if r > 0:
            blocks[2 * i:2 * i + 2, 2 * i:2 * i + 2] = (np.eye(2) - np.outer(row, row) / r ** 2) / r
    return blocks


SECOND_ORDER_CASES = {  # the function, its declared gradient's Jacobian, the point with element or row k guarded
    "2g / x at x = 0": (_reciprocal_slope, _reciprocal_slope_second, CASES["2g / x at x = 0"][2]),
    "safe norm, r by a safe sqrt": (_safe_norm_of_safe_sqrt, _safe_norm_second, CASES["safe norm at a zero row"][2]),
}


@pytest.mark.parametrize("case", SECOND_ORDER_CASES)
@pytest.mark.parametrize("guarded", range(3))
@pytest.mark.parametrize("mode", ["jacrev(grad)", "jacfwd(grad)", "jacrev(jacfwd)", "hessian", "jit(jacrev(grad))"])
def test_second_derivatives_at_order_2_give_the_guarded_point_zero(case, guarded, mode):
    """At order 2 reverse over reverse differentiates the VJP through the divisor too (−g/x² at x = 0, times the
    select's zero: NaN). The divisor is given 1 where the quotient is discarded, so every mode gives the declared
    gradient's Jacobian, 0 at the guarded point (``jax.custom_vjp`` with x as its residual gives NaN there)."""
    function, second, point = SECOND_ORDER_CASES[case]
    f = sgm.custom_gradient(function, order=2)
    x = jnp.asarray(point(guarded))
    total = lambda x: jnp.sum(f(x))  # noqa: E731
    if mode == "jacrev(jacfwd)":
        got = jax.jacrev(lambda x: jax.jacfwd(f)(x).reshape(-1, x.size).sum(0))(x)
    else:
        got = {"jacrev(grad)": jax.jacrev(jax.grad(total)), "jacfwd(grad)": jax.jacfwd(jax.grad(total)),
               "hessian": jax.hessian(total), "jit(jacrev(grad))": jax.jit(jax.jacrev(jax.grad(total)))}[mode](x)
    got = np.asarray(got).reshape(x.size, x.size)
    np.testing.assert_allclose(got, second(np.asarray(x)), rtol=1e-13, atol=1e-15)
    guarded_columns = np.asarray(jnp.zeros(x.shape).at[guarded].set(1.0)).reshape(-1) == 1
    assert (got[guarded_columns] == 0).all() and (got[:, guarded_columns] == 0).all()


def test_a_plain_norm_in_f_keeps_its_own_derivative_at_a_zero_row_at_order_2():
    """The documented limit: at order 2 what the VJP closes over moves with x through f's own ops, and
    ``jnp.linalg.norm``'s derivative at a zero row is JAX's, 0·inf: reverse over reverse is NaN on that row, as
    ``jax.custom_vjp`` gives it with the same norm computed in ``fwd``; forward over reverse is 0."""
    @jax.custom_vjp
    def anchor(x):
        return jnp.linalg.norm(x, axis=1, keepdims=True)

    def anchor_fwd(x):  # (the norm computed plainly in fwd, the library's f's, as its residual)
        r = _safe_norm(x)[0]
        return r, (x, r)

    anchor.defvjp(anchor_fwd, lambda residuals, g: (jnp.where(residuals[1] > 0, g / residuals[1], 0.0) * residuals[0],))
    f = sgm.custom_gradient(_safe_norm, order=2)
    x = jnp.asarray(ROWS * (np.arange(3) != 1)[:, None])
    got, expected = (jax.jacrev(jax.grad(lambda x, g=g: jnp.sum(g(x))))(x) for g in (f, anchor))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    nan = np.zeros((3, 2, 3, 2), dtype=bool)
    nan[:, :, 1, :] = True  # (every gradient element, in the zero row: the norm's pullback there is 0·inf)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert (np.asarray(jax.hessian(lambda x: jnp.sum(f(x)))(x))[1] == 0).all()


def _unit_rows(x):  # rows scaled to unit length: jnp.where broadcasts the condition (n, 1) after the quotient (n, d)
    r = jnp.linalg.norm(x, axis=-1, keepdims=True)
    y = jnp.where(r > 0, x / jnp.where(r > 0, r, 1.0), 0.0)
    return y, lambda g: (jnp.where(r > 0, (g - y * jnp.sum(g * y, -1, keepdims=True)) / r, 0.0),)


def _unit_rows_product(x, t):
    """J·t of ``_unit_rows``' declared Jacobian, (I − yyᵀ)/r on each row, 0 on a zero row."""
    r = np.linalg.norm(x, axis=-1, keepdims=True)
    y = x / np.where(r > 0, r, 1.0)
    return np.where(r > 0, (t - y * (t * y).sum(-1, keepdims=True)) / np.where(r > 0, r, 1.0), 0.0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("transform", ["jvp", "jit(jvp)", "vmap(jvp)", "jacfwd"])
def test_a_condition_broadcast_after_the_quotient_keeps_the_declared_zero(order, transform):
    """``jnp.where`` broadcasts its condition after the quotient it selects is made, so the select's own
    predicate came too late to mask the division (NaN at a zero row): it is made again there from the condition."""
    f = sgm.custom_gradient(_unit_rows, order=order)
    for k in range(3):
        x = jnp.asarray(ROWS * (np.arange(3) != k)[:, None])
        t = jnp.linspace(-1.0, 2.0, x.size).reshape(x.shape)
        if transform == "jacfwd":
            got = np.einsum("ijkl,kl->ij", jax.jacfwd(f)(x), t)
        elif transform == "vmap(jvp)":
            got = jax.vmap(lambda x, t: jax.jvp(f, (x,), (t,))[1])(jnp.stack([x, x]), jnp.stack([t, 2.0 * t]))[1] / 2
        else:
            tangent_of = lambda x, t: jax.jvp(f, (x,), (t,))[1]  # noqa: E731
            got = (jax.jit(tangent_of) if transform == "jit(jvp)" else tangent_of)(x, t)
        np.testing.assert_allclose(got, _unit_rows_product(np.asarray(x), np.asarray(t)), rtol=1e-14, atol=1e-16,
                                   err_msg=f"zero row {k}")
        np.testing.assert_allclose(jax.vjp(f, x)[1](t)[0], _unit_rows_product(np.asarray(x), np.asarray(t)),
                                   rtol=1e-14, atol=1e-16)
