"""The helpers and the gradient checker for Keras 3, each the one of the namespace of Keras's backend.

Each states its math once, here; the backend's namespace has the details
(``stopgrad_math.tensorflow``, ``.jax`` or ``.torch``). Arguments that are
keras.Variables are given as their values (``backends.values``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stopgrad_math.keras.backends import namespace, values
from stopgrad_math.shared.gradient_report import GradientReport


def stop_gradient(tree: Any) -> Any:
    """Returns the backend's stop-gradient applied to every leaf of a nest.

    Examples:
        >>> float(stop_gradient(keras.ops.convert_to_tensor(3.0)))
        3.0
    """
    return namespace().stop_gradient(values(tree))


def stop_gradient_where(x: Any, mask: Any) -> Any:
    """Returns x, with its derivative stopped where ``mask`` is true: where(mask, stop(x), x)."""
    return namespace().stop_gradient_where(values(x), values(mask))


def zero_with_gradient(x: Any) -> Any:
    """Returns u = x − stop(x): exactly +0.0 in value, derivative 1 w.r.t. x."""
    return namespace().zero_with_gradient(values(x))


def partial_custom_gradient(f: Callable[..., Any], g: Callable[..., Any], x: Any, *others: Any) -> Any:
    """Returns h = f(x, *others) with dh/dx = g(x, *others), and autodiff for ``others``."""
    return namespace().partial_custom_gradient(f, g, values(x), *values(others))


def straight_through(forward: Any, backward: Any) -> Any:
    """Returns the value of ``forward`` with the derivative of ``backward``: stop(f) + b − stop(b)."""
    return namespace().straight_through(values(forward), values(backward))


def scale_gradient(x: Any, scale: Any) -> Any:
    """Returns x with its derivative multiplied by ``scale``."""
    return namespace().scale_gradient(values(x), values(scale))


def reverse_gradient(x: Any, scale: Any = 1.0) -> Any:
    """Returns x with its derivative multiplied by −scale: a gradient-reversal layer's op.

    Examples:
        >>> float(reverse_gradient(keras.ops.convert_to_tensor(3.0)))
        3.0
    """
    return namespace().reverse_gradient(values(x), values(scale))


def magic_box(tau: Any) -> Any:
    """Returns the DiCE operator: value 1, d magic_box(τ) = magic_box(τ)·dτ at every order."""
    return namespace().magic_box(values(tau))


def check_gradient(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
                   step: float = 6e-6, seed: int = 0) -> GradientReport:
    """Compares fn's derivatives with float64 central differences, with the backend's checker."""
    return namespace().check_gradient(fn, *values(args), rtol=rtol, atol=atol, step=step,  # type: ignore[no-any-return]
                                      seed=seed)


def assert_gradient(fn: Callable[..., Any], *args: Any, **options: Any) -> GradientReport:
    """Raises AssertionError with check_gradient's table unless it passed; returns the report."""
    return namespace().assert_gradient(fn, *values(args), **options)  # type: ignore[no-any-return]
