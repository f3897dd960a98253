"""The PyTorch decorator's last stage: y with the zero term of each differentiable output attached.

The term is J·v with v = c(stop(x) − x), +0.0 in value: ``attached`` forms
it with the proven transpose, with the identity form where y has one
element (J is vjp(1)), or, at order 2 and where the transpose cannot be
formed, as ``identity.mapped_zero``, a carrier whose backward is the VJP
(``_Maps``). Where a kept proof's J·v is at hand, the eager fast paths
(``eager_fast_path``) give the same values in fewer ops, and at order 2,
where reverse mode alone can ask, one node gives the carrier's derivatives
(``recorded_term``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from stopgrad_math.shared.layouts import Layout
from stopgrad_math.torch import (
    aten_graphs,
    compiled_graphs,
    eager_fast_path,
    identity,
    kept_proofs,
    recorded_term,
    refusals,
    second_derivative_guard,
    tracing,
)
from stopgrad_math.torch.tracing import Linear
from stopgrad_math.torch.vjp_conventions import Leaves


def _one_element(outputs: Leaves, xs: list[torch.Tensor]) -> bool:
    """Whether J is vjp(1): one differentiable output of one element, complex exactly where the arguments are."""
    if len(outputs.differentiable) != 1:
        return False
    y = outputs.values[outputs.differentiable[0]]
    return y.numel() == 1 and all(x.is_complex() == y.is_complex() for x in xs)


@dataclasses.dataclass(frozen=True)
class _Maps:
    """The proven VJP and its transpose as functions of what the VJP closes over, at order 2: the derivatives of
    ``identity.mapped_zero``, which takes those tensors as its inputs."""

    vjp: aten_graphs.LinearMap
    transpose: kept_proofs.Transpose | None
    outputs: list[tuple[torch.Size, torch.dtype]]
    cotangents: list[torch.Tensor]  # examples of y's cotangents
    name: str
    without_transpose: str = ""  # why J·v cannot be formed (``refusals.without_derivative``): forward mode raises it

    def zeros(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=dtype, device=vs[0].device) for shape, dtype in self.outputs]

    def linear(self, cts: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.vjp.applied(cts, constants)

    def transposed(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        second_derivative_guard.check_forward_over_forward(self.name)
        if self.without_transpose:
            raise RuntimeError(self.without_transpose)
        if self.transpose is not None:
            return dataclasses.replace(self.transpose, constants=constants)(*vs)
        return list(torch.func.vjp(self.vjp.on(constants), *tracing.zeros_like(self.cotangents))[1](list(vs)))


def attached(linear: Linear, outputs: Leaves, xs: list[torch.Tensor], order: int,
             transposed: Linear | None = None, name: str = "f", alone: bool = False) -> Any:
    """y with each differentiable output's zero term attached; ``linear``: the proven VJP, from the cotangents of
    y's differentiable leaves to those of ``xs``; ``transposed``: its transpose J·v where it is at hand (else the
    pullback of torch.func.vjp of ``linear``); ``alone``: compiled, the map is embedded without its transpose, which
    cannot be formed (``compiled_proof._REVERSE_ONLY``), in order 2's carrier."""
    if (order == 2 or alone) and isinstance(linear, (compiled_graphs.Registered, aten_graphs.LinearMap)):
        return _carried(linear, outputs, xs, transposed, name, alone)
    if _one_element(outputs, xs):  # the identity form, with the Jacobian's one row vjp(1)
        index = outputs.differentiable[0]
        value = outputs.values[index]
        gradients = linear(torch.ones_like(value))
        terms = [identity.zero_term(Layout.SCALAR, value, x, g if order == 2 else identity.stop(g))
                 for x, g in zip(xs, gradients, strict=True)]
        return outputs.with_values({index: identity.attach(value, [t.reshape(value.shape) for t in terms])})
    dual = _dual(outputs, xs, transposed, order)
    if dual is not None:
        return dual
    zeros = [identity.zero_with_slope(x, slope_is_negative=True) for x in xs]
    try:
        products = transposed(*zeros) if transposed is not None else \
            torch.func.vjp(linear, *tracing.zeros_like(outputs.tensors()))[1](zeros)
    except RuntimeError as error:
        reason = refusals.without_derivative(error, name)
        if reason is None or not isinstance(linear, aten_graphs.LinearMap):
            raise
        ys = outputs.tensors()  # the carrier: backward the VJP at the stopped constants, jvp the reason
        maps = _Maps(linear, None, [(y.shape, y.dtype) for y in ys], ys, name, without_transpose=reason)
        return outputs.with_values({k: identity.attach(outputs.values[k], [z]) for k, z in zip(
            outputs.differentiable, identity.mapped_zero(maps, zeros, linear.constants), strict=True)})
    # each output linked to every x, as a Function's node links them: where there is one of each, a proven J·v
    # links them already, and reverse mode alone leaves the link out (forward mode keeps its +0.0 tangent, which
    # ``eager_fast_path.dual_of_map`` reproduces for every count)
    linked = second_derivative_guard.forward_mode_possible() or len(zeros) > 1 or len(products) > 1
    return outputs.with_values({
        k: identity.attach(outputs.values[k], [identity.zero_with_derivative_of(p, zeros, linked)])
        for k, p in zip(outputs.differentiable, products, strict=True)})


def _carried(linear: compiled_graphs.Registered | aten_graphs.LinearMap, outputs: Leaves, xs: list[torch.Tensor],
             transposed: Linear | None, name: str, alone: bool) -> Any:
    """``attached`` at order 2 (or compiled, ``alone``): each zero term the carrier's (``identity.mapped_zero``, or
    compiled its registered graph); eagerly, in forward mode under a transform, the fast path (``_dual``), and in
    reverse mode alone one node (``recorded_term``)."""
    compiled = isinstance(linear, compiled_graphs.Registered)
    dual = None if alone or compiled else _dual(outputs, xs, transposed, 2)
    if dual is not None:
        return dual
    if isinstance(linear, aten_graphs.LinearMap) and not alone and recorded_term.reverse_alone():
        return recorded_term.recorded(linear, outputs, xs)  # the carrier's derivatives, in one node
    vs = [identity.zero_with_slope(x, slope_is_negative=True) for x in xs]
    if isinstance(linear, compiled_graphs.Registered):
        zeros = list(compiled_graphs.run_mapped_zero(linear.key, len(vs), *vs, *linear.given))
    else:
        ys = outputs.tensors()
        maps = _Maps(linear, transposed if isinstance(transposed, kept_proofs.Transpose) else None,
                     [(y.shape, y.dtype) for y in ys], ys, name)
        zeros = identity.mapped_zero(maps, vs, linear.constants)
    return outputs.with_values({k: identity.attach(outputs.values[k], [z])
                                for k, z in zip(outputs.differentiable, zeros, strict=True)})


def _dual(outputs: Leaves, xs: list[torch.Tensor], transposed: Linear | None, order: int) -> Any:
    """y through the forward-mode fast path (``eager_fast_path.dual_of_map``), where a kept proof's J·v is at hand:
    at order 1 where its graph maps tangents (eagerly, or under a jvp transform), at order 2 under a jvp transform;
    None where the ordinary ops must run. (Not compiled: Dynamo before torch 2.8 cannot ask isinstance of its own
    function.)"""
    if identity.compiling() or not isinstance(transposed, kept_proofs.Transpose) or not (
            transposed.maps_tangents if order == 1 else second_derivative_guard.in_transform()):
        return None
    ys = [outputs.values[k] for k in outputs.differentiable]
    factor = transposed.factor
    duals = eager_fast_path.dual_of_map(ys, xs, transposed, None if factor is None else (
        lambda x: factor.forward(x, *transposed.constants)), linked=order == 1)
    return None if duals is None else outputs.with_values(dict(zip(outputs.differentiable, duals, strict=True)))


def product_of_map(outputs: Leaves, xs: list[torch.Tensor], transposed: Linear | None,
                   closed_over: list[torch.Tensor], name: str, order: int) -> Any:
    """y through the reverse-mode fast path (``eager_fast_path.product_of_map``), at order 1 with the guard, where
    a kept proof's J·v is v times a tensor of the constants, x and y are one each and y is not a one-element
    output (which ``attached`` embeds as the identity form); None where ``attached`` must run."""
    if not (order == 1 and isinstance(transposed, kept_proofs.Transpose) and transposed.factor is not None
            and len(xs) == 1 and len(outputs.differentiable) == 1 and not _one_element(outputs, xs)):
        return None
    index = outputs.differentiable[0]
    y = eager_fast_path.product_of_map(outputs.values[index], xs[0], transposed.factor.forward, transposed.constants,
                                       closed_over, name)
    return None if y is None else outputs.with_values({index: y})
