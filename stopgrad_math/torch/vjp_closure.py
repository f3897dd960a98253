"""A VJP with the tensors it closes over lifted out, for tracing it where they cannot be traced.

Under ``torch.func`` the tensors a VJP closes over are the transforms'
wrappers (a ``BatchedTensor`` under ``vmap``), which ``make_fx`` cannot
trace outside their transform, and inside it would trace them wrongly.
``lifted`` opens the VJP: the tensors in its closure and its defaults (in
tuples, lists and dicts, in the functions it closes over and in the
attributes of plain objects it holds (a Function's ctx), two levels deep)
become a list, and ``rebuild(tensors)`` makes the same VJP over
others, here plain stand-ins of the same shapes and dtypes. What it cannot
open (a global, a torch object's attributes) stays as it is; a VJP that reads a
wrapped tensor that way is found when it is traced.

``keyed`` opens it the stricter way of ``shared.closure_key``, for the eager
decorator's proofs, made once per key: a tensor keyed by its shape, strides,
dtype, device and layout, and none taken from a global or a module's attribute
(a tensor can change in place), so that what a key cannot capture is traced
anew at every call; with ``floats``, a Python float there is passed in
beside the tensors, keyed by its type alone.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import types
from collections.abc import Callable, Hashable
from typing import Any

import torch

from stopgrad_math.shared import closure_key

DEPTH = 2  # how many levels of functions in a closure are opened

Rebuild = Callable[[list[torch.Tensor]], Any]


@dataclasses.dataclass(frozen=True)
class Lifted:
    """A VJP's closed-over tensors, and ``rebuild(tensors)``: the VJP over others of their shapes. ``pytorchs``:
    the functions of PyTorch's that it closes over and that hold tensors (``torch.func.vjp``'s pullback), left
    as they are: what they compute with their tensors is the graph recorded when those were made, which a
    stand-in has not."""

    tensors: list[torch.Tensor]
    rebuild: Rebuild
    pytorchs: list[str] = dataclasses.field(default_factory=list)


def lifted(vjp: Callable[..., Any]) -> Lifted | None:
    """The VJP opened, or None where it is not a plain function (a ``functools.partial``, a callable object)."""
    if not isinstance(vjp, types.FunctionType):
        return None
    found = Lifted([], lambda new: None)
    return dataclasses.replace(found, rebuild=_function(vjp, DEPTH, found))


def _function(fn: types.FunctionType, depth: int, found: Lifted) -> Rebuild:
    cells = [_cell(cell, depth, found) for cell in fn.__closure__ or ()]
    defaults = [_value(v, depth, found) for v in fn.__defaults__ or ()]

    def rebuild(new: list[torch.Tensor]) -> types.FunctionType:
        closure = tuple(build(new) for build in cells) or None
        made = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                  tuple(build(new) for build in defaults) or None, closure)
        made.__kwdefaults__ = fn.__kwdefaults__
        return made

    return rebuild


def _value(value: Any, depth: int, found: Lifted) -> Rebuild:
    if isinstance(value, torch.Tensor):
        index = len(found.tensors)
        found.tensors.append(value)
        return lambda new: new[index]
    if type(value) in (tuple, list):
        parts = [_value(v, depth, found) for v in value]
        return lambda new: type(value)(build(new) for build in parts)
    if type(value) is dict:
        items = {k: _value(v, depth, found) for k, v in value.items()}
        return lambda new: {k: build(new) for k, build in items.items()}
    if isinstance(value, types.FunctionType) and value.__code__.co_filename.startswith(_TORCH):
        if _holds_tensors(value):
            found.pytorchs.append(value.__qualname__)
        return lambda new: value
    if isinstance(value, types.FunctionType) and depth > 0:
        return _function(value, depth - 1, found)
    if _is_plain_object(value) and depth > 0:
        return _object(value, depth - 1, found)
    return lambda new: value


_TORCH = os.path.dirname(torch.__file__)


def _holds_tensors(fn: types.FunctionType) -> bool:
    """Whether a function's closure holds a tensor, alone or in a tuple or list (one level)."""
    held = []
    for cell in fn.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    return any(isinstance(v, torch.Tensor) for value in held
               for v in (value if type(value) in (tuple, list) else (value,)))


def _is_plain_object(value: Any) -> bool:
    """An instance of a user's class that keeps its state in ``__dict__`` (a Function's ctx, a small record): not a
    module, a class, a function, nor one of torch's own objects (a Module's parameters are its own business)."""
    kind = type(value)
    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                                                  types.MethodType))
            and not kind.__module__.startswith("torch") and kind.__module__ != "builtins")


def _object(value: Any, depth: int, found: Lifted) -> Rebuild:
    """An object whose attributes hold tensors: rebuilt as a shallow copy with those attributes rebuilt."""
    attributes = {name: _value(v, depth, found) for name, v in vars(value).items()}
    if len(found.tensors) == 0 or not any(isinstance(v, (torch.Tensor, tuple, list, dict))
                                          for v in vars(value).values()):
        return lambda new: value

    def rebuild(new: list[torch.Tensor]) -> Any:
        made = copy.copy(value)
        for name, build in attributes.items():
            setattr(made, name, build(new))
        return made

    return rebuild


def _cell(cell: Any, depth: int, found: Lifted) -> Callable[[list[torch.Tensor]], Any]:
    try:
        contents = cell.cell_contents
    except ValueError:  # a cell not yet filled (a name assigned after the VJP is made): kept as it is
        return lambda new: cell
    build = _value(contents, depth, found)
    return lambda new: types.CellType(build(new))


def tensor_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What a graph traced on a stand-in of the tensor depends on: its shape, strides, dtype, device and layout."""
    return "tensor", tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device, tensor.layout


def strided_stand_in(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A maker of an uninitialized tensor of the tensor's ``tensor_key``, read now (under vmap, one sample's)."""
    shape, stride, dtype, device = tensor.shape, tensor.stride(), tensor.dtype, tensor.device
    return lambda: torch.empty_strided(shape, stride, dtype=dtype, device=device)


_CONSTANTS = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
_TENSORS = closure_key.Arrays(lambda value: isinstance(value, torch.Tensor), tensor_key, lambda value: False,
                              _CONSTANTS)


def _float_or_tensor_key(value: Any) -> Hashable:
    return ("number", float) if type(value) is float else _TENSORS.key(value)  # (a tensor keyed as ``_TENSORS``)


_TENSORS_AND_FLOATS = closure_key.Arrays(lambda value: type(value) is float or isinstance(value, torch.Tensor),
                                         _float_or_tensor_key, lambda value: False, _CONSTANTS)


def keyed(vjp: Callable[..., Any], floats: bool = False) -> closure_key.Opened | None:
    """The VJP as a key and its closed-over tensors (``shared.closure_key``); None where it holds something a key
    cannot capture (a list, an object, a tensor read from a global), and is traced at every call. ``floats``: the
    Python floats in its closure and defaults are among the arrays too, keyed by their type alone (a learning rate
    that changes at every call), for a proof that takes each as a symbol; else each is in the key by value."""
    return closure_key.opened(vjp, _TENSORS_AND_FLOATS if floats else _TENSORS)


def sparse_read(vjp: Any) -> str | None:
    """The name by which the VJP reads a tensor of a sparse layout (a cell of its closure, a default, a global its
    code names, or a tuple, list or dict held there), where it reads one; None otherwise. PyTorch's fake tensors
    have no sparse layouts, so such a VJP cannot be traced into ATen ops."""
    if not isinstance(vjp, types.FunctionType):
        return None
    named: list[tuple[str, Any]] = []
    for name, cell in zip(vjp.__code__.co_freevars, vjp.__closure__ or (), strict=True):
        try:
            named.append((name, cell.cell_contents))
        except ValueError:  # a cell not yet filled
            continue
    named += [(f"a default ({k})", v) for k, v in enumerate(vjp.__defaults__ or ())]
    named += [(name, vjp.__globals__[name]) for name in vjp.__code__.co_names if name in vjp.__globals__]
    for name, value in named:
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in _held(value)):
            return name
    return None


def _held(value: Any) -> list[Any]:
    """The value, or the items of a tuple, list or dict (one level)."""
    if type(value) in (tuple, list):
        return list(value)
    if type(value) is dict:
        return list(value.values())
    return [value]
