"""custom_gradient(fx, gx, x): values, derivatives by layout, modes, errors."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from helpers import (
    MODES,
    assert_value_exact,
    bits,
    float32_exact,
    flushes_denormals,
    gradient_and_second,
    in_mode,
    jvp,
    vjp,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stopgrad_math import custom_gradient

FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def log1pexp(x):
    """Stable value with the exact gradient sigmoid(x) embedded."""
    return custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)


def assert_vjp_jvp(mode, fn, truth, x, upstream, tangent, rtol=1e-6, atol=0.0):
    """fn's VJP and JVP in `mode` equal autodiff of the stable formula `truth`."""
    ours_vjp = in_mode(lambda x, w: vjp(fn, x, w), mode)(x, upstream)
    ours_jvp = in_mode(lambda x, v: jvp(fn, x, v), mode)(x, tangent)
    np.testing.assert_allclose(ours_vjp, vjp(truth, x, upstream), rtol=rtol, atol=atol)
    np.testing.assert_allclose(ours_jvp, jvp(truth, x, tangent), rtol=rtol, atol=atol)


# ---------------------------------------------------------------- value


AWKWARD = float32_exact((0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3e38, 65504.0, 1e-8))


def awkward_arrays(shape):
    elements = st.one_of(st.sampled_from(AWKWARD), st.floats(width=32, allow_nan=False))
    return hnp.arrays(np.float32, shape, elements=elements)


@st.composite
def value_cases(draw):
    fx_shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    x_shape = draw(st.sampled_from([(), fx_shape, fx_shape[1:]]))
    dtype = draw(st.sampled_from(FLOATS))
    arrays = [draw(awkward_arrays(shape)) for shape in (fx_shape, fx_shape, x_shape)]
    return dtype, arrays


@pytest.mark.parametrize("mode", MODES)
@given(case=value_cases())
@example(case=(tf.float32, [np.array([-0.0, np.inf, np.nan, 1e-40], np.float32),  # −0.0 in fx, every run
                            np.array([2.0, -np.inf, 1.0, -0.0], np.float32),
                            np.array([1.0, 0.5, -0.0, np.nan], np.float32)]))
@settings(max_examples=30)
def test_value_is_fx_bit_for_bit_whatever_gx_and_x_hold(mode, case):
    dtype, (fx, gx, x) = case
    fx, gx, x = (tf.cast(a, dtype) for a in (fx, gx, x))

    def value(fx, gx, x):
        with tf.GradientTape() as tape:  # a watching tape, so the identity is built
            tape.watch(x)
            return custom_gradient(fx, gx, x)

    assert_value_exact(in_mode(value, mode)(fx, gx, x).numpy(), fx.numpy())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_subnormal_value_is_exact_or_flushed_as_by_any_tf_arithmetic(mode, dtype):
    tiny = np.arange(1, 4, dtype=f"uint{8 * dtype.size}").view(dtype.as_numpy_dtype)
    fx = tf.constant(np.concatenate([tiny, -tiny]), dtype)

    def value(fx):
        with tf.GradientTape() as tape:
            tape.watch(fx)
            return custom_gradient(fx, tf.ones_like(fx), fx)

    out = in_mode(value, mode)(fx).numpy()
    assert_value_exact(out, fx.numpy())
    if dtype == tf.float16 or not flushes_denormals(dtype, mode):
        np.testing.assert_array_equal(bits(out), bits(fx.numpy()))


def test_tfp_examples_of_leaking_inf_and_nan_keep_their_value():
    x = tf.constant([0.0, 4.0])
    y = tf.constant([np.inf, 1.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, y])
        root = custom_gradient(tf.sqrt(x), 0.5 / tf.sqrt(x), x)
        ones = custom_gradient(tf.ones(2), tf.ones(2), y)
        tfp_root = tfp.math.custom_gradient(tf.sqrt(x), 0.5 / tf.sqrt(x), x)
    np.testing.assert_array_equal(root, [0.0, 2.0])
    np.testing.assert_array_equal(ones, [1.0, 1.0])
    assert np.isnan(tfp_root.numpy()).all(), "the anchor's bug this test documents"
    np.testing.assert_array_equal(tape.gradient(root, x), [np.inf, 0.25])


# ---------------------------------------------------------------- derivative by layout


def test_weighted_vector_loss_elementwise_where_tfp_is_wrong(mode):
    x = tf.constant([-1.0, 0.0, 2.0, 100.0])
    w = tf.constant([1.0, 0.0, 3.0, 0.5])
    expected = tf.math.sigmoid(x) * w  # [0.27, 0, 2.64, 0.5]
    ours = in_mode(lambda x, w: vjp(log1pexp, x, w), mode)(x, w)
    np.testing.assert_allclose(ours, expected, rtol=1e-7)
    np.testing.assert_allclose(ours, [0.2689414, 0.0, 2.6423912, 0.5], rtol=1e-6)
    anchor = vjp(lambda x: tfp.math.custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x), x, w)
    np.testing.assert_allclose(anchor, [0.30, 0.56, 0.99, 1.13], atol=0.01)  # tfp spreads the sum
    assert_vjp_jvp(mode, log1pexp, tf.math.softplus, x, w, tf.constant([1.0, -2.0, 0.5, 3.0]))


def test_elementwise_in_float64_at_x_100_is_exactly_one(mode):
    x = tf.constant([100.0, 800.0], tf.float64)
    ours = in_mode(lambda x: vjp(log1pexp, x, None), mode)(x)
    np.testing.assert_array_equal(ours, [1.0, 1.0])


def test_per_row_parameter_broadcast_against_fx(mode):
    z = tf.reshape(tf.linspace(-1.0, 1.0, 12), [3, 4])
    b = tf.constant([[0.5], [-1.0], [2.0]])  # one parameter per row of fx

    def ours(b):
        return custom_gradient(tf.exp(b * z), z * tf.exp(b * z), b)

    w = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])
    tangent = tf.constant([[1.0], [2.0], [-1.0]])
    assert_vjp_jvp(mode, ours, lambda b: tf.exp(b * z), b, w, tangent, rtol=2e-5)  # float32 sums, other order


def test_scalar_x_with_vector_fx(mode):
    t = tf.constant([0.0, 1.0, 2.0, 3.0])

    def ours(s):
        return custom_gradient(tf.sin(s * t), t * tf.cos(s * t), s)

    assert_vjp_jvp(mode, ours, lambda s: tf.sin(s * t), tf.constant(0.7), tf.constant([1.0, 2, 3, 4]), tf.constant(2.0))


def test_full_jacobian_of_a_linear_map(mode):
    a = tf.reshape(tf.range(24, dtype=tf.float64) / 7 - 1, [3, 2, 2, 2])  # fx [3, 2], x [2, 2]

    def linear(x):
        return tf.tensordot(a, x, axes=2)

    def ours(x):
        return custom_gradient(linear(x), a, x)

    x = tf.constant([[1.0, -2.0], [0.5, 3.0]], tf.float64)
    w = tf.constant([[1.0, 0.0], [-1.0, 2.0], [0.5, 0.25]], tf.float64)
    assert_vjp_jvp(mode, ours, linear, x, w, tf.constant([[0.1, 0.2], [-0.3, 0.4]], tf.float64), rtol=1e-12)


def test_full_jacobian_matrix_for_a_vector(mode):
    a = tf.constant([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])

    def linear(x):
        return tf.linalg.matvec(a, x)

    def ours(x):
        return custom_gradient(linear(x), a, x)

    assert_vjp_jvp(mode, ours, linear, tf.constant([1.0, 2.0, 3.0]), tf.constant([2.0, -1.0]), tf.constant([1.0, 0, 1]))


def test_one_element_fx_of_any_shape(mode):
    def ours(x):
        return custom_gradient(tf.reshape(tf.reduce_sum(x**2), [1, 1]), 2 * x, x)

    def truth(x):
        return tf.reshape(tf.reduce_sum(x**2), [1, 1])

    x = tf.constant([1.0, -2.0, 3.0])
    assert_vjp_jvp(mode, ours, truth, x, tf.constant([[1.5]]), tf.constant([1.0, 1.0, -1.0]))


def test_otherwise_tfp_rule_gradient_of_the_sum_is_gx(mode):
    x = tf.constant([1.0, 2.0, 3.0])
    gx = tf.constant([0.5, -1.0, 2.0])
    fx = tf.constant([10.0, 20.0])  # fx [2], x [3]: no other layout fits

    def ours(x):
        return custom_gradient(fx, gx, x)

    np.testing.assert_allclose(in_mode(lambda x: vjp(ours, x, None), mode)(x), gx)
    anchor = vjp(lambda x: tfp.math.custom_gradient(fx, gx, x), x, tf.constant([1.0, 3.0]))
    np.testing.assert_allclose(in_mode(lambda x: vjp(ours, x, tf.constant([1.0, 3.0])), mode)(x), anchor)
    np.testing.assert_allclose(anchor, gx * 4 / 2)


def test_empty_fx_under_tfp_rule_gives_zero_gradient_not_nan():
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(vjp(lambda x: custom_gradient(tf.zeros([0]), x, x), x, None), [0.0, 0.0])


def test_same_as_tfp_for_scalar_fx_with_several_x(mode):
    x = [tf.constant([1.0, -2.0]), tf.constant([[0.5, 0.25], [3.0, -1.0]])]
    gx = [tf.constant([0.3, 7.0]), tf.constant([[1.0, 2.0], [-3.0, 4.0]])]
    fx = tf.constant(1.5)

    def value_and_grads(cg, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = cg(fx, gx, x)
        return y, tape.gradient(y, x, output_gradients=tf.constant(2.5))

    ours = in_mode(lambda x: value_and_grads(custom_gradient, x), mode)(x)
    anchor = value_and_grads(tfp.math.custom_gradient, x)
    tf.nest.map_structure(np.testing.assert_array_equal, ours, anchor)
    np.testing.assert_array_equal(ours[1][1], 2.5 * gx[1])


# ---------------------------------------------------------------- property tests


@st.composite
def broadcast_cases(draw):
    base = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, base_shape=base, max_dims=3, min_side=0))
    x_shape, a_shape = shapes.input_shapes
    out_shape = np.broadcast_shapes(x_shape, a_shape)
    elements = st.floats(-3, 3, width=64)
    arrays = [draw(hnp.arrays(np.float64, s, elements=elements)) for s in (x_shape, a_shape, out_shape, x_shape)]
    return arrays


@given(case=broadcast_cases())
def test_elementwise_with_broadcasting_matches_autodiff(case):
    x, a, w, v = (tf.constant(c) for c in case)

    def truth(x):
        return tf.sin(a * x) + a * x**2

    def ours(x):
        return custom_gradient(truth(x), a * tf.cos(a * x) + 2 * a * x, x)

    # Inputs lie in [-3, 3]: the absolute tolerance covers cancellation in the truth's own sums.
    assert_vjp_jvp("eager", ours, truth, x, w, v, rtol=1e-12, atol=1e-9)


@st.composite
def jacobian_cases(draw):
    fx_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    x_shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    elements = st.floats(-3, 3, width=64)
    shapes = (fx_shape + x_shape, x_shape, fx_shape, x_shape)
    return [draw(hnp.arrays(np.float64, s, elements=elements)) for s in shapes]


@given(case=jacobian_cases())
def test_full_jacobian_matches_autodiff(case):
    a, x, w, v = (tf.constant(c) for c in case)
    rank = len(case[1].shape)

    def truth(x):
        return tf.tensordot(a, tf.sinh(x), axes=rank)

    def ours(x):
        return custom_gradient(truth(x), a * tf.cosh(x), x)

    assert_vjp_jvp("eager", ours, truth, x, w, v, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("dtype", FLOATS)
def test_gradient_in_every_float_dtype_is_gx_exactly(mode, dtype):
    x = tf.constant([-3.0, 0.0, 40.0], dtype)

    def gx_and_derivatives(x):  # gx is computed in dtype; the identity must pass it on unchanged
        return tf.math.sigmoid(x), vjp(log1pexp, x), jvp(log1pexp, x, tf.ones_like(x))

    gx, reverse, forward = in_mode(gx_and_derivatives, mode)(x)
    np.testing.assert_array_equal(reverse, gx)
    np.testing.assert_array_equal(forward, gx)
    truth = tf.math.sigmoid(tf.constant([-3.0, 0.0, 40.0], tf.float64))
    np.testing.assert_allclose(tf.cast(gx, tf.float64), truth, rtol=float(ml_dtypes.finfo(gx.dtype.as_numpy_dtype).eps))


# ---------------------------------------------------------------- awkward derivatives


def test_zero_upstream_gives_zero_gradient_even_where_gx_is_inf(mode):
    x = tf.constant([1.0, 2.0, 3.0])
    gx = tf.constant([np.inf, np.nan, 2.0])
    mask = tf.constant([0.0, 0.0, 1.0])

    def ours(x):
        return custom_gradient(x, gx, x)

    np.testing.assert_array_equal(in_mode(lambda x, w: vjp(ours, x, w), mode)(x, mask), [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(in_mode(lambda x, v: jvp(ours, x, v), mode)(x, mask), [0.0, 0.0, 2.0])


def test_non_finite_x_keeps_value_and_gets_the_declared_gradient(mode):
    """gx is declared at every element, inf and NaN in x included: the gradient is gx·upstream there too, in
    reverse and forward mode, and the value is fx."""
    x = tf.constant([np.inf, -np.inf, np.nan, 2.0])
    ones = tf.ones([4])

    def value_and_derivatives(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = custom_gradient(ones, 3 * ones, x)
        return y, tape.gradient(y, x), jvp(lambda x: custom_gradient(ones, 3 * ones, x), x, tf.fill([4], 2.0))

    value, grad, tangent = in_mode(value_and_derivatives, mode)(x)
    np.testing.assert_array_equal(value, ones)
    np.testing.assert_array_equal(grad, [3.0] * 4)
    np.testing.assert_array_equal(tangent, [6.0] * 4)


def test_log1pexp_at_non_finite_x_gets_sigmoid_the_declared_derivative(mode):
    """custom_gradient(softplus(x), sigmoid(x), x) at [1, nan, inf, −inf]: the gradient is sigmoid(x), NaN
    where x is NaN and 1 at inf, 0 at −inf; truth: sigmoid computed by NumPy."""
    x = tf.constant([1.0, np.nan, np.inf, -np.inf], tf.float64)
    rule = lambda x: custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)  # noqa: E731
    truth = 1.0 / (1.0 + np.exp(-x.numpy()))
    np.testing.assert_array_equal(in_mode(lambda x: vjp(rule, x), mode)(x), truth)
    np.testing.assert_array_equal(in_mode(lambda x: jvp(rule, x, tf.ones_like(x)), mode)(x), truth)


# ---------------------------------------------------------------- every mode of differentiation


def test_jacobian_and_batch_jacobian(mode):
    x = tf.constant([[-1.0, 0.0, 100.0], [2.0, -30.0, 5.0]])

    def jacobians(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = log1pexp(x)
        return tape.jacobian(y, x), tape.batch_jacobian(y, x), tape.jacobian(y, x, experimental_use_pfor=False)

    full, batch, loop = in_mode(jacobians, mode)(x)
    s = tf.math.sigmoid(x).numpy()
    np.testing.assert_allclose(batch, np.stack([np.diag(row) for row in s]), rtol=1e-7)
    expected_full = np.einsum("ij,ik,jl->ijkl", s, np.eye(2), np.eye(3))
    np.testing.assert_allclose(full, expected_full, rtol=1e-7)
    np.testing.assert_allclose(loop, expected_full, rtol=1e-7)


def test_vectorized_map_per_example_gradients(mode):
    x = tf.constant([[-1.0, 100.0], [0.0, 2.0], [5.0, -5.0]])

    def per_example(row):
        with tf.GradientTape() as tape:
            tape.watch(row)
            loss = tf.reduce_sum(tf.constant([1.0, 2.0]) * log1pexp(row))
        return tape.gradient(loss, row)

    grads = in_mode(lambda x: tf.vectorized_map(per_example, x), mode)(x)
    np.testing.assert_allclose(grads, tf.math.sigmoid(x) * [1.0, 2.0], rtol=1e-7)


def test_tf_gradients_in_a_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([0.0, 100.0])
        (grad,) = tf.gradients(log1pexp(x), [x], grad_ys=tf.constant([2.0, 3.0]))
    with tf.compat.v1.Session(graph=graph) as session:
        np.testing.assert_array_equal(session.run(grad), [1.0, 3.0])


def _second_derivative(cg, x, manually_stopped):
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            fx = tf.stop_gradient(tf.math.softplus(x))
            y = cg(fx, tf.math.sigmoid(x), x, fx_gx_manually_stopped=manually_stopped)
        grad = inner.gradient(y, x)
    return grad, outer.gradient(grad, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def test_second_derivative_through_stopped_gx_is_zero(mode):
    x = tf.constant([-1.0, 0.0, 3.0])
    grad, hess = in_mode(lambda x: _second_derivative(custom_gradient, x, False), mode)(x)
    np.testing.assert_allclose(grad, tf.math.sigmoid(x), rtol=1e-7)
    np.testing.assert_array_equal(hess, [0.0, 0.0, 0.0])


def test_second_derivative_with_manual_stop_is_that_of_the_expression_as_in_tfp(mode):
    # h = f + g(x)·u with u = x − stop(x) has h' = g + g'·u and h'' = 2·g' at u = 0.
    x = tf.constant([-1.0, 0.0, 3.0])
    grad, hess = in_mode(lambda x: _second_derivative(custom_gradient, x, True), mode)(x)
    s = tf.math.sigmoid(x)
    np.testing.assert_allclose(grad, s, rtol=1e-7)
    np.testing.assert_allclose(hess, 2 * s * (1 - s), rtol=1e-6)
    np.testing.assert_allclose(hess, _second_derivative(tfp.math.custom_gradient, x, True)[1], rtol=1e-6)


def test_second_derivative_is_unconnected_under_a_plain_tape():
    assert gradient_and_second(log1pexp, tf.constant(1.0))[1] is None


def test_tfp_partial_custom_gradient_with_manual_stops(mode):
    # tfp's own test: gradient x²y for x and x for y.
    x = tf.Variable(2.1)
    y = tf.Variable(3.1)
    stop = tf.stop_gradient

    def grads():
        with tf.GradientTape() as tape:
            fx = stop(x) * y
            gx = stop(tf.square(x)) * y
            h = custom_gradient(fx, gx, x + stop(y), fx_gx_manually_stopped=True)
        return h, tape.gradient(h, [x, y])

    h, (dx, dy) = in_mode(grads, mode)()
    assert h.numpy() == np.float32(2.1) * np.float32(3.1)
    assert dx.numpy() == np.square(np.float32(2.1)) * np.float32(3.1)  # float32 throughout, under NumPy 1.x too
    assert dy.numpy() == np.float32(2.1)


# ---------------------------------------------------------------- structures, variables, dtypes


def test_nested_structure_of_x_with_variables_and_a_none_gradient(mode):
    scale = tf.Variable(2.0)
    params = {"loc": tf.constant([1.0, -1.0]), "scale": scale, "fixed": tf.constant(3.0)}

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(params["loc"])
            fx = params["loc"] * params["scale"]
            gx = {"loc": tf.fill([2], 2.0), "scale": tf.constant([1.0, -1.0]), "fixed": None}
            h = custom_gradient(fx, gx, params)
        return tape.gradient(h, [params["loc"], scale, params["fixed"]], output_gradients=tf.constant([1.0, 3.0]))

    d_loc, d_scale, d_fixed = in_mode(grads, mode)()
    np.testing.assert_array_equal(d_loc, [2.0, 6.0])
    assert d_scale.numpy() == 1.0 - 3.0
    assert d_fixed is None


def test_x_of_another_float_dtype_and_gx_as_python_list():
    x = tf.constant([1.0, 2.0], tf.float64)
    grad = vjp(lambda x: custom_gradient(tf.constant([5.0, 6.0]), [0.5, 0.25], x), x, None)
    assert grad.dtype == tf.float64
    np.testing.assert_array_equal(grad, [0.5, 0.25])


def test_eager_with_nothing_watching_returns_fx_itself():
    fx = tf.constant([1.0, 2.0])
    assert custom_gradient(fx, tf.ones(2), tf.zeros(2)) is fx


# ---------------------------------------------------------------- graphs, saving, distribution


def _op_types(concrete_function, prefix="custom_gradient"):
    return {op.type for op in concrete_function.graph.get_operations() if op.name.startswith(prefix)}


def test_static_shapes_add_no_assert_or_identity_ops():
    fn = tf.function(lambda x: log1pexp(x))
    types = _op_types(fn.get_concrete_function(tf.TensorSpec([3, 2])))
    assert types, "the identity's ops live under its name scope"
    assert not types & {"Assert", "Identity", "NoOp", "Equal"}, types


@pytest.mark.parametrize("custom_gradients", [True, False])
def test_saved_model_round_trip_keeps_the_gradient(tmp_path, custom_gradients):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return log1pexp(x)

    path = str(tmp_path / "model")
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=custom_gradients)
    tf.saved_model.save(Model(), path, options=options)
    loaded = tf.saved_model.load(path)
    x = tf.constant([-1.0, 0.0, 100.0])
    grad = vjp(loaded, x, tf.constant([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(grad, tf.math.sigmoid(x) * [1.0, 2.0, 3.0], rtol=1e-7)
    np.testing.assert_array_equal(loaded(x), tf.math.softplus(x))


def test_mirrored_strategy_gradients_equal_single_device():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        theta = tf.Variable([0.5, 100.0])
    data = tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [2.0, 1.0]])

    def loss_grad(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(batch * log1pexp(theta)) / 4.0
        return tape.gradient(loss, theta)

    @tf.function
    def step(dataset_iterator):
        per_replica = strategy.run(loss_grad, args=(next(dataset_iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(data).batch(4))
    distributed = step(iter(dataset))
    single = tf.reduce_sum(data, 0) / 4.0 * tf.math.sigmoid(theta.read_value())
    np.testing.assert_allclose(distributed, single, rtol=1e-6)
    assert strategy.num_replicas_in_sync == 2


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "gx, x",
    [([tf.ones(2)], {"a": tf.ones(2)}), ({"b": tf.ones(2)}, {"a": tf.ones(2)}), ([tf.ones(2)], [tf.ones(2)] * 2)],
)
def test_structure_mismatch_is_a_value_error(gx, x):
    with pytest.raises(ValueError, match="structure of x"):
        custom_gradient(tf.ones(2), gx, x)


def test_tuple_and_list_structures_are_interchangeable():
    x = (tf.constant(1.0), tf.constant(2.0))
    grads = vjp(lambda x: custom_gradient(tf.constant(0.0), [3.0, 4.0], x), x)
    np.testing.assert_array_equal(grads, [3.0, 4.0])


def test_unfitting_gradient_shape_names_argument_and_shapes_while_tracing():
    @tf.function
    def bad(x):
        return custom_gradient(tf.ones([2, 3]), {"w": tf.ones([4])}, {"w": x})

    with pytest.raises(ValueError, match=r"x\[w\].*\(2, 3\).*\(5,\).*\(4,\)"):
        bad.get_concrete_function(tf.TensorSpec([5]))


@pytest.mark.parametrize(
    "fx, gx, x, what",
    [
        (tf.constant([1, 2]), tf.ones(2), tf.ones(2), "floating or complex fx"),
        (tf.ones(2), tf.ones(2), tf.constant([1, 2]), "floating or complex x"),
        (tf.ones(2), tf.constant([1, 2]), tf.ones(2), "floating or complex gradient for x"),
        (tf.ones(2), tf.ones(2), tf.ones(2, tf.complex64), "complex x for a real fx"),
        (tf.ones(2), tf.ones(2, tf.complex64), tf.ones(2), "complex gradient for x for a real fx"),
    ],
)
def test_inputs_of_other_dtypes_are_type_errors(fx, gx, x, what):
    with pytest.raises(TypeError, match=what):
        custom_gradient(fx, gx, x)


@pytest.mark.parametrize(
    "args, missing",
    [
        ((tf.ones(2),), "without gx and x"),
        ((tf.ones(2), tf.ones(2)), "without x"),
        ((tf.ones(2), None, tf.ones(2)), "without gx"),
    ],
)
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_tensor_without_gx_or_x_is_a_type_error_naming_both_forms(args, missing, mode):
    with pytest.raises(TypeError, match=rf"decorator form.*identity form.*{missing}"):
        in_mode(lambda: custom_gradient(*args), mode)()


def test_an_fx_that_is_no_tensor_is_a_type_error_naming_fx():
    with pytest.raises(TypeError, match="custom_gradient's fx must be a tensor or convertible to one"):
        custom_gradient(lambda x: x, tf.ones(2), tf.ones(2))


# ---------------------------------------------------------------- complex


COMPLEX_MODES = (*MODES, "tf1")


def in_complex_mode(fn, mode, *args):
    """fn(*args) in a mode of MODES, or in a TF1 graph of unknown shapes with tf.gradients."""
    if mode != "tf1":
        return in_mode(fn, mode)(*args)
    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf.compat.v1.placeholder(a.dtype, shape=None) for a in args]
        outputs = fn(*inputs)
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(outputs, dict(zip(inputs, [a.numpy() for a in args], strict=True)))


def complex_bits(array):
    """The bit patterns of the real and imaginary parts, so that -0.0 and NaN compare exactly."""
    array = np.atleast_1d(np.asarray(array))
    return bits(array.view(f"float{array.dtype.itemsize * 4}"))


def complex_vjp(fn, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, x, output_gradients=upstream)


def complex_tf1_vjp(fn, x, upstream):
    y = fn(x)
    return y, tf.gradients(y, [x], grad_ys=upstream)[0]


Z = tf.constant([1.0 + 2.0j, -0.5 + 0.25j, 3.0 - 1.0j], tf.complex128)
C = tf.constant([0.5 - 1.0j, 2.0 + 0.0j, -1.0 + 3.0j], tf.complex128)
A = np.array([[1.0 + 1j, 2.0, -1j], [0.5, -2.0 + 0.5j, 1.0]])  # NumPy: TF1 graphs cannot capture eager tensors
def cis(t):
    """exp(i·t) for a real t."""
    return tf.exp(1j * tf.cast(t, tf.complex128))


COMPLEX_CASES = {  # name: (ours, the formula autodiff differentiates, x, upstream)
    "scalar fx = sum(x·x), gx = 2x": (
        lambda x: custom_gradient(tf.reduce_sum(x * x), 2 * x, x), lambda x: tf.reduce_sum(x * x), Z,
        tf.constant(1.5 - 0.5j, tf.complex128),
    ),
    "elementwise exp": (lambda x: custom_gradient(tf.exp(x), tf.exp(x), x), tf.exp, Z, C),
    "jacobian of a complex matrix": (
        lambda x: custom_gradient(tf.linalg.matvec(A, x), A, x), lambda x: tf.linalg.matvec(A, x), Z, C[:2],
    ),
    "complex fx of a real x: exp(i·t)": (
        lambda t: custom_gradient(cis(t), 1j * cis(t), t), cis, tf.constant([0.3, -1.2, 2.0], tf.float64), C,
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", COMPLEX_MODES)
@pytest.mark.parametrize("name", sorted(COMPLEX_CASES))
def test_complex_gradient_is_tf_autodiffs_for_the_holomorphic_formula(name, mode):
    ours, formula, x, upstream = COMPLEX_CASES[name]
    vjp_fn = complex_tf1_vjp if mode == "tf1" else complex_vjp
    value, grad, fx = in_complex_mode(lambda x, w: (*vjp_fn(ours, x, w), formula(x)), mode, x, upstream)
    np.testing.assert_array_equal(complex_bits(value), complex_bits(fx))  # fx as this mode computes it
    np.testing.assert_allclose(grad, complex_vjp(formula, x, upstream)[1], rtol=1e-14)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(COMPLEX_CASES))
def test_complex_forward_mode_is_tf_autodiffs_for_the_holomorphic_formula(name, mode):
    ours, formula, x, _ = COMPLEX_CASES[name]
    tangent = tf.cast(tf.reshape(tf.range(1.0, 4.0), x.shape), x.dtype) * (1 - 0.5j if x.dtype.is_complex else 1)
    ours_jvp = in_mode(lambda x, t: jvp(ours, x, t), mode)(x, tangent)
    np.testing.assert_allclose(ours_jvp, jvp(formula, x, tangent), rtol=1e-14)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.complex64, tf.complex128])
def test_complex_value_is_fx_bit_for_bit_whatever_gx_and_x_hold(mode, dtype):
    parts = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 1.5])
    fx = tf.complex(tf.constant(parts), tf.constant(parts[::-1]))
    gx_re, gx_im = [np.inf, 1.0, np.nan, 0.0, -2.0, 3.0], [0.0, np.nan, 1.0, 2.0, 0.0, -np.inf]
    gx = tf.complex(tf.constant(gx_re), tf.constant(gx_im))
    x = tf.complex(tf.constant([1.0, np.inf, 2.0, np.nan, -0.0, 4.0]), tf.constant([0.5, 1.0, -np.inf, 2.0, 3.0, 0.0]))
    fx, gx, x = (tf.cast(t, dtype) for t in (fx, gx, x))

    def value(fx, gx, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            return custom_gradient(fx, gx, x)

    np.testing.assert_array_equal(complex_bits(in_mode(value, mode)(fx, gx, x)), complex_bits(fx))


def test_complex_zero_upstream_gives_zero_gradient_where_gx_is_inf():
    x = tf.constant([1.0 + 1j, 2.0 - 1j], tf.complex128)
    gx = tf.constant([complex(np.inf, 0), 2.0 + 1j], tf.complex128)
    _, grad = complex_vjp(lambda x: custom_gradient(x, gx, x), x, tf.constant([0.0, 1.0 + 0j], tf.complex128))
    np.testing.assert_array_equal(grad, [0.0, 2.0 - 1j])  # conj(g)·upstream


def test_per_sample_values_take_tfps_rule_and_the_readmes_two_per_sample_ways_give_each_sample_its_gradient():
    """fx (B,), x and gx (B, D): neither the Jacobian nor elementwise, so gx is read by tfp's rule, as the
    gradient of sum(fx), which a weighted loss Σ wᵢ·hᵢ turns into (Σw / B)·gx (the README says so: a limit of the
    layout, tested as that); the README's per-sample ways, the decorator's VJP and the Jacobian, give wᵢ·gxᵢ,
    the closed form."""
    b, d = 3, 2
    x = tf.constant(np.arange(b * d, dtype=np.float64).reshape(b, d) / 4.0)
    gx = tf.cos(x)
    fx = tf.reduce_sum(tf.sin(x), axis=1)
    w = tf.constant([1.0, -2.0, 0.5], tf.float64)

    def gradient(h_of):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(w * h_of(x))
        return tape.gradient(loss, x)

    spread = gradient(lambda x: custom_gradient(fx, gx, x))
    np.testing.assert_allclose(spread, tf.reduce_sum(w) / b * gx)

    @custom_gradient
    def per_sample(x):
        return fx, lambda ct: ct[:, None] * gx

    jacobian = gx[:, None, :] * tf.eye(b, dtype=tf.float64)[:, :, None]
    for got in (gradient(per_sample), gradient(lambda x: custom_gradient(fx, jacobian, x))):
        np.testing.assert_allclose(got, w[:, None] * tf.cos(x))
