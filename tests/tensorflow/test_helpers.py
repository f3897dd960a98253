"""The partial-stop helpers and estimators against their definitions, in every mode."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, assert_value_exact, bits, float32_exact, in_mode, jvp, vjp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stopgrad_math import (
    magic_box,
    partial_custom_gradient,
    reverse_gradient,
    scale_gradient,
    stop_gradient,
    stop_gradient_where,
    straight_through,
    zero_with_gradient,
)

AWKWARD = st.one_of(st.sampled_from(float32_exact([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e38, 0.5, 2.5])),
                    st.floats(width=32))
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)


@st.composite
def value_and_mask(draw):
    shape = draw(SHAPES)
    x = draw(hnp.arrays(np.float32, shape, elements=AWKWARD))
    mask = draw(hnp.arrays(np.bool_, shape))
    return x, mask


def under_tape(fn):
    """fn(x, ...) evaluated while a tape watches x, so that the identity is built."""

    def run(x, *rest):
        with tf.GradientTape() as tape:
            tape.watch(x)
            return fn(x, *rest)

    return run


# ---------------------------------------------------------------- stop_gradient


Pair = collections.namedtuple("Pair", ["a", "b"])


def test_stop_gradient_over_every_kind_of_structure():
    x = tf.constant([1.0, 2.0])
    v = tf.Variable(3.0)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        out = stop_gradient({"pair": Pair(x, [v, 2.0]), "array": np.ones(2, np.float32), "none": None})
        total = tf.reduce_sum(out["pair"].a) + out["pair"].b[0] + out["pair"].b[1] + tf.reduce_sum(out["array"])
    assert isinstance(out["pair"], Pair) and out["none"] is None
    assert tape.gradient(total, x) is None and tape.gradient(total, v) is None
    np.testing.assert_array_equal(out["pair"].a, x)
    assert float(total) == 3.0 + 3.0 + 2.0 + 2.0


@pytest.mark.parametrize("mode", MODES)
def test_stop_gradient_cuts_reverse_and_forward_mode_for_every_kind_of_leaf(mode):
    def run(x):
        with tf.GradientTape() as tape, tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, 10.0])) as accumulator:
            tape.watch(x)
            ragged = tf.RaggedTensor.from_row_lengths(x * 3.0, [1, 1])
            out = stop_gradient({"x": x * 2.0, "ragged": ragged, "count": tf.size(x)})
            total = tf.reduce_sum(out["x"]) + tf.reduce_sum(out["ragged"]) + 5.0 * x[0]  # connected by x[0] alone
        return total, tape.gradient(total, x), accumulator.jvp(total), out["count"]

    total, gradient, tangent, count = in_mode(run, mode)(tf.constant([1.0, 2.0]))
    assert float(total) == 2.0 + 4.0 + 3.0 + 6.0 + 5.0 and int(count) == 2
    np.testing.assert_array_equal(gradient, [5.0, 0.0])
    assert float(tangent) == 5.0


# ---------------------------------------------------------------- stop_gradient_where


@pytest.mark.parametrize("mode", MODES)
@given(case=value_and_mask())
def test_stop_gradient_where_value_exact_gradient_masked(mode, case):
    x, mask = (tf.constant(c) for c in case)
    upstream = tf.ones_like(x) * 2.0

    def run(x, mask, w):
        return stop_gradient_where(x, mask), vjp(lambda x: stop_gradient_where(x, mask), x, w), jvp(
            lambda x: stop_gradient_where(x, mask), x, w
        )

    value, grad, tangent = in_mode(run, mode)(x, mask, upstream)
    np.testing.assert_array_equal(bits(value.numpy()), bits(x.numpy()))  # a select copies bits
    np.testing.assert_array_equal(grad, np.where(case[1], 0.0, 2.0))
    np.testing.assert_array_equal(tangent, np.where(case[1], 0.0, 2.0))


def test_stop_gradient_where_broadcasts_mask_and_rejects_bad_shapes():
    x = tf.ones([2, 3])
    np.testing.assert_array_equal(vjp(lambda x: stop_gradient_where(x, [True, False, True]), x), [[0, 1, 0]] * 2)
    with pytest.raises(ValueError, match=r"mask of shape \(4,\)"):
        stop_gradient_where(x, [True] * 4)


# ---------------------------------------------------------------- straight_through


@pytest.mark.parametrize("mode", MODES)
@given(x=hnp.arrays(np.float32, SHAPES, elements=AWKWARD))
def test_straight_through_value_is_forward_exactly_gradient_is_backward(mode, x):
    x = tf.constant(x)
    w = tf.fill(tf.shape(x), 3.0)

    def run(x, w):
        def estimator(x):
            return straight_through(tf.round(x), 0.5 * x)

        return under_tape(estimator)(x), vjp(estimator, x, w), jvp(estimator, x, w)

    value, grad, tangent = in_mode(run, mode)(x, w)
    assert_value_exact(value.numpy(), tf.round(x).numpy())
    np.testing.assert_array_equal(grad, np.full(x.shape, 1.5))  # d(0.5·x)·3 at every x, inf and NaN too
    # Forward mode: backward's own tangent as TensorFlow computes it, whose rule for a product can give NaN
    # where the other factor (here x) is inf or NaN (the truth is 1.5 there too): 0.5·x's limit, not the
    # identity's (docs/tensorflow.md). 1.5 at every finite x; 1.5 or NaN at the others, never another number.
    tangent, finite = np.asarray(tangent), np.isfinite(x.numpy())
    assert np.all((tangent == 1.5) | (np.isnan(tangent) & ~finite)), (x, tangent)


def test_straight_through_is_not_the_rounding_formula():
    x = tf.constant([1e8, 0.1], tf.float32)
    forward = tf.constant([3.0, 0.7], tf.float32)
    naive = x + tf.stop_gradient(forward - x)  # what people write: 1e8 + (3 - 1e8) rounds
    assert naive.numpy()[0] != 3.0
    np.testing.assert_array_equal(under_tape(lambda x: straight_through(forward, x))(x), forward)


def test_straight_through_structures_and_shape_errors():
    x = {"a": tf.constant([0.4]), "b": tf.constant(1.6)}
    grads = vjp(lambda x: straight_through(tf.nest.map_structure(tf.round, x), x), x)
    assert float(grads["b"]) == 1.0 and grads["a"].numpy().tolist() == [1.0]
    with pytest.raises(ValueError, match=r"backward of shape \(3,\)"):
        straight_through(tf.ones([2]), tf.ones([3]))


# ---------------------------------------------------------------- scale_gradient, reverse_gradient


@pytest.mark.parametrize("mode", MODES)
@given(x=hnp.arrays(np.float32, SHAPES, elements=AWKWARD), scale=st.sampled_from([0.0, -2.0, 0.25, 3.0]))
def test_scale_and_reverse_gradient(mode, x, scale):
    x = tf.constant(x)
    w = tf.fill(tf.shape(x), 2.0)

    def run(x, w):
        return (
            under_tape(lambda x: scale_gradient(x, scale))(x),
            vjp(lambda x: scale_gradient(x, scale), x, w),
            jvp(lambda x: reverse_gradient(x, scale), x, w),
        )

    value, grad, reversed_tangent = in_mode(run, mode)(x, w)
    assert_value_exact(value.numpy(), x.numpy())
    np.testing.assert_array_equal(grad, np.full(x.shape, 2.0 * scale))  # at every x, inf and NaN too
    np.testing.assert_array_equal(reversed_tangent, np.full(x.shape, -2.0 * scale))


@pytest.mark.parametrize("scale", [tf.constant(True), tf.constant("text"), tf.constant(1j)])
def test_a_tensor_scale_that_is_no_real_number_is_refused_naming_the_function(scale):
    """reverse_gradient negated a bool tensor scale first: TensorFlow's raw kernel error, naming nothing."""
    for function in (scale_gradient, reverse_gradient):
        with pytest.raises(TypeError, match=rf"{function.__name__}'s scale must be a floating or integer tensor"):
            function(tf.constant([1.0, 2.0]), scale)


def test_scale_gradient_with_a_variable_schedule_broadcast_per_row(mode):
    schedule = tf.Variable([[1.0], [0.5]])
    x = tf.ones([2, 3])

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = scale_gradient(x, schedule)
        return tape.gradient(y, [x, schedule])

    step = in_mode(grads, mode)
    dx, dschedule = step(x)
    np.testing.assert_array_equal(dx, [[1.0] * 3, [0.5] * 3])
    assert dschedule is None
    schedule.assign([[0.0], [2.0]])
    np.testing.assert_array_equal(step(x)[0], [[0.0] * 3, [2.0] * 3])


def test_scale_gradient_rejects_a_scale_that_does_not_broadcast():
    with pytest.raises(ValueError, match=r"scale of shape \(3,\) does not broadcast to x of shape \(2,\)"):
        scale_gradient(tf.ones([2]), tf.ones([3]))
    with pytest.raises(ValueError, match="does not broadcast"):
        scale_gradient(tf.ones([2]), tf.ones([2, 2]))  # never read as a Jacobian


# ---------------------------------------------------------------- magic_box


def test_magic_box_values_and_derivatives_of_every_order(mode):
    def derivatives(theta):
        with tf.GradientTape() as third:
            third.watch(theta)
            with tf.GradientTape() as second:
                second.watch(theta)
                with tf.GradientTape() as first:
                    first.watch(theta)
                    box = magic_box(theta**2)
                d1 = first.gradient(box, theta)
            d2 = second.gradient(d1, theta)
        return box, d1, d2, third.gradient(d2, theta)

    theta = tf.constant(0.3, tf.float64)
    box, d1, d2, d3 = in_mode(derivatives, mode)(theta)
    t = 0.3  # derivatives of exp(θ² − stop(θ²)) at the point: 2t, (2t)² + 2, (2t)³ + 12t
    assert box.numpy() == 1.0
    np.testing.assert_allclose([d1, d2, d3], [2 * t, (2 * t) ** 2 + 2, (2 * t) ** 3 + 12 * t], rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@given(tau=hnp.arrays(np.float32, SHAPES, elements=AWKWARD))
def test_magic_box_is_exactly_one_whatever_tau_holds(mode, tau):
    tau = tf.constant(tau)
    value, tangent = in_mode(lambda t: (under_tape(magic_box)(t), jvp(magic_box, t, tf.ones_like(t))), mode)(tau)
    np.testing.assert_array_equal(value, np.ones(tau.shape, np.float32))
    np.testing.assert_array_equal(tangent, np.ones(tau.shape, np.float32))  # dτ at every τ, inf and NaN too


def test_dice_score_function_estimate_matches_the_exact_gradient():
    # E_{z ~ Bernoulli(p)}[z] = p, so d/dθ of the expectation is dp/dθ.
    theta = tf.constant(0.4)
    z = tf.constant([1.0, 0.0, 1.0, 1.0, 0.0])
    with tf.GradientTape() as tape:
        tape.watch(theta)
        p = tf.sigmoid(theta)
        log_prob = z * tf.math.log(p) + (1 - z) * tf.math.log(1 - p)
        surrogate = tf.reduce_mean(magic_box(log_prob) * z)
    estimate = tape.gradient(surrogate, theta)
    p = tf.sigmoid(theta)
    # Per sample: z · d log q(z) / dθ = z · (z − p); averaged over the fixed samples.
    np.testing.assert_allclose(estimate, tf.reduce_mean(z * (z - p)), rtol=1e-6)


# ---------------------------------------------------------------- partial_custom_gradient


def test_partial_custom_gradient_first_and_mixed_second_derivatives(mode):
    def f(x, y):
        return tf.math.softplus(x * y)

    def g(x, y):  # exact dh/dx
        return y * tf.sigmoid(x * y)

    def derivatives(fn, x, y):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([x, y])
            with tf.GradientTape() as inner:
                inner.watch([x, y])
                h = fn(x, y)
            dx, dy = inner.gradient(h, [x, y])
        return [h, dx, dy, outer.gradient(dx, y), outer.gradient(dy, x), outer.gradient(dy, y)]

    x, y = tf.constant([0.5, 80.0], tf.float64), tf.constant([1.5, 2.0], tf.float64)
    ours = in_mode(lambda x, y: derivatives(lambda x, y: partial_custom_gradient(f, g, x, y), x, y), mode)(x, y)
    truth = derivatives(f, x, y)
    for a, b in zip(ours, truth, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_partial_custom_gradient_where_autodiff_of_f_is_nan():
    def f(x, y):
        return tf.math.log(1 + tf.exp(x)) * y

    def g(x, y):
        return tf.sigmoid(x) * y

    x, y = tf.constant(100.0), tf.constant(2.0)
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        h = partial_custom_gradient(lambda x, y: tf.math.softplus(x) * y, g, x, y)
    dx, dy = tape.gradient(h, [x, y])
    assert (float(h), float(dx), float(dy)) == (200.0, 2.0, 100.0)
    assert np.isnan(vjp(lambda x: f(x, y), x).numpy())  # what it replaces


# ---------------------------------------------------------------- bad inputs named


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: zero_with_gradient(tf.constant([1, 2])), r"zero_with_gradient's x must be a floating or .*int32"),
        (lambda: magic_box(tf.constant([1, 2])), r"magic_box's tau must be a floating .*int32"),
        (lambda: magic_box(None), r"magic_box's tau must be a tensor or convertible to one"),
        (lambda: straight_through(tf.constant([1, 2]), tf.constant([1.0, 2.0])), r"straight_through's forward .*int32"),
        (lambda: straight_through(tf.constant([1.0]), tf.constant([1])), r"straight_through's backward .*int32"),
        (lambda: stop_gradient_where(tf.constant([1.0, 2.0]), tf.constant([1, 0])), r"mask must be a bool.*int32"),
        (lambda: stop_gradient_where(tf.constant([1.0, 2.0]), [0.5, 0.0]), r"mask must be a bool"),
        (lambda: stop_gradient_where(tf.constant([1.0, 2.0]), np.array([0.5, 0.0])), r"mask must be a bool.*float64"),
        (lambda: scale_gradient(tf.constant([1.0]), np.complex128(2 + 1j)), r"scale must be a floating or integer"),
        (lambda: scale_gradient(tf.constant([1.0]), "2"), r"scale_gradient's scale must be a floating or integer"),
        (lambda: scale_gradient(tf.constant([True]), 2.0), r"scale_gradient's x must be a floating"),
    ],
)
def test_helpers_name_what_they_need(call, words):
    with pytest.raises(TypeError, match=words):
        call()


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_integer_scales_and_exact_negation(dtype):
    x = tf.constant([1.0, 2.0], dtype)
    np.testing.assert_array_equal(vjp(lambda x: reverse_gradient(x, 2), x), [-2.0, -2.0])
    np.testing.assert_array_equal(vjp(lambda x: scale_gradient(x, tf.constant(3)), x), [3.0, 3.0])
    got = vjp(lambda x: reverse_gradient(x, 0.1), x).numpy()
    np.testing.assert_array_equal(got, np.full(2, -0.1, dtype.as_numpy_dtype))  # 0.1 in x's dtype, not float32's


def test_none_leaves_are_skipped_as_stop_gradient_skips_them():
    x = tf.constant([1.0, 2.0])
    for helper, scale in ((scale_gradient, 0.5), (reverse_gradient, 0.5)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = helper({"a": x, "b": None}, scale)
        assert out["b"] is None
        sign = 1.0 if helper is scale_gradient else -1.0
        np.testing.assert_array_equal(tape.gradient(out["a"], x), [sign * 0.5] * 2)
