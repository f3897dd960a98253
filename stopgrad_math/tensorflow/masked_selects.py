"""A select's discarded elements stay zero through the transpose: the guarded division's rule in forward mode.

A grad_fn that guards a division selects after it, ``tf.where(x > 0, dy / x, 0)``:
where ``x`` is 0 the quotient is ``0 / 0`` and the select throws it away. The
tape's transpose of grad_fn (J·v, forward mode's product and order 1's term in a
graph) runs the same ops backwards: the select's gradient first, which puts a
zero where the select discarded, then the division's, ``0 / 0``: NaN, where the
declared Jacobian's element is 0 (the "where NaN trap"; here the user's code
avoided it and the transpose made it).

While ``transposing`` is active, the gradients of a select and of the
elementwise ops linear in one operand (``Mul``, ``RealDiv``, ``Div``; ``Neg``,
``Cast``, ``Identity``, ``AddV2``, ``Sub`` pass the cotangent on) carry the
select's condition down to the op that produced its operand, where that operand
has the select's shape and every op of grad_fn that reads it is such a select
or op (``GradFnOps``, recorded while grad_fn ran; the mask is the union of
theirs, a sum or a nested call reading it leaves it unmasked): a masked
product's gradient is
``where(m, grad · where(m, y, 0), 0)`` and a masked quotient's
``where(m, grad / where(m, y, 1), 0)`` (the "double where"). Where the select
keeps an element these are TensorFlow's own gradients, bit for bit; where it
discards one, +0.0 whatever the op computes there, and so is every derivative
of them (order 1's term in a graph is differentiated again by the caller's
tape). Everywhere else TensorFlow's gradients run unchanged: the registry's
entries are wrapped once, and delegate while nothing transposes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal

_SELECTS = frozenset({"Select", "SelectV2"})
_SCALING = {"Mul": 0.0, "RealDiv": 1.0, "Div": 1.0}  # the coefficient that stands in where the select discards
_CARRYING = {"Mul": (0, 1), "RealDiv": (0,), "Div": (0,)}  # the operands that may carry the cotangent (not a divisor)
_PASSING = frozenset({"Neg", "Cast", "Identity", "AddV2", "Add", "Sub"})
_MASKABLE = _SELECTS | _PASSING | frozenset(_SCALING)  # the ops whose result a mask is carried to


_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "BroadcastGradientArgs"})
"""Ops that read a tensor's shape alone: no cotangent passes through them."""


@dataclasses.dataclass
class GradFnOps:
    """What grad_fn's ops were: which read each tensor and which made it, recorded as they ran (eagerly a tape's
    op keeps its inputs, not its outputs). A forward accumulator's JVP of an op reads it too, and is not counted."""

    consumers: dict[Any, int] = dataclasses.field(default_factory=dict)  # per tensor's ref: ops that read it
    producers: dict[Any, tuple[str, tuple[tf.Tensor, ...]]] = dataclasses.field(default_factory=dict)
    made: dict[tuple[Any, ...], int] = dataclasses.field(default_factory=dict)  # per op's key: how many such ops

    def record(self, op_type: str | bytes, inputs: Any, outputs: Any) -> None:
        op_type = op_type.decode() if isinstance(op_type, bytes) else op_type  # (eagerly, some ops name it in bytes)
        if op_type in _SHAPE_READERS or _tf_internal.runs_a_forward_accumulators_jvp(op_type):
            return
        tensors = tuple(t for t in inputs if isinstance(t, tf.Tensor))
        for tensor in tensors:
            self.consumers[tensor.ref()] = self.consumers.get(tensor.ref(), 0) + 1
        if len(tensors) == len(inputs) and outputs is not None and len(outputs) == 1:
            self.producers[outputs[0].ref()] = (op_type, tensors)
            key = _key(op_type, tensors)
            self.made[key] = self.made.get(key, 0) + 1


def _key(op_type: str, inputs: Any) -> tuple[Any, ...]:
    return (op_type, *(t.ref() if isinstance(t, tf.Tensor) else None for t in inputs))


@dataclasses.dataclass
class _Transpose:
    ops: GradFnOps
    results: set[Any]  # refs of grad_fn's results, read beside its ops
    masks: dict[tuple[Any, ...], tf.Tensor] = dataclasses.field(default_factory=dict)  # per op's key: where kept
    arrived: dict[Any, list[tf.Tensor]] = dataclasses.field(default_factory=dict)  # per tensor's ref: its readers'


_ACTIVE: contextvars.ContextVar[_Transpose | None] = contextvars.ContextVar("stopgrad_math_masked", default=None)


@contextlib.contextmanager
def recording_ops() -> Iterator[GradFnOps]:
    """While the block runs grad_fn: which ops read and made each tensor (for ``transposing``). Eagerly each op is
    recorded as it runs; in a graph the ops the block made are read after it, with the function calls among
    them (which no op callback reports there)."""
    ops = GradFnOps()
    if not tf.executing_eagerly():
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        yield ops
        for op in graph.get_operations()[first:]:
            ops.record(_tf_internal.called_function_name(op) or op.type, list(op.inputs), list(op.outputs))
        return

    def record(op_type: str, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None, graph: Any = None) -> None:
        ops.record(op_type, inputs, outputs)

    with _tf_internal.op_callback(record):
        yield ops


@contextlib.contextmanager
def transposing(ops: GradFnOps, results: list[tf.Tensor]) -> Iterator[Callable[[], bool]]:
    """The tape's gradients taken in the block keep a select's discarded elements zero (the module's rule). Yields
    whether any op was masked so far."""
    state = _Transpose(ops, {t.ref() for t in results if isinstance(t, tf.Tensor)})
    token = _ACTIVE.set(state)
    try:
        yield lambda: bool(state.masks)
    finally:
        _ACTIVE.reset(token)


def _same_shape(*tensors: Any) -> bool:
    """Whether the tensors' shapes are known while tracing and equal (so no op of theirs broadcasts)."""
    shapes = [t.shape for t in tensors]
    return all(s.is_fully_defined() for s in shapes) and all(s == shapes[0] for s in shapes)


def _broadcast_axes(operand: tf.Tensor, out: tf.Tensor) -> Any:
    """The axes of ``out`` that ``operand`` was broadcast along (to be reduced, keeping dimensions): known while
    tracing where both shapes are, else ``BroadcastGradientArgs`` at run time, as TensorFlow's own gradients find
    them."""
    if operand.shape.is_fully_defined() and out.shape.is_fully_defined():
        given, rank = operand.shape.as_list(), out.shape.rank
        padded = [1] * (rank - len(given)) + given
        return [axis for axis, (n, m) in enumerate(zip(padded, out.shape.as_list(), strict=True)) if n == 1 != m]
    return tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(operand), s1=tf.shape(out))[0]


def _onto(mask: tf.Tensor, out: tf.Tensor, operand: tf.Tensor) -> tf.Tensor:
    """A mask over an elementwise op's result ``out`` (broadcasting to it), as a mask over one of its operands: an
    element kept where any element of ``out`` it reaches is kept (broadcasting, and shapes unknown while tracing,
    at run time)."""
    if _same_shape(mask, operand, out):
        return mask
    full = mask if _same_shape(mask, out) else tf.broadcast_to(mask, tf.shape(out))
    if _same_shape(operand, out):
        return full
    return tf.reshape(tf.reduce_any(full, _broadcast_axes(operand, out), keepdims=True), tf.shape(operand))


def _kept_by_every_reader(state: _Transpose, tensor: Any, mask: tf.Tensor) -> tf.Tensor | None:
    """Where ``tensor`` is kept, once every op of grad_fn that reads it has said (``mask``, of its shape, is one
    reader's): the union of their masks; None until then, and for ever where a reader masks nothing (a sum, a
    nested call, a result of grad_fn)."""
    ref = tensor.ref()
    arrived = state.arrived.setdefault(ref, [])
    arrived.append(mask)
    if len(arrived) != state.ops.consumers.get(ref, 0):
        return None
    return functools.reduce(tf.logical_or, arrived)


def _mask(state: _Transpose, tensor: Any, mask: tf.Tensor, out: tf.Tensor) -> None:
    """One reader of ``tensor``, whose result ``out`` it reaches, keeps it where ``mask`` (over ``out``) holds. Once
    all have, the op that made it (and those before it that pass the cotangent on) is marked kept where any of them
    keeps it; a select before it narrows the mask by its own condition. An op is marked only where no other op of
    its kind read the same inputs, and only a floating ``tensor`` that is not a result of grad_fn."""
    if not isinstance(tensor, tf.Tensor) or not (tensor.dtype.is_floating or tensor.dtype.is_complex) \
            or tensor.ref() in state.results:  # (a tape keeps None for an input it needs no value of)
        return
    producer = state.ops.producers.get(tensor.ref())
    if producer is None or producer[0] not in _MASKABLE \
            or state.ops.made.get(_key(*producer)) != 1:
        return
    kept = _kept_by_every_reader(state, tensor, _onto(mask, out, tensor))
    if kept is None:
        return
    op_type, inputs = producer
    if op_type in _SELECTS:
        _select_operands(state, op_type, inputs, tensor, kept)
        return
    state.masks[_key(*producer)] = kept
    for index in _CARRYING.get(op_type, range(len(inputs))):
        _mask(state, inputs[index], kept, tensor)


def _select_operands(state: _Transpose, op_type: str, inputs: Any, out: tf.Tensor,
                     kept: tf.Tensor | None = None) -> None:
    """A select's operands kept where it keeps them (and where ``kept``, the mask over its result, holds).
    ``SelectV2`` broadcasts; ``Select`` (TF1's ``where``) picks rows by a condition of rank 1 (``_picks_rows``),
    and is not read there."""
    condition, *operands = inputs
    if not isinstance(condition, tf.Tensor):  # (a tape keeps None for an input it needs no value of)
        return
    if op_type == "Select" and any(_picks_rows(condition, o) for o in operands if isinstance(o, tf.Tensor)):
        return
    for operand, where in zip(operands, (condition, tf.logical_not(condition)), strict=True):
        _mask(state, operand, where if kept is None else tf.logical_and(where, kept), out)


def _picks_rows(condition: tf.Tensor, operand: tf.Tensor) -> bool:
    """Whether TF1's ``Select`` may pick ``operand``'s rows by a vector ``condition``, which is not broadcasting (or
    the ranks are unknown while tracing)."""
    ranks = condition.shape.rank, operand.shape.rank
    return None in ranks or (ranks[0] == 1 and ranks[1] > 1)


def _scaled(op_type: str, op: Any, grad: tf.Tensor, result: list[Any], mask: tf.Tensor) -> tuple[Any, ...]:
    """A masked product's or quotient's gradients: TensorFlow's where kept, +0.0 where discarded, with the
    coefficient replaced there (the double where), so that no derivative of them meets it either. ``mask`` is over
    the op's result (``grad``'s shape); an operand broadcast into it gets the masked gradient summed back, as
    TensorFlow sums it."""
    for index in _CARRYING[op_type]:
        operand = op.inputs[index]
        if result[index] is None or not isinstance(operand, tf.Tensor) \
                or not isinstance(op.inputs[1 - index], tf.Tensor):
            continue
        coefficient = tf.math.conj(op.inputs[1 - index])
        coefficient = tf.where(mask, coefficient, tf.cast(_SCALING[op_type], coefficient.dtype))
        product = grad * coefficient if op_type == "Mul" else grad / coefficient
        masked = tf.where(mask, product, tf.zeros([], product.dtype))
        if not _same_shape(operand, grad):
            masked = tf.reshape(tf.reduce_sum(masked, _broadcast_axes(operand, grad), keepdims=True),
                                tf.shape(operand))
        result[index] = masked
    return tuple(result)


def _masked_gradient(op_type: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """TensorFlow's gradient of ``op_type``, with the module's rule while a transpose is taken."""
    def gradient(op: Any, *grads: Any) -> Any:
        state = _ACTIVE.get()
        result = original(op, *grads)
        if state is None or op.inputs is None:
            return result
        if not isinstance(grads[0], tf.Tensor):
            return result
        if op_type in _SELECTS:  # (the cotangent has the result's shape: eagerly a tape keeps no outputs)
            _select_operands(state, op_type, list(op.inputs), grads[0])
            return result
        mask = state.masks.get(_key(op_type, op.inputs))
        if mask is None or op_type in _PASSING:
            return result
        return _scaled(op_type, op, grads[0], list(result), mask)

    return gradient


def _wrapper(op_type: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda original: _masked_gradient(op_type, original)


for _op_type in sorted(_SELECTS | set(_SCALING) | _PASSING):
    _tf_internal.wrap_registered_gradient(_op_type, _wrapper(_op_type))
