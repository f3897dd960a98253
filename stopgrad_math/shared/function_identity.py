"""When two Python functions are the same function: one code, one closure.

A factory that decorates a new function on every call (TFP's custom-gradient
factory wraps its ``vjp_fwd`` in a fresh ``f_wrapped`` each time) makes
functions that differ by ``id`` and are the same computation. The decorator
asks two questions of a function that ``id`` answers wrongly for them: is its
own grad_fn already running (the rule that ends a recursion such as
erfcx' = 2x·erfcx − 2/√π, or a Bessel function's gradient at order v ± 1),
and has its grad_fn been read before for these input signatures (eager mode's
memo of routes). ``key`` answers both: the code object, and what the closure
holds, compared by value where the value is immutable and by identity
otherwise. Functions in the closure are compared the same way, two levels deep.

A key never takes two different objects for the same: an object compared by
identity is held by a weak reference where it has one (a dead one equals
nothing) and by a strong one otherwise, so its ``id`` cannot be reused while
the key lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

_BY_VALUE = (type(None), bool, int, float, complex, str, bytes, type)
_EMPTY = object()  # a closure cell not yet filled (a function that refers to itself before it is defined)
DEPTH = 2  # how many levels of functions in closures are compared by their code rather than by identity


class same:
    """A value compared by identity."""

    __slots__ = ("_id", "_ref")

    def __init__(self, value: Any):
        self._id = id(value)
        try:
            self._ref: Callable[[], Any] = weakref.ref(value)
        except TypeError:  # no weak references to it (a list, an int subclass): held, so its id stays its own
            self._ref = lambda: value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, same):
            return NotImplemented
        mine = self._ref()
        return mine is not None and mine is other._ref()

    def __hash__(self) -> int:
        return self._id


def key(f: Callable[..., Any], depth: int = DEPTH) -> Hashable:
    """A hashable that is equal for two functions with the same code, closure values and defaults.

    >>> def make(scale):
    ...     return lambda x: scale * x
    >>> key(make(2.0)) == key(make(2.0)) != key(make(3.0))
    True
    """
    code = getattr(f, "__code__", None)
    if code is None or depth < 0:  # a callable object, a builtin: itself
        return same(f)
    cells = tuple(_value_key(_contents(cell), depth - 1) for cell in f.__closure__ or ())
    defaults = _value_key(getattr(f, "__defaults__", None), depth - 1)
    kwdefaults = _value_key(getattr(f, "__kwdefaults__", None), depth - 1)
    return code, cells, defaults, kwdefaults


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _value_key(value: Any, depth: int) -> Hashable:
    if type(value) in _BY_VALUE:
        return type(value), value  # 1, 1.0 and True hash alike and are not the same constant
    if type(value) is tuple:
        return tuple, tuple(_value_key(v, depth) for v in value)
    if type(value) is dict and all(type(k) in _BY_VALUE and type(v) in _BY_VALUE for k, v in value.items()):
        # A dict of constants by its constants: TFP's factory passes the arguments it keeps out of the gradient
        # in a fresh dict at every call. Anything else mutable (a list a grad_fn appends its upstreams to) is
        # compared by identity: its contents change, the function does not.
        return dict, tuple((type(k), k, type(v), v) for k, v in value.items())
    if callable(value) and hasattr(value, "__code__"):
        return key(value, depth)
    return same(value)
