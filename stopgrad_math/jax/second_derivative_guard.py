"""The decorator's guard: a derivative beyond its order raises instead of missing a term.

At ``order=1`` the decorator holds the VJP's Jacobian J constant, so a
second derivative would miss the term through J's own dependence on x (for
``exp(f(x))`` it gives exp(f)·f′² where the truth is exp(f)·(f′² + f″)).
JAX decides this exactly, from its nesting of traces: the zero ``v`` of every
term passes through ``guarded(v, watched)``, the identity in value whose
tangent is ``dv · fence(watched)``, where ``fence`` is 1 in value and
``watched`` are the arguments and what the VJP closes over. A first derivative
evaluates the fence on plain values; a second one, an outer ``jvp`` whose
tangent reaches an argument or a closed-over value, differentiates the
fence, and its rule raises a ``LookupError`` naming ``order=2``. At
``order=2`` the fence is two deep: the third derivative raises.

Made of ``jax.custom_jvp``s whose tangents are linear (a product with 1, a
zero), so every transform composes and XLA folds both away.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

MESSAGES = {
    1: "A second derivative through {name}, decorated at order=1, would miss the term through its vjp's own "
       "dependence on the arguments (order=1 holds the vjp's Jacobian constant). Decorate it with "
       "custom_gradient(order=2) for exact second derivatives.",
    2: "A third derivative through {name}, decorated at order=2, would miss terms: order=2 is exact to the second "
       "derivative.",
}


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def fence(depth: int, message: str, watched: list[jax.Array]) -> jax.Array:
    """1.0, whose derivative ``depth`` deep w.r.t. ``watched`` raises ``LookupError(message)``."""
    del depth, message, watched
    return jnp.ones((), jnp.float32)


@fence.defjvp
def _fence_jvp(depth: int, message: str, primals: tuple[list[jax.Array]],
               tangents: tuple[list[jax.Array]]) -> tuple[jax.Array, jax.Array]:
    if depth <= 1:
        raise LookupError(message)
    return fence(depth - 1, message, primals[0]), jnp.zeros((), jnp.float32)  # one level down, on the primals


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _guarded(v: jax.Array, watched: list[jax.Array], order: int, message: str) -> jax.Array:
    del watched, order, message
    return v


@_guarded.defjvp
def _guarded_jvp(order: int, message: str, primals: tuple[jax.Array, list[jax.Array]],
                 tangents: tuple[jax.Array, list[jax.Array]]) -> tuple[jax.Array, jax.Array]:
    v, watched = primals
    return v, tangents[0] * fence(order, message, watched).astype(tangents[0].dtype)


def guarded(v: jax.Array, watched: list[jax.Array], order: int, name: str) -> jax.Array:
    """v, whose tangent is dv·fence(watched): exact, and raising at the derivative beyond ``order``."""
    return _guarded(v, watched, order, MESSAGES[order].format(name=name))
