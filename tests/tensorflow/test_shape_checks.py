"""Shape checks: the run-time predicates against NumPy, the static ones against the run-time truth."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from stopgrad_math.tensorflow import shape_checks

SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
VECTOR = tf.TensorSpec([None], tf.int32)


def numpy_broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


@tf.function(input_signature=[VECTOR, VECTOR])
def run_time_predicates(a, b):
    (a_padded, b_padded), _ = shape_checks.left_padded(a, b)
    fits, product = shape_checks.broadcast_padded(a_padded, b_padded)
    return shape_checks.same_shape(a, b), fits, product, shape_checks.broadcasts_to(a, b)


@given(a=SHAPES, b=SHAPES)
def test_run_time_predicates_equal_numpy_for_any_ranks(a, b):
    same, fits, product, broadcasts_to = run_time_predicates(tf.constant(a, tf.int32), tf.constant(b, tf.int32))
    truth = numpy_broadcast(a, b)
    assert bool(same) == (a == b)
    assert bool(fits) == (truth is not None)
    if truth is not None:
        assert tuple(product.numpy()) == truth
    assert bool(broadcasts_to) == (truth == b)


@given(a=SHAPES, b=SHAPES, hide=st.lists(st.booleans(), min_size=8, max_size=8), unknown_rank=st.booleans())
def test_static_checks_bracket_the_run_time_truth(a, b, hide, unknown_rank):
    """must_broadcast_to implies the truth, the truth implies may_broadcast_to, for every hidden dimension."""
    truth = numpy_broadcast(a, b) == b
    a_static = tf.TensorShape(None if unknown_rank else [None if h else d for d, h in zip(a, hide, strict=False)])
    b_static = tf.TensorShape([None if h else d for d, h in zip(b, hide[4:], strict=False)])
    assert shape_checks.may_broadcast_to(tf.TensorShape(a), tf.TensorShape(b)) == truth  # fully known: exact
    assert shape_checks.must_broadcast_to(tf.TensorShape(a), tf.TensorShape(b)) == truth
    if shape_checks.must_broadcast_to(a_static, b_static):
        assert truth
    if truth:
        assert shape_checks.may_broadcast_to(a_static, b_static)


@pytest.mark.parametrize("mode", ["function", "xla"])
def test_reshaped_where_is_the_value_or_one_zero(mode):
    def choose(value, selected, shape):
        return shape_checks.reshaped_where(value, selected, shape)

    signature = [tf.TensorSpec(None), tf.TensorSpec([], tf.bool), VECTOR]
    chosen = tf.function(choose, input_signature=signature, jit_compile=(mode == "xla"))
    value = tf.reshape(tf.range(6.0), [2, 3])
    np.testing.assert_array_equal(chosen(value, True, tf.constant([3, 2])), np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(chosen(value, False, tf.constant([3, 2])), np.zeros([1, 1]))
    np.testing.assert_array_equal(chosen(tf.zeros([0]), False, tf.constant([4, 4, 4])), np.zeros([1, 1, 1]))


def test_reshaped_where_passes_the_gradient_only_where_selected():
    value = tf.constant([1.0, 2.0, 3.0])
    for selected, expected in ((True, [1.0, 2.0, 3.0]), (False, [0.0, 0.0, 0.0])):
        with tf.GradientTape() as tape:
            tape.watch(value)
            out = shape_checks.reshaped_where(value, tf.constant(selected), tf.constant([3]))
            loss = tf.reduce_sum(out * tf.constant([1.0, 2.0, 3.0])[: tf.size(out)])
        np.testing.assert_array_equal(tape.gradient(loss, value), expected)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_require_passes_the_value_bit_for_bit_or_fails(mode):
    def checked(value, fits):
        return shape_checks.require(fits, value, ["the value did not fit:", tf.shape(value)])

    signature = [tf.TensorSpec(None), tf.TensorSpec([], tf.bool)]
    run = checked if mode == "eager" else tf.function(checked, input_signature=signature, jit_compile=(mode == "xla"))
    for value in (tf.constant(-0.0), tf.constant([[np.nan, -0.0, np.inf]]), tf.zeros([0, 2])):
        out = run(value, tf.constant(True))
        assert out.shape == value.shape
        np.testing.assert_array_equal(out.numpy().view(np.uint32), value.numpy().view(np.uint32))
        with pytest.raises(tf.errors.InvalidArgumentError, match="did not fit" if mode != "xla" else "reshape"):
            run(value, tf.constant(False))


def test_broadcast_checked_decides_statically_where_it_can():
    def ops(fn, *specs):
        return {op.type for op in tf.function(fn).get_concrete_function(*specs).graph.get_operations()}

    def checked(v, t):
        return shape_checks.broadcast_checked(v, t, "mask", "x")

    assert "Assert" not in ops(checked, tf.TensorSpec([]), tf.TensorSpec(None))  # a scalar always broadcasts
    assert "Assert" not in ops(checked, tf.TensorSpec([1, 3]), tf.TensorSpec([None, 3]))
    assert "Assert" in ops(checked, tf.TensorSpec([None]), tf.TensorSpec([None]))
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not broadcast to x of shape \(None, 3\)"):
        ops(checked, tf.TensorSpec([2]), tf.TensorSpec([None, 3]))
