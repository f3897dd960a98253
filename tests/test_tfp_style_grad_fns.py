"""Custom gradients as TFP writes them: grad_fns that call decorated functions, their own f among them.

The grad_fns run when f is called (the identity needs J then), so a recursion must end there: inside a grad_fn
of order 1 every value but the upstream is a constant, and a decorated call on constants returns its value
alone. Checked against autodiff of the closed forms in float64 and against tf.custom_gradient side by side.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, in_mode, jvp, vjp

from stopgrad_math import custom_gradient

TWO_OVER_ROOT_PI = 2 / math.sqrt(math.pi)


def _erfcx_parts(x):
    return tf.math.exp(x * x) * tf.math.erfc(x), lambda dy: dy * (2 * x * erfcx(x) - TWO_OVER_ROOT_PI)


erfcx = custom_gradient(_erfcx_parts)  # erfcx(x) = exp(x²)·erfc(x); erfcx' = 2x·erfcx(x) − 2/√π
erfcx_order_2 = custom_gradient(order=2)(
    lambda x: (tf.math.exp(x * x) * tf.math.erfc(x), lambda dy: dy * (2 * x * erfcx_order_2(x) - TWO_OVER_ROOT_PI))
)


@tf.custom_gradient
def anchor_erfcx(x):
    return tf.math.exp(x * x) * tf.math.erfc(x), lambda dy: dy * (2 * x * anchor_erfcx(x) - TWO_OVER_ROOT_PI)


def closed_form(x):
    return tf.math.exp(x * x) * tf.math.erfc(x)  # fine in float64 for |x| ≤ 3


X = tf.constant([-1.5, -0.2, 0.0, 0.7, 2.5], tf.float64)
UPSTREAM = tf.constant([1.0, -2.0, 0.5, 3.0, 0.25], tf.float64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("x", [X, X[3]], ids=["vector", "scalar"])
def test_erfcx_calling_itself_in_its_gradient(mode, x):
    upstream = UPSTREAM[: tf.size(x)] if x.shape.rank else UPSTREAM[0]
    tangent = -upstream

    def derivatives(x):
        return erfcx(x), vjp(erfcx, x, upstream), jvp(erfcx, x, tangent)

    value, gradient, forward = in_mode(derivatives, mode)(x)
    np.testing.assert_allclose(value, in_mode(closed_form, mode)(x), rtol=1e-15)  # XLA fuses it differently
    np.testing.assert_allclose(gradient, vjp(closed_form, x, upstream), rtol=1e-10)
    np.testing.assert_allclose(forward, jvp(closed_form, x, tangent), rtol=1e-10)
    np.testing.assert_allclose(gradient, vjp(anchor_erfcx, x, upstream), rtol=1e-12)  # side by side


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_function_that_only_computes_the_value(mode):
    np.testing.assert_array_equal(in_mode(erfcx, mode)(X), in_mode(closed_form, mode)(X))  # was a RecursionError


def test_erfcx_in_a_tf1_graph_with_tf_gradients():
    with tf.Graph().as_default():
        x = tf.constant(X.numpy())
        y = erfcx(x)
        (gradient,) = tf.gradients(y, x, grad_ys=tf.constant(UPSTREAM.numpy()))
        (want,) = tf.gradients(closed_form(x), x, grad_ys=tf.constant(UPSTREAM.numpy()))
        with tf.compat.v1.Session() as session:
            got, want = session.run([gradient, want])
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_order_2_erfcx_has_exact_second_derivatives_at_depth_two(mode):
    def hessian_diagonal(fn, x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(fn(x))
            gradient = inner.gradient(y, x)
        return gradient, outer.gradient(gradient, x)

    got = in_mode(lambda x: hessian_diagonal(erfcx_order_2, x), mode)(X)
    want = hessian_diagonal(closed_form, X)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9)


# A psum and a broadcast whose gradients are each other, as in TFP's distributed reductions.
@custom_gradient
def psum(x):
    return tf.reduce_sum(x), lambda dy: broadcast(dy, tf.shape(x))


@custom_gradient
def broadcast(s, shape):
    return tf.broadcast_to(s, shape), lambda dy: psum(dy)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_that_call_each_other(mode):
    w = tf.constant([[1.0, -2.0], [0.5, 4.0]], tf.float64)

    def loss(x):
        return tf.reduce_sum(w * broadcast(psum(x) ** 2, tf.shape(x)))

    def plain(x):
        return tf.reduce_sum(w * tf.broadcast_to(tf.reduce_sum(x) ** 2, tf.shape(x)))

    x = tf.constant([[0.3, -1.0], [2.0, 0.5]], tf.float64)
    got = in_mode(lambda x: vjp(loss, x), mode)(x)
    np.testing.assert_allclose(got, vjp(plain, x), rtol=1e-12)


@custom_gradient
def doubled(x):
    return 2 * x, lambda dy: halved_back(dy)


@custom_gradient
def halved_back(d):
    return 2 * d, lambda dy: doubled(dy)


def test_gradients_calling_each_other_on_the_upstream_without_end_raise_a_clear_error():
    x = tf.constant([1.0, 2.0])
    with pytest.raises(ValueError, match="8 deep"):
        vjp(doubled, x)
