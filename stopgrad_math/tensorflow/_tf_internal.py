"""Every TensorFlow API outside ``tf.*``'s public surface that the library uses, in one place.

Each name says why no public API does the job. All were checked against
TensorFlow 2.18 and 2.21, the oldest and newest versions ``setup.cfg``
allows: ``tests/tensorflow/test_tf_internal.py`` imports each one and checks what the
library relies on, in ``make test`` and ``make test-oldest``.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import forwardprop_util as _forwardprop_util
from tensorflow.python.eager import record as _record
from tensorflow.python.framework import op_callbacks as _op_callbacks
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import gradients_util as _gradients_util
from tensorflow.python.saved_model import save_context as _save_context
from tensorflow.python.util import nest as _nest

could_possibly_record = _record.could_possibly_record
"""Whether any GradientTape or ForwardAccumulator is active on this thread. Public code can only ask one tape
(``tape._recording`` is private too); the identity returns the value alone when nothing can record."""


def shape_tuple(tensor: tf.Tensor | tf.Variable) -> tuple[int | None, ...] | None:
    """The static shape as a tuple, None for an unknown dimension, or None for an unknown rank.

    A tensor's own ``_shape_tuple``: ``.shape`` builds a TensorShape, about 3 µs for each fresh eager tensor when
    measured between ops, the largest part of the layout choice in eager mode.
    """
    if isinstance(tensor, tf.Tensor):
        return tensor._shape_tuple()  # type: ignore[no-any-return]
    shape = tensor.shape
    return None if shape.rank is None else tuple(shape.as_list())


stop_recording = _record.stop_recording
"""Pauses every tape and accumulator on the thread. ``GradientTape.stop_recording`` pauses one tape, which the
library does not hold; ``tf.stop_gradient`` pauses them all this way, one op at a time."""

record_operation = _record.record_operation
"""Records an op on every active tape and accumulator with a backward and a forward function of the library's
own: tf.custom_gradient does this with a backward alone (an accumulator then differentiates f's ops), and no
public API takes a forward function. The ``order=2`` term (``recorded_term``) needs both."""

recording_inside_forward_function = _forwardprop_util.push_forwardprop_state
"""Lets tapes and accumulators made inside a recorded op's forward function record: TensorFlow runs a forward
function with the accumulators' state set so that they ignore what their own JVP computes, and a tape or
accumulator made there then records nothing (its gradient is None). A declared-linear solve's forward function
solves with an operator that a tape or accumulator applies (``solves``); no public API restores them."""

saving = _save_context.in_save_context
"""Whether ``tf.saved_model.save`` is exporting, which traces the gradient function of every op with a registered
gradient (given no op) to save it beside the graph: a gradient function that raises while it is traced fails the
save. No public API says that an export is under way."""

should_record_backprop = _record.should_record_backprop
"""Whether an active tape records ops on these tensors: the decorator's test of whether grad_fn's result depends
on the upstream at all (``tape.gradient`` would answer only after computing it)."""



def gradient_possible(tensors: list[tf.Tensor]) -> bool:
    """Whether any tape or forward accumulator watches one of these tensors. ``should_record_backprop`` asks the
    tapes alone; this is the test tf.function asks of its inputs, and no public API answers it."""
    kind = _gradients_util.PossibleTapeGradientTypes(tensors)
    return bool(kind != _gradients_util.POSSIBLE_GRADIENT_TYPES_NONE)


def one_tape_alone(tensors: list[tf.Tensor]) -> bool:
    """Whether exactly one GradientTape watches these tensors, not a persistent one, and no forward accumulator:
    then only that tape can ask for their derivative, once. TensorFlow counts the watchers for tf.function's
    choice of gradient functions; no public API counts them."""
    kind = _gradients_util.PossibleTapeGradientTypes(tensors)
    return bool(kind == _gradients_util.POSSIBLE_GRADIENT_TYPES_FIRST_ORDER) and should_record_backprop(tensors)


def higher_order_gradient_possible(tensors: list[tf.Tensor]) -> bool:
    """Whether two tapes, a persistent tape, or a tape and an accumulator watch these tensors: TensorFlow's own
    test of whether a gradient of a gradient can be taken, which tf.function asks to choose its gradient
    functions. No public API says how many tapes watch a tensor."""
    kind = _gradients_util.PossibleTapeGradientTypes(tensors)
    return bool(kind == _gradients_util.POSSIBLE_GRADIENT_TYPES_HIGHER_ORDER)


VariableWatcher = _record.VariableWatcher
"""The variables a function reads, as tf.custom_gradient finds them for ``grad_fn(..., variables=...)``. A
GradientTape's ``watched_variables`` also holds variables watched before and records the ops besides."""

flatten_with_joined_string_paths = _nest.flatten_with_joined_string_paths
"""A nested structure's leaves with their paths ("a/0"), for error messages that name the argument. ``tf.nest``
exports no path-aware flatten."""

TensorProtocol = tf.__internal__.types.Tensor
"""TensorFlow's base type of every tensor-like value; ``keras.Variable`` (Keras 3) is one without being a
``tf.Tensor`` or a ``tf.Variable``. Keras itself checks for it under this name."""

ShardedVariable = tf.__internal__.distribute.ShardedVariable
"""A variable split over parameter servers: a composite, neither ``tf.Variable`` nor ``tf.Tensor``."""

gradient_function = _ops.get_gradient_function
"""The gradient TensorFlow registered for a graph op: None for an op declared not differentiable, LookupError for
one with none. ``tf.RegisterGradient`` only adds to the registry; nothing public reads it, and the decorator must
know, while tracing, which of grad_fn's ops a transpose cannot see through."""


def function_graph(graph: tf.Graph, name: str) -> tf.Graph | None:
    """The graph of the function ``name`` that an op of ``graph`` calls (a tf.cond branch, a while body, a nested
    tf.function), looked up in it and the graphs it is nested in; None where no graph is kept for it.

    Control-flow ops name their bodies by a function attribute, and only the graph's private function library
    maps the name to the body's ops; the decorator reads them to decide how grad_fn is embedded.
    """
    while graph is not None:
        function = graph._get_function(name)
        if function is not None:
            return getattr(function, "graph", None)
        graph = getattr(graph, "outer_graph", None)
    return None


def captured_value(tensor: tf.Tensor) -> tf.Tensor | None:
    """The eager tensor that a function's placeholder captures (a value the traced code closed over), or None.

    A FuncGraph keeps its captures privately as well as through ``.captures``; this reads the public list.
    """
    graph = tensor.graph
    for external, internal in getattr(graph, "captures", ()):
        if internal is tensor and isinstance(external, tf.Tensor) and not tf.is_symbolic_tensor(external):
            return external
    return None


@contextlib.contextmanager
def op_callback(callback: Callable[..., None]) -> Iterator[None]:
    """``callback(op_type, inputs, attrs, outputs, op_name, graph)`` for each op run eagerly or made in a graph
    while the block runs, on this thread. TensorFlow's own hook for tfdbg, not exported under ``tf.*``; the
    decorator counts which ops read each tensor of grad_fn (``masked_selects``), which no eager tensor says."""
    _op_callbacks.add_op_callback(callback)
    try:
        yield
    finally:
        _op_callbacks.remove_op_callback(callback)


_JVP_CALL = re.compile(r"_jvp_(exact|relaxed)_shapes")
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def runs_a_forward_accumulators_jvp(op_type: str) -> bool:
    """Whether an op (eagerly: its type; a call: the function's name) is a ForwardAccumulator's JVP of another
    op. TensorFlow runs each JVP as a call of its private functions ``_jvp_exact_shapes`` and
    ``_jvp_relaxed_shapes`` (``eager.forwardprop``); nothing public tells such a call from the user's."""
    return bool(_JVP_CALL.search(op_type))


def called_function_name(op: tf.Operation) -> str | None:
    """The name of the function a graph's call op runs, None for any other op."""
    if op.type not in _CALL_OPS:
        return None
    return str(op.get_attr("f").name)


def wrap_registered_gradient(op_type: str, wrap: Callable[[Any], Any]) -> None:
    """Replaces the gradient registered for ``op_type`` by ``wrap(registered)``. ``tf.RegisterGradient`` refuses a
    second registration, and a graph's ``gradient_override_map`` reaches neither eager tapes nor ops that exist
    already; the registry is what a tape and ``tf.gradients`` look an op's gradient up in, eagerly and in graphs."""
    entry = _ops._gradient_registry._registry[op_type]
    entry["type"] = wrap(entry["type"])


_PFOR_LOOP_BODY = re.compile(r"(^|/)loop_body(_\d+)?(/|$)")


def in_pfor_loop_body() -> bool:
    """Whether this code is traced as the loop body of ``pfor`` (``tf.vectorized_map``, or a tape's ``jacobian`` with
    pfor), which converts each op to its batched form afterwards: a registered gradient does not survive that
    conversion (pfor's IdentityN converter drops ``_gradient_op_type``), so a gradient taken through the map is
    autodiff's, or 0. Nothing public tells: pfor traces the body under the name scope ``loop_body``
    (``parallel_for.control_flow_ops._pfor_impl``), read here (a user's scope of that name is taken for it too)."""
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return not tf.executing_eagerly() and bool(_PFOR_LOOP_BODY.search(scope))


AUTOGRAPH_STATUS: contextvars.ContextVar[Any] = contextvars.ContextVar("stopgrad_math_autograph", default=None)
"""The AutoGraph status where a decorated function was called, for ``converted``."""


def autograph_status() -> Any:
    """AutoGraph's status at this point: enabled inside code it converts, else disabled or unspecified."""
    return tf.__internal__.autograph.control_status_ctx()


def converted(fn: Any) -> Any:
    """``fn`` as AutoGraph converts it where the decorated function's caller has AutoGraph on, else as it is.

    The decorator's own code is kept from AutoGraph (it cannot convert it, and warns), which would also keep
    the user's f and grad_fn from it; Keras converts a layer's ``call`` this way, with the caller's status read
    through the same ``tf.__internal__`` names. ``tf.autograph.to_graph`` converts always, eagerly too.
    """
    status = AUTOGRAPH_STATUS.get()
    if status is None or status.status.name != "ENABLED":  # as it is: no wrapper on the eager path
        return fn
    return tf.__internal__.autograph.tf_convert(fn, status)
