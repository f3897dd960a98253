"""The route: the ops of grad_fn on the upstream's path, read into every body they call, and the route they give."""

import numpy as np
import pytest
import tensorflow as tf

from stopgrad_math.tensorflow.transposition import (
    Route,
    choose_route,
    dot_product_mismatch,
    findings,
    opaque_reason,
)

inner = tf.function(lambda a: 2.0 * tf.stop_gradient(a))


def _found(grad_fn, extra=lambda d: None):
    """The findings of grad_fn(d) as (op, kind) pairs."""
    return sorted((f.op, f.verdict.kind.name) for f in _findings_of(grad_fn, extra))


@pytest.mark.parametrize(
    "grad_fn, expected",
    [
        (lambda d: 3 * d, []),
        (lambda d: 2 * d + tf.stop_gradient(d), [("StopGradient", "OPAQUE")]),
        (lambda d: d + tf.numpy_function(lambda a: 2 * a, [d], tf.float32, stateful=False),
         [("PyFuncStateless", "OPAQUE")]),
        (lambda d: tf.reshape(d, tf.shape(d)) + tf.zeros_like(d), []),  # nothing of d passes through Shape
        (lambda d: 2 * d + tf.stop_gradient(tf.zeros([3])), []),  # stopped, but not on the upstream's path
        (lambda d: d + tf.cond(tf.constant(True), lambda: tf.stop_gradient(d), lambda: d),
         [("StopGradient", "OPAQUE")]),  # found in the branch
        (lambda d: d + inner(d), [("StopGradient", "OPAQUE")]),  # found in a nested tf.function
        (lambda d: tf.cond(tf.reduce_sum(d) > 0, lambda: d, lambda: -d),
         [("Greater", "NONLINEAR"), ("StatelessIf", "NONLINEAR")]),
        (lambda d: tf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a + d), [0, tf.zeros_like(d)])[1], []),
        (lambda d: tf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a + d), [0, tf.ones_like(d)])[1],
         [("StatelessWhile", "NONLINEAR")]),  # starts from a non-zero constant: affine
        (lambda d: tf.while_loop(lambda i, a: tf.reduce_sum(a) < 9, lambda i, a: (i + 1, a + d),
                                 [0, tf.zeros_like(d)])[1], [("Less", "NONLINEAR"), ("StatelessWhile", "NONLINEAR")]),
        (lambda d: tf.ones([3]), [("a result made by Const", "NONLINEAR")]),  # constant, not zero: affine
        (lambda d: tf.zeros([3]), []),  # the zero map
    ],
    ids=["linear", "stop_gradient", "numpy_function", "value-free ops", "off the path", "stop inside tf.cond",
         "stop inside a nested tf.function", "cond on the upstream", "loop accumulating", "loop from a constant",
         "loop stopping by the upstream", "constant result", "zero result"],
)
def test_the_ops_on_the_upstreams_path_and_their_kinds(grad_fn, expected):
    assert _found(grad_fn) == sorted(expected)


def test_an_op_that_does_not_reach_the_results_is_not_counted():
    assert _found(lambda d: 3 * d, extra=lambda d: tf.nn.relu(tf.stop_gradient(d)) * 2) == []


def test_the_route_from_the_findings():
    assert choose_route([], one_element=False, small=False) is Route.TRANSPOSE
    opaque = _findings_of(lambda d: tf.stop_gradient(d))
    assert choose_route(opaque, one_element=True, small=False) is Route.ONE_ELEMENT  # grad_fn(1): no transpose
    assert choose_route(opaque, one_element=False, small=True) is Route.UNIT_UPSTREAMS
    assert choose_route(opaque, one_element=False, small=False) is Route.REVERSE_ONLY  # grad_fn(upstream) alone
    assert "StopGradient" in opaque_reason(opaque)
    nonlinear = _findings_of(lambda d: tf.nn.relu(d))
    for one_element in (True, False):  # refused by every route, whatever the size of y
        with pytest.raises(ValueError, match=r"Relu \(it clips or rectifies it\)"):
            choose_route(nonlinear, one_element=one_element, small=True)


def _findings_of(grad_fn, extra=lambda d: None):
    """The findings of grad_fn(d), read off its graph as the decorator reads them (``extra``: more ops on d)."""
    found = []

    @tf.function
    def trace(d):
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        result = grad_fn(d)
        extra(d)
        found.append(findings(graph.get_operations()[first:], [d], [result]))
        return result

    trace.get_concrete_function(tf.TensorSpec([3]))
    return found[0]


def test_the_dot_product_test_the_fallback_for_untraceable_grad_fns():
    rng = np.random.default_rng(0)
    a, b, jacobian = rng.normal(size=4), rng.normal(size=3), rng.normal(size=(3, 4))
    transpose, direct = jacobian @ a, jacobian.T @ b  # T(a) = J·a, grad_fn(b) = Jᵀ·b
    assert dot_product_mismatch([(transpose, b)], [(a, direct)], tf.float64) is None
    assert "sees only part" in dot_product_mismatch([(transpose / 3, b)], [(a, direct)], tf.float64)  # a third seen
    assert dot_product_mismatch([(transpose.astype(np.float32), b)], [(a, direct)], tf.float32) is None  # rounding
    # An infinite transpose compares nothing: never a pass (it was, before), so the decorator does not trust it.
    infinite = dot_product_mismatch([(transpose * np.inf, b)], [(a, direct * np.inf)], tf.float64)
    assert "not finite" in infinite
