"""What of an argument or output the identity carries: its gradient component.

The identity differentiates dense tensors. Each kind of value users pass
has one tensor that carries its gradient, as in TensorFlow:

  a floating or complex tf.Tensor      itself
  a variable: tf.Variable and its      one read of it; the gradient reaches the
    subclasses (mirrored, AutoCast),   variable through the read
    keras.Variable, ShardedVariable
  tf.RaggedTensor                      its flat_values
  tf.SparseTensor, tf.IndexedSlices    their values

Integer, bool and string tensors, Python numbers and strings, None, NumPy
arrays, dtypes and shapes are constants: no tape can watch them. Any other
object (``self``, a ``tf.Module``, a distribution, a callable) is given to f
as it is, as ``tf.custom_gradient`` gives it: what f reads from it keeps its
ordinary autodiff gradient, as from a closure, and a gradient grad_fn
returns for it is refused (it would be lost).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal, identity

_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, np.ndarray, np.generic, tf.DType, tf.TensorShape)
_COMPOSITES = (tf.RaggedTensor, tf.SparseTensor, tf.IndexedSlices)


@dataclasses.dataclass
class Component:
    """One value's gradient component, and how to put a replacement for it back."""

    name: str
    value: Any  # as the caller passed it
    read: Callable[[], tf.Tensor] | None  # the tensor that carries the gradient; None for a constant
    rebuild: Callable[[tf.Tensor], Any]  # value with that tensor replaced
    passed_through: bool = False  # an object of another kind (self, a distribution), given to f as it is

    @functools.cached_property
    def tensor(self) -> tf.Tensor:
        """The component, read when first needed: a variable whose gradient is sparse is only ever gathered.

        Only a component that carries a gradient has one; asking a constant is the library's own error.
        """
        if self.read is None:
            raise TypeError(f"{self.name} is a constant, with no tensor to carry a gradient.")
        return self.read()

    @functools.cached_property
    def stopped(self) -> tf.Tensor:
        """stop_gradient of the tensor, made once for every use in one call."""
        return identity.stop(self.tensor)

    # Cached: a component lives for one call, and eager mode pays for every property read.
    @functools.cached_property
    def dtype(self) -> tf.DType | None:
        if self.read is None:
            return None
        return tf.as_dtype(self.value.dtype) if _is_variable(self.value) else self.tensor.dtype

    @functools.cached_property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape(self.value.shape) if _is_variable(self.value) else self.tensor.shape

    @functools.cached_property
    def differentiable(self) -> bool:
        return self.dtype is not None and identity.is_inexact(self.dtype)

    @property
    def unread(self) -> Any:
        """The variable itself, where the value is one (gathering rows of it does not read it whole), else the
        tensor."""
        return self.value if isinstance(self.value, tf.Variable) else self.tensor


def _is_variable(value: Any) -> bool:
    # keras.Variable (Keras 3) is TensorFlow's base Tensor type but no tf.Tensor, a ShardedVariable a
    # composite (see _tf_internal).
    if isinstance(value, tf.Tensor):  # first: the protocol checks below are slow
        return False
    return isinstance(value, (tf.Variable, _tf_internal.TensorProtocol, _tf_internal.ShardedVariable))


def is_variable_or_composite(value: Any) -> bool:
    """Whether a value carries its gradient in something other than itself: a variable, ragged or sparse."""
    return isinstance(value, _COMPOSITES) or _is_variable(value)


def of(name: str, value: Any) -> Component:
    """The gradient component of one leaf of f's arguments or outputs; TypeError for what cannot be carried."""
    if isinstance(value, tf.Tensor):
        return Component(name, value, lambda: value, lambda t: t)
    if isinstance(value, tf.RaggedTensor):
        return Component(f"{name}.flat_values", value, lambda: value.flat_values, value.with_flat_values)
    if isinstance(value, tf.SparseTensor):
        return Component(f"{name}.values", value, lambda: value.values, value.with_values)
    if isinstance(value, tf.IndexedSlices):
        rebuild = lambda t: tf.IndexedSlices(t, value.indices, value.dense_shape)  # noqa: E731
        return Component(f"{name}.values", value, lambda: value.values, rebuild)
    if _is_variable(value):
        return Component(name, value, lambda: tf.convert_to_tensor(value), lambda t: t)
    # Anything else (self, a tf.Module, a distribution) is given to f as it is, as tf.custom_gradient does: what f
    # reads from it keeps its ordinary autodiff gradient, as from a closure.
    return Component(name, value, None, lambda t: value, passed_through=not isinstance(value, _CONSTANTS))


def gradient_tensor(gradient: Any, component: Component) -> tf.Tensor | tf.IndexedSlices:
    """The part of grad_fn's gradient for a value that belongs to its component.

    A composite value takes a composite gradient of its kind (its component
    is taken) or the component's gradient itself; a dense value takes a
    tensor, anything convertible to one, or tf.IndexedSlices (kept sparse).
    """
    if isinstance(gradient, tf.IndexedSlices) and isinstance(component.value, tf.IndexedSlices):
        return gradient.values
    if isinstance(gradient, tf.IndexedSlices):
        return gradient
    if isinstance(gradient, _COMPOSITES):
        if type(gradient) is not type(component.value):
            kinds = type(gradient).__name__, type(component.value).__name__
            raise ValueError(f"grad_fn returned a {kinds[0]} for {component.name}, a {kinds[1]}.")
        return of(component.name, gradient).tensor
    return identity.to_tensor(gradient, f"grad_fn's gradient for {component.name}", dtype_hint=component.dtype)


@dataclasses.dataclass
class Flattened:
    """A structure's leaves as components, in tf.nest's order, and the way back to the structure."""

    structure: Any
    components: list[Component]
    flat: bool = False  # a list or tuple of leaves, rebuilt without nest's cost in eager

    @classmethod
    def of(cls, structure: Any, prefix: str) -> Flattened:
        """Leaves named ``prefix[path]``; a lone leaf is named ``prefix``."""
        if not tf.nest.is_nested(structure):
            return cls(structure, [of(prefix, structure)])
        flat = type(structure) in (list, tuple) and not any(tf.nest.is_nested(leaf) for leaf in structure)
        paths = enumerate(structure) if flat else _tf_internal.flatten_with_joined_string_paths(structure)
        return cls(structure, [of(f"{prefix}[{path}]", leaf) for path, leaf in paths], flat)

    @functools.cached_property
    def differentiable(self) -> list[int]:
        return [i for i, c in enumerate(self.components) if c.differentiable]

    def with_tensors(self, tensors: dict[int, tf.Tensor]) -> Any:
        """The structure with each component ``i`` in ``tensors`` replaced."""
        leaves = [c.rebuild(tensors[i]) if i in tensors else c.value for i, c in enumerate(self.components)]
        if self.flat:
            return type(self.structure)(leaves)
        return tf.nest.pack_sequence_as(self.structure, leaves) if tf.nest.is_nested(self.structure) else leaves[0]
