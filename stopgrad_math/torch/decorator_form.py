"""The decorator form in PyTorch: a VJP embedded as the linear map it is the transpose of.

``f(*args)`` returns ``(y, vjp)``, ``vjp(ct)`` the cotangents of the
positional arguments (as in the other namespaces). The VJP is traced into a
graph of ATen ops, and ``linear_ops`` proves it linear from that graph (or
names the op that is not). J·v is then the VJP's own derivative: the VJP of
the linear map ct ↦ Jᵀct is J, so the pullback of ``torch.func.vjp`` of the
VJP, applied to the zero v, is J·v, made of the ATen ops' derivatives:

    h = y − zero_with_derivative_of(J·v),   v = c(stop(x) − x)

v is +0.0 in value, so h is y bit for bit; the derivative of h w.r.t. x is
J in every mode (``backward``, ``forward_ad``, ``torch.func``), and its
transpose, the reverse-mode product, is the VJP again. It is exact wherever
the VJP's ops are linear in the cotangent and their derivatives are their
exact transposes, which is what the table admits. Where y has one element,
J is vjp(1) and the identity form embeds it, which keeps an infinite
derivative.

At ``order=1`` f runs at stop(x) and what the VJP closes over is stopped, so
J is constant; ``second_derivative_guard`` makes a second derivative raise
where PyTorch shows it. At ``order=2`` f runs at x, so what the VJP closes
over moves with x, and the zero term is ``identity.mapped_zero``: an
``autograd.Function`` whose backward is the VJP and whose jvp is J·dv, run on
those tensors as they are and giving them no derivative itself. So the first
derivative is J, as at ``order=1``, whatever J's own derivative holds, and a
double backward or a nested ``torch.func`` transform differentiates the VJP's
ops (the Jacobian of the declared gradient, as PyTorch's double backward of a
Function gives it); y is computed at stop(x) by a second call. What f reads
other than its positional arguments (keyword arguments, a module's
parameters) keeps y's ordinary autodiff.

A call takes the stages in this order, each a module of its own:

1. ``evaluation``: whether the call differentiates at all, and f evaluated;
2. the proof, by one of three routes (``_proven_call``): a proof kept for the
   signature (``kept_proofs``), else the VJP traced and proven now
   (``tracing``, on ``aten_graphs`` and ``linear_ops``), or, while Dynamo
   traces the call, the proof made as a constant of the graph
   (``compiled_proof``, its graphs run through ``compiled_graphs``); the
   graphs of a proof's map and transpose are ``proof_graphs``';
3. ``zero_terms``: the zero term of each output, attached to y;

and ``refusals`` says why where a stage cannot go on. Where the caller can
fall back (``call_or_fall_back``, for ``stopgrad_math.torch.Function``), a
VJP that cannot be embedded gives its reason to the caller instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared import nesting
from stopgrad_math.shared.arguments import BEYOND_ORDER, call_f, name_of
from stopgrad_math.torch import (
    compiled_graphs,
    compiled_proof,
    deferred_term,
    evaluation,
    identity,
    kept_proofs,
    recorded_term,
    refusals,
    second_derivative_guard,
    tracing,
    unrecorded,
    zero_terms,
)
from stopgrad_math.torch.tracing import Linear
from stopgrad_math.torch.vjp_conventions import Leaves


def _proven(cotangents: tracing.Cotangents, vjp: Callable[[Any], Any],
            order: int) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None]:
    """The argument leaves whose cotangent is linear (``tracing.proven_states`` of the VJP traced as
    ``tracing.traced_vjp`` does); the map from the cotangents of y to theirs: the traced graph, with what the VJP closes
    over stopped (order 1) or live (order 2); what it closes over, as it is; and the map's transpose J·v where it is at
    hand (None: the pullback of torch.func.vjp of the map). Eagerly and under torch.func, outside any trace, the proof
    of a known signature (``kept_proofs.known``)."""
    if not torch._C._len_torch_dispatch_stack():
        known = kept_proofs.known(cotangents, vjp, order)
        if known is not None:
            return known
    traced = tracing.traced_vjp(cotangents, vjp)
    kept = tracing.proven_states(cotangents, traced.states())
    constants = traced.constants if order == 2 else [identity.stop(c) for c in traced.constants]
    return kept, traced.linear(constants, [cotangents.found.index(k) for k in kept]), traced.constants, None


def _proven_call(cotangents: tracing.Cotangents, vjp: Callable[[Any], Any], kwargs: dict[str, Any],
                 watch: unrecorded.Followed | None,
                 falls_back: bool) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None, bool, int] | str:
    """``_proven`` eagerly and under torch.func, ``compiled_proof.proven_while_compiling`` under Dynamo: the kept
    leaves, the VJP's map, what it closes over (eagerly), its transpose where at hand, whether the map is embedded
    alone (compiled, ``compiled_proof._REVERSE_ONLY``), and the order it is embedded at: 1 at order 2 where the VJP
    reads a tensor f computed with grad mode off (``unrecorded``), whose derivative order 2 cannot take;
    ``falls_back``: a VJP that cannot be embedded gives the reason rather than raising."""
    f, leaves, outputs, names, order = (cotangents.f, cotangents.leaves, cotangents.outputs, cotangents.names,
                                        cotangents.order)
    if identity.compiling():
        proof = compiled_proof.proven_while_compiling(f, leaves, kwargs, outputs, names, order, falls_back=falls_back)
        if isinstance(proof, str):
            return proof
        kept, registered, transposed, alone, embedded_at = proof
        return kept, cotangents.of(vjp, kept) if registered is None else registered, [], transposed, alone, embedded_at
    try:
        kept, linear, closed_over, transposed = _proven(cotangents, vjp, order)
        if unrecorded.lost_read(watch, closed_over):  # order 2 cannot differentiate the VJP: order 1's first
            kept, linear, closed_over, transposed = _proven(cotangents, vjp, 1)  # derivatives, and a second raises
            return kept, linear, closed_over, transposed, False, 1
    except Exception as error:
        if not (falls_back and refusals.falls_back_on(error)):
            raise
        return refusals.fall_back_reason(f, error)
    return kept, linear, closed_over, transposed, False, order


def _embed(f: Callable[..., Any], args: tuple[Any, ...], names: list[str], kwargs: dict[str, Any], order: int,
           guard: bool, fallback: Callable[[str], Any] | None = None) -> Any:
    name = name_of(f)
    if fallback is None and not evaluation.differentiating(args):  # (a Function's apply has asked)
        return call_f(f, args, kwargs)[0]
    leaves = Leaves.of_arguments(args, names)
    if not leaves.differentiable:
        return call_f(f, args, kwargs)[0]
    y, vjp, watch, undifferentiable = evaluation.evaluated(f, leaves, kwargs, order)
    outputs = Leaves.of(y, "y")
    if not outputs.differentiable:
        return y
    order = 1 if undifferentiable else order
    cotangents = tracing.Cotangents(f, names, leaves, outputs, order)
    deferred = None if fallback is None else _deferred(cotangents, vjp, kwargs, watch, undifferentiable)
    if deferred is not None and deferred.kept is not None:  # a signature proven before: no proof, no key
        return deferred.attached()
    proof = _proven_call(cotangents, vjp, kwargs, watch, fallback is not None)
    if isinstance(proof, str):
        assert fallback is not None  # (a reason comes back only where there is one to take it)
        return fallback(proof)
    kept, linear, closed_over, transposed, alone, embedded_at = proof
    if deferred is not None and deferred.admits(kept):
        return deferred.attached()
    xs = [leaves.values[k] for k in kept]
    if not xs:  # every cotangent None or proven zero: y keeps a zero derivative, as a Function's output would
        zero = sum((identity.zero_with_slope(x, slope_is_negative=True).real.sum() * 0.0
                    for x in leaves.tensors()), torch.zeros(()))
        return outputs.with_values({k: identity.attach(outputs.values[k], [zero]) for k in outputs.differentiable})
    why = unrecorded.beyond(undifferentiable, embedded_at, order)  # (said by a second derivative, which raises)
    return _attached(linear, outputs, xs, closed_over, transposed, alone, name, embedded_at, guard, why)


def _deferred(cotangents: tracing.Cotangents, vjp: Callable[[Any], Any], kwargs: dict[str, Any],
              watch: unrecorded.Followed | None, undifferentiable: str | None) -> deferred_term.Call | None:
    """A Function's call (``_embed``'s, given a fallback) in reverse mode alone, its VJP naming what the forward
    saved, whose proof the node makes where a derivative needs it (``deferred_term``); None elsewhere."""
    if kwargs or not recorded_term.reverse_alone():  # (first: Dynamo cannot read a nested function's attributes)
        return None
    saved = getattr(vjp, "saved_tensors", None)
    if saved is None:
        return None
    return deferred_term.Call(cotangents, vjp, saved, undifferentiable,
                              lambda: _proven_call(cotangents, vjp, kwargs, watch, falls_back=True))


def _attached(linear: Linear, outputs: Leaves, xs: list[torch.Tensor], closed_over: list[torch.Tensor],
              transposed: Linear | None, alone: bool, name: str, order: int, guard: bool, why: str | None) -> Any:
    """y with the zero term of the map ``linear`` through xs (``zero_terms``), embedded at ``order``, guarded where
    ``guard``: a derivative beyond the order raises (``why``: what it says, about ``{name}``)."""
    if not guard:
        return zero_terms.attached(linear, outputs, xs, order, transposed, name, alone)
    if identity.compiling():  # the transforms show as AOTAutograd traces the call (order 2 guards in ``mapped_zero``)
        xs = list(compiled_graphs.guarded_at_order_1((why or BEYOND_ORDER[1]).format(name=name), *xs)) \
            if order == 1 else xs
        return zero_terms.attached(linear, outputs, xs, order, transposed, name, alone)
    # J depends on xs and what the VJP closes over: derivatives of those count
    second_derivative_guard.check([*xs, *closed_over], order, name, why)
    product = None if why else zero_terms.product_of_map(outputs, xs, transposed, closed_over, name, order)
    if product is not None:
        return product
    xs = [second_derivative_guard.hooked(x, closed_over, name, why or BEYOND_ORDER[1]) for x in xs] \
        if order == 1 else xs
    return zero_terms.attached(linear, outputs, xs, order, transposed, name, alone)


def decorate(f: Callable[..., Any], order: int = 1, check_linearity: bool = False) -> Callable[..., Any]:
    """Returns f with its VJP embedded as a linear map; the contract is on ``custom_gradient``.

    ``check_linearity`` is accepted for the TensorFlow namespace's signature:
    on PyTorch every VJP is traced, so its linearity is always proven.
    """
    arguments_of.check_options(order, check_linearity)
    return nesting.decorated(f, order, _embed)


def call_or_fall_back(f: Callable[..., Any], args: tuple[Any, ...], order: int,
                      fallback: Callable[[str], Any]) -> Any:
    """``decorate(f, order)(*args)``, but where the VJP cannot be embedded (``NotEmbeddable``), the value
    ``fallback(reason)`` rather than the error (``stopgrad_math.torch.Function``'s hand-back to
    torch.autograd.Function). No wrapper of f is made: Dynamo before torch 2.8 refuses an attribute set on one."""
    return nesting.call(f, args, {}, order, _embed, fallback=fallback)
