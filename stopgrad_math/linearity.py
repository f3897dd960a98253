"""Checks that a grad_fn is linear in the upstream gradient.

Any stop-gradient identity makes the backward pass linear in the upstream
gradient: h's derivative is a fixed linear map J, and J·v is read off grad_fn
by differentiating it at d = 0. A grad_fn that is not linear (gradient
clipping, normalization) cannot be expressed: J·v would silently be its
linearization at zero. These checks catch that: the cheap ones always, where
the values are known while tracing (always in eager), the superposition test
on request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

_NOT_LINEAR = (
    "a custom gradient must be linear in the upstream gradient (clipping or normalizing "
    "the gradient cannot be expressed by a stop-gradient identity)"
)
_RTOL = {tf.float16: 5e-2, tf.bfloat16: 5e-2, tf.float32: 1e-3, tf.float64: 1e-9}


def check_at_zero(gradients: Sequence[tf.Tensor], names: Sequence[str]) -> None:
    """Raises ValueError where grad_fn(0) is known and finite but not zero."""
    for gradient, name in zip(gradients, names, strict=True):
        value = tf.get_static_value(gradient)
        if value is not None and np.any(np.isfinite(value) & (value != 0)):
            raise ValueError(f"grad_fn(0) is not zero for {name}: {_NOT_LINEAR}.")


def check_connected(products: Sequence[Any], gradients: Sequence[tf.Tensor]) -> None:
    """Raises ValueError where grad_fn returned gradients that do not depend on the upstream."""
    if gradients and all(p is None for p in products):
        raise ValueError(f"grad_fn's result does not depend on the upstream gradient: {_NOT_LINEAR}.")


def check_superposition(call: Callable[[list], list], upstreams: Sequence[Any], seed: int = 0) -> None:
    """Raises if call(a·d1 + d2) differs from a·call(d1) + call(d2) for random d1, d2.

    ``call`` maps a list of upstream gradients (None for outputs without one)
    to a list of gradients. In eager mode the check raises at once; in a
    graph it runs with the graph (tf.errors.InvalidArgumentError).
    """
    d1, d2 = (
        [None if d is None else tf.random.stateless_normal(tf.shape(d), [seed, k], dtype=d.dtype) for d in upstreams]
        for k in (1, 2)
    )
    a = 1.7
    mixed = [None if p is None else a * p + q for p, q in zip(d1, d2, strict=True)]
    for lhs, g1, g2 in zip(call(mixed), call(d1), call(d2), strict=True):
        rhs = a * g1 + g2
        rtol = _RTOL[lhs.dtype.base_dtype]
        scale = tf.reduce_max(tf.abs(tf.concat([tf.reshape(rhs, [-1]), tf.zeros([1], rhs.dtype)], 0)))
        atol = rtol * scale
        tf.debugging.assert_near(lhs, rhs, rtol=rtol, atol=atol, message=f"grad_fn is not linear: {_NOT_LINEAR}")
