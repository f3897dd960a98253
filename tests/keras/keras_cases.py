"""stopgrad_math.keras on the backend this process runs (KERAS_BACKEND), beside Keras's own ops.custom_gradient;
test_backends.py runs this file once per backend, each in its own process. Truths: the closed forms (sigmoid for
log1pexp's derivative), Keras's own answers where they are right, and ops.softplus's training."""

import functools
import pathlib

import numpy as np
import pytest

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

import stopgrad_math.keras as sgk  # noqa: E402

BACKEND = keras.backend.backend()
X = np.array([-3.0, 0.0, 5.0, 100.0], dtype=np.float32)
SIGMOID = 1.0 / (1.0 + np.exp(-X.astype(np.float64)))


def log1pexp_with(decorator):
    """Keras's own example (ops.custom_gradient's docstring, keras3's op_custom_gradient), decorated."""

    @decorator
    def log1pexp(x):
        e = ops.exp(x)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return ops.multiply(upstream, 1.0 - 1.0 / ops.add(1, e))

        return ops.log(1 + e), grad

    return log1pexp


def reverse(fn, x):
    """d sum(fn(x)) / dx with the backend's own reverse mode."""
    x = ops.convert_to_tensor(x)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(x)
            total = ops.sum(fn(x))
        return ops.convert_to_numpy(tape.gradient(total, x))
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.grad(lambda x: ops.sum(fn(x)))(x))
    x = x.detach().requires_grad_(True)
    ops.sum(fn(x)).backward()
    return x.grad.numpy()


def forward(fn, x):
    """The JVP of fn along ones with the backend's own forward mode (ForwardAccumulator, jax.jvp,
    torch.func.jvp)."""
    x = ops.convert_to_tensor(x)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            y = fn(x)
        return ops.convert_to_numpy(accumulator.jvp(y))
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.jvp(fn, (x,), (ops.ones_like(x),))[1])
    import torch

    return torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1].detach().numpy()


def keras_own_forward_mode():
    """What Keras's own ops.custom_gradient gives in forward mode: the numbers, or the error's name."""
    try:
        return forward(log1pexp_with(ops.custom_gradient), X)
    except Exception as error:  # measured, not assumed: the README's table is these outcomes
        return type(error).__name__


README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _outcome(derivative, decorator):
    """The derivative at x = 100 of the Keras example, decorated, by a mode: its number, or the error's name."""
    try:
        value = float(np.asarray(derivative(log1pexp_with(decorator), np.array([100.0], dtype=np.float32)))[0])
    except Exception as error:  # measured, not assumed: these outcomes are the README's table
        return f"`{type(error).__name__}`"
    return "NaN" if np.isnan(value) else repr(value)


def table_row():
    """This backend's row of the README's table, measured."""
    cells = [_outcome(mode, decorator) for decorator in (ops.custom_gradient, sgk.custom_gradient)
             for mode in (reverse, forward)]
    return f"| {BACKEND} | " + " | ".join(cells) + " |"


def test_the_readmes_table_row_is_what_this_backend_does():
    assert table_row() in README.read_text()


def test_the_keras_example_value_bit_for_bit_and_its_gradient():
    ours, theirs = log1pexp_with(sgk.custom_gradient), log1pexp_with(ops.custom_gradient)
    value = ops.convert_to_numpy(ours(ops.convert_to_tensor(X)))
    np.testing.assert_array_equal(value.view(np.uint32), ops.convert_to_numpy(theirs(X)).view(np.uint32))
    assert value[-1] == np.inf  # float32, as written: exp(100) overflows
    np.testing.assert_allclose(reverse(ours, X), SIGMOID, rtol=1e-6)
    assert reverse(ours, X)[-1] == 1.0


def test_forward_mode_is_exact_where_keras_own_is_not():
    np.testing.assert_allclose(forward(log1pexp_with(sgk.custom_gradient), X), SIGMOID, rtol=1e-6)
    expected = {"tensorflow": "nan", "jax": "TypeError", "torch": "RuntimeError"}[BACKEND]
    outcome = keras_own_forward_mode()
    assert (("nan" if np.isnan(outcome[-1]) else "right") if isinstance(outcome, np.ndarray) else outcome) == expected


def test_a_grad_with_upstream_by_keyword_alone_as_keras_torch_backend_calls_it():
    @sgk.custom_gradient
    def square(x):
        def grad(*args, upstream):
            assert args == ()  # the inputs are what f closes over
            return upstream * 2.0 * x

        return x * x, grad

    np.testing.assert_allclose(reverse(square, X[:3]), 2.0 * X[:3])
    np.testing.assert_allclose(forward(square, X[:3]), 2.0 * X[:3])


def test_the_identity_form():
    def log1pexp(x):
        return sgk.custom_gradient(ops.softplus(x), ops.sigmoid(x), x)

    np.testing.assert_array_equal(ops.convert_to_numpy(log1pexp(X)), ops.convert_to_numpy(ops.softplus(X)))
    np.testing.assert_allclose(reverse(log1pexp, X), SIGMOID, rtol=1e-6)
    np.testing.assert_allclose(forward(log1pexp, X), SIGMOID, rtol=1e-6)


@pytest.mark.parametrize("use_variable", [False, True])
def test_keras_own_custom_gradient_test_side_by_side(use_variable):
    """keras/src/ops/core_test.py's test_custom_gradient (Keras 3.15, in its wheel), for Keras's decorator and ours:
    the gradient at 100 is 1.0, the function called on a tensor, or inside a Layer on a non-trainable
    keras.Variable (where the layer's derivative is 1 w.r.t. its input)."""

    class Log1pexpLayer(keras.layers.Layer):
        def __init__(self, log1pexp):
            super().__init__()
            self.log1pexp = log1pexp
            self.v = keras.Variable(5.0, trainable=False)

        def call(self, inputs):
            return self.log1pexp(self.v) + inputs

    for decorator in (ops.custom_gradient, sgk.custom_gradient):
        log1pexp = log1pexp_with(decorator)
        to_derive = Log1pexpLayer(log1pexp) if use_variable else log1pexp
        assert reverse(to_derive, np.float32(100.0)) == 1.0


def test_a_keras_variable_passed_and_read():
    scale = keras.Variable(np.float32(3.0))

    @sgk.custom_gradient
    def scaled(x, s):
        return x * s, lambda upstream: (upstream * s, None)

    np.testing.assert_allclose(reverse(lambda x: scaled(x, scale), X[:3]), np.full(3, 3.0))
    np.testing.assert_allclose(forward(lambda x: scaled(x, scale) * scale, X[:3]), np.full(3, 9.0))


class GradientReversal(keras.layers.Layer):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def call(self, inputs):
        return sgk.reverse_gradient(inputs, self.scale)


def test_a_gradient_reversal_layer():
    layer = GradientReversal(0.5)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(X)), X)
    np.testing.assert_allclose(reverse(lambda x: layer(x) * 3.0, X), np.full(4, -1.5))
    np.testing.assert_allclose(forward(lambda x: layer(x) * 3.0, X), np.full(4, -1.5))


def _trained(activation, steps=5, policy="float32", jit_compile=False):
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8), keras.layers.Activation(activation),
                                  keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
        rng = np.random.default_rng(0)
        inputs, targets = rng.normal(size=(64, 2)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
        model.fit(inputs, targets, batch_size=16, epochs=steps, shuffle=False, verbose=0)
        return [np.asarray(ops.convert_to_numpy(w)) for w in model.weights], model.layers[1].compute_dtype
    finally:
        keras.mixed_precision.set_global_policy("float32")


@functools.cache
def _softplus_weights(jit_compile=False):
    """The weights ops.softplus trains to (the same function autodiffed): the truth of several tests, trained once
    (compiled, a model's training compiles in tens of seconds on torch's CPU)."""
    return _trained(ops.softplus, jit_compile=jit_compile)[0]


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_model_fit_with_a_custom_gradient_activation_reaches_the_same_weights(policy):
    """Against Keras's own decorator of the same example (right in reverse mode), and in float32 against
    ops.softplus, the same function autodiffed; in float16 the example's own formula rounds otherwise than
    softplus (1 + exp(x) loses x's digits), which is the formula's doing, not the decorator's."""
    ours, dtype = _trained(log1pexp_with(sgk.custom_gradient), policy=policy)
    keras_own, _ = _trained(log1pexp_with(ops.custom_gradient), policy=policy)
    assert dtype == ("float16" if policy == "mixed_float16" else "float32")
    truths = [keras_own] + ([_softplus_weights()] if policy == "float32" else [])
    half = policy == "mixed_float16"  # gradients in float16, whose rounding a compiler may place otherwise
    for truth in truths:
        for got, expected in zip(ours, truth, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-3 if half else 1e-5, atol=1e-4 if half else 1e-6)


@pytest.mark.parametrize("form", ["decorator", "identity"])
def test_model_fit_compiled_with_jit_compile_matches_the_uncompiled_run(form):
    """model.compile(jit_compile=True): XLA on TensorFlow, jax.jit on JAX, torch.compile on torch, which traces the
    namespace's lookup and the decorator's call; the weights are the uncompiled run's, and softplus's (the same
    function autodiffed), to a compiler's reordering of float32 sums."""
    activation = log1pexp_with(sgk.custom_gradient) if form == "decorator" else (
        lambda x: sgk.custom_gradient(ops.logaddexp(x, 0.0), ops.sigmoid(x), x))
    compiled, _ = _trained(activation, jit_compile=True)
    for truth in (_trained(activation)[0], _softplus_weights(jit_compile=True)):
        for got, expected in zip(compiled, truth, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def compiled_reverse(fn, x):
    """d sum(fn(x)) / dx under the backend's own compiler: XLA (tf.function(jit_compile=True)), jax.jit, and
    torch.compile(fullgraph=True), one graph with no break (the namespace's lookup and the decorator's call traced)."""
    x = ops.convert_to_tensor(x)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def gradient(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                total = ops.sum(fn(x))
            return tape.gradient(total, x)

        return ops.convert_to_numpy(gradient(x))
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.jit(jax.grad(lambda x: ops.sum(fn(x))))(x))
    import torch

    return torch.compile(torch.func.grad(lambda x: ops.sum(fn(x))), fullgraph=True)(x).numpy()


def _keras_ops_compile():
    """Whether Keras's own ops compile here (on torch, Keras before 3.6 or so flattens arguments with optree, which
    torch.compile(fullgraph=True) cannot trace)."""
    try:
        compiled_reverse(ops.softplus, X)
    except Exception:  # Dynamo's Unsupported, whatever its class in this torch
        return False
    return True


@pytest.mark.parametrize("form", ["decorator", "identity"])
def test_both_forms_under_the_backends_compiler(form):
    """Where Keras's own ops do not compile under fullgraph (a limit of that Keras), ours do not either, since they
    call Keras's ops: tested as that limit."""
    activation = log1pexp_with(sgk.custom_gradient) if form == "decorator" else (
        lambda x: sgk.custom_gradient(ops.logaddexp(x, 0.0), ops.sigmoid(x), x))
    if not _keras_ops_compile():
        assert tuple(int(p) for p in keras.__version__.split(".")[:2]) < (3, 15)  # 3.5's limit; 3.15's ops compile
        with pytest.raises(Exception):  # noqa: B017
            compiled_reverse(activation, X)
        return
    np.testing.assert_allclose(compiled_reverse(activation, X), SIGMOID, rtol=1e-6)


def test_the_helpers_run_on_the_backend():
    x = ops.convert_to_tensor(X)
    np.testing.assert_array_equal(ops.convert_to_numpy(sgk.stop_gradient(x)), X)
    assert np.all(reverse(lambda x: sgk.stop_gradient(x) * x, X) == X)
    np.testing.assert_array_equal(ops.convert_to_numpy(sgk.zero_with_gradient(x)), np.zeros(4))
    np.testing.assert_allclose(reverse(lambda x: sgk.scale_gradient(x, 2.0), X), np.full(4, 2.0))
    np.testing.assert_allclose(reverse(lambda x: sgk.straight_through(ops.round(x), x * 3.0), X), np.full(4, 3.0))
    np.testing.assert_allclose(reverse(lambda x: sgk.partial_custom_gradient(ops.softplus, ops.sigmoid, x), X),
                               SIGMOID, rtol=1e-6)


def test_the_checker_passes_a_right_gradient_and_fails_a_wrong_one():
    assert sgk.check_gradient(log1pexp_with(sgk.custom_gradient), X[:3]).passed

    @sgk.custom_gradient
    def wrong(x):
        return ops.softplus(x), lambda upstream: upstream * 1.1 * ops.sigmoid(x)

    assert not sgk.check_gradient(wrong, X[:3]).passed


NON_FINITE = np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32)


def test_a_non_finite_x_gets_the_declared_derivative_on_every_backend():
    """Issue 54: the rule reaches an element of x that is NaN or ±inf, in both forms and both modes, on each
    backend (its namespace's carrier; on torch it gave such an element no derivative)."""

    @sgk.custom_gradient
    def half(x):
        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return ops.multiply(upstream, 0.5)

        return ops.multiply(x, 1.0), grad

    def identity_form(x):
        return sgk.custom_gradient(ops.softplus(x), ops.sigmoid(x), x)

    want_half = np.full(4, 0.5)
    with np.errstate(over="ignore"):
        want_sigmoid = 1.0 / (1.0 + np.exp(-NON_FINITE.astype(np.float64)))  # NaN, 1 and 0 at the three
    for way in (reverse, forward):
        np.testing.assert_array_equal(way(half, NON_FINITE), want_half)
        np.testing.assert_allclose(way(identity_form, NON_FINITE), want_sigmoid, rtol=1e-6)


class HalvedWhenTraining(keras.layers.Layer):
    """A layer whose decorated ``call`` takes ``training``: its gradient is half the upstream in training, a
    quarter otherwise (issue 57: the decorated method's signature was (*args, **kwargs), and Keras, which passes
    ``training`` to a call that takes it, could not)."""

    @sgk.custom_gradient
    def call(self, x, training=None):
        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            return ops.multiply(upstream, 0.5 if training else 0.25)

        return ops.multiply(x, 1.0), grad


def test_a_layers_decorated_call_keeps_its_signature_and_binds_the_layer():
    """Keras reads the call's signature through the decorator, passes training, and the layer is bound, not an
    argument: the grad returns x's gradient alone, as with Keras's own ops.custom_gradient on a function."""
    import inspect

    layer = HalvedWhenTraining()
    assert list(inspect.signature(layer.call).parameters) == ["x", "training"]
    model = keras.Sequential([keras.Input((4,)), layer])
    x = X[None]
    np.testing.assert_array_equal(ops.convert_to_numpy(model(x, training=True)), x)
    np.testing.assert_array_equal(reverse(lambda x: layer(x, training=True), x), np.full_like(x, 0.5))
    np.testing.assert_array_equal(reverse(lambda x: layer(x, training=False), x), np.full_like(x, 0.25))


def test_implicit_functions_on_the_backend():
    """A square root as a root of z² − a (dz/da = 1 / 2z, d²z/da² = −1 / 4z³) and exponential draws through their
    CDF (dz/dλ = −z/λ), in the backend's reverse and forward mode; a keras.Variable as a parameter."""

    @sgk.custom_root(lambda z, a: z * z - a)
    def square_root(init, a):
        return ops.sqrt(a)

    a = np.array([4.0, 9.0, 0.25], dtype=np.float32)
    z = np.sqrt(a)
    np.testing.assert_allclose(reverse(lambda a: square_root(ops.zeros(3), a), a), 1 / (2 * z), rtol=1e-6)
    np.testing.assert_allclose(forward(lambda a: square_root(ops.zeros(3), a), a), 1 / (2 * z), rtol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(square_root(ops.zeros(3), keras.Variable(a))), z)
    draws = np.array([0.5, 2.0, 7.0], dtype=np.float32)
    cdf = lambda z, rate: 1 - ops.exp(-rate * z)  # noqa: E731
    rate = np.array([0.5, 2.0, 4.0], dtype=np.float32)
    np.testing.assert_allclose(reverse(lambda r: sgk.implicit_reparameterization(draws, cdf, r), rate),
                               -draws / rate, rtol=1e-6)
    np.testing.assert_allclose(forward(lambda r: sgk.implicit_reparameterization(draws, cdf, r), rate),
                               -draws / rate, rtol=1e-6)
