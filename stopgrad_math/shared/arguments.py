"""custom_gradient's arguments, read alike in both namespaces.

Which form a call is, and which of a decorated function's arguments are
differentiable: the positional ones; keyword arguments are constants (each namespace
makes a derivative that reaches one raise, naming it), unless every
argument is a keyword: then those that name positional parameters are bound
as positional, as the call ``f(x=1.0)`` means ``f(1.0)``.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any


def positional(f: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(differentiable positional arguments, constant keyword arguments) of the call ``f(*args, **kwargs)``."""
    if args or not kwargs:
        return args, kwargs
    bound = inspect.signature(f).bind(**kwargs)
    return bound.args, bound.kwargs


def names(f: Callable[..., Any], count: int, by_keyword: bool) -> list[str]:
    """How errors name the ``count`` positional arguments of a call: ``args[k]``, or where the call gave every
    argument by keyword (bound as positional by ``positional``), the parameters' names."""
    if by_keyword:
        return list(inspect.signature(f).parameters)[:count]
    return [f"args[{k}]" for k in range(count)]


def require_gx_and_x(gx: Any, x: Any) -> None:
    """The identity form needs both gx and x: a TypeError saying which is missing, and what the forms are."""
    if x is None or gx is None:
        raise TypeError(
            "custom_gradient takes a function, as @custom_gradient or custom_gradient(f) (the decorator form), "
            "or fx, gx and x, as custom_gradient(fx, gx, x) (the identity form); got fx "
            f"{'without gx and x' if x is None and gx is None else 'without gx' if gx is None else 'without x'}. "
            "For a value with no gradient at all, use stop_gradient(fx)."
        )


def check_options(order: Any, check_linearity: Any) -> None:
    """The decorator's options, checked when they are given (not when the decorated function first runs)."""
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order not in (1, 2):
        raise ValueError(f"order must be 1 or 2; got {order!r}.")
    if not isinstance(check_linearity, bool):
        raise TypeError(f"check_linearity must be True or False; got {check_linearity!r}.")


def decorator_form(fx: Any, gx: Any, x: Any, order: Any, check_linearity: Any,
                   decorate: Callable[..., Callable[..., Any]]) -> Callable[..., Any] | None:
    """What ``custom_gradient(fx, gx, x, order=, check_linearity=)`` is where it is the decorator form
    (``custom_gradient(f)``, or ``custom_gradient(order=2)`` returning a decorator); None for the identity form,
    whose arguments are checked here."""
    if gx is None and x is None:
        if fx is None:
            check_options(order, check_linearity)
            return lambda f: decorate(f, order=order, check_linearity=check_linearity)
        if callable(fx):
            return decorate(fx, order=order, check_linearity=check_linearity)
    if order != 1 or check_linearity:
        raise ValueError("order and check_linearity belong to the decorator form, custom_gradient(f).")
    require_gx_and_x(gx, x)
    return None
