"""values_only(): values without the gradient machinery, for inference.

The identity's value depends on ``g`` (its zero term is computed from it),
so a graph that only serves values still computes every gradient. Inside
``values_only()`` each function of this library returns its value alone and
marks it as not differentiable: a value ``v`` computed from sources ``x``
becomes

    PreventGradient(IdentityN(v, x)[0])

IdentityN ties v to every source at no run-time cost, so that any gradient
asked of v with respect to a source reaches the PreventGradient op, whose
gradient raises (reverse and forward mode, tapes and ``tf.gradients``),
even where v's own ops do not connect it to x. Nothing falls back to plain
autodiff of v. In eager mode nothing is built: the value is returned as it
is, and a recording tape or accumulator raises at once.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal, gradient_components

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("stopgrad_math_values_only", default=False)

_NOT_DIFFERENTIABLE = (
    "stopgrad_math.values_only() was active when this value was computed, so it has no gradient: trace or "
    "compute it outside values_only() to differentiate it."
)


@contextlib.contextmanager
def values_only() -> Iterator[None]:
    """Within it, every function of stopgrad_math returns its value alone, with no gradient.

    For inference: a graph traced inside ``values_only()`` (a ``tf.function``,
    a SavedModel's serving signature) computes ``fx`` alone, where
    ``custom_gradient(fx, gx, x)`` would also compute ``gx`` and the zero
    term, and never calls a decorated function's ``grad_fn``. Any attempt to
    differentiate such a value raises (TensorFlow's PreventGradient), never a
    silent plain-autodiff gradient: in eager mode and while tracing, at once
    when a GradientTape or ForwardAccumulator is recording; a graph traced
    inside it when its gradient is taken later (LookupError).

    Inputs are checked as outside it, with the same errors. It applies to the
    thread (and asyncio task) that enters it; a ``tf.function`` traced before
    keeps its trace, so trace a fresh one inside it.

    Raises:
      RuntimeError: entered, or a function of this library called inside it,
        while a tape or accumulator is recording.

    Examples:
        >>> serve = tf.function(lambda x: custom_gradient(tf.exp(x), tf.exp(x), x))
        >>> with values_only():
        ...   served = serve.get_concrete_function(tf.TensorSpec([None]))
        >>> served(tf.constant([0.0, 1.0])).numpy()
        array([1.       , 2.7182817], dtype=float32)
    """
    _refuse_if_recording("values_only() cannot be entered")
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _refuse_if_recording(what: str) -> None:
    if _tf_internal.could_possibly_record():
        raise RuntimeError(
            f"{what} while a GradientTape or ForwardAccumulator is recording: inside "
            "stopgrad_math.values_only() values have no gradient. Take gradients outside values_only()."
        )


def active() -> bool:
    """Whether values_only() is in force here."""
    return _ACTIVE.get()


def undifferentiable(value: Any, sources: Sequence[Any]) -> Any:
    """``value``, for values_only(): each leaf's gradient component (``gradient_components``) tied to the
    ``sources`` (tensors or variables) and wrapped in PreventGradient; RuntimeError where a tape or
    accumulator is recording; in eager mode, where nothing is, ``value`` as it is."""
    _refuse_if_recording("A stopgrad_math function was called inside values_only()")
    if tf.executing_eagerly():
        return value
    ties = [_tie(s) for s in sources if s is not None]
    return tf.nest.map_structure(lambda leaf: _undifferentiable(leaf, ties), value)


def _tie(source: Any) -> tf.Tensor:
    """What a gradient with respect to ``source`` starts from: a variable's handle (no read), else the tensor."""
    if isinstance(source, tf.Variable):
        return source.handle
    return source if isinstance(source, tf.Tensor) else tf.convert_to_tensor(source)


def _undifferentiable(leaf: Any, ties: list[Any]) -> Any:
    component = gradient_components.of("value", leaf)
    if not component.differentiable:
        return leaf
    tied = tf.raw_ops.IdentityN(input=[component.tensor, *ties])[0]
    return component.rebuild(tf.raw_ops.PreventGradient(input=tied, message=_NOT_DIFFERENTIABLE))
