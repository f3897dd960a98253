"""Which layouts a gx shape selects, and the errors for shapes that fit none."""

import pytest
import tensorflow as tf

from stopgrad_math.tensorflow.gradient_layout import Layout, candidates

S = tf.TensorShape
T = lambda shape: None if shape is None else tuple(shape)  # noqa: E731  the static shape as candidates takes it
J, E, C, U = Layout.JACOBIAN, Layout.ELEMENTWISE, Layout.SCALAR, Layout.SUM


@pytest.mark.parametrize(
    "fx, x, gx, layout",
    [
        ([3], [3], [3, 3], J),
        ([2, 3], [4], [2, 3, 4], J),
        ([], [5], [5], J),  # a scalar's Jacobian is its gradient
        ([4], [], [4], J),  # a scalar x: the same as elementwise
        ([3], [3], [3], E),
        ([3], [3], [], E),  # one derivative for every element
        ([3, 4], [3, 1], [3, 4], E),  # a per-row parameter
        ([2, 3], [2, 3], [3], E),
        ([0], [0], [0], E),
        ([1, 1], [3], [3], C),
        ([], [2], [], C),  # tfp's stack([a, b]) case: a scalar gx broadcast to x
        ([], [2, 3], [], C),  # a Python float for a matrix: tfp crashes here
        ([1], [2, 3], [1, 3], C),
        ([2], [3], [3], U),
        ([4], [], [], U),  # tfp's rule: the gradient of the sum is gx
        ([2], [3], [], U),  # ... broadcast to x
        ([2], [2, 3], [3], U),
    ],
)
def test_fully_known_shapes_select_the_first_layout_that_fits(fx, x, gx, layout):
    choice = candidates("x", T(fx), T(x), T(gx))
    assert choice.layouts == (layout,) and choice.static


@pytest.mark.parametrize(
    "fx, x, gx, layouts",
    [
        ([None], [None], [None], [E, C, U]),  # batch dimensions of None: decided at run time
        ([None, 3], [3], [None, 3], [E]),
        ([], [None], [None], [J, C, U]),
        ([2], [3], [None], [U]),
        (None, [3], [3], [J, E, C, U]),
        (None, None, None, [J, E, C, U]),
    ],
)
def test_unknown_dimensions_keep_every_layout_that_may_fit(fx, x, gx, layouts):
    choice = candidates("x", T(fx), T(x), T(gx))
    assert choice.layouts == tuple(layouts) and not choice.static  # one candidate too: XLA drops run-time asserts


@pytest.mark.parametrize(
    "fx, x, gx",
    [([2, 3], [5], [4]), ([], [2], [3]), ([3], [3], [2, 3]), ([2], [2], [3]), ([None, 2], [3], [4])],
)
def test_a_shape_that_fits_nothing_names_every_shape(fx, x, gx):
    with pytest.raises(ValueError) as error:
        candidates("x[w]", T(fx), T(x), T(gx))
    message = str(error.value)
    for shape in (fx, x, gx):
        assert str(S(shape)) in message
    assert message.startswith("The gradient for x[w] fits no layout")
    assert "broadcast to x[w]'s shape" in message
    if S(fx).is_fully_defined():
        assert str(S(fx).concatenate(S(x))) in message
