"""stopgrad_math.jax.custom_gradient(fx, gx, x) under every JAX transform, against independent truths:
autodiff of a stable formula, analytic derivatives and float64 finite differences."""


import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402
from jax_transforms import TRANSFORMS, elementwise_cases, run_on_two_host_devices  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

X = jnp.array([-1.0, 0.0, 2.0, 100.0])
SIGMOID = np.float32([0.26894143, 0.5, 0.880797, 1.0])  # jax.nn.sigmoid(X): the stable formula's derivative


def log1pexp(x):
    return sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)


def _sum_of(fn):
    return lambda x: jnp.sum(fn(x))


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_log1pexp_has_the_exact_derivative_under_every_transform(transform):
    got = TRANSFORMS[transform](log1pexp, X)
    np.testing.assert_allclose(got, SIGMOID, rtol=1e-6)
    np.testing.assert_allclose(got, TRANSFORMS[transform](jax.nn.softplus, X), rtol=1e-6)  # stable autodiff


def test_the_naive_formulas_nan_at_100_is_what_the_library_fixes():
    """The wrong answer the library replaces, measured (tfp's mean-of-derivatives JVP: tests/jax/test_tfp_on_jax.py)."""
    naive = jax.grad(lambda x: jnp.log(1 + jnp.exp(x)))(100.0)
    assert np.isnan(naive)
    assert float(jax.grad(log1pexp)(100.0)) == 1.0


@pytest.mark.parametrize("wrap", ["plain", "jit", "vmap"])
def test_the_value_is_fx_bit_for_bit(wrap):
    fx = jnp.array([-0.0, jnp.inf, -jnp.inf, jnp.nan, 1e-40, 3.0])  # 1e-40: a float32 subnormal
    x = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    fn = lambda x: sgm.custom_gradient(fx, 2.0 * x, x)  # noqa: E731
    got = {"plain": fn, "jit": jax.jit(fn), "vmap": lambda x: jax.vmap(fn)(x[None])[0]}[wrap](x)
    same = bits(got) == bits(fx)
    flushed = (np.asarray(got) == 0) & (np.asarray(fx) != 0) & (np.abs(np.asarray(fx)) < 1.2e-38)
    assert np.all(same | flushed), (got, fx)  # XLA's CPU kernels may flush a subnormal, as any arithmetic op
    assert bits(got)[0] == bits(fx)[0] and bits(got)[3] == bits(fx)[3]  # −0.0 and NaN exactly


def test_an_infinite_gx_gives_an_infinite_derivative_in_both_modes():
    fn = lambda x: sgm.custom_gradient(jnp.sqrt(x), 0.5 / jnp.sqrt(x), x)  # noqa: E731
    assert float(jax.grad(fn)(0.0)) == np.inf
    assert float(jax.jvp(fn, (0.0,), (1.0,))[1]) == np.inf
    assert float(fn(0.0)) == 0.0


def test_an_infinite_or_nan_element_of_x_keeps_the_value_and_gets_the_declared_derivative():
    """gx reaches x = ±inf and NaN as any other element: the truth is autodiff of x ↦ gx·x (a stopped gx)."""
    x = jnp.array([jnp.inf, 1.0, jnp.nan, -jnp.inf])
    gx = lambda x: jnp.where(jnp.isnan(x), -2.0, jnp.where(x == -jnp.inf, jnp.inf, 3.0))  # noqa: E731
    fn = lambda x: sgm.custom_gradient(jnp.ones_like(x), gx(x), x)  # noqa: E731
    np.testing.assert_array_equal(fn(x), [1.0, 1.0, 1.0, 1.0])
    for name, derivative in TRANSFORMS.items():
        np.testing.assert_array_equal(derivative(fn, x), derivative(lambda x: jax.lax.stop_gradient(gx(x)) * x, x),
                                      err_msg=name)
        np.testing.assert_array_equal(derivative(fn, x), [3.0, 3.0, -2.0, np.inf], err_msg=name)


def test_log1pexp_at_inf_and_nan_has_the_declared_sigmoid():
    """The issue's case: gx = sigmoid(x) is 1 at +inf, 0 at −inf and NaN at NaN, and passes there."""
    f = lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)  # noqa: E731
    x = jnp.array([1.0, jnp.nan, jnp.inf, -jnp.inf])
    want = np.array([1 / (1 + np.exp(-1.0)), np.nan, 1.0, 0.0], np.float32)
    for name, derivative in TRANSFORMS.items():
        np.testing.assert_allclose(derivative(f, x), want, rtol=1e-6, err_msg=name)
    np.testing.assert_array_equal(f(x), jnp.logaddexp(x, 0.0))


A = jnp.array([[1.0, 2.0, 0.5], [-3.0, 0.25, 4.0]])


@pytest.mark.parametrize("jacobian", [jax.jacfwd, jax.jacrev])
def test_a_full_jacobian_gx(jacobian):
    fn = lambda x: sgm.custom_gradient(A @ x, A, x)  # noqa: E731
    np.testing.assert_array_equal(jacobian(fn)(jnp.array([1.0, -1.0, 2.0])), A)


def test_a_scalar_fx_with_its_gradient():
    fn = lambda x: sgm.custom_gradient(jnp.sum(x**2), 2.0 * x, x)  # noqa: E731
    x = jnp.array([1.0, -2.0, 3.0])
    np.testing.assert_array_equal(jax.grad(fn)(x), 2.0 * x)
    np.testing.assert_array_equal(jax.jvp(fn, (x,), (jnp.ones(3),))[1], 2.0 * jnp.sum(x))


def test_tfps_rule_for_a_gx_of_xs_shape_and_a_vector_fx():
    """fx of 3 elements, x of 2, gx of x's shape: the gradient of sum(h) is gx (tfp's rule)."""
    gx = jnp.array([5.0, -7.0])
    fn = lambda x: sgm.custom_gradient(jnp.ones(3) * jnp.sum(x), gx, x)  # noqa: E731
    np.testing.assert_allclose(jax.grad(_sum_of(fn))(jnp.array([1.0, 2.0])), gx, rtol=1e-6)


def test_elementwise_with_broadcasting_a_scalar_x_and_a_vector_fx():
    gx = jnp.array([1.0, 2.0, 3.0])
    fn = lambda x: sgm.custom_gradient(x * gx, gx, x)  # noqa: E731
    assert float(jax.grad(_sum_of(fn))(2.0)) == 6.0
    np.testing.assert_array_equal(jax.jacfwd(fn)(2.0), gx)


def test_pytrees_of_x_with_a_none_leaf():
    def fn(params):
        fx = params["a"] * params["b"][0]
        return sgm.custom_gradient(fx, {"a": 3.0 * jnp.ones(2), "b": (None,)}, params)

    params = {"a": jnp.array([1.0, 2.0]), "b": (jnp.array(4.0),)}
    got = jax.grad(_sum_of(fn))(params)
    np.testing.assert_array_equal(got["a"], [3.0, 3.0])
    assert float(got["b"][0]) == 0.0  # None: no gradient



def test_float64_against_finite_differences(float64):
    x = jnp.linspace(-2.0, 2.0, 7, dtype=jnp.float64)
    fn = lambda x: sgm.custom_gradient(jnp.sin(x) * jnp.exp(x), (jnp.cos(x) + jnp.sin(x)) * jnp.exp(x), x)  # noqa: E731
    f, xs, h = lambda v: np.sin(v) * np.exp(v), np.asarray(x, np.float64), 1e-6
    exact = (f(xs + h) - f(xs - h)) / (2 * h)  # central differences in NumPy
    assert jax.grad(_sum_of(fn))(x).dtype == jnp.float64
    np.testing.assert_allclose(jax.grad(_sum_of(fn))(x), exact, rtol=1e-8)
    np.testing.assert_allclose(jax.jvp(fn, (x,), (jnp.ones_like(x),))[1], exact, rtol=1e-8)


def test_complex_values_follow_jaxs_convention():
    """exp with its own derivative: jvp and vjp equal JAX's autodiff of exp, complex tangents and cotangents."""
    z = jnp.array([0.3 + 1.0j, -1.0 + 0.5j])
    t = jnp.array([1.0 - 2.0j, 0.5 + 0.25j])
    fn = lambda z: sgm.custom_gradient(jnp.exp(z), jnp.exp(z), z)  # noqa: E731
    np.testing.assert_allclose(jax.jvp(fn, (z,), (t,))[1], jax.jvp(jnp.exp, (z,), (t,))[1], rtol=1e-6)
    np.testing.assert_allclose(jax.vjp(fn, z)[1](t)[0], jax.vjp(jnp.exp, z)[1](t)[0], rtol=1e-6)


def test_the_second_derivative_through_a_stopped_gx_is_zero():
    """The documented limit, as on TensorFlow: gx is held constant."""
    assert float(jax.grad(jax.grad(log1pexp))(0.5)) == 0.0
    np.testing.assert_array_equal(jax.hessian(_sum_of(log1pexp))(X[:3]), np.zeros([3, 3]))


# Each way to differentiate a scalar function of one scalar, once or twice, alone or in a loop or a checkpoint.
SCALAR_MODES = {
    "grad": jax.grad,
    "jvp": lambda fn: lambda x: jax.jvp(fn, (x,), (1.0,))[1],
    "jacfwd": jax.jacfwd,
    "hessian": jax.hessian,
    "vmap(grad)": lambda fn: lambda x: jax.vmap(jax.grad(fn))(jnp.full(2, x))[0],
    "jit(grad)": lambda fn: jax.jit(jax.grad(fn)),
    "grad(jit)": lambda fn: jax.grad(jax.jit(fn)),
    "grad(scan)": lambda fn: jax.grad(lambda x: jax.lax.scan(lambda c, _: (fn(c), None), x, None, length=1)[0]),
    "grad(fori_loop)": lambda fn: jax.grad(lambda x: jax.lax.fori_loop(0, 1, lambda _, c: fn(c), x)),
    "grad(checkpoint)": lambda fn: jax.grad(jax.checkpoint(fn)),
}


def _with_gx_unstopped(x):
    return sgm.custom_gradient(jax.lax.stop_gradient(jnp.sin(x)), jnp.cos(x), x, fx_gx_manually_stopped=True)


def _with_fx_unstopped(x):
    return sgm.custom_gradient(jnp.sin(x), jax.lax.stop_gradient(jnp.cos(x)), x, fx_gx_manually_stopped=True)


@pytest.mark.parametrize("mode", SCALAR_MODES)
def test_a_manually_stopped_gx_or_fx_that_moves_with_x_is_a_value_error_naming_it(mode):
    """Unrefused, a live gx doubles the second derivative (2·g′: the embedded g′ and gx's own) and a live fx the
    first; the promise is checked where x moves, in every mode."""
    for fn, named in ((_with_gx_unstopped, "the gradient for x moves with x"), (_with_fx_unstopped, "fx moves")):
        with pytest.raises(ValueError, match=named):
            SCALAR_MODES[mode](fn)(0.7)
    assert bits(_with_gx_unstopped(0.7)) == bits(jnp.sin(jnp.float32(0.7)))  # a value alone is not refused


def _x_stopped_by_hand(x, y):  # h = x·y, dh/dx = 2y by hand, dh/dy = x by autodiff through fx
    still = jax.lax.stop_gradient(x)
    return sgm.custom_gradient(still * y, 2 * y, x, fx_gx_manually_stopped=True)


@pytest.mark.parametrize("mode", SCALAR_MODES)
def test_a_manual_stop_kept_is_embedded_with_its_mixed_second_derivative(mode):
    """fx and gx stopped w.r.t. x and live in y: dh/dx = 2y (x = 3, y = 5: 10) in every mode, and d²h/dydx = 2."""
    first = SCALAR_MODES[mode](lambda x: _x_stopped_by_hand(x, 5.0))(3.0)
    expected = 0.0 if mode == "hessian" else 10.0  # the hessian w.r.t. x: gx does not move with x
    assert float(first) == expected
    mixed = jax.grad(lambda y: jax.grad(_x_stopped_by_hand)(3.0, y))(5.0)
    assert float(mixed) == 2.0


def test_x_and_y_differentiated_together_under_a_manual_stop_is_refused_and_partial_custom_gradient_is_not():
    """The documented limit: JAX shows that fx moves in x's jvp, not through what; partial_custom_gradient stops
    x itself, and gives the truth (∂h/∂x = 2y = 10, ∂h/∂y = x = 3; Hessian [[0, 2], [2, 0]])."""
    with pytest.raises(ValueError, match="fx moves with x"):
        jax.grad(_x_stopped_by_hand, argnums=(0, 1))(3.0, 5.0)

    def h(x, y):
        return sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)

    assert [float(d) for d in jax.grad(h, argnums=(0, 1))(3.0, 5.0)] == [10.0, 3.0]
    np.testing.assert_array_equal(jax.hessian(h, argnums=(0, 1))(3.0, 5.0), [[0.0, 2.0], [2.0, 0.0]])


def test_an_integer_x_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"x must be floating or complex.*int32"):
        sgm.custom_gradient(jnp.ones(2), jnp.ones(2), jnp.array([1, 2], jnp.int32))


def test_a_complex_gx_for_a_real_fx_is_a_type_error():
    with pytest.raises(TypeError, match="real function has no complex derivative"):
        sgm.custom_gradient(jnp.ones(2), jnp.ones(2, jnp.complex64), jnp.ones(2))


def test_a_gx_of_no_layout_is_a_value_error_naming_the_shapes():
    with pytest.raises(ValueError, match=r"gradient for x fits no layout: fx has shape \(2,\), x has shape \(3,\) "
                                         r"and its gradient has shape \(4,\)"):
        sgm.custom_gradient(jnp.ones(2), jnp.ones(4), jnp.ones(3))


def test_gx_of_another_structure_is_a_value_error():
    with pytest.raises(ValueError, match="gx must have the structure of x"):
        sgm.custom_gradient(jnp.ones(2), {"a": jnp.ones(2)}, {"b": jnp.ones(2)})


def test_fx_without_gx_and_x_is_a_type_error_naming_both_forms():
    with pytest.raises(TypeError, match=r"without gx and x.*stop_gradient"):
        sgm.custom_gradient(jnp.ones(2))
    with pytest.raises(TypeError, match="without x"):
        sgm.custom_gradient(jnp.ones(2), jnp.ones(2))


def test_sharded_arrays_over_two_host_devices():
    """A batch sharded over two CPU devices: the identity form's and the helpers' derivatives as on one device, the
    outputs sharded alike."""
    run_on_two_host_devices("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        import stopgrad_math.jax as sgm
        mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
        x = jax.device_put(jnp.linspace(-5.0, 100.0, 8), NamedSharding(mesh, PartitionSpec("batch")))
        f = lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
        value, grad = jax.jit(jax.value_and_grad(lambda x: f(x).sum()))(x)
        tangent = jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1])(x)
        assert len(x.sharding.device_set) == 2 and len(tangent.sharding.device_set) == 2
        np.testing.assert_allclose(grad, jax.nn.sigmoid(np.linspace(-5.0, 100.0, 8)), rtol=1e-6)
        np.testing.assert_allclose(tangent, grad, rtol=1e-6)
        helpers = {  # each helper on the sharded batch, with its derivative (stop_gradient: a constant 0, unsharded)
            "scale_gradient": (lambda x: sgm.scale_gradient(x, 0.1), np.float32(0.1)),
            "straight_through": (lambda x: sgm.straight_through(jnp.round(x), x), 1.0),
            "stop_gradient_where": (lambda x: sgm.stop_gradient_where(x, x > 50.0), np.linspace(-5, 100, 8) <= 50),
            "magic_box": (lambda x: sgm.magic_box(2.0 * x), 2.0),
            "reverse_gradient": (lambda x: sgm.reverse_gradient(x, 2.0), -2.0),
            "zero_with_gradient": (sgm.zero_with_gradient, 1.0),
            "partial_custom_gradient": (lambda x: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y,
                                                                              x, 3.0), 6.0),
        }
        for name, (fn, want) in helpers.items():
            got = jax.jit(jax.grad(lambda x: fn(x).sum()))(x)
            assert len(got.sharding.device_set) == 2, name
            np.testing.assert_allclose(got, np.broadcast_to(want, (8,)), rtol=1e-6, err_msg=name)
        print("ok", len(jax.devices()))
    """)


# ---------------------------------------------------------------- hypothesis: shapes, dtypes, awkward values

from hypothesis import given, settings  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(elementwise_cases())
def test_the_value_is_fx_and_the_derivative_gx_for_any_shape_dtype_and_value(case):
    fx, gx, x = case
    fn = jax.jit(lambda x: sgm.custom_gradient(fx, gx, x))
    value = np.asarray(fn(x))
    flushed = (value == 0) & (np.signbit(value) == np.signbit(fx)) & (np.abs(fx.astype(np.float64)) < 1e-4)
    assert np.all((bits(value) == bits(fx)) | flushed | (np.isnan(value) & np.isnan(fx.astype(np.float64))))
    tangent = np.asarray(jax.jvp(fn, (x,), (np.ones_like(x),))[1]).astype(np.float64)
    cotangent = np.asarray(jax.vjp(fn, x)[1](np.ones_like(fx))[0]).astype(np.float64)
    want = gx.astype(np.float64)  # at every element of x, ±inf and NaN included: the declared gx
    np.testing.assert_array_equal(tangent, want)
    np.testing.assert_array_equal(cotangent, want)
    truth = lambda x: gx * x  # noqa: E731  (autodiff of a product with a constant gx: inf·0 = NaN off the diagonal)
    np.testing.assert_array_equal(np.float64(jax.jacfwd(fn)(x)), np.float64(jax.jacfwd(truth)(x)))
    np.testing.assert_array_equal(np.float64(jax.jacrev(fn)(x)), np.float64(jax.jacrev(truth)(x)))
