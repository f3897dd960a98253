"""Stopping gradients over pytrees and per element, in JAX."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stopgrad_math.jax import identity
from stopgrad_math.shared import layouts


def stop_gradient(tree: Any) -> Any:
    """Returns ``jax.lax.stop_gradient`` applied to every leaf of a pytree.

    Arrays, NumPy values and Python numbers become stopped arrays; None
    stays None (an empty subtree, as JAX has it).

    Examples:
        >>> out = stop_gradient({"loc": jnp.array([1.0]), "scale": 2.0, "extra": None})
        >>> sorted(out), float(out["scale"]), out["extra"]
        (['extra', 'loc', 'scale'], 2.0, None)
    """
    return jax.tree_util.tree_map(lambda leaf: identity.stop(jnp.asarray(leaf)), tree)


def stop_gradient_where(x: Any, mask: Any) -> jax.Array:
    """Returns x, with its gradient stopped where ``mask`` is true.

    ``where(mask, stop(x), x)``: the value is x bit for bit; the derivative is
    x's where mask is false and zero where it is true. ``mask`` is a bool
    array that broadcasts to x's shape.

    Examples:
        >>> f = lambda x: stop_gradient_where(x, jnp.array([True, False, True]))
        >>> jax.grad(lambda x: f(x).sum())(jnp.array([1.0, 2.0, 3.0]))
        Array([0., 1., 0.], dtype=float32)
    """
    x = identity.inexact_array(x, "stop_gradient_where's x")
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:  # a 0/1 or float mask would be read as a select, silently
        raise TypeError(f"stop_gradient_where's mask must be a bool array; got {mask.dtype}.")
    layouts.require_broadcast("stop_gradient_where's mask", mask.shape, "x's", x.shape)
    return jnp.where(mask, identity.stop(x), x)
