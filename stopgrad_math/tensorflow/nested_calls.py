"""Decorated calls made inside a grad_fn: whether each embeds its gradient, and at what order.

A grad_fn may call decorated functions, its own f among them (erfcx' =
2x·erfcx − 2/√π; a Bessel function's gradient at order v ± 1). grad_fn runs
when f is called, not in the backward pass, so a recursion must end where it
starts. While a grad_fn runs, ``evaluating`` records the order of the
embedding that called it, how many grad_fns deep it is, and the functions
whose grad_fns are running; ``how`` and ``inner_order`` read that record.
While tracing, each embedded call's ops are kept as one box (``boxed``),
which the route of the calling grad_fn reads as a whole (``transposition``);
a call on the upstream at order 1 is deferred (``deferred_calls``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import tensorflow as tf

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared import function_identity
from stopgrad_math.tensorflow import _tf_internal, gradient_components, transposition

MAX_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class Evaluating:
    """Set while a grad_fn runs: the order of the embedding that calls it, how many grad_fns deep, where the
    decorated calls it makes are kept (each one op box for the route, ``transposition``), the functions whose
    grad_fns are running (``function_identity.key`` of each f: a factory's fresh wrapper of the same function is
    the same function), and whether it is a deferred call's grad_fn, run when a derivative is asked."""

    order: int
    depth: int
    boxes: list[transposition.Box]
    running: frozenset[Hashable]
    deferred: bool = False


_EVALUATING: contextvars.ContextVar[Evaluating | None] = contextvars.ContextVar("grad_fn_evaluation", default=None)


def current() -> Evaluating | None:
    """The grad_fn evaluation this call is made in, or None outside every grad_fn."""
    return _EVALUATING.get()


@contextlib.contextmanager
def evaluating(order: int, boxes: list[transposition.Box], f: Callable[..., Any],
               deferred: bool = False) -> Iterator[None]:
    """Marks the grad_fn of ``f`` as running, for an embedding of ``order`` or a ``deferred`` call."""
    outer = _EVALUATING.get()
    depth, running = (1, frozenset()) if outer is None else (outer.depth + 1, outer.running)
    token = _EVALUATING.set(Evaluating(order, depth, boxes, running | {function_identity.key(f)}, deferred))
    try:
        yield
    finally:
        _EVALUATING.reset(token)


class Call(enum.Enum):
    """How a decorated call is made."""

    EMBEDDED = "its gradient embedded by the identity"
    VALUE = "f's value alone, with no derivative"
    DEFERRED = "TensorFlow's custom gradient, grad_fn called when a derivative is asked (deferred_calls)"


def how(f: Callable[..., Any], evaluating: Evaluating | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """How a decorated call is made: embedded, except inside a grad_fn of order 1.

    There every value but the upstream is a constant: the arguments were
    stopped, and the upstream is a constant too where y has one element. A
    call on the upstream (a tensor a tape records) is deferred: its grad_fn
    is called when the transpose, or a derivative of J·v, asks for it, which
    ends gradients that call each other on the upstream (a psum whose
    gradient is a broadcast whose gradient is a psum) where TensorFlow's own
    decorator ends them. Variables, which a tape may watch, and ragged or
    sparse values are embedded. A call on constants is embedded only in a
    graph, where ``tf.gradients`` may still differentiate it without a tape
    (TFP's ``value_and_gradient`` does, inside Student-t's CDF gradient), and
    only where f's own grad_fn is not running: calling f alone ends a
    recursion. "f's own" is ``function_identity``'s, since TFP's factory
    wraps f anew at every call. Inside a grad_fn of order 2, whose arguments
    move with x, every call is embedded, at the order ``inner_order`` gives.
    """
    if evaluating is None:
        return Call.EMBEDDED
    call = _inside(f, evaluating, args, kwargs)
    if call is Call.EMBEDDED and evaluating.depth >= MAX_DEPTH:
        raise ValueError(
            f"grad_fns embed decorated calls inside each other {MAX_DEPTH} deep: gradients that call each other "
            "without end (on variables, or on ragged or sparse values) cannot be embedded when f is called. Pass "
            "tensors, or embed a Jacobian with custom_gradient(fx, jacobian, x)."
        )
    return call


def _inside(f: Callable[..., Any], evaluating: Evaluating, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    if evaluating.order == 2:
        return Call.EMBEDDED
    leaves = tf.nest.flatten((args, kwargs))
    if any(gradient_components.is_variable_or_composite(leaf) for leaf in leaves):
        return Call.EMBEDDED  # a variable, ragged or sparse value: its own recording is not asked, so it is embedded
    if not _tf_internal.should_record_backprop([leaf for leaf in leaves if isinstance(leaf, tf.Tensor)]):
        if tf.executing_eagerly():
            return Call.VALUE
        if evaluating.deferred:  # the backward pass of a graph, which tf.gradients may differentiate again
            return Call.DEFERRED
        return Call.VALUE if function_identity.key(f) in evaluating.running else Call.EMBEDDED
    positional = tf.nest.flatten(arguments_of.positional(f, args, kwargs)[0])
    if not _tf_internal.should_record_backprop([leaf for leaf in positional if isinstance(leaf, tf.Tensor)]):
        return Call.EMBEDDED  # the upstream in a keyword argument, a constant: embedding raises, naming it
    return Call.DEFERRED


def inner_order(f: Callable[..., Any], evaluating: Evaluating) -> int:
    """The order of a decorated call inside a grad_fn. Inside one of order 2, whose arguments move with x, a call
    is embedded at order 2 too: a grad_fn that differentiates it (Student-t's CDF, betainc's gradient through
    ``value_and_gradient``) needs its second derivative. A call of a function whose grad_fn is running already
    (erfcx' = 2x·erfcx − 2/√π) is embedded at order 1, which ends the recursion: only its first derivative
    enters a second derivative there."""
    return 2 if evaluating.order == 2 and function_identity.key(f) not in evaluating.running else 1


def boxed(evaluating: Evaluating, embed: Callable[[], Any]) -> Any:
    """A decorated call inside a grad_fn, embedded by ``embed``; while tracing, its ops are kept as one box for
    the route of the grad_fn that makes it."""
    if tf.executing_eagerly():
        return embed()
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    result = embed()
    evaluating.boxes.append(transposition.Box(frozenset(graph.get_operations()[first:])))
    return result
