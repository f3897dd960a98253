"""check_gradient over every custom gradient that the package's tests define, and TensorFlow's own checker beside it.

The functions whose custom gradient is meant to be the true derivative must
pass; the estimators, whose gradients differ from the derivative by design,
must be reported as differing.
"""

import pytest
import tensorflow as tf
from helpers import sibling

from stopgrad_math import (
    check_gradient,
    magic_box,
    partial_custom_gradient,
    reverse_gradient,
    scale_gradient,
    straight_through,
)

deco = sibling("test_decorator_form")
emb = sibling("test_identity_form")

X = tf.constant([-2.0, 0.3, 1.5])


def softplus_of_product(x, y):
    return tf.math.softplus(x * y)


def sigmoid_of_product_times_y(x, y):
    return y * tf.sigmoid(x * y)

TRUE_DERIVATIVES = {
    "identity form log1pexp": (emb.log1pexp, (X,)),
    "decorator log1pexp, TF signature": (deco.log1pexp_tf, (X,)),
    "decorator log1pexp, keras signature": (deco.log1pexp_keras, (X,)),
    "decorator log1pexp, torch signature": (deco.log1pexp_torch, (X,)),
    "decorator log1pexp, *upstreams": (deco.log1pexp_varargs, (X,)),
    "decorator matvec": (deco.matvec, (X,)),
    "decorator linear_poly (variables)": (deco.linear_poly, (X,)),
    "decorator power, keyword constant": (lambda x: deco.power(x, exponent=3.0), (X,)),
    "decorator order 2 sin(x)·x": (deco.sin_times_x, (X,)),
    "partial_custom_gradient": (
        lambda x, y: partial_custom_gradient(softplus_of_product, sigmoid_of_product_times_y, x, y),
        (X, tf.constant([1.0, 2.0, -0.5])),
    ),
}

ESTIMATORS = {
    "straight_through(round, x)": lambda x: straight_through(tf.round(x), x),
    "scale_gradient(x, 0.5)": lambda x: scale_gradient(x, 0.5),
    "reverse_gradient(x)": lambda x: reverse_gradient(x),
    "magic_box(x)": lambda x: magic_box(x),
}


@pytest.mark.parametrize("name", TRUE_DERIVATIVES)
def test_custom_gradients_meant_as_derivatives_pass(name):
    fn, args = TRUE_DERIVATIVES[name]
    report = check_gradient(fn, *args)
    assert report.passed, f"{name}\n{report}"


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimators_are_reported_as_differing_from_the_derivative(name):
    report = check_gradient(ESTIMATORS[name], tf.constant([0.2, 0.7], tf.float64))
    assert not report.passed and report.max_abs_error >= 0.5


def _tf_numerical_check(fn, args):
    """TensorFlow's own checker (tf.test.compute_gradient: its finite differences, not the library's), per
    argument: the largest difference between the tape's Jacobian and the numerical one."""
    errors = []
    for i in range(len(args)):
        def of_one(a, i=i):
            return fn(*args[:i], a, *args[i + 1:])

        theoretical, numerical = tf.test.compute_gradient(of_one, [args[i]], delta=1e-3)
        errors.append(max(float(abs(t - n).max()) for t, n in zip(theoretical, numerical, strict=True)))
    return max(errors)


@pytest.mark.parametrize("name", TRUE_DERIVATIVES)
def test_custom_gradients_meant_as_derivatives_agree_with_tensorflows_checker(name):
    fn, args = TRUE_DERIVATIVES[name]
    assert _tf_numerical_check(fn, args) < 2e-3, name  # float32 differences with a step of 1e-3: about 4e-4 at most


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimators_differ_by_tensorflows_checker_too(name):
    assert _tf_numerical_check(ESTIMATORS[name], (tf.constant([0.2, 0.7], tf.float64),)) >= 0.5, name
