"""partial_custom_gradient: a custom gradient for one argument, autodiff for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math.tensorflow.identity_form import custom_gradient
from stopgrad_math.tensorflow.stops import stop_gradient


def partial_custom_gradient(f: Callable[..., Any], g: Callable[..., Any], x: Any, *others: Any) -> tf.Tensor:
    """Returns h = f(x, *others) with dh/dx = g(x, *others), autodiff for ``others``.

    tfp's "partial custom gradient" done for the caller: f and g are evaluated
    at stop(x) with ``others`` live, and embedded with
    ``custom_gradient(fx, gx, x, fx_gx_manually_stopped=True)``:

        h = f(stop x, y) − multiply_no_nan(g(stop x, y), stop(x) − x)

    so the value is f(x, y) bit for bit, dh/dx = g, dh/dy = ∂f/∂y, and the
    mixed second derivatives are right: ∂²h/∂x∂y = ∂²h/∂y∂x = ∂g/∂y. The
    second derivative in x alone is zero, as for any custom gradient held
    constant in x. g's shape is read as in ``custom_gradient``; x may be a
    nested structure, g(x, ...) then has the same structure.

    Examples:
        f = x·y with the custom dh/dx = 2y, and dh/dy = x by autodiff.

        >>> x, y = tf.constant(3.0), tf.constant(5.0)
        >>> with tf.GradientTape() as tape:
        ...   tape.watch([x, y])
        ...   h = partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)
        >>> [float(d) for d in tape.gradient(h, [x, y])]
        [10.0, 3.0]
    """
    stopped = stop_gradient(x)
    return custom_gradient(f(stopped, *others), g(stopped, *others), x, fx_gx_manually_stopped=True)
