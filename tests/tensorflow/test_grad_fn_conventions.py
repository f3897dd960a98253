"""How grad_fn's answer is matched to f's arguments, and checked where shapes are known only at run time."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import MODES, in_mode

from stopgrad_math import custom_gradient

# ---------------------------------------------------------------- shapes known only at run time


@custom_gradient
def sum_with_short_gradient(x):
    """The bug of the issue: a [1] gradient for a [3] argument, which broadcasting would spread to [222]."""
    return tf.reduce_sum(x * x), lambda dy: tf.reshape(dy * 222.0, [1])


def gradient_of(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


@pytest.mark.parametrize("mode", ["function", "xla"])
def test_a_wrong_gradient_shape_under_unknown_shapes_fails_when_the_graph_runs(mode):
    traced = tf.function(lambda x: gradient_of(sum_with_short_gradient, x), input_signature=[tf.TensorSpec(None)],
                         jit_compile=(mode == "xla"))  # fmt: skip
    words = r"grad_fn returned a gradient of shape.*\[1\].*for args\[0\] of shape.*\[3\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=words if mode == "function" else "shape_check_failed"):
        traced(tf.constant([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(traced(tf.constant([2.0])), [222.0])  # a [1] argument: the gradient fits


def test_a_wrong_gradient_shape_known_while_tracing_names_the_argument_then():
    traced = tf.function(lambda x: gradient_of(sum_with_short_gradient, x))
    with pytest.raises(ValueError, match=r"shape \(1,\) for args\[0\] of shape \(3,\)"):
        traced.get_concrete_function(tf.TensorSpec([3]))


def test_the_run_time_check_adds_no_op_where_shapes_are_known():
    def ops(spec):
        graph = tf.function(lambda x: gradient_of(sum_with_short_gradient, x)).get_concrete_function(spec).graph
        return {op.type for op in graph.get_operations()}

    assert "Assert" not in ops(tf.TensorSpec([1]))
    assert "Assert" in ops(tf.TensorSpec([None]))


# ---------------------------------------------------------------- dicts and nested arguments


def make_dict_function(grad_fn_answer):
    @custom_gradient
    def weighted(params):
        a, b = params["a"], params["b"]

        def grad(dy):
            return grad_fn_answer(dy, a, b)

        return tf.reduce_sum(3.0 * a) + tf.reduce_sum(5.0 * b), grad

    return weighted


def dict_gradients(fn, a, b):
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        y = fn({"b": b, "a": a})
    return tape.gradient(y, [a, b])


A, B = tf.constant([1.0, 2.0]), tf.constant([[1.0, 2.0, 3.0]])
TRUTH = [np.full([2], 3.0), np.full([1, 3], 5.0)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "answer",
    [
        lambda dy, a, b: {"b": 5.0 * dy * tf.ones_like(b), "a": 3.0 * dy * tf.ones_like(a)},  # by key
        lambda dy, a, b: [{"a": 3.0 * dy * tf.ones_like(a), "b": 5.0 * dy * tf.ones_like(b)}],  # one per argument
        lambda dy, a, b: [3.0 * dy * tf.ones_like(a), 5.0 * dy * tf.ones_like(b)],  # flat, tf.nest's order: a, b
    ],
    ids=["dict", "list of a dict", "flat list in tf.nest order"],
)
def test_dict_arguments_match_by_key_or_in_tf_nest_order(answer, mode):
    grads = in_mode(lambda a, b: dict_gradients(make_dict_function(answer), a, b), mode)(A, B)
    for got, want in zip(grads, TRUTH, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_flat_list_in_another_order_is_caught_where_the_shapes_differ():
    swapped = make_dict_function(lambda dy, a, b: [5.0 * dy * tf.ones_like(b), 3.0 * dy * tf.ones_like(a)])
    with pytest.raises(ValueError, match=r"shape \(1, 3\) for args\[0/a\] of shape \(2,\)"):
        dict_gradients(swapped, A, B)


def test_the_wrong_number_of_gradients_says_how_a_flat_list_is_read():
    too_many = make_dict_function(lambda dy, a, b: [dy, dy, dy])
    with pytest.raises(ValueError, match=r"returned 3 gradients.*args\[0/a\].*tf.nest's order \(dict keys sorted\)"):
        dict_gradients(too_many, A, B)


def test_a_numpy_complex_gradient_for_a_real_argument_is_refused_not_cast():
    """TensorFlow would cast it to float32 with a dtype hint and drop the imaginary part."""

    @custom_gradient
    def f(x):
        return 2.0 * x, lambda dy: np.complex128(2 + 1j)

    with pytest.raises(ValueError, match=r"complex128 gradient for args\[0\], a float32"):
        gradient_of(f, tf.constant(1.0))
