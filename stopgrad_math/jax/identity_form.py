"""custom_gradient(fx, gx, x) in JAX: the identity form, tfp's signature, every layout of gx."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from stopgrad_math.jax import decorator_form, identity, second_derivative_guard
from stopgrad_math.shared import arguments, layouts
from stopgrad_math.shared.layouts import Layout


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
    return choice.layouts[0], g if g.dtype == fx.dtype else g.astype(fx.dtype), x


def custom_gradient(fx: Any = None, gx: Any = None, x: Any = None, fx_gx_manually_stopped: bool = False,
                    name: str | None = None, *, order: int = 1,
                    check_linearity: bool = False) -> jax.Array | Callable[..., Any]:
    """Embeds a known gradient: ``custom_gradient(fx, gx, x)`` or ``@custom_gradient``.

    **Identity form**, tfp's signature: an array with the value of ``fx``
    bit for bit (−0.0, inf and NaN included) and the derivative ``gx`` with
    respect to ``x`` (an array or a pytree; ``gx`` has its structure, None:
    no gradient for that leaf), under every transform:

        h = stop(fx) − Σ zero_product(stop(gx), stop(x) − x)

    gx is read from its shape as on TensorFlow: ``fx.shape + x.shape`` is the
    Jacobian; a gx that broadcasts with x to ``fx.shape`` is elementwise; for
    a one-element fx it is the gradient; otherwise, as in tfp, the gradient
    of ``sum(fx)``. Complex values follow JAX's convention (the JVP is
    gx·tangent). An infinite gx gives an infinite derivative; an inf or NaN
    element of x keeps the value and gets gx as any other element does.

    **Decorator form**, a drop-in for ``jax.custom_gradient``: ``f(*args)``
    returns ``(y, vjp)``; the decorated f has the value y bit for bit and the
    VJP's derivative under ``grad``, ``vjp``, ``jvp``, ``jacfwd``, ``jacrev``,
    ``vmap`` and ``jit`` (``jax.custom_vjp`` has no forward mode). vjp must
    be linear in its cotangent, which is proven from its jaxpr (a ValueError
    names any other primitive); ``order=2`` makes second derivatives exact.

    Every argument, error and limit: [custom_gradient in full](custom_gradient.md).

    Args:
      fx: the value f(x); or, alone, the function to decorate.
      gx: the derivative of f at x (None: no gradient for that leaf).
      x: what the derivative is with respect to.
      fx_gx_manually_stopped: fx and gx are used as given, unstopped (a ValueError where they move with x).
      name: accepted for tfp's signature (JAX keeps no op names).
      order: decorator form: 2 for exact second derivatives.
      check_linearity: decorator form: accepted; on JAX linearity is always proven.

    Returns:
      fx with derivative gx; or the decorated function.

    Examples:
        log(1 + exp(x)) with its exact derivative at x = 100, in forward mode.

        >>> f = lambda x: custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
        >>> jax.jvp(f, (jnp.array([0.0, 100.0]),), (jnp.ones(2),))[1]
        Array([0.5, 1. ], dtype=float32)
        >>> @custom_gradient
        ... def log1pexp(x):
        ...   e = jnp.exp(x)
        ...   return jnp.log1p(e), lambda ct: ct * (1 - 1 / (1 + e))
        >>> float(jax.jvp(log1pexp, (100.0,), (1.0,))[1])   # jax.custom_gradient raises here
        1.0
    """
    del name  # JAX keeps no op names
    decorated = arguments.decorator_form(fx, gx, x, order, check_linearity, decorator_form.decorate)
    if decorated is not None:
        return decorated
    return with_gradient(fx, gx, x, fx_gx_manually_stopped)


_UNSTOPPED = ("{what} moves with x: fx_gx_manually_stopped=True promises that fx and gx are stopped w.r.t. x, "
              "but {what} is differentiated together with x, so its own derivative would add to the embedded one "
              "({effect}). Stop x where fx and gx read it; partial_custom_gradient(f, g, x, *others) does, and "
              "keeps the derivatives w.r.t. the others.")


def _held_apart_from_x(fx: jax.Array, planned: list[tuple[str, Layout, jax.Array, jax.Array]]
                       ) -> tuple[jax.Array, list[tuple[str, Layout, jax.Array, jax.Array]]]:
    """fx and each gx, bit for bit, whose derivative raises where they move in the jvp that x moves in.

    Only a dependence can be seen, not on what: an fx or gx that reads another argument differentiated in the
    same jvp as x is refused too (partial_custom_gradient embeds that case with x stopped, unchecked)."""
    xs = [leaf for *_, leaf in planned]
    fx = second_derivative_guard.held_apart(fx, xs, _UNSTOPPED.format(what="fx", effect="twice the derivative"))
    return fx, [(label, layout, second_derivative_guard.held_apart(
        g, xs, _UNSTOPPED.format(what=f"the gradient for {label}", effect="twice the second derivative")), leaf)
        for label, layout, g, leaf in planned]


def with_gradient(fx: Any, gx: Any, x: Any, fx_gx_manually_stopped: bool = False, *,
                  stopped_by_caller: bool = False) -> jax.Array:
    """The identity form alone (the helpers' entry): fx with derivative gx w.r.t. x. ``stopped_by_caller``:
    fx and gx read x stopped by construction (partial_custom_gradient), and the promise is not checked."""
    fx = identity.inexact_array(fx, "fx")
    planned = [(label, *_checked(fx, label, g, leaf)) for label, g, leaf in _leaves(gx, x) if g is not None]
    promise = "stop" if not fx_gx_manually_stopped else "trust" if stopped_by_caller else "check"
    labels, layouts_of = tuple(p[0] for p in planned), tuple(p[1] for p in planned)
    embedded: jax.Array = _embedded(fx, [p[2] for p in planned], [p[3] for p in planned], labels=labels,
                                    layouts=layouts_of, promise=promise)
    return embedded


@functools.partial(jax.jit, static_argnames=("labels", "layouts", "promise"))
def _embedded(fx: jax.Array, gs: list[jax.Array], xs: list[jax.Array], *, labels: tuple[str, ...],
              layouts: tuple[Layout, ...], promise: str) -> jax.Array:
    """stop(fx) − Σ zero_term(g, x), compiled once per layout, shape and dtype: eagerly one dispatch rather than
    ten small ops, each of which a transform would trace anew. Under an outer jit it is inlined; every transform
    sees through it. ``promise``: "stop" fx and gx, "check" that they are held apart from x
    (fx_gx_manually_stopped=True), or "trust" the caller who stopped x (partial_custom_gradient)."""
    planned = list(zip(labels, layouts, gs, xs, strict=True))
    if promise == "stop":
        fx = identity.stop(fx)
        planned = [(label, layout, identity.stop(g), leaf) for label, layout, g, leaf in planned]
    elif promise == "check":
        fx, planned = _held_apart_from_x(fx, planned)
    return identity.attach(fx, [identity.zero_term(layout, fx, leaf, g) for _, layout, g, leaf in planned])
