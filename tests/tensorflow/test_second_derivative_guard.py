"""The order-1 decorator's second-derivative guard (stopgrad_math.tensorflow.second_derivative_guard).

At order=1 J is held constant in x, so a second derivative misses ∂J/∂x. Where a tape or accumulator could take
one when f is called, it raises; first derivatives and values are tf.custom_gradient's, bit for bit. Where no
tape watches x while f runs (TF1 graphs, a traced function differentiated twice from outside) the term is
missing: tested below as that limit, against the truth, never as the answer.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, bits, gradient_and_second, in_mode

from stopgrad_math import custom_gradient

X = tf.constant([0.3, -0.4, 2.0])
ORDER_2 = r"custom_gradient\(order=2\)"


def _sin(decorator):
    return decorator(lambda x: (tf.sin(x), lambda dy: dy * tf.cos(x)))


def _log1pexp(decorator):
    def f(x):
        e = tf.exp(x)
        return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))

    return decorator(f)


def _truth(x):
    """d²/dx² Σ exp(sin x), elementwise, in float64."""
    x = np.asarray(x, np.float64)
    return np.exp(np.sin(x)) * (np.cos(x) ** 2 - np.sin(x))


def _nested_tapes(f, around=tf.exp):
    """d²/dx² Σ around(f(x)) by a tape over a tape."""
    return lambda x: gradient_and_second(lambda t: around(f(t)), x)[1]


@pytest.mark.parametrize("mode", MODES)
def test_nested_tapes_raise_where_order_2_and_tf_custom_gradient_are_exact(mode):
    with pytest.raises(Exception, match=ORDER_2):
        in_mode(_nested_tapes(_sin(custom_gradient)), mode)(X)
    for decorator in (custom_gradient(order=2), tf.custom_gradient):
        np.testing.assert_allclose(in_mode(_nested_tapes(_sin(decorator)), mode)(X), _truth(X), rtol=1e-5)


def test_a_second_derivative_alone_raises():
    """d²f/dx² with nothing beside it: before the guard, None (unconnected)."""
    with pytest.raises(LookupError, match=ORDER_2):
        _nested_tapes(_sin(custom_gradient), around=tf.identity)(X)


def test_a_persistent_tapes_gradient_of_a_gradient_raises():
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(X)
        y = tf.reduce_sum(tf.exp(_sin(custom_gradient)(X)))
        first = tape.gradient(y, X)
    with pytest.raises(LookupError, match=ORDER_2):
        tape.gradient(first, X)


def test_a_tape_and_an_accumulator_give_both_first_derivatives():
    """Reverse and forward mode of one call, as the log1pexp notebook takes them under XLA: the guard is built
    (two watchers) and changes neither."""
    def both(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator, tf.GradientTape() as tape:
            tape.watch(x)
            y = _log1pexp(custom_gradient)(x)
            reverse = tape.gradient(y, x)
        return reverse, accumulator.jvp(y)

    x = tf.constant([-5.0, 0.5, 100.0])
    for derivative in in_mode(both, "xla")(x):
        np.testing.assert_allclose(derivative, tf.math.sigmoid(tf.cast(x, tf.float64)), rtol=1e-5)  # 1 − 1/(1 + e)


@pytest.mark.parametrize("where", ["tf1", "tapes around a tf.function", "forward over reverse"])
def test_the_limit_where_no_tape_watches_while_f_runs_misses_the_term_through_j(where):
    """The documented limit, tested as that limit: exp(f)·f′² where the truth is exp(f)·(f′² + f″). Forward over
    reverse is the accumulator's derivative of the backward pass, which no op can stop without stopping a first
    derivative in forward mode."""
    def second_derivative(decorator):
        f = _sin(decorator)
        if where == "tf1":
            with tf.Graph().as_default():
                x = tf.constant(X.numpy())
                (first,) = tf.gradients(tf.reduce_sum(tf.exp(f(x))), x)
                (second,) = tf.gradients(first, x)
                with tf.compat.v1.Session() as session:
                    return session.run(second)
        if where == "forward over reverse":
            with tf.autodiff.ForwardAccumulator(X, tf.ones_like(X)) as accumulator:
                with tf.GradientTape() as tape:
                    tape.watch(X)
                    y = tf.reduce_sum(tf.exp(f(X)))
                first = tape.gradient(y, X)
            return accumulator.jvp(first).numpy()
        once = tf.function(lambda x: tf.exp(f(x)))  # traced with no tape watching x
        return _nested_tapes(once, around=tf.identity)(X).numpy()

    x = X.numpy().astype(np.float64)
    np.testing.assert_allclose(second_derivative(tf.custom_gradient), _truth(x), rtol=1e-5)
    np.testing.assert_allclose(second_derivative(custom_gradient), np.exp(np.sin(x)) * np.cos(x) ** 2, rtol=1e-5)
    assert not np.allclose(np.exp(np.sin(x)) * np.cos(x) ** 2, _truth(x), rtol=1e-2)  # the missing term matters


AWKWARD = tf.constant([0.5, 100.0, -0.0, 0.0, -3.0, np.inf, -np.inf, np.nan])
UPSTREAM = tf.constant([1.0, 2.0, -0.0, -1.0, 0.0, -0.0, 1.0, 1.0])


def _watched(how, fn, x, upstream):
    """fn's value and first derivative, with the guard built: a persistent tape, or a second tape around."""
    if how == "persistent":
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = fn(x)
        return y, tape.gradient(y, x, output_gradients=upstream)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return y, tape.gradient(y, x, output_gradients=upstream)


def _plain(fn, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, x, output_gradients=upstream)


@pytest.mark.parametrize("how", ["persistent", "nested"])
@pytest.mark.parametrize("mode", MODES)
def test_values_and_first_derivatives_are_those_without_the_guard_bit_for_bit(how, mode):
    """−0.0, inf and NaN in x and in the upstream: the guard adds −0.0, which changes no gradient's sign. At finite
    x that is tf.custom_gradient's gradient; at non-finite x the decorator's own (the docs: the value wins)."""
    guarded = in_mode(lambda x, u: _watched(how, _log1pexp(custom_gradient), x, u), mode)(AWKWARD, UPSTREAM)
    unguarded = in_mode(lambda x, u: _plain(_log1pexp(custom_gradient), x, u), mode)(AWKWARD, UPSTREAM)
    theirs = in_mode(lambda x, u: _watched(how, _log1pexp(tf.custom_gradient), x, u), mode)(AWKWARD, UPSTREAM)
    for got, want in zip(guarded, unguarded, strict=True):
        np.testing.assert_array_equal(bits(got), bits(want))
    finite = np.isfinite(AWKWARD)
    np.testing.assert_array_equal(bits(guarded[0]), bits(theirs[0]))
    np.testing.assert_array_equal(bits(guarded[1])[finite], bits(theirs[1])[finite])


def test_a_persistent_tapes_jacobian_and_forward_mode_alone_build_or_meet_no_guard_error():
    f = _log1pexp(custom_gradient)
    x = tf.constant([0.5, 100.0, -3.0])
    sigmoid = tf.math.sigmoid(tf.cast(x, tf.float64)).numpy()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = f(x)
    np.testing.assert_allclose(np.diag(tape.jacobian(y, x)), sigmoid, rtol=1e-6)
    with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
        y = f(x)
    np.testing.assert_allclose(accumulator.jvp(y), sigmoid, rtol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64, tf.complex64])
def test_every_dtype_meets_the_guard_in_float32_and_keeps_its_gradient(dtype):
    x = tf.cast(X, dtype)
    guarded = _watched("persistent", _sin(custom_gradient), x, None)
    unguarded = _plain(_sin(custom_gradient), x, None)
    theirs = _watched("persistent", _sin(tf.custom_gradient), x, None)
    assert guarded[1].dtype == dtype
    for got, want in zip(guarded, unguarded, strict=True):
        np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(guarded[0]), bits(theirs[0]))
    np.testing.assert_array_equal(guarded[1], theirs[1])  # equal numbers (a complex zero's sign is the decorator's)
    with pytest.raises(LookupError, match=ORDER_2):
        _nested_tapes(lambda t: tf.math.real(_sin(custom_gradient)(t)))(x)


def test_a_mixed_derivative_through_a_closure_is_exact():
    """A gradient penalty: d/dθ of ‖∂h/∂x‖² with the outer tape on θ alone builds no guard, and J's θ-dependence
    (a tensor f closes over) is carried, as tf.custom_gradient carries it."""
    theta = tf.Variable(0.7)

    def penalty_gradient(decorator):
        with tf.GradientTape() as outer:
            t = theta * 1.0
            f = decorator(lambda x: (tf.sin(t * x), lambda dy: dy * t * tf.cos(t * x)))
            with tf.GradientTape() as inner:
                inner.watch(X)
                y = tf.reduce_sum(f(X))
            penalty = tf.reduce_sum(inner.gradient(y, X) ** 2)
        return outer.gradient(penalty, theta)

    x, t = X.numpy().astype(np.float64), 0.7
    truth = np.sum(2 * t * np.cos(t * x) * (np.cos(t * x) - t * x * np.sin(t * x)))  # d/dθ Σ (θ cos θx)²
    np.testing.assert_allclose(penalty_gradient(custom_gradient), truth, rtol=1e-5)
    np.testing.assert_allclose(penalty_gradient(tf.custom_gradient), truth, rtol=1e-5)


def test_tensorflow_registers_no_derivative_of_zeta_in_s_and_its_q_derivative_reads_s():
    """What the guard is built on: if TensorFlow adds ζ's s-derivative, a first derivative would reach P."""
    with tf.Graph().as_default():
        s, q = tf.constant(2.0), tf.constant(1.5)
        d_s, d_q = tf.gradients(tf.math.zeta(s, q), [s, q])
        assert d_s is None
        assert tf.gradients(d_q, s)[0] is not None
