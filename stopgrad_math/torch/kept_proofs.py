"""The PyTorch decorator's proofs kept by signature, eagerly and under torch.func.

A VJP is proven at the first call of its signature (``_signature``: the
VJP's key from ``vjp_closure``, the names, the order, the arguments' and
y's structure and leaves) and the proof kept, at most ``PROOFS_KEPT`` of
them, the least recently used dropped first: the leaves whose cotangent is
linear, and ``proof_graphs``' two graphs, traced on stand-ins so that a
proof holds no tensor of a call. A float the VJP closes over is a symbol of
the proof (``size_conditions.floats_as_symbols``), unless the VJP reads its
value: then each value is a signature. A VJP that cannot be keyed, reads a
value while traced by shapes, or keeps a tensor of its own, is traced at
every call (``known`` gives None).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

from stopgrad_math.shared import bounded_cache, closure_key
from stopgrad_math.shared.arguments import name_of
from stopgrad_math.torch import (
    aten_graphs,
    eager_fast_path,
    identity,
    proof_graphs,
    second_derivative_guard,
    size_conditions,
    tracing,
    vjp_closure,
)
from stopgrad_math.torch.tracing import Linear
from stopgrad_math.torch.vjp_conventions import stand_in


@dataclasses.dataclass(frozen=True)
class Proof:
    """A VJP proven once for its signature: the argument leaves whose cotangent is linear, and the graphs of
    ``proof_graphs.maps`` (its map and its transpose), each a function of the cotangents (or v) and then the values the
    VJP closes over: its tensors, and its Python floats at ``floats`` (by position among those values), which the
    graphs take as symbols. It holds no tensor of the call it was made at: the graphs were traced on stand-ins."""

    kept: list[int]
    vjp_map: torch.fx.GraphModule | None  # None where nothing is kept
    transposed: torch.fx.GraphModule | None
    maps_tangents: bool = False  # forward mode differentiates the transpose by applying it to the tangents
    factor: torch.fx.GraphModule | None = None  # the transpose is v times this graph's tensor
    floats: tuple[int, ...] = ()
    found: tuple[int, ...] = ()  # the argument leaves the VJP answers for (``tracing.Cotangents.found``)


PROOFS_KEPT = 256
_PROOFS: bounded_cache.BoundedCache[Any] = bounded_cache.BoundedCache(PROOFS_KEPT)
_TRACED_AT_EVERY_CALL = object()  # a signature whose VJP reads a value, or closes over a tensor it made itself
_FLOATS_BY_VALUE = object()  # a signature whose VJP reads a float it closes over: proven per value of its floats


def known(cotangents: tracing.Cotangents, vjp: Callable[[Any], Any],
          order: int) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None] | None:
    """``decorator_form._proven`` from the proof made at the first call of the VJP's signature (``_signature``): the
    VJP's code, the values in its closure other than tensors and floats, the globals it reads, each tensor's
    ``tensor_key``, the arguments' and y's structure and leaves, the order. A float it closes over is a symbol of the
    proof (``size_conditions.floats_as_symbols``), so that a learning rate changing at every call is proven once; where
    the VJP reads one's value (a branch, ``math.exp``), each value is a signature. None where the VJP cannot be keyed
    (``vjp_closure.keyed``), or where a trace by shapes alone fails (it reads a value in Python) or keeps a tensor: then
    it is traced at every call, as before."""
    found = _kept(cotangents, vjp, order, floats=True)
    if found is not None and found[1] is _FLOATS_BY_VALUE:
        found = _kept(cotangents, vjp, order, floats=False)
    if found is None or found[1] is _TRACED_AT_EVERY_CALL:
        return None
    opened, proof = found
    cotangents.found = list(proof.found)
    tensors = [t for k, t in enumerate(opened.arrays) if k not in proof.floats]
    vjp_map, transposed = proof.vjp_map, proof.transposed
    if vjp_map is None or transposed is None:
        return [], lambda *cts: [], tensors, None
    floats = tuple((k, opened.arrays[k]) for k in proof.floats)
    constants = tensors if order == 2 else [identity.stop(t) for t in tensors]

    def put_back(graph: Any) -> Any:
        return _FloatsPutBack.around(graph, floats, len(tensors))

    # (forward: a Module's call adds its hooks' checks)
    linear = aten_graphs.LinearMap(put_back(vjp_map).forward, constants)
    return list(proof.kept), linear, tensors, Transpose(put_back(transposed), constants, proof.maps_tangents,
                                                        put_back(proof.factor))


def _kept(cotangents: tracing.Cotangents, vjp: Callable[[Any], Any], order: int,
          floats: bool) -> tuple[closure_key.Opened, Any] | None:
    """The VJP opened (``vjp_closure.keyed``, its floats as operands or by value) and the proof of its signature,
    made now where it is new; None where it cannot be keyed."""
    opened = vjp_closure.keyed(vjp, floats)
    signature = None if opened is None else _signature(cotangents, opened, order)
    if opened is None or signature is None:
        return None
    proof = _PROOFS.get(signature)
    return opened, _PROOFS.put(signature, _proof(cotangents, opened)) if proof is None else proof


@dataclasses.dataclass(frozen=True)
class _FloatsPutBack:
    """A proof's graph, given its first inputs and then the tensors the VJP closes over, with the VJP's floats put
    back among those where the graph took them (``proof_graphs.with_numbers``)."""

    graph: torch.fx.GraphModule
    floats: tuple[tuple[int, float], ...]
    tensors: int  # how many of its inputs, last, are the tensors

    @classmethod
    def around(cls, graph: Any, floats: tuple[tuple[int, float], ...], tensors: int) -> Any:
        """The graph, or where it takes floats, the graph with them put back (None stays None)."""
        return graph if graph is None or not floats else cls(graph, floats, tensors)

    def forward(self, *inputs: torch.Tensor) -> Any:
        first = len(inputs) - self.tensors
        return self.graph.forward(*inputs[:first], *proof_graphs.with_numbers(list(inputs[first:]), self.floats))


@dataclasses.dataclass(frozen=True)
class Transpose:
    """A proof's J·v, run on v with the tensors the VJP closes over; ``maps_tangents``: forward mode differentiates
    it by applying it to the tangents (``eager_fast_path.maps_tangents``); ``factor``: J·v is v times this graph's
    tensor (``eager_fast_path.product_factor``)."""

    graph: torch.fx.GraphModule | _FloatsPutBack
    constants: list[torch.Tensor]
    maps_tangents: bool
    factor: torch.fx.GraphModule | _FloatsPutBack | None = None

    def __call__(self, *vs: torch.Tensor) -> list[torch.Tensor]:  # v as the stand-ins it was traced on: contiguous
        return list(self.graph.forward(*[v.contiguous() for v in vs], *self.constants))


def _proof(cotangents: tracing.Cotangents, opened: closure_key.Opened) -> Any:
    """The ``Proof`` of the VJP opened; ``_TRACED_AT_EVERY_CALL`` where a trace by shapes fails, proves nothing, keeps a
    tensor, or, under vmap, indexes with a mask made from a batched tensor (``tracing.traced_vjp`` then says which).
    Shapes are read where the call is, and the graphs traced outside any torch.func transform, on plain stand-ins. Where
    the VJP closes over floats, each is a symbol (``size_conditions.floats_as_symbols``), and ``_FLOATS_BY_VALUE`` where
    the trace read one or failed: their values decide."""
    examples = cotangents.examples()
    floats = tuple(k for k, a in enumerate(opened.arrays) if type(a) is float)
    makers = [*(stand_in(e) for e in examples),
              *((lambda: 0.0) if type(a) is float else vjp_closure.strided_stand_in(a) for a in opened.arrays)]
    describe = cotangents.described()
    leaves = cotangents.leaves
    leaf_makers = {k: stand_in(leaves.values[k]) for k in leaves.differentiable}
    batched = {len(examples) + k for k, t in enumerate(opened.arrays) if tracing.batched_by_vmap(t)}
    with aten_graphs.exclusive(), temporarily_clear_interpreter_stack():  # (exclusive: the modules made here too)
        stand_ins: list[Any] = [make() for make in makers]
        if floats:
            stand_ins = size_conditions.floats_as_symbols(stand_ins)
        try:
            traced = tracing.traced_by_shapes(cotangents, describe, opened.rebuild, stand_ins, len(examples))
            kept = tracing.proven_states(cotangents, traced.states())
        except Exception:  # a read of a value (an op on it: item's _local_scalar_dense), or no proof: the trace on
            # the real tensors it closes over says what is allowed, or names the op
            return _FLOATS_BY_VALUE if floats else _TRACED_AT_EVERY_CALL
        if not all(k in traced.literals and c.numel() == 1 for k, c in enumerate(traced.constants)) or (
                batched and aten_graphs.boolean_mask_op(traced.graph, batched) is not None):
            return _FLOATS_BY_VALUE if floats else _TRACED_AT_EVERY_CALL
        proof = Proof([], None, None, found=tuple(cotangents.found))
        if kept:
            try:
                vjp_map, transposed = proof_graphs.maps(traced, [cotangents.found.index(k) for k in kept],
                                                        [leaf_makers[k]() for k in kept], stand_ins, len(examples), [])
            except Exception:
                if floats:
                    return _FLOATS_BY_VALUE
                raise
            proof = Proof(kept, vjp_map, transposed, eager_fast_path.maps_tangents(transposed, len(kept)),
                          eager_fast_path.product_factor(transposed, len(kept)), floats, tuple(cotangents.found))
        if floats and size_conditions.branched(stand_ins):
            return _FLOATS_BY_VALUE
    cotangents.warn_if_none_found()
    return proof


def _signature(cotangents: tracing.Cotangents, opened: closure_key.Opened, order: int) -> Hashable | None:
    """What a proof depends on besides the VJP's key: the names, the order (a decorated call inside the VJP is
    evaluated by it), the structure and leaves of the arguments and of y (a tensor by ``tensor_key``, its shape
    as the call sees it, under vmap one sample's; another leaf by value), and which tensors the VJP closes over
    vmap batches (a boolean mask made from one cannot be batched; where none is, an eager call and a transform
    share the proof); None where a leaf is of another kind."""
    try:
        leaves = tuple(_leaf_key(v) for v in cotangents.leaves.values)
        outputs = tuple(_leaf_key(v) for v in cotangents.outputs.values)
    except TypeError:
        return None
    batched = tuple(k for k, t in enumerate(opened.arrays) if tracing.batched_by_vmap(t)) \
        if second_derivative_guard.in_transform() else ()
    return (opened.key, name_of(cotangents.f), tuple(cotangents.names), order,
            cotangents.leaves.structure_key(), leaves, cotangents.outputs.structure_key(), outputs,
            batched)


def _leaf_key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return vjp_closure.tensor_key(value)
    if type(value) in (type(None), bool, int, float, complex, str, bytes):
        return type(value), value
    raise TypeError(type(value).__name__)
