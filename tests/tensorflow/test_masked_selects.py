"""Issue 77 on TensorFlow: an element that grad_fn's own select discards contributes exactly zero to forward mode,
whatever the discarded branch computes. The tape's transpose of grad_fn ran the select's gradient before the
division's, so ``tf.where(x > 0, dy / x, 0)`` gave ``0 / 0`` (NaN) in forward mode at x = 0, where the declared
Jacobian's element is 0 and ``tf.custom_gradient``'s forward mode gives 0 (``masked_selects``).

The truths are the declared Jacobians written out (analytic, NumPy), with the guarded point (0, a zero row, ±inf,
NaN) in one element at a time; a quotient that grad_fn reads besides the select keeps its whole derivative."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import in_mode, jvp, vjp

import stopgrad_math as sgm

MODES = ["eager", "graph", "xla"]
ORDERS = [1, 2]


def _safe_norm(x):  # a safe norm's grad_fn: the guard by tf.where, the rows' norms read from f
    r = tf.norm(x, axis=1, keepdims=True)
    return r, lambda dy: tf.where(r > 0, dy / r, tf.zeros_like(r)) * x


def _safe_norm_jacobian(x):
    r = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(r > 0, x / np.where(r > 0, r, 1.0), 0.0)  # ∂r_i/∂x_ij, declared 0 on a zero row


def _reciprocal_slope(x):  # y = x, its gradient declared 2dy / x, guarded at 0 after a scaling and a negation
    return tf.identity(x), lambda dy: tf.where(tf.not_equal(x, 0.0), -(-(2.0 * dy) / x), tf.zeros_like(x))


def _finite_slope(x):  # y = x, its gradient declared dy·x where x is finite and 0 at ±inf and NaN (larq's guard)
    return tf.identity(x), lambda dy: tf.where(tf.math.is_finite(x), dy * x, 0.0)


ROWS = np.array([[3.0, 4.0], [1.0, -2.0], [0.5, 0.5]], np.float32)
POINTS = np.array([0.5, -2.0, 4.0], np.float32)

CASES = {
    "safe norm at a zero row": (_safe_norm, _safe_norm_jacobian, lambda k: ROWS * (np.arange(3) != k)[:, None]),
    "2dy / x at x = 0": (_reciprocal_slope, lambda x: np.where(x != 0, 2.0 / np.where(x != 0, x, 1.0), 0.0),
                         lambda k: POINTS * (np.arange(3) != k)),
    "dy·x at a non-finite x": (_finite_slope, lambda x: np.where(np.isfinite(x), x, 0.0),
                               lambda k: np.where(np.arange(3) == k, [np.inf, -np.inf, np.nan][k], POINTS)),
}


def _tangent_truth(case, x, tangent):
    jacobian = CASES[case][1](x.astype(np.float64))
    product = np.where(jacobian == 0, 0.0, jacobian * np.where(jacobian == 0, 0.0, tangent))
    return product.sum(axis=1, keepdims=True) if case == "safe norm at a zero row" else product


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_forward_mode_gives_the_declared_zero_where_the_select_discards(case, mode, order):
    rule, _, points = CASES[case]
    fn = sgm.custom_gradient(rule, order=order)
    tangent_of = in_mode(lambda x, t: jvp(fn, x, t), mode)
    for k in range(3):
        x = points(k).astype(np.float32)
        tangent = np.linspace(0.5, 1.5, x.size, dtype=np.float32).reshape(x.shape)
        got = tangent_of(tf.constant(x), tf.constant(tangent)).numpy()
        np.testing.assert_allclose(got, _tangent_truth(case, x, tangent), rtol=2e-6, atol=0, err_msg=f"{case}, {k}")


@pytest.mark.parametrize("mode", MODES)
def test_forward_mode_at_the_guarded_point_is_the_mechanisms(mode):
    """tf.custom_gradient's forward mode gives 0 at x = 0 (it differentiates f, whose derivative the rule is)."""
    def rule(x):
        return tf.math.log(tf.maximum(x, 1e-30)), lambda dy: tf.where(x > 0, dy / x, tf.zeros_like(x))

    x, tangent = tf.constant([0.0, 1.0, 2.0, -1.0]), tf.constant([1.0, 1.0, 1.0, 1.0])
    want = in_mode(lambda x, t: jvp(tf.custom_gradient(rule), x, t), mode)(x, tangent).numpy()
    assert want[0] == 0.0
    for order in ORDERS:
        got = in_mode(lambda x, t, order=order: jvp(sgm.custom_gradient(rule, order=order), x, t), mode)(x, tangent)
        np.testing.assert_array_equal(got.numpy(), want)


def _read_twice(x):  # the quotient read by the select and again by a sum: its discarded elements still count there
    def grad_fn(dy):
        quotient = dy / x
        return tf.where(x > 0, quotient, 0.0) + 0.5 * quotient
    return tf.identity(x), grad_fn


@tf.function
def _tripled(t):
    return 3.0 * t


def _read_by_a_function(x):  # the quotient read by the select and by a nested tf.function (one call op)
    def grad_fn(dy):
        quotient = dy / x
        return tf.where(x > 0, quotient, 0.0) + _tripled(quotient)
    return tf.identity(x), grad_fn


def _read_by_two_selects(x):  # kept where either select keeps it: 0 at x = 0, where both discard
    def grad_fn(dy):
        quotient = dy / x
        return tf.where(x > 0, quotient, 0.0) + tf.where(x > 1, quotient, 0.0)
    return tf.identity(x), grad_fn


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
def test_a_quotient_read_by_two_selects_is_kept_where_either_keeps_it(mode, order):
    x = np.array([0.0, 0.5, 2.0, -1.0, 0.0], np.float32)
    tangent = np.array([1.0, 2.0, 3.0, -1.0, -2.0], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        jacobian = np.where(x > 0, 1.0, 0.0) / np.where(x != 0, x, 1.0) + np.where(x > 1, 1.0, 0.0) / np.where(
            x != 0, x, 1.0)
    fn = sgm.custom_gradient(_read_by_two_selects, order=order)
    got = in_mode(lambda x, t: jvp(fn, x, t), mode)(tf.constant(x), tf.constant(tangent))
    np.testing.assert_allclose(got.numpy(), jacobian * tangent, rtol=2e-6, atol=0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rule, extra", [(_read_twice, 0.5), (_read_by_a_function, 3.0)])
def test_a_quotient_read_besides_the_select_keeps_its_whole_derivative(rule, extra, mode, order):
    """Masking the quotient where the select discards would drop the other reader's share there: J·v at x < 0 is
    extra/x, not 0 (in reverse mode too, which at order 1 in a graph is the transpose of J·v)."""
    x = tf.constant([-2.0, 0.5, -0.25, 4.0])
    tangent = tf.constant([1.0, 2.0, 3.0, -1.0])
    jacobian = np.where(x.numpy() > 0, 1.0 + extra, extra) / x.numpy()
    fn = sgm.custom_gradient(rule, order=order)
    got = in_mode(lambda x, t: jvp(fn, x, t), mode)(x, tangent)
    np.testing.assert_allclose(got.numpy(), jacobian * tangent.numpy(), rtol=2e-6)
    np.testing.assert_allclose(in_mode(lambda x: vjp(fn, x), mode)(x).numpy(), jacobian, rtol=2e-6)


@pytest.mark.parametrize("mode", MODES)
def test_reverse_mode_is_grad_fn_and_keeps_the_guarded_zero(mode):
    """Reverse mode calls grad_fn (or, at order 1 in a graph, differentiates the masked J·v): the declared
    gradient, 0 at x = 0, as tf.custom_gradient gives it."""
    def rule(x):
        return tf.math.log(tf.maximum(x, 1e-30)), lambda dy: tf.where(x > 0, dy / x, tf.zeros_like(x))

    x = tf.constant([0.0, 1.0, 2.0, -1.0])
    want = in_mode(lambda x: vjp(tf.custom_gradient(rule), x), mode)(x).numpy()
    for order in ORDERS:
        got = in_mode(lambda x, order=order: vjp(sgm.custom_gradient(rule, order=order), x), mode)(x).numpy()
        np.testing.assert_array_equal(np.abs(got), np.abs(want))
        # The documented limit: order 1's reverse mode is −grad_fn(−ȳ), so the select's +0.0 comes back −0.0.
        np.testing.assert_array_equal(np.signbit(got), [order == 1, False, False, order == 1])
    assert not np.signbit(want).any()


def test_tensorflows_own_gradients_are_unchanged_where_nothing_transposes():
    """The registry's entries are wrapped once, for every tape: outside a transpose they are TensorFlow's."""
    x = tf.constant([0.0, 1.0, -1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.where(x > 0, 1.0 / x, 0.0)
    assert np.isnan(tape.gradient(y, x).numpy()[0])  # the where-NaN trap, as TensorFlow has it


def _larq_approx_sign(x):  # larq's approx_sign, its grad_fn as larq writes it
    def grad(dy):
        abs_x = tf.math.abs(x)
        zeros = tf.zeros_like(dy)
        mask = tf.math.less_equal(abs_x, 1.0)
        return tf.where(mask, (1 - abs_x) * 2 * dy, zeros)
    return tf.sign(x), grad


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
def test_larqs_approx_sign_has_its_rules_tangent_at_non_finite_inputs(mode, order):
    """At ±inf (1 − |x|)·2 is −inf, and 0 · −inf is NaN where the select discards: the rule's tangent there is 0."""
    x = np.array([np.inf, -np.inf, np.nan, 0.5, -0.25, 2.0, 1.0], np.float32)
    tangent = np.array([1.0, 2.0, 3.0, 0.5, -1.0, 4.0, 1.5], np.float32)
    got = in_mode(lambda x, t: jvp(sgm.custom_gradient(_larq_approx_sign, order=order), x, t), mode)(
        tf.constant(x), tf.constant(tangent))
    with np.errstate(invalid="ignore"):
        want = np.where(np.abs(x) <= 1.0, 2.0 * (1.0 - np.abs(x)) * tangent, 0.0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("rule, extra", [(_read_twice, 0.5), (None, 0.0)])
def test_tf1_gradients_give_the_declared_gradient(rule, extra, order):
    """In a TF1 graph tf.gradients differentiates order 1's term, the transpose of the masked J·v: grad_fn's
    gradient, 0 where the guard discards, and a second reader's share kept."""
    def guarded(x):
        return tf.identity(x), lambda dy: tf.where(x > 0, dy / x, tf.zeros_like(x))

    x = np.array([-2.0, 0.5, 0.0, 4.0], np.float32)
    with tf.Graph().as_default():
        placed = tf.constant(x)
        gradient = tf.gradients(sgm.custom_gradient(rule or guarded, order=order)(placed), placed)[0]
        with tf.compat.v1.Session() as session:
            got = session.run(gradient)
    with np.errstate(divide="ignore"):
        want = np.where(x > 0, 1.0 + extra, extra) / x if rule else np.where(x > 0, 1.0 / np.where(x > 0, x, 1), 0.0)
    np.testing.assert_allclose(got, np.where(np.isnan(want), got, want), rtol=2e-6)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def _unit_rows(x):  # rows scaled to unit length: the select's condition (n, 1) and the division broadcast to (n, d)
    r = tf.norm(x, axis=-1, keepdims=True)
    y = tf.where(r > 0, x / tf.where(r > 0, r, 1.0), 0.0)
    return y, lambda dy: tf.where(r > 0, (dy - y * tf.reduce_sum(dy * y, -1, keepdims=True)) / r, 0.0)


def _unit_rows_product(x, t):
    """J·t of ``_unit_rows``' declared Jacobian, (I − yyᵀ)/r on each row, 0 on a zero row (symmetric: Jᵀ too)."""
    x, t = x.astype(np.float64), t.astype(np.float64)
    r = np.linalg.norm(x, axis=-1, keepdims=True)
    y = x / np.where(r > 0, r, 1.0)
    return np.where(r > 0, (t - y * (t * y).sum(-1, keepdims=True)) / np.where(r > 0, r, 1.0), 0.0)


def _in_shape_mode(fn, mode):
    """``in_mode``, and "graph, unknown shapes": traced for every shape of rank 2 (nothing known while tracing)."""
    if mode != "graph, unknown shapes":
        return in_mode(fn, mode)
    return tf.function(fn, input_signature=[tf.TensorSpec([None, None], tf.float32)] * 2)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", [*MODES, "graph, unknown shapes"])
def test_a_condition_that_broadcasts_and_shapes_unknown_while_tracing_keep_the_declared_zero(mode, order):
    """The select's condition has one element a row and the quotient one a row's element, broadcast, and under an
    input signature of unknown shapes nothing is known while tracing: the masks are broadcast and reduced as
    TensorFlow's gradients broadcast and reduce (the forward tangent at a zero row was NaN in each). Reverse mode
    too, which at order 1 in a graph transposes that masked J·v."""
    fn = sgm.custom_gradient(_unit_rows, order=order)
    tangent_of = _in_shape_mode(lambda x, t: jvp(fn, x, t), mode)
    gradient_of = _in_shape_mode(lambda x, u: vjp(fn, x, u), mode)
    for k in range(3):
        x = ROWS * (np.arange(3) != k)[:, None]
        t = np.linspace(0.5, 1.5, x.size, dtype=np.float32).reshape(x.shape)
        want = _unit_rows_product(x, t)
        for got in (tangent_of(tf.constant(x), tf.constant(t)), gradient_of(tf.constant(x), tf.constant(t))):
            np.testing.assert_allclose(got.numpy(), want, rtol=2e-6, atol=1e-7, err_msg=f"zero row {k}")
            assert not np.signbit(got.numpy()[k]).any() or order == 1  # (order 1's reverse mode: −grad_fn(−ȳ))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_forward_mode_through_a_traced_call_keeps_the_declared_zero(case, order):
    """Forward mode through a call of a tf.function (an accumulator outside it, or inside another function around
    the call) is TensorFlow's transpose of the called function's backward, taken twice. At order 2 that backward
    was grad_fn's ops as written, and the select's discarded 0 / 0 came back NaN (as tf.custom_gradient's does
    there); it is now the masked J·v transposed back. Order 1's J·v is made with the masks."""
    rule, _, points = CASES[case]
    called = tf.function(sgm.custom_gradient(rule, order=order))
    nested = tf.function(lambda x, t: jvp(called, x, t))
    for k in range(3):
        x = points(k).astype(np.float32)
        tangent = np.linspace(0.5, 1.5, x.size, dtype=np.float32).reshape(x.shape)
        for got in (jvp(called, tf.constant(x), tf.constant(tangent)), nested(tf.constant(x), tf.constant(tangent))):
            np.testing.assert_allclose(got.numpy(), _tangent_truth(case, x, tangent), rtol=2e-6, atol=0,
                                       err_msg=f"{case}, {k}")


def test_a_traced_calls_second_derivative_at_order_2_is_the_declared_gradients_jacobian():
    """Forward over reverse through a traced call (the tape in a tf.function, the accumulator outside): the Jacobian
    of the declared gradient where(x > 0, 1/x, 0), −t/x² and 0 at x = 0, as tf.custom_gradient's (TensorFlow's
    forward mode of grad_fn's select there), where the first derivative through a traced call is NaN for it."""
    def rule(x):
        return tf.math.log(tf.maximum(x, 1e-30)), lambda dy: tf.where(x > 0, dy / x, tf.zeros_like(x))

    x, tangent = tf.constant([0.0, 1.0, 2.0, -1.0]), tf.constant([1.0, 2.0, 1.0, 1.0])
    gradient = tf.function(lambda x: vjp(sgm.custom_gradient(rule, order=2), x))
    np.testing.assert_allclose(jvp(gradient, x, tangent).numpy(), [0.0, -2.0, -0.25, 0.0], rtol=1e-6, atol=0)
    anchor = tf.function(lambda x: vjp(tf.custom_gradient(rule), x))
    np.testing.assert_allclose(jvp(anchor, x, tangent).numpy(), [0.0, -2.0, -0.25, 0.0], rtol=1e-6, atol=0)
    assert np.isnan(jvp(tf.function(tf.custom_gradient(rule)), x, tangent).numpy()[0])  # its first derivative
