"""How the JAX decorator reads what it is given: the leaves of the arguments and of y, and the VJP's answer.

A leaf is differentiable where JAX differentiates it (a floating or complex
array or number); anything else passes through to f as it is. The VJP
returns the cotangents of the positional arguments, one per argument in a
tuple (or the cotangent alone for one argument; None for no gradient);
``argument_cotangents`` reads that answer as one cotangent per argument leaf,
checked against the leaf's structure, shape and kind, or names what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stopgrad_math.jax import identity
from stopgrad_math.shared.arguments import call_f, cotangent_of_each_argument, name_of

__all__ = ["Leaves", "argument_cotangents", "call_f", "is_differentiable", "name_of"]


def is_differentiable(leaf: Any) -> bool:
    """A floating or complex array or number: what JAX differentiates. Anything else passes through."""
    if isinstance(leaf, (bool, np.bool_)) or not isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, complex)):
        return False
    return identity.is_inexact(jnp.result_type(leaf))


@dataclasses.dataclass
class Leaves:
    """A pytree's leaves, with labels, and which of them are differentiable (as arrays)."""

    labels: list[str]
    values: list[Any]
    structure: Any
    differentiable: list[int]

    @classmethod
    def of_arguments(cls, args: tuple[Any, ...], names: list[str]) -> Leaves:
        """The leaves of the positional arguments, each labelled by its argument's name and its path in it."""
        return cls.of(list(args), "", lambda path: f"{names[path[0].idx]}{jax.tree_util.keystr(path[1:])}")

    @classmethod
    def of(cls, tree: Any, prefix: str, label: Callable[[Any], str] | None = None) -> Leaves:
        """``label``: a leaf's path to its label; by default ``prefix`` and the path."""
        pairs, structure = jax.tree_util.tree_flatten_with_path(tree)
        values = [v for _, v in pairs]
        differentiable = [k for k, v in enumerate(values) if is_differentiable(v)]
        for k in differentiable:
            if not isinstance(values[k], jax.Array):  # a Python or NumPy number; an array as it is, unconverted
                values[k] = jnp.asarray(values[k])
        label = label or (lambda path: f"{prefix}{jax.tree_util.keystr(path)}")
        return cls([label(p) for p, _ in pairs], values, structure, differentiable)

    def with_values(self, replaced: dict[int, Any]) -> Any:
        values = [replaced.get(k, v) for k, v in enumerate(self.values)]
        return jax.tree_util.tree_unflatten(self.structure, values)


def _matches(argument: Any, cotangent: Any) -> bool:
    """Whether the sequence cotangent is argument's cotangent: argument is a container of its structure."""
    structure = jax.tree_util.tree_structure(argument)
    if jax.tree_util.treedef_is_leaf(structure):  # an array's cotangent is an array, not a tuple of them
        return False
    try:
        structure.flatten_up_to(cotangent)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
    return True


def argument_cotangents(result: Any, args: tuple[Any, ...], leaves: Leaves, names: list[str],
                         f: Callable[..., Any]) -> dict[int, jax.Array]:
    """The cotangent of each argument leaf that vjp gives one for (None and float0 zeros are no gradient),
    cast to the leaf's dtype, its shape checked."""
    per_argument = cotangent_of_each_argument(result, args, names, f, _matches)
    flat: list[Any] = []
    for name, argument, ct in zip(names, args, per_argument, strict=True):
        structure = jax.tree_util.tree_structure(argument)
        if ct is None:
            flat += [None] * len(jax.tree_util.tree_leaves(argument))
            continue
        try:
            flat += structure.flatten_up_to(ct)  # type: ignore[attr-defined]  # in PyTreeDef, not in its stub
        except (TypeError, ValueError) as error:
            raise ValueError(f"The vjp of {name_of(f)} returned a cotangent for {name} of another structure "
                             f"than the argument: {error}") from None
    found = {}
    for k, ct in enumerate(flat):
        if ct is not None and getattr(ct, "dtype", None) != jax.dtypes.float0:
            ct = jnp.asarray(ct)  # a constant's must be proven zero: its gradient would be lost
            found[k] = _checked(f, leaves.labels[k], leaves.values[k], ct) if k in leaves.differentiable else ct
    return found


def _checked(f: Callable[..., Any], label: str, x: jax.Array, ct: jax.Array) -> jax.Array:
    """ct in x's dtype; ValueError or TypeError naming ``label`` where its shape or kind is not x's."""
    if ct.shape != x.shape:
        raise ValueError(f"The vjp of {name_of(f)} returned a cotangent of shape {ct.shape} for {label} of shape "
                         f"{x.shape}: a cotangent has its argument's shape.")
    if identity.is_complex(ct.dtype) and not identity.is_complex(x.dtype):
        raise TypeError(f"The vjp of {name_of(f)} returned a complex cotangent ({ct.dtype}) for the real {label} "
                        f"({x.dtype}).")
    return ct.astype(x.dtype)
