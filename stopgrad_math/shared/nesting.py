"""Decorated calls inside a VJP, alike in the JAX and PyTorch namespaces.

A VJP may call decorated functions, its own f among them (erfcx' = 2x·erfcx
− 2/√π). While a decorator evaluates the VJP of an embedding of order k
(``evaluating(k)``), a decorated call inside it returns its value alone at
k = 1 (everything there is stopped, and a recursion ends), and embeds at
order 1 without a guard at k = 2 (its arguments move with x, at first
order), so a recursion is two deep. ``decorated`` is the function each
namespace's decorator returns, on its own ``embed``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from stopgrad_math.shared import arguments


class _Evaluations(threading.local):
    """The orders being evaluated, innermost last, per thread: a list on a threading.local rather than a ContextVar
    or a generator context manager, since Dynamo (torch.compile) traces reading and changing it, and neither of
    those."""

    def __init__(self) -> None:
        self.orders: list[int] = []


_EVALUATIONS = _Evaluations()


def _evaluations() -> list[int]:
    return _EVALUATIONS.orders


class evaluating:  # a context manager, named as the contextlib ones are
    """The VJP of an embedding of ``order`` is being evaluated (traced, or applied) within."""

    def __init__(self, order: int):
        self.order = order

    def __enter__(self) -> None:
        _evaluations().append(self.order)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        _evaluations().pop()


class Embed(Protocol):
    def __call__(self, f: Callable[..., Any], args: tuple[Any, ...], names: list[str], kwargs: dict[str, Any],
                 order: int, guard: bool, fallback: Callable[[str], Any] | None = None) -> Any: ...


def _keywords_as_given(f: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    return kwargs


def call(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int, embed: Embed,
         keywords: Callable[[Callable[..., Any], dict[str, Any]], dict[str, Any]] = _keywords_as_given,
         fallback: Callable[[str], Any] | None = None) -> Any:
    """One call of f, decorated: its positional arguments read (``shared.arguments``), its keyword arguments
    passed through ``keywords``, and the call embedded by ``embed`` at ``order`` (or as a nested call inside a VJP,
    which takes its value alone at order 1); ``fallback(reason)`` is its value where the VJP cannot be embedded."""
    by_keyword = len(args) == 0 and len(kwargs) > 0  # (Dynamo traces no `not` of a tuple)
    args, kwargs = arguments.positional(f, args, kwargs)
    names = arguments.names(f, len(args), by_keyword)
    kwargs = keywords(f, kwargs)
    orders = _evaluations()
    inside = orders[-1] if len(orders) > 0 else None
    if inside == 1:
        return arguments.call_f(f, args, kwargs)[0]
    if inside == 2:
        return embed(f, args, names, kwargs, order=1, guard=False, fallback=fallback)
    return embed(f, args, names, kwargs, order=order, guard=True, fallback=fallback)


def decorated(f: Callable[..., Any], order: int, embed: Embed,
              keywords: Callable[[Callable[..., Any], dict[str, Any]], dict[str, Any]] = _keywords_as_given,
              ) -> Callable[..., Any]:
    """f, decorated: each call is ``call`` of f; where f is defined in a class body and called on an instance, the
    instance is bound, not an argument whose cotangent the VJP gives."""

    owner = arguments.owner_of(f)
    method = None if owner is None else _method(f)

    @functools.wraps(f)
    def decorated_f(*args: Any, **kwargs: Any) -> Any:
        if method is not None and arguments.called_as_a_method(owner, args):
            return call(method, args, kwargs, order, embed, keywords)
        return call(f, args, kwargs, order, embed, keywords)

    decorated_f.undecorated = f  # type: ignore[attr-defined]
    return decorated_f


def _method(f: Callable[..., Any]) -> Callable[..., Any]:
    """f called as a method: its instance is an argument like any other to the decorator, and its VJP, which
    returns the cotangents of the arguments after the instance (as ``tf.custom_gradient`` binds a method), gives
    None first for the instance; a VJP that gives that None itself (as a method's had to) is taken as it is. Made
    where f is decorated, so that a compiled call meets a function, not one it makes."""

    @functools.wraps(f)
    def method(instance: Any, *args: Any, **kwargs: Any) -> Any:
        y, vjp = arguments.call_f(f, (instance, *args), kwargs)
        count = len(args)

        def vjp_of_the_arguments(ct: Any) -> Any:
            answer = vjp(ct)  # one cotangent per argument in a tuple, or the one argument's alone
            if type(answer) is tuple and len(answer) == count + 1 and answer[0] is None:
                return answer  # the instance's None given too, as the decorators took a method before
            return (None, *answer) if type(answer) is tuple and len(answer) == count else (None, answer)

        return y, vjp_of_the_arguments

    return method
