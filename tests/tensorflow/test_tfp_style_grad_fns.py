"""Custom gradients as TFP writes them: grad_fns that call decorated functions, their own f among them.

The grad_fns run when f is called (the identity needs J then), so a recursion must end there: inside a grad_fn
of order 1 every value but the upstream is a constant, and a decorated call on constants returns its value
alone. Checked against autodiff of the closed forms in float64 and against tf.custom_gradient side by side.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, gradient_and_second, in_mode, jvp, vjp

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
    got = in_mode(lambda x: gradient_and_second(erfcx_order_2, x), mode)(X)
    want = gradient_and_second(closed_form, X)
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


def test_gradients_that_call_each_other_in_a_tf1_graph():
    with tf.Graph().as_default():
        x = tf.constant([[0.3, -1.0], [2.0, 0.5]], tf.float64)
        (got,) = tf.gradients(broadcast(psum(x) ** 2, tf.shape(x)), x)
        (want,) = tf.gradients(tf.broadcast_to(tf.reduce_sum(x) ** 2, tf.shape(x)), x)
        with tf.compat.v1.Session() as session:
            got, want = session.run([got, want])
    np.testing.assert_allclose(got, want, rtol=1e-12)


# Two maps whose gradients are each other on the upstream without end, with y of more than one element: x ↦ A·x
# with gradient d ↦ Aᵀ·d, and d ↦ Aᵀ·d with gradient u ↦ A·u. A is not square, so a transpose taken the wrong way
# round fails on shapes or gives another number.
A = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])  # NumPy: a TF1 graph takes it as a constant


def _times_a(grad):
    return lambda x: (tf.linalg.matvec(A, x), lambda dy: grad(dy))


def _times_a_transposed(grad):
    return lambda d: (tf.linalg.matvec(A, d, transpose_a=True), lambda dy: grad(dy))


times_a = custom_gradient(_times_a(lambda dy: times_a_transposed(dy)))
times_a_transposed = custom_gradient(_times_a_transposed(lambda dy: times_a(dy)))
anchor_times_a = tf.custom_gradient(_times_a(lambda dy: anchor_times_a_transposed(dy)))
anchor_times_a_transposed = tf.custom_gradient(_times_a_transposed(lambda dy: anchor_times_a(dy)))
times_a_order_2 = custom_gradient(order=2)(_times_a(lambda dy: times_a_transposed_order_2(dy)))
times_a_transposed_order_2 = custom_gradient(order=2)(_times_a_transposed(lambda dy: times_a_order_2(dy)))

X3 = tf.constant([0.3, -1.0, 2.0], tf.float64)
U2 = tf.constant([1.5, -0.5], tf.float64)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_calling_each_other_on_the_upstream_without_end_are_exact_as_tensorflows(mode):
    """Was refused ("8 deep"): each grad_fn embedded the other's at once. At order 1 a call on the upstream inside
    a grad_fn is asked for its gradient when a derivative needs it, as TensorFlow's own decorator asks."""
    tangent = tf.constant([1.0, 2.0, -3.0], tf.float64)

    def derivatives(x):
        return times_a(x), vjp(times_a, x, U2), jvp(times_a, x, tangent)

    value, gradient, forward = in_mode(derivatives, mode)(X3)
    np.testing.assert_array_equal(value, tf.linalg.matvec(A, X3))
    np.testing.assert_allclose(gradient, tf.linalg.matvec(A, U2, transpose_a=True), rtol=1e-15)  # Aᵀ·u
    np.testing.assert_allclose(forward, tf.linalg.matvec(A, tangent), rtol=1e-15)  # A·t
    np.testing.assert_array_equal(gradient, in_mode(lambda x: vjp(anchor_times_a, x, U2), mode)(X3))


@pytest.mark.parametrize("mode", MODES)
def test_gradients_calling_each_other_on_the_upstream_give_the_jacobian(mode):
    """tape.jacobian vectorizes the backward pass (pfor) through the deferred calls' custom gradients."""
    def jacobian(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = times_a(x)
        return tape.jacobian(y, x)

    np.testing.assert_allclose(in_mode(jacobian, mode)(X3), A, rtol=1e-15)


def test_gradients_calling_each_other_on_the_upstream_through_a_reloaded_saved_model(tmp_path):
    """The deferred calls are TensorFlow custom gradients inside the saved graph: a reloaded SavedModel keeps them."""
    module = tf.Module()
    module.f = tf.function(times_a, input_signature=[tf.TensorSpec([3], tf.float64)])
    tf.saved_model.save(module, str(tmp_path))
    reloaded = tf.saved_model.load(str(tmp_path))
    tangent = tf.constant([1.0, 2.0, -3.0], tf.float64)
    np.testing.assert_allclose(vjp(reloaded.f, X3, U2), tf.linalg.matvec(A, U2, transpose_a=True), rtol=1e-15)
    np.testing.assert_allclose(jvp(reloaded.f, X3, tangent), tf.linalg.matvec(A, tangent), rtol=1e-15)


def test_gradients_calling_each_other_on_the_upstream_in_a_tf1_graph():
    with tf.Graph().as_default():
        x = tf.constant(X3.numpy())
        (got,) = tf.gradients(times_a(x), x, grad_ys=tf.constant(U2.numpy()))
        with tf.compat.v1.Session() as session:
            got = session.run(got)
    np.testing.assert_allclose(got, tf.linalg.matvec(A, U2, transpose_a=True), rtol=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_calling_each_other_on_the_upstream_at_order_2_have_exact_second_derivatives(mode):
    """Σ w·(A·x)²: gradient 2·Aᵀ·(w·A·x), Hessian·1 = 2·Aᵀ·(w·A·1). Inside a grad_fn of order 2 calls embed at
    order 2, a function whose grad_fn is running at order 1, and below that a call on the upstream is deferred."""
    w = tf.constant([0.5, -2.0], tf.float64)
    got = in_mode(lambda x: gradient_and_second(lambda v: w * times_a_order_2(v) ** 2, x), mode)(X3)
    ax = tf.linalg.matvec(A, X3)
    want_gradient = 2 * tf.linalg.matvec(A, w * ax, transpose_a=True)
    want_second = 2 * tf.linalg.matvec(A, w * tf.linalg.matvec(A, tf.ones([3], tf.float64)), transpose_a=True)
    np.testing.assert_allclose(got[0], want_gradient, rtol=1e-14)
    np.testing.assert_allclose(got[1], want_second, rtol=1e-14)


def test_a_second_derivative_through_gradients_calling_each_other_at_order_1_raises_naming_order_2():
    with pytest.raises(LookupError, match="order=2"):
        gradient_and_second(lambda v: times_a(v) ** 2, X3)


SCALE = tf.Variable(3.0, dtype=tf.float64)
scaled_with_variables = custom_gradient(
    lambda d: (SCALE * d, lambda dy, variables=None: (SCALE * dy, [tf.reduce_sum(d * dy)])))
scaled = custom_gradient(lambda d: (SCALE * d, lambda dy: SCALE * dy))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inner", [scaled_with_variables, scaled], ids=["grad_fn takes variables", "it does not"])
def test_a_deferred_call_that_reads_a_variable(mode, inner):
    """A call on the upstream inside a grad_fn whose f reads a variable: tf.custom_gradient asks its grad_fn to take
    `variables`; at order 1 nothing needs that derivative (J·v is linear in a vector that is zero), so one that
    does not take them is not refused. y = 2·x with J = 2·scale as grad_fn says: the gradient is 6·u."""
    outer = custom_gradient(lambda x: (6.0 * x, lambda dy: 2.0 * inner(dy)))
    x, upstream = tf.constant([1.0, 2.0], tf.float64), tf.constant([1.0, -0.5], tf.float64)
    got = in_mode(lambda x: (vjp(outer, x, upstream), jvp(outer, x, upstream)), mode)(x)
    np.testing.assert_array_equal(got[0], 6.0 * upstream)
    np.testing.assert_array_equal(got[1], 6.0 * upstream)


# ---------------------------------------------------------------- grad_fns the tape cannot transpose
# For a y of more than one element J·v is read off grad_fn by differentiating it with respect to the upstream.
# Where that cannot see the whole of grad_fn, a y of at most 16 elements gets J from grad_fn on unit upstreams;
# a larger one is refused (while tracing in graphs, at the first call in eager mode), never silently partial.


def _chunked_3x(stop_in_loop: bool):
    def f(x):
        def grad(dy):  # 3·dy as TFP accumulates it: a chunk in a loop that keeps no gradient, and the rest
            loop = tf.while_loop(lambda i, a: i < 1, lambda i, a: (i + 1, a + 2 * dy), [0, tf.zeros_like(dy)],
                                 back_prop=not stop_in_loop)[1]
            return loop + dy

        return 3 * x, grad

    return f


def _numpy_chunk_3x(x):
    return 3 * x, lambda dy: dy + tf.numpy_function(lambda d: 2 * d, [dy], tf.float64, stateful=False)


def _tfxla_dynamic_update_slice(operand, update, start):
    from tensorflow.compiler.tf2xla.python import xla  # TFP's path to this op: no public one exists

    return xla.dynamic_update_slice(operand, update, start)


def _scattered_3x(x):
    def grad(dy):  # the first element written by an op that has no gradient at all
        return 3 * _tfxla_dynamic_update_slice(dy, dy[:1], [0])

    return 3 * x, grad


def _prevented_3x(x):
    message = "Second derivative is not implemented."  # TFP's words for its samplers
    return 3 * x, lambda dy: tf.raw_ops.PreventGradient(input=3 * dy, message=message)


OPAQUE_CASES = {
    "while_loop(back_prop=False)": (_chunked_3x(True), MODES),
    "numpy_function": (_numpy_chunk_3x, ("eager", "function")),  # XLA cannot compile a numpy_function
    "XlaDynamicUpdateSlice": (_scattered_3x, MODES),
    "PreventGradient": (_prevented_3x, MODES),
}


@pytest.mark.parametrize(("case", "mode"), [(c, m) for c, (_, modes) in OPAQUE_CASES.items() for m in modes])
def test_grad_fns_the_tape_cannot_transpose_are_exact_for_a_small_y(case, mode):
    make = OPAQUE_CASES[case][0]
    x = tf.constant([1.0, -2.0, 0.5], tf.float64)
    upstream, tangent = tf.constant([1.0, 2.0, -4.0], tf.float64), tf.constant([0.5, -1.0, 3.0], tf.float64)
    embedded, anchor = custom_gradient(make), tf.custom_gradient(make)
    got = in_mode(lambda x: (vjp(embedded, x, upstream), jvp(embedded, x, tangent)), mode)(x)
    np.testing.assert_array_equal(got[0], 3 * upstream)  # was [1, 2, -4] in a traced function: a chunk dropped
    np.testing.assert_array_equal(got[1], 3 * tangent)
    np.testing.assert_array_equal(got[0], in_mode(lambda x: vjp(anchor, x, upstream), mode)(x))  # side by side


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("case", ["while_loop(back_prop=False)", "numpy_function"])
def test_grad_fns_the_tape_sees_only_part_of_give_reverse_mode_alone_for_a_larger_y(case, mode):
    """y of 17 elements, past unit upstreams: reverse mode is grad_fn(upstream), tf.custom_gradient's; forward
    mode, which needs the transpose the tape cannot see, raises naming the op (the same decision eagerly, from a
    trace)."""
    make, x = OPAQUE_CASES[case][0], tf.range(17, dtype=tf.float64)
    upstream = tf.range(17, dtype=tf.float64) - 5.0
    got = in_mode(lambda x: vjp(custom_gradient(make), x, upstream), mode)(x)
    np.testing.assert_array_equal(got, 3 * upstream)
    np.testing.assert_array_equal(got, in_mode(lambda x: vjp(tf.custom_gradient(make), x, upstream), mode)(x))
    op = "StopGradient" if case.startswith("while_loop") else "PyFunc"
    with pytest.raises(ValueError, match=f"Forward mode .*{op}"):
        in_mode(lambda x: jvp(custom_gradient(make), x, upstream), mode)(x)


def test_a_grad_fn_the_tape_sees_whole_through_a_loop_keeps_the_transpose_for_a_large_y():
    x = tf.range(40, dtype=tf.float64)
    got = tf.function(lambda x: vjp(custom_gradient(_chunked_3x(False)), x))(x)
    np.testing.assert_array_equal(got, np.full(40, 3.0))


@pytest.mark.parametrize("case", OPAQUE_CASES)
def test_grad_fns_the_tape_cannot_transpose_in_a_tf1_graph(case):
    with tf.Graph().as_default():
        x = tf.constant([1.0, 2.0, -3.0], tf.float64)
        (gradient,) = tf.gradients(custom_gradient(OPAQUE_CASES[case][0])(x), x, grad_ys=tf.constant([1.0, 2.0, 4.0],
                                                                                                       tf.float64))
        with tf.compat.v1.Session() as session:
            np.testing.assert_array_equal(session.run(gradient), [3.0, 6.0, 12.0])


# ---------------------------------------------------------------- an op without a gradient beside the upstream's path


@custom_gradient
def gamma_sample(alpha):
    """TFP's implicit reparameterization: d sample / d alpha = RandomGammaGrad(alpha, sample)."""
    sample = tf.random.stateless_gamma(tf.shape(alpha), [3, 4], alpha, dtype=alpha.dtype)
    return sample, lambda dy: dy * tf.raw_ops.RandomGammaGrad(alpha=alpha, sample=sample)


ALPHA = tf.constant([0.5, 1.5, 4.0, 20.0], tf.float64)
WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0])


def _want(alpha):
    sample = tf.random.stateless_gamma(tf.shape(alpha), [3, 4], alpha, dtype=alpha.dtype)
    return WEIGHTS * tf.raw_ops.RandomGammaGrad(alpha=alpha, sample=sample)


@pytest.mark.parametrize("mode", ["eager", "function"])  # XLA has no gamma sampler
def test_gamma_samples_get_random_gamma_grad(mode):
    got = in_mode(lambda a: vjp(gamma_sample, a, tf.constant(WEIGHTS)), mode)(ALPHA)
    np.testing.assert_allclose(got, _want(ALPHA), rtol=1e-12)


def test_gamma_samples_under_tf1_gradients():
    with tf.Graph().as_default():  # tf.gradients walked through the stopped alpha into RandomGammaGrad and raised
        alpha = tf.constant(ALPHA.numpy())
        (gradient,) = tf.gradients(gamma_sample(alpha), alpha, grad_ys=tf.constant(WEIGHTS))
        with tf.compat.v1.Session() as session:
            got, want = session.run([gradient, _want(alpha)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_gamma_samples_side_by_side_with_tf_custom_gradient():
    anchor = tf.custom_gradient(gamma_sample.undecorated)
    np.testing.assert_array_equal(vjp(gamma_sample, ALPHA, tf.constant(WEIGHTS)),
                                  vjp(anchor, ALPHA, tf.constant(WEIGHTS)))


def test_gamma_samples_in_a_traced_function_differentiated_from_outside():
    traced = tf.function(gamma_sample)
    np.testing.assert_allclose(vjp(traced, ALPHA, tf.constant(WEIGHTS)), _want(ALPHA), rtol=1e-12)


def test_a_y_whose_size_is_unknown_while_tracing_cannot_take_unit_upstreams():
    """Reverse mode is grad_fn(upstream), tf.custom_gradient's; forward mode, whose J·v would need unit upstreams,
    raises naming the op."""
    spec = [tf.TensorSpec(None, tf.float64)]
    x = tf.constant([1.0, -2.0, 0.5], tf.float64)
    ours, theirs = (tf.function(lambda x, decorator=d: vjp(decorator(_prevented_3x), x), input_signature=spec)(x)
                    for d in (custom_gradient, tf.custom_gradient))
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, np.full(3, 3.0))
    traced = tf.function(lambda x: jvp(custom_gradient(_prevented_3x), x, x), input_signature=spec)
    with pytest.raises(ValueError, match=r"PreventGradient.*at most 16 elements known while tracing"):
        traced.get_concrete_function()


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_unit_upstreams_follow_tfs_complex_convention(mode):
    """z² with grad_fn conj(2z)·dy behind PreventGradient: J = conj(grad_fn(e_k)), as for one element."""

    def square(z):
        return z * z, lambda dy: tf.raw_ops.PreventGradient(input=tf.math.conj(2 * z) * dy)

    z = tf.constant([1 + 2j, -0.5j, 3 - 1j], tf.complex128)
    upstream, tangent = tf.constant([1 - 1j, 2, 0.5j], tf.complex128), tf.constant([1j, 1, -2], tf.complex128)
    embedded = custom_gradient(square)
    got = in_mode(lambda z: (vjp(embedded, z, upstream), jvp(embedded, z, tangent)), mode)(z)
    np.testing.assert_allclose(got[0], vjp(tf.custom_gradient(square), z, upstream), rtol=1e-15)
    np.testing.assert_allclose(got[1], 2 * z * tangent, rtol=1e-15)  # the holomorphic derivative


# A grad_fn that calls, on its upstream, a decorated function of two outputs and uses one of them: TensorFlow gives
# the deferred call's custom gradient None for the unused output's upstream, which is zero (issue 59).
pair = custom_gradient(lambda d: ((2.0 * d, 3.0 * d), lambda da, db: 2.0 * da + 3.0 * db))
uses_one_of_a_pair = custom_gradient(lambda x: (6.0 * x, lambda dy: 3.0 * pair(dy)[0]))


@pytest.mark.parametrize("mode", MODES)
def test_a_deferred_call_with_an_output_that_reaches_nothing_reads_its_upstream_as_zero(mode):
    """y = 6·x, grad_fn 3·(2·dy): the pair's second output 3·dy reaches nothing, so its upstream is zero; read as
    ones it would add to every element of the gradient, and to forward mode's product. (TensorFlow passes the
    deferred call's gradient zeros for it here, in every mode: the test below gives it the None itself.)"""
    x, upstream = tf.constant([1.0, 2.0], tf.float64), tf.constant([1.0, -0.5], tf.float64)
    got = in_mode(lambda x: (vjp(uses_one_of_a_pair, x, upstream), jvp(uses_one_of_a_pair, x, upstream)), mode)(x)
    np.testing.assert_array_equal(got[0], 6.0 * upstream)  # autodiff of 6·x
    np.testing.assert_array_equal(got[1], 6.0 * upstream)


def test_a_deferred_call_with_an_output_that_reaches_nothing_in_a_tf1_graph():
    with tf.Graph().as_default():
        x = tf.constant([1.0, 2.0], tf.float64)
        (got,) = tf.gradients(uses_one_of_a_pair(x), x, grad_ys=tf.constant([1.0, -0.5], tf.float64))
        with tf.compat.v1.Session() as session:
            got = session.run(got)
    np.testing.assert_array_equal(got, [6.0, -3.0])


def test_a_none_upstream_of_a_deferred_call_is_zero():
    """Where TensorFlow passes None for an output's upstream (it fills zeros itself for a floating output in every
    mode above), the deferred call reads it as the zero it stands for, never as another value."""
    from stopgrad_math.tensorflow import deferred_calls
    from stopgrad_math.tensorflow.gradient_components import Flattened

    outputs = Flattened.of([tf.constant([2.0, 4.0], tf.float64), tf.constant([1.0, 3.0], tf.float64)], "y")
    given = tf.constant([0.5, -1.0], tf.float64)
    dense = deferred_calls.dense_upstreams(outputs, (None, given))
    np.testing.assert_array_equal(dense[outputs.differentiable[0]], [0.0, 0.0])
    assert dense[outputs.differentiable[1]] is given
