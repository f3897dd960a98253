"""The decorator embeds grad_fn only where its ops prove the route: programs tf.custom_gradient runs, side by side.

Each case was a silent wrong gradient or a loud failure before the op table (stopgrad_math.tensorflow.linear_ops):
now it gives tf.custom_gradient's numbers, or a ValueError naming the op, the same in eager, tf.function, XLA and TF1.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, in_mode, jvp, vjp

from stopgrad_math import custom_gradient

X = tf.constant([0.3, -0.4, 2.0])
UPSTREAM = tf.constant([1.0, -2.0, 0.5])


def _times_3(grad_fn):
    return lambda x: (3.0 * x, grad_fn)


def _tf1_gradient(fn, x, upstream):
    with tf.Graph().as_default():
        x_graph = tf.constant(x.numpy())
        (gradient,) = tf.gradients(fn(x_graph), x_graph, grad_ys=tf.constant(upstream.numpy()))
        with tf.compat.v1.Session() as session:
            return session.run(gradient)


def _side_by_side(f, mode):
    """The gradient at X for UPSTREAM of f decorated by the library and by tf.custom_gradient, in one mode."""
    def gradient(embedded):
        if mode == "tf1":
            return _tf1_gradient(embedded, X, UPSTREAM)
        return in_mode(lambda x: vjp(embedded, x, UPSTREAM), mode)(X)

    return gradient(custom_gradient(f)), gradient(tf.custom_gradient(f))


NONLINEAR = {
    "clip_by_norm": (lambda dy: tf.clip_by_norm(dy, 0.1), "Maximum|Sqrt|Select"),
    "normalize": (lambda dy: dy / tf.norm(dy), "RealDiv|Sqrt"),
    "relu": (lambda dy: 2 * tf.nn.relu(dy), "Relu"),
    "clip_by_value": (lambda dy: tf.clip_by_value(dy, -0.5, 0.5), "Minimum|Maximum|ClipByValue"),
    "affine": (lambda dy: 2 * dy + 1, "AddV2"),
}


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
@pytest.mark.parametrize("case", NONLINEAR)
def test_non_linear_grad_fns_are_refused_naming_the_op_in_every_mode(case, mode):
    grad_fn, ops = NONLINEAR[case]
    embedded = custom_gradient(_times_3(grad_fn))
    with pytest.raises(ValueError, match=rf"({ops}) \(it "):
        if mode == "tf1":
            _tf1_gradient(embedded, X, UPSTREAM)
        else:
            in_mode(lambda x: vjp(embedded, x, UPSTREAM), mode)(X)


def test_a_non_linear_grad_fn_is_refused_for_a_y_of_one_element_too():
    embedded = custom_gradient(lambda x: (tf.reduce_sum(x), lambda dy: tf.clip_by_norm(dy, 0.1) * tf.ones([3])))
    with pytest.raises(ValueError, match="Maximum"):  # grad_fn(1) would give 0.1 for any upstream
        vjp(embedded, X)


inner_stop = tf.function(lambda a: tf.stop_gradient(a))
STOPS_INSIDE = {
    "tf.cond": lambda dy: dy + tf.cond(tf.constant(True), lambda: tf.stop_gradient(dy), lambda: dy),
    "nested tf.function": lambda dy: dy + inner_stop(dy),
}


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
@pytest.mark.parametrize("case", STOPS_INSIDE)
def test_a_stop_inside_control_flow_or_a_nested_function_gives_tf_custom_gradients_numbers(case, mode):
    got, want = _side_by_side(_times_3(STOPS_INSIDE[case]), mode)
    np.testing.assert_array_equal(got, 2 * UPSTREAM)  # was 1× under tf.function: the stop was not seen
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", STOPS_INSIDE)
def test_a_stop_inside_control_flow_gives_reverse_mode_alone_for_a_larger_y(case, mode):
    """y of 17 elements, past unit upstreams: reverse mode is grad_fn(upstream), tf.custom_gradient's; forward
    mode, whose transpose the stop hides, raises naming it."""
    x, upstream = tf.range(17, dtype=tf.float32), tf.range(17, dtype=tf.float32) - 8.0
    ours, theirs = (in_mode(lambda x, d=d: vjp(d(_times_3(STOPS_INSIDE[case])), x, upstream), mode)(x)
                    for d in (custom_gradient, tf.custom_gradient))
    np.testing.assert_array_equal(ours, 2 * upstream)
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(ValueError, match=r"Forward mode .*StopGradient"):
        in_mode(lambda x: jvp(custom_gradient(_times_3(STOPS_INSIDE[case])), x, upstream), mode)(x)


WEIGHTS = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]]  # per replica: the sum of both is the truth


def _all_reduced(decorator):
    @decorator
    def summed(x):
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", x), lambda dy: context.all_reduce("sum", dy)

    return summed


def _replica_loss(summed, x):
    context = tf.distribute.get_replica_context()
    return tf.reduce_sum(tf.constant(WEIGHTS)[context.replica_id_in_sync_group] * summed(x))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_collective_in_grad_fn_under_mirrored_strategy_as_tfps_sharded_log_prob_parts(mode):
    """f = all_reduce(x) across replicas with grad_fn = all_reduce(dy): each replica's gradient is the sum of every
    replica's weights (TFP's LogProbPartsTest gave each replica's own, silently, under tf.function)."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def run(decorator):
        summed = _all_reduced(decorator)

        def replica(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = _replica_loss(summed, x)
            return tape.gradient(loss, x)

        x = tf.ones([3])  # an input of the function: a tensor made inside it would lack a device to reduce to
        call = in_mode(lambda: strategy.run(replica, (x,)), mode)
        return [v.numpy() for v in strategy.experimental_local_results(call())]

    got = run(custom_gradient)
    for replica in got:
        np.testing.assert_array_equal(replica, [11.0, 22.0, 33.0])
    np.testing.assert_array_equal(got, run(tf.custom_gradient))


def test_a_collective_in_grad_fn_with_a_stop_on_its_upstream_is_refused_in_an_eager_replica_context():
    """Eagerly, a grad_fn holding an all-reduce cannot be traced (merge_call refuses a nested graph), so its
    transpose is tested numerically: the transpose of the transpose must be grad_fn. Here a stopped term of the
    upstream is invisible to the tape; taken for the transpose, each replica's gradient would be the all-reduced
    weights alone, [11, 22, 33], where grad_fn says [12, 24, 36] and [21, 42, 63]."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    @custom_gradient
    def summed(x):
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", x) + x, lambda dy: context.all_reduce("sum", dy) + tf.stop_gradient(dy)

    def replica(x):
        return vjp(lambda v: _replica_loss(summed, v), x)

    with pytest.raises(ValueError, match="transpose of its transpose"):
        strategy.run(replica, (tf.ones([3]),))


def test_a_collective_in_grad_fn_under_mirrored_strategy_does_not_compile_with_xla():
    """TensorFlow's limit, not the library's: XLA compiles neither decorator's replica all-reduce here."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for decorator in (custom_gradient, tf.custom_gradient):
        summed = _all_reduced(decorator)
        replica = tf.function(lambda x: vjp(lambda v: _replica_loss(summed, v), x), jit_compile=True)  # noqa: B023
        x = tf.ones([3])
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
            tf.function(lambda: strategy.run(replica, (x,)))()  # noqa: B023


def test_a_collective_in_grad_fn_under_mirrored_strategy_in_a_tf1_graph():
    """A TF1 graph builds the all-reduce from a sum on one device, in a custom gradient: taken for the
    collective it is (it gave each replica twice its own weights, from unit upstreams). tf.custom_gradient
    cannot run this program at all."""
    def run(decorator):
        with tf.Graph().as_default():
            strategy = tf.compat.v1.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
            summed = _all_reduced(decorator)
            replica = lambda x: tf.gradients(_replica_loss(summed, x), x)[0]  # noqa: E731
            with strategy.scope():
                gradients = strategy.experimental_local_results(strategy.run(replica, (tf.ones([3]),)))
            with tf.compat.v1.Session() as session:
                return session.run(gradients)

    for replica in run(custom_gradient):
        np.testing.assert_array_equal(replica, [11.0, 22.0, 33.0])
    with pytest.raises(ValueError, match="destinations can not be empty"):
        run(tf.custom_gradient)


@custom_gradient
def squared(b):  # f's own autodiff gives b, half the derivative: only grad_fn's is right
    return b * tf.stop_gradient(b), lambda dy: dy * 2 * b


def _with_a_tape(b):
    with tf.GradientTape() as tape:
        tape.watch(b)
        v = squared(b)
    return tape.gradient(v, b)


def _differentiates_inside(derivative):
    def f(x):
        def grad(dy):  # as TFP's Student-t CDF differentiates betainc inside its own gradient
            return dy * derivative(x * 1.0)

        return x * x, grad

    return f


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
def test_a_grad_fn_that_differentiates_a_decorated_function_with_its_own_tape(mode):
    got, want = _side_by_side(_differentiates_inside(_with_a_tape), mode)
    np.testing.assert_allclose(got, 2 * X * UPSTREAM, rtol=1e-6)  # d/dx x² = 2x
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["function", "xla", "tf1"])
def test_a_grad_fn_that_differentiates_a_decorated_function_with_tf_gradients(mode):
    """No tape watches b: in a graph the nested call is embedded all the same (it was f alone, and
    tf.gradients then differentiated f's own ops)."""
    got, want = _side_by_side(_differentiates_inside(lambda b: tf.gradients(squared(b), b)[0]), mode)
    np.testing.assert_allclose(got, 2 * X * UPSTREAM, rtol=1e-6)
    np.testing.assert_array_equal(got, want)


def test_an_untraceable_grad_fn_that_differentiates_with_its_own_tape():
    """Eager mode, where grad_fn reads a value in Python and cannot be traced: the numerical fallback must not
    pause the tapes grad_fn makes itself."""
    def untraceable(b):
        assert bool(tf.reduce_all(tf.math.is_finite(b)))  # a Python bool: fails while tracing
        return _with_a_tape(b)

    got, want = _side_by_side(_differentiates_inside(untraceable), "eager")
    np.testing.assert_allclose(got, 2 * X * UPSTREAM, rtol=1e-6)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", [*MODES, "tf1"])
@pytest.mark.parametrize("y_size", [1, 3])
def test_a_gradient_of_another_float_dtype_is_cast_to_the_arguments(mode, y_size):
    """Keras float8's bfloat16 gradient for a float32 argument."""
    embedded = custom_gradient(lambda x: (3.0 * x[:y_size], lambda dy: tf.pad(tf.cast(3.0 * dy, tf.bfloat16),
                                                                              [[0, 3 - y_size]])))
    if mode == "tf1":
        got = _tf1_gradient(embedded, X, UPSTREAM[:y_size])
    else:
        got = in_mode(lambda x: vjp(embedded, x, UPSTREAM[:y_size]), mode)(X).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[:y_size], 3.0 * UPSTREAM[:y_size])


DECORATOR_EXAMPLE = textwrap.dedent('''
    import tensorflow as tf
    import stopgrad_math as sgm

    @sgm.custom_gradient
    def log1pexp(x):
        e = tf.exp(x)
        def grad(upstream):
            return upstream * (1 - 1 / (1 + e))
        return tf.math.log(1 + e), grad

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = log1pexp(x)
        return tape.gradient(y, x)

    print(step(tf.constant([-1.0, 0.0, 2.0])).numpy())
''')


def test_the_documented_decorator_example_under_tf_function_draws_no_autograph_warning(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(DECORATOR_EXAMPLE)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert "AutoGraph" not in result.stderr and "Please report this" not in result.stderr, result.stderr
    np.testing.assert_allclose(np.array(result.stdout.strip(" []\n").split(), float),
                               tf.math.sigmoid([-1.0, 0.0, 2.0]), rtol=1e-6)


def _untraceable_with_an_infinite_derivative(x):
    """J = diag(1, inf, 2, ...): grad_fn reads a value in Python (no trace), so only the numerical fallback is
    left, and its dot-product test meets the inf."""
    slope = tf.concat([[1.0, np.inf], tf.fill([tf.size(x) - 2], 2.0)], 0)

    def grad_fn(dy):
        assert bool(tf.reduce_all(tf.math.is_finite(dy)))  # a Python bool: fails while tracing
        return dy * slope

    return x, grad_fn


def test_an_infinite_transpose_is_not_trusted_unit_upstreams_give_nan_at_that_element():
    """The dot-product test cannot judge an infinite transpose (it used to pass it): for a small y, J is built
    from grad_fn on unit upstreams, which gives tf.custom_gradient's gradient where it is finite, and NaN at the
    infinite element (the documented limit: inf times the zeros of J beside it)."""
    x, upstream = tf.constant([0.5, 1.0, -2.0]), tf.constant([1.0, 2.0, -1.0])
    got = vjp(custom_gradient(_untraceable_with_an_infinite_derivative), x, upstream)
    want = vjp(tf.custom_gradient(_untraceable_with_an_infinite_derivative), x, upstream)
    np.testing.assert_array_equal(want, [1.0, np.inf, -2.0])
    np.testing.assert_array_equal(got, [1.0, np.nan, -2.0])


def test_an_infinite_transpose_of_a_larger_y_is_refused_saying_why():
    x = tf.range(17, dtype=tf.float32)
    with pytest.raises(ValueError, match="not finite at the sample"):
        vjp(custom_gradient(_untraceable_with_an_infinite_derivative), x)
