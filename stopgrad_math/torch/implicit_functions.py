"""Implicit functions in PyTorch: a solver's result with the implicit function theorem's derivative, in every mode.

A root z of ``F(z, θ) = 0`` moves as ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ``. Its VJP,

    θ̄ = −(∂_θ F)ᵀ u,   (∂_z F)ᵀ u = z̄,

is linear in z̄, so the decorator embeds it, and ``forward_ad``,
``torch.func`` and ``torch.compile`` come from its transpose; the solver runs
on detached tensors and is never differentiated. At ``order=2`` the VJP reads
z moved with θ at first order, ``z − (p − stop(p))`` with
``p = (∂_z F)⁻¹ ∂_θ F · (θ − stop(θ))`` (exactly z in value), so a second
derivative through the root (a Hessian of an outer loss) is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from stopgrad_math.shared.arguments import name_of, with_values_at
from stopgrad_math.torch import decorator_form, identity, solves
from stopgrad_math.torch.solves import Solve


def _is_differentiable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and identity.is_inexact(value.dtype)


def _stopped(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _negated(gradient: torch.Tensor) -> torch.Tensor:
    return -gradient


def _residual(fun: Callable[..., Any], fixed_point: bool, params: tuple[Any, ...]) -> Callable[[Any], Any]:
    """z ↦ F(z, *params): ``fun`` itself, or ``fun(z, *params) − z`` for a fixed point."""
    if fixed_point:
        return lambda z: fun(z, *params) - z
    return lambda z: fun(z, *params)


def _moving(fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None, z: torch.Tensor,
            params: tuple[Any, ...]) -> torch.Tensor:
    """z with its first-order derivative in the params: ``z − (p − stop(p))``, p = (∂_z F)⁻¹ ∂_θ F·(θ − stop(θ)),
    its parts at stopped values (so its own derivative is not F's second; order 2 refuses a third)."""
    tensors = tuple(k for k, p in enumerate(params) if _is_differentiable(p))
    stopped = tuple(_stopped(p) for p in params)
    zeros = tuple(params[k] - stopped[k] for k in tensors)
    moved = solves.forward_product(with_values_at(lambda *ps: _residual(fun, fixed_point, ps)(z), stopped, tensors),
                                   tuple(stopped[k] for k in tensors), zeros)
    p = solves.forward(_residual(fun, fixed_point, stopped), z, moved, solve)
    return identity.attach(z, [identity.zero_with_derivative_of(p, [], linked=False)])


def _root(solution: torch.Tensor, *params: Any, fun: Callable[..., Any], fixed_point: bool,
          solve: Solve | str | None, order: int) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """``(solution, vjp)``: the implicit derivative of ``F(solution, *params) = 0``; None for the solution (detached)
    and for a param that is not a floating tensor."""
    tensors = tuple(k for k, p in enumerate(params) if _is_differentiable(p))  # (a tuple: the VJP's key reads it)

    def vjp(cotangent: torch.Tensor) -> tuple[Any, ...]:
        z = _moving(fun, fixed_point, solve, solution, params) if order == 2 else solution
        u = solves.transposed(_residual(fun, fixed_point, params), z, cotangent, solve)
        of_params = with_values_at(lambda *ps: _residual(fun, fixed_point, ps)(z), params, tensors)
        gradients = torch.func.vjp(of_params, *(params[k] for k in tensors))[1](u)
        cotangents: list[Any] = [None] * len(params)
        for k, gradient in zip(tensors, gradients, strict=True):
            cotangents[k] = _negated(gradient)
        return (None, *cotangents)

    return solution, vjp


def _implicit(name: str, fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None,
              order: int) -> Callable[..., Any]:
    """``(solution, *params) ↦ solution``, decorated at ``order`` with the implicit derivative, named for messages.
    It closes over ``fun``, so that a compiled call reaches the tensors ``fun`` closes over by name."""

    def implicit(solution: torch.Tensor, *params: Any) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
        return _root(solution, *params, fun=fun, fixed_point=fixed_point, solve=solve, order=order)

    implicit.__name__ = implicit.__qualname__ = name
    return decorator_form.decorate(implicit, order)


def _solved(solver: Callable[..., Any], fun: Callable[..., Any], fixed_point: bool, solve: Solve | None,
            order: int, kind: str) -> Callable[..., Any]:
    implicit = _implicit(f"{kind}({name_of(solver)})", fun, fixed_point, solve, order)

    @functools.wraps(solver)
    def solved(init: Any, *params: Any) -> Any:
        with torch.no_grad():
            solution = solver(_stopped(init), *(_stopped(p) for p in params))
        return implicit(_stopped(solution), *params)

    return solved


def custom_root(optimality_fun: Callable[..., Any], solve: Solve | None = None, *,
                order: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a solver: its root z of ``optimality_fun(z, *params) = 0``, with the implicit derivative.

    ``custom_root(optimality_fun, solve)(solver)`` is ``(init, *params) ↦ z``:
    the value is ``solver(init, *params)`` run on detached inputs under
    ``no_grad`` (NumPy or a loop eagerly), never differentiated; the
    derivative in ``params`` (tensors; z a tensor) is
    ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ`` under ``backward``, ``forward_ad``,
    ``torch.func`` and ``torch.compile``. ``init`` gets none.
    ``solve=None`` forms ``∂_z F`` densely; a ``solve(matvec, b)`` is handed
    whichever operator (reverse mode the transpose) and must be linear op by
    op. ``order=2``: second derivatives exact; ``order=1``: a second raises.

    Examples:
        Ridge regression's solution, differentiated twice in its regularization.

        >>> X, y = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]]), torch.tensor([1.0, 0.0, 2.0])
        >>> optimality = lambda w, lam: X.T @ (X @ w - y) + lam * w
        >>> @custom_root(optimality)
        ... def ridge(init, lam):
        ...   return torch.linalg.solve(X.T @ X + lam * torch.eye(2), X.T @ y)
        >>> loss = lambda lam: (ridge(torch.zeros(2), lam) ** 2).sum()
        >>> exact = lambda lam: (torch.linalg.solve(X.T @ X + lam * torch.eye(2), X.T @ y) ** 2).sum()
        >>> torch.allclose(torch.func.hessian(loss)(torch.tensor(1.0)), torch.func.hessian(exact)(torch.tensor(1.0)))
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

        >>> W = torch.tensor([[0.3, -0.2], [0.1, 0.4]])
        >>> layer = lambda z, x: torch.tanh(W @ z + x)
        >>> @custom_fixed_point(layer)
        ... def equilibrium(init, x):
        ...   z = init
        ...   for _ in range(100):
        ...     z = layer(z, x)
        ...   return z
        >>> x = torch.tensor([0.5, -1.0])
        >>> z = equilibrium(torch.zeros(2), x)
        >>> J = torch.func.jacfwd(equilibrium, argnums=1)(torch.zeros(2), x)   # torchopt's has no forward mode
        >>> D = torch.diag(1 - z ** 2)
        >>> torch.allclose(J, torch.linalg.solve(torch.eye(2) - D @ W, D), atol=1e-6)
        True
    """
    return lambda solver: _solved(solver, fixed_point_fun, True, solve, order, "custom_fixed_point")


def implicit_reparameterization(sample: torch.Tensor, cdf: Callable[..., Any], *params: Any,
                                order: int = 1) -> torch.Tensor:
    """Returns draws ``sample`` with their implicit reparameterization gradient in ``params``.

    For draws ``z = F⁻¹(u; θ)`` of a distribution whose CDF is ``cdf(z, *params)``
    (elementwise; ``params`` broadcast to the draws' shape), the derivative is
    ``dz/dθ = −(∂F/∂θ) / (∂F/∂z)`` (Figurnov et al., 2018), summed back to each
    parameter's shape. ``sample`` is detached. ``order=1`` (the default) gives first derivatives and refuses a second;
    ``order=2`` makes second derivatives exact where ``cdf`` has them (Gamma's CDF has none in its concentration
    in TensorFlow and PyTorch).

    Examples:
        Exponential draws, z = −log(1 − u) / rate, whose derivative is −z / rate.

        >>> z = torch.tensor([0.5, 2.0])
        >>> rate = torch.tensor(2.0, requires_grad=True)
        >>> cdf = lambda z, rate: 1 - torch.exp(-rate * z)
        >>> implicit_reparameterization(z, cdf, rate).sum().backward()
        >>> rate.grad   # −(0.5 + 2) / 2
        tensor(-1.2500)
    """
    implicit = _implicit(f"implicit_reparameterization({name_of(cdf)})", cdf, False, solves.ELEMENTWISE, order)
    draws: torch.Tensor = implicit(_stopped(torch.as_tensor(sample)), *params)
    return draws
