"""Implicit functions for Keras 3, each the one of the namespace of Keras's backend.

A solver's result with the implicit function theorem's derivative,
``dz = −(∂_z F)⁻¹ ∂_θ F · dθ``, in every mode of the backend; written with
``keras.ops`` it runs on each. Arguments that are keras.Variables are given
as their values (``backends.values``). The details, per backend:
``stopgrad_math.tensorflow``, ``.jax`` and ``.torch``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stopgrad_math.keras.backends import namespace, values

Solver = Callable[..., Any]


def _with_values(solved: Solver) -> Solver:
    return lambda init, *params: solved(values(init), *values(params))


def custom_root(optimality_fun: Callable[..., Any], solve: Callable[..., Any] | None = None, *,
                order: int = 2) -> Callable[[Solver], Solver]:
    """Decorates a solver ``(init, *params) ↦ z``: its root of ``optimality_fun(z, *params) = 0``, never
    differentiated, with the implicit derivative in ``params``.

    Examples:
        >>> @custom_root(lambda z, a: z * z - a)
        ... def square_root(init, a):
        ...   return keras.ops.sqrt(a)
        >>> float(square_root(0.0, keras.ops.convert_to_tensor(4.0)))
        2.0
    """
    return lambda solver: _with_values(namespace().custom_root(optimality_fun, solve, order=order)(solver))


def custom_fixed_point(fixed_point_fun: Callable[..., Any], solve: Callable[..., Any] | None = None, *,
                       order: int = 2) -> Callable[[Solver], Solver]:
    """Decorates a solver ``(init, *params) ↦ z``: its fixed point ``z = fixed_point_fun(z, *params)``, never
    differentiated, with the implicit derivative in ``params``."""
    return lambda solver: _with_values(namespace().custom_fixed_point(fixed_point_fun, solve, order=order)(solver))


def implicit_reparameterization(sample: Any, cdf: Callable[..., Any], *params: Any, order: int = 1) -> Any:
    """Returns draws ``sample`` with their implicit reparameterization gradient in ``params``:
    dz/dθ = −(∂F/∂θ) / (∂F/∂z) of the elementwise CDF ``cdf(z, *params)``."""
    return namespace().implicit_reparameterization(values(sample), cdf, *values(params), order=order)
