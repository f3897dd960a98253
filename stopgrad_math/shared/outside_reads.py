"""Where a function reads a value from outside its arguments, and a reader of it a compiler can trace.

A compiled graph must read a tensor that f or its VJP takes from outside (a
weight in f's closure, a module's parameter, a global) afresh at each call.
A decorator that traced f on its own finds such a tensor as a constant of its
trace, and knows it only by identity. ``paths`` says where f reaches it: a
cell of f's closure (or of a function held there, ``DEPTH`` levels deep), a
global of f's module that f or such a function reads, or one of f's
arguments; then up to ``DEPTH`` attributes, of the names their code reads or
the members a framework names (a module's parameters, read by the module's own
code, not f's)::

    ("cell", ("w",))    ("cell", ("scale", "w"))    ("global", "W")    ("argument", 0, "weight")
    ("cell", ("self",), "layer", "bias")

``reader(f, paths)`` is a plain function, ``read(*arguments)``, whose closure
is those cells themselves and whose globals are f's: a tracer (Dynamo) inlines
it as it inlines f, and so reads the values at each call and guards them as it
guards f's own reads. A value that no path reaches (an item of a list, a global
of another module) gives None: the caller keeps its other route.
"""

from __future__ import annotations

import keyword
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from stopgrad_math.shared.closure_key import names_read

DEPTH = 2  # functions followed through cells, and attributes followed from a root
Path = tuple[Any, ...]
_NOT_FOLLOWED = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, types.FunctionType,
                 types.BuiltinFunctionType, types.MethodType)
_MISSING = object()


def paths(f: Callable[..., Any], arguments: Sequence[Any], wanted: Sequence[Any],
          is_leaf: Callable[[Any], bool],
          members: Callable[[Any], Iterable[str]] = lambda value: ()) -> list[Path] | None:
    """A path for each of ``wanted`` (by identity), in its order; None where one is not found. ``arguments``: the
    leaves f was called on; ``is_leaf``: a value whose attributes are not followed (an array); ``members``: the
    attribute names a value holds for code that is not f's (a module's parameters, buffers and submodules)."""
    if not wanted:
        return []
    if not isinstance(f, types.FunctionType):
        return None
    roots, names = _roots(f)
    roots += [(("argument", k), value) for k, value in enumerate(arguments) if not is_leaf(value)]
    attributes = sorted(name for name in names if name.isidentifier() and not keyword.iskeyword(name))
    targets = {id(value) for value in wanted}
    found: dict[int, Path] = {}
    for level in range(DEPTH + 1):
        following: list[tuple[Path, Any]] = []
        for path, value in roots:
            if id(value) in targets:
                found.setdefault(id(value), path)
            elif level < DEPTH and not is_leaf(value) and not isinstance(value, _NOT_FOLLOWED):
                named = sorted({*attributes, *(n for n in members(value) if n.isidentifier())})
                following += [((*path, name), child) for name in named
                              if (child := _attribute(value, name)) is not _MISSING]
        roots = following
    if len(found) < len(targets):
        return None
    return [found[id(value)] for value in wanted]


def _roots(f: types.FunctionType) -> tuple[list[tuple[Path, Any]], set[str]]:
    """The cells of f and of the functions they hold (``DEPTH`` deep), and the globals of f's module that those
    functions read, as (path, value); and the names their code reads."""
    roots: list[tuple[Path, Any]] = []
    names: set[str] = set()
    functions: list[tuple[tuple[str, ...], types.FunctionType]] = [((), f)]  # each with its route of cells
    for _ in range(DEPTH + 1):
        following = []
        for route, fn in functions:
            if fn.__globals__ is f.__globals__:  # (a reader has f's globals alone)
                read = names_read(fn.__code__)
                names |= read
                roots += [(("global", name), fn.__globals__[name]) for name in sorted(read)
                          if name not in fn.__code__.co_freevars and name in fn.__globals__]
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
                try:
                    value = cell.cell_contents
                except ValueError:  # a cell not yet filled
                    continue
                roots.append((("cell", (*route, name)), value))
                if isinstance(value, types.FunctionType):
                    following.append(((*route, name), value))
        functions = following
    return roots, names


def _attribute(value: Any, name: str) -> Any:
    """``value.name``, or _MISSING where it has none (or reading it raises: a property that fails)."""
    try:
        return getattr(value, name)
    except Exception:
        return _MISSING


def reader(f: types.FunctionType, found: Sequence[Path]) -> Callable[..., tuple[Any, ...]]:
    """``read(*arguments)``: the values at ``found``, read from f's cells (and those of the functions they hold)
    and f's globals as their code reads them, and from the arguments given."""
    routes = sorted({path[1] for path in found if path[0] == "cell"})
    local = {route: f"cell{k}" for k, route in enumerate(routes)}

    def expression(path: Path) -> str:
        kind, root, *names = path
        head = {"argument": f"arguments[{root}]", "global": root}.get(kind) or local[root]
        return ".".join([head, *names])

    source = (f"def outer({', '.join(local.values())}):\n"
              f"    def read(*arguments):\n"
              f"        return ({''.join(expression(path) + ', ' for path in found)})\n"
              f"    return read\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reads of {f.__qualname__}>", "exec"), namespace)
    code = next(c for c in namespace["outer"].__code__.co_consts if isinstance(c, types.CodeType))
    by_name = {name: _cell(f, route) for route, name in local.items()}
    return types.FunctionType(code, f.__globals__, "read", None, tuple(by_name[n] for n in code.co_freevars) or None)


def _cell(f: types.FunctionType, route: tuple[str, ...]) -> Any:
    """The cell at the end of ``route``: f's cell of its first name, then the cell of each next name in the
    closure of the function the previous one holds."""
    fn: Any = f
    for k, name in enumerate(route):
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        if k == len(route) - 1:
            return cell
        fn = cell.cell_contents
    raise ValueError("an empty route")
