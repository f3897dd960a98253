"""custom_gradient(fx, gx, x) in JAX: the identity form, tfp's signature, every layout of gx."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stopgrad_math import layouts
from stopgrad_math.jax import identity
from stopgrad_math.layouts import Layout


def _leaves(gx: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """(label, gx leaf, x leaf) for each leaf of x, gx having x's structure (a None leaf: no gradient)."""
    labelled, structure = jax.tree_util.tree_flatten_with_path(gx, is_leaf=lambda leaf: leaf is None)
    try:
        x_leaves = structure.flatten_up_to(x)  # type: ignore[attr-defined]  # in PyTreeDef, not in its stub
    except (TypeError, ValueError) as error:
        raise ValueError(f"gx must have the structure of x: {error}") from None
    return [(f"x{jax.tree_util.keystr(path)}", g, leaf) for (path, g), leaf in zip(labelled, x_leaves, strict=True)]


def _checked(fx: jax.Array, label: str, g: Any, x: Any) -> tuple[Layout, jax.Array, jax.Array]:
    """(layout, gx in fx's dtype, x) for one argument, or the error that names it."""
    x = identity.inexact_array(x, label)
    g = identity.inexact_array(g, f"the gradient for {label}", dtype_hint=fx.dtype)
    if not identity.is_complex(fx.dtype) and (identity.is_complex(g.dtype) or identity.is_complex(x.dtype)):
        raise TypeError(f"The gradient for {label} or {label} is complex ({g.dtype}, {x.dtype}) for a real fx "
                        f"({fx.dtype}): a real function has no complex derivative.")
    choice = layouts.candidates(label, fx.shape, x.shape, g.shape)
    return choice.layouts[0], g.astype(fx.dtype), x


def _term(layout: Layout, fx: jax.Array, x: jax.Array, g: jax.Array) -> jax.Array:
    """+0.0 broadcasting to fx's shape, with derivative g in its layout."""
    g = jnp.where(jnp.isfinite(identity.stop(x)), g, jnp.zeros((), g.dtype))  # inf or NaN x: 0, never g·0 = NaN
    product = identity.multiply_no_nan(g, identity.zero_with_slope(x, slope_is_negative=True).astype(fx.dtype))
    if layout is Layout.ELEMENTWISE:
        return product
    if layout is Layout.JACOBIAN:
        return jnp.sum(product, axis=tuple(range(fx.ndim, product.ndim)))
    total = jnp.sum(product)
    if layout is Layout.SCALAR:
        return total
    return total / max(identity.size(fx.shape), 1)  # tfp's rule spreads the sum over fx (an empty fx: no division)


def custom_gradient(fx: Any, gx: Any = None, x: Any = None, fx_gx_manually_stopped: bool = False,
                    name: str | None = None) -> jax.Array:
    """Returns an array with the value of ``fx`` and the derivative ``gx`` with respect to ``x``.

        h = stop(fx) − Σ multiply_no_nan(stop(gx), stop(x) − x)

    The value is fx bit for bit (−0.0, inf and NaN included), under every
    transform (``grad``, ``jvp``, ``jacfwd``, ``jacrev``, ``hessian``, ``vmap``,
    ``jit``). ``x`` is an array or a pytree of them, ``gx`` a pytree of x's
    structure (None: no gradient for that leaf), read from its shape as on
    TensorFlow: ``fx.shape + x.shape`` is the Jacobian; a gx that broadcasts
    with x to ``fx.shape`` is elementwise; for a one-element fx it is the
    gradient; otherwise, as in tfp, the gradient of ``sum(fx)``. Complex
    values follow JAX's convention (the JVP is gx·tangent). An infinite gx
    gives an infinite derivative; an inf or NaN element of x keeps the value
    and gets no derivative. ``name`` is accepted for tfp's signature.

    The decorator form of ``stopgrad_math.custom_gradient`` is not yet on JAX.

    Examples:
        log(1 + exp(x)) with its exact derivative at x = 100, in forward mode.

        >>> f = lambda x: custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
        >>> jax.jvp(f, (jnp.array([0.0, 100.0]),), (jnp.ones(2),))[1]
        Array([0.5, 1. ], dtype=float32)
    """
    del name  # JAX keeps no op names
    if gx is None and x is None:
        raise TypeError("stopgrad_math.jax.custom_gradient takes (fx, gx, x); its decorator form is not yet on JAX.")
    if (gx is None) != (x is None):
        raise TypeError("custom_gradient needs both gx and x, or neither.")
    fx = identity.inexact_array(fx, "fx")
    planned = [(label, *_checked(fx, label, g, leaf)) for label, g, leaf in _leaves(gx, x) if g is not None]
    if not fx_gx_manually_stopped:
        fx = identity.stop(fx)
        planned = [(label, layout, identity.stop(g), leaf) for label, layout, g, leaf in planned]
    return identity.attach(fx, [_term(layout, fx, leaf, g) for _, layout, g, leaf in planned])
