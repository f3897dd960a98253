"""custom_gradient's arguments, read alike in every namespace.

Which form a call is, and which of a decorated function's arguments are
differentiable: the positional ones; keyword arguments are constants (each namespace
makes a derivative that reaches one raise, naming it), unless every
argument is a keyword: then those that name positional parameters are bound
as positional, as the call ``f(x=1.0)`` means ``f(1.0)``. And the decorated
function's answer: ``call_f`` reads its ``(y, vjp)``, and
``cotangent_of_each_argument`` the VJP's answer, one cotangent (or None) per
positional argument.
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


def owner_of(f: Callable[..., Any]) -> tuple[str, str] | None:
    """(module, qualified name) of the class in whose body f is defined (``Layer.call``, ``Module.forward``), read
    once where f is decorated; None for a function of a module or of another function."""
    owner, _, _ = getattr(f, "__qualname__", "").rpartition(".")
    if not owner or owner.endswith("<locals>"):
        return None
    return getattr(f, "__module__", "") or "", owner


def called_as_a_method(owner: tuple[str, str] | None, args: tuple[Any, ...]) -> bool:
    """Whether a call of a function defined in the body of ``owner`` (``owner_of``) has an instance of that class
    first: a method, whose instance the decorators bind rather than differentiate (a Keras layer's ``call``
    decorated, as ``tf.custom_gradient`` allows)."""
    if owner is None or len(args) == 0:
        return False
    module, qualname = owner
    return any(kind.__qualname__ == qualname and kind.__module__ == module for kind in type(args[0]).__mro__)


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


# What a decorator's guard says where a derivative goes beyond its order (a LookupError in every namespace).
BEYOND_ORDER = {
    1: "A second derivative through {name}, decorated at order=1, would miss the term through its vjp's own "
       "dependence on the arguments (order=1 holds the vjp's Jacobian constant). Decorate it with "
       "custom_gradient(order=2) for exact second derivatives.",
    2: "A third derivative through {name}, decorated at order=2, would miss terms: order=2 is exact to the second "
       "derivative.",
}


def undifferentiable(framework: str, error: BaseException) -> str:
    """What a second derivative raises where ``order=2`` could not run f on the arguments it differentiates (``error``)
    and the call is order 1's: a template of ``{name}``, as ``BEYOND_ORDER``'s."""
    told = f"{type(error).__name__}: {error}".replace("{", "{{").replace("}", "}}")
    return ("A second derivative through {name} would miss the term through its vjp's own dependence on the "
            f"arguments: {framework} could not run {{name}} on arguments it differentiates ({told}), as order=2 "
            "does for it. Its first derivatives are exact, as at order=1: they need none of that.")


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


def name_of(f: Callable[..., Any]) -> str:
    """f's name, for messages."""
    name: str | None = getattr(f, "__name__", None)  # (no repr, no str: Dynamo before torch 2.8 traces neither
    return repr(f) if name is None else name         # on a function made in the compiled code)


def with_values_at(function: Callable[..., Any], values: tuple[Any, ...],
                   positions: tuple[int, ...]) -> Callable[..., Any]:
    """``function(*values)`` as a function of the values at ``positions`` alone (the others as given): what a
    framework's vjp or jvp differentiates where only some arguments are tensors."""

    def of_positions(*replacing: Any) -> Any:
        replaced = list(values)
        for k, value in zip(positions, replacing, strict=True):
            replaced[k] = value
        return function(*replaced)

    return of_positions


def call_f(f: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> tuple[Any, Callable[[Any], Any]]:
    """f's ``(y, vjp)``; TypeError where f returns anything else."""
    result = f(*args, **kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and callable(result[1])):
        raise TypeError(f"{name_of(f)} must return a pair (y, vjp); got {type(result).__name__}.")
    return result[0], result[1]


def cotangent_of_each_argument(result: Any, args: tuple[Any, ...], names: list[str], f: Callable[..., Any],
                               matches: Callable[[Any, Any], bool]) -> list[Any]:
    """vjp's answer as one cotangent nest (or None) per positional argument: a tuple of one per argument, or
    for one argument its cotangent alone. ``matches(argument, answer)``: whether a sequence answer is the one
    argument's cotangent (the argument a container of its structure), as the framework's pytrees tell."""
    sequence = isinstance(result, (tuple, list))
    count = len(args)
    if count == 1:
        if sequence and len(result) == 1:
            return [result[0]]
        if not sequence or matches(args[0], result):
            return [result]
    elif sequence and len(result) == count:
        return list(result)
    got = len(result) if sequence else 1
    raise ValueError(f"The vjp of {name_of(f)} returned {got} cotangent{'s' * (got != 1)} for {count} positional "
                     f"argument{'s' * (count != 1)} ({', '.join(names)}): it returns one per argument, in a tuple "
                     "where there are several (None for no gradient).")
