"""stopgrad_math.jax.check_gradient: right derivatives pass, wrong ones fail, in float32 and float64."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

X = [-3.0, 0.0, 5.0]


def log1pexp(scale=1.0):
    return lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), scale * jax.nn.sigmoid(x), x)



def test_a_right_gradient_passes_in_float32_with_differences_in_float32():
    report = sgm.check_gradient(log1pexp(), jnp.array(X))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float32"}
    assert {row.mode for row in report.rows} == {"reverse", "forward"}


@pytest.mark.parametrize("scale", [1.005, 0.995, -1.0])
def test_a_gradient_wrong_by_half_a_percent_fails_in_both_modes(scale):
    report = sgm.check_gradient(log1pexp(scale), jnp.array(X))
    assert not report.passed and not any(row.passed for row in report.rows)
    with pytest.raises(AssertionError, match="gradient check failed"):
        sgm.assert_gradient(log1pexp(scale), jnp.array(X))


def test_float64_differences_where_jax_has_float64(float64):
    report = sgm.check_gradient(log1pexp(), jnp.array(X, jnp.float64))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float64"}
    assert report.max_rel_error < 1e-8
    assert not sgm.check_gradient(log1pexp(1.0 + 1e-5), jnp.array(X, jnp.float64)).passed


def test_a_nan_derivative_where_the_function_is_finite_fails():
    """sqrt with its derivative written NaN below x = 0.5: fails at 0.25, where the finite difference is finite."""
    fn = lambda x: sgm.custom_gradient(jnp.sqrt(x), jnp.where(x > 0.5, 0.5 / jnp.sqrt(x), jnp.nan), x)  # noqa: E731
    assert not sgm.check_gradient(fn, jnp.array([0.25, 4.0])).passed
    assert sgm.check_gradient(fn, jnp.array([1.0, 4.0])).passed


def test_several_arguments_and_outputs_and_a_non_floating_argument():
    fn = lambda a, b, n: (a * b, {"s": jnp.sin(a) * n})  # noqa: E731
    report = sgm.check_gradient(fn, jnp.array([0.5, 1.0]), jnp.array([2.0, -1.0]), 3)
    assert report.passed and sorted({row.argument for row in report.rows}) == [0, 1]


def test_nothing_to_check_never_passes_and_complex_is_refused():
    assert not sgm.check_gradient(lambda n: n * 2, 3).passed
    with pytest.raises(TypeError, match="real and imaginary parts"):
        sgm.check_gradient(jnp.exp, jnp.array([1.0 + 1.0j]))
    with pytest.raises(ValueError, match="step must be a finite number above 0"):
        sgm.check_gradient(jnp.sin, jnp.ones(2), step=0.0)


def test_arguments_are_pytrees_each_leaf_checked_and_named():
    report = sgm.check_gradient(lambda p, t: p["a"] * jnp.sin(p["b"]) + t[0] * t[1],
                                {"a": jnp.array(2.0), "b": jnp.array([0.1, 0.3])}, (jnp.ones(2), 3.0 * jnp.ones(2)))
    assert report.passed
    assert sorted({(row.argument, row.leaf) for row in report.rows}) == [(0, "['a']"), (0, "['b']"), (1, "[0]"),
                                                                         (1, "[1]")]
    assert "0['b']" in str(report)
    wrong = sgm.check_gradient(lambda t: sgm.custom_gradient(t[0] * t[1], 5.0 * t[1], t[0]), (2.0, 3.0))
    assert not wrong.passed  # a tuple is two leaves, not one stacked array: each leaf's wrong gradient is found
    assert sorted(row.leaf for row in wrong.rows if not row.passed) == ["[0]", "[0]", "[1]", "[1]"]


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)])
def test_a_function_computing_in_float32_from_a_float64_argument_is_checked_at_float32(float64, scale, passes):
    """Its jaxpr computes in float32, so the differences take float32's step and tolerance; the gradient 10% off
    still fails. The truth is the closed form σ(x)."""
    def in_float32(x):
        value = jnp.logaddexp(x.astype(jnp.float32), 0.0).astype(jnp.float64)
        return sgm.custom_gradient(value, scale * jax.nn.sigmoid(x), x)

    report = sgm.check_gradient(in_float32, jnp.array([-3.0, 0.5, 4.0], jnp.float64))
    assert report.passed == passes
    assert {row.numeric_dtype for row in report.rows} == {"float32"}
