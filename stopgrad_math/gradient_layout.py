"""How the shape of ``gx`` says which derivative it holds.

For an output ``fx`` and an argument ``x``, a ``gx`` is read by the first of
these layouts that its shape fits:

  JACOBIAN     gx.shape == fx.shape + x.shape: the full Jacobian,
               d fx[i] / d x[j] = gx[i, j].
  ELEMENTWISE  broadcast(gx.shape, x.shape) == fx.shape: a diagonal Jacobian
               with broadcasting, d fx[i] / d x[i] = gx[i], summed over the
               axes along which x is broadcast.
  SCALAR       fx has one element and gx.shape == x.shape: d fx / d x = gx.
  SUM          gx.shape == x.shape: tfp's rule, the gradient of
               reduce_sum(fx) is gx (each element of fx gets gx / size(fx)).

A gx that fits none of them is an error. Shapes are compared while tracing;
where dimensions are unknown then, the first layout the known dimensions allow
is taken and a check is added to the graph that fails with the same message if
the run-time shapes do not fit it.
"""

from __future__ import annotations

import enum

import tensorflow as tf


class Layout(enum.Enum):
    JACOBIAN = "the full Jacobian: gx.shape == fx.shape + x.shape"
    ELEMENTWISE = "elementwise: broadcast(gx.shape, x.shape) == fx.shape"
    SCALAR = "a gradient of a one-element fx: gx.shape == x.shape"
    SUM = "tfp's rule, the gradient of reduce_sum(fx): gx.shape == x.shape"


def _broadcast(a: tf.TensorShape, b: tf.TensorShape) -> tf.TensorShape | None:
    try:
        return tf.broadcast_static_shape(a, b)
    except ValueError:
        return None


def _one_element_possible(shape: tf.TensorShape) -> bool:
    return all(d is None or d == 1 for d in shape.as_list())


def fits_elementwise(fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> bool:
    """Whether broadcast(gx.shape, x.shape) can be fx.shape."""
    product = _broadcast(gx, x)
    return product is not None and product.is_compatible_with(fx)


def broadcasts_to(shape: tf.TensorShape, target: tf.TensorShape) -> bool:
    """Whether a tensor of ``shape`` can broadcast to exactly ``target``."""
    return fits_elementwise(target, target, shape)


def _fits(layout: Layout, fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> bool:
    if layout is Layout.JACOBIAN:
        return gx.is_compatible_with(fx.concatenate(x))
    if layout is Layout.ELEMENTWISE:
        return fits_elementwise(fx, x, gx)
    if layout is Layout.SCALAR:
        return _one_element_possible(fx) and gx.is_compatible_with(x)
    return gx.is_compatible_with(x)


def _describe(name: str, fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> str:
    return (
        f"fx has shape {fx}, {name} has shape {x} and its gradient has shape {gx}. "
        f"A gradient must be the full Jacobian (shape {fx.concatenate(x)}), broadcast with "
        f"{name} to fx's shape (elementwise), or have {name}'s shape."
    )


def choose(name: str, fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> Layout:
    """Returns the first layout that the static shapes fit, else raises ValueError."""
    for shape, what in ((fx, "fx"), (x, name), (gx, f"the gradient for {name}")):
        if shape.rank is None:
            raise ValueError(f"custom_gradient needs a known rank for {what}; got shape {shape}.")
    for layout in Layout:
        if _fits(layout, fx, x, gx):
            return layout
    raise ValueError(f"The gradient for {name} fits no layout. {_describe(name, fx, x, gx)}")


def _runtime_fit(layout: Layout, fx: tf.Tensor, x: tf.Tensor, gx: tf.Tensor) -> tf.Tensor:
    fx_shape, x_shape, gx_shape = tf.shape(fx), tf.shape(x), tf.shape(gx)
    if layout is Layout.JACOBIAN:
        return tf.reduce_all(tf.equal(gx_shape, tf.concat([fx_shape, x_shape], 0)))
    if layout is Layout.ELEMENTWISE:
        return tf.reduce_all(tf.equal(tf.broadcast_dynamic_shape(gx_shape, x_shape), fx_shape))
    same = tf.reduce_all(tf.equal(gx_shape, x_shape))
    if layout is Layout.SCALAR:
        return tf.logical_and(tf.equal(tf.size(fx), 1), same)
    return same


def checked(layout: Layout, name: str, fx: tf.Tensor, x: tf.Tensor, gx: tf.Tensor) -> tf.Tensor:
    """Returns gx, behind a run-time shape check only where static shapes are partial."""
    if all(t.shape.is_fully_defined() for t in (fx, x, gx)):
        return gx
    message = (
        f"custom_gradient took the gradient for {name} as {layout.value} from the shapes "
        f"known while tracing (fx {fx.shape}, {name} {x.shape}, gradient {gx.shape}), "
        "but the run-time shapes do not fit it."
    )
    check = tf.debugging.Assert(_runtime_fit(layout, fx, x, gx), [message, tf.shape(fx), tf.shape(x), tf.shape(gx)])
    with tf.control_dependencies([check]):
        return tf.identity(gx)


def contract(layout: Layout, zero_term: tf.Tensor, fx: tf.Tensor, x_rank: int) -> tf.Tensor:
    """Reduces an elementwise zero term (gx times the zero of x) to fx's layout."""
    if layout is Layout.ELEMENTWISE:
        return zero_term
    if layout is Layout.JACOBIAN:
        if x_rank == 0:
            return zero_term
        return tf.reduce_sum(zero_term, axis=list(range(-x_rank, 0)))
    total = tf.reduce_sum(zero_term)
    if layout is Layout.SCALAR:
        return total
    # tfp's rule spreads the sum over every element of fx; an empty fx has
    # no element to spread over and must not divide by zero.
    size = fx.shape.num_elements()
    size = tf.maximum(tf.size(fx), 1) if size is None else max(size, 1)
    return total / tf.cast(size, total.dtype)
