"""Whether the tape's transpose of a grad_fn is the whole of it.

For a y of more than one element the decorator reads J·v off grad_fn by
differentiating grad_fn(d) with respect to the upstream d (the transpose
trick). A tape sees only the ops it can differentiate: a part of grad_fn
computed through ``tf.stop_gradient`` (``tf.while_loop(back_prop=False)``),
``tf.numpy_function`` or another op that declares no gradient drops out of
J·v without a word. Two checks catch that:

* while tracing, ``untransposable_ops`` lists the ops of grad_fn on the
  upstream's path that a transpose cannot see through (no cost when the graph
  runs);
* in eager mode, where there is no graph to read, ``dot_product_mismatch``
  compares the transpose with grad_fn on random vectors,
  ⟨T(a), b⟩ = ⟨a, grad_fn(b)⟩.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from stopgrad_math import _tf_internal, identity

_EPS = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23, tf.float64: 2.0**-52}
# Ops with no gradient whose output does not depend on their input's values: nothing of J is lost through them.
_VALUE_FREE = frozenset({"ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank"})


def untransposable_ops(ops: Sequence[tf.Operation], upstreams: Sequence[tf.Tensor],
                       results: Sequence[tf.Tensor]) -> list[str]:
    """The types of the ops among ``ops`` (a graph's ops in creation order) that take the upstream's values
    toward ``results`` where a tape cannot follow: a stop_gradient, or an op with no gradient."""
    on_path = {t.ref() for t in upstreams}
    blocking = []
    for op in ops:
        if not any(t.ref() in on_path for t in op.inputs):
            continue
        if _blocks(op):
            blocking.append(op)
        else:
            on_path.update(t.ref() for t in op.outputs)
    if not blocking:
        return []
    needed = _ancestors(results, within=set(ops))
    return sorted({op.type for op in blocking if op in needed})


def _blocks(op: tf.Operation) -> bool:
    if op.type in _VALUE_FREE or not any(identity.is_inexact(t.dtype) for t in op.outputs):
        return False
    if op.type == "StopGradient":
        return True
    try:
        return _tf_internal.gradient_function(op) is None
    except LookupError:
        return True


def _ancestors(results: Sequence[tf.Tensor], within: set[tf.Operation]) -> set[tf.Operation]:
    """The ops among ``within`` that ``results`` depend on (the walk stays inside, not in the whole graph)."""
    seen: set[tf.Operation] = set()
    stack = [t.op for t in results if t.op in within]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs if t.op in within)
    return seen


def _real_inner_product(a: tf.Tensor, b: tf.Tensor) -> tuple[float, float]:
    """Re Σ conj(a)·b in float64, and Σ |a|·|b| (the scale its rounding is judged against)."""
    a, b = np.asarray(a).astype(np.complex128), np.asarray(b).astype(np.complex128)
    with np.errstate(invalid="ignore", over="ignore"):  # an infinite derivative: the caller skips the test
        return float(np.real(np.sum(np.conj(a) * b))), float(np.sum(np.abs(a) * np.abs(b)))


def dot_product_mismatch(transposed: Sequence[tuple[tf.Tensor, tf.Tensor]],
                         direct: Sequence[tuple[tf.Tensor, tf.Tensor]], dtype: tf.DType) -> bool:
    """Whether Σ⟨T(a), b⟩ (``transposed``: pairs (T(a), b)) and Σ⟨a, grad_fn(b)⟩ (``direct``: pairs
    (a, grad_fn(b))) differ by more than rounding, sqrt(eps) of their scale; never where either is not finite."""
    sums = [np.sum([_real_inner_product(p, q) for p, q in pairs], axis=0) if pairs else np.zeros(2)
            for pairs in (transposed, direct)]
    (left, left_scale), (right, right_scale) = sums
    if not np.all(np.isfinite([left, right, left_scale, right_scale])):
        return False
    tolerance = float(np.sqrt(_EPS[dtype.real_dtype]))
    return bool(abs(left - right) > tolerance * max(left_scale, right_scale, np.finfo(np.float64).tiny))
