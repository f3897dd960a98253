"""The helpers of stopgrad_math.jax under grad, jvp, vmap and jit, against analytic derivatives."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402
from jax_transforms import TRANSFORMS  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

X = jnp.array([0.4, -1.6, 2.5])
ONES = jnp.ones(3)


def _both_modes(fn, x, tangent=None):
    """(reverse, forward) derivatives of an elementwise fn at x, jitted: the gradient of sum(fn) and the JVP
    along ``tangent`` (ones: both are the diagonal of the Jacobian)."""
    tangent = jnp.ones_like(x) if tangent is None else tangent
    reverse = jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(x)
    forward = jax.jit(lambda x, t: jax.jvp(fn, (x,), (t,))[1])(x, tangent)
    return reverse, forward


def test_stop_gradient_over_a_pytree():
    fn = lambda p: p["a"] * sgm.stop_gradient(p)["b"] + sgm.stop_gradient(p)["a"] ** 2  # noqa: E731
    got = jax.grad(fn)({"a": 3.0, "b": 5.0})
    assert (float(got["a"]), float(got["b"])) == (5.0, 0.0)
    assert sgm.stop_gradient({"k": None})["k"] is None


def test_stop_gradient_where_stops_per_element():
    mask = jnp.array([True, False, True])
    reverse, forward = _both_modes(lambda x: sgm.stop_gradient_where(x, mask), X)
    np.testing.assert_array_equal(reverse, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(forward, [0.0, 1.0, 0.0])


def test_stop_gradient_where_refuses_a_float_mask_and_a_mask_that_does_not_broadcast():
    with pytest.raises(TypeError, match="mask must be a bool array"):
        sgm.stop_gradient_where(X, jnp.ones(3))
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not broadcast to x's \(3,\)"):
        sgm.stop_gradient_where(X, jnp.array([True, False]))


def test_straight_through_round_keeps_the_value_and_takes_the_identitys_derivative():
    fn = lambda x: sgm.straight_through(jnp.round(x), x)  # noqa: E731
    np.testing.assert_array_equal(jax.jit(fn)(X), jnp.round(X))
    reverse, forward = _both_modes(fn, X)
    np.testing.assert_array_equal(reverse, ONES)
    np.testing.assert_array_equal(forward, ONES)


def test_straight_through_keeps_negative_zero_and_refuses_other_structures():
    assert bits(sgm.straight_through(jnp.array(-0.0), jnp.array(3.0))) == bits(np.float32(-0.0))
    with pytest.raises(ValueError, match="same structure"):
        sgm.straight_through({"a": X}, {"b": X})


@pytest.mark.parametrize("scale", [0.1, 3.0, -2.5])
def test_scale_and_reverse_gradient(scale):
    reverse, forward = _both_modes(lambda x: sgm.scale_gradient(x, scale), X)
    np.testing.assert_allclose(reverse, np.float32(scale) * np.ones(3), rtol=1e-7)
    np.testing.assert_allclose(forward, np.float32(scale) * np.ones(3), rtol=1e-7)
    np.testing.assert_array_equal(sgm.scale_gradient(X, scale), X)
    reverse, _ = _both_modes(lambda x: sgm.reverse_gradient(x, scale), X)
    np.testing.assert_allclose(reverse, -np.float32(scale) * np.ones(3), rtol=1e-7)


def test_scale_gradient_per_element():
    scale = jnp.array([1.0, 2.0, 3.0])
    reverse, forward = _both_modes(lambda x: sgm.scale_gradient(x, scale), X)
    np.testing.assert_array_equal(reverse, scale)
    np.testing.assert_array_equal(forward, scale)


def test_magic_box_derivatives_at_every_order():
    """τ = θ²: d box = 2θ, d² box = (2θ)² + 2, d³ box = (2θ)³ + 12θ, at θ = 0.3; value exactly 1."""
    box = lambda theta: sgm.magic_box(theta**2)  # noqa: E731
    theta = 0.3
    assert float(jax.jit(box)(theta)) == 1.0
    np.testing.assert_allclose(jax.grad(box)(theta), 2 * theta, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jax.grad(box))(theta), (2 * theta) ** 2 + 2, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jax.grad(jax.grad(box)))(theta), (2 * theta) ** 3 + 12 * theta, rtol=1e-5)
    np.testing.assert_allclose(jax.jvp(jax.grad(box), (theta,), (1.0,))[1], (2 * theta) ** 2 + 2, rtol=1e-6)


def test_partial_custom_gradient_mixed_second_derivatives():
    """f = x·y with dh/dx = 2y (custom), dh/dy = x (autodiff); ∂²h/∂x∂y = ∂²h/∂y∂x = 2 (∂g/∂y), in reverse over
    reverse (it was −0.0 with the masking product in the tangent) and forward over reverse."""
    h = lambda x, y: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)  # noqa: E731
    gx, gy = jax.grad(h, argnums=(0, 1))(3.0, 5.0)
    assert (float(gx), float(gy)) == (10.0, 3.0)
    assert float(jax.grad(jax.grad(h, argnums=0), argnums=1)(3.0, 5.0)) == 2.0
    assert float(jax.grad(jax.grad(h, argnums=1), argnums=0)(3.0, 5.0)) == 2.0
    assert float(jax.jvp(lambda y: jax.grad(h)(3.0, y), (5.0,), (1.0,))[1]) == 2.0


def test_zero_with_gradient_is_plus_zero_with_slope_one():
    x = jnp.array([-0.0, 2.0, jnp.inf])
    u = sgm.zero_with_gradient(x)
    assert np.all(bits(u) == bits(np.zeros(3, np.float32)))  # +0.0, also at −0.0 and inf
    reverse, forward = _both_modes(sgm.zero_with_gradient, x)
    np.testing.assert_array_equal(reverse, [1.0, 1.0, 1.0])  # slope one at inf too, as autodiff of x has it
    np.testing.assert_array_equal(forward, [1.0, 1.0, 1.0])


Y = jnp.array([2.0, -0.5, 3.0])
# Elementwise uses of every helper, with the derivative (the Jacobian's diagonal) each must have at X.
ELEMENTWISE = {
    "stop_gradient": (sgm.stop_gradient, np.zeros(3)),
    "stop_gradient_where": (lambda x: sgm.stop_gradient_where(x, x > 0), np.float32([0.0, 1.0, 0.0])),
    "straight_through": (lambda x: sgm.straight_through(jnp.round(x), x), np.ones(3)),
    "scale_gradient": (lambda x: sgm.scale_gradient(x, 0.1), np.full(3, np.float32(0.1))),
    "reverse_gradient": (lambda x: sgm.reverse_gradient(x, 2.0), np.full(3, -2.0)),
    "zero_with_gradient": (sgm.zero_with_gradient, np.ones(3)),
    "magic_box": (lambda x: sgm.magic_box(x**2), 2 * np.asarray(X)),
    "partial_custom_gradient": (lambda x: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x,
                                                                      jnp.ones_like(x) * 3.0), np.full(3, 6.0)),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("helper", ELEMENTWISE)
def test_every_helper_under_every_transform(helper, transform):
    fn, want = ELEMENTWISE[helper]
    np.testing.assert_allclose(TRANSFORMS[transform](fn, X), want, rtol=1e-6)


# The second derivative each elementwise use has at X: zero but for magic_box(x²), (2x)² + 2 (partial's custom
# gradient 2y is held constant in x, as documented).
SECOND = {name: np.zeros(3) for name in ELEMENTWISE} | {"magic_box": (2 * np.asarray(X)) ** 2 + 2}


@pytest.mark.parametrize("helper", ELEMENTWISE)
def test_every_helper_under_hessian(helper):
    fn, _ = ELEMENTWISE[helper]
    np.testing.assert_allclose(jnp.diagonal(jax.hessian(lambda x: jnp.sum(fn(x)))(X)), SECOND[helper], rtol=1e-5)


def test_magic_box_hessian_and_forward_over_reverse():
    """d²/dx² magic_box(x²) = (2x)² + 2 elementwise: jax.hessian (forward over reverse) and jacrev of jacfwd."""
    fn = lambda x: jnp.sum(sgm.magic_box(x**2))  # noqa: E731
    want = np.diag((2 * np.asarray(X)) ** 2 + 2)
    np.testing.assert_allclose(jax.hessian(fn)(X), want, rtol=1e-5)
    np.testing.assert_allclose(jax.jacrev(jax.jacfwd(fn))(X), want, rtol=1e-5)


@pytest.mark.parametrize("call", [
    lambda: sgm.scale_gradient(jnp.array([1, 2]), 0.5),
    lambda: sgm.magic_box(jnp.array(1)),
    lambda: sgm.zero_with_gradient("x"),
    lambda: sgm.reverse_gradient(X, "big"),
])
def test_values_without_a_derivative_are_type_errors(call):
    with pytest.raises(TypeError):
        call()
