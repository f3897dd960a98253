"""The decorator's first stage: f evaluated on stopped arguments, and grad_fn on zero upstreams.

``evaluate`` calls ``f(*args, **kwargs)`` once, with every differentiable
argument stopped (at ``order=2`` on the arguments themselves, for grad_fn to
read what f computed from x; ``recorded_term``), and keeps
what the later stages need in a ``Plan``: y and its components, grad_fn, the
arguments and the variables f reads. Keyword arguments are constants, held
so that a derivative w.r.t. one raises, naming it. ``probe`` calls grad_fn on
zero upstreams that a tape watches: its ops give the route, its tape J·v.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared.grad_fn_signature import signature
from stopgrad_math.tensorflow import (
    _tf_internal,
    grad_fn_conventions,
    gradient_components,
    identity,
    masked_selects,
    nested_calls,
    transposition,
    value_only_mode,
)
from stopgrad_math.tensorflow.grad_fn_conventions import Gradient
from stopgrad_math.tensorflow.gradient_components import Component, Flattened

_NUMBERS = (bool, int, float, complex, np.ndarray, np.generic)


def call_f(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[..., Any]]:
    """f's ``(y, grad_fn)``, each converted by AutoGraph where the caller's code is."""
    result = _tf_internal.converted(f)(*args, **kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and callable(result[1])):
        raise TypeError(f"{getattr(f, '__name__', f)} must return a pair (y, grad_fn); got {type(result).__name__}.")
    return result[0], _tf_internal.converted(result[1])


def _stopped(flat: Flattened) -> Any:
    """The structure with every differentiable component stopped."""
    return flat.with_tensors({i: flat.components[i].stopped for i in flat.differentiable})


_KEYWORD = ("{label} is a keyword argument of {name}, which the decorator holds constant: grad_fn returns "
            "gradients of the positional arguments alone, so a derivative w.r.t. {label} would be a silent 0. Pass "
            "it positionally and return its gradient from grad_fn, or stop it (tf.stop_gradient).")


def _constants(f: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments, constants: every tensor and variable in them held by a PreventGradient, so that a
    tape or accumulator differentiating one raises, naming it, where a stop would give a silent 0."""
    name = getattr(f, "__name__", repr(f))
    held = {}
    for keyword, value in kwargs.items():
        flat = Flattened.of(value, keyword)
        held[keyword] = flat.with_tensors({i: tf.raw_ops.PreventGradient(
            input=flat.components[i].tensor, message=_KEYWORD.format(label=flat.components[i].name, name=name))
            for i in flat.differentiable})
    return held


@dataclasses.dataclass
class Plan:
    """What one call embeds: f's value, its grad_fn, and the components of arguments and outputs."""

    f: Callable[..., Any]
    outputs: Flattened
    grad_fn: Callable[..., Any]
    arguments: Flattened
    variables: list[Component]  # read inside f, when grad_fn gives their gradients
    order: int
    boxes: list[transposition.Box] = dataclasses.field(default_factory=list)  # nested decorated calls
    deferred: bool = False  # a deferred call's (``deferred_calls``): grad_fn runs when a derivative is asked
    unasked: frozenset[str] = frozenset()  # arguments whose gradient nothing can ask for (``unasked``)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)  # in a graph: a wrong gradient's refusal

    def gradients(self, upstreams: dict[int, Any]) -> list[Gradient]:
        """grad_fn(upstreams), checked and paired with the components they belong to."""
        variables = [c.value for c in self.variables]
        with nested_calls.evaluating(self.order, self.boxes, self.f, self.deferred):
            grads, variable_grads = grad_fn_conventions.call(self.grad_fn, self.outputs, upstreams, variables)
        pairs = grad_fn_conventions.match(grads, self.arguments)
        if self.variables:
            flat = list(variable_grads) if variable_grads is not None else []
            if len(flat) != len(self.variables):
                counts = len(flat), len(self.variables)
                raise ValueError(f"grad_fn returned {counts[0]} variable gradients for {counts[1]} variables.")
            pairs += [(c, g) for c, g in zip(self.variables, flat, strict=True) if g is not None]
        return [gradient for c, g in pairs if (gradient := self._checked_where_asked(c, g)) is not None]

    def _checked_where_asked(self, component: Component, gradient: Any) -> Gradient | None:
        """grad_fn's gradient for a component, checked (``grad_fn_conventions.checked``). A wrong one (its shape,
        its dtype) is refused where that component's gradient is asked for: eagerly at once where a tape or an
        accumulator watches it, and dropped where none does (``unasked``), as TensorFlow never reads that gradient
        (HGQ's clip gives its bounds gradients of x's shape); in a graph at order 1, where tf.gradients may ask
        for it later or never, kept in ``refused`` for the decorator to raise when it is asked."""
        try:
            return grad_fn_conventions.checked(component, gradient)
        except ValueError as error:
            if component.name in self.unasked:
                return None
            if not tf.executing_eagerly() and self.order == 1:
                self.refused[component.name] = str(error)
                return None
            raise

    def gradients_at(self, upstreams: dict[int, tf.Tensor]) -> list[Gradient]:
        """grad_fn on upstreams given as dense tensors, one per differentiable output (rebuilt as its kind)."""
        return self.gradients({i: self.outputs.components[i].rebuild(d) for i, d in upstreams.items()})

    def with_terms(self, terms: dict[int, list[tf.Tensor]]) -> Any:
        """f's value with zero terms attached to output components: y bit for bit, derivative theirs."""
        attached = {i: identity.attach(self.outputs.components[i].tensor, t) for i, t in terms.items() if t}
        return self.outputs.with_tensors(attached)


def unasked(arguments: Flattened) -> frozenset[str]:
    """The differentiable argument components whose gradient nothing can ask for: eagerly, those no tape or
    forward accumulator watches. In a graph tf.gradients may ask for any tensor later: none."""
    if not tf.executing_eagerly():
        return frozenset()
    components = [arguments.components[i] for i in arguments.differentiable]
    return frozenset(c.name for c in components if not _tf_internal.gradient_possible([c.tensor]))


def outputs_of(y: Any) -> Flattened:
    """f's y as components; numbers become tensors so that grad_fn gets an upstream for them, as with
    tf.custom_gradient."""
    if not isinstance(y, tf.Tensor):  # a lone tensor without nest's cost
        y = tf.nest.map_structure(lambda t: tf.convert_to_tensor(t) if isinstance(t, _NUMBERS) else t, y)
    return Flattened.of(y, "y")


def evaluate(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int) -> Plan:
    """f called on its stopped arguments (at ``order=2`` on the arguments themselves), and what it returned."""
    args, kwargs = arguments_of.positional(f, args, kwargs)
    arguments = Flattened.of(list(args), "args")
    kwargs = _constants(f, kwargs)
    if order == 1:
        stopped = {i: arguments.components[i].stopped for i in arguments.differentiable}
        at = dict(zip(stopped, identity.unreachable(list(stopped.values())), strict=True))
    else:  # grad_fn reads what f computed from x, for its own derivative (``recorded_term``)
        at = {i: arguments.components[i].tensor for i in arguments.differentiable}
    with _tf_internal.VariableWatcher() as watcher:
        y, grad_fn = call_f(f, tuple(arguments.with_tensors(at)), kwargs)
    watched = watcher.watched_variables()
    outputs = outputs_of(y)
    if order == 2:  # y moves with x through f's ops: stopped, and called again where it moves with variables
        stopped = {i: arguments.components[i].stopped for i in arguments.differentiable}
        y = _stopped(outputs) if not watched else call_f(f, tuple(arguments.with_tensors(stopped)), kwargs)[0]
        outputs = outputs_of(y)
    variables = []
    if watched and signature(grad_fn).takes_variables:
        variables = [gradient_components.of(v.name, v) for v in watched]
        outputs = outputs_of(_stopped(outputs))  # grad_fn gives the variables' gradients: cut autodiff's path to them
    return Plan(f, outputs, grad_fn, arguments, variables, order, unasked=unasked(arguments))


def value_alone(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """values_only(): f's y, not differentiable w.r.t. the arguments or the variables f reads; no grad_fn call."""
    args, kwargs = arguments_of.positional(f, args, kwargs)
    arguments = Flattened.of(list(args), "args")
    with _tf_internal.VariableWatcher() as watcher:
        y = call_f(f, args, kwargs)[0]
    sources = [arguments.components[i].unread for i in arguments.differentiable] + list(watcher.watched_variables())
    return value_only_mode.undifferentiable(y, sources)


class Untransposable(Exception):
    """The tape's transpose of grad_fn is not the whole of it."""


@dataclasses.dataclass
class Probe:
    """grad_fn called on zero upstreams that a tape watches: its ops say the route, its tape gives J·v."""

    tape: tf.GradientTape
    upstreams: dict[int, tf.Tensor]  # per differentiable output: the watched zeros
    gradients: list[Gradient]
    reached: list[bool]  # per gradient: whether the tape records it from the upstream
    first_op: int  # in a graph: where grad_fn's ops begin
    ops: masked_selects.GradFnOps  # what grad_fn's ops read and made
    masked: bool = False  # whether a transpose taken so far masked an op

    @property
    def watched(self) -> list[tf.Tensor]:
        return list(self.upstreams.values())

    @property
    def connected(self) -> list[Gradient]:
        """The gradients the tape records from the upstreams."""
        return [g for g, r in zip(self.gradients, self.reached, strict=True) if r]

    def findings(self, plan: Plan) -> list[transposition.Finding]:
        """While tracing: the ops grad_fn made, read as the route needs them."""
        ops = tf.compat.v1.get_default_graph().get_operations()[self.first_op:]
        return transposition.findings(ops, self.watched, [g.values for g in self.gradients], plan.boxes)

    def transposed(self, gradients: list[Gradient], vectors: list[tf.Tensor]) -> list[Any]:
        """J·vector for each watched upstream: grad_fn's ops differentiated against the vectors."""
        if not gradients:
            return [None] * len(self.upstreams)
        try:
            results = [g.values for g in gradients]
            with masked_selects.transposing(self.ops, results) as masked:
                products = list(self.tape.gradient(results, self.watched, output_gradients=vectors))
                self.masked = self.masked or masked()
                return products
        except LookupError as error:
            raise Untransposable(str(error)) from error

    def masks_a_select(self) -> bool:
        """Whether grad_fn's transpose masks a select's discarded elements (``masked_selects``): its J·v, formed
        once while tracing (ops no output reads, which the graph's optimizer drops), masked an op; False where it
        cannot be formed (the backward is then grad_fn's ops, as before)."""
        if not self.masked and self.connected:
            try:
                self.transposed(self.connected, [tf.zeros_like(g.values) for g in self.connected])
            except Untransposable:
                return False
        return self.masked

    def transposed_back(self, upstreams: dict[int, tf.Tensor]) -> list[Gradient]:
        """grad_fn(upstreams) as the transpose of its masked J·v (``transposed``), for a backward that TensorFlow
        transposes again by its own registered gradients (a traced call's JVP): made of the masked ops, whose
        transposes keep a discarded element 0, where grad_fn's ops as written give its 0 / 0 back as NaN. The same
        values, but at the discarded elements, where each is +0.0."""
        connected = self.connected
        vectors = [tf.zeros_like(g.values) for g in connected]
        products = self.transposed(connected, vectors)
        pairs = [(tf.convert_to_tensor(p), upstreams[i]) for i, p in zip(self.upstreams, products, strict=True)
                 if p is not None]
        # tf.gradients, not a tape: TensorFlow calls a backward with its tapes paused where it forms a traced
        # call's JVP, and a tape made there records nothing (its gradient was 0).
        back = tf.gradients([p for p, _ in pairs], vectors, grad_ys=[u for _, u in pairs],
                            unconnected_gradients=tf.UnconnectedGradients.ZERO) if pairs else [
            tf.zeros_like(v) for v in vectors]
        unreached = [Gradient(g.component, tf.zeros_like(g.values), g.indices)
                     for g, r in zip(self.gradients, self.reached, strict=True) if not r]
        return [Gradient(g.component, b, g.indices) for g, b in zip(connected, back, strict=True)] + unreached


def probe(plan: Plan, persistent: bool, watch: bool = True) -> Probe:
    """grad_fn on zero upstreams; ``watch``: a tape records it from them (the transpose needs one; for a y of
    one element none does, so that decorated calls inside grad_fn take the upstream as the constant it is)."""
    zeros = {i: tf.zeros_like(plan.outputs.components[i].tensor) for i in plan.outputs.differentiable}
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    first_op = len(graph.get_operations()) if graph is not None else 0
    with tf.GradientTape(watch_accessed_variables=False, persistent=persistent) as tape:
        tape.watch(list(zeros.values()) if watch else [])
        with masked_selects.recording_ops() as ops:
            gradients = plan.gradients_at(zeros)
        reached = [_tf_internal.should_record_backprop([g.values]) for g in gradients]
    return Probe(tape, zeros, gradients, reached, first_op, ops)
