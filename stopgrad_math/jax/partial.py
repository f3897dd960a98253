"""partial_custom_gradient in JAX: a custom gradient for one argument, autodiff for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from stopgrad_math.jax.identity_form import with_gradient
from stopgrad_math.jax.stops import stop_gradient


def partial_custom_gradient(f: Callable[..., Any], g: Callable[..., Any], x: Any, *others: Any) -> jax.Array:
    """Returns h = f(x, *others) with dh/dx = g(x, *others), autodiff for ``others``.

    f and g are evaluated at stop(x) with ``others`` live, and embedded with
    ``custom_gradient(fx, gx, x, fx_gx_manually_stopped=True)``: the value is
    f(x, y) bit for bit, dh/dx = g, dh/dy = ∂f/∂y, and the mixed second
    derivatives are ∂g/∂y.

    Examples:
        f = x·y with the custom dh/dx = 2y, and dh/dy = x by autodiff.

        >>> h = lambda x, y: partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)
        >>> [float(d) for d in jax.grad(h, argnums=(0, 1))(3.0, 5.0)]
        [10.0, 3.0]
    """
    stopped = stop_gradient(x)
    return with_gradient(f(stopped, *others), g(stopped, *others), x, fx_gx_manually_stopped=True,
                         stopped_by_caller=True)
