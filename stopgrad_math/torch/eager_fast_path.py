"""The identity form's fast path for plain eager calls: one ``autograd.Function`` whose backward and jvp are the
ordinary-op identity's derivative, op for op, where every element of x and gx is finite.

Eagerly each of the identity's ops is a pass over memory and a node of the tape, about fifteen of them. Where x
and g are finite, the identity's derivative (``identity.zero_term``, differentiated by PyTorch) comes to

    reverse:  x̄ = −((−c)·g + 0·sign(g))      forward:  ḣ = −(−(ẋ·g) + 0)

for a cotangent c or a tangent ẋ, where the zero terms are what the identity's unchosen branches and its slope
carrier add: they set the sign of a zero result, and they are kept so that every bit (signs of zero, NaN
payloads, rounding) is the identity's. These are four or five passes. The value is ``fx − 0.0``, the identity's
last op.

The fast path is taken only where the two are known to agree (``tests/test_torch_fast_path.py`` compares them
bit for bit over a grid of ±0, subnormal, huge, ±inf and NaN cotangents and tangents, and in every mode): one
leaf of x, elementwise, with fx, gx and x of one shape and one dtype (float16, 32 or 64), plain tensors, in reverse
mode or in forward mode but not both, and plainly eager (``identity.plainly_eager``: no torch.func transform,
compilation, trace, dispatch or torch function mode).
Everything else is the ordinary ops: a non-finite element of x or gx, broadcasting, several leaves, complex
values, ``fx_gx_manually_stopped``. A backward with ``create_graph=True`` differentiates its own result, so it
recomputes the identity's ops from the saved x and differentiates those.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from stopgrad_math.shared.layouts import Layout
from stopgrad_math.torch import identity


def _ordinary(fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The identity of ordinary ops (fx and g stopped): the definition the fast path reproduces."""
    return identity.attach(fx, [identity.zero_term(Layout.ELEMENTWISE, fx, x, g)])


class _FiniteIdentity(torch.autograd.Function):
    """fx with derivative g w.r.t. x, for finite x and g (fx and g stopped); see the module docstring."""

    @staticmethod
    def forward(ctx: Any, fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(g)
        ctx.save_for_forward(g)
        ctx.fx, ctx.x = fx, x  # for create_graph alone, unpacked without save_for_backward's version check,
        # as the ordinary ops keep no reference to x that a later in-place change of x would invalidate
        return torch.sub(fx, 0.0)

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor | None) -> tuple[None, None, torch.Tensor | None]:
        (g,) = ctx.saved_tensors
        if cotangent is None:
            return None, None, None
        if torch.is_grad_enabled():  # create_graph: the ordinary ops, differentiable as the identity's are
            x = ctx.x
            (grad,) = torch.autograd.grad(_ordinary(ctx.fx, g, x), x, cotangent, create_graph=True)
            return None, None, grad
        sign_zero = torch.sign(g).mul_(0.0)
        return None, None, torch.mul(cotangent.neg(), g).add_(sign_zero).neg_()

    @staticmethod
    def jvp(ctx: Any, fx_tangent: Any, g_tangent: Any, x_tangent: torch.Tensor | None) -> torch.Tensor:
        del fx_tangent, g_tangent  # fx and g are stopped: they carry none
        (g,) = ctx.saved_tensors
        if x_tangent is None:
            return torch.zeros_like(g)
        return torch.mul(x_tangent, g).neg_().add_(0.0).neg_()


_DTYPES = (torch.float16, torch.float32, torch.float64)
"""Where the grid holds every bit; on bfloat16 the forward formula differs from the identity in a NaN's sign."""


def _plain(tensor: torch.Tensor, like: torch.Tensor) -> bool:
    return (type(tensor) is torch.Tensor and tensor.layout == torch.strided and tensor.shape == like.shape
            and tensor.dtype == like.dtype and tensor.device == like.device)


def _one_mode(x: torch.Tensor) -> bool:
    """Reverse mode alone (x requires grad, no forward-mode level) or forward mode alone (x has a tangent at the
    current level, and nothing requires grad): a Function's backward and jvp are each ours there."""
    reverse = torch.is_grad_enabled() and x.requires_grad
    if forward_ad._current_level < 0:
        return reverse
    tangent = forward_ad.unpack_dual(x).tangent  # type: ignore[no-untyped-call]
    return not reverse and tangent is not None and not (torch.is_grad_enabled() and tangent.requires_grad)


def finite_identity(fx: torch.Tensor, planned: list[tuple[str, Layout, torch.Tensor, torch.Tensor]]
                    ) -> torch.Tensor | None:
    """The identity's result through the fast path, fx and g stopped; None where the ordinary ops must run."""
    if len(planned) != 1 or fx.dtype not in _DTYPES:
        return None
    (_, layout, g, x) = planned[0]
    if layout is not Layout.ELEMENTWISE or not (_plain(fx, fx) and _plain(g, fx) and _plain(x, fx)):
        return None
    if not (identity.plainly_eager() and _one_mode(x) and identity.all_finite(x, g)):
        return None
    result: torch.Tensor = _FiniteIdentity.apply(fx, g, x)  # type: ignore[no-untyped-call]
    return result
