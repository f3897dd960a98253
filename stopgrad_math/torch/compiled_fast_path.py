"""The identity form's fast path under ``torch.compile``: one ``autograd.Function`` whose backward is the ordinary-op
identity's derivative for every value of x, gx and the cotangent, op for op.

Compiled, the ordinary ops make Inductor compute T (``identity.zero_term``: masks, the slope carrier, about
forty ops) in the forward kernel only to subtract its +0.0, and the partitioner may keep T's masks for the
backward, a different kernel for each layer of a network. Differentiated by AOTAutograd, with ĝ = g where g is
finite (else 0) and s = sign(g) (0 for NaN), they come to

    x̄ = −((−c)·ĝ + where(g finite, 0, (−c)/r)·s),   r = 2·sqrt(k) = where(g finite, 2, 0)

at every x, inf and NaN too (the carrier of ``identity.carried_zero`` passes the cotangent unchanged), where r is
the slope carrier's square root's derivative at its argument k: 1 where g is finite, +0.0 where it is
not, so that an infinite g gives an infinite derivative of its sign and a NaN g a NaN one). The Function's
forward is ``fx − 0.0``, the identity's last op; its backward computes the line above from the saved g.
Compiled, it gives the compiled ordinary ops' bits over a grid of ±0, subnormal, huge, ±inf and NaN in x, g and the
cotangent (``tests/torch/test_eager_fast_path.py``), and one short kernel each way, the same for every layer.

Taken where ``torch.compile`` traces reverse mode alone: one leaf of x, elementwise, fx, gx and x plain tensors of
one shape and dtype (float16, 32 or 64), x requiring grad in grad mode, no forward-mode level and no torch.func
transform (inside one the Function would need functorch rules of its own; ``torch.func.grad`` of a compiled
Function without them reads zeros). A compiled backward is not differentiable again, whichever ops built it
(AOTAutograd raises for ``create_graph``), so the Function needs no double backward. Everything else is the
ordinary ops.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from stopgrad_math.shared.layouts import Layout
from stopgrad_math.torch import eager_fast_path, second_derivative_guard


class _CompiledIdentity(torch.autograd.Function):
    """fx with derivative g w.r.t. x (fx and g stopped), for every x and g; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        del x  # an input for its gradient alone: the derivative is g's at every x
        ctx.save_for_backward(g)
        return torch.sub(fx, 0.0)

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        (g,) = ctx.saved_tensors
        finite_g = g.abs() < math.inf
        sign = (g > 0).to(g.dtype) - (g < 0).to(g.dtype)  # the carrier's s: 0 for NaN
        negated = cotangent.neg()  # the cotangent of T, subtracted from fx
        through_product = negated * torch.where(finite_g, g, 0.0)
        through_carrier = torch.where(finite_g, 0.0, negated / torch.where(finite_g, 2.0, 0.0)) * sign
        return None, None, (through_product + through_carrier).neg()


def identity(fx: torch.Tensor, planned: list[tuple[str, Layout, torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
    """The identity's result through the Function while torch.compile traces reverse mode alone (fx and g
    stopped); None where the ordinary ops must run."""
    plain = eager_fast_path.one_plain_elementwise(fx, planned)
    if plain is None:
        return None
    g, x = plain
    if not (torch.is_grad_enabled() and x.requires_grad) or second_derivative_guard.forward_mode_possible():
        return None
    result: torch.Tensor = _CompiledIdentity.apply(fx, g, x)  # type: ignore[no-untyped-call]
    return result
