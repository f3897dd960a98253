"""The identity's term for each layout of ``gx``, in TensorFlow.

Which layout a gx's shape means is decided in ``stopgrad_math.shared.layouts``,
shared with the JAX substrate. Static shapes decide where they are fully
known (no op is added). Where dimensions are unknown while tracing, every
layout the known dimensions allow is kept, and the graph takes the first that
the run-time shapes fit, by the same rules, so eager and graph agree for the
same shapes; a run-time misfit fails with the static words.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

from stopgrad_math.shared.layouts import MUST_BE, Choice, Layout, candidates
from stopgrad_math.tensorflow import identity, shape_checks

__all__ = ["Choice", "Layout", "candidates", "contracted", "zero_term"]


def contracted(layout: Layout, zero_term: tf.Tensor, fx: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
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
        return contracted(choice.layouts[0], identity.negative_zero_term(gx, x, fx.dtype, x_stopped), fx, x)
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
            "and its gradient has shape", gx, ". " + MUST_BE.format(x=name, jacobian=""),
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
