"""A NaN or inf never changes a finite derivative (stopgrad_math, TensorFlow): the declared derivative reaches
every element, and a non-finite value cuts only the paths that go through it. Truths: reverse-mode autodiff of
the same formula and tf.custom_gradient with the same VJP; in forward mode the rule applied as written, in
NumPy (TensorFlow's own forward rule for a matmul multiplies the NaN by the zero tangent of the other factor)."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import in_mode
from non_finite_cases import CASES, CT, TANGENT_W, TANGENT_X, assert_same, tangent_as_written

import stopgrad_math as sgm


def plain(x, w):
    return tf.matmul(x, w, transpose_b=True)


def _mixing(x, w):
    return tf.matmul(x, w, transpose_b=True), lambda ct: (ct @ w, tf.transpose(ct) @ x)


ORDERS = {1: sgm.custom_gradient(_mixing), 2: sgm.custom_gradient(_mixing, order=2)}
anchor = tf.custom_gradient(_mixing)  # the same rule through TensorFlow's mechanism, right in reverse mode


def _gradient(f, x, w):
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = f(x, w)
    return tape.gradient(y, [x, w], output_gradients=tf.constant(CT))


def _jacobian(f, x, w):
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = f(x, w)
    return tape.jacobian(y, [x, w], experimental_use_pfor=True)


def _tangent(f, x, w, tangents):
    primals = [t for t, v in zip((x, w), tangents, strict=True) if v is not None]
    with tf.autodiff.ForwardAccumulator(primals, [tf.constant(v) for v in tangents if v is not None]) as acc:
        y = f(x, w)
    return [acc.jvp(y)]


def _tf1_gradients(f, x, w):
    with tf.Graph().as_default():
        xg, wg = tf.constant(x.numpy()), tf.constant(w.numpy())
        grads = tf.gradients(f(xg, wg), [xg, wg], grad_ys=tf.constant(CT))
        with tf.compat.v1.Session() as session:
            return session.run(grads)


REVERSE = {
    "gradient": lambda f, x, w: _gradient(f, x, w),
    "tf.function gradient": lambda f, x, w: in_mode(lambda x, w: _gradient(f, x, w), "function")(x, w),
    "XLA gradient": lambda f, x, w: in_mode(lambda x, w: _gradient(f, x, w), "xla")(x, w),
    "tape.jacobian": lambda f, x, w: in_mode(lambda x, w: _jacobian(f, x, w), "function")(x, w),
    "TF1 tf.gradients": _tf1_gradients,
}
FORWARD = {  # the tangents given to (x, w)
    "x alone": (TANGENT_X, None),
    "w alone": (None, TANGENT_W),
    "both": (TANGENT_X, TANGENT_W),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", REVERSE)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_in_reverse_mode(case, mode, order):
    """X·Wᵀ with the VJP (ct·W, ctᵀ·X): dX = ct·W never reads X, so a NaN in X leaves it finite; dW is NaN in
    the column the NaN reaches alone. The decorator once gave 0 on the NaN's row of dX and wrong finite numbers
    in dW."""
    x, w = (tf.constant(a) for a in CASES[case])
    f = ORDERS[order]
    assert_same(REVERSE[mode](f, x, w), REVERSE[mode](plain, x, w), f"{case}, {mode}")
    np.testing.assert_array_equal(f(x, w), plain(x, w))  # the value, as it was


@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_is_tf_custom_gradient_in_reverse_mode(case):
    x, w = (tf.constant(a) for a in CASES[case])
    for mode in ("gradient", "tf.function gradient", "TF1 tf.gradients"):
        assert_same(REVERSE[mode](ORDERS[1], x, w), REVERSE[mode](anchor, x, w), f"{case}, {mode}")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("run", ["eager", "function", "xla"])
@pytest.mark.parametrize("tangents", FORWARD)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_with_a_nan_or_inf_is_the_rule_as_written_in_forward_mode(case, tangents, run, order):
    """At order 1 a tangent on X alone is tX·Wᵀ, finite on the NaN's row (the decorator once gave NaN there,
    and −inf turned NaN), where TensorFlow's own forward mode of X·Wᵀ gives NaN."""
    x, w = (tf.constant(a) for a in CASES[case])
    f, given = ORDERS[order], FORWARD[tangents]
    got = in_mode(lambda x, w: _tangent(f, x, w, given), run)(x, w)
    want = tangent_as_written(*CASES[case], given)
    if order == 1:
        assert_same(got, [want], f"{case}, {tangents}")
    else:
        # Order 2 differentiates grad_fn's own ops, with TensorFlow's forward rules, which multiply the NaN or
        # inf by the zero tangent of the other factor, on more elements once TensorFlow traces its rules with
        # relaxed shapes (after 32 traces of an op: what ran before decides), as they do for the formula itself:
        # the stated limit (docs/tensorflow.md). Every element is the rule's or NaN, never a wrong number.
        got = np.asarray(got[0])
        assert np.all(np.isnan(got) | np.isclose(got, want, rtol=1e-12, atol=0)), (case, tangents, got, want)
    if case == "nan in X" and tangents == "x alone":
        assert np.isnan(_tangent(plain, x, w, given)[0].numpy()[0]).all()  # autodiff's forward mode, beside it


AWKWARD_X = tf.constant([1.0, np.nan, np.inf, -np.inf], tf.float64)


def _elementwise(f, x, run):
    """The gradient along ones and the tangent along ones of an elementwise f."""
    def both(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            z = f(x)
        return tape.gradient(y, x), acc.jvp(z)
    return in_mode(both, run)(x)


@pytest.mark.parametrize("order", ORDERS)
def test_an_elementwise_rule_reaches_a_non_finite_x(mode, order):
    """x ↦ (x, ct·0.5) at [1, NaN, inf, −inf]: 0.5 everywhere, as the rule says and tf.custom_gradient gives
    in reverse mode (the decorator gave 0 at the three non-finite elements)."""
    def rule(x):
        return tf.identity(x), lambda ct: ct * 0.5

    half = sgm.custom_gradient(rule, order=order)
    grad, tangent = _elementwise(half, AWKWARD_X, mode)
    np.testing.assert_array_equal(grad, [0.5] * 4)
    np.testing.assert_array_equal(tangent, [0.5] * 4)
    np.testing.assert_array_equal(grad, _elementwise(tf.custom_gradient(rule), AWKWARD_X, "eager")[0])
    np.testing.assert_array_equal(half(AWKWARD_X), AWKWARD_X)


def test_the_identity_form_passes_gx_at_a_non_finite_x(mode):
    """log1pexp with gx = sigmoid(x): 1 at +inf, 0 at −inf, NaN at NaN (the identity form gave 0, 0, 0), in
    both modes; the truth is autodiff of stop(sigmoid(x))·x."""
    f = lambda x: sgm.custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)  # noqa: E731
    want = _elementwise(lambda x: tf.stop_gradient(tf.math.sigmoid(x)) * x, AWKWARD_X, "eager")[0]
    for got in _elementwise(f, AWKWARD_X, mode):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, [1 / (1 + np.exp(-1.0)), np.nan, 1.0, 0.0], rtol=1e-12)
