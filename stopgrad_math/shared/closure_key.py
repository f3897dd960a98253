"""A VJP's closure opened: the arrays it closes over as arguments, everything else as a key.

The decorators trace a VJP, prove it linear and transpose it. What that
work gives depends on the VJP's code, on what its closure and its defaults
hold, on the globals its code reads, and on the shapes and dtypes of the
arrays among them; the arrays' values enter the computation only as inputs.
``opened`` splits a VJP into those two parts: a key of everything but the
arrays, and the arrays themselves, with a ``rebuild`` that makes the same VJP
over other arrays of those shapes. Two VJPs with one key are one computation
of their arrays, so a decorator does that work once per key and passes the
arrays in. What an array is, and what of it enters the key, each framework
says (``Arrays``).

What is in the key, and so makes new work when it changes: the code; each
value in the closure and the defaults that is a Python number, string, tuple
or ``None`` (by value, unless the framework passes it in as an array), a builtin (by identity), a module or class (by
identity, with its attributes of the names the code reads), or a nested
function (opened in turn, two levels deep); each array's ``Arrays.key``; and
every global the code may read, by value where it is a number or string, by
identity where it is a builtin, an array the framework calls immutable or a
library's function, by code, closure and globals where it is another
function, and a module or class with its attributes of the names the code reads (``jnp.exp``, ``torch.exp``, a
float a module or a class holds; a function of the user's own code there is
opened as a global function is, a library's taken by identity), so that
reassigning one between calls makes another key.

A nested function's part of a key (a helper, a Function's backward, with the globals and module attributes it
reads) is remembered with every read it was made of: a cell's contents, a global, an attribute, a function's code
and defaults. At the next call the reads are made again, and where each gives the very object it gave, the
remembered part is the key's; where one does not (a global rebound, a cell reassigned), the function is opened
anew. Only a part that holds no array is remembered (its arrays are the call's).

Refused (None), so that the decorator traces the VJP anew at every call: a
VJP whose closure holds anything mutable or opaque (a list, a dict, an object
whose attributes it may read), one whose code assigns to its closure or to a
global, one that reads a mutable array (NumPy's, PyTorch's) from a global or
a global of another kind, and a callable that is not a plain function (a
``functools.partial``, the ``Partial`` that ``jax.vjp`` returns).
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import os
import sysconfig
import types
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from stopgrad_math.shared.bounded_cache import BoundedCache
from stopgrad_math.shared.function_identity import same

_BY_VALUE = (type(None), bool, int, float, complex, str, bytes)
_NEVER_ARRAYS = frozenset({type(None), bool, int, str, bytes})  # (a shape, an axis, a count, a name: by value)
_BY_IDENTITY = (types.ModuleType, type, types.BuiltinFunctionType)
_STORES = frozenset({"STORE_DEREF", "DELETE_DEREF", "STORE_GLOBAL", "DELETE_GLOBAL"})
DEPTH = 2  # how many levels of functions in a closure, or read from globals, are opened
_ABSENT = object()
_ITSELF = "the module itself"

Rebuild = Callable[[list[Any]], Any]


@dataclasses.dataclass(frozen=True)
class Arrays:
    """A framework's arrays: which closed-over values are passed in (``is_array``: never a bool, int, str, bytes or
    None, which are keyed by value, nor a tuple; a float or complex may be), what of one a traced
    computation depends on (``key``: its shape, dtype...), and which read from a global may be taken by identity
    because nothing can change it in place (``is_immutable``); and its immutable values taken by value
    (``constants``)."""

    is_array: Callable[[Any], bool]
    key: Callable[[Any], Hashable]
    is_immutable: Callable[[Any], bool]
    constants: tuple[type, ...] = ()  # the framework's immutable values, keyed by value (a dtype, a device)


@dataclasses.dataclass(frozen=True)
class Opened:
    """A VJP as a key and the arrays its closure holds; ``rebuild(arrays)`` is the VJP over other arrays."""

    key: Hashable
    arrays: list[Any]
    rebuild: Rebuild


class _Refused(Exception):
    """The VJP holds something whose effect on its trace a key cannot capture."""


def opened(vjp: Callable[..., Any], arrays: Arrays) -> Opened | None:
    """The VJP opened, or None where it holds something a key cannot capture."""
    opening = _Opening(arrays)
    if not isinstance(vjp, types.FunctionType):
        return None
    try:
        key, rebuild = opening._function(vjp, DEPTH)  # (not remembered: a VJP is made anew at each call)
    except _Refused:
        return None
    return Opened(key, opening.found, rebuild)


@functools.lru_cache(maxsize=1024)
def _code_facts(code: types.CodeType) -> tuple[tuple[str, ...], bool]:
    """The names the code (with the code nested in it) may read as globals, sorted (the order of a key), and
    whether it assigns to a global or to its closure (a ``nonlocal`` of a name it closes over; assigning the cells
    it makes for the functions it defines, as f does for its VJP, is its own business)."""
    names, stores_global, stored_free = _facts(code)
    return tuple(sorted(names)), stores_global or bool(stored_free)


def names_read(code: types.CodeType) -> frozenset[str]:
    """The names the code (with the code nested in it) may read as globals or as attributes."""
    return frozenset(_code_facts(code)[0])


def _facts(code: types.CodeType) -> tuple[frozenset[str], bool, frozenset[str]]:
    """names read as globals, whether a global is assigned, and which of the code's free variables are assigned
    (by it, or by the code nested in it)"""
    names = set(code.co_names)
    stores_global, stored = False, set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in _STORES:
            if instruction.opname.endswith("GLOBAL"):
                stores_global = True
            else:
                stored.add(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            nested_names, nested_global, nested_stored = _facts(constant)
            names |= nested_names
            stores_global = stores_global or nested_global
            stored |= nested_stored
    return frozenset(names), stores_global, frozenset(stored & set(code.co_freevars))


_CELL, _ITEM, _ATTRIBUTE = "cell", "item", "attribute"
Read = tuple[str, Any, str, Any]  # (kind, where, name, what it gave): a cell's contents, a mapping's item, an attribute


def _read(kind: str, where: Any, name: str) -> Any:
    if kind is _ITEM:
        return where.get(name, _ABSENT)
    if kind is _ATTRIBUTE:
        return getattr(where, name, _ABSENT)
    return where.cell_contents


def _unchanged(reads: tuple[Read, ...]) -> bool:
    """Whether each read gives the very object it gave when it was recorded (``_read``, inlined: this is the key's
    cost at every call)."""
    for kind, where, name, seen in reads:
        if kind is _ITEM:
            now = where.get(name, _ABSENT)
        elif kind is _ATTRIBUTE:
            now = getattr(where, name, _ABSENT)
        else:
            try:
                now = where.cell_contents
            except ValueError:  # a cell emptied since
                return False
        if now is not seen:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class _Remembered:
    """A nested function's part of a key, and the reads it was made of."""

    reads: tuple[Read, ...]
    made: Any


Made = TypeVar("Made")

PARTS_KEPT = 256
_PARTS: BoundedCache[_Remembered] = BoundedCache(PARTS_KEPT)


class _Opening:
    """Collects the arrays of one VJP's closure, in the order its ``rebuild`` reads them, and the reads a key is
    made of."""

    def __init__(self, arrays: Arrays) -> None:
        self.arrays = arrays
        self.found: list[Any] = []
        self.reads: list[Read] = []

    def read(self, kind: str, where: Any, name: str = "") -> Any:
        seen = _read(kind, where, name)
        self.reads.append((kind, where, name, seen))
        return seen

    def remembered(self, part: str, fn: types.FunctionType, depth: int, make: Callable[[], Made]) -> Made:
        """``make()``, the ``part`` of the key for ``fn``, or what it made before where every read it was made of
        gives the same object now (``_unchanged``) and it found no array."""
        # (a kept part's reads hold fn, so its id is its own; a framework's Arrays is a constant of its module)
        index = (part, id(fn), depth, id(self.arrays))
        known = _PARTS.get(index)
        if known is not None and _unchanged(known.reads):
            self.reads.extend(known.reads)
            return cast(Made, known.made)
        first, arrays = len(self.reads), len(self.found)
        made = make()
        if len(self.found) == arrays:  # (its arrays are the call's: a part with one is made at every call)
            _PARTS.put(index, _Remembered(tuple(self.reads[first:]), made))
        return made

    def contents(self, cell: Any) -> Any:
        try:
            return self.read(_CELL, cell)
        except ValueError:  # a cell not yet filled
            raise _Refused from None

    def function(self, fn: Any, depth: int) -> tuple[Hashable, Rebuild]:
        if not isinstance(fn, types.FunctionType) or depth < 0:
            raise _Refused
        return self.remembered("function", fn, depth, lambda: self._function(fn, depth))

    def _function(self, fn: types.FunctionType, depth: int) -> tuple[Hashable, Rebuild]:
        code = self.read(_ATTRIBUTE, fn, "__code__")
        names, stores = _code_facts(code)
        if stores:
            raise _Refused
        cells = [self.value(self.contents(cell), depth, names) for cell in fn.__closure__ or ()]
        defaults = [self.value(v, depth, names) for v in self.read(_ATTRIBUTE, fn, "__defaults__") or ()]
        given = self.read(_ATTRIBUTE, fn, "__kwdefaults__") or {}
        kwdefaults = {k: self.value(self.read(_ITEM, given, k), depth, names) for k in sorted(given)}
        key = (code, tuple(k for k, _ in cells), tuple(k for k, _ in defaults),
               tuple((name, k) for name, (k, _) in kwdefaults.items()),
               self.globals_key(fn, names, depth))
        namespace, name = fn.__globals__, fn.__name__

        def rebuild(arrays: list[Any]) -> types.FunctionType:
            closure = tuple(types.CellType(build(arrays)) for _, build in cells) or None
            made = types.FunctionType(code, namespace, name, tuple(build(arrays) for _, build in defaults) or None,
                                      closure)
            made.__kwdefaults__ = {k: build(arrays) for k, (_, build) in kwdefaults.items()} or None
            return made

        return key, rebuild

    def value(self, value: Any, depth: int, names: tuple[str, ...]) -> tuple[Hashable, Rebuild]:
        """A value in the closure or the defaults; ``names``: those the code may read as attributes."""
        kind = type(value)
        if kind in _NEVER_ARRAYS:
            return (kind, value), lambda arrays: value
        if kind is tuple:  # (no framework's array is a tuple)
            parts = [self.value(v, depth, names) for v in value]
            return (tuple, tuple(k for k, _ in parts)), lambda arrays: tuple(build(arrays) for _, build in parts)
        if self.arrays.is_array(value):  # before the numbers: a framework may pass a number in as an operand
            index = len(self.found)
            self.found.append(value)
            return self.arrays.key(value), lambda arrays: arrays[index]
        if kind in _BY_VALUE or kind in self.arrays.constants:
            return (kind, value), lambda arrays: value
        if isinstance(value, _BY_IDENTITY):
            return self.global_key(value, depth, names), lambda arrays: value
        if isinstance(value, types.FunctionType):
            key, build = self.function(value, depth - 1)
            return ("function", key), build
        raise _Refused

    def global_key(self, value: Any, depth: int, names: tuple[str, ...]) -> Hashable:
        """A global the VJP reads, which the trace takes as it is: by value, by identity where it cannot change, a
        module with the attributes of it that the code may read (``names``), or a function by its code, closure
        and globals in turn."""
        if type(value) in _BY_VALUE or type(value) in self.arrays.constants:
            return type(value), value
        if isinstance(value, (types.ModuleType, type)):  # a class attribute can be reassigned as a module's can
            return same(value), self.attributes(value, depth - 1, names)
        if isinstance(value, _BY_IDENTITY) or self.arrays.is_immutable(value):
            return same(value)
        if type(value) is tuple:
            return tuple, tuple(self.global_key(v, depth, names) for v in value)
        if isinstance(value, types.FunctionType) and _library_code(self.read(_ATTRIBUTE, value, "__code__")):
            return same(value)  # (a library's module globals are never rebound: what it reads, it reads as it is)
        if isinstance(value, types.FunctionType) and depth > 0:
            return self.function_key(value, depth - 1)
        raise _Refused

    def attribute_key(self, value: Any, depth: int, names: tuple[str, ...]) -> Hashable:
        """A module's or a class's attribute the code may read (``jnp.exp``, ``torch.nn``, ``Config.scale``):
        reassigning it makes another key. A module or class is followed ``depth`` levels; a function of the
        user's own code (``helpers.scale``) is opened as a global function is, so that a global it reads makes
        another key when it is rebound (refused ``depth`` levels down); a library's function is taken by
        identity; a mutable array or container is refused; anything else is taken by value or by identity."""
        if type(value) in _BY_VALUE or type(value) in self.arrays.constants:
            return type(value), value
        if isinstance(value, (types.ModuleType, type)) and depth > 0:
            return same(value), self.attributes(value, depth - 1, names)
        if isinstance(value, types.FunctionType) and not _library_code(self.read(_ATTRIBUTE, value, "__code__")):
            if depth <= 0:
                raise _Refused  # what it reads further down is out of the key's reach
            return "function", self.function_key(value, depth - 1)
        if isinstance(value, (list, dict, set, bytearray)) or (
                self.arrays.is_array(value) and not self.arrays.is_immutable(value)):
            raise _Refused  # changed in place, it would not change the key
        return same(value)

    def attributes(self, module: types.ModuleType | type, depth: int, names: tuple[str, ...]) -> Hashable:
        """The module's or class's attributes of the names the code reads, each by ``attribute_key``; one that is
        the module itself (``torch.torch``) as such, as its attributes are the module's, in the key already."""
        keys = []
        for name in names:
            value = self.read(_ATTRIBUTE, module, name)
            if value is not _ABSENT:
                keys.append((name, _ITSELF if value is module else self.attribute_key(value, depth, names)))
        return tuple(keys)

    def function_key(self, fn: types.FunctionType, depth: int) -> Hashable:
        return self.remembered("global function", fn, depth, lambda: self._function_key(fn, depth))

    def _function_key(self, fn: types.FunctionType, depth: int) -> Hashable:
        code = self.read(_ATTRIBUTE, fn, "__code__")
        names, stores = _code_facts(code)
        if stores:
            raise _Refused
        cells = tuple(self.global_key(self.contents(cell), depth, names) for cell in fn.__closure__ or ())
        defaults = tuple(self.global_key(v, depth, names) for v in self.read(_ATTRIBUTE, fn, "__defaults__") or ())
        return code, cells, defaults, self.globals_key(fn, names, depth)

    def globals_key(self, fn: types.FunctionType, names: tuple[str, ...], depth: int) -> Hashable:
        """The globals of ``fn`` that its code may read; a name it does not define (a builtin, an attribute's
        name) as absent, so that defining it later makes another key."""
        namespace = fn.__globals__
        keys = []
        for name in names:
            value = self.read(_ITEM, namespace, name)
            keys.append((name,) if value is _ABSENT else (name, self.global_key(value, depth, names)))
        return tuple(keys)


_LIBRARIES = ("<frozen ", *{os.path.join(path, "") for name in ("stdlib", "platstdlib", "purelib", "platlib")
                             if (path := sysconfig.get_paths().get(name))},
              os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ""))
"""The file names of library code: Python's own (frozen modules too), site-packages, and this library itself,
whose module globals no user rebinds between calls, and whose functions a key takes by identity."""


def _library_code(code: types.CodeType) -> bool:
    return code.co_filename.startswith(_LIBRARIES)
