"""Stopping gradients over structures and per element."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from stopgrad_math.tensorflow import identity, shape_checks, value_only_mode


def stop_gradient(structure: Any) -> Any:
    """Returns ``tf.stop_gradient`` applied to every leaf of a nested structure.

    Dicts, lists, tuples and namedtuples keep their structure; Tensors,
    tf.Variables, NumPy arrays and Python numbers become stopped Tensors (as
    ``tf.stop_gradient`` makes them); None leaves stay None.

    Examples:
        >>> out = stop_gradient({"loc": tf.constant([1.0]), "scale": 2.0, "extra": None})
        >>> sorted(out), out["scale"].dtype.name, float(out["scale"]), out["extra"]
        (['extra', 'loc', 'scale'], 'float32', 2.0, None)
    """
    return tf.nest.map_structure(_stopped, structure)


def _stopped(leaf: Any) -> Any:
    if leaf is None:
        return None
    if isinstance(leaf, tf.Variable) or (tf.is_tensor(leaf) and not isinstance(leaf, tf.Tensor)):
        return tf.stop_gradient(leaf)  # a composite part by part, a variable read
    return identity.stop(identity.to_tensor(leaf, "stop_gradient's leaf"))


def _bool_tensor(mask: Any) -> tf.Tensor:
    mask = identity.to_tensor(mask, "stop_gradient_where's mask", dtype_hint=tf.bool)  # NumPy floats stay floats
    if mask.dtype != tf.bool:  # a 0/1 or float mask would be read as a select, silently
        raise TypeError(f"stop_gradient_where's mask must be a bool tensor; got {mask.dtype.name}.")
    return mask


def stop_gradient_where(x: Any, mask: Any) -> tf.Tensor:
    """Returns x, with its gradient stopped where ``mask`` is true.

    ``where(mask, stop(x), x)``: a select copies bits, so the value is x
    exactly (inf, NaN and subnormals too); the gradient is the upstream where
    mask is false and zero where it is true, the per-element stop that
    ``tf.stop_gradient`` cannot express. ``mask`` is a bool tensor that
    broadcasts to x's shape: checked while tracing, or when the graph runs
    where shapes are not known before (ValueError, InvalidArgumentError).

    Examples:
        >>> x = tf.constant([1.0, 2.0, 3.0])
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = stop_gradient_where(x, [True, False, True])
        >>> tape.gradient(y, x).numpy()
        array([0., 1., 0.], dtype=float32)
    """
    x = identity.to_tensor(x, "stop_gradient_where's x")
    mask = _bool_tensor(mask)
    mask = shape_checks.broadcast_checked(mask, x, "mask", "x")
    if value_only_mode.active():
        return value_only_mode.undifferentiable(x, [x])
    return tf.where(mask, identity.stop(x), x)
