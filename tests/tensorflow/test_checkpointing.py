"""Gradient checkpointing with the TensorFlow decorator, as users write it (issue 57): f runs a block of a standard
Keras layer, and grad_fn recomputes the block under a tf.GradientTape and returns TensorFlow's own gradient of it.
Every gradient op of the standard layers is linear in the upstream, and linear_ops knows each by the input that is
the upstream. The truth is plain autodiff of the block (a tape, a ForwardAccumulator), float64."""

import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras")

import stopgrad_math as sgm  # noqa: E402

LAYERS = keras.layers


def _blocks():
    """name → (layer, input shape), float64, weights from a fixed seed."""
    keras.utils.set_random_seed(57)
    made = {
        "dense": (LAYERS.Dense(5, dtype="float64"), (3, 6)),
        "layer_norm": (LAYERS.LayerNormalization(dtype="float64"), (3, 6)),
        "batch_norm_inference": (LAYERS.BatchNormalization(dtype="float64"), (3, 6)),
        "conv1d": (LAYERS.Conv1D(3, 2, dtype="float64"), (1, 6, 2)),
        "conv2d": (LAYERS.Conv2D(3, 3, padding="same", dtype="float64"), (1, 5, 5, 2)),
        "depthwise_conv2d": (LAYERS.DepthwiseConv2D(3, dtype="float64"), (1, 5, 5, 2)),
        "max_pool2d": (LAYERS.MaxPooling2D(2, dtype="float64"), (1, 4, 4, 2)),
        "average_pool2d": (LAYERS.AveragePooling2D(2, dtype="float64"), (1, 4, 4, 2)),
        "dropout_inference": (LAYERS.Dropout(0.5, dtype="float64"), (3, 6)),
        "softmax": (LAYERS.Softmax(dtype="float64"), (3, 6)),
        **{activation: (LAYERS.Activation(activation, dtype="float64"), (3, 6))
           for activation in ("relu", "relu6", "elu", "selu", "sigmoid", "tanh", "softplus", "gelu",
                              "silu", "leaky_relu")},
    }
    return made


BLOCKS = _blocks()


def _block(name):
    layer, _ = BLOCKS[name]
    return lambda x: layer(x, training=False)


def _recomputed(block, decorator=sgm.custom_gradient):
    @decorator
    def checkpointed(x):
        def grad_fn(upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                again = block(x)
            return tape.gradient(again, x, output_gradients=upstream)

        return block(x), grad_fn

    return checkpointed


def _data(name):
    _, shape = BLOCKS[name]
    rng = np.random.default_rng(len(name))
    x = tf.constant(rng.standard_normal(shape))
    y = _block(name)(x)
    return x, tf.constant(rng.standard_normal(shape)), tf.constant(rng.standard_normal(y.shape))


def _reverse(fn, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=upstream)


def _forward(fn, x, tangent):
    with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
        y = fn(x)
    return accumulator.jvp(y)


def _in_mode(mode, way, fn, x, direction):
    """``way(fn, x, direction)`` eagerly, in a tf.function, or compiled by XLA."""
    if mode == "eager":
        return way(fn, x, direction)
    return tf.function(lambda x, direction: way(fn, x, direction), jit_compile=mode == "xla")(x, direction)


MODES = ["eager", "tf.function", "xla"]
# XLA has no float64 MaxPoolGradGrad, which J·v of a max pool's gradient is: tested apart, as that limit.
_CASES = [(name, mode) for name in BLOCKS for mode in MODES if (name, mode) != ("max_pool2d", "xla")]


@pytest.mark.parametrize(("name", "mode"), _CASES)
def test_a_recomputed_block_has_the_blocks_gradient(name, mode):
    block = _block(name)
    x, _, upstream = _data(name)
    np.testing.assert_allclose(_in_mode(mode, _reverse, _recomputed(block), x, upstream), _reverse(block, x, upstream),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("name", "mode"), _CASES)
def test_a_recomputed_block_has_the_blocks_derivative_in_forward_mode(name, mode):
    block = _block(name)
    x, tangent, _ = _data(name)
    np.testing.assert_allclose(_in_mode(mode, _forward, _recomputed(block), x, tangent), _forward(block, x, tangent),
                               rtol=1e-10, atol=1e-12)


def _transposed_gradient(block, x, tangent, upstream):
    """J·v as the transpose of the block's gradient, a linear map of the upstream: TensorFlow's autodiff of it."""
    with tf.GradientTape() as outer:
        outer.watch(upstream)
        gradient = _reverse(block, x, upstream)
        total = tf.reduce_sum(gradient * tangent)
    return outer.gradient(total, upstream)


@pytest.mark.parametrize("name", BLOCKS)
def test_a_recomputed_block_at_nan_and_inf_has_the_gradients_derivative(name):
    """x holding NaN, inf and -inf: the gradient is the block's gradient at x, and J·v its transpose (TensorFlow's
    autodiff of the gradient as a linear map of the upstream), NaN and inf where those are, in a tf.function."""
    block = _block(name)
    x, tangent, upstream = _data(name)
    x = tf.constant(np.concatenate([[np.nan, np.inf, -np.inf], x.numpy().reshape(-1)[3:]]).reshape(x.shape))
    checkpointed = _recomputed(block)
    np.testing.assert_allclose(_in_mode("tf.function", _reverse, checkpointed, x, upstream),
                               _reverse(block, x, upstream), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_in_mode("tf.function", _forward, checkpointed, x, tangent),
                               _transposed_gradient(block, x, tangent, upstream), rtol=1e-10, atol=1e-12)


def _max_pool(x):
    return tf.nn.max_pool2d(x, 2, 2, "VALID")


def test_a_float64_max_pool_under_xla_raises_as_tensorflow_does():
    """J·v of MaxPoolGrad is MaxPoolGradGrad, which XLA implements for float32 and not float64. TensorFlow's own
    forward mode of the block raises there, and so does the decorator, in both modes, naming the op (a limit in
    reverse mode, where the block's own gradient compiles: tf.custom_gradient gives it); float32 is exact."""
    rng = np.random.default_rng(0)
    x, tangent, upstream = (tf.constant(rng.standard_normal(shape)) for shape in ((1, 4, 4, 2),) * 2 + ((1, 2, 2, 2),))
    with pytest.raises(tf.errors.InvalidArgumentError, match="MaxPoolGradGrad"):
        _in_mode("xla", _forward, _max_pool, x, tangent)
    for way, direction in ((_reverse, upstream), (_forward, tangent)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="MaxPoolGradGrad"):
            _in_mode("xla", way, _recomputed(_max_pool), x, direction)
    x, tangent, upstream = (tf.cast(t, tf.float32) for t in (x, tangent, upstream))
    for way, direction in ((_reverse, upstream), (_forward, tangent)):
        np.testing.assert_allclose(_in_mode("xla", way, _recomputed(_max_pool), x, direction),
                                   way(_max_pool, x, direction), rtol=1e-6)


def test_a_gradient_op_with_the_upstream_in_a_saved_input_is_not_linear():
    """MaxPoolGrad is linear in its gradient input alone: a grad_fn that also makes the pooled input from the
    upstream (which routes the gradient by the upstream's own values) is refused naming the op; it was taken for
    linear in every input, as a reshape is."""
    x = tf.constant(np.arange(16.0).reshape(1, 4, 4, 1))

    @sgm.custom_gradient
    def routed_by_the_upstream(x):
        y = tf.nn.max_pool2d(x, 2, 2, "VALID")

        def grad_fn(upstream):
            spread = tf.repeat(tf.repeat(upstream, 2, axis=1), 2, axis=2)  # linear in the upstream
            return tf.raw_ops.MaxPoolGrad(orig_input=spread, orig_output=y, grad=upstream, ksize=[1, 2, 2, 1],
                                          strides=[1, 2, 2, 1], padding="VALID")

        return y, grad_fn

    with pytest.raises(ValueError, match="MaxPoolGrad"):
        _reverse(routed_by_the_upstream, x, tf.ones([1, 2, 2, 1], tf.float64))


_UNDIFFERENTIATED = {  # a layer whose gradient op TensorFlow cannot differentiate, and that op
    "softsign": (lambda dtype: LAYERS.Activation("softsign", dtype=dtype), (3, 6), "SoftsignGrad"),
    "bilinear upsampling": (lambda dtype: LAYERS.UpSampling2D(interpolation="bilinear", dtype=dtype), (1, 3, 3, 2),
                            "ResizeBilinearGrad"),
}
_UNDIFFERENTIATED_MODES = ["eager", "tf.function", "xla", "TF1 tf.gradients"]


def _tf1_gradient(fn, x, upstream):
    with tf.Graph().as_default():
        placed = tf.constant(x.numpy()), tf.constant(upstream.numpy())
        gradient = tf.gradients(fn(placed[0]), placed[0], grad_ys=placed[1])[0]
        with tf.compat.v1.Session() as session:
            return session.run(gradient)


def _recomputed_with_weights(block, decorator):
    """grad_fn as tf.recompute_grad writes it: the recomputed block's gradient for x and for its weights."""

    @decorator
    def checkpointed(x):
        def grad_fn(upstream, variables=None):
            with tf.GradientTape() as tape:
                tape.watch(x)
                again = block(x)
            gradients = tape.gradient(again, [x, *variables], output_gradients=upstream)
            return gradients[0], gradients[1:]

        return block(x), grad_fn

    return checkpointed


@pytest.mark.parametrize("mode", _UNDIFFERENTIATED_MODES)
@pytest.mark.parametrize("name", _UNDIFFERENTIATED)
def test_a_gradient_op_tensorflow_cannot_differentiate_gives_tf_custom_gradients_reverse_mode(name, mode):
    """TensorFlow registers no gradient of SoftsignGrad nor of ResizeBilinearGrad, and J·v is the gradient op's
    own derivative, so forward mode cannot be formed. Reverse mode is tf.custom_gradient's, grad_fn(upstream), bit
    for bit, and the block's gradient; forward mode raises naming the op, where tf.custom_gradient's raises a
    LookupError or gives no tangent (as TensorFlow's own forward mode of ResizeBilinear does). Under XLA in
    float32: XLA's float64 ResizeBilinearGrad is wrong in the block's own autodiff (by 21 here, against eager)."""
    make, shape, op = _UNDIFFERENTIATED[name]
    dtype = tf.float32 if mode == "xla" else tf.float64
    layer = make(dtype.name)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape), dtype)
    upstream = tf.constant(rng.standard_normal(layer(x).shape), dtype)
    ours, theirs = _recomputed(layer), _recomputed(layer, tf.custom_gradient)
    if mode == "TF1 tf.gradients":
        got, anchor = _tf1_gradient(ours, x, upstream), _tf1_gradient(theirs, x, upstream)
    else:
        got, anchor = (np.asarray(_in_mode(mode, _reverse, fn, x, upstream)) for fn in (ours, theirs))
    np.testing.assert_array_equal(got.view(np.uint8), anchor.view(np.uint8))
    np.testing.assert_allclose(got, _reverse(layer, x, upstream), rtol=1e-12, atol=1e-6 if mode == "xla" else 0)
    if mode != "TF1 tf.gradients":
        with pytest.raises(ValueError, match=f"Forward mode .*{op}"):
            _in_mode(mode, _forward, ours, x, x)
        try:  # the anchor's forward mode: a LookupError ("no entry for" the op), or no tangent at all
            tangent = _in_mode(mode, _forward, theirs, x, x)
        except Exception as error:  # a LookupError, inside a StagingError while tracing
            assert op in str(error)
        else:  # TensorFlow's own forward mode of ResizeBilinear gives none either, silently
            assert tangent is None or not np.any(tangent)


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_with_weights_that_tensorflow_cannot_transpose_gives_their_gradients_too(mode):
    """A dense layer then softsign, grad_fn returning the weights' gradients (``variables``): the weights'
    gradients and x's are tf.custom_gradient's, bit for bit."""
    dense = LAYERS.Dense(4, dtype="float64")
    block = lambda x: tf.nn.softsign(dense(x))  # noqa: E731
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((5, 3)))
    upstream = tf.constant(rng.standard_normal((5, 4)))
    block(x)

    def gradients(decorator):
        fn = _recomputed_with_weights(block, decorator)

        def taken(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            return tape.gradient(y, [x, *dense.trainable_variables], output_gradients=upstream)

        return (taken if mode == "eager" else tf.function(taken, jit_compile=mode == "xla"))(x, upstream)

    for got, anchor in zip(gradients(sgm.custom_gradient), gradients(tf.custom_gradient), strict=True):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(anchor).view(np.uint8))


def test_at_order_2_a_gradient_op_tensorflow_cannot_differentiate_is_refused_naming_it():
    """At order=2 the second derivative is J's own derivative, which needs J·v as well: refused, naming the op."""
    layer = LAYERS.Activation("softsign", dtype="float64")

    @sgm.custom_gradient(order=2)
    def checkpointed(x):
        def grad_fn(upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                again = layer(x)
            return tape.gradient(again, x, output_gradients=upstream)

        return layer(x), grad_fn

    with pytest.raises(ValueError, match="SoftsignGrad"):
        _reverse(checkpointed, tf.ones((3, 6), tf.float64), tf.ones((3, 6), tf.float64))

