"""Estimators on the identity, in JAX: straight-through, scaled and reversed gradients, DiCE's magic box."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stopgrad_math.jax import identity
from stopgrad_math.jax.identity_form import with_gradient
from stopgrad_math.shared import layouts


def straight_through(forward: Any, backward: Any) -> Any:
    """Returns the value of ``forward`` with the derivative of ``backward``.

    ``stop(forward) − (stop(backward) − backward)``: the subtracted term is
    exactly +0.0, so the value is forward bit for bit; the derivative is
    backward's. ``backward`` broadcasts to forward's shape and is cast to its
    dtype; where backward is inf or NaN the value is kept and backward's
    derivative passes all the same. Pytrees of the same structure are mapped
    leaf by leaf.

    Examples:
        round in the forward pass, identity in the backward pass.

        >>> f = lambda x: straight_through(jnp.round(x), x)
        >>> x = jnp.array([0.4, 1.6])
        >>> f(x), jax.grad(lambda x: f(x).sum())(x)
        (Array([0., 2.], dtype=float32), Array([1., 1.], dtype=float32))
    """
    try:
        return jax.tree_util.tree_map(_straight_through_leaf, forward, backward)
    except ValueError as error:
        if "structure" in str(error) or "Tuple arity" in str(error) or "Dict key" in str(error):
            raise ValueError(f"straight_through's forward and backward must have the same structure: {error}") from None
        raise


def _straight_through_leaf(forward: Any, backward: Any) -> jax.Array:
    forward = identity.inexact_array(forward, "straight_through's forward")
    backward = identity.inexact_array(backward, "straight_through's backward", dtype_hint=forward.dtype)
    layouts.require_broadcast("straight_through's backward", backward.shape, "forward's", forward.shape)
    term = identity.zero_with_slope(backward.astype(forward.dtype), slope_is_negative=True)
    return identity.attach(identity.stop(forward), [term])


def scale_gradient(x: Any, scale: Any) -> Any:
    """Returns x with its derivative multiplied by ``scale``.

    The elementwise identity with f = x and g = scale: the value is x bit for
    bit. ``scale`` broadcasts to each leaf's shape; pytrees are mapped leaf
    by leaf with the same scale.

    Examples:
        >>> jax.grad(lambda x: scale_gradient(x, 0.1).sum())(jnp.array([1.0, 2.0]))
        Array([0.1, 0.1], dtype=float32)
    """
    return jax.tree_util.tree_map(lambda leaf: _scaled(leaf, scale), x)


def _scaled(x: Any, scale: Any) -> jax.Array:
    x = identity.inexact_array(x, "scale_gradient's x")
    scale = identity.inexact_array(scale, "scale_gradient's scale", dtype_hint=x.dtype)
    layouts.require_broadcast("scale_gradient's scale", scale.shape, "x's", x.shape)
    return with_gradient(x, jnp.broadcast_to(scale, x.shape), x)


def reverse_gradient(x: Any, scale: Any = 1.0) -> Any:
    """Returns x with its derivative multiplied by −scale (gradient reversal).

    Examples:
        >>> float(jax.grad(lambda x: reverse_gradient(x, 0.5))(3.0))
        -0.5
    """
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return scale_gradient(x, -scale)  # a Python number stays one, converted to x's dtype directly
    try:
        return scale_gradient(x, -np.asarray(scale) if not isinstance(scale, jax.Array) else -scale)
    except TypeError as error:  # a string, None, a bool
        raise TypeError(f"reverse_gradient's scale must be a number or an array of numbers; got {scale!r:.60}.") \
            from error


def magic_box(tau: Any) -> jax.Array:
    """Returns the DiCE operator: value 1, d magic_box(τ) = magic_box(τ)·dτ at every order.

    ``exp(τ − stop(τ))`` with the identity's exact zero: the value is 1.0
    exactly, also where τ is inf or NaN, and every derivative is that of
    exp(τ) divided by exp(stop(τ)).

    Examples:
        τ = θ² at θ = 0.3: first derivative 2θ = 0.6, second (2θ)² + 2.

        >>> box = lambda theta: magic_box(theta**2)
        >>> round(float(jax.grad(box)(0.3)), 6), round(float(jax.grad(jax.grad(box))(0.3)), 6)
        (0.6, 2.36)
    """
    tau = identity.inexact_array(tau, "magic_box's tau")
    return jnp.exp(identity.zero_with_slope(tau, slope_is_negative=False))
