"""tfp.math.custom_gradient's own test cases, and the issue's, side by side with ours.

TFP's tests (tensorflow_probability/python/math/custom_gradient_test.py) are
restated here in our words and run in every regime TFP's test_util covers and
more: eager, tf.function, XLA, and TF1 graphs with tf.gradients. Where tfp's
derivative is right, ours must equal it; where it is wrong (a non-scalar fx,
which tfp reads as "the gradient of the sum"), ours is checked against
autodiff of the same formula and the test says why the two differ. The
docs/tensorflow.md's "Deliberate differences from tfp" table lists the same cases.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from helpers import bits

from stopgrad_math import custom_gradient

REGIMES = ("eager", "function", "xla", "tf1")
ANCHOR = tfp.math.custom_gradient
NONE = "no gradient"  # session.run cannot fetch None


def tape_gradients(fn, xs, upstream=None):
    with tf.GradientTape() as tape:
        tape.watch(xs)
        y = fn(*xs)
    return y, tape.gradient(y, xs, output_gradients=upstream)


def graph_gradients(fn, xs, upstream=None):
    y = fn(*xs)
    return y, tf.gradients(y, xs, grad_ys=upstream)


def run(case, cg, regime):
    """case(cg, gradients, variables) in a regime; the result as NumPy, None gradients as NONE.

    ``variables(*values)`` makes the case's tf.Variables once: tf.function
    traces twice when the first trace makes one, and the second must reuse it.
    """
    made = []

    def variables(*values):
        if not made:
            made.extend(tf.Variable(v) for v in values)
        return made

    if regime == "tf1":
        graph = tf.Graph()
        with graph.as_default():
            out = case(cg, graph_gradients, variables)
            out = tf.nest.map_structure(lambda t: tf.constant(NONE) if t is None else t, out)
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            out = session.run(out)
        return tf.nest.map_structure(lambda a: None if isinstance(a, bytes) else np.asarray(a), out)
    fn = lambda: case(cg, tape_gradients, variables)  # noqa: E731
    out = fn() if regime == "eager" else tf.function(fn, jit_compile=(regime == "xla"))()
    return tf.nest.map_structure(lambda t: None if t is None else np.asarray(t), out)


def assert_same(a, b, rtol=0.0):
    tf.nest.assert_same_structure(a, b, check_types=False)
    for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=rtol)


# ---------------------------------------------------------------- TFP's cases, where tfp is right: the same answer


X = np.concatenate([np.linspace(-100, 100, 1000), [0.0]])


def works_correctly(cg, gradients, variables):  # tfp: f = x²/2 given the gradient (x − 1)³/3, upstream ones
    return gradients(lambda x: cg(x**2 / 2, (x - 1) ** 3 / 3, x), [tf.constant(X)])


def works_correctly_both_f_g_zero(cg, gradients, variables):  # tfp: both f and g zero at x = 0
    return gradients(lambda x: cg(x**2 / 2, x**3 / 3, x), [tf.constant(X)])


def vector_of_vars(cg, gradients, variables):  # tfp: a scalar fx of z = stack([x, y]) with a scalar gx: 18 to both
    x, y = variables(2.0, 3.0)

    def embedded(x, y):
        z = tf.stack([x, y])
        return cg(z[0] * z[1], z[0] ** 2 * z[1] ** 2 / 2, z)

    return gradients(embedded, [x, y])


def side_vars(cg, gradients, variables):  # tfp: y enters fx only, so it gets no gradient
    x, y = variables(np.float32(2.1), np.float32(3.1))
    return gradients(lambda x, y: cg(x * y, tf.square(x) * y, x), [x, y])


def fx_gx_manually_stopped(cg, gradients, variables):  # tfp: the y parts left live give dy = x
    x, y = variables(np.float32(2.1), np.float32(3.1))
    stop = tf.stop_gradient

    def embedded(x, y):
        return cg(stop(x) * y, stop(tf.square(x)) * y, x + stop(y), fx_gx_manually_stopped=True)

    return gradients(embedded, [x, y])


def several_x(cg, gradients, variables):  # a scalar log-likelihood of two parameters
    a, b = tf.constant([1.0, -2.0]), tf.constant([[0.5, 0.25], [3.0, -1.0]])
    return gradients(lambda a, b: cg(tf.reduce_sum(a) * tf.reduce_sum(b), [a * 3, b * 2], [a, b]), [a, b])


def complex_scalar(cg, gradients, variables):  # complex fx = sum(x·x), gx = 2x: TF's holomorphic convention, conj(2x)
    z = tf.constant([1.0 + 2.0j, -0.5 + 0.25j], tf.complex128)
    return gradients(lambda z: cg(tf.reduce_sum(z * z), 2 * z, z), [z], tf.constant(1.0 + 0j, tf.complex128))


X21, Y31 = np.float32(2.1), np.float32(3.1)  # tfp's "extra tenth to force imprecision"
SAME_AS_TFP = {
    "works_correctly": (works_correctly, lambda: [X**2 / 2, [(X - 1) ** 3 / 3]]),
    "works_correctly_both_f_g_zero": (works_correctly_both_f_g_zero, lambda: [X**2 / 2, [X**3 / 3]]),
    "vector_of_vars": (vector_of_vars, lambda: [6.0, [18.0, 18.0]]),
    "side_vars": (side_vars, lambda: [X21 * Y31, [X21**2 * Y31, None]]),
    "fx_gx_manually_stopped": (fx_gx_manually_stopped, lambda: [X21 * Y31, [X21**2 * Y31, X21]]),
    "several_x": (several_x, lambda: [-1.0 * 2.75, [np.array([3.0, -6.0]), np.array([[1.0, 0.5], [6.0, -2.0]])]]),
    "complex_scalar": (complex_scalar, lambda: [(1 + 2j) ** 2 + (-0.5 + 0.25j) ** 2, [np.conj([2 + 4j, -1 + 0.5j])]]),
}  # fmt: skip


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("name", sorted(SAME_AS_TFP))
def test_tfp_cases_give_tfps_answer(name, regime):
    case, truth = SAME_AS_TFP[name]
    ours, anchor = run(case, custom_gradient, regime), run(case, ANCHOR, regime)
    assert_same(ours, anchor, rtol=1e-6 if regime == "xla" else 0.0)  # XLA may reassociate tfp's sums
    assert_same(ours, truth(), rtol=1e-6)


# ---------------------------------------------------------------- dynamic shapes: tfp's sum rule, decided at run time


@pytest.mark.parametrize("regime", ["function", "xla", "tf1"])
@pytest.mark.parametrize("fx_size", [1, 4])
def test_tfp_sum_rule_with_shapes_known_only_at_run_time(fx_size, regime):
    fx_value, g_value, x_value = np.arange(1.0, fx_size + 1), np.array([0.5, -1.0, 2.0]), np.array([1.0, 2.0, 3.0])

    def case(cg, gradients, variables):
        if regime == "tf1":
            fx, g, x = (tf.compat.v1.placeholder_with_default(v, shape=None) for v in (fx_value, g_value, x_value))
        else:  # a batch dimension of None, as TensorSpec([None]) gives
            fx, g, x = (tf.compat.v1.placeholder_with_default(v, shape=[None]) for v in (fx_value, g_value, x_value))
        return gradients(lambda x: cg(fx, g, x), [x], tf.ones_like(fx) * 2.0)

    ours, anchor = run(case, custom_gradient, regime), run(case, ANCHOR, regime)
    assert_same(ours, anchor)
    assert_same(ours, [fx_value, [2.0 * g_value]])  # the gradient of 2·sum(fx) is 2·gx, whatever size(fx)


# ---------------------------------------------------------------- where tfp is wrong or refuses: ours against a truth


def weighted_vector_loss(cg, gradients, variables):
    """A vector fx read with an upstream that is not all ones: tfp spreads the sum, so d/dx is wrong."""
    x = tf.constant([-1.0, 0.0, 2.0, 100.0])
    upstream = tf.constant([1.0, 0.0, 3.0, 0.5])
    return gradients(lambda x: cg(tf.math.softplus(x), tf.math.sigmoid(x), x), [x], upstream)


def forward_mode_of_a_vector(cg, gradients, variables):
    """The forward derivative of a vector fx: tfp's gx·u is summed and spread, so each element gets the mean."""
    x = tf.constant([-1.0, 0.0, 2.0])
    with tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, 2.0, 3.0])) as acc:
        y = cg(tf.math.softplus(x), tf.math.sigmoid(x), x)
    return y, acc.jvp(y)


def python_float_for_a_matrix(cg, gradients, variables):
    """A scalar fx with a Python-float gx for a matrix x: the same derivative at every element (tfp raises)."""
    x = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    return gradients(lambda x: cg(tf.reduce_sum(x) * 0.5, 0.5, x), [x])


def infinite_gx(cg, gradients, variables):
    """sqrt at 0 with its derivative inf: tfp's value is NaN everywhere (inf · 0); ours is sqrt(x) exactly."""
    x = tf.constant([0.0, 4.0])
    return gradients(lambda x: cg(tf.sqrt(x), 0.5 / tf.sqrt(x), x), [x])


def infinite_x(cg, gradients, variables):
    """An x of inf: tfp's value is NaN (inf − inf); ours keeps fx, and gives that element the declared gx as
    tfp does (the carrier keeps both where ordinary ops can keep only one)."""
    y = tf.constant([np.inf, 1.0])
    return gradients(lambda y: cg(tf.ones(2), 3 * tf.ones(2), y), [y])


S, D = tf.math.sigmoid, tf.constant([-1.0, 0.0, 2.0])
DIFFERENT_FROM_TFP = {  # name: (case, truth, tfp's answer or the exception it raises)
    "weighted_vector_loss": (
        weighted_vector_loss,
        lambda: [tf.math.softplus([-1.0, 0.0, 2.0, 100.0]), [S([-1.0, 0.0, 2.0, 100.0]) * [1.0, 0.0, 3.0, 0.5]]],
        lambda: [tf.math.softplus([-1.0, 0.0, 2.0, 100.0]), [S([-1.0, 0.0, 2.0, 100.0]) * 4.5 / 4]],
    ),
    "forward_mode_of_a_vector": (
        forward_mode_of_a_vector,
        lambda: [tf.math.softplus(D), S(D) * [1.0, 2.0, 3.0]],
        lambda: [tf.math.softplus(D), tf.fill([3], tf.reduce_sum(S(D) * [1.0, 2.0, 3.0]) / 3)],
    ),
    "python_float_for_a_matrix": (
        python_float_for_a_matrix, lambda: [10.5, [np.full([2, 3], 0.5)]], (ValueError, tf.errors.InvalidArgumentError),
    ),
    "infinite_gx": (
        infinite_gx, lambda: [np.array([0.0, 2.0]), [np.array([np.inf, 0.25])]],
        lambda: [np.array([np.nan, np.nan]), [np.array([np.inf, 0.25])]],
    ),
    "infinite_x": (
        infinite_x, lambda: [np.array([1.0, 1.0]), [np.array([3.0, 3.0])]],
        lambda: [np.array([np.nan, np.nan]), [np.array([3.0, 3.0])]],
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "name, regime",
    [(n, r) for n in sorted(DIFFERENT_FROM_TFP) for r in REGIMES if (n, r) != ("forward_mode_of_a_vector", "tf1")],
)  # TF1 graphs have no forward mode
def test_where_tfp_is_wrong_ours_equals_the_truth(name, regime):
    case, truth, anchor_answer = DIFFERENT_FROM_TFP[name]
    assert_same(run(case, custom_gradient, regime), tf.nest.map_structure(np.asarray, truth()), rtol=1e-6)
    if isinstance(anchor_answer, tuple):
        with pytest.raises(anchor_answer):
            run(case, ANCHOR, regime)
    else:  # the anchor's measured answer, so that the difference stays documented
        assert_same(run(case, ANCHOR, regime), tf.nest.map_structure(np.asarray, anchor_answer()), rtol=1e-6)


def test_the_value_is_fx_bit_for_bit_where_tfp_rounds_it():
    """tfp adds sum(gx·u)/size(fx) to fx: +0.0 turns −0.0 into +0.0; ours subtracts +0.0, which keeps it."""
    x = tf.constant([1.0, 2.0])
    fx = tf.constant([-0.0, 3.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours, anchor = custom_gradient(fx, x, x), ANCHOR(fx, x, x)
    np.testing.assert_array_equal(bits(ours.numpy()), bits(fx.numpy()))
    assert bits(anchor.numpy())[0] == 0  # tfp: +0.0


def test_a_shape_tfps_check_lets_through_by_accident_is_refused():
    """tfp compares the shape vectors [3] and [3, 3] with broadcasting, so a [3, 3] gx for an x of [3] passes
    its check and the gradient is gx's column sums; the layout table has no such reading, so ours refuses it."""
    x, gx = tf.constant([1.0, 2.0, 3.0]), tf.reshape(tf.range(9.0), [3, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        anchor = ANCHOR(tf.reduce_sum(x), gx, x)
    np.testing.assert_array_equal(tape.gradient(anchor, x), tf.reduce_sum(gx, axis=0))
    with pytest.raises(ValueError, match="fits no layout"):
        custom_gradient(tf.reduce_sum(x), gx, x)
