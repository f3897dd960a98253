"""check_gradient and assert_gradient: accept right gradients, reject wrong ones, say where."""

import numpy as np
import pytest
import tensorflow as tf

from stopgrad_math import assert_gradient, check_gradient, custom_gradient


def log1pexp_with(gradient_factor):
    def log1pexp(x):
        return custom_gradient(tf.math.softplus(x), gradient_factor * tf.math.sigmoid(x), x)

    return log1pexp


POINTS = tf.constant([-5.0, -1.0, 0.0, 2.0, 30.0])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_accepts_the_right_log1pexp_gradient(dtype):
    report = check_gradient(log1pexp_with(1.0), tf.cast(POINTS, dtype))
    assert report.passed, str(report)
    assert [row.mode for row in report.rows] == ["reverse", "forward"]
    assert all(row.checked == 5 and row.skipped == 0 and row.numeric_dtype == "float64" for row in report.rows)
    assert report.max_rel_error < (1e-3 if dtype == tf.float32 else 1e-8)


def test_rejects_a_gradient_off_by_a_factor_of_two_and_names_the_worst_element():
    report = check_gradient(log1pexp_with(2.0), POINTS)
    assert not report.passed
    for row in report.rows:  # values are derivatives of the randomly weighted sum of outputs
        assert not row.passed
        assert row.computed / row.numeric == pytest.approx(2.0, rel=1e-6)
        assert row.max_rel_error == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(AssertionError, match=r"gradient check failed:[\s\S]*NO"):
        assert_gradient(log1pexp_with(2.0), POINTS)


def test_a_point_where_the_value_overflows_is_skipped_and_the_rest_checked():
    @tf.custom_gradient
    def anchor(x):  # log(1 + exp(100)) is inf in float32
        e = tf.exp(x)
        return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))

    report = check_gradient(anchor, tf.constant([1.0, 100.0]))
    assert report.passed, str(report)  # the inf output gets weight 0; its 0·NaN forward derivative is skipped
    for row in report.rows:
        assert row.checked >= 1 and row.computed == pytest.approx(row.numeric, rel=1e-6) and row.numeric > 0.5


def test_points_where_fn_is_not_finite_are_skipped():
    def sqrt(x):
        return custom_gradient(tf.sqrt(x), 0.5 / tf.sqrt(x), x)

    points = tf.constant([0.0, 4.0, -1.0], tf.float64)
    report = check_gradient(sqrt, points)  # x = 0: no central difference; x = -1: output left out (0 = 0)
    assert report.passed, str(report)
    assert all(row.checked == 2 and row.skipped == 1 for row in report.rows)
    plain = check_gradient(tf.sqrt, points)  # autodiff's 0·NaN at x = -1 is skipped, not failed
    assert plain.passed and plain.rows[0].checked >= 1 and plain.rows[0].worst_index == (1,)
    wrong_sqrt = lambda x: custom_gradient(tf.sqrt(x), 1 / tf.sqrt(x), x)  # noqa: E731
    assert not check_gradient(wrong_sqrt, tf.constant([4.0, -1.0], tf.float64)).passed


def test_integer_arguments_and_several_outputs():
    def powers(x, n):
        return x ** tf.cast(n, x.dtype), {"twice": 2 * x}

    report = check_gradient(powers, tf.constant([1.5, -2.0], tf.float64), tf.constant(3))
    assert report.passed and {row.argument for row in report.rows} == {0}


def test_functions_of_float32_constants_fall_back_to_their_dtype():
    scale = tf.constant(3.0)
    report = check_gradient(lambda x: scale * x**2, tf.constant([1.0, 2.0]))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float32"}


def test_report_table_has_one_row_per_argument_and_mode():
    report = check_gradient(lambda x, y: x * y, tf.constant([1.0], tf.float64), tf.constant([2.0], tf.float64))
    table = str(report).splitlines()
    assert len(table) == 1 + 4 + 1 and "max abs err" in table[0]
    assert "derivative of ⟨w, fn(*args)⟩" in table[-1]  # computed and numeric are not fn's own derivatives


# ---------------------------------------------------------------- never a vacuous pass


def wrong_square(a):
    return custom_gradient(a * a, 3 * a, a)  # the true derivative is 2a


@pytest.mark.parametrize(
    "point", [[1.0, 2.0], (1.0, 2.0), 2.0, np.float32(2.0), np.float64(2.0), np.array([1.0, 2.0]), tf.Variable(2.0)],
    ids=["list", "tuple", "float", "numpy float32", "numpy float64", "numpy array", "variable"],
)
def test_a_wrong_gradient_fails_at_every_kind_of_point(point):
    report = check_gradient(wrong_square, point)
    assert not report.passed and sum(row.checked for row in report.rows) > 0
    assert check_gradient(lambda a: custom_gradient(a * a, 2 * a, a), point).passed
    with pytest.raises(AssertionError, match="gradient check failed"):
        assert_gradient(wrong_square, point)


@pytest.mark.parametrize("args", [(tf.constant([1, 2]),), (tf.zeros([0]),), (3,)], ids=["integer", "empty", "int"])
def test_a_report_with_nothing_checked_never_passes(args):
    report = check_gradient(lambda a: a * a, *args)
    assert not report.passed
    assert sum(row.checked for row in report.rows) == 0


@pytest.mark.parametrize("step", [0, -1e-3, float("nan"), float("inf"), "1e-3"])
def test_a_step_that_is_no_positive_finite_number_is_a_value_error(step):
    with pytest.raises(ValueError, match="check_gradient's step must be a finite number above 0"):
        check_gradient(lambda a: a * a, tf.constant([1.0]), step=step)


def test_complex_arguments_are_refused_not_skipped():
    with pytest.raises(TypeError, match="real and imaginary parts"):
        check_gradient(lambda z: z * z, tf.constant([1.0 + 1j]))


def test_inside_tf_function_it_says_it_runs_eagerly():
    """It was NotImplementedError: Cannot convert a symbolic tf.Tensor to a numpy array."""
    @tf.function
    def traced(x):
        return check_gradient(tf.math.softplus, x).passed

    with pytest.raises(RuntimeError, match=r"check_gradient runs eagerly.*outside tf\.function"):
        traced(tf.constant([1.0]))
    assert check_gradient(tf.function(tf.math.softplus), tf.constant([1.0])).passed  # fn may be a tf.function


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)])
def test_a_function_computing_in_float32_from_a_float64_argument_is_checked_at_float32(scale, passes):
    """Its graph computes in float32, so the differences take float32's step and tolerance; the gradient 10% off
    still fails. The truth is the closed form σ(x)."""
    def in_float32(x):
        value = tf.cast(tf.math.softplus(tf.cast(x, tf.float32)), tf.float64)
        return custom_gradient(value, scale * tf.math.sigmoid(x), x)

    report = check_gradient(in_float32, tf.constant([-3.0, 0.5, 4.0], tf.float64))
    assert report.passed == passes
    assert {row.numeric_dtype for row in report.rows} == {"float32"}
