"""The identity form and every helper where shapes are known only at run time.

For the same run-time shapes, eager, tf.function (unknown rank, and known rank
with unknown dimensions), XLA and TF1 graphs give the same value, gradient and
forward derivative, each checked against a NumPy model of the layout table
written from its definition; a misfit is an error in every mode.
"""

import functools
import math

import numpy as np
import pytest
import tensorflow as tf
from helpers import bits
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import stopgrad_math as sgm

MISFIT = "fits no layout"

# ---------------------------------------------------------------- the layout table in NumPy


def numpy_broadcast(*shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def numpy_layout(fx, x, gx):
    if gx == fx + x:
        return "jacobian"
    if numpy_broadcast(gx, x) == fx:
        return "elementwise"
    if numpy_broadcast(gx, x) == x:
        return "scalar" if math.prod(fx) == 1 else "sum"
    return None


def unbroadcast(a, shape):
    """Sums a over the axes along which an array of ``shape`` was broadcast to a.shape."""
    a = a.sum(axis=tuple(range(a.ndim - len(shape))))
    return a.sum(axis=tuple(i for i, d in enumerate(shape) if d == 1), keepdims=True).reshape(shape)


def numpy_derivatives(fx, x, g, w, t):
    """(vjp for upstream w, jvp for tangent t) of the term whose derivative g the table defines."""
    layout = numpy_layout(fx.shape, x.shape, g.shape)
    if layout == "jacobian":
        matrix = g.reshape(fx.size, x.size)
        return (w.reshape(-1) @ matrix).reshape(x.shape), (matrix @ t.reshape(-1)).reshape(fx.shape)
    if layout == "elementwise":
        spread = np.broadcast_to(g, fx.shape)
        return unbroadcast(w * spread, x.shape), spread * np.broadcast_to(t, fx.shape)
    spread = np.broadcast_to(g, x.shape)
    size = 1 if layout == "scalar" else max(fx.size, 1)
    return w.sum() / size * spread, np.full(fx.shape, (spread * t).sum() / size)


# ---------------------------------------------------------------- the identity form in every mode


def value_vjp_jvp(fx, g, x, w, t):
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = sgm.custom_gradient(fx, g, x)
    with tf.autodiff.ForwardAccumulator(x, t) as acc:
        forward = sgm.custom_gradient(fx, g, x)
    return value, tape.gradient(value, x, output_gradients=w), acc.jvp(forward)


UNKNOWN_RANK = [tf.TensorSpec(None, tf.float64)] * 5
in_function = tf.function(value_vjp_jvp, input_signature=UNKNOWN_RANK)
in_xla = tf.function(value_vjp_jvp, input_signature=UNKNOWN_RANK, jit_compile=True)


@functools.cache
def in_function_of_ranks(*ranks):
    """value_vjp_jvp traced with every dimension unknown but the ranks known."""
    return tf.function(value_vjp_jvp, input_signature=[tf.TensorSpec([None] * r, tf.float64) for r in ranks])


@functools.cache
def tf1_session():
    """A TF1 session over tf.gradients through the identity, with placeholders of unknown shape."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf.compat.v1.placeholder(tf.float64, shape=None) for _ in range(4)]
        fx, g, x, w = inputs
        value = sgm.custom_gradient(fx, g, x)
        (grad,) = tf.gradients(value, [x], grad_ys=w)
    return tf.compat.v1.Session(graph=graph), inputs, [value, grad]


def run_tf1(fx, g, x, w):
    session, inputs, outputs = tf1_session()
    return session.run(outputs, dict(zip(inputs, (fx, g, x, w), strict=True)))


def run_every_mode(fx, g, x, w, t):
    tensors = [tf.constant(a) for a in (fx, g, x, w, t)]
    ranks = [a.ndim for a in (fx, g, x, w, t)]
    modes = {
        "eager": lambda: value_vjp_jvp(*tensors),
        "function, unknown rank": lambda: in_function(*tensors),
        "function, known rank": lambda: in_function_of_ranks(*ranks)(*tensors),
        "xla": lambda: in_xla(*tensors),
        "tf1": lambda: [*run_tf1(fx, g, x, w), None],
    }
    results = {}
    for mode, run in modes.items():
        try:
            results[mode] = [None if r is None else np.asarray(r) for r in run()]
        except (ValueError, tf.errors.InvalidArgumentError) as error:
            results[mode] = error
    return results


# ---------------------------------------------------------------- shapes that hit every layout


SIDES = st.integers(0, 3)


def shapes(max_dims=2):
    return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=3)


@st.composite
def shape_triples(draw):
    """(fx, x, gx) shapes aimed at each layout in turn, and at none."""
    aim = draw(st.sampled_from(["jacobian", "elementwise", "one element", "sum", "anything"]))
    if aim == "jacobian":
        fx, x = draw(shapes()), draw(shapes())
        return fx, x, fx + x
    if aim == "elementwise":
        gx, x = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0)).input_shapes
        return np.broadcast_shapes(gx, x), x, gx
    x = draw(shapes(3))
    gx = draw(hnp.broadcastable_shapes(x, min_side=0, max_dims=len(x)).filter(lambda s: numpy_broadcast(s, x) == x))
    fx = (1,) * draw(st.integers(0, 2)) if aim == "one element" else draw(shapes())
    return (fx, x, gx) if aim != "anything" else (draw(shapes()), draw(shapes()), draw(shapes()))


def arrays_for(fx, x, gx, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(-4, 5, size=s).astype(np.float64) / 2 for s in (fx, gx, x, fx, x)]


@given(triple=shape_triples(), seed=st.integers(0, 2**16))
@settings(max_examples=30)
def test_every_mode_gives_the_layout_tables_derivative_or_an_error(triple, seed):
    fx_shape, x_shape, gx_shape = triple
    fx, g, x, w, t = arrays_for(fx_shape, x_shape, gx_shape, seed)
    results = run_every_mode(fx, g, x, w, t)
    if numpy_layout(fx_shape, x_shape, gx_shape) is None:
        for mode, result in results.items():
            assert isinstance(result, Exception), (mode, triple)
            if isinstance(result, ValueError):  # while tracing: eager, or where known ranks already decide
                assert mode in ("eager", "function, known rank") and MISFIT in str(result), (mode, result)
            else:  # XLA cannot run an Assert: it refuses to compile the check instead
                assert isinstance(result, tf.errors.InvalidArgumentError), (mode, result)
                assert (MISFIT if mode != "xla" else "shape_check_failed") in str(result), (mode, result)
        return
    want_vjp, want_jvp = numpy_derivatives(fx, x, g, w, t)
    for mode, result in results.items():
        assert not isinstance(result, Exception), (mode, triple, result)
        value, vjp, jvp = result
        np.testing.assert_array_equal(bits(value), bits(fx), err_msg=mode)
        np.testing.assert_allclose(vjp, want_vjp, rtol=1e-12, atol=1e-12, err_msg=mode)
        if jvp is not None:  # TF1 graphs have no forward mode
            np.testing.assert_allclose(jvp, want_jvp, rtol=1e-12, atol=1e-12, err_msg=mode)


def test_tfp_sum_rule_under_a_batch_dimension_of_none():
    """The issue's case: fx of 1 or 4 elements with x, gx of 3 under TensorSpec([None])."""
    x, g = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    for fx in (np.array([7.0]), np.array([1.0, 2.0, 3.0, 4.0])):
        w = np.arange(1.0, fx.size + 1)
        results = run_every_mode(fx, g, x, w, np.ones(3))
        for mode, (value, vjp, _) in results.items():
            np.testing.assert_array_equal(value, fx, err_msg=mode)
            np.testing.assert_allclose(vjp, w.sum() / fx.size * g, rtol=1e-15, err_msg=mode)


def test_run_time_misfit_has_the_static_words():
    fx, g, x = np.ones(2), np.ones(4), np.ones(3)
    with pytest.raises(ValueError) as static:
        sgm.custom_gradient(tf.constant(fx), tf.constant(g), tf.constant(x))
    with pytest.raises(tf.errors.InvalidArgumentError) as run_time:
        in_function(*(tf.constant(a) for a in (fx, g, x, fx, x)))
    head, tail = str(static.value).split(". A gradient must be")
    assert head.split(":")[0] in str(run_time.value)  # "The gradient for x fits no layout"
    assert "A gradient must be" + tail.split("(shape fx.shape + x.shape")[0] in str(run_time.value)
    for shape in ("[2]", "[3]", "[4]"):
        assert shape in str(run_time.value)


# ---------------------------------------------------------------- what static shapes decide costs nothing


# Ops in each traced program (value and gradient, static shapes) before run-time layouts existed; since then
# reverse_gradient has one fewer (a Python scale is negated in Python, not by a Neg op), and it and
# scale_gradient one fewer again (one StopGradient of x serves the value and the zero); since issue 54 each zero
# x − stop(x) is one call of the carrier and one call of its gradient where it was a finite mask (IsFinite, Cast,
# MulNoNan, and MulNoNan in the gradient): three fewer for each argument.
OPS_BEFORE = {
    "elementwise": 18, "jacobian": 34, "scalar": 31, "sum": 38, "nested": 37, "partial": 26,
    "straight_through": 13, "scale_gradient": 21, "reverse_gradient": 21, "stop_gradient_where": 15, "magic_box": 11,
}  # fmt: skip
S = tf.TensorSpec
STATIC_PROGRAMS = {
    "elementwise": (lambda x: sgm.custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x), [S([3, 2])]),
    "jacobian": (lambda x: sgm.custom_gradient(tf.ones([2]), tf.ones([2, 3]), x), [S([3])]),
    "scalar": (lambda x: sgm.custom_gradient(tf.reduce_sum(x), 2 * x, x), [S([3])]),
    "sum": (lambda x: sgm.custom_gradient(tf.ones([2]), x, x), [S([3])]),
    "nested": (
        lambda a, b: sgm.custom_gradient(a * 2.0, {"a": a, "b": tf.ones([2, 3])}, {"a": a, "b": b}),
        [S([2, 3]), S([3])],
    ),
    "partial": (
        lambda x, y: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y),
        [S([3]), S([3])],
    ),
    "straight_through": (lambda x: sgm.straight_through(tf.round(x), x), [S([3])]),
    "scale_gradient": (lambda x: sgm.scale_gradient(x, 0.5), [S([3])]),
    "reverse_gradient": (lambda x: sgm.reverse_gradient(x, 0.5), [S([3])]),
    "stop_gradient_where": (lambda x: sgm.stop_gradient_where(x, x > 0), [S([3])]),
    "magic_box": (lambda x: sgm.magic_box(x), [S([3])]),
}


@pytest.mark.parametrize("name", sorted(STATIC_PROGRAMS))
def test_static_shapes_trace_exactly_the_ops_they_did_before(name):
    build, specs = STATIC_PROGRAMS[name]

    def value_and_grad(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = build(*xs)
        return y, tape.gradient(y, xs)

    graph = tf.function(value_and_grad).get_concrete_function(*specs).graph
    assert len(graph.get_operations()) == OPS_BEFORE[name]


# ---------------------------------------------------------------- every helper


def _partial(x, y):
    return sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)


# name: (helper, arguments, derivative w.r.t. the first for upstream w, arguments that do not fit, error words)
HELPERS = {
    "straight_through": (
        lambda b, f: sgm.straight_through(f, b),
        [np.array([0.5, 1.0, 2.0]), np.array([[1.4, 0.2, 2.6], [-1.0, 0.0, 3.0]])],
        lambda w, b, f: w.sum(axis=0), [np.ones([2, 3]), np.ones([3])], "backward of shape",
    ),
    "stop_gradient_where": (
        sgm.stop_gradient_where, [np.array([[1.0, -2.0, 3.0]]), np.array([True, False, True])],
        lambda w, x, m: w * ~m, [np.ones([3]), np.array([[True] * 3] * 2)], "mask of shape",
    ),
    "scale_gradient": (
        sgm.scale_gradient, [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.5, -2.0])],
        lambda w, x, s: w * s, [np.ones([2]), np.ones([3])], "scale of shape",
    ),
    "reverse_gradient": (
        sgm.reverse_gradient, [np.array([1.0, 2.0, 3.0]), np.array(0.25)],
        lambda w, x, s: -w * s, [np.ones([3]), np.ones([2, 3])], "scale of shape",
    ),
    "magic_box": (sgm.magic_box, [np.array([0.3, -1.0])], lambda w, t: w, None, None),
    "zero_with_gradient": (sgm.zero_with_gradient, [np.array([[2.0, -0.0]])], lambda w, x: w, None, None),
    "partial_custom_gradient": (
        _partial, [np.array([1.0, 2.0]), np.array([3.0, -1.0])], lambda w, x, y: 2 * y * w, None, None,
    ),
    "stop_gradient": (
        lambda x: x + sgm.stop_gradient({"a": x})["a"], [np.array([4.0, 5.0])], lambda w, x: w, None, None,
    ),
}  # fmt: skip


# name: the value from the helper's definition, in NumPy (never the library's own eager output)
VALUES = {
    "straight_through": lambda b, f: f,
    "stop_gradient_where": lambda x, m: x,
    "scale_gradient": lambda x, s: x,
    "reverse_gradient": lambda x, s: x,
    "magic_box": lambda t: np.ones_like(t),
    "zero_with_gradient": lambda x: np.zeros_like(x),  # +0.0, also at x = −0.0
    "partial_custom_gradient": lambda x, y: x * y,
    "stop_gradient": lambda x: x + x,
}


def helper_value_and_vjp(helper, first, *rest):
    with tf.GradientTape() as tape:
        tape.watch(first)
        value = helper(first, *rest)
    upstream = tf.reshape(tf.range(1, tf.size(value) + 1, dtype=value.dtype), tf.shape(value))
    return value, tape.gradient(value, first, output_gradients=upstream), upstream


def helper_in_every_mode(helper, arguments):
    tensors = [tf.constant(a) for a in arguments]
    signature = [tf.TensorSpec(None, t.dtype) for t in tensors]
    run = functools.partial(helper_value_and_vjp, helper)
    results = {"eager": lambda: run(*tensors)}
    results["function"] = lambda: tf.function(run, input_signature=signature)(*tensors)
    results["xla"] = lambda: tf.function(run, input_signature=signature, jit_compile=True)(*tensors)

    def tf1():
        graph = tf.Graph()
        with graph.as_default():
            inputs = [tf.compat.v1.placeholder(t.dtype, shape=None) for t in tensors]
            value = helper(*inputs)
            upstream = tf.reshape(tf.range(1, tf.size(value) + 1, dtype=value.dtype), tf.shape(value))
            (grad,) = tf.gradients(value, inputs[:1], grad_ys=upstream)
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run([value, grad, upstream], dict(zip(inputs, arguments, strict=True)))

    results["tf1"] = tf1
    return results


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helpers_under_unknown_shapes_in_every_mode(name):
    helper, arguments, derivative, _, _ = HELPERS[name]
    want = VALUES[name](*arguments)
    for mode, run in helper_in_every_mode(helper, arguments).items():
        value, grad, upstream = (np.asarray(r) for r in run())
        np.testing.assert_array_equal(bits(value), bits(np.asarray(want, value.dtype)), err_msg=mode)
        np.testing.assert_allclose(grad, derivative(upstream, *arguments), rtol=1e-6, err_msg=mode)


@pytest.mark.parametrize("name", sorted(n for n, case in HELPERS.items() if case[3] is not None))
def test_helpers_refuse_shapes_that_do_not_broadcast_in_every_mode(name):
    helper, _, _, misfit, words = HELPERS[name]
    for mode, run in helper_in_every_mode(helper, misfit).items():
        expected = ValueError if mode == "eager" else tf.errors.InvalidArgumentError
        with pytest.raises(expected, match=words if mode != "xla" else "shape_check_failed"):
            run()
