"""The decorator's ``order=2`` term where reverse mode alone can ask: one node that runs the proven VJP.

Plainly eager (no torch.func transform, compilation, trace, dispatch or torch function mode) and with no
forward-mode level, reverse mode is the only derivative that can be taken of a call: a level entered later gives
no tangent to a tensor made before it. There order 2's ordinary ops (``zero_terms.attached``: h = y − z, z the
+0.0 of ``identity.mapped_zero`` at v = stop(x) − x) come to

    ȳ = h̄        x̄ = −Jᵀ(−h̄)        (an output with no cotangent gives Jᵀ a +0.0 one)

for a cotangent h̄ of h: each subtraction negates the cotangent of what it subtracts, and the carrier's backward is
the proven VJP's graph Jᵀ on what the VJP closes over. ``recorded`` makes one node whose backward runs those ops,
where the ordinary ops make about six and a Function. Like the carrier, it takes what the VJP closes over as inputs
that it gives no derivative, so that a backward with ``create_graph=True`` records Jᵀ's ops on them as they moved
with x: the second derivative is the carrier's, op for op.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from stopgrad_math.torch import aten_graphs, identity
from stopgrad_math.torch.vjp_conventions import Leaves


def reverse_alone() -> bool:
    """Whether reverse mode alone can differentiate what is computed now: plainly eager (``identity.plainly_eager``)
    and no forward-mode level."""
    return forward_ad._current_level < 0 and identity.plainly_eager()


class _RecordedMap(torch.autograd.Function):
    """y − 0.0 for each differentiable output, with ȳ = h̄ and x̄ = −Jᵀ(−h̄) (see the module docstring); what the VJP
    closes over is among its inputs, and gets no derivative from it."""

    @staticmethod
    def forward(ctx: Any, linear: aten_graphs.LinearMap, count: int, xs: int,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # (an output with no cotangent gives Jᵀ +0.0, as the carrier's materializes)
        ctx.save_for_backward(*tensors[count + xs:])  # as the carrier saves them: an in-place change of one raises
        ctx.linear = linear
        ctx.outputs = [(y.shape, y.dtype, y.device) for y in tensors[:count]]
        return tuple(torch.sub(y, 0.0) for y in tensors[:count])

    @staticmethod
    def backward(ctx: Any, *cotangents: torch.Tensor | None) -> tuple[Any, ...]:
        constants = list(ctx.saved_tensors)
        upstream = [torch.zeros(shape, dtype=dtype, device=device) if ct is None else torch.neg(ct)
                    for ct, (shape, dtype, device) in zip(cotangents, ctx.outputs, strict=True)]
        gradients = [torch.neg(g) for g in ctx.linear.applied(upstream, constants)]
        return (None, None, None, *cotangents, *gradients, *[None] * len(constants))


def recorded(linear: aten_graphs.LinearMap, outputs: Leaves, xs: list[torch.Tensor]) -> Any:
    """y (``outputs``) with each differentiable output through the one node, its derivative w.r.t. ``xs`` the
    proven VJP ``linear`` on the tensors it closes over."""
    ys = [outputs.values[k] for k in outputs.differentiable]
    constants = identity.saveable(linear.constants)
    results = _RecordedMap.apply(linear, len(ys), len(xs), *ys, *xs, *constants)  # type: ignore[no-untyped-call]
    return outputs.with_values(dict(zip(outputs.differentiable, results, strict=True)))
