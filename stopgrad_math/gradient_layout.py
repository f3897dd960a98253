"""How the shape of ``gx`` says which derivative it holds.

For an output ``fx`` and an argument ``x``, a ``gx`` is read by the first of
these layouts that its shape fits:

  JACOBIAN     gx.shape == fx.shape + x.shape: the full Jacobian,
               d fx[i] / d x[j] = gx[i, j].
  ELEMENTWISE  broadcast(gx.shape, x.shape) == fx.shape: a diagonal Jacobian
               with broadcasting, d fx[i] / d x[i] = gx[i], summed over the
               axes along which x is broadcast.
  SCALAR       fx has one element and gx broadcasts to x.shape:
               d fx / d x = gx, broadcast (a scalar gx: the same everywhere).
  SUM          gx broadcasts to x.shape: tfp's rule, the gradient of
               reduce_sum(fx) is gx (each element of fx gets gx / size(fx)).

A gx that fits none of them is an error. Static shapes decide where they are
fully known (no op is added). Where dimensions are unknown while tracing,
every layout the known dimensions allow is kept, and the graph takes the
first that the run-time shapes fit, by the same rules, so eager and graph
agree for the same shapes; a run-time misfit fails with the static words.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable

import tensorflow as tf

from stopgrad_math import identity, shape_checks

Shape = tuple[int | None, ...] | None
"""A static shape: a tuple, None for an unknown dimension, or None for an unknown rank."""


class Layout(enum.Enum):
    JACOBIAN = "the full Jacobian: gx.shape == fx.shape + x.shape"
    ELEMENTWISE = "elementwise: broadcast(gx.shape, x.shape) == fx.shape"
    SCALAR = "the gradient of a one-element fx: gx broadcasts to x.shape"
    SUM = "tfp's rule, the gradient of reduce_sum(fx): gx broadcasts to x.shape"


def _may_fit(layout: Layout, fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> bool:
    if layout is Layout.JACOBIAN:
        return bool(gx.is_compatible_with(fx.concatenate(x)))
    if layout is Layout.ELEMENTWISE:
        product = shape_checks.static_broadcast(gx, x)
        return product is not None and product.is_compatible_with(fx)
    if layout is Layout.SCALAR and not shape_checks.may_have_one_element(fx):
        return False
    return shape_checks.may_broadcast_to(gx, x)


_MUST_BE = (
    "A gradient must be the full Jacobian (shape fx.shape + {x}.shape{jacobian}), broadcast with {x} to fx's "
    "shape (elementwise), or broadcast to {x}'s shape (a one-element fx, or tfp's rule for the sum of fx)."
)


def _misfit(name: str, fx: tf.TensorShape, x: tf.TensorShape, gx: tf.TensorShape) -> str:
    jacobian = f" = {fx.concatenate(x)}" if fx.rank is not None and x.rank is not None else ""
    return (
        f"The gradient for {name} fits no layout: fx has shape {fx}, {name} has shape {x} and its gradient "
        f"has shape {gx}. {_MUST_BE.format(x=name, jacobian=jacobian)}"
    )


@dataclasses.dataclass(frozen=True)
class Choice:
    """The layouts a gx may be read by, first fitting first; ``static``: fully known shapes decided, and
    ``layouts[0]`` is the layout (no op decides)."""

    layouts: tuple[Layout, ...]
    static: bool


def candidates(name: str, fx: Shape, x: Shape, gx: Shape) -> Choice:
    """The layouts to choose from: the one that fits where shapes are known, else all that may fit.

    Shapes are static shapes as tuples (``_tf_internal.shape_tuple``: None
    for an unknown dimension, or for an unknown rank). Raises ValueError,
    naming the argument and the shapes, where none may fit.
    """
    choice = _choice(fx, x, gx)
    if not choice.layouts:
        raise ValueError(_misfit(name, tf.TensorShape(fx), tf.TensorShape(x), tf.TensorShape(gx)))
    return choice


@functools.lru_cache(maxsize=1024)  # eager calls and traces see the same few shapes again and again
def _choice(fx: Shape, x: Shape, gx: Shape) -> Choice:
    shapes = tf.TensorShape(fx), tf.TensorShape(x), tf.TensorShape(gx)
    fitting = tuple(layout for layout in Layout if _may_fit(layout, *shapes))
    static = all(shape.is_fully_defined() for shape in shapes)
    return Choice(fitting[:1] if static else fitting, static)


def _contract(layout: Layout, zero_term: tf.Tensor, fx: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """Reduces an elementwise zero term (gx times the zero of x) to fx's layout."""
    if layout is Layout.ELEMENTWISE:
        return zero_term
    if layout is Layout.JACOBIAN:
        if x.shape.rank is None:
            return tf.reduce_sum(zero_term, axis=tf.range(tf.rank(fx), tf.rank(zero_term)))
        return tf.reduce_sum(zero_term, axis=list(range(-x.shape.rank, 0))) if x.shape.rank else zero_term
    total = tf.reduce_sum(zero_term)
    if layout is Layout.SCALAR:
        return total
    # tfp's rule spreads the sum over every element of fx; an empty fx has
    # no element to spread over and must not divide by zero.
    size = fx.shape.num_elements()
    size = tf.maximum(tf.size(fx), 1) if size is None else max(size, 1)
    return total / tf.cast(size, total.dtype)


def zero_term(name: str, choice: Choice, fx: tf.Tensor, x: tf.Tensor, gx: tf.Tensor,
              x_stopped: tf.Tensor) -> tf.Tensor:
    """The identity's term for one argument: +0.0 in value, broadcasting to fx, derivative gx in its layout.

    ``choice`` is ``candidates(...)``'s answer for these tensors; gx is
    already in fx's dtype and stopped as the caller wants; ``x_stopped`` is stop(x).
    """
    if choice.static:
        return _contract(choice.layouts[0], identity.negative_zero_term(gx, x, fx.dtype, x_stopped), fx, x)
    return _RunTime(name, choice.layouts, fx, x, gx, x_stopped).term()


class _RunTime:
    """The term where static shapes leave the layout open: each candidate is computed,
    on fx, x and gx where it is the first that fits the run-time shapes and on a
    single zero elsewhere (``shape_checks.reshaped_where``), and the terms added."""

    def __init__(self, name: str, layouts: tuple[Layout, ...], fx: tf.Tensor, x: tf.Tensor, gx: tf.Tensor,
                 x_stopped: tf.Tensor):
        self.gx, self.dtype = gx, fx.dtype
        self.minus_u = identity.zero_with_slope(x, slope_is_negative=True, stopped=x_stopped)
        self.shapes = [tf.shape(t) for t in (fx, x, gx)]
        self.padded, self.ranks = shape_checks.left_padded(*self.shapes)
        self.selected, taken = {}, tf.constant(False)
        fits = self._fits()
        for layout in layouts:
            self.selected[layout] = tf.logical_and(fits[layout](), tf.logical_not(taken))
            taken = tf.logical_or(taken, self.selected[layout])
        self.check = shape_checks.require(taken, tf.zeros([], self.dtype), self._message(name))

    def _fits(self) -> dict[Layout, Callable[[], tf.Tensor]]:
        """Whether the run-time shapes fit each layout, computed only for the layouts asked for."""
        (fx, x, gx), (fx_rank, x_rank, gx_rank) = self.padded, self.ranks
        to_x = functools.cache(lambda: shape_checks.broadcasts_to_padded(gx, gx_rank, x, x_rank))

        def elementwise() -> tf.Tensor:
            fits, product = shape_checks.broadcast_padded(gx, x)
            return fits & tf.equal(tf.maximum(gx_rank, x_rank), fx_rank) & tf.reduce_all(tf.equal(product, fx))

        fx_shape, x_shape, gx_shape = self.shapes
        return {
            Layout.JACOBIAN: lambda: shape_checks.same_shape(gx_shape, tf.concat([fx_shape, x_shape], 0)),
            Layout.ELEMENTWISE: elementwise,
            Layout.SCALAR: lambda: to_x() & tf.equal(tf.reduce_prod(fx_shape), 1),
            Layout.SUM: to_x,
        }

    def _message(self, name: str) -> list[str | tf.Tensor]:
        fx, x, gx = self.shapes
        return [
            f"The gradient for {name} fits no layout: fx has shape", fx, f", {name} has shape", x,
            "and its gradient has shape", gx, ". " + _MUST_BE.format(x=name, jacobian=""),
        ]  # fmt: skip

    def _product(self, selected: tf.Tensor, g_shape: tf.Tensor, u_shape: tf.Tensor) -> tf.Tensor:
        g = shape_checks.reshaped_where(self.gx, selected, g_shape)
        return identity.times_zero(g, shape_checks.reshaped_where(self.minus_u, selected, u_shape), self.dtype)

    def _shaped_like_fx(self, term: tf.Tensor, selected: tf.Tensor) -> tf.Tensor:
        fx_shape = self.shapes[0]
        return tf.reshape(term, tf.where(selected, fx_shape, tf.ones_like(fx_shape)))

    def term(self) -> tf.Tensor:
        fx_shape, x_shape, _ = self.shapes
        _, x_padded, gx_padded = self.padded
        total = self.check
        if Layout.SCALAR in self.selected or Layout.SUM in self.selected:  # one product serves both
            scalar = self.selected.get(Layout.SCALAR, tf.constant(False))
            spread = self.selected.get(Layout.SUM, tf.constant(False))
            product = self._product(scalar | spread, gx_padded, x_padded)
            size = tf.where(spread, tf.maximum(tf.reduce_prod(fx_shape), 1), 1)  # tfp's rule divides by size(fx)
            total += tf.reduce_sum(product) / tf.cast(size, self.dtype)
        if Layout.JACOBIAN in self.selected:
            selected = self.selected[Layout.JACOBIAN]
            rows, columns = tf.reduce_prod(fx_shape), tf.reduce_prod(x_shape)
            product = self._product(selected, tf.stack([rows, columns]), tf.stack([1, columns]))
            total += self._shaped_like_fx(tf.reduce_sum(product, axis=1), selected)
        if Layout.ELEMENTWISE in self.selected:
            selected = self.selected[Layout.ELEMENTWISE]
            total += self._shaped_like_fx(self._product(selected, gx_padded, x_padded), selected)
        return total
