"""Whether the tape's transpose of a grad_fn is the whole of it: the ops read while tracing, and the eager
dot-product test."""

import numpy as np
import pytest
import tensorflow as tf

from stopgrad_math.transposition import dot_product_mismatch, untransposable_ops


def _blocking(grad_fn, extra=lambda d: None):
    """The untransposable ops of grad_fn(d), read off its graph as the decorator reads them."""
    found = []

    @tf.function
    def trace(d):
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        result = grad_fn(d)
        extra(d)
        found.append(untransposable_ops(graph.get_operations()[first:], [d], [result]))
        return result

    trace.get_concrete_function(tf.TensorSpec([3]))
    return found[0]


@pytest.mark.parametrize(
    "grad_fn, blocking",
    [
        (lambda d: 3 * d, []),
        (lambda d: 2 * d + tf.stop_gradient(d), ["StopGradient"]),
        (lambda d: d + tf.numpy_function(lambda a: 2 * a, [d], tf.float32, stateful=False), ["PyFuncStateless"]),
        (lambda d: d + tf.zeros_like(d) + tf.cast(tf.size(d), tf.float32), []),  # nothing of J is lost there
        (lambda d: 2 * d + tf.stop_gradient(tf.ones([3])), []),  # stopped, but not on the upstream's path
        (lambda d: tf.raw_ops.RandomGammaGrad(alpha=d, sample=d), ["RandomGammaGrad"]),  # no gradient at all
    ],
    ids=["linear", "stop_gradient", "numpy_function", "value-free ops", "off the path", "no gradient"],
)
def test_the_ops_that_take_the_upstream_where_no_tape_follows(grad_fn, blocking):
    assert _blocking(grad_fn) == blocking


def test_a_blocking_op_that_does_not_reach_the_results_is_not_counted():
    assert _blocking(lambda d: 3 * d, extra=lambda d: tf.stop_gradient(d) * 2) == []


def test_the_dot_product_test():
    rng = np.random.default_rng(0)
    a, b, jacobian = rng.normal(size=4), rng.normal(size=3), rng.normal(size=(3, 4))
    transpose, direct = jacobian @ a, jacobian.T @ b  # T(a) = J·a, grad_fn(b) = Jᵀ·b
    assert not dot_product_mismatch([(transpose, b)], [(a, direct)], tf.float64)
    assert dot_product_mismatch([(transpose / 3, b)], [(a, direct)], tf.float64)  # a third of it seen
    assert not dot_product_mismatch([(transpose * np.inf, b)], [(a, direct)], tf.float64)  # cannot be judged
    assert not dot_product_mismatch([(transpose.astype(np.float32), b)], [(a, direct)], tf.float32)  # rounding
