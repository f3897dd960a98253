"""values_only(): the value alone, bit for bit, and every way of differentiating it refused."""

import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import bits

import stopgrad_math as sgm

X = tf.constant([-1.5, 0.0, 2.0, 100.0])


def _parts(x):
    e = tf.exp(x)
    return tf.math.log(1 + e), 1 - 1 / (1 + e)


@sgm.custom_gradient
def _decorated(x):
    value, gradient = _parts(x)
    return value, lambda dy: dy * gradient


def _ragged_output(x):
    @sgm.custom_gradient
    def f(x):
        return tf.RaggedTensor.from_row_lengths(2 * x, [1, 3]), lambda dy: 2 * dy.flat_values

    return f(x).flat_values


_SCALE = tf.constant(3.0)  # read while the lambda runs; a tensor made inside it would differ by mode

# Each function of the library whose value is one of its inputs, as a function of x.
FUNCTIONS = {
    "identity form": lambda x: sgm.custom_gradient(*_parts(x), x),
    "identity form, fx not connected to x": lambda x: sgm.custom_gradient(tf.stop_gradient(x * 2), 2.0, x),
    "decorator": _decorated,
    "decorator, ragged output": _ragged_output,
    "partial_custom_gradient": lambda x: sgm.partial_custom_gradient(lambda s: x * s, lambda s: s, x),
    "straight_through": lambda x: sgm.straight_through(tf.round(x), x),
    "stop_gradient_where": lambda x: sgm.stop_gradient_where(x, x > 0),
    "scale_gradient": lambda x: sgm.scale_gradient(x, _SCALE),
    "reverse_gradient": lambda x: sgm.reverse_gradient(x),
}


def _op_types(concrete) -> set[str]:
    """Every op type in a concrete function, the functions it calls included."""
    graph_def = concrete.graph.as_graph_def()
    nodes = [*graph_def.node, *(node for f in graph_def.library.function for node in f.node_def)]
    return {node.op for node in nodes}


def _traced(fn, jit_compile=False):
    """fn traced inside values_only() for a vector of unknown length, as a serving signature is."""
    with sgm.values_only():
        return tf.function(fn, jit_compile=jit_compile).get_concrete_function(tf.TensorSpec([None]))


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_value_is_the_value_outside_bit_for_bit(name, jit_compile):
    want = tf.function(FUNCTIONS[name], jit_compile=jit_compile)(X)  # traced alike: grappler rewrites log(1 + e)
    np.testing.assert_array_equal(bits(_traced(FUNCTIONS[name], jit_compile)(X)), bits(want))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_tape_outside_the_traced_function_is_refused(name):
    served = _traced(FUNCTIONS[name])
    # TensorFlow builds the function's backward as it is called under a tape: the call raises.
    with pytest.raises(LookupError, match="values_only"), tf.GradientTape() as tape:
        tape.watch(X)
        tape.gradient(served(X), X)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_forward_mode_outside_the_traced_function_is_refused(name):
    served = _traced(FUNCTIONS[name])
    with pytest.raises(LookupError, match="values_only"), tf.autodiff.ForwardAccumulator(X, tf.ones_like(X)) as acc:
        acc.jvp(served(X))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_tf_gradients_in_a_tf1_graph_is_refused(name):
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        with sgm.values_only():
            y = FUNCTIONS[name](x)
        with pytest.raises(LookupError, match="values_only"):
            tf.gradients(y, x)


@pytest.mark.parametrize("recorder", ["tape", "accumulator"])
def test_recording_while_tracing_inside_is_refused_at_once(recorder):
    def differentiated(x):
        if recorder == "tape":
            with tf.GradientTape() as tape:
                tape.watch(x)
                return tape.gradient(sgm.custom_gradient(*_parts(x), x), x)
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            return acc.jvp(sgm.custom_gradient(*_parts(x), x))

    with pytest.raises(RuntimeError, match="values_only"):
        _traced(differentiated)


def test_variables_get_no_gradient_from_either_form():
    variable = tf.Variable([1.0, 2.0])

    @sgm.custom_gradient
    def reads_variable(x):
        return x * variable, lambda dy, variables=None: (dy * variable, [dy * x])

    functions = [lambda x: reads_variable(x), lambda x: sgm.custom_gradient(variable * 2, 2.0, variable) + x]
    for fn in functions:
        served = _traced(fn)
        with pytest.raises(LookupError, match="values_only"), tf.GradientTape() as tape:
            tape.gradient(served(tf.constant([3.0, 4.0])), variable)


def test_eager_returns_the_value_and_refuses_any_recording():
    np.testing.assert_array_equal(bits(FUNCTIONS["identity form"](X)), bits(_parts(X)[0]))
    with tf.GradientTape(), pytest.raises(RuntimeError, match="cannot be entered"), sgm.values_only():
        pass
    with sgm.values_only():
        np.testing.assert_array_equal(bits(_decorated(X)), bits(_parts(X)[0]))
        for fn in FUNCTIONS.values():
            with tf.GradientTape() as tape, pytest.raises(RuntimeError, match="values_only"):
                tape.watch(X)
                fn(X)
            with tf.autodiff.ForwardAccumulator(X, X), pytest.raises(RuntimeError, match="values_only"):
                fn(X)


def test_no_gradient_machinery_is_traced():
    calls = []

    @sgm.custom_gradient
    def counted(x):
        def grad(dy):
            calls.append(1)
            return dy * 2.0

        return x * 2.0, grad

    traced = [_traced(FUNCTIONS["identity form"]), _traced(counted)]
    assert not calls
    for concrete in traced:
        types = _op_types(concrete)
        assert "PreventGradient" in types and not types & {"MulNoNan", "IsFinite", "Assert"}


def test_leaving_it_restores_the_custom_gradient():
    with sgm.values_only():
        pass
    with tf.GradientTape() as tape:
        tape.watch(X)
        y = FUNCTIONS["identity form"](X)
    np.testing.assert_allclose(tape.gradient(y, X), tf.math.sigmoid(X), rtol=1e-6)


def test_it_applies_to_the_thread_that_enters_it():
    seen = []
    traced = lambda: tf.function(FUNCTIONS["identity form"]).get_concrete_function(tf.TensorSpec([None]))  # noqa: E731
    with sgm.values_only():
        thread = threading.Thread(target=lambda: seen.append(traced()))
        thread.start()
        thread.join()
    types = _op_types(seen[0])
    assert "MulNoNan" in types and "PreventGradient" not in types


def test_a_saved_model_traced_inside_serves_values_and_refuses_gradients(tmp_path):
    module = tf.Module()
    module.serve = tf.function(FUNCTIONS["identity form"], input_signature=[tf.TensorSpec([None])])
    with sgm.values_only():
        module.serve.get_concrete_function()  # traced here, with no gradient machinery
        tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    loaded = tf.saved_model.load(str(tmp_path))
    want = bits(tf.function(FUNCTIONS["identity form"])(X))  # traced alike: grappler rewrites log(1 + e)
    np.testing.assert_array_equal(bits(loaded.serve(X)), want)
    served = loaded.signatures["serving_default"]
    np.testing.assert_array_equal(bits(next(iter(served(x=X).values()))), want)
    assert "PreventGradient" in _op_types(served) and "MulNoNan" not in _op_types(served)
    with pytest.raises(LookupError, match="values_only"), tf.GradientTape() as tape:
        tape.watch(X)
        tape.gradient(loaded.serve(X), X)
