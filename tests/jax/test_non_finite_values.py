"""A NaN or inf never changes a finite derivative (stopgrad_math.jax): the declared derivative reaches every
element, and a non-finite value cuts only the paths that go through it. Truths: autodiff of the same formula
(which applies the rule as written) and jax.custom_vjp with the same VJP in reverse mode, in every transform."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402
from non_finite_cases import CASES, CT, TANGENT_W, TANGENT_X, assert_same  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402


def plain(x, w):
    return x @ w.T


@sgm.custom_gradient
def mixing(x, w):
    return x @ w.T, lambda ct: (ct @ w, ct.T @ x)


@jax.custom_vjp
def mixing_vjp(x, w):  # the anchor in reverse mode: the same rule as jax.custom_vjp
    return x @ w.T


mixing_vjp.defvjp(lambda x, w: (x @ w.T, (x, w)), lambda res, ct: (ct @ res[1], ct.T @ res[0]))


# Each derivative of a function of (x, w), as a tuple of arrays.
MODES = {
    "vjp": lambda f, x, w: jax.vjp(f, x, w)[1](CT),
    "grad": lambda f, x, w: jax.grad(lambda x, w: jnp.sum(f(x, w) * CT), argnums=(0, 1))(x, w),
    "jit(grad)": lambda f, x, w: jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * CT), argnums=(0, 1)))(x, w),
    "jvp in x alone": lambda f, x, w: jax.jvp(lambda x: f(x, w), (x,), (TANGENT_X,))[1:],
    "jvp in w alone": lambda f, x, w: jax.jvp(lambda w: f(x, w), (w,), (TANGENT_W,))[1:],
    "jvp in both": lambda f, x, w: jax.jvp(f, (x, w), (TANGENT_X, TANGENT_W))[1:],
    "jit(jvp)": lambda f, x, w: jax.jit(lambda x: jax.jvp(lambda x: f(x, w), (x,), (TANGENT_X,))[1])(x)[None],
    "jacfwd": lambda f, x, w: jax.jacfwd(f, argnums=(0, 1))(x, w),
    "jacrev": lambda f, x, w: jax.jacrev(f, argnums=(0, 1))(x, w),
    "vmap(vjp) over rows": lambda f, x, w: jax.vmap(
        lambda r: jax.vjp(lambda r: f(r[None], w), r)[1](CT[:1])[0])(x)[None],
    "scan": lambda f, x, w: jax.grad(lambda x: jnp.sum(jax.lax.scan(
        lambda c, _: (c, f(x, w) * CT), 0.0, None, length=2)[1]))(x)[None],
    "linearize": lambda f, x, w: jax.linearize(lambda x: f(x, w), x)[1](TANGENT_X)[None],
}


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_in_every_mode(float64, case, mode, order):
    """X·Wᵀ with the VJP (ct·W, ctᵀ·X): dX = ct·W never reads X, so a NaN in X leaves it finite; dW is NaN
    in the column the NaN reaches alone; a tangent on X alone is tX·Wᵀ. The decorator once gave 0 on the NaN's
    row of dX and wrong finite numbers in dW."""
    x, w = (jnp.asarray(a) for a in CASES[case])
    f = mixing if order == 1 else sgm.custom_gradient(mixing.__wrapped__, order=2)
    assert_same(MODES[mode](f, x, w), MODES[mode](plain, x, w), f"{case}, {mode}")
    np.testing.assert_array_equal(f(x, w), plain(x, w))  # the value, as it was


@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_is_jax_custom_vjp_in_reverse_mode(float64, case):
    x, w = (jnp.asarray(a) for a in CASES[case])
    for mode in ("vjp", "grad", "jit(grad)", "jacrev"):
        assert_same(MODES[mode](mixing, x, w), MODES[mode](mixing_vjp, x, w), f"{case}, {mode}")


AWKWARD_X = jnp.array([1.0, jnp.nan, jnp.inf, -jnp.inf])
ELEMENTWISE = {  # a derivative of an elementwise function along ones, in each transform
    "grad": lambda f, x: jax.grad(lambda x: jnp.sum(f(x)))(x),
    "jvp": lambda f, x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1],
    "jit(jvp)": lambda f, x: jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1])(x),
    "jacfwd": lambda f, x: jnp.diagonal(jax.jacfwd(f)(x)),
    "jacrev": lambda f, x: jnp.diagonal(jax.jacrev(f)(x)),
    "vmap(grad)": lambda f, x: jax.vmap(jax.grad(f))(x),
    "fori_loop": lambda f, x: jax.grad(lambda x: jnp.sum(jax.lax.fori_loop(0, 1, lambda _, c: f(c), x)))(x),
}


@pytest.mark.parametrize("mode", ELEMENTWISE)
def test_an_elementwise_rule_reaches_a_non_finite_x(mode):
    """x ↦ (x, ct·0.5) at [1, NaN, inf, −inf]: 0.5 everywhere, as the rule says and jax.custom_vjp gives (the
    decorator gave 0 at the three non-finite elements)."""
    half = sgm.custom_gradient(lambda x: (x, lambda ct: ct * 0.5))
    anchor = jax.custom_vjp(lambda x: x)
    anchor.defvjp(lambda x: (x, None), lambda _, ct: (ct * 0.5,))
    got = ELEMENTWISE[mode](half, AWKWARD_X)
    np.testing.assert_array_equal(got, ELEMENTWISE[mode](lambda x: 0.5 * x, AWKWARD_X))
    np.testing.assert_array_equal(got, [0.5, 0.5, 0.5, 0.5])
    if mode in ("grad", "jacrev", "vmap(grad)", "fori_loop"):
        np.testing.assert_array_equal(got, ELEMENTWISE[mode](anchor, AWKWARD_X))
    np.testing.assert_array_equal(half(AWKWARD_X), AWKWARD_X)


@pytest.mark.parametrize("mode", ELEMENTWISE)
def test_the_identity_form_passes_gx_at_a_non_finite_x(mode):
    """log1pexp with gx = sigmoid(x): 1 at +inf, 0 at −inf, NaN at NaN (the identity form gave 0, 0, 0)."""
    f = lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)  # noqa: E731
    want = ELEMENTWISE[mode](lambda x: jax.lax.stop_gradient(jax.nn.sigmoid(x)) * x, AWKWARD_X)
    got = ELEMENTWISE[mode](f, AWKWARD_X)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, [1 / (1 + np.exp(-1.0)), np.nan, 1.0, 0.0], rtol=1e-6)


GRID = np.array([0.0, -0.0, 1e-45, -1e-45, 1.5, -2.25, 3e38, -3e38, np.inf, -np.inf, np.nan], np.float32)


@pytest.mark.parametrize("slope_is_negative", [False, True])
def test_the_carrier_is_the_ordinary_ops_zero_bit_for_bit_where_they_give_one(slope_is_negative):
    """Where a is finite, a − stop(a) is the definition: the carrier has its value and, in both modes and under
    jit and vmap, its derivative bit for bit, over ±0, subnormals, huge values and every tangent of the grid;
    where a is not finite it is +0.0 with slope one, which ordinary ops cannot give."""
    from stopgrad_math.jax import identity

    a = jnp.asarray(GRID)
    finite = np.isfinite(GRID)
    ordinary = lambda a: a - jax.lax.stop_gradient(a)  # noqa: E731
    for tangent in GRID:
        t = jnp.full_like(a, tangent)
        for transform in (lambda f: f, jax.jit, jax.vmap):
            carried = transform(lambda a, t: jax.jvp(identity.carried_zero, (a,), (t,)))(a, t)
            plain = transform(lambda a, t: jax.jvp(ordinary, (a,), (t,)))(a, t)
            assert np.all(bits(carried[0]) == bits(np.zeros_like(GRID)))
            assert np.all(bits(carried[1]) == bits(np.full_like(GRID, tangent)))
            assert np.all(bits(np.asarray(plain[0])[finite]) == bits(np.zeros_like(GRID)[finite]))
            assert np.all(bits(np.asarray(plain[1])[finite]) == bits(np.asarray(carried[1])[finite]))
        cotangents = jax.vjp(identity.carried_zero, a)[1](t)[0], jax.vjp(ordinary, a)[1](t)[0]
        assert np.all(bits(np.asarray(cotangents[0])[finite]) == bits(np.asarray(cotangents[1])[finite]))
        assert np.all(bits(cotangents[0]) == bits(np.asarray(t)))
    zero = identity.zero_with_slope(a, slope_is_negative)
    assert np.all(bits(zero) == bits(np.zeros_like(GRID)))
    slope = jax.jvp(lambda a: identity.zero_with_slope(a, slope_is_negative), (a,), (jnp.ones_like(a),))[1]
    np.testing.assert_array_equal(slope, np.full_like(GRID, -1.0 if slope_is_negative else 1.0))
