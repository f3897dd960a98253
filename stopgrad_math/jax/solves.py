"""Linear solves the decorator can embed, in JAX: ``linear_solve``, and the implicit functions' adjoint solves.

A VJP is embedded where it is proven linear in its cotangent. A solve by an
iterative method whose stopping test reads the right-hand side (CG with a
tolerance, a hand-written ``while_loop``) is not, op by op; declared linear
with ``jax.lax.custom_linear_solve`` it is, and its derivative in ``b`` is a
solve again. The implicit functions solve with the transpose of the
residual's Jacobian in ``z``: densely, with the caller's solver handed the
transposed operator, or elementwise where the residual is elementwise.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

Solve = Callable[[Callable[[Any], Any], Any], Any]
ELEMENTWISE = "elementwise"  # ``transposed``'s solve for an elementwise residual (a string: a VJP's closure is
# rebuilt from its key, a function there as a copy)


def linear_solve(matvec: Callable[[Any], Any], b: Any, solve: Solve, transpose_solve: Solve | None = None,
                 symmetric: bool = False) -> Any:
    """Returns ``solve(matvec, b)``, declared linear in ``b``: ``jax.lax.custom_linear_solve``.

    x solves ``matvec(x) = b``; its derivative in ``b`` is a solve with the
    same operator, and in reverse mode ``transpose_solve(vecmat, b)`` with the
    transposed one (``symmetric=True``: ``solve`` again). ``solve`` is never
    differentiated, so it may stop on a tolerance or loop in a
    ``while_loop``, and a VJP that calls it is still proven linear.

    A zero ``b`` (every element) gives 0, as x = 0 solves ``matvec(x) = 0``,
    and ``solve`` is not called for it (under ``vmap`` it runs and its answer
    is not selected): a solver that divides by ``|b|`` (CG's fixed steps)
    gives 0/0 = NaN there, which a zero cotangent, a zero tangent or
    ``order=2``'s motion of a root would meet.

    Examples:
        A CG solve inside a VJP, in forward mode (a VJP with ``cg``'s loop alone could not be transposed).

        >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
        >>> cg = lambda matvec, b: jax.scipy.sparse.linalg.cg(matvec, b, tol=1e-12)[0]
        >>> x = linear_solve(lambda v: A @ v, jnp.array([1.0, 2.0]), cg, symmetric=True)
        >>> bool(jnp.allclose(A @ x, jnp.array([1.0, 2.0])))
        True
    """
    transposed = None if transpose_solve is None else _zero_at_zero(transpose_solve)
    return jax.lax.custom_linear_solve(matvec, b, _zero_at_zero(solve), transpose_solve=transposed,
                                       symmetric=symmetric)


def _zero_at_zero(solve: Solve) -> Solve:
    """``solve``, giving 0 for a ``b`` that is zero in every element without running it (a ``cond``: under ``vmap``
    both branches run and the zero is selected; the solver is never differentiated, so its NaN there reaches
    nothing)."""

    def zero_at_zero(matvec: Callable[[Any], Any], b: Any) -> Any:
        zero = jnp.all(jnp.array([jnp.all(leaf == 0) for leaf in jax.tree_util.tree_leaves(b)]))
        return jax.lax.cond(zero, lambda b: jax.tree_util.tree_map(jnp.zeros_like, b), lambda b: solve(matvec, b), b)

    return zero_at_zero


def forward(residual: Callable[[Any], Any], z: Any, b: Any, solve: Solve | str | None) -> Any:
    """p with ``(∂_z residual) p = b`` at ``z``, as ``transposed`` solves with the transpose."""
    if solve is None:
        flat, unravel = ravel_pytree(z)
        jacobian = jax.jacfwd(lambda flat: ravel_pytree(residual(unravel(flat)))[0])(flat)
        return unravel(jnp.linalg.solve(jacobian, ravel_pytree(b)[0]))
    if solve == ELEMENTWISE:
        return b / jax.jvp(residual, (z,), (jnp.ones_like(z),))[1]
    given = typing.cast(Solve, solve)
    return linear_solve(lambda p: jax.jvp(residual, (z,), (p,))[1], b, given, transpose_solve=given)


def transposed(residual: Callable[[Any], Any], z: Any, b: Any, solve: Solve | str | None) -> Any:
    """u with ``(∂_z residual)ᵀ u = b`` at ``z``: ``solve=None`` forms the Jacobian densely (any pytree z,
    raveled); ``ELEMENTWISE`` divides by its diagonal, read in one JVP (linear op by op); a ``solve(matvec, b)`` is
    handed the transposed operator (a pullback), declared linear, so that its transpose (forward mode) hands
    ``solve`` the operator itself."""
    if solve is None:
        flat, unravel = ravel_pytree(z)
        jacobian = jax.jacfwd(lambda flat: ravel_pytree(residual(unravel(flat)))[0])(flat)
        return unravel(jnp.linalg.solve(jacobian.T, ravel_pytree(b)[0]))
    if solve == ELEMENTWISE:
        return b / jax.jvp(residual, (z,), (jnp.ones_like(z),))[1]
    pullback, given = jax.vjp(residual, z)[1], typing.cast(Solve, solve)
    return linear_solve(lambda u: pullback(u)[0], b, given, transpose_solve=given)
