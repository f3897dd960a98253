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

Under ``torch.compile`` Dynamo traces all of this into one graph, but the
VJP it holds is its own variable, which make_fx cannot trace again: there
the proof is a constant of the graph, made as Dynamo traces the call by
tracing f and its VJP anew on fake tensors (``_proven_while_compiling``).
Where that proof's graphs serve (``_routed``), the tensors f and its VJP
read from outside are their inputs, read at each call by a reader over f's
own cells and globals (``shared.outside_reads``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import pathlib
import re
import sys
import types
import typing
import warnings
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
from torch.utils import _pytree as pytree

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared import bounded_cache, closure_key, function_identity, linearity, nesting, outside_reads
from stopgrad_math.shared.arguments import call_f, name_of
from stopgrad_math.shared.layouts import Layout
from stopgrad_math.shared.linearity import Judged, NotEmbeddable
from stopgrad_math.torch import (
    eager_fast_path,
    identity,
    linear_ops,
    second_derivative_guard,
    size_conditions,
    unrecorded,
    vjp_closure,
)
from stopgrad_math.torch.vjp_conventions import Leaves, answer_of, argument_cotangents, stand_in, structure_key

# ---------------------------------------------------------------- the VJP, traced and proven linear


EVERY_COTANGENT_NONE = (
    "The vjp of {name} returned None for every argument of a call whose arguments require grad: every gradient "
    "through {name} is zero. Inside f the arguments are stopped, as a Function's forward sees them, so a guard "
    "such as `if x.requires_grad` (a port of ctx.needs_input_grad) is always false there: drop it and return every "
    "cotangent; autograd takes only those it needs.")


class _Cotangents:
    """The VJP as a function of the cotangents of y's differentiable leaves, giving the cotangents of the
    argument leaves it answers for (``found``, by leaf index), in that order."""

    def __init__(self, f: Callable[..., Any], names: list[str], leaves: Leaves, outputs: Leaves, order: int):
        self.f, self.names, self.leaves, self.outputs, self.order = f, names, leaves, outputs, order
        self.found: list[int] = []

    def examples(self) -> list[torch.Tensor]:
        """Zeros of the cotangents of y's differentiable leaves: what a trace of the VJP or a pullback is given."""
        return _zeros_like(self.outputs.tensors())

    def described(self) -> Callable[[], _Cotangents]:
        """A maker of the same reading with each tensor leaf a plain stand-in of its shape and dtype: what a
        trace outside a torch.func transform may touch (a wrapper of the transform, there, may not be)."""
        leaves, outputs = self.leaves.described(), self.outputs.described()
        return lambda: _Cotangents(self.f, self.names, leaves(), outputs(), self.order)

    def warn_if_none_found(self) -> None:
        """After a trace of the VJP: a warning (once per f and message, Python's default filter) where it returned
        None for every argument of a call whose arguments require grad."""
        if not self.found and any(getattr(self.leaves.values[k], "requires_grad", False)
                                  for k in self.leaves.differentiable):
            warnings.warn(EVERY_COTANGENT_NONE.format(name=name_of(self.f)), stacklevel=5)

    def of(self, vjp: Callable[[Any], Any], kept: list[int] | None = None) -> Callable[..., list[torch.Tensor]]:
        """``vjp`` read leaf by leaf; ``kept``: the argument leaves (by index) to return, by default all found."""
        args = tuple(self.leaves.with_values({}))

        def cotangents(*cts: torch.Tensor) -> list[torch.Tensor]:
            outputs = self.outputs
            with nesting.evaluating(self.order):
                answer = answer_of(vjp, outputs.with_values({
                    **{k: None for k in range(len(outputs.values)) if k not in outputs.differentiable},
                    **dict(zip(outputs.differentiable, cts, strict=True))}), self.f)
            by_leaf = argument_cotangents(answer, args, self.leaves, self.names, self.f)
            self.found = list(by_leaf)
            return list(by_leaf.values()) if kept is None else [by_leaf[k] for k in kept]

        return cotangents


def _traced(cotangents: _Cotangents, vjp: Callable[[Any], Any]) -> linear_ops.Traced:
    """The VJP as an ATen graph, traced as PyTorch runs a backward (``linear_ops.trace``). Outside torch.func it
    is traced as it is, on fake cotangents and the real tensors it closes over, which it may read; under a
    transform those are the transform's wrappers, so they are lifted out (the graph's first constants) and it
    is traced outside the transform on fake stand-ins of their shapes (a VJP that reads a tensor's value in
    Python then raises)."""
    sparse = vjp_closure.sparse_read(vjp)
    if sparse is not None:
        raise _sparse_refusal(cotangents.f, sparse)
    if second_derivative_guard.in_transform():
        return _traced_under_transform(cotangents, vjp)
    try:
        traced = linear_ops.trace(cotangents.of(vjp), *cotangents.examples())
    except (ValueError, TypeError, LookupError):
        raise
    except Exception as error:  # what make_fx raises on a read of the cotangent, or on what it cannot trace
        if _raised_by_the_vjp(error):
            raise
        raise _untraceable(cotangents.f, error, "eagerly") from error
    cotangents.warn_if_none_found()
    return traced


def _traced_under_transform(cotangents: _Cotangents, vjp: Callable[[Any], Any]) -> linear_ops.Traced:
    """``_traced`` under a torch.func transform: by shapes alone, outside it, its closed-over tensors lifted out."""
    name = name_of(cotangents.f)
    examples = cotangents.examples()
    lifted = vjp_closure.lifted(vjp)
    if lifted is None:
        raise ValueError(f"The vjp of {name} is a {type(vjp).__name__}, not a function: under torch.func the "
                         "decorator traces a vjp with the tensors it closes over lifted out, which only a plain "
                         "function (a def or a lambda) allows.")
    if lifted.pytorchs:
        raise ValueError(
            f"The vjp of {name} closes over a function of PyTorch's that holds tensors ({lifted.pytorchs[0]}: "
            "torch.func.vjp's pullback, which runs the graph recorded when f ran). Under torch.func the decorator "
            "traces the vjp outside the transform, on stand-ins of the tensors it closes over, and a stand-in "
            "carries no recorded graph. Recompute inside the vjp, as checkpointing does: lambda ct: "
            "torch.func.vjp(block, x)[1](ct)[0].")
    makers = [stand_in(t) for t in [*examples, *lifted.tensors]]  # shapes read inside the transform
    describe = cotangents.described()
    with temporarily_clear_interpreter_stack():
        try:
            traced = _traced_by_shapes(cotangents, describe, lifted.rebuild, [make() for make in makers],
                                       len(examples))
        except (ValueError, TypeError, LookupError):
            raise
        except Exception as error:  # what make_fx raises on a value read or a wrapped tensor
            if _raised_by_the_vjp(error):
                raise
            raise _untraceable(cotangents.f, error, "under torch.func") from error
    cotangents.warn_if_none_found()
    count = len(examples)  # the cotangents' placeholders, then the lifted tensors'
    batched = {count + k for k, t in enumerate(lifted.tensors) if _batched(t)}
    masked = linear_ops.boolean_mask_op(traced.graph, batched) if batched else None
    if masked is not None:
        raise ValueError(f"The vjp of {name} indexes with a boolean mask ({masked}: g[mask] = 0, g[mask], nonzero) "
                         "computed from a tensor vmap batches, whose shape then depends on the mask's values, so "
                         "vmap cannot batch it. Write the choice with torch.where (g = torch.where(mask, 0, g)), "
                         "which every transform batches.")
    return dataclasses.replace(traced, constants=[*lifted.tensors, *traced.constants])


def _batched(tensor: torch.Tensor) -> bool:
    """Whether the tensor is batched by a torch.func vmap, at any level of its wrappers (a float is not)."""
    if not isinstance(tensor, torch.Tensor):
        return False
    while is_functorch_wrapped_tensor(tensor):
        if is_batchedtensor(tensor):
            return True
        tensor = get_unwrapped(tensor)
    return False


def _traced_by_shapes(cotangents: _Cotangents, describe: Callable[[], _Cotangents],
                      rebuild: Callable[[list[torch.Tensor]], Any], stand_ins: list[torch.Tensor],
                      count: int) -> linear_ops.Traced:
    """The VJP traced on fake tensors: ``stand_ins`` of the ``count`` cotangents of y, then of the tensors it
    closes over (``rebuild``: the VJP closing over others in place of its own), with y and the arguments as
    ``describe`` makes them: a graph of shapes alone, in which a read of any value raises. Its constants are its
    own (the literals it makes); ``cotangents.found`` is set."""
    described = describe()

    def rebuilt(*values: torch.Tensor) -> list[torch.Tensor]:
        return described.of(rebuild(list(values[count:])))(*values[:count])

    traced = linear_ops.trace(rebuilt, *stand_ins, cotangents=count, fake=True)
    cotangents.found = described.found
    return traced


def _sparse_refusal(f: Callable[..., Any], sparse: str) -> NotEmbeddable:
    return NotEmbeddable(f"The vjp of {name_of(f)} reads the sparse tensor {sparse}, which the decorator cannot trace "
                      "into ATen ops to prove the vjp linear: PyTorch's fake tensors have no sparse layout. Close "
                      "over it dense (to_dense()), or keep this rule an autograd.Function.")


# Where an exception raised inside is PyTorch's (the trace's) or the library's own (a refusal), not the VJP's.
_NOT_THE_VJPS = (str(pathlib.Path(torch.__file__).parent), str(pathlib.Path(__file__).parent.parent))


def _raised_by_the_vjp(error: Exception) -> bool:
    """Whether the VJP's own code raised ``error`` (a ``Boom`` of the user's, a ZeroDivisionError), which passes
    through unchanged, as it would from the backward of an autograd.Function, rather than the trace (a read of a
    fake value, an op it cannot trace): an exception of a type PyTorch defines, a bare RuntimeError or
    NotImplementedError (what PyTorch's C++ raises), or one raised inside PyTorch's own Python is the trace's, and
    one raised in the library's is its refusal."""
    kind = type(error)
    if kind in (RuntimeError, NotImplementedError) or kind.__module__.split(".")[0] == "torch":
        return False
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is None or not frame.tb_frame.f_code.co_filename.startswith(_NOT_THE_VJPS)


def _falls_back_on(error: Exception) -> bool:
    """Whether a call that can fall back (``stopgrad_math.torch.Function``) hands ``error`` to PyTorch's mechanism:
    a VJP the decorator cannot embed, or one that raised an exception of its own, which the Function's backward
    then raises where PyTorch calls it (in the backward pass, if one runs)."""
    return isinstance(error, NotEmbeddable) or _raised_by_the_vjp(error)


def _fall_back_reason(f: Callable[..., Any], error: Exception) -> str:
    if isinstance(error, NotEmbeddable):
        return str(error)
    return (f"The vjp of {name_of(f)} raised {type(error).__name__} ({error}) when the decorator ran it to prove it "
            "linear: PyTorch's mechanism runs it in the backward pass instead.")


def _untraceable(f: Callable[..., Any], error: Exception, where: str, vjp: Any = None) -> NotEmbeddable:
    """What make_fx raised on a VJP it traced (a value read, a wrapped tensor, a compiled function, a sparse tensor),
    said as what to change: ``where`` is "eagerly", where only the cotangent is fake, "under torch.func", where the
    tensors the VJP closes over are lifted out, or "under torch.compile", where ``vjp`` is the one the proof's trace
    of f made (elsewhere ``_traced`` has refused a sparse tensor before tracing)."""
    sparse = vjp_closure.sparse_read(vjp)
    if sparse is not None:
        return _sparse_refusal(f, sparse)
    if "dynamo-optimized" in str(error):
        return NotEmbeddable(f"The vjp of {name_of(f)} calls a function compiled with torch.compile, which the "
                          "decorator cannot trace into ATen ops to prove it linear: call the function uncompiled "
                          "inside the vjp, and compile the caller of the decorated function instead.")
    advice = ("it may not read a tensor's value in Python, nor index with a boolean mask (write the choice with "
              "torch.where)")
    if where == "eagerly":
        advice = ("it may not read its cotangent's value in Python (item, float, int, bool, tolist, numpy, or a "
                  "branch on a tensor computed from it): a VJP is linear in the cotangent, so no value of it "
                  "can choose the map (write a choice with torch.where on what it closes over). Eagerly it may "
                  "read the values of the tensors it closes over")
    if where == "under torch.func":
        advice += (", nor a tensor held by an object or a global (close over the tensor itself), since the tensors "
                   "it closes over are lifted out")
    first_line = str(error).splitlines()[0] if str(error) else ""
    return NotEmbeddable(f"The vjp of {name_of(f)} cannot be traced {where} ({type(error).__name__}: {first_line}). "
                      f"There the decorator traces it by shapes alone: {advice}.")


def _proven_states(cotangents: _Cotangents, states: list[Judged]) -> list[int]:
    """The argument leaves (by index) whose cotangent is linear in the cotangent of y, from the states of the
    traced VJP's outputs; ValueError naming the op or the leaf where it is not linear."""
    f, leaves = cotangents.f, cotangents.leaves
    return [k for k, state in zip(cotangents.found, states, strict=True)
            if linearity.kept(state, name_of(f), leaves.labels[k], leaves.values[k], k in leaves.differentiable,
                              "stopgrad_math.torch.linear_ops")]


def _proven(cotangents: _Cotangents, vjp: Callable[[Any], Any],
            order: int) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None]:
    """The argument leaves whose cotangent is linear (``_proven_states`` of the VJP traced as ``_traced`` does);
    the map from the cotangents of y to theirs: the traced graph, with what the VJP closes over stopped (order 1)
    or live (order 2); what it closes over, as it is; and the map's transpose J·v where it is at hand (None: the
    pullback of torch.func.vjp of the map). Eagerly and under torch.func, outside any trace, the proof of a known
    signature (``_known``)."""
    if not torch._C._len_torch_dispatch_stack():
        known = _known(cotangents, vjp, order)
        if known is not None:
            return known
    traced = _traced(cotangents, vjp)
    kept = _proven_states(cotangents, traced.states())
    constants = traced.constants if order == 2 else [identity.stop(c) for c in traced.constants]
    return kept, traced.linear(constants, [cotangents.found.index(k) for k in kept]), traced.constants, None


# ---------------------------------------------------------------- proofs kept by signature


@dataclasses.dataclass(frozen=True)
class _Proof:
    """A VJP proven once for its signature: the argument leaves whose cotangent is linear, and the graphs of
    ``_maps`` (its map and its transpose), each a function of the cotangents (or v) and then the values the
    VJP closes over: its tensors, and its Python floats at ``floats`` (by position among those values), which the
    graphs take as symbols. It holds no tensor of the call it was made at: the graphs were traced on stand-ins."""

    kept: list[int]
    vjp_map: torch.fx.GraphModule | None  # None where nothing is kept
    transposed: torch.fx.GraphModule | None
    maps_tangents: bool = False  # forward mode differentiates the transpose by applying it to the tangents
    factor: torch.fx.GraphModule | None = None  # the transpose is v times this graph's tensor
    floats: tuple[int, ...] = ()


PROOFS_KEPT = 256
_PROOFS: bounded_cache.BoundedCache[Any] = bounded_cache.BoundedCache(PROOFS_KEPT)
_TRACED_AT_EVERY_CALL = object()  # a signature whose VJP reads a value, or closes over a tensor it made itself
_FLOATS_BY_VALUE = object()  # a signature whose VJP reads a float it closes over: proven per value of its floats


def _known(cotangents: _Cotangents, vjp: Callable[[Any], Any],
           order: int) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None] | None:
    """``_proven`` from the proof made at the first call of the VJP's signature (``_signature``): the VJP's code,
    the values in its closure other than tensors and floats, the globals it reads, each tensor's ``tensor_key``,
    the arguments' and y's structure and leaves, the order. A float it closes over is a symbol of the proof
    (``size_conditions.floats_as_symbols``), so that a learning rate changing at every call is proven once; where
    the VJP reads one's value (a branch, ``math.exp``), each value is a signature. None where the VJP cannot be
    keyed (``vjp_closure.keyed``), or where a trace by shapes alone fails (it reads a value in Python) or keeps a
    tensor: then it is traced at every call, as before."""
    found = _kept(cotangents, vjp, order, floats=True)
    if found is not None and found[1] is _FLOATS_BY_VALUE:
        found = _kept(cotangents, vjp, order, floats=False)
    if found is None or found[1] is _TRACED_AT_EVERY_CALL:
        return None
    opened, proof = found
    tensors = [t for k, t in enumerate(opened.arrays) if k not in proof.floats]
    vjp_map, transposed = proof.vjp_map, proof.transposed
    if vjp_map is None or transposed is None:
        return [], lambda *cts: [], tensors, None
    floats = tuple((k, opened.arrays[k]) for k in proof.floats)
    constants = tensors if order == 2 else [identity.stop(t) for t in tensors]

    def put_back(graph: Any) -> Any:
        return _FloatsPutBack.around(graph, floats, len(tensors))

    # (forward: a Module's call adds its hooks' checks)
    linear = linear_ops.LinearMap(put_back(vjp_map).forward, constants)
    return list(proof.kept), linear, tensors, _Transpose(put_back(transposed), constants, proof.maps_tangents,
                                                         put_back(proof.factor))


def _kept(cotangents: _Cotangents, vjp: Callable[[Any], Any], order: int,
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
    back among those where the graph took them (``_with_numbers``)."""

    graph: torch.fx.GraphModule
    floats: tuple[tuple[int, float], ...]
    tensors: int  # how many of its inputs, last, are the tensors

    @classmethod
    def around(cls, graph: Any, floats: tuple[tuple[int, float], ...], tensors: int) -> Any:
        """The graph, or where it takes floats, the graph with them put back (None stays None)."""
        return graph if graph is None or not floats else cls(graph, floats, tensors)

    def forward(self, *inputs: torch.Tensor) -> Any:
        first = len(inputs) - self.tensors
        return self.graph.forward(*inputs[:first], *_with_numbers(list(inputs[first:]), self.floats))


@dataclasses.dataclass(frozen=True)
class _Transpose:
    """A proof's J·v, run on v with the tensors the VJP closes over; ``maps_tangents``: forward mode differentiates
    it by applying it to the tangents (``eager_fast_path.maps_tangents``); ``factor``: J·v is v times this graph's
    tensor (``eager_fast_path.product_factor``)."""

    graph: torch.fx.GraphModule | _FloatsPutBack
    constants: list[torch.Tensor]
    maps_tangents: bool
    factor: torch.fx.GraphModule | _FloatsPutBack | None = None

    def __call__(self, *vs: torch.Tensor) -> list[torch.Tensor]:  # v as the stand-ins it was traced on: contiguous
        return list(self.graph.forward(*[v.contiguous() for v in vs], *self.constants))


def _proof(cotangents: _Cotangents, opened: closure_key.Opened) -> Any:
    """The ``_Proof`` of the VJP opened; ``_TRACED_AT_EVERY_CALL`` where a trace by shapes fails, proves nothing,
    keeps a tensor, or, under vmap, indexes with a mask made from a batched tensor (``_traced`` then says which).
    Shapes are read where the call is, and the graphs traced outside any torch.func transform, on plain
    stand-ins. Where the VJP closes over floats, each is a symbol (``size_conditions.floats_as_symbols``), and
    ``_FLOATS_BY_VALUE`` where the trace read one or failed: their values decide."""
    examples = cotangents.examples()
    floats = tuple(k for k, a in enumerate(opened.arrays) if type(a) is float)
    makers = [*(stand_in(e) for e in examples),
              *((lambda: 0.0) if type(a) is float else vjp_closure.strided_stand_in(a) for a in opened.arrays)]
    describe = cotangents.described()
    leaves = cotangents.leaves
    leaf_makers = {k: stand_in(leaves.values[k]) for k in leaves.differentiable}
    batched = {len(examples) + k for k, t in enumerate(opened.arrays) if _batched(t)}
    with linear_ops.exclusive(), temporarily_clear_interpreter_stack():  # (exclusive: the modules made here too)
        stand_ins: list[Any] = [make() for make in makers]
        if floats:
            stand_ins = size_conditions.floats_as_symbols(stand_ins)
        try:
            traced = _traced_by_shapes(cotangents, describe, opened.rebuild, stand_ins, len(examples))
            kept = _proven_states(cotangents, traced.states())
        except Exception:  # a read of a value (an op on it: item's _local_scalar_dense), or no proof: the trace on
            # the real tensors it closes over says what is allowed, or names the op
            return _FLOATS_BY_VALUE if floats else _TRACED_AT_EVERY_CALL
        if not all(k in traced.literals and c.numel() == 1 for k, c in enumerate(traced.constants)) or (
                batched and linear_ops.boolean_mask_op(traced.graph, batched) is not None):
            return _FLOATS_BY_VALUE if floats else _TRACED_AT_EVERY_CALL
        proof = _Proof([], None, None)
        if kept:
            try:
                vjp_map, transposed = _maps(traced, [cotangents.found.index(k) for k in kept],
                                            [leaf_makers[k]() for k in kept], stand_ins, len(examples), [])
            except Exception:
                if floats:
                    return _FLOATS_BY_VALUE
                raise
            proof = _Proof(kept, vjp_map, transposed, eager_fast_path.maps_tangents(transposed, len(kept)),
                           eager_fast_path.product_factor(transposed, len(kept)), floats)
        if floats and size_conditions.branched(stand_ins):
            return _FLOATS_BY_VALUE
    cotangents.warn_if_none_found()
    return proof


def _signature(cotangents: _Cotangents, opened: closure_key.Opened, order: int) -> Hashable | None:
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
    batched = tuple(k for k, t in enumerate(opened.arrays) if _batched(t)) \
        if second_derivative_guard.in_transform() else ()
    return (opened.key, name_of(cotangents.f), tuple(cotangents.names), order,
            structure_key(cotangents.leaves.structure), leaves, structure_key(cotangents.outputs.structure), outputs,
            batched)


def _leaf_key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return vjp_closure.tensor_key(value)
    if type(value) in (type(None), bool, int, float, complex, str, bytes):
        return type(value), value
    raise TypeError(type(value).__name__)


def _shape_of(tensor: torch.Tensor, specialized: bool) -> tuple[tuple[int | None, ...], torch.dtype, torch.device]:
    """What a stand-in is made of, under Dynamo: each a constant of the graph. First the rank alone (each size
    None), so that one proof serves every size and Dynamo guards none; ``specialized``: the sizes (a range's
    length is one Dynamo must know, and a dynamic size is specialized by it), so the proof is for this shape, and
    another recompiles and proves. (Dynamo shows a dynamic size as an int: none can be told apart.)"""
    if specialized:
        return tuple(len(range(n)) for n in tensor.shape), tensor.dtype, tensor.device
    return tuple(None for _ in tensor.shape), tensor.dtype, tensor.device


Linear = Callable[..., list[torch.Tensor]]


def _proven_while_compiling(f: Callable[..., Any], leaves: Leaves, kwargs: dict[str, Any], outputs: Leaves,
                            names: list[str], order: int, falls_back: bool = False,
                            ) -> tuple[list[int], Linear | None, Linear | None, bool] | str:
    """``_proven`` where Dynamo traces the call. The VJP there is Dynamo's variable, not a function make_fx can
    trace again, so ``_stopgrad_math_proof`` traces f and its VJP anew, on fake tensors of the arguments' shapes:
    a constant of the graph to Dynamo, made as it traces, and again when it recompiles for another f, rank or
    dtype; first for the ranks alone (``_shape_of``), then, where that proof does not serve, for the sizes. What
    it is given must be constants to Dynamo: the nest ``(args, kwargs)`` with every leaf None, then each tensor
    leaf as (shape, dtype, device) and each other leaf as itself, one argument apiece (an object or a module is
    taken as it is there, guarded by its identity, and not inside a tuple). Where the proof registered
    the map and its transpose (``_registered``), they come back as functions of y's cotangents and of v, run on
    f's arguments stopped; else None, and the VJP is differentiated as Dynamo traces it. ``falls_back``: a VJP
    that cannot be embedded gives the reason (a ``NotEmbeddable``'s message, a constant) rather than raising."""
    nest = (leaves.with_values({}), kwargs)
    flat = pytree.tree_leaves(nest)
    skeleton = pytree.tree_map(lambda v: None, nest)
    tensors = tuple(k for k, v in enumerate(flat) if isinstance(v, torch.Tensor))
    # f's Python floats, symbols in the proof for any size: Dynamo keeps one that changed between calls as a
    # symbol, no constant to give a proof, and shows it as a float like any other. (An int is given as it is: one
    # is a dim or a count as often as a number, which a symbol would make a proof per size.)
    numbers = tuple(k for k, v in enumerate(flat) if type(v) is float)
    order = 1 if order == 1 else 2  # a constant: with dynamic=True Dynamo takes a closed-over int for an input
    key, condition, *kept = _stopgrad_math_proof(
        f, tuple(names), order, falls_back, skeleton, tensors, numbers,
        tuple(_shape_of(t, False) for t in outputs.tensors()),
        *[_shape_of(v, False) if isinstance(v, torch.Tensor) else _A_FLOAT if k in numbers else v
          for k, v in enumerate(flat)])
    # the sizes and numbers where the proof for any size holds, given as it was traced on them: cotangents as the
    # compiled call makes them (contiguous zeros), then f's argument tensors and numbers. Elsewhere the proof is
    # for this call's sizes alone (the numbers still symbols: Dynamo cannot make one a constant again)
    traced_on = [*_zeros_like(outputs.tensors()), *(flat[k] for k in tensors), *(flat[k] for k in numbers)]
    if key == _PER_SIZE or not size_conditions.holds(condition, traced_on):
        key, condition, *kept = _stopgrad_math_proof(
            f, tuple(names), order, falls_back, skeleton, tensors, numbers,
            tuple(_shape_of(t, True) for t in outputs.tensors()),
            *[_shape_of(v, True) if isinstance(v, torch.Tensor) else _A_FLOAT if k in numbers else v
              for k, v in enumerate(flat)])
        if key != _REFUSED and not size_conditions.holds(condition, traced_on):
            if falls_back:
                return _BRANCH_ON_A_FLOAT.format(name=name_of(f))
            refuse(_BRANCH_ON_A_FLOAT.format(name=name_of(f)))
    if key == _REFUSED:
        return _REFUSALS[int(kept[0])]
    if key == _REVERSE_ONLY:
        return _graphs_at(f, kept[0], list(kept[1:]), flat, tensors, numbers, order, reverse_only=True)
    if key < 0:
        return kept, None, None, False
    return _graphs_at(f, key, kept, flat, tensors, numbers, order, reverse_only=False)


def _graphs_at(f: Callable[..., Any], key: int, kept: list[int], flat: list[Any], tensors: tuple[int, ...],
               numbers: tuple[int, ...], order: int,
               reverse_only: bool) -> tuple[list[int], Linear, Linear | None, bool]:
    """``_proven_while_compiling``'s answer from the graphs registered at ``key``, run on f's arguments (stopped at
    order 1) and the tensors it reads from outside; last, whether the map is embedded alone (``_REVERSE_ONLY``),
    said as a flag: Dynamo before torch 2.8 cannot ask isinstance of a function, which the map is at order 1."""
    given = [*(identity.stop(flat[k]) if order == 1 else flat[k] for k in tensors), *(flat[k] for k in numbers)]
    reader = _stopgrad_math_reader(f, key)
    if reader:  # the tensors from outside, read as f reads them
        given += [identity.stop(t) if order == 1 else t for t in getattr(_READERS, reader)(*flat)]
    if order == 2 or reverse_only:  # mapped_zero's derivatives: J from the arguments as given; jvp J·v, where
        return kept, _Registered(key, given), None, reverse_only  # it can be formed
    return (kept, lambda *cts: list(_run_compiled(key, *cts, *given)),
            lambda *vs: list(_run_compiled(key + 1, *vs, *given)), False)


_A_FLOAT = "float"  # a float argument as the proof is given it: a symbol, whatever its value

_BRANCH_ON_A_FLOAT = (
    "{name} or its vjp branches on the value of a Python float argument that torch.compile keeps as a symbol (it "
    "changed between calls), and took another branch at the value the decorator proves for any float than it "
    "takes at this call's. Pass the float as a tensor, or have Dynamo specialize floats "
    "(torch._dynamo.config.specialize_float = True), as it did before the value changed.")


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def refuse(message: str) -> None:
    """Raises NotEmbeddable while Dynamo compiles, as a proof does: Dynamo runs this as it traces, so that the error
    leaves the compilation as it is (raised in the code Dynamo traces, it would be a graph break, and the call run
    again in pieces)."""
    raise NotEmbeddable(message)


@dataclasses.dataclass(frozen=True)
class _Registered:
    """The graphs registered at ``key`` for a compiled call at order 2 (or one whose J·v cannot be formed, at order
    1: ``_REVERSE_ONLY``), and the tensors they read after their first
    inputs (f's arguments as they are, then those read from outside)."""

    key: int
    given: list[torch.Tensor]

    def __call__(self, *cts: torch.Tensor) -> list[torch.Tensor]:
        return list(_run_compiled(self.key, *cts, *self.given))


@dataclasses.dataclass(frozen=True)
class _KeyedMaps:
    """``identity.mapped_zero``'s maps from the graphs at ``key``, inside a compiled graph (``_run_mapped_zero``);
    ``numbers``: the Python numbers among the graphs' inputs, by position, which a Function carries beside its
    tensor inputs."""

    key: int
    numbers: tuple[tuple[int, Any], ...] = ()

    def zeros(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros_like(p) for p in _COMPILED[self.key + 1](*vs, *self._with_numbers(constants))]  # (dead
        # J·v: DCE'd)

    def linear(self, cts: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(_COMPILED[self.key](*cts, *self._with_numbers(constants)))

    def transposed(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        second_derivative_guard.check_forward_over_forward(_NAMES.get(self.key, "f"))
        if self.key in _WITHOUT_TRANSPOSE:
            raise RuntimeError(_WITHOUT_TRANSPOSE[self.key])
        return list(_COMPILED[self.key + 1](*vs, *self._with_numbers(constants)))

    def _with_numbers(self, tensors: list[torch.Tensor]) -> list[Any]:
        return _with_numbers(tensors, self.numbers)


def _with_numbers(tensors: list[torch.Tensor], numbers: tuple[tuple[int, Any], ...]) -> list[Any]:
    """The tensors with each number put back at its position among the values a graph takes."""
    given: list[Any] = list(tensors)
    for k, number in numbers:
        given.insert(k, number)
    return given


_NAMES: dict[int, str] = {}  # the decorated function's name at each key of ``_COMPILED``, for its messages
_WITHOUT_TRANSPOSE: dict[int, str] = {}  # why J·v cannot be formed (``_without_derivative``), at such a key


@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def _run_mapped_zero(key: int, count: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``identity.mapped_zero`` of the graphs at ``key`` on the ``count`` zeros v and then the tensors they read,
    in a compiled graph: Dynamo keeps the call (it traces no Function with a jvp), and AOTAutograd traces the
    Function and its derivatives in every mode."""
    constants = tensors[count:]
    numbers = tuple((k, c) for k, c in enumerate(constants) if not isinstance(c, torch.Tensor))
    return tuple(identity.mapped_zero(_KeyedMaps(key, numbers), list(tensors[:count]),
                                      [c for c in constants if isinstance(c, torch.Tensor)]))


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def _stopgrad_math_proof(f: Callable[..., Any], names: tuple[str, ...], order: int, falls_back: bool, skeleton: Any,
                         tensors: tuple[int, ...], numbers: tuple[int, ...], cotangents: tuple[Any, ...],
                         *flat: Any) -> tuple[int, ...]:
    """``_proof_for_any_size`` (shapes of their rank alone) or ``_proof_of_f``, made once for f's key
    (``vjp_closure.keyed``: its code, closure and globals) and what it is given: a decorated function called at
    several places of one compiled program is proven once. Its name is Dynamo's for the constant it keeps in the
    globals of the compiled function (torch 2.6 to 2.13), where it should meet nothing of the user's.
    ``falls_back``: a ``NotEmbeddable`` comes back as ``(_REFUSED, 0, k)``, its message ``_REFUSALS[k]``."""
    _forget_what_dynamo_forgot()
    opened = vjp_closure.keyed(f)
    key: Hashable = None
    if opened is not None:
        # which closed-over tensors are one: a proof's graphs read each tensor it traced once
        aliases = tuple(next(i for i, b in enumerate(opened.arrays) if b is a) for a in opened.arrays)
        key = (opened.key, aliases, names, order, falls_back, structure_key(pytree.tree_structure(skeleton)), tensors,
               numbers, cotangents, tuple(_held_weakly(v) for v in flat))
        try:
            hash(key)
        except TypeError:  # a leaf that is not hashable: proven at each compilation
            key = None
    known = None if key is None else _PROVEN_WHILE_COMPILING.get(key)
    if known is not None:
        return known
    any_size = any(n is None for shape, _, _ in [*cotangents, *(flat[k] for k in tensors)] for n in shape)
    try:
        proof = (_proof_for_any_size(f, names, order, skeleton, tensors, numbers, cotangents, *flat) if any_size
                 else _proof_of_f(f, names, order, skeleton, tensors, numbers, cotangents, *flat,
                                  symbolic=bool(numbers)))
    except Exception as error:
        if not (falls_back and _falls_back_on(error)):
            raise
        _REFUSALS.append(_fall_back_reason(f, error))
        proof = (_REFUSED, 0, len(_REFUSALS) - 1)
    return proof if key is None else _PROVEN_WHILE_COMPILING.put(key, proof)


_PROVEN_WHILE_COMPILING: bounded_cache.BoundedCache[tuple[int, ...]] = bounded_cache.BoundedCache(PROOFS_KEPT)
_REFUSED = -3  # a proof's first number where the VJP cannot be embedded and the call falls back
_REVERSE_ONLY = -4  # one whose transpose cannot be formed (``_registered``): then the key, and the leaves kept
_REFUSALS: list[str] = []  # their reasons, one per compilation that fell back


def _held_weakly(value: Any) -> Any:
    """A leaf of f's arguments in a compiled proof's key: one compared by identity (a module, an object of the
    caller's) by a weak reference (``function_identity.same``, equal to nothing once the object is gone), so
    that the key keeps it alive no longer than its caller; any other as it is."""
    kind: Any = type(value)  # (a class's slots, compared with object's)
    if kind.__hash__ is object.__hash__ and kind.__eq__ is object.__eq__:
        return function_identity.same(value)
    return value


def _dynamo_has_not_reset(*args: Any) -> None:
    """A compilation callback, registered so that its absence tells of a ``torch._dynamo.reset()``, which clears
    them."""


def _forget_what_dynamo_forgot() -> None:
    """After ``torch._dynamo.reset()``, which forgets every compiled function (as a new process would start), the
    proofs and graphs made for them are dropped too, as Dynamo drops its own side tables; a compiled function
    made since compiles and proves anew."""
    handler = torch._dynamo.callback.callback_handler
    if _dynamo_has_not_reset in handler.start_callbacks:
        return
    tables = (_PROVEN_WHILE_COMPILING, _COMPILED, _NAMES, _READS, _REFUSALS, _WITHOUT_TRANSPOSE)
    for table in tables:  # (a reader goes with its f)
        table.clear()
    size_conditions.forget()
    handler.register_start_callback(_dynamo_has_not_reset)


def _proof_of_f(f: Callable[..., Any], names: tuple[str, ...], order: int, skeleton: Any, tensors: tuple[int, ...],
                numbers: tuple[int, ...], cotangents: tuple[Any, ...], *flat: Any,
                symbolic: bool = False) -> tuple[int, ...]:
    """``(key, condition, *kept)``: the argument leaves whose cotangent is linear (``_proven_states``), from f and
    its VJP traced together on fake tensors (f's own ops read no cotangent, so only the VJP's are judged), and the
    key of the graphs registered for them (``_registered``; negative: none). ``skeleton``: the nest ``(args,
    kwargs)``, ``flat`` its leaves, those at ``tensors`` as (shape, dtype, device); ``cotangents``: (shape, dtype,
    device) of y's differentiable leaves. ``symbolic``: each size None is a symbol (``size_conditions``), as is
    each leaf at ``numbers`` (a float, given as ``_A_FLOAT``), and ``condition`` says at which sizes and numbers
    the proof holds; else 0, every size and number is given and the proof is for those."""
    structure = pytree.tree_structure(skeleton)
    count = len(cotangents)
    read: list[_Cotangents] = []
    vjps: list[Any] = []  # the last one f returned, for an error to read

    def vjp_of_f(*values: torch.Tensor) -> list[torch.Tensor]:
        given = dict(zip((*tensors, *numbers), values[count:], strict=True))
        args, kwargs = pytree.tree_unflatten([given.get(k, v) for k, v in enumerate(flat)], structure)
        roots = list(values[count:count + len(tensors)]) if order == 2 else None  # (its argument tensors)
        # f in grad mode, as a call runs it (the trace runs as a backward does, without): at order 2 the watch
        # then finds only what f itself computes with grad mode off. A decorated call in f gives its value alone:
        # only the VJP's ops are judged.
        with nesting.evaluating(1), unrecorded.watching(roots) as watch, torch.set_grad_enabled(order == 2):
            y, vjp = call_f(f, args, kwargs)
        vjps.append(vjp)
        lifted = vjp_closure.lifted(vjp)
        unrecorded.check(watch, [] if lifted is None else lifted.tensors, name_of(f))
        read.append(_Cotangents(f, list(names), Leaves.of_arguments(args, list(names)), Leaves.of(y, "y"), order))
        return read[-1].of(vjp)(*values[:count])

    try:
        # Traced apart from Dynamo's own trace: outside the torch.func transforms it may be tracing, and with no
        # tracing context, whose fake mode (dynamic shapes, no real tensor allowed) make_fx would take up.
        with temporarily_clear_interpreter_stack(), torch._guards.tracing(None):
            shapes = [*cotangents, *(flat[k] for k in tensors)]
            examples = size_conditions.stand_ins(shapes, len(numbers)) if symbolic else [
                torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in shapes]
            traced = linear_ops.trace(vjp_of_f, *examples, cotangents=count, fake=True)
            kept = _proven_states(read[-1], traced.states())
            positions = [read[-1].found.index(k) for k in kept]
            kept_examples = [examples[count + tensors.index(k)] for k in kept]
            if kept:  # (as written where its autodiff is the map and J·v can be formed)
                reads = _routed(f, traced, flat, order, lambda: linear_ops.differentiated_as_traced(
                    vjp_of_f, *examples, traced=traced) and _transposable(
                    traced, positions, kept_examples, examples, count, name_of(f)))
            if not kept or reads is None:  # nothing to embed (y keeps a zero derivative, whatever the VJP's
                # autodiff), or differentiated as Dynamo traces it
                return (-1, size_conditions.condition(examples) if symbolic else 0, *kept)
            outside = [k for k in range(len(traced.constants)) if k not in traced.literals]
            key = _registered(traced, positions, kept_examples, examples, count, outside, name_of(f))
            _READS[key], _NAMES[key] = reads, name_of(f)
            # (after the graphs, made on the same stand-ins: any size they assumed is in the condition too)
            condition = size_conditions.condition(examples) if symbolic else 0
            if key in _WITHOUT_TRANSPOSE:
                return (_REVERSE_ONLY, condition, key, *kept)
            return (key, condition, *kept)
    except (ValueError, TypeError, LookupError):
        raise
    except Exception as error:
        if _raised_by_the_vjp(error):
            raise
        raise _untraceable(f, error, "under torch.compile", vjps[-1] if vjps else None) from error


def _routed(f: Callable[..., Any], traced: linear_ops.Traced, flat: Sequence[Any], order: int,
            as_written: Callable[[], bool]) -> list[outside_reads.Path] | None:
    """How a compiled call embeds the VJP ``traced`` (with f, as a backward runs): through registered graphs of
    its map and transpose (``_registered``), which read the tensors from outside at the paths returned (``[]``:
    none); or None, differentiated as Dynamo traces it. Graphs serve where the VJP's literals are numbers: at
    order 1 with no tensor from outside, and wherever its autodiff as written is not the map (``as_written``), if
    f's code reaches every tensor from outside by a name (``outside_reads``). Else the autodiff as written serves
    where it is the map, and anything else is refused: a ValueError naming why."""
    outside = [traced.constants[k] for k in range(len(traced.constants)) if k not in traced.literals]
    numbers = all(traced.constants[k].numel() == 1 for k in traced.literals)
    if numbers and not outside:
        return []
    if order == 1 and as_written():  # (order 2 embeds the graphs alone: their derivatives are mapped_zero's)
        return None
    reads = outside_reads.paths(f, flat, outside, _is_shape, _module_members) if numbers else None
    if reads is None:
        raise NotEmbeddable(f"The vjp of {name_of(f)} computes without grad mode (no_grad, set_grad_enabled(False), "
                         "inference_mode, @once_differentiable), branches on it, changes its cotangent in place or "
                         "detaches it (detach, .data), as a Function's backward may. Eagerly and under torch.func "
                         "the decorator embeds the map such a backward applies; under torch.compile it does so where "
                         "it reaches each tensor f and its vjp read from outside (a weight) by a name their code "
                         "reads: a cell of f's closure or of a function held there, a global of f's module, an "
                         "argument, or an attribute of one of those. Here it did not (a tensor read as an item of a "
                         "list or a dict, a global of another module, a tensor made from a literal of several "
                         "elements), and differentiating the vjp as written would not give that map. Pass that "
                         "tensor to f as an argument or read it by such a name, or write the vjp in grad mode with "
                         "no stop on the cotangent's path.")
    return reads


_PER_SIZE = -2  # a proof for any size failed: prove for this size, which Dynamo then guards


def _proof_for_any_size(f: Callable[..., Any], names: tuple[str, ...], order: int, skeleton: Any,
                        tensors: tuple[int, ...], numbers: tuple[int, ...], cotangents: tuple[Any, ...],
                        *flat: Any) -> tuple[int, ...]:
    """``_proof_of_f`` for shapes of their rank alone (sizes None, each a symbol): it serves every size where its
    condition holds (``size_conditions``) and the VJP is differentiated as Dynamo traces it anyway (it closes over
    an outside tensor, or ``order=2``; ``differentiated_as_traced``; its ops are judged linear whatever the
    sizes). Anything else is ``_PER_SIZE``, proven again at this call's sizes: a VJP whose map and transpose are
    registered as graphs (they are made for one size), a VJP written as a backward, a trace that fails with sizes
    as symbols (a size read as a number), a refusal."""
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs an op that fails at the stand-in sizes
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return _proof_of_f(f, names, order, skeleton, tensors, numbers, cotangents, *flat, symbolic=True)
    except Exception:  # said again, at this call's sizes, by the proof that follows
        return (_PER_SIZE, 0)
    finally:
        quiet.setLevel(level)


_READS: dict[int, list[outside_reads.Path]] = {}
"""Where the compiled call at each key of ``_COMPILED`` reads the tensors from outside that its graphs take last
(``outside_reads.paths``): none for most."""
_READERS = types.ModuleType("stopgrad_math.torch.decorator_form._READERS")
"""The readers of those tensors, one per f and key, as attributes: Dynamo inlines one found there as it inlines
f, reading f's cells and globals at each call and guarding them as it guards f's reads."""
_READER_NAMES: weakref.WeakKeyDictionary[Callable[..., Any], dict[int, str]] = weakref.WeakKeyDictionary()
_READER_NUMBERS = itertools.count()


def _module_members(value: Any) -> list[str]:
    """What a layer's own code reads, not f's: a module's parameters, buffers and submodules; a Keras layer's
    variables and layers (its attributes), and a Keras variable's tensor, its ``value``."""
    members = [*value._parameters, *value._buffers, *value._modules] if isinstance(value, torch.nn.Module) else []
    keras = sys.modules.get("keras")  # (a Keras layer is of Keras's, imported by whoever made one)
    if keras is None:
        return members
    if isinstance(value, keras.Variable):
        return ["value"]
    if isinstance(value, keras.layers.Layer):
        members += [name for name, held in vars(value).items() if isinstance(held, keras.Variable | keras.layers.Layer)]
    return members


def _is_shape(value: Any) -> bool:
    """An argument leaf as the proof is given it: a tensor's (shape, dtype, device), not an object to follow."""
    return type(value) is tuple


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def _stopgrad_math_reader(f: Callable[..., Any], key: int) -> str:
    """The name in ``_READERS`` of f's reader of the outside tensors the graphs at ``key`` take, made once per f
    and key and dropped with f; "" where they take none."""
    reads = _READS.get(key)
    if not reads:
        return ""
    names = _READER_NAMES.setdefault(f, {})
    if key not in names:
        names[key] = name = f"read{next(_READER_NUMBERS)}"
        function = typing.cast(types.FunctionType, f)  # paths are found for a plain function alone
        setattr(_READERS, name, outside_reads.reader(function, reads))
        weakref.finalize(f, delattr, _READERS, name)
    return names[key]


_COMPILED: dict[int, torch.fx.GraphModule] = {}
"""The maps compiled calls run (``_run_compiled``), by key: two for each compilation of a decorated call, kept as
long as the compiled code that calls them (which Dynamo keeps, bounded by its recompile limit, until
``torch._dynamo.reset()``: ``_forget_what_dynamo_forgot``)."""
_KEYS = itertools.count(0, 2)  # (next() of a count is atomic: two threads compiling at once get two keys)


def _registered(traced: linear_ops.Traced, positions: list[int], kept_examples: list[torch.Tensor],
                examples: list[torch.Tensor], count: int, outside: list[int], name: str) -> int:
    """Keys of the two graphs ``_maps`` makes for a compiled call, from f and its VJP traced as a backward runs,
    with the tensors of f's arguments and then those it reads from outside as their last inputs: at ``key`` the
    VJP's map, at ``key + 1`` its transpose. Inside the compiled graph AOTAutograd differentiates their ops, so a
    VJP under no_grad or with a branch on grad mode is embedded as the map a backward applies, as it is eagerly.
    Where the transpose cannot be formed (``_without_derivative``), ``key + 1`` gives zeros in its shapes and
    ``_WITHOUT_TRANSPOSE`` says why: the call embeds the map alone (``_REVERSE_ONLY``)."""
    key = next(_KEYS)
    (_COMPILED[key], _COMPILED[key + 1]), reason = _maps_or_reason(traced, positions, kept_examples, examples,
                                                                   count, outside, name)
    if reason is not None:
        _WITHOUT_TRANSPOSE[key] = reason
    return key


def _maps_or_reason(traced: linear_ops.Traced, positions: list[int], kept_examples: list[torch.Tensor],
                    examples: list[torch.Tensor], count: int, outside: list[int],
                    name: str) -> tuple[tuple[torch.fx.GraphModule, ...], str | None]:
    """``_maps``, and None; or, where the transpose cannot be formed (``_without_derivative``), the map with zeros
    in the transpose's shapes, and why."""
    try:
        return _maps(traced, positions, kept_examples, examples, count, outside), None
    except RuntimeError as error:
        reason = _without_derivative(error, name)
        if reason is None:
            raise
        return _maps(traced, positions, kept_examples, examples, count, outside, transposable=False), reason


def _transposable(traced: linear_ops.Traced, positions: list[int], kept_examples: list[torch.Tensor],
                  examples: list[torch.Tensor], count: int, name: str) -> bool:
    """False where the VJP runs a layer's backward op (``linear_ops``' table) whose derivative PyTorch does not
    implement, so that J·v cannot be formed (``_without_derivative``); a VJP of no such op is not traced again."""
    if not any(op in linear_ops.LAYER_BACKWARDS for op in traced.recorded):
        return True
    outside = [k for k in range(len(traced.constants)) if k not in traced.literals]
    return _maps_or_reason(traced, positions, kept_examples, examples, count, outside, name)[1] is None


def _maps(traced: linear_ops.Traced, positions: list[int], kept_examples: list[torch.Tensor],
          examples: list[torch.Tensor], count: int, outside: list[int],
          transposable: bool = True) -> tuple[torch.fx.GraphModule, ...]:
    """Two graphs of ATen ops from a VJP traced as a backward runs on ``examples`` (the ``count`` cotangents of y,
    then the tensors of f's arguments), whose own constants are one-element literals but for those at
    ``outside`` (tensors read from outside, which become their last inputs): the VJP's map from y's cotangents to
    those of the argument leaves at ``positions`` among the traced outputs, and its transpose, J·v, from v in
    those leaves' shapes (``kept_examples``); each takes the tensors after its first inputs."""
    numbers = {k: (c.item(), c.shape, c.dtype, c.device) for k, c in enumerate(traced.constants) if k not in outside}
    arguments = len(examples) - count

    def constants(given: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """f's argument tensors, then the graph's constants: an outside tensor as given, a literal made by ops (a
        tensor constant would be real under Dynamo)"""
        read = iter(given[arguments:])
        return [*given[:arguments], *(next(read) if k in outside else torch.full(
            numbers[k][1], numbers[k][0], dtype=numbers[k][2], device=numbers[k][3])
            for k in range(len(traced.constants)))]

    def vjp_map(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:  # (its stops recorded as stops)
        return tuple(linear_ops.stops_recorded(traced.linear(constants(values[count:]), positions))(
            *values[:count]))

    def transposed(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        linear = linear_ops.stops_recorded(traced.linear(constants(values[len(positions):]), positions))
        cotangents = [torch.zeros(e.shape, dtype=e.dtype, device=e.device) for e in examples[:count]]
        if not transposable:  # (its shapes alone: ``_KeyedMaps.zeros``)
            return tuple(cotangents)
        return tuple(torch.func.vjp(linear, *cotangents)[1](list(values[:len(positions)])))

    read = [traced.constants[k].detach() for k in outside]
    with linear_ops.exclusive():
        vjp_module = linear_ops.make_fx(vjp_map, tracing_mode="fake", _allow_non_fake_inputs=True,
                                        decomposition_table=linear_ops.compiled_decompositions())(*examples, *read)
        # v's stand-ins made anew: make_fx binds its inputs by identity, and a kept leaf's example may be among
        # the examples
        transpose_module = linear_ops.make_fx(transposed, tracing_mode="fake", _allow_non_fake_inputs=True,
                                              decomposition_table=linear_ops.compiled_decompositions())(
            *[torch.empty_like(e) for e in kept_examples], *examples[count:], *read)
        for module in (vjp_module, transpose_module):  # the pullback's primal computation is dead
            linear_ops.runnable(module)  # (first: its stops' markers are dead too)
            module.graph.eliminate_dead_code()
            module.recompile()
    return vjp_module, transpose_module


@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def _run_compiled(key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A map ``_registered`` made, in a compiled graph: Dynamo keeps the call, and AOTAutograd traces its ATen ops
    and differentiates them."""
    return tuple(_COMPILED[key](*tensors))


# ---------------------------------------------------------------- the embedding


def _zeros_like(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in tensors]


def _one_element(outputs: Leaves, xs: list[torch.Tensor]) -> bool:
    """Whether J is vjp(1): one differentiable output of one element, complex exactly where the arguments are."""
    if len(outputs.differentiable) != 1:
        return False
    y = outputs.values[outputs.differentiable[0]]
    return y.numel() == 1 and all(x.is_complex() == y.is_complex() for x in xs)


def _evaluated(f: Callable[..., Any], leaves: Leaves, kwargs: dict[str, Any],
               order: int) -> tuple[Any, Any, unrecorded.Watch | None]:
    """f's ``(y, vjp)``: y at stop(x); the VJP at stop(x) (order 1: what it closes over is stopped when it is
    embedded), or at x (order 2, eagerly and under torch.func), watched where reverse mode may differentiate it
    (``unrecorded``: a watch of what f computed without grad mode; else None). At order 2 f runs once where the
    watch saw it read nothing else that requires grad (y detached is then y at stop(x)), else again at stop(x),
    replaying the first call's draws. Compiled, and at order 2 under one torch.func derivative alone, the VJP at
    stop(x) as at order 1."""
    stopped = {k: identity.stop(leaves.values[k]) for k in leaves.differentiable}
    # Compiled, the proof's graphs compute J from the arguments (``_Registered``). Under a jvp, or a grad or vjp,
    # transform alone (``eager_fast_path.forward_transforms_alone``, ``reverse_transforms_alone``: nothing under
    # the wrappers requiring grad) no second derivative can be taken, and the VJP at stop(x) closes over what it
    # closes over at x, in value (``mapped_zero`` gives that no derivative itself).
    tensors = leaves.tensors()
    if order == 1 or identity.compiling() or eager_fast_path.forward_transforms_alone(tensors) \
            or eager_fast_path.reverse_transforms_alone(tensors):
        return (*call_f(f, leaves.with_values(stopped), kwargs), None)
    moving = [leaves.values[k] for k in leaves.differentiable]
    reverse = any(x.requires_grad for x in moving)  # (the watch's lost tensors matter to reverse mode alone)
    drawn = _random_states()
    if reverse or any(unrecorded.moves(x) for x in moving):
        followed = unrecorded.Watch(moving)
        with followed:
            y, vjp = call_f(f, leaves.with_values({}), kwargs)
        watch = followed if reverse else None
        if not followed.reads_outside:  # y depends on the arguments alone: its value at stop(x), no second call
            return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, y), vjp, watch
    else:
        watch, vjp = None, call_f(f, leaves.with_values({}), kwargs)[1]
    _random_states(drawn)  # the second call draws what the first drew: y and the VJP's residuals agree
    return call_f(f, leaves.with_values(stopped), kwargs)[0], vjp, watch


def _random_states(restored: Any = None) -> Any:
    """The states of PyTorch's default generators (the CPU's, and each CUDA device's once CUDA is started), or,
    given states, those set back. f runs twice at order 2: a sampler's value and the residuals its VJP reads
    must be one draw, as where f runs once."""
    if restored is not None:
        cpu, cuda = restored
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return None
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]


@dataclasses.dataclass(frozen=True)
class _Maps:
    """The proven VJP and its transpose as functions of what the VJP closes over, at order 2: the derivatives of
    ``identity.mapped_zero``, which takes those tensors as its inputs."""

    vjp: linear_ops.LinearMap
    transpose: _Transpose | None
    outputs: list[tuple[torch.Size, torch.dtype]]
    cotangents: list[torch.Tensor]  # examples of y's cotangents
    name: str
    without_transpose: str = ""  # why J·v cannot be formed (``_without_derivative``): forward mode raises it

    def zeros(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=dtype, device=vs[0].device) for shape, dtype in self.outputs]

    def linear(self, cts: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.vjp.on(constants)(*cts)

    def transposed(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        second_derivative_guard.check_forward_over_forward(self.name)
        if self.without_transpose:
            raise RuntimeError(self.without_transpose)
        if self.transpose is not None:
            return dataclasses.replace(self.transpose, constants=constants)(*vs)
        return list(torch.func.vjp(self.vjp.on(constants), *_zeros_like(self.cotangents))[1](list(vs)))


_NO_DERIVATIVE = re.compile(r"derivative for (?:aten::)?(\w+) is not implemented")


def _without_derivative(error: RuntimeError, name: str) -> str | None:
    """Why J·v cannot be formed, where forming it (autodiff of the VJP in its cotangent) met a backward op of
    ``linear_ops``' table (linear in its upstream, so the VJP is proven) whose own derivative PyTorch does not
    implement (hardsigmoid_backward, the CPU flash attention's backward): reverse mode needs the VJP alone, and
    gets it; forward mode raises this. None for any other error."""
    found = _NO_DERIVATIVE.search(str(error))
    if found is None or found.group(1) not in linear_ops.RULES:
        return None
    return (f"The vjp of {name} runs aten::{found.group(1)}, which is linear in its upstream gradient but has no "
            "derivative in PyTorch: reverse mode runs the vjp itself, as a torch.autograd.Function would, and "
            "forward mode (J·v, the vjp's transpose, its derivative in the cotangent) cannot be formed. "
            f"PyTorch's error: {error}")


def _attached(linear: Linear, outputs: Leaves, xs: list[torch.Tensor], order: int,
              transposed: Linear | None = None, name: str = "f", alone: bool = False) -> Any:
    """y with each differentiable output's zero term attached; ``linear``: the proven VJP, from the cotangents of
    y's differentiable leaves to those of ``xs``; ``transposed``: its transpose J·v where it is at hand (else the
    pullback of torch.func.vjp of ``linear``); ``alone``: compiled, the map is embedded without its transpose, which
    cannot be formed (``_REVERSE_ONLY``), in order 2's carrier."""
    if (order == 2 or alone) and isinstance(linear, (_Registered, linear_ops.LinearMap)):  # (compiled: _Registered)
        dual = None if alone or isinstance(linear, _Registered) else _dual(outputs, xs, transposed, order)
        if dual is not None:
            return dual
        vs = [identity.zero_with_slope(x, slope_is_negative=True) for x in xs]
        if isinstance(linear, _Registered):
            zeros = list(_run_mapped_zero(linear.key, len(vs), *vs, *linear.given))
        else:
            ys = outputs.tensors()
            maps = _Maps(linear, transposed if isinstance(transposed, _Transpose) else None,
                         [(y.shape, y.dtype) for y in ys], ys, name)
            zeros = identity.mapped_zero(maps, vs, linear.constants)
        return outputs.with_values({k: identity.attach(outputs.values[k], [z])
                                    for k, z in zip(outputs.differentiable, zeros, strict=True)})
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
            torch.func.vjp(linear, *_zeros_like(outputs.tensors()))[1](zeros)
    except RuntimeError as error:
        reason = _without_derivative(error, name)
        if reason is None or not isinstance(linear, linear_ops.LinearMap):
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


def _dual(outputs: Leaves, xs: list[torch.Tensor], transposed: Linear | None, order: int) -> Any:
    """y through the forward-mode fast path (``eager_fast_path.dual_of_map``), where a kept proof's J·v is at hand:
    at order 1 where its graph maps tangents (eagerly, or under a jvp transform), at order 2 under a jvp transform;
    None where the ordinary ops must run. (Not compiled: Dynamo before torch 2.8 cannot ask isinstance of its own
    function.)"""
    if identity.compiling() or not isinstance(transposed, _Transpose) or not (
            transposed.maps_tangents if order == 1 else second_derivative_guard.in_transform()):
        return None
    ys = [outputs.values[k] for k in outputs.differentiable]
    factor = transposed.factor
    duals = eager_fast_path.dual_of_map(ys, xs, transposed, None if factor is None else (
        lambda x: factor.forward(x, *transposed.constants)), linked=order == 1)
    return None if duals is None else outputs.with_values(dict(zip(outputs.differentiable, duals, strict=True)))


def differentiating(args: Sequence[Any]) -> bool:
    """Whether a derivative of a call on ``args`` (a nest) may be taken: an argument that requires grad in grad
    mode, a forward-mode level, a torch.func transform, a trace (make_fx's, an outer VJP's) or a compilation.
    Where none is, a decorated call is f's value alone, as a Function's forward without grad, and the VJP is not
    called; the identity form is fx."""
    if identity.compiling() or second_derivative_guard.forward_mode_possible() \
            or torch._C._len_torch_dispatch_stack():
        return True
    if not torch.is_grad_enabled():
        return False
    flat = args if all(type(a) is torch.Tensor for a in args) else pytree.tree_leaves(args)
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


def _proven_call(cotangents: _Cotangents, vjp: Callable[[Any], Any], kwargs: dict[str, Any],
                 watch: unrecorded.Watch | None,
                 falls_back: bool) -> tuple[list[int], Linear, list[torch.Tensor], Linear | None, bool] | str:
    """``_proven`` eagerly and under torch.func, ``_proven_while_compiling`` under Dynamo: the kept leaves, the VJP's
    map, what it closes over (eagerly), its transpose where at hand, and whether the map is embedded alone (compiled,
    ``_REVERSE_ONLY``); ``falls_back``: a VJP that cannot be embedded gives the reason rather than raising."""
    f, leaves, outputs, names, order = (cotangents.f, cotangents.leaves, cotangents.outputs, cotangents.names,
                                        cotangents.order)
    if identity.compiling():
        proof = _proven_while_compiling(f, leaves, kwargs, outputs, names, order, falls_back=falls_back)
        if isinstance(proof, str):
            return proof
        kept, registered, transposed, alone = proof
        return kept, cotangents.of(vjp, kept) if registered is None else registered, [], transposed, alone
    try:
        kept, linear, closed_over, transposed = _proven(cotangents, vjp, order)
    except Exception as error:
        if not (falls_back and _falls_back_on(error)):
            raise
        return _fall_back_reason(f, error)
    unrecorded.check(watch, closed_over, name_of(f))
    return kept, linear, closed_over, transposed, False


def _embed(f: Callable[..., Any], args: tuple[Any, ...], names: list[str], kwargs: dict[str, Any], order: int,
           guard: bool, fallback: Callable[[str], Any] | None = None) -> Any:
    name = name_of(f)
    if not differentiating(args):
        return call_f(f, args, kwargs)[0]
    leaves = Leaves.of_arguments(args, names)
    if not leaves.differentiable:
        return call_f(f, args, kwargs)[0]
    y, vjp, watch = _evaluated(f, leaves, kwargs, order)
    outputs = Leaves.of(y, "y")
    if not outputs.differentiable:
        return y
    cotangents = _Cotangents(f, names, leaves, outputs, order)
    compiling = identity.compiling()
    proof = _proven_call(cotangents, vjp, kwargs, watch, fallback is not None)
    if isinstance(proof, str):
        assert fallback is not None  # (a reason comes back only where there is one to take it)
        return fallback(proof)
    kept, linear, closed_over, transposed, alone = proof
    xs = [leaves.values[k] for k in kept]
    if not xs:  # every cotangent None or proven zero: y keeps a zero derivative, as a Function's output would
        zero = sum((identity.zero_with_slope(x, slope_is_negative=True).real.sum() * 0.0
                    for x in leaves.tensors()), torch.zeros(()))
        return outputs.with_values({k: identity.attach(outputs.values[k], [zero]) for k in outputs.differentiable})
    if guard and not compiling:  # J depends on xs and what the VJP closes over: derivatives of those count
        second_derivative_guard.check([*xs, *closed_over], order, name)
        product = _product_of_map(outputs, xs, transposed, closed_over, name, order)
        if product is not None:
            return product
        xs = [second_derivative_guard.hooked(x, closed_over, name) for x in xs] if order == 1 else xs
    return _attached(linear, outputs, xs, order, transposed, name, alone)


def _product_of_map(outputs: Leaves, xs: list[torch.Tensor], transposed: Linear | None,
                    closed_over: list[torch.Tensor], name: str, order: int) -> Any:
    """y through the reverse-mode fast path (``eager_fast_path.product_of_map``), at order 1 with the guard, where
    a kept proof's J·v is v times a tensor of the constants, x and y are one each and y is not a one-element
    output (which ``_attached`` embeds as the identity form); None where ``_attached`` must run."""
    if not (order == 1 and isinstance(transposed, _Transpose) and transposed.factor is not None and len(xs) == 1
            and len(outputs.differentiable) == 1 and not _one_element(outputs, xs)):
        return None
    index = outputs.differentiable[0]
    y = eager_fast_path.product_of_map(outputs.values[index], xs[0], transposed.factor.forward, transposed.constants,
                                       closed_over, name)
    return None if y is None else outputs.with_values({index: y})


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
