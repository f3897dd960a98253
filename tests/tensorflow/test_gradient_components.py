"""Every kind of argument and output the decorator carries, against tf.custom_gradient or the definition.

Variables of every kind, RaggedTensor, SparseTensor and IndexedSlices get
exactly grad_fn's gradient, never plain autodiff of f; what cannot be carried
is a TypeError naming the argument.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
import tf_keras
from helpers import MODES, in_mode

from stopgrad_math import custom_gradient

# ---------------------------------------------------------------- variables of every kind


@custom_gradient
def double_with_grad_five(w):
    """Autodiff would give 2; the custom gradient is 5."""
    return 2.0 * w, lambda dy: 5.0 * dy


def gradient_through(fn, variable, source=None):
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(fn(variable))
    return tape.gradient(y, source if source is not None else variable)


@pytest.mark.parametrize("mode", MODES)
def test_a_keras_3_variable_argument_gets_the_custom_gradient(mode):
    w = keras.Variable([3.0, -1.0])
    np.testing.assert_array_equal(in_mode(lambda: gradient_through(double_with_grad_five, w), mode)(), [5.0, 5.0])


@pytest.mark.parametrize("mode", MODES)
def test_a_tf_keras_autocast_variable_argument_gets_the_custom_gradient(mode):
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = tf_keras.layers.Dense(1)
        layer.build((None, 2))
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    kernel = layer.kernel
    assert type(kernel).__name__ == "AutoCastVariable"
    np.testing.assert_array_equal(in_mode(lambda: gradient_through(double_with_grad_five, kernel), mode)(), [[5.0]] * 2)


@pytest.mark.parametrize("mode", MODES)
def test_a_sharded_variable_argument_gets_the_custom_gradient_in_each_shard(mode):
    shards = [tf.Variable([1.0, 2.0]), tf.Variable([3.0])]
    sharded = tf.__internal__.distribute.ShardedVariable(shards)
    grads = in_mode(lambda: gradient_through(double_with_grad_five, sharded, shards), mode)()
    np.testing.assert_array_equal(grads[0], [5.0, 5.0])
    np.testing.assert_array_equal(grads[1], [5.0])


def test_a_mirrored_variable_argument_gets_the_custom_gradient_on_every_replica():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])

    @tf.function
    def step():
        per_replica = strategy.run(lambda: gradient_through(double_with_grad_five, w))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    np.testing.assert_array_equal(step(), [10.0, 10.0])  # 5 from each of two replicas


class Keras3Dense(keras.layers.Layer):
    """A Keras 3 layer passing its own weight to a decorated matmul with a scaled gradient for the kernel."""

    def __init__(self, decorator, grad_scale, **kwargs):
        super().__init__(**kwargs)
        self.decorator, self.grad_scale = decorator, grad_scale

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 1), initializer="ones")

    def call(self, x):
        scale = self.grad_scale

        @self.decorator
        def matmul(x, k):
            def grad(*args, upstream=None):
                upstream = args[0] if upstream is None else upstream
                return keras.ops.matmul(upstream, keras.ops.transpose(k)), scale * keras.ops.matmul(
                    keras.ops.transpose(x), upstream
                )

            return keras.ops.matmul(x, k), grad

        return matmul(x, self.kernel)


def test_keras_3_model_fit_trains_the_weights_keras_ops_custom_gradient_trains():
    x = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)

    def fitted(decorator):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), Keras3Dense(decorator, grad_scale=0.5)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        model.fit(x, y, epochs=5, batch_size=32, verbose=0)
        return model.layers[0].kernel.numpy()

    ours, anchor = fitted(custom_gradient), fitted(keras.ops.custom_gradient)
    np.testing.assert_allclose(ours, anchor, rtol=1e-6)
    assert not np.allclose(ours, fitted(lambda f: (lambda x, k: f(x, k)[0]))), "the scaled gradient must matter"


# ---------------------------------------------------------------- composite tensors


def make_square(decorator):
    @decorator
    def square(x):
        return x * x, lambda dy: 2.0 * x * dy

    return square


def ragged_gradient(square, x):
    with tf.GradientTape() as tape:
        tape.watch(x.flat_values)
        y = square(x)
        loss = tf.reduce_sum(y.flat_values * tf.constant([1.0, 2.0, 3.0]))
    return y.flat_values, tape.gradient(loss, x.flat_values)


@pytest.mark.parametrize("mode", MODES)
def test_ragged_argument_and_output_equal_tf_custom_gradient(mode):
    x = tf.ragged.constant([[1.0, 2.0], [3.0]])
    ours = in_mode(lambda v: ragged_gradient(make_square(custom_gradient), x.with_flat_values(v)), mode)(x.flat_values)
    anchor = ragged_gradient(make_square(tf.custom_gradient), x)
    for a, b in zip(ours, anchor, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours[1], [2.0, 8.0, 18.0])  # 2x times the weights


def test_ragged_gradient_from_tape_is_ragged_as_in_tf():
    x = tf.ragged.constant([[1.0, 2.0], [3.0]])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = make_square(custom_gradient)(x)
    grad = tape.gradient(y, x)
    assert isinstance(grad, tf.RaggedTensor)
    assert grad.to_list() == [[2.0, 4.0], [6.0]]


@pytest.mark.parametrize("mode", ["eager", "function"])  # XLA has no kernels for sparse ops
def test_sparse_argument_gets_the_custom_gradient_in_its_values(mode):
    indices, dense_shape = tf.constant([[0, 0], [1, 1]], tf.int64), tf.constant([2, 2], tf.int64)

    @custom_gradient
    def total(s):
        def grad(dy):  # 7 per stored value, where autodiff would give 2
            return tf.SparseTensor(s.indices, 7.0 * dy * tf.ones_like(s.values), s.dense_shape)

        return 2.0 * tf.sparse.reduce_sum(s), grad

    def values_gradient(values):
        with tf.GradientTape() as tape:
            tape.watch(values)
            y = total(tf.SparseTensor(indices, values, dense_shape))
        return tape.gradient(y, values)

    np.testing.assert_array_equal(in_mode(values_gradient, mode)(tf.constant([1.0, 3.0])), [7.0, 7.0])
    with pytest.raises(ValueError, match="SparseTensor is not supported"):  # the anchor refuses sparse arguments
        tf.custom_gradient(total.undecorated)(tf.SparseTensor(indices, tf.constant([1.0, 3.0]), dense_shape))


# ---------------------------------------------------------------- objects given to f as they are


@pytest.mark.parametrize(
    "argument, kind",
    [
        (tfp.distributions.Normal(0.0, 1.0), "Normal"),
        (tf.TensorArray(tf.float32, size=1), "TensorArray"),
        (object(), "object"),
    ],
)
def test_an_object_argument_is_given_to_f_as_it_is_and_a_gradient_for_it_is_refused(argument, kind):
    seen = []

    def f(x, other):
        seen.append(other)
        return 2.0 * x, lambda dy: 2.0 * dy  # one gradient per tensor argument, as tf.custom_gradient takes it

    x = tf.constant(1.0)
    for call in (lambda g: g(x, argument), lambda g: g(x, other=argument)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = call(custom_gradient(f))
        assert seen[-1] is argument  # as it is, as tf.custom_gradient passes it
        assert float(tape.gradient(y, x)) == 2.0

    @custom_gradient
    def claims_a_gradient(x, other):
        return 2.0 * x, lambda dy: (2.0 * dy, 1.0)

    with tf.GradientTape() as tape, pytest.raises(ValueError, match=r"gradient for args\[1\].*carries no gradient"):
        tape.watch(x)
        claims_a_gradient(x, argument)


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
@pytest.mark.parametrize("base", [object, tf.Module])
def test_methods_of_a_class_and_of_a_tf_module_as_in_tfs_testCustomGradientClass(mode, base):
    """A decorated method: self passes through to f; grad_fn gives the gradient of the tensor argument."""

    def make(decorator):
        class Scaled(base):
            def __init__(self):
                super().__init__()
                self.scale = 3.0

            @decorator
            def __call__(self, x):
                return self.scale * x, lambda dy: 5.0 * dy  # grad_fn's gradient: 5, not the scale

        return Scaled()

    def gradient(module, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = module(x)
        return tape.gradient(y, x)

    def run(decorator):
        if mode != "tf1":
            return in_mode(lambda x: gradient(make(decorator), x), mode)(tf.constant([1.0, 2.0])).numpy()
        with tf.Graph().as_default():
            x = tf.constant([1.0, 2.0])
            (result,) = tf.gradients(make(decorator)(x), x)
            with tf.compat.v1.Session() as session:
                return session.run(result)

    got = run(custom_gradient)
    np.testing.assert_array_equal(got, [5.0, 5.0])
    np.testing.assert_array_equal(got, run(tf.custom_gradient))


@pytest.mark.parametrize("mode", MODES)
def test_a_variable_read_through_self_gets_grad_fns_variable_gradient(mode):
    """f reads a tf.Module's variable through self: grad_fn gives its gradient by the ``variables`` keyword,
    as TF's testCustomGradientWithVariables does; the truth is the gradient grad_fn states."""

    def make(decorator):
        class Linear(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable([2.0, -1.0])

            @decorator
            def __call__(self, x):
                def grad_fn(dy, variables=None):
                    return 7.0 * dy * self.w, [11.0 * dy * x]  # neither is autodiff's: w and x

                return self.w * x, grad_fn

        return Linear()

    def gradients(module, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = module(x)
        return tape.gradient(y, [x, module.w])

    x = tf.constant([1.0, 3.0])
    module = make(custom_gradient)
    got = in_mode(lambda x: gradients(module, x), mode)(x)
    np.testing.assert_array_equal(got[0], 7.0 * np.float32([2.0, -1.0]))
    np.testing.assert_array_equal(got[1], 11.0 * np.float32([1.0, 3.0]))
    anchor = make(tf.custom_gradient)
    for ours, theirs in zip(got, in_mode(lambda x: gradients(anchor, x), mode)(x), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_constants_of_every_kind_pass_through():
    seen = {}

    @custom_gradient
    def f(x, *constants):
        seen["constants"] = constants
        return 2.0 * x, lambda dy: [2.0 * dy] + [None] * len(constants)

    constants = (None, 3, 2.5, 1j, "text", b"bytes", np.ones(2), np.float32(1.0), tf.float32, tf.TensorShape([2]), len)
    x = tf.constant(1.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = f(x, *constants)
    assert tape.gradient(y, x).numpy() == 2.0
    assert seen["constants"][:6] == constants[:6] and seen["constants"][-1] is len


# ---------------------------------------------------------------- sparse gradients stay sparse


def embedding_lookup(decorator):
    @decorator
    def lookup(table, ids):
        rows = tf.gather(table, ids)

        def grad(dy):
            return tf.IndexedSlices(dy, ids, tf.shape(table, out_type=tf.int64)), None

        return rows, grad

    return lookup


def table_gradient(lookup, table, ids, weights):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(lookup(table, ids) * weights)
    return tape.gradient(loss, table)


@pytest.mark.parametrize("mode", MODES)
def test_an_indexed_slices_gradient_stays_indexed_slices_as_with_tf_custom_gradient(mode):
    table = tf.Variable(tf.reshape(tf.range(40.0), [10, 4]))
    ids = tf.constant([3, 7, 3])  # a repeated row: its two slices both count
    weights = tf.reshape(tf.range(12.0), [3, 4])
    ours = in_mode(lambda: table_gradient(embedding_lookup(custom_gradient), table, ids, weights), mode)()
    anchor = table_gradient(embedding_lookup(tf.custom_gradient), table, ids, weights)
    assert isinstance(ours, tf.IndexedSlices) and isinstance(anchor, tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(ours), tf.convert_to_tensor(anchor))
    np.testing.assert_array_equal(ours.indices, [3, 7, 3])


def test_the_forward_pass_touches_only_the_gathered_rows():
    """No op of the traced step makes a table-sized tensor but the read of the table itself."""
    table = tf.Variable(tf.zeros([1000, 8]))

    @tf.function
    def step(ids):
        return table_gradient(embedding_lookup(custom_gradient), table, ids, tf.ones([3, 8]))

    graph = step.get_concrete_function(tf.TensorSpec([3], tf.int32)).graph
    table_sized = [op.type for op in graph.get_operations() for out in op.outputs if out.shape == [1000, 8]]
    # The read f gets, stopped, and passed through integers for tf.gradients (a Bitcast forwards its buffer).
    assert sorted(table_sized) == ["Bitcast", "Bitcast", "ReadVariableOp", "StopGradient"], table_sized


def closed_over_lookup(decorator, table):
    @decorator
    def lookup(ids):
        rows = tf.gather(table, ids)

        def grad(dy, variables=None):
            return None, [tf.IndexedSlices(dy, ids, tf.shape(table, out_type=tf.int64))]

        return rows, grad

    return lookup


def test_a_table_closed_over_with_a_sparse_variables_gradient_is_never_read_whole():
    """A variable passed as an argument is read once, as tf.custom_gradient reads it (TF copies a variable on
    each read once sparse ops have touched it); one that f closes over, with its gradient from `variables`, is
    only ever gathered."""
    table = tf.Variable(tf.reshape(tf.range(8000.0), [1000, 8]))

    def step(decorator, ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(closed_over_lookup(decorator, table)(ids) * tf.range(8.0))
        return tape.gradient(loss, table)

    traced = tf.function(lambda ids: step(custom_gradient, ids))
    graph = traced.get_concrete_function(tf.TensorSpec([3], tf.int32)).graph
    # grad_fn's tf.shape(table) leaves a read that nothing consumes, which the graph never runs.
    used = [op.type for op in graph.get_operations() for t in op.outputs if t.shape == [1000, 8] and t.consumers()]
    assert not used, used
    ids = tf.constant([5, 999, 5])
    ours, anchor = traced(ids), step(tf.custom_gradient, ids)
    assert isinstance(ours, tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(ours), tf.convert_to_tensor(anchor))


# ---------------------------------------------------------------- integer and complex


@pytest.mark.parametrize("mode", MODES)
def test_integer_arguments_and_outputs_never_call_grad_fn(mode):
    @custom_gradient
    def square(x):
        def grad(dy):
            raise AssertionError("grad_fn must not be called: nothing here is differentiable")

        return x * x, grad

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(tf.constant(1.0))
            return square(x)

    anchor = tf.custom_gradient(square.undecorated)(tf.constant([1, 2]))
    np.testing.assert_array_equal(in_mode(run, mode)(tf.constant([1, 2])), anchor)
    np.testing.assert_array_equal(anchor, [1, 4])


def complex_derivatives(fn, z, upstream, tangent):
    with tf.GradientTape() as tape:
        tape.watch(z)
        y = fn(z)
    with tf.autodiff.ForwardAccumulator(z, tangent) as acc:
        y2 = fn(z)
    return y, tape.gradient(y, z, output_gradients=upstream), acc.jvp(y2)


Z = tf.constant([1.0 + 2.0j, -0.5 + 0.25j, 3.0 - 1.0j], tf.complex128)
COMPLEX = {  # name: (decorated, formula, upstream): grad_fn in TF's convention, conj(f')·dy
    "elementwise exp": (
        custom_gradient(lambda z: (tf.exp(z), lambda dy: dy * tf.math.conj(tf.exp(z)))), tf.exp,
        tf.constant([0.5 - 1j, 2.0, -1.0 + 3j], tf.complex128),
    ),
    "one element: sum(z·z)": (
        custom_gradient(lambda z: (tf.reduce_sum(z * z), lambda dy: dy * tf.math.conj(2 * z))),
        lambda z: tf.reduce_sum(z * z), tf.constant(1.5 - 0.5j, tf.complex128),
    ),
    "real y of complex z: |z|²": (
        custom_gradient(lambda z: (tf.math.real(z * tf.math.conj(z)), lambda dy: tf.cast(dy, z.dtype) * 2 * z)),
        lambda z: tf.math.real(z * tf.math.conj(z)), tf.constant([1.0, -2.0, 0.5], tf.float64),
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(COMPLEX))
def test_complex_arguments_and_outputs_follow_tfs_convention(name, mode):
    ours, formula, upstream = COMPLEX[name]
    tangent = tf.constant([1.0 - 1j, 0.5j, 2.0], tf.complex128)
    got = in_mode(lambda z, w, t: complex_derivatives(ours, z, w, t), mode)(Z, upstream, tangent)
    want = complex_derivatives(formula, Z, upstream, tangent)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13)


# ---------------------------------------------------------------- the anchor's behaviour, as the docs state it


def test_tf_custom_gradient_refuses_a_keras_3_variable_argument_in_eager():
    with pytest.raises(TypeError, match="must accept keyword argument 'variables'"):
        gradient_through(tf.custom_gradient(double_with_grad_five.undecorated), keras.Variable(3.0))


@pytest.mark.parametrize("make", ["numpy_function", "PreventGradient"])
def test_tf_custom_gradient_runs_opaque_grad_fns_in_the_backward_pass(make):
    def cube(x):
        def grad(dy):
            if make == "numpy_function":
                return tf.numpy_function(lambda d, x: (3 * d * x**2).astype(np.float32), [dy, x], tf.float32)
            return tf.raw_ops.PreventGradient(input=3 * dy * x**2, message="no second derivative")

        return x**3, grad

    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.custom_gradient(cube)(x)
    np.testing.assert_array_equal(tape.gradient(y, x), [3.0, 12.0])
