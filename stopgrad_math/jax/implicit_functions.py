"""Implicit functions in JAX: a solver's result with the implicit function theorem's derivative, in every mode.

A root z of ``F(z, θ) = 0`` moves as ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ``. Its VJP,

    θ̄ = −(∂_θ F)ᵀ u,   (∂_z F)ᵀ u = z̄,

is linear in z̄, so the decorator embeds it, and forward mode, ``vmap`` and
``jit`` come from its transpose; the solver runs on stopped values and is
never differentiated. At ``order=2`` the VJP reads z moved with θ at first
order, ``z − (p − stop(p))`` with ``p = (∂_z F)⁻¹ ∂_θ F · (θ − stop(θ))``
(exactly z in value), so a second derivative through the root (a Hessian of an
outer loss) is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from stopgrad_math.jax import decorator_form, identity, solves
from stopgrad_math.jax.solves import Solve
from stopgrad_math.shared.arguments import name_of


def _stopped(tree: Any) -> Any:
    """Each inexact array leaf stopped (the solver's inputs and output); integers, None and other values as given."""
    return jax.tree_util.tree_map(lambda leaf: identity.stop(leaf) if _inexact(leaf) else leaf, tree)


def _negated(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: -leaf if _inexact(leaf) else leaf, tree)


def _inexact(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)


def _residual(fun: Callable[..., Any], fixed_point: bool, params: tuple[Any, ...]) -> Callable[[Any], Any]:
    """z ↦ F(z, *params): ``fun`` itself, or ``fun(z, *params) − z`` for a fixed point."""
    if fixed_point:
        return lambda z: jax.tree_util.tree_map(jnp.subtract, fun(z, *params), z)
    return lambda z: fun(z, *params)


def _moving(fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None, z: Any,
            params: tuple[Any, ...]) -> Any:
    """z with its first-order derivative in the params: ``z − (p − stop(p))``, p = (∂_z F)⁻¹ ∂_θ F·(θ − stop(θ)),
    its parts at stopped values (so its own derivative is not F's second; order 2 refuses a third)."""
    stopped = _stopped(params)
    zeros = jax.tree_util.tree_map(lambda p, s: p - s if _inexact(p) else s, params, stopped)
    moved = jax.jvp(lambda *ps: _residual(fun, fixed_point, ps)(z), stopped, zeros)[1]
    p = solves.forward(_residual(fun, fixed_point, stopped), z, moved, solve)
    return jax.tree_util.tree_map(lambda z, p: identity.attach(z, [identity.zero_with_derivative_of(p)]), z, p)


def _root(solution: Any, *params: Any, fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None,
          order: int) -> tuple[Any, Callable[[Any], Any]]:
    """``(solution, vjp)``: the implicit derivative of ``F(solution, *params) = 0``; None for the solution
    (stopped)."""

    def vjp(cotangent: Any) -> Any:
        z = _moving(fun, fixed_point, solve, solution, params) if order == 2 else solution
        u = solves.transposed(_residual(fun, fixed_point, params), z, cotangent, solve)
        pullback = jax.vjp(lambda *params: _residual(fun, fixed_point, params)(z), *params)[1]
        return (None, *_negated(tuple(pullback(u))))

    return solution, vjp


def _implicit(name: str, fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None,
              order: int) -> Callable[..., Any]:
    """``(solution, *params) ↦ solution``, decorated at ``order`` with the implicit derivative, named for
    messages."""

    def implicit(solution: Any, *params: Any) -> tuple[Any, Callable[[Any], Any]]:
        return _root(solution, *params, fun=fun, fixed_point=fixed_point, solve=solve, order=order)

    implicit.__name__ = implicit.__qualname__ = name
    return decorator_form.decorate(implicit, order)


def _solved(solver: Callable[..., Any], fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None,
            order: int, kind: str) -> Callable[..., Any]:
    implicit = _implicit(f"{kind}({name_of(solver)})", fun, fixed_point, solve, order)

    @functools.wraps(solver)
    def solved(init: Any, *params: Any) -> Any:
        return implicit(_stopped(solver(_stopped(init), *_stopped(params))), *params)

    return solved


def custom_root(optimality_fun: Callable[..., Any], solve: Solve | None = None, *,
                order: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a solver: its root z of ``optimality_fun(z, *params) = 0``, with the implicit derivative.

    ``custom_root(optimality_fun, solve)(solver)`` is ``(init, *params) ↦ z``:
    the value is ``solver(init, *params)`` run on stopped inputs (NumPy or a
    loop eagerly; under ``jit`` what JAX can trace), never differentiated; the
    derivative in ``params`` is ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ``, in every mode.
    ``init`` gets none. ``solve=None`` forms ``∂_z F`` densely; a
    ``solve(matvec, b)`` solves matrix-free, for whichever operator it is
    handed (reverse mode hands it the transpose). ``order=2``: second
    derivatives exact; ``order=1``: a second derivative raises.

    Examples:
        Ridge regression's solution, differentiated twice in its regularization.

        >>> X, y = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]]), jnp.array([1.0, 0.0, 2.0])
        >>> optimality = lambda w, lam: X.T @ (X @ w - y) + lam * w
        >>> @custom_root(optimality)
        ... def ridge(init, lam):
        ...   return jnp.linalg.solve(X.T @ X + lam * jnp.eye(2), X.T @ y)
        >>> loss = lambda lam: jnp.sum(ridge(jnp.zeros(2), lam) ** 2)
        >>> exact = lambda lam: jnp.sum(jnp.linalg.solve(X.T @ X + lam * jnp.eye(2), X.T @ y) ** 2)
        >>> bool(jnp.allclose(jax.hessian(loss)(1.0), jax.hessian(exact)(1.0)))
        True
    """

    return lambda solver: _solved(solver, optimality_fun, False, solve, order, "custom_root")


def custom_fixed_point(fixed_point_fun: Callable[..., Any], solve: Solve | None = None, *,
                       order: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a solver: its fixed point ``z = fixed_point_fun(z, *params)``, with the implicit derivative.

    ``custom_root`` of ``T(z, θ) − z``: ``dz = (I − ∂_z T)⁻¹ ∂_θ T · dθ``;
    ``solve`` and ``order`` as there.

    Examples:
        A deep-equilibrium layer, z = tanh(W z + x), found by iteration.

        >>> W = jnp.array([[0.3, -0.2], [0.1, 0.4]])
        >>> layer = lambda z, x: jnp.tanh(W @ z + x)
        >>> @custom_fixed_point(layer)
        ... def equilibrium(init, x):
        ...   return jax.lax.fori_loop(0, 100, lambda _, z: layer(z, x), init)
        >>> x = jnp.array([0.5, -1.0])
        >>> z = equilibrium(jnp.zeros(2), x)
        >>> J = jax.jacfwd(equilibrium, argnums=1)(jnp.zeros(2), x)   # jaxopt's raises in forward mode
        >>> D = jnp.diag(1 - z ** 2)
        >>> bool(jnp.allclose(J, jnp.linalg.solve(jnp.eye(2) - D @ W, D), atol=1e-6))
        True
    """

    return lambda solver: _solved(solver, fixed_point_fun, True, solve, order, "custom_fixed_point")


def implicit_reparameterization(sample: Any, cdf: Callable[..., Any], *params: Any, order: int = 1) -> jax.Array:
    """Returns draws ``sample`` with their implicit reparameterization gradient in ``params``.

    For draws ``z = F⁻¹(u; θ)`` of a distribution whose CDF is ``cdf(z, *params)``
    (elementwise; ``params`` broadcast to the draws' shape), the derivative is
    ``dz/dθ = −(∂F/∂θ) / (∂F/∂z)`` (Figurnov et al., 2018), summed back to each
    parameter's shape. ``sample`` is stopped. ``order=1`` (the default) gives first derivatives and refuses a second;
    ``order=2`` makes second derivatives exact where ``cdf`` has them (Gamma's CDF has none in its concentration
    in TensorFlow and PyTorch).

    Examples:
        Exponential draws, z = −log(1 − u) / rate, whose derivative is −z / rate.

        >>> z = jnp.array([0.5, 2.0])
        >>> cdf = lambda z, rate: 1 - jnp.exp(-rate * z)
        >>> float(jax.grad(lambda rate: implicit_reparameterization(z, cdf, rate).sum())(2.0))   # −(0.5 + 2) / 2
        -1.25
    """
    implicit = _implicit(f"implicit_reparameterization({name_of(cdf)})", cdf, False, solves.ELEMENTWISE, order)
    draws: jax.Array = implicit(_stopped(jnp.asarray(sample)), *params)
    return draws
