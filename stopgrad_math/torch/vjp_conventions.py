"""How the PyTorch decorator reads what it is given: the leaves of the arguments and of y, and the VJP's answer.

A leaf is differentiable where PyTorch differentiates it (a floating or
complex tensor); anything else, Python numbers included, passes through to
f as it is. Nests are read by ``torch.utils._pytree``, as ``torch.func``
reads them. The VJP's answer is read as in the other namespaces
(``shared.arguments.cotangent_of_each_argument``); ``argument_cotangents``
checks each cotangent against its leaf's structure, shape and kind, or names
what is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from stopgrad_math.shared.arguments import cotangent_of_each_argument, name_of
from stopgrad_math.torch import identity


def is_differentiable(leaf: Any) -> bool:
    """A floating or complex tensor: what PyTorch differentiates."""
    return isinstance(leaf, torch.Tensor) and identity.is_inexact(leaf.dtype)


@dataclasses.dataclass
class Leaves:
    """A nest's leaves, with labels, and which of them are differentiable tensors."""

    labels: list[str]
    values: list[Any]
    structure: Any  # pytree.TreeSpec
    differentiable: list[int]
    layout: tuple[Any, ...] | None = None  # the structure as a key where it is known without hashing the TreeSpec
    given: tuple[Any, ...] | None = None  # the arguments themselves, where they are containers (``with_values``)

    @classmethod
    def of_arguments(cls, args: tuple[Any, ...], names: list[str]) -> Leaves:
        """The leaves of the positional arguments, each labelled by its argument's name and its path in it."""
        layout = _flat_layout(args)
        if layout is not None:  # the common call (a Function's too, its last argument needs_input_grad): no walk
            labels: list[str] = []
            values: list[Any] = []
            for k, argument in enumerate(args):
                if type(argument) is tuple:
                    labels.extend(f"{names[k]}[{j}]" for j in range(len(argument)))
                    values.extend(argument)
                else:
                    labels.append(names[k])
                    values.append(argument)
            structure = _made_structure(layout) if identity.compiling() else _flat_structure(layout)
            return cls.labelled(labels, values, structure, layout)
        leaves = cls.of(list(args), "", lambda path: f"{names[path[0].idx]}{pytree.keystr(path[1:])}")
        # (made anew, not dataclasses.replace'd: Dynamo before torch 2.8 cannot trace dataclasses.replace)
        return cls(leaves.labels, leaves.values, leaves.structure, leaves.differentiable, leaves.layout, args)

    @classmethod
    def of(cls, tree: Any, prefix: str, label: Callable[[Any], str] | None = None) -> Leaves:
        """``label``: a leaf's path to its label; by default ``prefix`` and the path."""
        if type(tree) is torch.Tensor and label is None:  # one tensor: its label is the prefix
            return cls.labelled([prefix], [tree], _LEAF, _LEAF_LAYOUT)
        pairs, structure = pytree.tree_flatten_with_path(tree)
        if label is None:  # (not `label or`: Dynamo may take a function's truth for control flow)
            label = lambda path: f"{prefix}{pytree.keystr(path)}"  # noqa: E731
        return cls.labelled([label(p) for p, _ in pairs], [v for _, v in pairs], structure)

    @classmethod
    def labelled(cls, labels: list[str], values: list[Any], structure: Any,
                 layout: tuple[Any, ...] | None = None) -> Leaves:
        """Leaves of these labels, values and structure; the differentiable ones found among the values."""
        return cls(labels, values, structure, [k for k, v in enumerate(values) if is_differentiable(v)], layout)

    def structure_key(self) -> Hashable:
        """The structure as a key (``structure_key``), from the layout where it is known."""
        return structure_key(self.structure) if self.layout is None else self.layout

    def with_values(self, replaced: dict[int, Any]) -> Any:
        values = [replaced.get(k, v) for k, v in enumerate(self.values)]
        if self.layout == _LEAF_LAYOUT:
            return values[0]
        if self.layout is not None:  # a ``_flat_layout``'s list of arguments, rebuilt without pytree's walk
            rebuilt, start = [], 0
            for n in self.layout[1:]:  # (None: a tensor; n: a tuple of n leaves)
                rebuilt.append(values[start] if n is None else tuple(values[start:start + n]))
                start += 1 if n is None else n
            return rebuilt
        arguments = pytree.tree_unflatten(values, self.structure)
        return arguments if self.given is None else self._given_where_kept(arguments, replaced)

    def _given_where_kept(self, arguments: list[Any], replaced: dict[int, Any]) -> list[Any]:
        """Each argument none of whose leaves is replaced as it was given, the very object: a list that f appends to
        (as a Function's forward may, to report what it computed) is the caller's, as PyTorch passes it."""
        start = 0
        for k, spec in enumerate(self.structure.children_specs):
            if not any(start <= j < start + spec.num_leaves for j in replaced):
                arguments[k] = self.given[k]  # type: ignore[index]
            start += spec.num_leaves
        return arguments

    def described(self) -> Callable[[], Leaves]:
        """A maker of the same leaves with each tensor a plain stand-in of its shape and dtype (``stand_in``):
        the shapes are read now, the stand-ins made when it is called (outside a torch.func transform, where
        one made inside would be the transform's)."""
        makers = [stand_in(v) if isinstance(v, torch.Tensor) else (lambda v=v: v) for v in self.values]
        return lambda: dataclasses.replace(self, values=[make() for make in makers])

    def tensors(self) -> list[torch.Tensor]:
        """The differentiable leaves, in order."""
        return [self.values[k] for k in self.differentiable]


_LEAF = pytree.tree_structure(0)
_LEAF_LAYOUT = ("one leaf",)


def _flat_layout(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Where each argument is a tensor, or a tuple of tensors and bools (a Function's ``needs_input_grad``), the
    arguments' structure as a key: a tuple's length, None for a tensor; else None, and the arguments are walked."""
    layout: list[int | None] = []
    for argument in args:
        if isinstance(argument, torch.Tensor):
            layout.append(None)
        elif type(argument) is tuple and all(type(v) is bool or isinstance(v, torch.Tensor) for v in argument):
            layout.append(len(argument))
        else:
            return None
    return ("flat", *layout)


def _made_structure(layout: tuple[Any, ...]) -> Any:
    """The TreeSpec of the argument list of this ``_flat_layout``."""
    return pytree.tree_structure([0 if n is None else (0,) * n for n in layout[1:]])


# made once per layout eagerly (a TreeSpec is immutable); Dynamo makes it as it traces, keeping no Python cache
_flat_structure = functools.lru_cache(maxsize=256)(_made_structure)


def structure_key(spec: Any) -> Any:
    """A pytree's structure as a key: the TreeSpec itself where it hashes (torch 2.13), else (torch 2.6, whose
    TreeSpec holds lists) its node type, context and children's keys."""
    try:
        hash(spec)
        return spec
    except TypeError:
        context = tuple(spec.context) if isinstance(spec.context, list) else spec.context
        return spec.type, context, tuple(structure_key(child) for child in spec.children_specs)


def stand_in(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A maker of a plain tensor of the shape, dtype and device the tensor shows (its logical shape under
    ``vmap``), read now."""
    shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
    return lambda: torch.empty(shape, dtype=dtype, device=device)


def _matches(argument: Any, cotangent: Any) -> bool:
    """Whether the sequence cotangent is argument's cotangent: argument is a container of its structure."""
    structure = pytree.tree_structure(argument)
    return not structure.is_leaf() and pytree.tree_structure(cotangent) == structure


def answer_of(vjp: Callable[[Any], Any], cotangent: Any, f: Callable[..., Any]) -> Any:
    """vjp called on its one argument, the cotangent of y in y's structure (a tuple where f returns several
    outputs). Where it fails with a TypeError and takes several required positional parameters, as a Function's
    ``backward(dw, dv)`` does, the TypeError says how the VJP is called."""
    try:
        return vjp(cotangent)
    except TypeError as error:
        required = _required_positional(vjp)
        if required < 2:
            raise
        raise TypeError(f"The vjp of {name_of(f)} takes {required} positional parameters, and is called with one: "
                        "the cotangent of y in y's structure, a tuple where f returns several outputs. A backward "
                        "written backward(dw, dv) is the VJP lambda cts: backward(*cts).") from error


def _required_positional(fn: Callable[..., Any]) -> int:
    """How many positional parameters fn requires (0 where its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional and p.default is inspect.Parameter.empty for p in parameters)


def _without_extra_nones(result: Any, args: tuple[Any, ...]) -> Any:
    """result less its trailing Nones beyond one per argument: a Function's backward may return more gradients
    than forward took inputs, the extras None, and PyTorch drops them. A sequence that is the one argument's
    own cotangent (a container of its structure) is left whole."""
    count = len(args)
    if not isinstance(result, (tuple, list)) or len(result) <= count or any(r is not None for r in result[count:]):
        return result
    if count == 1 and _matches(args[0], result):
        return result
    return tuple(result[:count])


def argument_cotangents(result: Any, args: tuple[Any, ...], leaves: Leaves, names: list[str],
                        f: Callable[..., Any]) -> dict[int, torch.Tensor]:
    """The cotangent of each argument leaf that vjp gives one for (None is no gradient), cast to the leaf's
    dtype, its shape checked. Trailing Nones beyond one per argument are dropped, as PyTorch drops them."""
    result = _without_extra_nones(result, args)
    flat = _flat_answer(result, leaves)
    if flat is None:
        flat = _walked_answer(result, args, names, f)
    found = {}
    for k, ct in enumerate(flat):
        if ct is not None:
            found[k] = _checked(f, leaves.labels[k], leaves.values[k], ct, k in leaves.differentiable)
    return found


def _flat_answer(result: Any, leaves: Leaves) -> list[Any] | None:
    """The answer leaf by leaf without pytree's walk, where the arguments have a ``_flat_layout`` (a Function's,
    ``needs_input_grad`` last) and the answer is a tuple of a tensor or None for each tensor argument and None for
    each tuple; None where it is otherwise, and ``_walked_answer`` reads it (or names what is wrong)."""
    layout = leaves.layout
    if layout is None or layout[0] != "flat" or type(result) is not tuple or len(result) != len(layout) - 1 \
            or len(result) < 2:
        return None
    flat: list[Any] = []
    for n, ct in zip(layout[1:], result, strict=True):
        if ct is None:
            flat += [None] * (1 if n is None else n)
        elif n is None and isinstance(ct, torch.Tensor):
            flat.append(ct)
        else:
            return None
    return flat


def _walked_answer(result: Any, args: tuple[Any, ...], names: list[str], f: Callable[..., Any]) -> list[Any]:
    """The answer leaf by leaf (None where no gradient), read by pytree; ValueError where a cotangent's structure
    is not its argument's."""
    flat: list[Any] = []
    for name, argument, ct in zip(names, args, cotangent_of_each_argument(result, args, names, f, _matches),
                                  strict=True):
        count = len(pytree.tree_leaves(argument))
        if ct is None:
            flat += [None] * count
            continue
        cts, structure = pytree.tree_flatten(ct)
        if structure != pytree.tree_structure(argument):
            raise ValueError(f"The vjp of {name_of(f)} returned a cotangent for {name} of another structure than "
                             f"the argument: {structure} for {pytree.tree_structure(argument)}.")
        flat += cts
    return flat


def _checked(f: Callable[..., Any], label: str, x: Any, ct: Any, differentiable: bool) -> torch.Tensor:
    """ct as a tensor in x's dtype; ValueError or TypeError naming ``label`` where its shape or kind is not x's."""
    if not isinstance(ct, torch.Tensor):
        raise TypeError(f"The vjp of {name_of(f)} returned a {type(ct).__name__} for {label}: a cotangent is a "
                        "tensor (None for no gradient).")
    if not differentiable:  # judged later: a cotangent for a constant must be proven zero
        return ct
    if ct.shape != x.shape:
        raise ValueError(f"The vjp of {name_of(f)} returned a cotangent of shape {tuple(ct.shape)} for {label} of "
                         f"shape {tuple(x.shape)}: a cotangent has its argument's shape.")
    if ct.is_complex() and not x.is_complex():
        raise TypeError(f"The vjp of {name_of(f)} returned a complex cotangent ({ct.dtype}) for the real {label} "
                        f"({x.dtype}).")
    return ct if ct.dtype == x.dtype else ct.to(x.dtype)
