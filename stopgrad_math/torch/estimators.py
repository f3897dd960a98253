"""Estimators on the identity, in PyTorch: straight-through, scaled and reversed gradients, DiCE's magic box."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from stopgrad_math.shared import layouts
from stopgrad_math.torch import identity
from stopgrad_math.torch.identity_form import with_gradient


def straight_through(forward: Any, backward: Any) -> Any:
    """Returns the value of ``forward`` with the derivative of ``backward``.

    ``stop(forward) − (stop(backward) − backward)``: the subtracted term is
    exactly +0.0, so the value is forward bit for bit; the derivative is
    backward's. ``backward`` broadcasts to forward's shape and is cast to its
    dtype; where backward is inf or NaN the value is kept and no derivative
    passes. Nests of the same structure are mapped leaf by leaf.

    Examples:
        round in the forward pass, identity in the backward pass.

        >>> x = torch.tensor([0.4, 1.6], requires_grad=True)
        >>> y = straight_through(torch.round(x), x)
        >>> y.sum().backward()
        >>> y.detach(), x.grad
        (tensor([0., 2.]), tensor([1., 1.]))
    """
    forwards, structure = pytree.tree_flatten(forward)
    backwards, backward_structure = pytree.tree_flatten(backward)
    if structure != backward_structure:
        raise ValueError(f"straight_through's forward and backward must have the same structure: forward is "
                         f"{structure}, backward is {backward_structure}.")
    return pytree.tree_unflatten([_straight_through_leaf(f, b) for f, b in zip(forwards, backwards, strict=True)],
                                 structure)


def _straight_through_leaf(forward: Any, backward: Any) -> torch.Tensor:
    forward = identity.inexact_tensor(forward, "straight_through's forward")
    backward = identity.inexact_tensor(backward, "straight_through's backward", dtype_hint=forward.dtype)
    layouts.require_broadcast("straight_through's backward", tuple(backward.shape), "forward's", tuple(forward.shape))
    term = identity.zero_with_slope(backward.to(forward.dtype), slope_is_negative=True)
    return identity.attach(identity.stop(forward), [term])


def scale_gradient(x: Any, scale: Any) -> Any:
    """Returns x with its derivative multiplied by ``scale``.

    The elementwise identity with f = x and g = scale: the value is x bit for
    bit. ``scale`` broadcasts to each leaf's shape; nests are mapped leaf by
    leaf with the same scale.

    Examples:
        >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> scale_gradient(x, 0.1).sum().backward()
        >>> x.grad
        tensor([0.1000, 0.1000])
    """
    return pytree.tree_map(lambda leaf: _scaled(leaf, scale), x)


def _scaled(x: Any, scale: Any) -> torch.Tensor:
    x = identity.inexact_tensor(x, "scale_gradient's x")
    scale = identity.inexact_tensor(scale, "scale_gradient's scale", dtype_hint=x.dtype)
    layouts.require_broadcast("scale_gradient's scale", tuple(scale.shape), "x's", tuple(x.shape))
    return with_gradient(x, scale.to(x.device).expand(x.shape), x)


def reverse_gradient(x: Any, scale: Any = 1.0) -> Any:
    """Returns x with its derivative multiplied by −scale (gradient reversal).

    Examples:
        >>> x = torch.tensor(3.0, requires_grad=True)
        >>> float(torch.autograd.grad(reverse_gradient(x, 0.5), x)[0])
        -0.5
    """
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return scale_gradient(x, -scale)  # a Python number stays one, converted to x's dtype directly
    try:
        return scale_gradient(x, -identity.inexact_tensor(scale, "reverse_gradient's scale"))
    except TypeError as error:  # a string, None, a bool
        raise TypeError(f"reverse_gradient's scale must be a number or a tensor of numbers; got {scale!r:.60}.") \
            from error


def magic_box(tau: Any) -> torch.Tensor:
    """Returns the DiCE operator: value 1, d magic_box(τ) = magic_box(τ)·dτ at every order.

    ``exp(τ − stop(τ))`` with the identity's exact zero: the value is 1.0
    exactly, also where τ is inf or NaN, and every derivative is that of
    exp(τ) divided by exp(stop(τ)).

    Examples:
        τ = θ² at θ = 0.3: first derivative 2θ = 0.6, second (2θ)² + 2.

        >>> theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        >>> (first,) = torch.autograd.grad(magic_box(theta**2), theta, create_graph=True)
        >>> (second,) = torch.autograd.grad(first, theta)
        >>> round(float(first.detach()), 6), round(float(second), 6)
        (0.6, 2.36)
    """
    tau = identity.inexact_tensor(tau, "magic_box's tau")
    return torch.exp(identity.zero_with_slope(tau, slope_is_negative=False))
