"""The implicit functions' linear solves with the residual's Jacobian in z, in PyTorch.

``(∂_z F)ᵀ u = b`` gives the VJP, ``(∂_z F) p = b`` the first-order motion
of z that ``order=2`` reads. Each is dense (the Jacobian formed), elementwise
(an elementwise residual's diagonal, read in one JVP) or the caller's
``solve(matvec, b)``, handed the operator it solves with, which the
decorator then proves linear op by op as it proves any VJP.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import torch

Solve = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor]
ELEMENTWISE = "elementwise"  # the solve of an elementwise residual (a string: a VJP's closure is keyed by value)


def forward_product(function: Callable[..., torch.Tensor], primals: tuple[torch.Tensor, ...],
                    tangents: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``J·tangents`` of ``function`` at ``primals``, in reverse mode alone: the pullback's own pullback (the
    pullback is linear, so its transpose is J). Forward mode here would nest in a caller's forward_ad level, which
    PyTorch refuses, and its formulas decompose into prims that a trace by shapes cannot run."""
    output, pullback = torch.func.vjp(function, *primals)[:2]
    return typing.cast(torch.Tensor, torch.func.vjp(pullback, torch.zeros_like(output))[1](tuple(tangents))[0])


def _diagonal(residual: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """An elementwise residual's Jacobian's diagonal: its pullback of ones."""
    return typing.cast(torch.Tensor, torch.func.vjp(residual, z)[1](torch.ones_like(z))[0])


def _jacobian(residual: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    return typing.cast(torch.Tensor,
                       torch.func.jacrev(lambda flat: residual(flat.reshape(z.shape)).reshape(-1))(z.reshape(-1)))


def transposed(residual: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, b: torch.Tensor,
               solve: Solve | str | None) -> torch.Tensor:
    """u with ``(∂_z residual)ᵀ u = b`` at ``z``."""
    if solve is None:
        return torch.linalg.solve(_jacobian(residual, z).mT, b.reshape(-1)).reshape(z.shape)  # type: ignore[no-any-return]
    if solve == ELEMENTWISE:
        return b / _diagonal(residual, z)
    pullback = torch.func.vjp(residual, z)[1]
    return _given(solve)(lambda u: pullback(u)[0], b)


def forward(residual: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, b: torch.Tensor,
            solve: Solve | str | None) -> torch.Tensor:
    """p with ``(∂_z residual) p = b`` at ``z``."""
    if solve is None:
        return torch.linalg.solve(_jacobian(residual, z), b.reshape(-1)).reshape(z.shape)  # type: ignore[no-any-return]
    if solve == ELEMENTWISE:
        return b / _diagonal(residual, z)
    return _given(solve)(lambda p: forward_product(residual, (z,), (p,)), b)


def _given(solve: Solve | str) -> Solve:
    if isinstance(solve, str):
        raise ValueError(f"Unknown solve {solve!r}: None, {ELEMENTWISE!r} or a function solve(matvec, b).")
    return solve
