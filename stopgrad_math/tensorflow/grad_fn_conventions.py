"""How a grad_fn is called, and how its answer is matched to f's arguments.

grad_fn maps upstream gradients to argument gradients, in any of the
conventions users write: ``grad(upstream)`` or ``grad(*upstreams)`` (TF),
``grad(upstream)`` taking y's structure (JAX), ``grad(*args, upstream=None)``
or ``grad(*args, upstream)`` (keras, torch), with ``variables`` when it also
gives the gradients of variables read inside f.

Its answer is matched to the arguments by structure where it has theirs (a
dict gradient for a dict argument, by key), else as a flat list in
tf.nest's order (dict keys sorted), one per leaf or one per differentiable
leaf. Each gradient is checked against its argument's dtype and shape, at
run time where the shapes are not known while tracing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import tensorflow as tf

from stopgrad_math.shared.grad_fn_signature import signature
from stopgrad_math.tensorflow import gradient_components, identity, shape_checks
from stopgrad_math.tensorflow.gradient_components import Component, Flattened


def call(
    grad_fn: Callable[..., Any], outputs: Flattened, upstreams: dict[int, Any], variables: list[Any]
) -> tuple[Any, Any]:
    """Calls grad_fn in its own convention; returns (gradients of args, gradients of variables).

    ``upstreams`` holds an upstream for each output leaf that has one (of the
    leaf's own kind); the others get None.
    """
    flat = [upstreams.get(i) for i in range(len(outputs.components))]
    packed = tf.nest.pack_sequence_as(outputs.structure, flat) if tf.nest.is_nested(outputs.structure) else flat[0]
    convention = signature(grad_fn)
    kwargs = {"variables": variables} if variables and convention.takes_variables else {}
    if convention.upstream_keyword:
        result = grad_fn(upstream=packed, **kwargs)
    elif convention.structured and len(flat) > 1:
        result = grad_fn(packed, **kwargs)
    else:
        result = grad_fn(*flat, **kwargs)
    if not kwargs:
        return result, None
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ValueError("grad_fn takes `variables`, so it must return (grads_of_args, grads_of_variables).")
    return result[0], result[1]


_SINGLE = (tf.Tensor, tf.Variable, tf.IndexedSlices, tf.RaggedTensor, tf.SparseTensor)


def _flat(gradients: Any, arguments: Flattened) -> list[Any]:
    """grad_fn's gradients, one per argument leaf where the structure says so, else as tf.nest flattens them."""
    if isinstance(gradients, _SINGLE) or not tf.nest.is_nested(gradients):
        return [gradients]
    shallow = arguments.structure
    if (len(shallow) == 1 and not tf.nest.is_nested(shallow[0]) and isinstance(gradients, (list, tuple))
            and len(gradients) != 1):  # one tensor argument, several gradients: a count, as TensorFlow says it
        raise ValueError(f"grad_fn returned {len(gradients)} gradients for f's 1 argument "
                         f"({arguments.components[0].name}): it is expected to return 1 gradient, one per "
                         "argument, as tf.custom_gradient's grad_fn does.")
    if len(shallow) == 1 and not (isinstance(gradients, (list, tuple)) and len(gradients) == 1):
        shallow = shallow[0]  # one argument: its gradient may come alone, not in a list of one
    try:
        return _up_to(shallow, gradients)
    except ValueError:
        return list(tf.nest.flatten(gradients))


def _up_to(shallow: Any, gradients: Any) -> list[Any]:
    """One gradient per leaf of ``shallow`` (tf.nest's order), where gradients has its structure; a None in
    place of a structure means no gradient for any of its leaves. ValueError where the structures differ."""
    if not tf.nest.is_nested(shallow):
        return [gradients]
    if gradients is None:
        return [None] * len(tf.nest.flatten(shallow))
    if isinstance(shallow, dict):
        if not isinstance(gradients, dict) or set(gradients) != set(shallow):
            raise ValueError("not the structure")
        return [g for key in sorted(shallow) for g in _up_to(shallow[key], gradients[key])]
    if not isinstance(gradients, (list, tuple)) or len(gradients) != len(shallow):
        raise ValueError("not the structure")
    return [g for s, given in zip(shallow, gradients, strict=True) for g in _up_to(s, given)]


def match(gradients: Any, arguments: Flattened) -> list[tuple[Component, Any]]:
    """Pairs grad_fn's gradients with the differentiable leaves of the arguments (None: no gradient)."""
    if gradients is None:
        return []
    flat, components = _flat(gradients, arguments), arguments.components
    differentiable = [components[i] for i in arguments.differentiable]
    if len(flat) == len(components):
        pairs = zip(components, flat, strict=True)
    elif len(flat) == len(differentiable):
        pairs = zip(differentiable, flat, strict=True)
    else:
        raise ValueError(
            f"grad_fn returned {len(flat)} gradients; f has {len(components)} argument leaves "
            f"({len(differentiable)} of them floating or complex): {[c.name for c in components]}. A flat list is "
            "matched in tf.nest's order (dict keys sorted)."
        )
    given = [(c, g) for c, g in pairs if g is not None]
    lost = [c.name for c, _ in given if c.passed_through]
    if lost:
        raise ValueError(f"grad_fn returned a gradient for {', '.join(lost)}, which f is given as it is (not a tensor "
                         "or variable): it carries no gradient. Return None for it, or pass the tensors it holds.")
    return [(c, g) for c, g in given if c.differentiable]


@dataclasses.dataclass
class Gradient:
    """grad_fn's gradient for one component, checked: dense, or the values of tf.IndexedSlices."""

    component: Component
    values: tf.Tensor
    indices: tf.Tensor | None  # rows of the component, for a sparse gradient

    @property
    def name(self) -> str:
        return self.component.name

    def zero(self, slope_is_negative: bool = True) -> tf.Tensor:
        """The identity's zero of what this gradient covers: the component, or only its gathered rows."""
        if self.indices is None:
            return identity.zero_with_slope(self.component.tensor, slope_is_negative, self.component.stopped)
        rows = tf.gather(self.component.unread, self.indices)  # the rows alone, never the whole table
        return identity.zero_with_slope(rows, slope_is_negative)


def checked(component: Component, gradient: Any) -> Gradient:
    """grad_fn's gradient for a component, with its dtype and shape checked."""
    gradient = gradient_components.gradient_tensor(gradient, component)
    if isinstance(gradient, tf.IndexedSlices):
        _check(gradient.values, component, rows=True)
        return Gradient(component, gradient.values, gradient.indices)
    return Gradient(component, _check(gradient, component, rows=False), None)


def _check(values: tf.Tensor, component: Component, rows: bool) -> tf.Tensor:
    """values, checked to be the gradient (or, with ``rows``, gathered rows of it) of the component."""
    dtype = cast(tf.DType, component.dtype)  # the component is differentiable, so it has one
    shape, name = component.shape, component.name
    if not identity.is_inexact(values.dtype) or identity.is_complex(values.dtype) != identity.is_complex(dtype):
        raise ValueError(f"grad_fn returned a {values.dtype.name} gradient for {name}, a {dtype.name}.")
    values = identity.cast(values, dtype)  # another float width (Keras float8's bfloat16 gradient), as TF casts it
    compared = (values.shape[1:], shape[1:]) if rows else (values.shape, shape)
    if not compared[0].is_compatible_with(compared[1]):
        raise ValueError(f"grad_fn returned a gradient of shape {values.shape} for {name} of shape {shape}.")
    if rows or (values.shape.is_fully_defined() and shape.is_fully_defined()):
        return values
    shapes = tf.shape(values), tf.shape(component.tensor)
    message = ["grad_fn returned a gradient of shape", shapes[0], f"for {name} of shape", shapes[1]]
    return shape_checks.require(shape_checks.same_shape(*shapes), values, message)
