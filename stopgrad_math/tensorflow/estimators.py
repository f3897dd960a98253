"""Gradient estimators that are identities in value: straight-through, scaling, DiCE."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.tensorflow import identity, shape_checks, value_only_mode
from stopgrad_math.tensorflow.identity_form import numeric_scale, scaled_identity


def straight_through(forward: Any, backward: Any) -> tf.Tensor:
    """Returns the value of ``forward`` with the gradient of ``backward``.

    ``stop(forward) − (stop(backward) − backward)``: the subtracted term is
    exactly +0.0, so the value is forward bit for bit, never the rounded
    ``backward + stop(forward − backward)``; the derivative is backward's.
    ``backward`` broadcasts to forward's shape (checked at run time where
    shapes are unknown while tracing) and is cast to its dtype. At an
    element where backward is inf or NaN the value is kept and no gradient
    passes. Nested structures are mapped leaf by leaf.

    Examples:
        round in the forward pass, identity in the backward pass.

        >>> x = tf.constant([0.4, 1.6])
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = straight_through(tf.round(x), x)
        >>> y.numpy(), tape.gradient(y, x).numpy()
        (array([0., 2.], dtype=float32), array([1., 1.], dtype=float32))
    """
    try:
        tf.nest.assert_same_structure(forward, backward)
    except (TypeError, ValueError) as error:
        raise ValueError(f"straight_through's forward and backward must have the same structure: {error}") from None
    return tf.nest.map_structure(_straight_through_leaf, forward, backward)


def _straight_through_leaf(forward: Any, backward: Any) -> tf.Tensor:
    forward = identity.inexact_tensor(forward, "straight_through's forward")
    backward = identity.inexact_tensor(backward, "straight_through's backward", dtype_hint=forward.dtype)
    backward = shape_checks.broadcast_checked(backward, forward, "backward", "forward")
    if identity.nothing_records():
        return forward
    if value_only_mode.active():
        return value_only_mode.undifferentiable(forward, [backward])
    term = identity.zero_with_slope(tf.cast(backward, forward.dtype), slope_is_negative=True)
    return identity.attach(tf.stop_gradient(forward), [term])


def scale_gradient(x: Any, scale: Any) -> Any:
    """Returns x with its gradient multiplied by ``scale``.

    The elementwise identity with f = x and g = scale: the value is x bit for
    bit and d/dx is scale (broadcast to x's shape, checked at run time where
    shapes are unknown while tracing; no gradient to scale). A tf.Variable
    scale can follow a schedule. Nested structures of x are
    mapped leaf by leaf with the same scale.

    Examples:
        >>> x = tf.constant([1.0, 2.0])
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = scale_gradient(x, 0.1)
        >>> tape.gradient(y, x).numpy()
        array([0.1, 0.1], dtype=float32)
    """
    return tf.nest.map_structure(lambda leaf: None if leaf is None else scaled_identity(leaf, scale), x)


def reverse_gradient(x: Any, scale: Any = 1.0) -> Any:
    """Returns x with its gradient multiplied by −scale (gradient reversal).

    Examples:
        >>> x = tf.constant(3.0)
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = reverse_gradient(x, 0.5)
        >>> float(tape.gradient(y, x))
        -0.5
    """
    return scale_gradient(x, _negated(scale))


def _negated(scale: Any) -> Any:
    """−scale; numbers negated as they are, so that 0.1 stays 0.1 in x's dtype (not float32's 0.1 cast up)."""
    if tf.is_tensor(scale) or isinstance(scale, tf.Variable):
        return -numeric_scale(identity.to_tensor(scale, "reverse_gradient's scale"), "reverse_gradient")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return -scale  # a Python number stays one, converted to x's dtype directly
    try:
        return np.negative(scale)
    except (TypeError, ValueError) as error:  # a string, None, a bool, a jagged list
        message = f"reverse_gradient's scale must be a number or a tensor of numbers; got {scale!r:.60}."
        raise TypeError(message) from error


def magic_box(tau: Any) -> tf.Tensor:
    """Returns the DiCE operator: value 1, d magic_box(τ) = magic_box(τ)·dτ at every order.

    ``exp(τ − stop(τ))`` with the identity's exact zero: exp(+0.0) is 1.0
    exactly, also where τ is inf or NaN, and since the exponent has derivative
    dτ at every order, every derivative of magic_box(τ) is that of exp(τ)
    divided by exp(stop(τ)). Multiplying a cost by magic_box of the summed
    log-probabilities of the samples it depends on gives score-function
    gradient estimates of any order.

    Examples:
        τ = θ² at θ = 0.3, first derivative 2θ = 0.6, second (2θ)² + 2.

        >>> theta = tf.constant(0.3)
        >>> with tf.GradientTape() as outer:
        ...   outer.watch(theta)
        ...   with tf.GradientTape() as inner:
        ...     inner.watch(theta)
        ...     box = magic_box(theta**2)
        ...   first = inner.gradient(box, theta)
        >>> round(float(first), 6), round(float(outer.gradient(first, theta)), 6)
        (0.6, 2.36)
    """
    tau = identity.inexact_tensor(tau, "magic_box's tau")
    return tf.exp(identity.zero_with_slope(tau, slope_is_negative=False))
