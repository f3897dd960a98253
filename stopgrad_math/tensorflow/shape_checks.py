"""Shape checks that hold where shapes are known only at run time.

Static shapes decide wherever they can: a check that cannot fail adds no op,
and one that cannot pass raises ``ValueError`` while tracing. Where unknown
dimensions leave the answer open, the graph decides when it runs, with shape
vectors compared by ops that never fail themselves, whatever the ranks.

A failed run-time check must never pass silently, and the checks must work
wherever the identity does: forward mode, pfor (jacobian, vectorized_map),
XLA and TF1 graphs. Control flow fails some of them (forward mode cannot go
through a Case op or nested conds, XLA compiles both branches of a cond,
pfor cannot convert a cond under a tape), so a run-time choice is made of
plain dataflow ops: every candidate is computed, the ones not chosen on a
single zero (``reshaped_where``), and a failure is an Assert together with
a reshape that XLA refuses while compiling (``require``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import tensorflow as tf

from stopgrad_math.shared import layouts

# ---------------------------------------------------------------- static shapes


def may_broadcast_to(shape: tf.TensorShape, target: tf.TensorShape) -> bool:
    """Whether a tensor of ``shape`` may broadcast to exactly ``target`` at run time."""
    return layouts.may_broadcast_to(_as_tuple(shape), _as_tuple(target))


def _as_tuple(shape: tf.TensorShape) -> layouts.Shape:
    return None if shape.rank is None else tuple(shape.as_list())


def must_broadcast_to(shape: tf.TensorShape, target: tf.TensorShape) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target`` whatever the unknown dimensions are."""
    if shape.rank == 0:
        return True
    if shape.rank is None or target.rank is None or shape.rank > target.rank:
        return False
    pairs = zip(reversed(shape.as_list()), reversed(target.as_list()), strict=False)
    return all(s == 1 or (s is not None and s == t) for s, t in pairs)


# ---------------------------------------------------------------- shape vectors at run time


def left_padded(*shapes: tf.Tensor) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Shape vectors padded on the left with ones to their common length, and their lengths (the ranks).

    Broadcasting aligns shapes on the right, so padded vectors compare
    elementwise whatever the ranks were.
    """
    ranks = [tf.size(s) for s in shapes]
    length = functools.reduce(tf.maximum, ranks)
    return [tf.concat([tf.ones([length - r], tf.int32), s], 0) for s, r in zip(shapes, ranks, strict=True)], ranks


def same_shape(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Whether two shape vectors are equal, lengths included (never an error)."""
    length = tf.maximum(tf.size(a), tf.size(b))
    # Padded on the right with different fills: a length mismatch never compares equal.
    a, b = (tf.concat([v, tf.fill([length - tf.size(v)], fill)], 0) for v, fill in ((a, -1), (b, -2)))
    return tf.reduce_all(tf.equal(a, b))


def broadcast_padded(a: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(whether a and b broadcast, the broadcast shape where they do), for vectors padded by ``left_padded``."""
    # tf.equal, not ==: in a TF1 graph == compares the tensors' identities.
    a_is_one = tf.equal(a, 1)
    fits = tf.reduce_all(tf.equal(a, b) | a_is_one | tf.equal(b, 1))
    return fits, tf.where(a_is_one, b, a)


def broadcasts_to_padded(shape: tf.Tensor, rank: tf.Tensor, target: tf.Tensor, target_rank: tf.Tensor) -> tf.Tensor:
    """Whether a tensor broadcasts to exactly ``target``'s shape, for vectors padded by ``left_padded``."""
    return tf.less_equal(rank, target_rank) & tf.reduce_all(tf.equal(shape, target) | tf.equal(shape, 1))


def broadcasts_to(shape: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """Whether a tensor of shape vector ``shape`` broadcasts to exactly ``target``."""
    (shape, target), (rank, target_rank) = left_padded(shape, target)
    return broadcasts_to_padded(shape, rank, target, target_rank)


# ---------------------------------------------------------------- decisions at run time


def require(fits: tf.Tensor, value: tf.Tensor, message: Sequence[object]) -> tf.Tensor:
    """Returns ``value`` where ``fits`` is true when the graph runs, and fails with ``message`` where not.

    ``message`` mixes strings with tensors (the run-time shapes), as for
    ``tf.debugging.Assert``. XLA compiles the Assert to nothing, but checks a
    reshape's element count while compiling; so the value passes through a
    reshape to its own shape, or, where the check fails, to one with more
    elements, and under XLA the misfit stops compilation with
    InvalidArgumentError at the op named ``shape_check_failed_`` followed by
    the message's words (``..._scale_of_shape_does_not_broadcast_to_x_of_shape``).
    """
    check = tf.debugging.Assert(fits, list(message), summarize=16)
    # XLA's error shows no message, only the op's name: the name says which arguments misfit (not the shapes,
    # which are known only as the graph runs).
    words = re.sub(r"[^A-Za-z0-9]+", "_", " ".join(part for part in message if isinstance(part, str))).strip("_")
    with tf.control_dependencies([check]):
        shape = tf.shape(value)
        more = tf.fill([tf.cast(tf.logical_not(fits), tf.int32)], 2)  # [2] where it fails: scalars grow too
        checked = tf.reshape(value, tf.concat([tf.where(fits, shape, shape + 1), more], 0),
                             name=f"shape_check_failed_{words}" if words else "shape_check_failed")
    checked.set_shape(value.shape)
    return checked


def reshaped_where(value: tf.Tensor, selected: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """``value`` reshaped to ``shape`` where ``selected``, else one zero shaped like ``ones_like(shape)``.

    The run-time form of a choice between a computation and none: an unselected
    branch of the caller's runs on one zero, so its ops never fail and cost
    nothing, and its derivative is zero. Where selected no data is copied
    (slicing a whole tensor and padding by nothing forward the buffer).
    """
    flat = tf.reshape(value, [-1])
    kept = tf.slice(flat, [0], [tf.where(selected, tf.size(flat), 0)])
    padded = tf.pad(kept, [[0, tf.where(selected, 0, 1)]])
    return tf.reshape(padded, tf.where(selected, shape, tf.ones_like(shape)))


def broadcast_checked(value: tf.Tensor, target: tf.Tensor, what: str, target_what: str) -> tf.Tensor:
    """Returns ``value``, checked to broadcast to exactly ``target``'s shape.

    While tracing where the shapes decide (no op added), at run time where
    they do not; the error names both arguments and their shapes.
    """
    if must_broadcast_to(value.shape, target.shape):
        return value
    if not may_broadcast_to(value.shape, target.shape):
        raise ValueError(f"{what} of shape {value.shape} does not broadcast to {target_what} of shape {target.shape}.")
    value_shape, target_shape = tf.shape(value), tf.shape(target)
    message = [f"{what} of shape", value_shape, f"does not broadcast to {target_what} of shape", target_shape]
    return require(broadcasts_to(value_shape, target_shape), value, message)
