"""@custom_gradient: every grad_fn convention, exact for any function, in every mode."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, bits, in_mode, jvp, vjp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stopgrad_math import custom_gradient


def softplus_exact_grad(e):
    return 1 - 1 / (1 + e)


# ---------------------------------------------------------------- the docs' log1pexp, every signature


@custom_gradient
def log1pexp_tf(x):
    e = tf.exp(x)

    def grad(upstream):
        return upstream * softplus_exact_grad(e)

    return tf.math.log(1 + e), grad


@custom_gradient
def log1pexp_keras(x):
    e = tf.exp(x)

    def grad(*args, upstream=None):
        if upstream is None:
            (upstream,) = args
        return upstream * softplus_exact_grad(e)

    return tf.math.log(1 + e), grad


@custom_gradient
def log1pexp_torch(x):
    e = tf.exp(x)

    def grad(*args, upstream):
        return upstream * softplus_exact_grad(e)

    return tf.math.log(1 + e), grad


@custom_gradient
def log1pexp_varargs(x):
    e = tf.exp(x)

    def grad(*upstreams):
        return [upstreams[0] * softplus_exact_grad(e)]

    return tf.math.log(1 + e), grad


@pytest.mark.parametrize("fn", [log1pexp_tf, log1pexp_keras, log1pexp_torch, log1pexp_varargs])
def test_log1pexp_every_signature_reverse_and_forward(mode, fn):
    x = tf.constant([-3.0, 0.0, 10.0, 100.0])
    w = tf.constant([1.0, 2.0, 0.0, 3.0])
    expected = tf.math.sigmoid(x)
    np.testing.assert_allclose(in_mode(lambda x: vjp(fn, x, w), mode)(x), expected * w, rtol=1e-6)
    np.testing.assert_allclose(in_mode(lambda x: jvp(fn, x, w), mode)(x), expected * w, rtol=1e-6)


def test_forward_mode_is_finite_where_tf_custom_gradient_is_nan(mode):
    @tf.custom_gradient
    def anchor(x):
        e = tf.exp(x)
        return tf.math.log(1 + e), lambda dy: dy * softplus_exact_grad(e)

    x = tf.constant(100.0)
    assert np.isnan(jvp(anchor, x, tf.constant(1.0)).numpy())  # the anchor's measured defect
    assert vjp(anchor, x).numpy() == 1.0
    assert in_mode(lambda x: jvp(log1pexp_tf, x, tf.constant(1.0)), mode)(x).numpy() == 1.0


def test_keras_ops_custom_gradient_side_by_side():
    @keras.ops.custom_gradient
    def anchor(x):
        e = keras.ops.exp(x)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return keras.ops.multiply(upstream, 1.0 - 1.0 / keras.ops.add(1, e))

        return keras.ops.log(1 + e), grad

    x = tf.constant([-2.0, 0.5, 100.0])
    np.testing.assert_array_equal(vjp(log1pexp_keras, x), vjp(anchor, x))


# ---------------------------------------------------------------- variables


weights = tf.Variable(tf.ones([2]))


@custom_gradient
def linear_poly(x):
    poly = weights[1] * x + weights[0]

    def grad_fn(dpoly, variables):
        grad_xs = dpoly * weights[1]
        dy_dw = dpoly * tf.stack([x**1, x**0])
        return grad_xs, [tf.reduce_sum(tf.reshape(dy_dw, [2, -1]), axis=1)]

    return poly, grad_fn


def test_tf_docs_linear_poly_with_variables(mode):
    def grads(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            poly = linear_poly(x)
        return poly, tape.gradient(poly, x), tape.gradient(poly, weights)

    poly, dx, dw = in_mode(grads, mode)(tf.constant([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(poly, [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(dx, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(dw, [6.0, 3.0])


def test_variables_read_inside_f_keep_autodiff_without_ceremony(mode):
    scale = tf.Variable(3.0)

    @custom_gradient
    def scaled_log1pexp(x):
        e = tf.exp(x)
        return scale * tf.math.softplus(x), lambda dy: dy * scale * softplus_exact_grad(e)

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = scaled_log1pexp(x)
        return tape.gradient(y, [x, scale])

    x = tf.constant([0.0, 100.0])
    dx, dscale = in_mode(grads, mode)(x)
    np.testing.assert_allclose(dx, 3.0 * tf.math.sigmoid(x), rtol=1e-6)
    np.testing.assert_allclose(dscale, tf.reduce_sum(tf.math.softplus(x)), rtol=1e-6)


def _scaled_by(variable, decorate, tape_inside):
    """y = x·w for a variable w read in f, grad_fn giving x's and w's gradients: computed directly, or by a tape
    of grad_fn's own (a backward that recomputes, as a checkpoint's does)."""
    @decorate
    def scaled(x):
        def grad_fn(dy, variables=None):
            if not tape_inside:
                return dy * variable, [dy * x]
            with tf.GradientTape() as tape:
                tape.watch(x)
                z = x * variable
            gx, gw = tape.gradient(z, [x, variable], output_gradients=dy)
            return gx, [gw]

        return x * variable, grad_fn

    return scaled


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("tape_inside", [False, True], ids=["grad_fn direct", "grad_fn runs a tape"])
def test_an_inf_upstream_reaches_a_variables_gradient_as_tf_custom_gradients_does(order, tape_inside):
    """Issue 77: eagerly at order 1, w's gradient was NaN at an inf upstream's element where tf.custom_gradient
    gives inf: the transpose's J read w live in grad_fn, and the tape differentiated J through it, times v = 0.
    grad_fn is now the recorded backward there: the same bits as tf.custom_gradient's, at both orders."""
    w = tf.Variable([1.0, 2.0])
    x, upstream = tf.constant([1.0, 3.0]), tf.constant([np.inf, 1.0])
    got = []
    for decorate in (tf.custom_gradient, lambda f: custom_gradient(f, order=order)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = _scaled_by(w, decorate, tape_inside)(x)
        got.append([g.numpy() for g in tape.gradient(y, [x, w], output_gradients=upstream)])
    for anchor, ours in zip(*got, strict=True):
        np.testing.assert_array_equal(bits(ours), bits(anchor))
    assert got[1][1][0] == np.inf


def test_a_variables_gradient_at_order_1_keeps_forward_mode_and_refuses_a_second_derivative():
    """The recorded backward's forward function is J·ẋ read off grad_fn's transpose: an accumulator over x and w
    gets ẋ·w + x·ẇ (analytic); a second derivative raises order 1's LookupError, as on every route."""
    w = tf.Variable([1.0, 2.0])
    x = tf.constant([1.0, 3.0])
    f = _scaled_by(w, custom_gradient, tape_inside=False)
    x_dot, w_dot = tf.constant([1.0, -1.0]), tf.constant([10.0, 100.0])
    with tf.autodiff.ForwardAccumulator([x, w], [x_dot, w_dot]) as accumulator:
        y = f(x)
    np.testing.assert_array_equal(accumulator.jvp(y), x_dot * w + x * w_dot)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = f(x)
        gradient = inner.gradient(y, x)
    with pytest.raises(LookupError, match="order=1"):
        outer.gradient(gradient, x)


def test_an_inf_upstream_for_a_variables_gradient_in_a_graph_at_order_1_is_the_documented_nan():
    """The limit, in a graph: the recorded backward would be a registered gradient, which pfor drops under
    vectorized_map, so order 1 keeps the transpose there, and w's gradient is NaN at the inf upstream's element
    (the term through J's read of w, times v = 0); the other element, and x's gradient, are tf.custom_gradient's."""
    w = tf.Variable([1.0, 2.0])
    x, upstream = tf.constant([1.0, 3.0]), tf.constant([np.inf, 1.0])
    f = _scaled_by(w, custom_gradient, tape_inside=False)

    @tf.function
    def gradients(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return tape.gradient(y, [x, w], output_gradients=upstream)

    gx, gw = gradients(x)
    np.testing.assert_array_equal(gx, [np.inf, 2.0])
    assert np.isnan(gw[0]) and gw[1] == 3.0


def test_grad_fn_with_variables_parameter_but_none_read(mode):
    @custom_gradient
    def double(x):
        def grad(dy, variables=None):
            assert variables is None
            return 2 * dy

        return 2 * x, grad

    np.testing.assert_array_equal(in_mode(lambda x: vjp(double, x), mode)(tf.constant([1.0, 5.0])), [2.0, 2.0])


def test_mirrored_variables_with_and_without_variables_parameter():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])

    @custom_gradient
    def autodiff_for_w(x):
        return w * x, lambda dy: 5.0 * dy * w  # custom for x, autodiff for w

    @custom_gradient
    def custom_for_w(x):
        return w * x, lambda dy, variables: (dy * w, [7.0 * dy * x])

    def step(fn):
        def replica(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.reduce_sum(fn(x))
            return tape.gradient(y, [x, w])

        per_replica = strategy.run(tf.function(replica), args=(tf.constant([3.0, 4.0]),))
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in per_replica]

    dx, dw = step(autodiff_for_w)
    np.testing.assert_allclose(dx, 2 * 5.0 * np.array([1.0, 2.0]))
    np.testing.assert_allclose(dw, 2 * np.array([3.0, 4.0]))
    dx, dw = step(custom_for_w)
    np.testing.assert_allclose(dx, 2 * np.array([1.0, 2.0]))
    np.testing.assert_allclose(dw, 2 * 7.0 * np.array([3.0, 4.0]))


class CustomDense(keras.layers.Layer):
    """A dense layer whose matmul carries a hand-written VJP scaled by `grad_scale`."""

    def __init__(self, units, grad_scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.grad_scale = units, grad_scale

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="ones")

    def call(self, x):
        kernel, scale = self.kernel, self.grad_scale

        @custom_gradient
        def matmul(x, k):
            return tf.matmul(x, k), lambda dy: (tf.matmul(dy, k, transpose_b=True), scale * tf.matmul(x, dy, True))

        return matmul(x, tf.convert_to_tensor(kernel))


def test_mixed_precision_autocast_variable_in_a_keras_layer():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = CustomDense(2)
        x = tf.constant([[1.0, 2.0, 3.0]])
        with tf.GradientTape() as tape:
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        (grad,) = tape.gradient(loss, layer.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert y.dtype == tf.float16 and grad.dtype == tf.float32
    np.testing.assert_array_equal(grad, [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])


def test_keras_model_fit_uses_the_custom_rule():
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)

    def fitted_kernel(grad_scale):
        model = keras.Sequential([keras.Input((3,)), CustomDense(1, grad_scale=grad_scale)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        history = model.fit(x, y, epochs=30, batch_size=64, verbose=0)
        return model.layers[0].kernel.numpy(), history.history["loss"]

    kernel, losses = fitted_kernel(1.0)
    np.testing.assert_allclose(kernel, [[1.0], [-2.0], [0.5]], atol=0.05)
    assert losses[-1] < 1e-2 * losses[0]
    frozen, _ = fitted_kernel(0.0)  # a zero custom gradient for the kernel: training cannot move it
    np.testing.assert_array_equal(frozen, np.ones((3, 1)))


# ---------------------------------------------------------------- exact for any function


A = tf.constant([[1.0, 2.0, -1.0], [0.5, 3.0, 4.0]])


@custom_gradient
def matvec(x):
    return tf.linalg.matvec(A, x), lambda dy: tf.linalg.matvec(A, dy, transpose_a=True)


def test_matmul_vjp_jvp_and_jacobian_equal_autodiff(mode):
    x = tf.constant([1.0, -2.0, 0.5])

    def derivatives(fn, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.jacobian(y, x), vjp(fn, x, tf.constant([2.0, -1.0])), jvp(fn, x, tf.constant([1.0, 0.0, 3.0]))

    ours = in_mode(lambda x: derivatives(matvec, x), mode)(x)
    truth = derivatives(lambda x: tf.linalg.matvec(A, x), x)
    for a, b in zip(ours, truth, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@st.composite
def matmul_cases(draw):
    n, k, m = (draw(st.integers(0, 4)) for _ in range(3))
    floats = st.floats(-3, 3, width=64)
    return [draw(hnp.arrays(np.float64, shape, elements=floats)) for shape in ((n, k), (k, m), (n, m), (n, k), (k, m))]


@given(case=matmul_cases())
def test_matmul_of_two_arguments_any_shape_matches_autodiff(case):
    a, b, w, ta, tb = (tf.constant(c) for c in case)

    @custom_gradient
    def product(a, b):
        return tf.matmul(a, b), lambda dy: (tf.matmul(dy, b, transpose_b=True), tf.matmul(a, dy, transpose_a=True))

    def both(fn):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = fn(a, b)
        with tf.autodiff.ForwardAccumulator([a, b], [ta, tb]) as acc:
            y2 = fn(a, b)
        return [*tape.gradient(y, [a, b], output_gradients=w), acc.jvp(y2, tf.UnconnectedGradients.ZERO)]

    for ours, truth in zip(both(product), both(tf.matmul), strict=True):
        np.testing.assert_allclose(ours, truth, rtol=1e-12, atol=1e-12)


def test_reduction_broadcasting_and_several_outputs(mode):
    @custom_gradient
    def stats(x, y):
        total = x + y  # [3, 1] + [4] -> [3, 4]

        def grad(d_sum, d_sq):
            g = d_sum + 2 * d_sq * tf.reduce_sum(total)
            return tf.reduce_sum(g, axis=1, keepdims=True), tf.reduce_sum(g, axis=0)

        return (total, tf.reduce_sum(total) ** 2), grad

    def truth(x, y):
        total = x + y
        return total, tf.reduce_sum(total) ** 2

    def grads(fn, x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            a, b = fn(x, y)
            loss = tf.reduce_sum(a * tf.reshape(tf.range(12.0), [3, 4])) + 0.5 * b
        return tape.gradient(loss, [x, y])

    x, y = tf.constant([[1.0], [2.0], [-1.0]]), tf.constant([0.5, 0.0, 1.0, 2.0])
    ours = in_mode(lambda x, y: grads(stats, x, y), mode)(x, y)
    for a, b in zip(ours, grads(truth, x, y), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_nested_structures_jax_style_grad_and_dict_output(mode):
    @custom_gradient
    def polar(params):
        r, theta = params["r"], params["theta"]

        def grad(upstream):  # one structured argument, as in JAX
            dx, dy = upstream["x"], upstream["y"]
            d_r = dx * tf.cos(theta) + dy * tf.sin(theta)
            return {"r": d_r, "theta": r * (dy * tf.cos(theta) - dx * tf.sin(theta))}

        return {"x": r * tf.cos(theta), "y": r * tf.sin(theta)}, grad

    def truth(params):
        return {"x": params["r"] * tf.cos(params["theta"]), "y": params["r"] * tf.sin(params["theta"])}

    def grads(fn, r, theta):
        with tf.GradientTape() as tape:
            tape.watch([r, theta])
            out = fn({"r": r, "theta": theta})
            loss = tf.reduce_sum(3.0 * out["x"] - out["y"])
        return tape.gradient(loss, [r, theta])

    r, theta = tf.constant([1.0, 2.0]), tf.constant([0.3, -1.2])
    ours = in_mode(lambda r, t: grads(polar, r, t), mode)(r, theta)
    for a, b in zip(ours, grads(truth, r, theta), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@custom_gradient
def power(x, exponent=2.0, label="unused"):
    return x**exponent, lambda dy: dy * exponent * x ** (exponent - 1)


def test_keyword_arguments_are_constants_inside_tf_function(mode):
    x = tf.constant([1.0, 2.0])
    grad = in_mode(lambda x: vjp(lambda x: power(x, exponent=tf.constant(3.0), label="cube"), x), mode)(x)
    np.testing.assert_array_equal(grad, [3.0, 12.0])

    @tf.custom_gradient
    def anchor(x, exponent=2.0):
        return x**exponent, lambda dy: dy * exponent * x ** (exponent - 1)

    with pytest.raises(Exception, match="keyword"):  # the anchor's measured defect
        tf.function(lambda x: vjp(lambda x: anchor(x, exponent=3.0), x))(x)


def test_a_keyword_argument_that_is_differentiated_raises_naming_it(mode):
    """A keyword argument has no gradient from grad_fn: a tape or accumulator on it raises, naming it (its
    truth, d/de x**e = x**e·log x, is nowhere in grad_fn), where a stop gave a silent 0."""
    x, exponent = tf.constant([1.0, 2.0]), tf.constant(3.0)

    def through_exponent(e):
        with tf.GradientTape() as tape:
            tape.watch(e)
            y = power(x, exponent=e)
        return tape.gradient(y, e)

    with pytest.raises(Exception, match="exponent is a keyword argument of power") as caught:
        in_mode(through_exponent, mode)(exponent)
    assert isinstance(caught.value, LookupError) or "LookupError" in str(caught.value)
    accumulator = tf.autodiff.ForwardAccumulator(exponent, tf.constant(1.0))
    with accumulator, pytest.raises(LookupError, match="exponent is a keyword argument"):
        power(x, exponent=exponent)
    variable = tf.Variable(3.0)
    with tf.GradientTape() as tape:
        y = power(x, exponent=variable)
    with pytest.raises(LookupError, match="exponent is a keyword argument"):
        tape.gradient(y, variable)
    with tf.Graph().as_default():  # a TF1 graph, differentiated by tf.gradients
        exponent = tf.constant(3.0)
        with pytest.raises(LookupError, match="exponent is a keyword argument"):
            tf.gradients(power(tf.constant([1.0, 2.0]), exponent=exponent), exponent)


def test_every_argument_a_keyword_keeps_the_custom_gradient():
    @custom_gradient
    def clipped_identity(x):
        return x, lambda dy: 0.5 * dy

    @tf.custom_gradient
    def anchor(x):
        return x, lambda dy: 0.5 * dy

    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(vjp(lambda x: clipped_identity(x=x), x), [0.5, 0.5])
    np.testing.assert_array_equal(vjp(lambda x: anchor(x=x), x), [1.0, 1.0])  # the anchor drops it silently


def test_python_scalars_none_strings_and_integer_tensors_among_args(mode):
    @custom_gradient
    def mixed(x, n, nothing, text, count, flag):
        assert nothing is None and text == "tag" and n == 3
        y = x * tf.cast(count, x.dtype) * n
        return y, lambda dy: (dy * tf.cast(count, x.dtype) * n, None, None, None, None, None)

    def grads(x):
        return vjp(lambda x: mixed(x, 3, None, "tag", tf.constant(2), tf.constant(True)), x)

    np.testing.assert_array_equal(in_mode(grads, mode)(tf.constant([1.0, -1.0])), [6.0, 6.0])


def test_none_gradient_for_one_input_and_the_same_tensor_twice(mode):
    @custom_gradient
    def product(a, b):
        return a * b, lambda dy: (dy * b, None)

    def grads(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            twice = product(x, x)  # only the first argument gets a gradient
            y = tf.constant(2.0)
            other = product(x, y)
        return tape.gradient(twice, x), tape.gradient(other, x)

    twice, other = in_mode(grads, mode)(tf.constant([3.0, -1.0]))
    np.testing.assert_array_equal(twice, [3.0, -1.0])
    np.testing.assert_array_equal(other, [2.0, 2.0])


def test_integer_output_passes_through_without_a_derivative():
    @custom_gradient
    def count_positive(x):
        return tf.reduce_sum(tf.cast(x > 0, tf.int32)), lambda dy: tf.zeros_like(x)

    x = tf.constant([1.0, -2.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        count = count_positive(x)
    assert count.numpy() == 2 and count.dtype == tf.int32


def test_any_function_name_works_as_a_graph_scope(mode):
    @custom_gradient
    def _private(x):
        return 2 * x, lambda dy: 2 * dy

    anonymous = custom_gradient(lambda x: (3 * x, lambda dy: 3 * dy))
    x = tf.constant([1.0])
    assert in_mode(lambda x: vjp(_private, x) + vjp(anonymous, x), mode)(x).numpy().tolist() == [5.0]


def _value_and_grad(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, x)


def test_tf_function_applied_directly_and_through_autograph_converted_helpers():
    x = tf.constant([0.0, 100.0])
    assert isinstance(tf.function(log1pexp_tf)(x), tf.Tensor)
    np.testing.assert_array_equal(vjp(tf.function(log1pexp_tf, jit_compile=True), x), [0.5, 1.0])
    _, grad = tf.function(lambda x, fn=log1pexp_tf: _value_and_grad(fn, x))(x)
    np.testing.assert_array_equal(grad, [0.5, 1.0])

    @tf.custom_gradient
    def anchor(x):
        e = tf.exp(x)
        return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))

    with pytest.raises(TypeError):  # the anchor's defect: autograph compiles its inner f and returns the pair
        tf.function(lambda x, fn=anchor: _value_and_grad(fn, x))(x)


def test_autograph_converts_tensor_control_flow_inside_f():
    @custom_gradient
    def sign_scaled(x):
        if tf.reduce_sum(x) > 0:  # noqa: SIM108 - a tensor condition: autograph turns it into tf.cond
            y = 2 * x
        else:
            y = -x
        return y, lambda dy: dy * tf.where(tf.reduce_sum(x) > 0, 2.0, -1.0)

    traced = tf.function(lambda x: vjp(sign_scaled, x))
    np.testing.assert_array_equal(traced(tf.constant([1.0, 2.0])), [2.0, 2.0])
    np.testing.assert_array_equal(traced(tf.constant([-1.0, -2.0])), [-1.0, -1.0])


def test_zero_size_inputs(mode):
    x = tf.zeros([0, 3])
    np.testing.assert_array_equal(in_mode(lambda x: vjp(log1pexp_tf, x), mode)(x), np.zeros([0, 3]))


def test_python_control_flow_on_values_in_eager():
    @custom_gradient
    def piecewise(x):
        if float(tf.reduce_sum(x)) > 0:
            return 2 * x, lambda dy: 2 * dy
        return -x, lambda dy: -dy

    np.testing.assert_array_equal(vjp(piecewise, tf.constant([1.0, 2.0])), [2.0, 2.0])
    np.testing.assert_array_equal(vjp(piecewise, tf.constant([-1.0, -2.0])), [-1.0, -1.0])


# ---------------------------------------------------------------- the TF docs' examples


def test_docs_x_times_y(mode):
    @custom_gradient
    def bar(x, y):
        return x * y, lambda dy: (dy * y, dy * x)

    def grads(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            z = bar(x, y)
        return z, tape.gradient(z, [x, y])

    z, (dx, dy) = in_mode(grads, mode)(tf.constant(2.0), tf.constant(3.0))
    assert (z.numpy(), dx.numpy(), dy.numpy()) == (6.0, 3.0, 2.0)


def test_docs_shuffle_behind_stop_gradient():
    x = tf.constant([0.3, 0.5])

    @custom_gradient
    def shuffled(x):
        @tf.function
        def inner():
            return tf.stop_gradient(tf.random.shuffle(x))

        return inner(), lambda upstream: upstream

    with tf.GradientTape() as tape:
        tape.watch(x)
        result = shuffled(x)
    assert sorted(result.numpy().tolist()) == pytest.approx([0.3, 0.5])
    np.testing.assert_array_equal(tape.gradient(result, x), [1.0, 1.0])


def test_docs_triple_identity_applied_twice_gives_nine(mode):
    @custom_gradient
    def triple_grad_identity(x):
        return tf.identity(x), lambda dy: 3 * dy

    x = tf.constant(5.0)
    assert in_mode(lambda x: vjp(lambda x: triple_grad_identity(triple_grad_identity(x)), x), mode)(x).numpy() == 9.0


def test_side_by_side_with_tf_custom_gradient_where_it_is_right(mode):
    def make(decorator):
        @decorator
        def softsign(x, y):
            denominator = 1 + tf.abs(x * y)
            return x * y / denominator, lambda dy: (dy * y / denominator**2, dy * x / denominator**2)

        return softsign

    def grads(fn, x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            z = fn(x, y)
        return [z, *tape.gradient(z, [x, y], output_gradients=tf.constant([1.0, -2.0, 0.5]))]

    x, y = tf.constant([1.0, -2.0, 0.3]), tf.constant([0.5, 4.0, -3.0])
    ours = in_mode(lambda x, y: grads(make(custom_gradient), x, y), mode)(x, y)
    anchor = grads(make(tf.custom_gradient), x, y)
    for a, b in zip(ours, anchor, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# ---------------------------------------------------------------- modes, saving, registry


def test_vectorized_map_and_jacobian_of_matvec(mode):
    xs = tf.constant([[1.0, 2.0, 3.0], [-1.0, 0.0, 2.0]])

    def per_example(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(matvec(x) * tf.constant([1.0, 2.0]))
        return tape.gradient(y, x)

    grads = in_mode(lambda xs: tf.vectorized_map(per_example, xs), mode)(xs)
    expected = tf.linalg.matvec(A, tf.constant([1.0, 2.0]), transpose_a=True)
    np.testing.assert_allclose(grads, tf.stack([expected, expected]), rtol=1e-6)


def test_order_2_under_a_vectorized_map_of_unknown_batch_gives_the_declared_gradient():
    """pfor rewrites the op that carries a registered gradient into a plain IdentityN: under tf.function over a
    batch of unknown size, order 2's gradient was 0. Traced as pfor's loop body, order 2 is embedded as order 1,
    whose terms, made of ordinary ops, give the declared gradient (half of autodiff's here); tf.custom_gradient
    gives autodiff's."""
    def halved(x):
        return tf.linalg.matvec(A, x), lambda dy: 0.5 * tf.linalg.matvec(A, dy, transpose_a=True)

    x, w = tf.constant([[1.0, 2.0, 3.0]]), tf.constant([[1.0, -1.0]])
    declared = 0.5 * vjp(lambda x: tf.matmul(x, A, transpose_b=True), x, w)

    def through_vectorized_map(fn):
        mapped = tf.function(lambda x: tf.vectorized_map(fn, x), input_signature=[tf.TensorSpec([None, 3])])
        return tf.convert_to_tensor(vjp(mapped, x, w))

    np.testing.assert_allclose(through_vectorized_map(custom_gradient(halved)), declared, rtol=1e-6)
    np.testing.assert_allclose(through_vectorized_map(custom_gradient(halved, order=2)), declared, rtol=1e-6)
    np.testing.assert_allclose(through_vectorized_map(tf.custom_gradient(halved)), 2 * declared, rtol=1e-6)



def _clip_with_bounds_gradients(x, low, high):
    """HGQ's clip, restated: the bounds are scalars, and grad_fn gives them gradients of x's shape (unsummed)."""
    def grad_fn(dy):
        inside = tf.cast((x >= low) & (x <= high), dy.dtype)
        return dy * inside, dy * tf.cast(x < low, dy.dtype), dy * tf.cast(x > high, dy.dtype)

    return tf.clip_by_value(x, low, high), grad_fn


def _saved_and_loaded(module, path):
    tf.saved_model.save(module, str(path))
    return tf.saved_model.load(str(path))


def test_a_grad_fn_giving_a_scalar_argument_an_unsummed_gradient_saves_and_refuses_it_where_it_is_asked(tmp_path):
    """Issue 77: a gradient refused for an argument (here a bound's, of x's shape for a scalar) is refused where
    that argument's derivative is asked; tf.saved_model.save traces every registered gradient, and the refusal
    raised there, failing the save (tf.custom_gradient's fails at the gradient itself, before and after saving,
    over an unknown batch). Bounds made inside (HGQ's): it saves, and x's gradient after reloading is the declared
    one (1 inside the bounds, 0 outside: analytic). A bound given as an input: the gradient raises naming it before
    saving (tf.function differentiates every input of the function at once) and after reloading, where it runs."""
    signature = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32)]

    class Clip(tf.Module):
        @tf.function(input_signature=signature)
        def __call__(self, x, low):
            return custom_gradient(_clip_with_bounds_gradients)(x, tf.constant(-1.0), tf.constant(1.0))

    class ClipOfBound(tf.Module):
        @tf.function(input_signature=signature)
        def __call__(self, x, low):
            return custom_gradient(_clip_with_bounds_gradients)(x, low, tf.constant(1.0))

    x, low = tf.constant([-2.0, 0.5, 2.0]), tf.constant(-1.0)
    for clip in (Clip(), _saved_and_loaded(Clip(), tmp_path / "inside")):
        np.testing.assert_array_equal(vjp(lambda x, clip=clip: clip(x, low), x, tf.ones(3)), [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"args\[1\]"):
        vjp(lambda x: ClipOfBound()(x, low), x, tf.ones(3))
    loaded = _saved_and_loaded(ClipOfBound(), tmp_path / "input")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"args\[1\]"):
        vjp(lambda x: loaded(x, low), x, tf.ones(3))



@pytest.mark.parametrize("custom_gradients", [True, False])
def test_saved_model_round_trip(tmp_path, custom_gradients):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x):
            return tf.vectorized_map(matvec, x)

    options = tf.saved_model.SaveOptions(experimental_custom_gradients=custom_gradients)
    tf.saved_model.save(Model(), str(tmp_path), options=options)
    loaded = tf.saved_model.load(str(tmp_path))
    x = tf.constant([[1.0, 2.0, 3.0]])
    w = tf.constant([[1.0, -1.0]])
    grad = tf.convert_to_tensor(vjp(loaded, x, w))  # may arrive as IndexedSlices
    np.testing.assert_allclose(grad, vjp(lambda x: tf.matmul(x, A, transpose_b=True), x, w), rtol=1e-6)


def test_no_call_or_trace_adds_to_the_gradient_registry():
    """The carrier's traced function registers its gradient once per signature it is traced for (one here,
    made by the first trace); decorated functions, their calls and retraces add nothing."""
    from tensorflow.python.framework import ops

    def traced_once(scale):
        @custom_gradient
        def fresh(x):
            return scale * x, lambda dy: scale * dy

        tf.function(lambda x: vjp(fresh, x))(tf.constant([1.0, 2.0]))

    traced_once(2.0)
    before = len(ops.gradient_registry.list())
    for scale in (3.0, 4.0, 5.0):
        traced_once(scale)
    assert len(ops.gradient_registry.list()) == before


def test_eager_with_nothing_watching_returns_y_as_f_computed_it():
    seen = {}

    @custom_gradient
    def f(x):
        seen["y"] = tf.exp(x)
        return seen["y"], lambda dy: dy * seen["y"]

    assert f(tf.constant(1.0)) is seen["y"]


# ---------------------------------------------------------------- higher order


@custom_gradient(order=2)
def sin_times_x(x):
    return tf.sin(x) * x, lambda dy: dy * (tf.cos(x) * x + tf.sin(x))


def test_order_two_hessian_hvp_and_forward_over_reverse(mode):
    def derivatives(fn, x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(fn(x) * tf.constant([1.0, 2.0, -1.0], x.dtype))
            grad = inner.gradient(y, x)
        hessian = outer.jacobian(grad, x)
        with tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, -1.0, 0.5], x.dtype)) as acc:
            forward_over_reverse = vjp(fn, x, tf.constant([1.0, 2.0, -1.0], x.dtype))
        return grad, hessian, acc.jvp(forward_over_reverse)

    x = tf.constant([0.3, -1.2, 2.0], tf.float64)
    ours = in_mode(lambda x: derivatives(sin_times_x, x), mode)(x)
    truth = derivatives(lambda x: tf.sin(x) * x, x)
    for a, b in zip(ours, truth, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_order_two_value_is_exact_and_first_derivative_unchanged(mode):
    x = tf.constant([-0.0, 1.0, 2.0])
    y = in_mode(lambda x: vjp(sin_times_x, x) * 0 + sin_times_x(x), mode)(x)
    np.testing.assert_array_equal(y, tf.sin(x) * x)


def test_order_two_first_derivative_stays_finite_where_grad_fn_overflows():
    """Issue 58: grad_fn's own derivative is 0·exp(100) = NaN in float32 at x = 100; at order=2 it reached the
    first derivative (NaN where order=1 gives 1.0). Now it enters second derivatives alone."""
    log1pexp2 = custom_gradient(order=2)(log1pexp_tf.undecorated)
    x = tf.constant([0.0, 100.0])
    np.testing.assert_array_equal(vjp(log1pexp2, x), [0.5, 1.0])
    np.testing.assert_array_equal(vjp(log1pexp_tf, x), [0.5, 1.0])


def counting(reads_variable):
    calls, scale = [], tf.Variable(2.0)

    def f(x):
        calls.append(1)
        e = tf.exp(x) * (scale if reads_variable else 2.0)
        return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))

    return custom_gradient(order=2)(f), calls, scale


def test_order_two_calls_f_once_when_it_reads_no_variables():
    fn, calls, _ = counting(reads_variable=False)
    x = tf.constant([0.5, -1.0])
    with tf.GradientTape() as outer:
        outer.watch(x)
        grad = vjp(fn, x)
    truth = tf.math.sigmoid(x + tf.math.log(2.0))  # d/dx log(1 + 2eˣ)
    np.testing.assert_allclose(grad, truth, rtol=1e-6)
    np.testing.assert_allclose(outer.gradient(grad, x), truth * (1 - truth), rtol=1e-5)
    assert len(calls) == 1


def test_order_two_with_a_variable_read_in_f_keeps_its_autodiff_gradient():
    fn, calls, scale = counting(reads_variable=True)
    x = tf.constant([0.5, -1.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(fn(x))
    d_scale = tape.gradient(y, scale)
    np.testing.assert_allclose(d_scale, tf.reduce_sum(tf.exp(x) / (1 + 2 * tf.exp(x))), rtol=1e-6)
    assert len(calls) == 2  # once at the midpoint for grad_fn, once at x for the value that moves with the variable


# ---------------------------------------------------------------- linearity and errors


@pytest.mark.parametrize("x", [[1.0], [1.0, 2.0]], ids=["one element", "two elements"])
def test_a_constant_nonzero_grad_fn_is_refused(x):
    @custom_gradient
    def constant_grad(x):
        return x, lambda dy: tf.ones_like(x)

    with pytest.raises(ValueError, match="linear in the upstream"):
        vjp(constant_grad, tf.constant(x))


@pytest.mark.parametrize("mode", ["function", "xla"])
def test_a_constant_grad_fn_whose_value_is_unknown_while_tracing_is_refused_while_tracing(mode):
    @custom_gradient
    def constant_grad(x):
        return 2 * x, lambda dy: tf.ones_like(x)

    traced = tf.function(lambda x: vjp(constant_grad, x), input_signature=[tf.TensorSpec(None)],
                         jit_compile=(mode == "xla"))
    with pytest.raises(ValueError, match="does not depend on the upstream"):  # was [0, 0] under XLA: silent
        traced(tf.constant([1.0, 2.0]))


# ---------------------------------------------------------------- the zero map, infinite and opaque derivatives


def zero_map(decorator, which):
    @decorator
    def f(x, b):
        if which == "zeros":
            return 2 * x * b, lambda dy: (tf.zeros_like(x), tf.zeros_like(b))
        if which == "none":
            return 2 * x * b, lambda dy: None
        return 2 * x * b, lambda dy: (2 * dy * b, tf.zeros_like(b))  # a zero map for b alone

    return f


def grads_of_both(fn, x, b):
    with tf.GradientTape() as tape:
        tape.watch([x, b])
        y = fn(x, b)
    return tape.gradient(y, [x, b])


@pytest.mark.parametrize("which", ["zeros", "none", "one argument"])
def test_the_zero_map_is_accepted_and_matches_tf_custom_gradient(which, mode):
    x, b = tf.constant([1.0, 2.0]), tf.constant([3.0, -1.0])
    ours = in_mode(lambda x, b: grads_of_both(zero_map(custom_gradient, which), x, b), mode)(x, b)
    if which == "none":  # tf.custom_gradient wants one None per input; None for both is no gradient at all
        assert ours == [None, None]
        with pytest.raises(ValueError, match="expected to return 2 gradients"):
            grads_of_both(zero_map(tf.custom_gradient, which), x, b)
        return
    anchor = grads_of_both(zero_map(tf.custom_gradient, which), x, b)
    for a, c in zip(ours, anchor, strict=True):
        assert (a is None) == (c is None)
        if a is not None:
            np.testing.assert_array_equal(a, c)
    if which == "one argument":
        np.testing.assert_array_equal(ours[0], [6.0, -2.0])


@custom_gradient
def root(x):
    s = tf.sqrt(x)
    return s, lambda dy: dy * 0.5 / s


def test_an_infinite_derivative_of_a_one_element_y_is_the_identity_forms(mode):
    x = tf.constant(0.0)
    identity_form = lambda x: custom_gradient(tf.sqrt(x), 0.5 / tf.sqrt(x), x)  # noqa: E731
    for upstream in (tf.constant(1.0), tf.constant(0.0)):
        ours = in_mode(lambda x, w: vjp(root, x, w), mode)(x, upstream)
        np.testing.assert_array_equal(ours, vjp(identity_form, x, upstream))
    assert in_mode(lambda x: vjp(root, x), mode)(x).numpy() == np.inf
    assert vjp(tf.custom_gradient(root.undecorated), x).numpy() == np.inf
    assert in_mode(lambda x: jvp(root, x, tf.constant(1.0)), mode)(x).numpy() == np.inf


def test_an_infinite_derivative_inside_a_y_of_several_elements_is_autodiffs(mode):
    """J·v puts v = 0 through grad_fn's own ops, and inf·0 is NaN there: the carrier still passes the derivative,
    so the element's gradient is inf as autodiff of tf.sqrt gives it, its neighbour's exact. Forward mode runs
    TensorFlow's forward rules over grad_fn's ops, and its rule for dy / s gives NaN at 0 / 0 where the tangent
    reaches dy alone (the truth is inf): grad_fn's own op's limit, shown beside it, not the carrier's."""
    x = tf.constant([0.0, 4.0])
    np.testing.assert_array_equal(in_mode(lambda x: vjp(root, x), mode)(x), vjp(tf.sqrt, x))
    tangent = in_mode(lambda x: jvp(root, x, tf.ones_like(x)), mode)(x).numpy()
    assert np.isnan(tangent[0]), tangent
    assert tangent[1] == 0.25 or np.isnan(tangent[1]), tangent  # NaN only once TF relaxes its rules' shapes
    assert np.isnan(jvp(lambda dy: dy / tf.constant([0.0, 2.0]), tf.zeros([2]), tf.ones([2])).numpy()[0])


def numpy_adjoint(dy, x):
    return (np.asarray(dy) * 3.0 * np.asarray(x) ** 2).astype(np.float32)


def opaque_cube(reduce):
    @custom_gradient
    def cube(x):
        y = tf.reduce_sum(x**3) if reduce else x**3
        return y, lambda dy: tf.numpy_function(numpy_adjoint, [dy, x], tf.float32, stateful=False)

    return cube


def prevented_cube(reduce):
    @custom_gradient
    def cube(x):
        y = tf.reduce_sum(x**3) if reduce else x**3
        message = "Second derivative is not implemented."  # TFP's words for its samplers
        return y, lambda dy: tf.raw_ops.PreventGradient(input=dy * 3.0 * x**2, message=message)

    return cube


@pytest.mark.parametrize("mode", ["eager", "function"])  # tf.numpy_function cannot be compiled by XLA
@pytest.mark.parametrize("make", [opaque_cube, prevented_cube], ids=["numpy_function", "PreventGradient"])
def test_opaque_grad_fns_work_for_a_one_element_y(make, mode):
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(in_mode(lambda x: vjp(make(True), x), mode)(x), [3.0, 12.0])
    np.testing.assert_array_equal(in_mode(lambda x: jvp(make(True), x, tf.constant([1.0, 1.0])), mode)(x), 15.0)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("make", [opaque_cube, prevented_cube], ids=["numpy_function", "PreventGradient"])
def test_opaque_grad_fns_of_a_small_y_get_their_jacobian_from_unit_upstreams(make, mode):
    x = tf.constant([1.0, 2.0, -0.5])
    np.testing.assert_array_equal(in_mode(lambda x: vjp(make(False), x, tf.constant([1.0, -2.0, 4.0])), mode)(x),
                                  [3.0, -24.0, 3.0])
    np.testing.assert_array_equal(in_mode(lambda x: jvp(make(False), x, tf.constant([1.0, 1.0, 2.0])), mode)(x),
                                  [3.0, 12.0, 1.5])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("make", [opaque_cube, prevented_cube], ids=["numpy_function", "PreventGradient"])
def test_opaque_grad_fns_of_a_larger_y_give_reverse_mode_and_refuse_forward_mode_naming_the_way_out(make, mode):
    """Reverse mode is grad_fn(upstream), as tf.custom_gradient's; forward mode raises (while tracing, in graphs)."""
    x, upstream = tf.range(17, dtype=tf.float32), tf.range(17, dtype=tf.float32) - 8.0
    np.testing.assert_allclose(in_mode(lambda x: vjp(make(False), x, upstream), mode)(x), upstream * 3.0 * x**2,
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"Forward mode .*at most 16 elements .*identity form"):
        in_mode(lambda x: jvp(make(False), x, upstream), mode)(x)


def test_grad_fn_nonzero_at_zero_is_refused():
    @custom_gradient
    def shifted(x):
        return x, lambda dy: dy + 1.0

    for _ in range(2):  # a failed check is made again at the next call, never remembered as passed
        with pytest.raises(ValueError, match=r"AddV2 \(it adds a term that does not depend on the upstream"):
            vjp(shifted, tf.constant([1.0]))


def test_eager_traces_grad_fn_once_per_signature_as_tf_function_would():
    upstreams = []

    @custom_gradient
    def double_sum(x, scale):
        def grad(dy):
            upstreams.append("traced" if tf.is_symbolic_tensor(dy) else float(dy))
            return dy * 2.0 * scale * tf.ones_like(x)

        return tf.reduce_sum(x * 2.0 * scale), grad

    def gradient(x, scale):
        upstreams.clear()
        g = vjp(lambda x: double_sum(x, scale), x)
        np.testing.assert_array_equal(g, np.full(x.shape, 2.0 * scale))
        return list(upstreams)

    assert gradient(tf.ones([3]), 1.0) == ["traced", 1.0]  # first call: grad_fn's ops read, then J = grad_fn(1)
    assert gradient(tf.ones([3]) * 5, 1.0) == [1.0]  # same shapes and constants: read already
    assert gradient(tf.ones([4]), 1.0) == ["traced", 1.0]  # a new shape, as a new trace
    assert gradient(tf.ones([3]), 3.0) == ["traced", 1.0]  # a new constant argument, as a new trace


def test_an_untraceable_grad_fn_gets_numerical_tests_in_eager_mode_and_check_linearity_refuses_it():
    def f(x):
        return 2.0 * x, lambda dy: dy * 2.0 if float(tf.reduce_sum(dy)) >= -1e30 else dy  # reads a value in Python

    x = tf.constant([1.0, -2.0])
    np.testing.assert_array_equal(vjp(custom_gradient(f), x, tf.constant([3.0, 1.0])), [6.0, 2.0])
    with pytest.raises(ValueError, match="cannot be traced"):
        vjp(custom_gradient(check_linearity=True)(f), x)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_clipping_is_refused_by_default_in_every_mode(mode):
    def clipped(x):
        return x * 2.0, lambda dy: tf.clip_by_norm(dy, 0.1) * 2.0

    checked = custom_gradient(clipped)
    with pytest.raises(ValueError, match="Maximum \\(it clips or rectifies it\\)"):
        in_mode(lambda x: vjp(checked, x), mode)(tf.constant([1.0, 2.0, 3.0]))
    linear = custom_gradient(check_linearity=True)(log1pexp_tf.undecorated)
    np.testing.assert_allclose(vjp(linear, tf.constant(0.0)), 0.5)


def test_f_not_returning_a_pair_is_a_type_error():
    with pytest.raises(TypeError, match=r"pair \(y, grad_fn\)"):
        vjp(custom_gradient(lambda x: x * 2), tf.constant(1.0))


def test_wrong_number_of_gradients_is_a_value_error():
    @custom_gradient
    def f(x, y):
        return x * y, lambda dy: dy * y

    with pytest.raises(ValueError, match="returned 1 gradients"):
        vjp(lambda x: f(x, x), tf.constant(1.0))


def test_wrong_gradient_shape_names_the_argument_at_trace_time():
    @custom_gradient
    def f(x):
        return tf.reduce_sum(x), lambda dy: tf.fill([4], dy)

    traced = tf.function(lambda x: vjp(f, x))
    with pytest.raises(ValueError, match=r"shape \(4,\) for args\[0\] of shape \(3,\)"):
        traced.get_concrete_function(tf.TensorSpec([3]))


def test_integer_gradient_is_a_value_error():
    @custom_gradient
    def f(x):
        return x, lambda dy: tf.constant([1])

    with pytest.raises(ValueError, match="int32 gradient for args"):
        vjp(f, tf.constant([1.0]))


def test_order_must_be_one_or_two():
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        custom_gradient(order=3)(lambda x: (x, lambda dy: dy))


# ---------------------------------------------------------------- stated limits of any stop-gradient identity


def test_a_gradient_used_as_a_side_channel_for_a_variable_is_refused_clearly():
    """Keras float8's pattern: the 'gradient' of an amax history is its next value, not linear in the upstream."""
    history = tf.Variable([1.0, 3.0])

    @custom_gradient
    def quantized(x):
        def grad(dy, variables=None):
            return dy, [tf.concat([history[1:], [tf.reduce_max(tf.abs(dy))]], 0)]

        history.read_value()
        return x, grad

    x = tf.constant([1.0, -2.0])
    with tf.GradientTape() as tape, pytest.raises(ValueError, match=r"ConcatV2 \(it adds a term|Max \(it clips"):
        tape.watch(x)
        quantized(x)


def test_grad_fns_side_effects_happen_where_its_derivative_is_formed():
    """Eagerly grad_fn is traced once per input signature, so that its ops can be read. Under one tape alone it
    then runs when the tape asks, on the upstream, as tf.custom_gradient runs it (negated twice: the order-1
    terms' own bits); where more can be asked (a persistent tape, an accumulator) it runs at the call, on zero
    upstreams, for J·v, and never in the backward; where nothing records, not at all."""
    upstreams = []

    @custom_gradient
    def logged(x):
        def grad(dy):
            upstreams.append("traced" if tf.is_symbolic_tensor(dy) else dy.numpy().tolist())
            return 2.0 * dy

        return 2.0 * x, grad

    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = logged(x)
    assert upstreams == ["traced"]  # at the call, before any gradient is asked for
    np.testing.assert_array_equal(tape.gradient(y, x, output_gradients=tf.constant([3.0, 4.0])), [6.0, 8.0])
    assert upstreams == ["traced", [-3.0, -4.0]]
    upstreams.clear()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = logged(x)
    assert upstreams == [[0.0, 0.0]]  # the same input signature: traced once; J·v at the call
    np.testing.assert_array_equal(tape.gradient(y, x, output_gradients=tf.constant([3.0, 4.0])), [6.0, 8.0])
    assert len(upstreams) == 1  # tape.gradient does not call grad_fn
    upstreams.clear()
    logged(x)  # nothing records: the value alone, no grad_fn call
    assert upstreams == []


def test_a_grad_fn_that_refuses_differentiation_raises_when_f_is_called_under_a_tape():
    @custom_gradient
    def refused(x):
        def grad(dy):
            raise NotImplementedError("refused: no gradient for this op")

        return 2.0 * x, grad

    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(refused(x), [2.0, 4.0])  # no tape: f's value, grad_fn untouched
    with tf.GradientTape() as tape, pytest.raises(NotImplementedError, match="refused"):
        tape.watch(x)
        refused(x)


# ---------------------------------------------------------------- options, the signature cache, AutoGraph


@pytest.mark.parametrize("options", [{"order": "2"}, {"order": 2.0}, {"order": True}, {"check_linearity": "yes"}])
def test_bad_options_are_refused_when_given(options):
    with pytest.raises((ValueError, TypeError), match=r"order must be 1 or 2|check_linearity must be True or False"):
        custom_gradient(**options)


def test_the_grad_fn_signature_cache_is_bounded():
    from stopgrad_math.shared import grad_fn_signature

    x = tf.constant([1.0, 2.0])
    for k in range(grad_fn_signature.SIGNATURES_KEPT + 300):  # a fresh code object each time, as generated code makes
        namespace = {}
        exec(f"def f(x):\n    return 2.0 * x, lambda dy{k}: {k % 7 + 1}.0 * dy{k}", namespace)  # a new code each k
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = custom_gradient(namespace["f"])(x)
        if k % 400 == 0:
            np.testing.assert_array_equal(tape.gradient(y, x), [k % 7 + 1.0] * 2)
    assert len(grad_fn_signature._SIGNATURES) == grad_fn_signature.SIGNATURES_KEPT


def test_a_decorated_lambda_draws_no_autograph_warning(caplog):
    double = custom_gradient(lambda x: (2 * x, lambda dy: 3 * dy))
    with caplog.at_level("WARNING", logger="tensorflow"):
        grad = tf.function(lambda x: vjp(double, x))(tf.constant([1.0]))
    np.testing.assert_array_equal(grad, [3.0])
    assert not [r for r in caplog.records if "AutoGraph could not transform" in r.getMessage()]


def test_integer_tensor_arguments_are_keyed_by_shape_for_the_eager_checks():
    """An integer tensor (row ids) is part of the input signature by shape and dtype, as tf.function keys it, so
    the dot-product test of the transpose is made once, not at every call with new ids."""
    upstreams = []

    @custom_gradient
    def gathered(table, ids):
        def grad(dy):
            upstreams.append(dy)
            return tf.tensor_scatter_nd_add(tf.zeros_like(table), ids[:, None], dy), None

        return tf.gather(table, ids), grad

    table = tf.reshape(tf.range(12.0), [6, 2])
    for ids in ([0, 2, 5], [1, 1, 3]):
        with tf.GradientTape() as tape:
            tape.watch(table)
            y = gathered(table, tf.constant(ids))
        want = tf.tensor_scatter_nd_add(tf.zeros([6, 2]), tf.constant(ids)[:, None], tf.ones([3, 2]))
        np.testing.assert_array_equal(tape.gradient(y, table), want)
    assert len(upstreams) == 3  # zeros at each call, and the random upstream once


# ---------------------------------------------------------------- claims held by their own tests


@custom_gradient
def scaled_pair(x):
    """Two structured outputs of an elementwise map: y = {"a": x·c, "b": (2x,)}; the gradient is the true one."""
    c = tf.constant([1.0, -1.0, 0.0, 2.0, 1.0])
    return {"a": x * c, "b": (2.0 * x,)}, lambda dy: dy["a"] * c + 2.0 * dy["b"][0]


AWKWARD_X = tf.constant([-0.0, np.inf, np.nan, 3.0, -np.inf])


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
def test_the_value_is_f_s_bit_for_bit_under_a_tape(mode):
    """−0.0, inf and NaN in y (and 0·inf, a NaN): assert_array_equal would take −0.0 for +0.0; bits do not."""
    want = scaled_pair.undecorated(AWKWARD_X)[0]

    def value(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            return scaled_pair(x)

    if mode == "tf1":
        with tf.Graph().as_default():
            got = tf.compat.v1.Session().run(value(tf.constant(AWKWARD_X.numpy())))
    else:
        got = in_mode(value, mode)(AWKWARD_X)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
        np.testing.assert_array_equal(bits(np.asarray(g)), bits(w.numpy()))


@pytest.mark.parametrize("mode", MODES)
def test_forward_mode_of_several_structured_outputs_is_the_jacobian_times_the_tangent(mode):
    x, tangent = tf.constant([0.5, -1.0, 2.0, 3.0, -0.5]), tf.constant([1.0, 2.0, -1.0, 0.5, 3.0])

    def jvps(x, tangent):
        with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
            y = scaled_pair(x)
        return accumulator.jvp(y)

    got = in_mode(jvps, mode)(x, tangent)
    np.testing.assert_allclose(got["a"], tangent.numpy() * [1.0, -1.0, 0.0, 2.0, 1.0])  # J = diag(c), by hand
    np.testing.assert_allclose(got["b"][0], 2.0 * tangent.numpy())


def test_eagerly_a_call_that_no_tape_or_accumulator_watches_calls_no_grad_fn():
    """A tape watching other tensors (a decorated call inside another's f, on stopped arguments) cannot ask for
    this call's derivative: f's value alone, no grad_fn (it cost TFP's Bessel functions a second grad_fn each).
    An accumulator on x still gets grad_fn's Jacobian."""
    calls = []

    @custom_gradient
    def doubled(x):
        def grad(dy):
            calls.append(dy)
            return 3 * dy  # deliberately not f's own derivative, so that only grad_fn can give 3

        return 2 * x, grad

    x, other = tf.constant([1.0, 2.0]), tf.constant(3.0)
    with tf.GradientTape() as tape:
        tape.watch(other)
        y = doubled(x)
    assert not calls
    np.testing.assert_array_equal(y, [2.0, 4.0])
    with tf.autodiff.ForwardAccumulator(x, tf.ones(2)) as accumulator:
        y = doubled(x)
    np.testing.assert_array_equal(accumulator.jvp(y), [3.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch([x, other])
        y = doubled(x)
    np.testing.assert_array_equal(tape.gradient(y, x), [3.0, 3.0])


def test_a_grad_fn_that_clips_runs_eagerly_where_nothing_watches_and_is_refused_where_traced():
    """Issue 58: eagerly with no tape, grad_fn is neither called nor judged (tf.custom_gradient's value alone); a
    tape gets the refusal naming the op; a graph cannot tell whether a later tape will differentiate it, so the
    call is refused as it is traced (the documented limit, against JAX, which judges where a derivative is
    asked)."""
    @custom_gradient
    def clip_gradient(x):
        return tf.identity(x), lambda ct: tf.clip_by_value(ct, -0.5, 0.5)

    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(clip_gradient(x), x)
    np.testing.assert_array_equal(tf.custom_gradient(clip_gradient.undecorated)(x), x)
    with pytest.raises(ValueError, match=r"Maximum|Minimum|clip"), tf.GradientTape() as tape:
        tape.watch(x)
        clip_gradient(x)
    with pytest.raises(ValueError, match=r"Maximum|Minimum|clip"):
        tf.function(clip_gradient)(x)


def test_a_decorated_keras_layer_call_keeps_its_signature_as_tf_custom_gradient_does():
    """tf_keras passes ``training`` to a layer's call that takes it, reading the call's signature: the decorator
    keeps f's (it was ``(*args, **kwargs)``, and a Sequential model raised ``unexpected keyword argument
    'training'``, issue 57). A call without ``training`` gets tf.custom_gradient's gradient, side by side (which
    refuses a keyword argument outside eager execution, so the call with ``training`` is ours alone)."""
    tf_keras = pytest.importorskip("tf_keras")

    def layer_with(decorator, takes_training):
        class Halved(tf_keras.layers.Layer):
            if takes_training:
                @decorator
                def call(self, x, training=None):
                    return tf.identity(x), lambda upstream: upstream * (0.5 if training else 0.25)
            else:
                @decorator
                def call(self, x):
                    return tf.identity(x), lambda upstream: upstream * 0.5

        return Halved()

    def gradient(layer, training):
        model = tf_keras.Sequential([tf_keras.Input((2,)), layer])
        x = tf.constant([[1.0, -2.0]])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = model(x, training=training)
        return tape.gradient(y, x).numpy()

    np.testing.assert_array_equal(gradient(layer_with(custom_gradient, False), True),
                                  gradient(layer_with(tf.custom_gradient, False), True))
    for training in (True, False):
        np.testing.assert_array_equal(gradient(layer_with(custom_gradient, True), training),
                                      np.full((1, 2), 0.5 if training else 0.25, np.float32))


def test_a_wrong_count_of_gradients_is_said_as_tensorflow_says_it():
    """One argument, two gradients: tf.custom_gradient says it expected 1 and got 2; so does the decorator (it
    took the pair for one stacked gradient, and named a shape, issue 57)."""
    def with_two_gradients(decorator):
        @decorator
        def f(x):
            return x * 2.0, lambda upstream: (upstream * 2.0, upstream * 3.0)

        return f

    x = tf.constant([1.0, 2.0])
    for decorator, message in ((tf.custom_gradient, "expected to return 1 gradients, but returned 2"),
                               (custom_gradient, "returned 2 gradients for f's 1 argument")):
        with pytest.raises(ValueError, match=re.escape(message)), tf.GradientTape() as tape:
            tape.watch(x)
            tape.gradient(with_two_gradients(decorator)(x), x)


def test_a_wrong_gradient_for_an_argument_nobody_differentiates_is_refused_only_where_it_may_be_asked():
    """HGQ's clip gives its scalar bounds gradients of x's shape. Eagerly, where only x is watched, TensorFlow
    never reads them, and neither does the decorator: x's gradient as tf.custom_gradient gives it; where a bound
    is watched it is refused at the call, naming it. In a graph, where tf.gradients may ask for any tensor later,
    it is refused when the bound's derivative is asked (a ValueError naming it, from tf.gradients, a tape or an
    accumulator), and x's gradient is given (tf.custom_gradient's IdentityN refuses that too); at order 2 at the
    call."""
    def clip_with(decorator):
        @decorator
        def clip(x, lower, upper):
            return tf.clip_by_value(x, lower, upper), lambda upstream: (upstream, tf.ones([2]), tf.ones([2]))

        return clip

    x, lower, upper = tf.constant([0.5, 3.0]), tf.constant(0.0), tf.constant(1.0)
    gradients = []
    for decorator in (tf.custom_gradient, custom_gradient):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = clip_with(decorator)(x, lower, upper)
        gradients.append(tape.gradient(y, x).numpy())
    np.testing.assert_array_equal(gradients[1], gradients[0])
    with pytest.raises(ValueError, match=r"args\[1\]"), tf.GradientTape() as tape:
        tape.watch([x, lower])
        clip_with(custom_gradient)(x, lower, upper)
    in_graph = tf.function(lambda x: tf.gradients(clip_with(custom_gradient)(x, lower, upper), x))(x)
    np.testing.assert_array_equal(in_graph[0], gradients[0])
    refused = r"shape \(2,\) for args\[1\]"
    with pytest.raises(ValueError, match=refused):
        tf.function(lambda x, lower: tf.gradients(clip_with(custom_gradient)(x, lower, upper), lower))(x, lower)

    @tf.function
    def bound_tangent(x, lower):
        with tf.autodiff.ForwardAccumulator(lower, tf.constant(1.0)) as accumulator:
            y = clip_with(custom_gradient)(x, lower, upper)
        return accumulator.jvp(y)

    with pytest.raises(ValueError, match=refused):
        bound_tangent(x, lower)
    with pytest.raises(ValueError, match=r"args\[1\]"):
        tf.function(lambda x: tf.gradients(clip_with(lambda f: custom_gradient(f, order=2))(x, lower, upper), x))(x)
