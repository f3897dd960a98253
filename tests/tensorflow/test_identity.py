"""zero_with_gradient and the value term: exact zeros, unit and guarded slopes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, assert_value_exact, bits, float32_exact, gradient_and_second, in_mode, jvp, vjp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stopgrad_math import zero_with_gradient
from stopgrad_math.tensorflow.identity import (
    _finite_in_host_memory,
    attach,
    carried_zero,
    negative_zero_term,
    nothing_records,
    stop_each,
    unreachable,
)

FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
ALL_INEXACT = (*FLOATS, tf.complex64, tf.complex128)
SPECIAL = float32_exact([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e38])
AWKWARD = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32))


@pytest.mark.parametrize("mode", MODES)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), elements=AWKWARD))
def test_zero_with_gradient_is_positive_zero_with_unit_slope_at_every_x(mode, x):
    x = tf.constant(x)
    upstream = tf.reshape(tf.range(tf.size(x), dtype=tf.float32) - 2.5, tf.shape(x))

    def value_and_grad(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            u = zero_with_gradient(x)
        return u, tape.gradient(u, x, output_gradients=w), jvp(zero_with_gradient, x, w)

    u, grad, tangent = in_mode(value_and_grad, mode)(x, upstream)
    np.testing.assert_array_equal(bits(u.numpy()), np.zeros(x.shape, np.uint32))  # +0.0 everywhere
    np.testing.assert_array_equal(grad, upstream)  # inf and NaN elements of x too: the slope is 1 there
    np.testing.assert_array_equal(tangent, upstream)


@pytest.mark.parametrize("dtype", FLOATS)
def test_zero_with_gradient_for_every_dtype_and_a_variable(dtype):
    v = tf.Variable(tf.constant([1.5, -2.0, 7.0], dtype))
    with tf.GradientTape() as tape:
        u = zero_with_gradient(v)
    assert u.dtype == dtype
    np.testing.assert_array_equal(u, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(tape.gradient(u, v), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_zero_with_gradient_passes_derivatives_at_non_finite_x_in_every_dtype(dtype, mode):
    x = tf.constant([1.5, np.inf, -np.inf, np.nan, -0.0], dtype)
    upstream = tf.constant([3.0, np.inf, np.nan, 5.0, -2.0], dtype)

    def value_and_derivatives(x, w):
        return zero_with_gradient(x), vjp(zero_with_gradient, x, w), jvp(zero_with_gradient, x, w)

    u, grad, tangent = in_mode(value_and_derivatives, mode)(x, upstream)
    np.testing.assert_array_equal(bits(u.numpy()), np.zeros(5, bits(u.numpy()).dtype))  # +0.0 everywhere
    want = np.array([3.0, np.inf, np.nan, 5.0, -2.0])  # the upstream, also where x is inf or NaN
    for derivative in (grad, tangent):
        assert derivative.dtype == dtype
        np.testing.assert_array_equal(tf.cast(derivative, tf.float64), want)


@pytest.mark.parametrize("copies", [1, 10], ids=["a few elements", "more than 16"])
@pytest.mark.parametrize("x_values", [[-0.0, 1e-40, 3.0, -5e30], [-0.0, np.inf, 3.0, np.nan]], ids=["finite", "not"])
def test_eager_finite_tensors_skip_the_carrier_and_change_no_bit(x_values, copies):
    """Eagerly, a finite x in host memory needs no carrier: value, gradient and JVP are the graph's (which
    keeps it), bit for bit, for g with inf and upstreams with zeros; so are they where x is not finite and
    the carrier is called eagerly. Python checks a few elements, NumPy more."""
    x = tf.constant(x_values * copies, tf.float32)
    g, upstream = tf.constant([np.inf, 2.0, -0.0, 7.0] * copies), tf.constant([0.0, 1.0, -2.0, 3.0] * copies)
    f = tf.constant([-0.0, np.nan, 1.0, np.inf] * copies)

    def parts(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = attach(f, [negative_zero_term(g, x, tf.float32)])
        return h, tape.gradient(h, x, output_gradients=upstream), jvp(lambda x: attach(
            f, [negative_zero_term(g, x, tf.float32)]), x, upstream)

    for eager, graph in zip(parts(x), tf.function(parts)(x), strict=True):
        np.testing.assert_array_equal(bits(eager), bits(graph))


@pytest.mark.parametrize("shape", [[], [3], [40]], ids=["0-d", "a few elements", "more than 16"])
@pytest.mark.parametrize("dtype", ALL_INEXACT)
def test_the_host_check_reads_every_dtype_and_size(dtype, shape):
    """Host tensors are read as views (a 0-d bfloat16 tensor, which NumPy cannot view, as a copy); one inf or
    NaN anywhere, in either part of a complex number, keeps the carrier."""
    finite = tf.cast(tf.fill(shape, 1.5), dtype)
    assert _finite_in_host_memory(finite)
    for bad in (np.inf, -np.inf, np.nan, complex(0.0, np.inf)):
        if isinstance(bad, complex) and not dtype.is_complex:
            continue
        last = tf.cast(tf.constant(bad, tf.complex128 if dtype.is_complex else tf.float64), dtype)
        x = tf.concat([tf.reshape(finite, [-1])[1:], [last]], 0) if shape else last
        assert not _finite_in_host_memory(x), (bad, x)


@pytest.mark.parametrize("x_values", [[1.0, -0.0, 5e30], [1.0, np.inf, np.nan]], ids=["finite", "not"])
def test_an_eager_tensor_captured_by_a_trace_is_read_as_the_constant_it_is(x_values):
    """A traced function that closes over an eager x captures its values: the carrier is left out only where
    they are finite. Against the same identity traced with x as an argument, which keeps it."""
    x = tf.constant(x_values)
    g, upstream = tf.constant([np.inf, 2.0, 3.0]), tf.constant([0.0, 1.0, -2.0])
    f = tf.constant([-0.0, 1.0, np.inf])

    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = attach(f, [negative_zero_term(g, x, tf.float32)])
        return h, tape.gradient(h, x, output_gradients=upstream)

    captured, argument = tf.function(lambda: value_and_grad(x))(), tf.function(value_and_grad)(x)
    for got, want in zip(captured, argument, strict=True):
        np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(argument[1], [0.0, 2.0, -6.0])  # g·upstream, 0 for a zero upstream (g = inf)


def test_negative_zero_term_is_positive_zero_with_slope_minus_g():
    g = tf.constant([np.inf, np.nan, -2.0, 3.0])
    x = tf.constant([1.0, 2.0, 3.0, -0.0])
    term = negative_zero_term(g, x, tf.float32)
    np.testing.assert_array_equal(bits(term.numpy()), np.zeros(4, np.uint32))
    np.testing.assert_array_equal(vjp(lambda x: negative_zero_term(g, x, tf.float32), x, tf.constant([0.0, 0, 1, 1])),
                                  [0.0, 0.0, 2.0, -3.0])


def test_negative_zero_term_casts_to_the_value_dtype():
    x = tf.constant([1.0, 2.0], tf.float64)
    grad = vjp(lambda x: negative_zero_term(tf.constant([2.0, 4.0]), x, tf.float32), x)
    assert grad.dtype == tf.float64
    np.testing.assert_array_equal(grad, [-2.0, -4.0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_attach_keeps_every_special_value_bit_for_bit(dtype):
    value = tf.constant([-0.0, 0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -3.5], dtype)
    out = attach(value, [tf.zeros([8], dtype), tf.zeros([], dtype)])
    assert_value_exact(out.numpy(), value.numpy())
    if dtype != tf.bfloat16:  # bfloat16 arithmetic canonicalises NaN; elsewhere even -NaN is kept
        np.testing.assert_array_equal(bits(out.numpy()), bits(value.numpy()))


def test_nothing_records_only_in_eager_without_tape_or_accumulator():
    assert nothing_records()
    with tf.GradientTape():
        assert not nothing_records()
    with tf.autodiff.ForwardAccumulator(tf.constant(1.0), tf.constant(1.0)):
        assert not nothing_records()
    assert not tf.function(lambda: tf.constant(nothing_records()))()



@pytest.mark.parametrize("mode", MODES)
def test_stop_each_keeps_the_values_and_cuts_every_derivative(mode):
    x, v = tf.constant([1.5, -0.0, 3e38]), tf.Variable([2.0, 3.0, 4.0])

    def stopped_times_unstopped(x):
        with tf.GradientTape(persistent=True) as tape, tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            tape.watch(x)
            x_stop, v_stop = stop_each([x, v])
            product = x_stop * x + v_stop * v
        return x_stop, v_stop, tape.gradient(product, x), tape.gradient(product, v), acc.jvp(product)

    x_stop, v_stop, dx, dv, tangent = in_mode(stopped_times_unstopped, mode)(x)
    assert_value_exact(x_stop.numpy(), x.numpy())
    np.testing.assert_array_equal(v_stop, v)
    np.testing.assert_array_equal(dx, x)
    np.testing.assert_array_equal(dv, v)
    np.testing.assert_array_equal(tangent, x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_INEXACT)
def test_unreachable_keeps_every_bit(dtype, mode):
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -3e-3])
    x = tf.cast(tf.constant(values), dtype)
    if dtype.is_complex:
        x = tf.complex(tf.math.real(x), tf.reverse(tf.math.real(x), [0]))
    got = in_mode(lambda x: unreachable(stop_each([x]))[0], mode)(x)
    as_parts = (lambda a: a.view(a.real.dtype)) if dtype.is_complex else (lambda a: a)  # no 128-bit integers
    np.testing.assert_array_equal(bits(as_parts(got.numpy())), bits(as_parts(x.numpy())))


def test_unreachable_hides_what_follows_from_tf_gradients():
    """tf.gradients walks through StopGradient into an op with no gradient and raises; not through this."""
    with tf.Graph().as_default():
        x = tf.constant([1.5, 2.5])
        no_gradient = lambda t: tf.raw_ops.RandomGammaGrad(alpha=t, sample=t)  # noqa: E731
        with pytest.raises(LookupError):
            tf.gradients(2 * x + no_gradient(stop_each([x])[0]), x)
        (gradient,) = tf.gradients(2 * x + no_gradient(unreachable(stop_each([x]))[0]), x)
        with tf.compat.v1.Session() as session:
            np.testing.assert_array_equal(session.run(gradient), [2.0, 2.0])


# ---------------------------------------------------------------- the carrier

CARRIED = [1.0, np.nan, np.inf, -np.inf, -0.0]


def _carrier_derivatives(a, w):
    """carried_zero(a)·3 (a product, so that the derivative crosses an op after the carrier): value, gradient,
    JVP and tape.jacobian's diagonal."""
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(a)
        y = 3.0 * carried_zero(a)
    jacobian = tape.jacobian(y, a, experimental_use_pfor=True)
    return y, tape.gradient(y, a, output_gradients=w), jvp(lambda a: 3.0 * carried_zero(a), a, w), \
        tf.linalg.diag_part(jacobian)


@pytest.mark.parametrize("mode", MODES)
def test_carried_zero_is_zero_with_its_operand_derivative_at_every_element(mode):
    """Value +0.0 where a is inf or NaN, a's bits where finite; the derivative passes at every element, in
    reverse and forward mode and through tape.jacobian's pfor. Truth: the derivative of 3·a."""
    a, w = tf.constant(CARRIED), tf.constant([2.0, -1.0, 0.5, 4.0, -3.0])
    value, grad, tangent, diagonal = in_mode(_carrier_derivatives, mode)(a, w)
    np.testing.assert_array_equal(bits(value.numpy()), bits(np.float32([3.0, 0.0, 0.0, 0.0, -0.0])))
    np.testing.assert_array_equal(grad, 3.0 * w.numpy())
    np.testing.assert_array_equal(tangent, 3.0 * w.numpy())
    np.testing.assert_array_equal(diagonal, [3.0] * 5)


def test_carried_zero_under_tf1_gradients():
    with tf.Graph().as_default():
        a = tf.constant(CARRIED)
        (grad,) = tf.gradients(3.0 * carried_zero(a), a)
        with tf.compat.v1.Session() as session:
            np.testing.assert_array_equal(session.run(grad), [3.0] * 5)


def test_carried_zero_through_vectorized_map_keeps_only_the_finite_elements_derivative_the_stated_limit():
    """A gradient through tf.vectorized_map differentiates pfor's copy of the ops, which drops every registered
    gradient (tf.custom_gradient's entirely): the ordinary ops' derivative is left, a's where a is finite and 0
    where not (docs/tensorflow.md). A gradient taken inside the mapped function is exact (the next test)."""
    rows = tf.constant([CARRIED, CARRIED[::-1]])
    np.testing.assert_array_equal(vjp(lambda a: tf.vectorized_map(carried_zero, a), rows),
                                  np.isfinite(rows.numpy()).astype(np.float32))
    anchor = tf.custom_gradient(lambda a: (tf.identity(a), lambda upstream: 5.0 * upstream))
    np.testing.assert_array_equal(vjp(lambda a: tf.vectorized_map(anchor, a), rows), np.ones([2, 5]))


def test_carried_zero_gradients_inside_vectorized_map_are_exact():
    rows = tf.constant([CARRIED, CARRIED[::-1]])
    per_row = tf.vectorized_map(lambda a: vjp(lambda a: 3.0 * carried_zero(a), a), rows)
    np.testing.assert_array_equal(per_row, np.full([2, 5], 3.0))


@pytest.mark.parametrize("mode", MODES)
def test_carried_zero_second_derivatives_are_a_s(mode):
    """c(a)·a, c(a) being a where a is finite and 0 where not: its gradient is a + c(a) and its second
    derivative (a tape over a tape) 2 at every element, the derivatives of a·a, NaN and inf a included."""
    a = tf.constant(CARRIED)
    grad, second = in_mode(lambda a: gradient_and_second(lambda a: carried_zero(a) * a, a), mode)(a)
    np.testing.assert_array_equal(bits(grad.numpy()), bits(np.float32([2.0, np.nan, np.inf, -np.inf, -0.0])))
    np.testing.assert_array_equal(second, [2.0] * 5)


_LOAD_AND_DIFFERENTIATE = """
import sys, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
a = tf.constant([1.0, np.nan, np.inf, -np.inf, -0.0])
with tf.GradientTape() as tape:
    tape.watch(a)
    y = loaded(a)
print(tape.gradient(y, a).numpy().tolist())
"""


@pytest.mark.parametrize("custom_gradients", [True, False], ids=["with custom gradients", "without"])
def test_carried_zero_in_a_saved_model_loaded_by_a_fresh_process(tmp_path, custom_gradients):
    """Where no gradient registered by this process exists. Saved with its custom gradient (TensorFlow's
    default), the carrier passes every element's derivative. Saved without, a gradient raises TensorFlow's
    LookupError, as it does for tf.custom_gradient saved so (the stated limit, docs/tensorflow.md): loud, never
    a derivative that lost its custom part."""

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, a):
            return 3.0 * carried_zero(a)

    options = tf.saved_model.SaveOptions(experimental_custom_gradients=custom_gradients)
    tf.saved_model.save(Model(), str(tmp_path), options=options)
    run = subprocess.run([sys.executable, "-c", _LOAD_AND_DIFFERENTIATE, str(tmp_path)], capture_output=True,
                         text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if custom_gradients:
        assert run.returncode == 0, run.stderr[-2000:]
        np.testing.assert_array_equal(json.loads(run.stdout.strip().splitlines()[-1].replace("nan", "NaN")),
                                      [3.0] * 5)
    else:
        assert run.returncode != 0 and "LookupError: No gradient defined" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("mode", MODES)
def test_carried_zero_of_a_finite_zero_is_the_zero_itself_bit_for_bit(mode):
    """As the identity uses it, on x − stop(x) with x finite (−0.0, a denormal, 3e38): the carrier's value,
    gradient and JVP are x − stop(x)'s own, computed by TensorFlow from the ops, bit for bit, for upstreams
    with −0.0, inf and NaN."""
    x = tf.constant([1.0, -0.0, 3e38, -1e-40, 0.0])
    w = tf.constant([-0.0, np.inf, np.nan, 2.0, -5.0])
    plain = lambda x: x - tf.stop_gradient(x)  # noqa: E731

    def parts(fn, x):
        return fn(x), vjp(fn, x, w), jvp(fn, x, w)

    carried = lambda x: carried_zero(plain(x))  # noqa: E731
    for got, want in zip(in_mode(lambda x: parts(carried, x), mode)(x),
                         in_mode(lambda x: parts(plain, x), mode)(x), strict=True):
        np.testing.assert_array_equal(bits(got.numpy()), bits(want.numpy()))
