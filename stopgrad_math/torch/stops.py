"""Stopping gradients over nests and per element, in PyTorch."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from stopgrad_math.shared import layouts
from stopgrad_math.torch import identity


def _stopped_leaf(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return identity.stop(leaf)
    if isinstance(leaf, (bool, str, bytes)) or leaf is None:
        return leaf
    return identity.stop(torch.as_tensor(leaf))


def stop_gradient(tree: Any) -> Any:
    """Returns every tensor of a nest (tuples, lists, dicts, namedtuples) with no derivative: ``detach()``.

    NumPy values and Python numbers become stopped tensors; None stays None.

    Examples:
        >>> out = stop_gradient({"loc": torch.tensor([1.0], requires_grad=True), "scale": 2.0, "extra": None})
        >>> out["loc"].requires_grad, float(out["scale"]), out["extra"]
        (False, 2.0, None)
    """
    return pytree.tree_map(_stopped_leaf, tree)


def stop_gradient_where(x: Any, mask: Any) -> torch.Tensor:
    """Returns x, with its gradient stopped where ``mask`` is true.

    ``where(mask, stop(x), x)``: the value is x bit for bit; the derivative is
    x's where mask is false and zero where it is true. ``mask`` is a bool
    tensor that broadcasts to x's shape.

    Examples:
        >>> x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        >>> stop_gradient_where(x, torch.tensor([True, False, True])).sum().backward()
        >>> x.grad
        tensor([0., 1., 0.])
    """
    x = identity.inexact_tensor(x, "stop_gradient_where's x")
    mask = torch.as_tensor(mask, device=x.device)
    if mask.dtype != torch.bool:  # a 0/1 or float mask would be read as a select, silently
        raise TypeError(f"stop_gradient_where's mask must be a bool tensor; got {mask.dtype}.")
    layouts.require_broadcast("stop_gradient_where's mask", tuple(mask.shape), "x's", tuple(x.shape))
    return torch.where(mask, identity.stop(x), x)
