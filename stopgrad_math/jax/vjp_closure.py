"""A VJP's closure opened: the arrays it closes over as arguments, everything else as a key.

The decorator traces a VJP into a jaxpr, proves it linear and transposes
it. What that work gives depends on the VJP's code, on what its closure and
its defaults hold, on the globals its code reads, and on the shapes and
dtypes of the arrays among them; the arrays' values enter the computation
only as inputs. ``opened`` splits a VJP into those two parts: a key of
everything but the arrays, and the arrays themselves, with a ``rebuild`` that
makes the same VJP over other arrays of those shapes (tracers of a compiled
embedding). Two VJPs with one key are one computation of their arrays, so the
decorator compiles the embedding once per key and passes the arrays in.

What is in the key, and so makes a new compilation when it changes: the code;
each value in the closure and the defaults that is a Python number, string,
tuple or ``None`` (by value), a module, class or builtin (by identity), or a
nested function (opened in turn, two levels deep); each array's shape, dtype
and weak type; and every global the code may read, by value where it is a
number or string, by identity where it is a class, builtin or JAX array
(immutable), by code, closure and globals where it is a function, and a
module with its attributes of the names the code reads (``jnp.exp``,
``jax.nn.sigmoid``, a float a module holds), so that reassigning one between
calls makes another key.

Refused, so that the decorator traces the VJP anew at every call as before:
a VJP whose closure holds anything mutable or opaque (a list, a dict, an
object whose attributes it may read), one whose code assigns to its closure
or to a global, one that reads a NumPy array from a global (mutable in place)
or a global of another kind, and a callable that is not a plain function (a
``functools.partial``, the ``Partial`` that ``jax.vjp`` returns).
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

from stopgrad_math.shared.function_identity import same

_BY_VALUE = (type(None), bool, int, float, complex, str, bytes)
_BY_IDENTITY = (types.ModuleType, type, types.BuiltinFunctionType)
_STORES = frozenset({"STORE_DEREF", "DELETE_DEREF", "STORE_GLOBAL", "DELETE_GLOBAL"})
DEPTH = 2  # how many levels of functions in a closure, or read from globals, are opened

Rebuild = Callable[[list[Any]], Any]


class _Refused(Exception):
    """The VJP holds something whose effect on its jaxpr a key cannot capture."""


@dataclasses.dataclass(frozen=True)
class Opened:
    """A VJP as a key and the arrays its closure holds; ``rebuild(arrays)`` is the VJP over other arrays."""

    key: Hashable
    arrays: list[Any]
    rebuild: Rebuild


def opened(vjp: Callable[..., Any]) -> Opened | None:
    """The VJP opened, or None where it holds something a key cannot capture."""
    opening = _Opening()
    try:
        key, rebuild = opening.function(vjp, DEPTH)
    except _Refused:
        return None
    return Opened(key, opening.arrays, rebuild)


def aval_key(array: Any) -> Hashable:
    """An array by what a compilation depends on: its shape, dtype and weak type."""
    return "array", tuple(np.shape(array)), np.dtype(array.dtype), bool(getattr(array, "weak_type", False))


@functools.lru_cache(maxsize=1024)
def _code_facts(code: types.CodeType) -> tuple[frozenset[str], bool]:
    """The names the code (with the code nested in it) may read as globals, and whether it assigns to its closure
    or to a global."""
    names = set(code.co_names)
    stores = any(instruction.opname in _STORES for instruction in dis.get_instructions(code))
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            nested_names, nested_stores = _code_facts(constant)
            names |= nested_names
            stores = stores or nested_stores
    return frozenset(names), stores


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


class _Opening:
    """Collects the arrays of one VJP's closure, in the order its ``rebuild`` reads them."""

    def __init__(self) -> None:
        self.arrays: list[Any] = []

    def function(self, fn: Any, depth: int) -> tuple[Hashable, Rebuild]:
        if not isinstance(fn, types.FunctionType) or depth < 0:
            raise _Refused
        code = fn.__code__
        names, stores = _code_facts(code)
        if stores:
            raise _Refused
        cells = [self.value(_contents(cell), depth) for cell in fn.__closure__ or ()]
        defaults = [self.value(v, depth) for v in fn.__defaults__ or ()]
        kwdefaults = {k: self.value(v, depth) for k, v in (fn.__kwdefaults__ or {}).items()}
        key = (code, tuple(k for k, _ in cells), tuple(k for k, _ in defaults),
               tuple((name, k) for name, (k, _) in sorted(kwdefaults.items())), _globals_key(fn, names, depth))
        namespace, name = fn.__globals__, fn.__name__

        def rebuild(arrays: list[Any]) -> types.FunctionType:
            closure = tuple(types.CellType(build(arrays)) for _, build in cells) or None
            made = types.FunctionType(code, namespace, name, tuple(build(arrays) for _, build in defaults) or None,
                                      closure)
            made.__kwdefaults__ = {k: build(arrays) for k, (_, build) in kwdefaults.items()} or None
            return made

        return key, rebuild

    def value(self, value: Any, depth: int) -> tuple[Hashable, Rebuild]:
        if type(value) in _BY_VALUE:
            return (type(value), value), lambda arrays: value
        if _is_array(value):
            index = len(self.arrays)
            self.arrays.append(value)
            return aval_key(value), lambda arrays: arrays[index]
        if type(value) is tuple:
            parts = [self.value(v, depth) for v in value]
            return (tuple, tuple(k for k, _ in parts)), lambda arrays: tuple(build(arrays) for _, build in parts)
        if isinstance(value, _BY_IDENTITY):
            return same(value), lambda arrays: value
        if isinstance(value, types.FunctionType):
            key, build = self.function(value, depth - 1)
            return ("function", key), build
        raise _Refused


def _global_key(value: Any, depth: int, names: frozenset[str]) -> Hashable:
    """A global the VJP reads, which the trace takes as it is: by value, by identity where it cannot change, a
    module with the attributes of it that the code may read (``names``), or a function by its code, closure and
    globals in turn."""
    if type(value) in _BY_VALUE:
        return type(value), value
    if isinstance(value, types.ModuleType):
        return same(value), _attributes(value, depth - 1, names)
    if isinstance(value, _BY_IDENTITY) or (isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)):
        return same(value)
    if type(value) is tuple:
        return tuple, tuple(_global_key(v, depth, names) for v in value)
    if isinstance(value, types.FunctionType) and depth > 0:
        return _function_key(value, depth - 1)
    raise _Refused


def _attribute_key(value: Any, depth: int, names: frozenset[str]) -> Hashable:
    """A module's attribute the code may read (``jnp.exp``, ``jax.nn``): reassigning it makes another key. A module
    is followed ``depth`` levels; anything else is taken by value or by identity."""
    if type(value) in _BY_VALUE:
        return type(value), value
    if isinstance(value, types.ModuleType) and depth > 0:
        return same(value), _attributes(value, depth - 1, names)
    return same(value)


def _attributes(module: types.ModuleType, depth: int, names: frozenset[str]) -> Hashable:
    """The module's attributes of the names the code reads, each by ``_attribute_key``."""
    return tuple((name, _attribute_key(getattr(module, name), depth, names))
                 for name in sorted(names) if hasattr(module, name))


def _function_key(fn: types.FunctionType, depth: int) -> Hashable:
    names, stores = _code_facts(fn.__code__)
    if stores:
        raise _Refused
    cells = tuple(_global_key(_contents(cell), depth, names) for cell in fn.__closure__ or ())
    defaults = tuple(_global_key(v, depth, names) for v in fn.__defaults__ or ())
    return fn.__code__, cells, defaults, _globals_key(fn, names, depth)


def _globals_key(fn: types.FunctionType, names: frozenset[str], depth: int) -> Hashable:
    """The globals of ``fn`` that its code may read; a name it does not define (a builtin, an attribute's name)
    as absent, so that defining it later makes another key."""
    namespace = fn.__globals__
    return tuple((name, _global_key(namespace[name], depth, names)) if name in namespace else (name,)
                 for name in sorted(names))


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        raise _Refused from None
