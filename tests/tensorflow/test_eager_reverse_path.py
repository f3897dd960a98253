"""Issue 75 on TensorFlow: eagerly, under one tape alone, the decorator at ``order=1`` records grad_fn as the
backward (−grad_fn(−ȳ), run when the tape asks) instead of forming J·v at every call for the tape to transpose
back. It is a fast path of the definition: each gradient here is the transpose route's, bit for bit (−0.0, NaN's
sign, a complex zero's), with the path forced off for the reference, and the path is taken (counted).

The grad_fns restated from real code: an elementwise rule at awkward values, a linear layer's (ct·Wᵀ, Xᵀ·ct)
with a NaN in X, a sum's broadcast, two outputs whose gradients add, three uses of the upstream, a complex sine,
half precision, an embedding's rows (tf.IndexedSlices), a gradient for one argument of two, and a quantizer with
a closed-over scale; and hypothesis's shapes (0-d and empty), dtypes and awkward values.
"""

from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from bit_patterns import bits
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import stopgrad_math as sgm
from stopgrad_math.tensorflow import decorator_form, recorded_term

AWKWARD = [0.5, 100.0, -0.0, 0.0, -3.0, np.inf, -np.inf, np.nan]


def _log1pexp(x):
    e = tf.exp(x)
    return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))


def _linear(x, w):
    return tf.matmul(x, w), lambda ct: (tf.matmul(ct, w, transpose_b=True), tf.matmul(x, ct, transpose_a=True))


def _row_sum(x):
    return tf.reduce_sum(x, axis=1), lambda ct: tf.broadcast_to(ct[:, None], tf.shape(x))


def _sin_cos(x):
    return (tf.sin(x), tf.cos(x)), lambda d_sin, d_cos: d_sin * tf.cos(x) - d_cos * tf.sin(x)


def _three_uses(x):
    return 6.0 * x, lambda dy: 1.5 * dy + 2.5 * dy + 2.0 * dy


def _sin(x):
    return tf.sin(x), lambda dy: dy * tf.math.conj(tf.cos(x))


def _lookup(table, ids):
    rows = tf.gather(table, ids)
    return rows, lambda ct: (tf.IndexedSlices(ct, ids, tf.shape(table, out_type=ids.dtype)), None)


def _scaled(x, scale):
    return x * scale, lambda ct: (ct * scale, None)


SCALE = tf.constant(0.1)


def _quantize(x):
    y = tf.round(x / SCALE) * SCALE
    return y, lambda ct: ct * tf.cast(tf.abs(x) < 1.0, ct.dtype)


def _x(values, dtype=tf.float32):
    return tf.constant(np.asarray(values), dtype)


def _cases():
    rng = np.random.default_rng(0)
    x_nan = rng.standard_normal((3, 4)).astype(np.float32)
    x_nan[1, 2] = np.nan
    return {
        "elementwise": (_log1pexp, [_x(AWKWARD)], _x([1.0, 2.0, -0.0, -1.0, 0.0, -0.0, np.inf, np.nan])),
        "linear layer": (_linear, [_x(x_nan), _x(rng.standard_normal((4, 2)))], _x(rng.standard_normal((3, 2)))),
        "row sum": (_row_sum, [_x(rng.standard_normal((3, 4)))], _x([1.0, -0.0, np.nan])),
        "two outputs": (_sin_cos, [_x(AWKWARD)], (_x(AWKWARD[::-1]), _x(np.ones(8)))),
        "three uses": (_three_uses, [_x(AWKWARD)], _x(AWKWARD[::-1])),
        "complex": (_sin, [_x([0.5, -0.0, 2.0, np.nan], tf.complex64)], _x([1.0, 1j, -0.0, 1.0], tf.complex64)),
        "float16": (_log1pexp, [_x(AWKWARD, tf.float16)], _x(AWKWARD[::-1], tf.float16)),
        "rows": (_lookup, [_x(rng.standard_normal((5, 2))), tf.constant([3, 0, 3])], _x(rng.standard_normal((3, 2)))),
        "one of two": (_scaled, [_x([1.0, -2.0, np.inf]), tf.constant(3.0)], _x([np.nan, 1.0, -0.0])),
        "quantizer": (_quantize, [_x(rng.standard_normal((6, 5)) * 2)], _x(rng.standard_normal((6, 5)))),
    }


CASES = _cases()


def _gradients(body, arguments, upstream):
    decorated = sgm.custom_gradient(body)
    differentiable = [a for a in arguments if a.dtype.is_floating or a.dtype.is_complex]
    with tf.GradientTape() as tape:
        tape.watch(differentiable)
        y = decorated(*arguments)
    gradients = tape.gradient(y, differentiable, output_gradients=upstream)
    # an IndexedSlices' rows summed, as a user reads them; None where grad_fn gives none
    return [None if g is None else tf.convert_to_tensor(g).numpy() for g in gradients]


@pytest.mark.parametrize("name", list(CASES))
def test_the_eager_reverse_path_is_the_transpose_routes_bits(name, monkeypatch):
    body, arguments, upstream = CASES[name]
    taken = []
    record = recorded_term.grad_fn_recorded
    monkeypatch.setattr(recorded_term, "grad_fn_recorded", lambda plan: taken.append(1) or record(plan))
    fast = _gradients(body, arguments, upstream)
    assert taken == [1]
    monkeypatch.setattr(decorator_form, "_reverse_alone", lambda plan: False)
    reference = _gradients(body, arguments, upstream)
    assert taken == [1]
    for got, want in zip(fast, reference, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_array_equal(bits(got), bits(want))


def test_the_path_gives_tf_custom_gradients_values_where_they_are_finite():
    """An independent truth beside the reference: tf.custom_gradient's grad_fn(ȳ), equal wherever a NaN's sign
    cannot differ."""
    body, arguments, upstream = CASES["linear layer"]
    ours = _gradients(body, arguments, upstream)
    with tf.GradientTape() as tape:
        tape.watch(arguments)
        y = tf.custom_gradient(body)(*arguments)
    theirs = tape.gradient(y, arguments, output_gradients=upstream)
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, want.numpy())
    assert np.isnan(ours[1]).any()  # the NaN in X reaches W's gradient, in its column


def test_a_persistent_tape_or_an_accumulator_takes_the_transpose_route():
    """Where a second derivative or a tangent can be asked, J·v is formed at the call: the path is not taken."""
    taken = []
    record = recorded_term.grad_fn_recorded
    x = _x([0.5, -3.0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recorded_term, "grad_fn_recorded", lambda plan: taken.append(1) or record(plan))
        decorated = sgm.custom_gradient(_log1pexp)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            decorated(x)
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            y = decorated(x)
        with tf.GradientTape() as tape, tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)):
            tape.watch(x)
            decorated(x)
    assert taken == []
    np.testing.assert_allclose(accumulator.jvp(y), tf.sigmoid(x), rtol=1e-6)


def test_a_variable_f_reads_keeps_its_autodiff_gradient():
    """y carries autodiff's path to a variable f reads (grad_fn gives none for it): the route's terms add to it."""
    v = tf.Variable(2.0)

    @sgm.custom_gradient
    def scaled(x):
        return x * v, lambda ct: ct * v

    x = _x([1.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = scaled(x)
    dx, dv = tape.gradient(y, [x, v])
    np.testing.assert_array_equal(dx, [2.0, 2.0])
    assert float(dv) == 4.0


def test_grad_fn_is_traced_once_per_signature_and_closure():
    """The route is proven once per input signature and closure (a new shape, a new closed-over value: a new
    proof), however often a training step calls."""
    traces = []

    def make(scale):
        @sgm.custom_gradient
        def scaled(x):
            def grad(dy):
                if tf.is_symbolic_tensor(dy):
                    traces.append(scale)
                return dy * scale
            return x * scale, grad
        return scaled

    for x, scale in [(_x([1.0, 2.0]), 2.0)] * 4 + [(_x([1.0, 2.0, 3.0]), 2.0), (_x([1.0, 2.0]), 3.0)]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = make(scale)(x)
        np.testing.assert_array_equal(tape.gradient(y, x), np.full(x.shape, scale, np.float32))
    assert traces == [2.0, 2.0, 3.0]


def test_a_closed_over_value_that_changes_grad_fns_ops_makes_a_new_proof():
    """A flag closed over chooses grad_fn's ops: a linear map TensorFlow transposes, or the same map through NumPy,
    which no tape follows (J from unit upstreams there). Each call's tangent is its own J·ẋ, whichever was proven
    first: a proof kept across closures would transpose through NumPy and lose the tangent."""
    def make(through_numpy):
        @sgm.custom_gradient
        def doubled(x):
            def grad(dy):
                if not through_numpy:
                    return 2.0 * dy
                return tf.ensure_shape(tf.numpy_function(lambda d: 2.0 * d, [dy], tf.float32), dy.shape)
            return 2.0 * x, grad
        return doubled

    x, tangent = _x([1.0, -2.0, 3.0, 0.5]), _x([1.0, 2.0, 3.0, 4.0])
    for through_numpy in (False, True):
        with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
            y = make(through_numpy)(x)
        np.testing.assert_array_equal(accumulator.jvp(y), 2.0 * tangent.numpy())


def test_at_order_2_one_tape_alone_makes_no_probe():
    """At ``order=2`` the backward is grad_fn already; the forward function's probe (grad_fn on watched zeros, for
    J·ẋ) is made only where an accumulator could ask: under one tape grad_fn runs once traced, then on the
    upstream alone. An accumulator still gets the exact tangent."""
    upstreams = []

    def logged(x):
        def grad(dy):
            upstreams.append("traced" if tf.is_symbolic_tensor(dy) else dy.numpy().tolist())
            return dy * tf.cos(x)
        return tf.sin(x), grad

    decorated = sgm.custom_gradient(order=2)(logged)
    x = _x([0.5, -1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = decorated(x)
    np.testing.assert_array_equal(tape.gradient(y, x, output_gradients=_x([3.0, 4.0])), _x([3.0, 4.0]) * tf.cos(x))
    assert upstreams == ["traced", [3.0, 4.0]]
    with tf.autodiff.ForwardAccumulator(x, _x([1.0, 2.0])) as accumulator:
        y = decorated(x)
    np.testing.assert_allclose(accumulator.jvp(y), _x([1.0, 2.0]) * tf.cos(x), rtol=1e-6)


_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32, "float64": tf.float64}
_VALUES = st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, 3e4, 1e-30])


@st.composite
def _awkward_cases(draw):
    """x, a derivative g that grad_fn closes over, and the upstream, as float64 arrays of one shape, and a dtype."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    x, g, upstream = (draw(hnp.arrays(np.float64, shape, elements=_VALUES)) for _ in range(3))
    return x, g, upstream, _DTYPES[draw(st.sampled_from(sorted(_DTYPES)))]


@settings(max_examples=40, deadline=None)
@given(_awkward_cases())
def test_any_shape_dtype_and_awkward_values_give_the_transpose_routes_bits(case):
    """grad_fn of two arguments (x elementwise, a scale by a sum), closing over an awkward derivative, at an awkward
    upstream, in every float dtype and shape: the path against the route forced off, bit for bit."""
    x, g, upstream, dtype = (*(tf.constant(a, tf.float64) for a in case[:3]), case[3])
    x, g, upstream = (tf.cast(t, dtype) for t in (x, g, upstream))

    def body(x, s):
        return x * s, lambda ct: (ct * g, tf.reduce_sum(ct * g))

    arguments = [x, tf.constant(1.0, dtype)]
    taken = []
    record = recorded_term.grad_fn_recorded
    with mock.patch.object(recorded_term, "grad_fn_recorded", lambda plan: taken.append(1) or record(plan)):
        fast = _gradients(body, arguments, upstream)
    with mock.patch.object(decorator_form, "_reverse_alone", lambda plan: False):
        reference = _gradients(body, arguments, upstream)
    assert taken == ([] if x.shape.num_elements() == 1 else [1])  # (one element: the identity form, J = grad_fn(1))
    for got, want in zip(fast, reference, strict=True):
        np.testing.assert_array_equal(bits(got), bits(want))
