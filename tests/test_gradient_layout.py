"""Which layout a gx shape selects, and the errors for shapes that fit none."""

import pytest
import tensorflow as tf

from stopgrad_math.gradient_layout import Layout, choose

S = tf.TensorShape


@pytest.mark.parametrize(
    "fx, x, gx, layout",
    [
        ([3], [3], [3, 3], Layout.JACOBIAN),
        ([2, 3], [4], [2, 3, 4], Layout.JACOBIAN),
        ([], [5], [5], Layout.JACOBIAN),  # a scalar's Jacobian is its gradient
        ([4], [], [4], Layout.JACOBIAN),  # a scalar x: the same as elementwise
        ([3], [3], [3], Layout.ELEMENTWISE),
        ([3], [3], [], Layout.ELEMENTWISE),  # one derivative for every element
        ([3, 4], [3, 1], [3, 4], Layout.ELEMENTWISE),  # a per-row parameter
        ([2, 3], [2, 3], [3], Layout.ELEMENTWISE),
        ([0], [0], [0], Layout.ELEMENTWISE),
        ([1, 1], [3], [3], Layout.SCALAR),
        ([2], [3], [3], Layout.SUM),
        ([4], [], [], Layout.SUM),  # tfp's rule: the gradient of the sum is gx
        ([None], [None], [None], Layout.ELEMENTWISE),
        ([None, 3], [3], [None, 3], Layout.ELEMENTWISE),
        ([], [None], [None], Layout.JACOBIAN),
    ],
)
def test_layout_is_the_first_that_fits(fx, x, gx, layout):
    assert choose("x", S(fx), S(x), S(gx)) is layout


@pytest.mark.parametrize(
    "fx, x, gx",
    [([2, 3], [5], [4]), ([], [2], []), ([3], [3], [2, 3]), ([2], [2], [3])],
)
def test_a_shape_that_fits_nothing_names_every_shape(fx, x, gx):
    with pytest.raises(ValueError) as error:
        choose("x[w]", S(fx), S(x), S(gx))
    message = str(error.value)
    for shape in (fx, x, gx):
        assert str(S(shape)) in message
    assert "x[w]" in message and str(S(fx).concatenate(S(x))) in message


def test_unknown_rank_is_refused():
    with pytest.raises(ValueError, match="known rank for the gradient for x"):
        choose("x", S([3]), S([3]), S(None))
