"""The decorator form: a vector-Jacobian product embedded as a linear map.

``f(*args, **kwargs)`` returns ``(y, grad_fn)``, grad_fn mapping upstream
gradients to argument gradients (a VJP, as for ``tf.custom_gradient``). The
elementwise identity is exact only for diagonal Jacobians, so the decorator
embeds the linear map itself:

    h = y − (J·v − stop(J·v)),   v = stop(x) − x,   J·v = ∂/∂d ⟨grad_fn(d), v⟩ at d = 0

grad_fn is linear in d, so the inner derivative is exactly the Jacobian-vector
product; v is +0.0 in value, so the subtracted term is +0.0 and h is y bit for
bit; and the derivative of h w.r.t. x is J, whose reverse-mode product with an
upstream gradient is grad_fn(upstream) again. Where y has one element no
transpose is needed: J is grad_fn(1), and the identity form embeds it,

    h = y − Σ multiply_no_nan(grad_fn(1), v)

which also serves grad_fns that TensorFlow cannot differentiate. Where the
transpose would not see all of grad_fn (``transposition``) and y is small, J
is built row by row from grad_fn on unit upstreams and embedded the same way.
Every zero is the identity module's, so there is one code path for the identity. What is
carried of each kind of argument is ``gradient_components``'; how grad_fn is
called and read is ``grad_fn_conventions``'.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared import bounded_cache, function_identity
from stopgrad_math.tensorflow import (
    _tf_internal,
    grad_fn_conventions,
    gradient_components,
    gradient_layout,
    identity,
    numerical_linearity,
    second_derivative_guard,
    transposition,
    value_only_mode,
)
from stopgrad_math.tensorflow.grad_fn_conventions import Gradient
from stopgrad_math.tensorflow.gradient_components import Component, Flattened

_NUMBERS = (bool, int, float, complex, np.ndarray, np.generic)


def _call_f(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[..., Any]]:
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


@dataclasses.dataclass(frozen=True)
class _Evaluating:
    """Set while a grad_fn runs: the order of the embedding that calls it, how many grad_fns deep, where the
    decorated calls it makes are kept (each one op box for the route, ``transposition``), and the functions
    whose grad_fns are running (``function_identity.key`` of each f: a factory's fresh wrapper of the same
    function is the same function)."""

    order: int
    depth: int
    boxes: list[transposition.Box]
    running: frozenset[Hashable]


# A grad_fn may call decorated functions, its own f among them (erfcx' = 2x·erfcx − 2/√π). They run when f is
# called, not in the backward pass, so each must end the recursion itself: see _needs_embedding.
_EVALUATING: contextvars.ContextVar[_Evaluating | None] = contextvars.ContextVar("grad_fn_evaluation", default=None)
MAX_DEPTH = 8


@contextlib.contextmanager
def _evaluating(order: int, boxes: list[transposition.Box], f: Callable[..., Any]) -> Iterator[None]:
    outer = _EVALUATING.get()
    depth, running = (1, frozenset()) if outer is None else (outer.depth + 1, outer.running)
    token = _EVALUATING.set(_Evaluating(order, depth, boxes, running | {function_identity.key(f)}))
    try:
        yield
    finally:
        _EVALUATING.reset(token)


@dataclasses.dataclass
class _Plan:
    """What one call embeds: f's value, its grad_fn, and the components of arguments and outputs."""

    f: Callable[..., Any]
    outputs: Flattened
    grad_fn: Callable[..., Any]
    arguments: Flattened
    variables: list[Component]  # read inside f, when grad_fn gives their gradients
    order: int
    boxes: list[transposition.Box] = dataclasses.field(default_factory=list)  # nested decorated calls

    def gradients(self, upstreams: dict[int, Any]) -> list[Gradient]:
        """grad_fn(upstreams), checked and paired with the components they belong to."""
        variables = [c.value for c in self.variables]
        with _evaluating(self.order, self.boxes, self.f):
            grads, variable_grads = grad_fn_conventions.call(self.grad_fn, self.outputs, upstreams, variables)
        pairs = grad_fn_conventions.match(grads, self.arguments)
        if self.variables:
            flat = list(variable_grads) if variable_grads is not None else []
            if len(flat) != len(self.variables):
                counts = len(flat), len(self.variables)
                raise ValueError(f"grad_fn returned {counts[0]} variable gradients for {counts[1]} variables.")
            pairs += [(c, g) for c, g in zip(self.variables, flat, strict=True) if g is not None]
        return [grad_fn_conventions.checked(c, g) for c, g in pairs]

    def with_terms(self, terms: dict[int, list[tf.Tensor]]) -> Any:
        """f's value with zero terms attached to output components: y bit for bit, derivative theirs."""
        attached = {i: identity.attach(self.outputs.components[i].tensor, t) for i, t in terms.items() if t}
        return self.outputs.with_tensors(attached)


def _outputs(y: Any) -> Flattened:
    # Numbers become tensors so that grad_fn gets an upstream for them, as with tf.custom_gradient.
    if not isinstance(y, tf.Tensor):  # a lone tensor without nest's cost
        y = tf.nest.map_structure(lambda t: tf.convert_to_tensor(t) if isinstance(t, _NUMBERS) else t, y)
    return Flattened.of(y, "y")


def _evaluate(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int) -> _Plan:
    args, kwargs = arguments_of.positional(f, args, kwargs)
    arguments = Flattened.of(list(args), "args")
    kwargs = _constants(f, kwargs)
    stopped = {i: arguments.components[i].stopped for i in arguments.differentiable}
    at = dict(zip(stopped, identity.unreachable(list(stopped.values())), strict=True)) if order == 1 else stopped
    if order == 2:
        # The midpoint stop(x) + u/2 equals x bit for bit (−0.0 too) and moves
        # at half speed, which makes J·v exact to second order.
        components = arguments.components
        at = {i: t + identity.zero_with_slope(components[i].tensor, False, t) / 2 for i, t in at.items()}
    with _tf_internal.VariableWatcher() as watcher:
        y, grad_fn = _call_f(f, tuple(arguments.with_tensors(at)), kwargs)
    watched = watcher.watched_variables()
    outputs = _outputs(y)
    if order == 2:  # f ran at the midpoint; its value must not move with it, but must with variables it reads
        y = _stopped(outputs) if not watched else _call_f(f, tuple(arguments.with_tensors(stopped)), kwargs)[0]
        outputs = _outputs(y)
    variables = []
    if watched and grad_fn_conventions.signature(grad_fn).takes_variables:
        variables = [gradient_components.of(v.name, v) for v in watched]
        outputs = _outputs(_stopped(outputs))  # grad_fn gives the variables' gradients: cut autodiff's path to them
    return _Plan(f, outputs, grad_fn, arguments, variables, order)


def _one_element_output(plan: _Plan) -> int | None:
    """The only differentiable output, where it is a dense tensor of one element known while tracing."""
    differentiable = plan.outputs.differentiable
    if len(differentiable) != 1:
        return None
    output = plan.outputs.components[differentiable[0]]
    return differentiable[0] if isinstance(output.value, tf.Tensor) and output.value.shape.num_elements() == 1 else None


# ---------------------------------------------------------------- 2. the route, from grad_fn's ops


@dataclasses.dataclass
class _Probe:
    """grad_fn called on zero upstreams that a tape watches: its ops say the route, its tape gives J·v."""

    tape: tf.GradientTape
    upstreams: dict[int, tf.Tensor]  # per differentiable output: the watched zeros
    gradients: list[Gradient]
    reached: list[bool]  # per gradient: whether the tape records it from the upstream
    first_op: int  # in a graph: where grad_fn's ops begin

    @property
    def watched(self) -> list[tf.Tensor]:
        return list(self.upstreams.values())

    def findings(self, plan: _Plan) -> list[transposition.Finding]:
        """While tracing: the ops grad_fn made, read as the route needs them."""
        ops = tf.compat.v1.get_default_graph().get_operations()[self.first_op:]
        return transposition.findings(ops, self.watched, [g.values for g in self.gradients], plan.boxes)


def _probe(plan: _Plan, persistent: bool, watch: bool = True) -> _Probe:
    """grad_fn on zero upstreams; ``watch``: a tape records it from them (the transpose needs one; for a y of
    one element none does, so that decorated calls inside grad_fn take the upstream as the constant it is)."""
    zeros = {i: tf.zeros_like(plan.outputs.components[i].tensor) for i in plan.outputs.differentiable}
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    first_op = len(graph.get_operations()) if graph is not None else 0
    with tf.GradientTape(watch_accessed_variables=False, persistent=persistent) as tape:
        tape.watch(list(zeros.values()) if watch else [])
        gradients = plan.gradients({i: plan.outputs.components[i].rebuild(d) for i, d in zeros.items()})
        reached = [_tf_internal.should_record_backprop([g.values]) for g in gradients]
    return _Probe(tape, zeros, gradients, reached, first_op)


# Eager mode: the route per decorated function (``function_identity``) and input signature.
ROUTES_KEPT = 1024
_ROUTES: bounded_cache.BoundedCache[transposition.Route] = bounded_cache.BoundedCache(ROUTES_KEPT)


def _route(plan: _Plan, probe: _Probe | None, signature: Hashable | None,
           require_proof: bool) -> transposition.Route:
    """The route for this call: from the ops of the probe while tracing; in eager mode from a trace of grad_fn
    made once per function and input ``signature`` (or, where grad_fn cannot be traced, from numerical tests)."""
    one_element, small = _one_element(plan), _small(plan)
    if probe is not None:
        return transposition.choose_route(probe.findings(plan), one_element, small)
    route = _ROUTES.get(signature) if signature is not None else None
    if route is None:
        found = _traced_findings(plan)
        if found is None:
            if require_proof:
                raise ValueError(_UNTRACEABLE)
            route = _tested_route(plan, one_element, small)
        else:
            route = transposition.choose_route(found, one_element, small)
        if signature is not None:
            _ROUTES.put(signature, route)
    return route


_UNTRACEABLE = (
    "grad_fn cannot be traced into a graph (it reads tensor values in Python), "
    "so its linearity cannot be proven from its ops, and check_linearity=True asks for that proof."
)


def _traced_findings(plan: _Plan) -> list[transposition.Finding] | None:
    """Eager mode: grad_fn traced into a graph on upstreams of y's shapes, its ops read; None where it cannot be.
    In a replica context every replica traces it on its first call, so a collective in it meets the others'."""
    outputs = plan.outputs.components
    specs = [tf.TensorSpec(outputs[i].tensor.shape, outputs[i].tensor.dtype) for i in plan.outputs.differentiable]

    watch = not _one_element(plan)  # as the probe watches them while tracing

    def call(upstreams: list[tf.Tensor]) -> tuple[list[tf.Tensor], list[transposition.Box]]:
        plan.boxes.clear()
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(upstreams if watch else [])
            pairs = zip(plan.outputs.differentiable, upstreams, strict=True)
            gradients = plan.gradients({i: outputs[i].rebuild(d) for i, d in pairs})
        return [g.values for g in gradients], list(plan.boxes)

    return transposition.trace(call, specs)


def _tested_route(plan: _Plan, one_element: bool, small: bool) -> transposition.Route:
    """Where grad_fn cannot be traced: numerical evidence, a sample rather than a proof (grad_fn(0) = 0,
    superposition on random upstreams, and for the transpose a dot-product test)."""
    _check_superposition(plan)
    if one_element:
        return transposition.Route.ONE_ELEMENT
    probe = _probe(plan, persistent=True)
    numerical_linearity.check_at_zero([g.values for g in probe.gradients], [g.name for g in probe.gradients])
    try:
        _dot_product_test(plan, probe)
    except _Untransposable as reason:
        if not small:
            raise ValueError(transposition.OPAQUE_MESSAGE.format(reason=reason)) from None
        return transposition.Route.UNIT_UPSTREAMS
    return transposition.Route.TRANSPOSE


def _one_element(plan: _Plan) -> bool:
    index = _one_element_output(plan)
    return index is not None and _real_or_all_complex(plan, index) and not _replicated()


def _replicated() -> bool:
    """In a replica context (``tf.distribute``), grad_fn(1) and grad_fn on unit upstreams are not rows of J:
    a collective in grad_fn maps every replica's upstream, not this replica's alone. J·v is the transpose then,
    through the collective's own gradient (an all-reduce's is an all-reduce)."""
    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


def _small(plan: _Plan) -> bool:
    """Whether J can be built from unit upstreams: a few output elements known while tracing, dense gradients
    of a real function or of a complex one with complex arguments (J is then conj(grad_fn(e_k)))."""
    outputs = [plan.outputs.components[i] for i in plan.outputs.differentiable]
    sizes = [c.value.shape.num_elements() if isinstance(c.value, tf.Tensor) else None for c in outputs]
    known = [n for n in sizes if n is not None]
    if len(known) < len(sizes) or sum(known) > transposition.SMALL_Y or _replicated():
        return False
    return all(_real_or_all_complex(plan, i) for i in plan.outputs.differentiable)


class _Untransposable(Exception):
    """The tape's transpose of grad_fn is not the whole of it."""


def _dot_product_test(plan: _Plan, probe: _Probe) -> None:
    """Eager mode, grad_fn untraceable: ⟨T(a), b⟩ = ⟨a, grad_fn(b)⟩ for random a, b, or _Untransposable."""
    connected = [g for g, r in zip(probe.gradients, probe.reached, strict=True) if r]
    a = [numerical_linearity.random_like(g.values, [1, k]) for k, g in enumerate(connected)]
    b = {i: numerical_linearity.random_like(w, [2, k]) for k, (i, w) in enumerate(probe.upstreams.items())}
    with _tf_internal.stop_recording():  # numbers to compare, nothing for the caller's tapes to keep
        transposed = _transposed(probe, connected, a)
    # Not under stop_recording, which would stop the tapes grad_fn makes itself (a nested derivative).
    direct = {g.name: g.values for g in plan.gradients({i: plan.outputs.components[i].rebuild(d)
                                                        for i, d in b.items()})}
    pairs_t = [(t, b_i) for t, b_i in zip(transposed, b.values(), strict=True) if t is not None]
    pairs_d = [(a_g, direct[g.name]) for a_g, g in zip(a, connected, strict=True)]
    unconnected = [direct[g.name] for g in probe.gradients if g not in connected]
    dtype = plan.outputs.components[plan.outputs.differentiable[0]].tensor.dtype
    if any(np.any(np.asarray(u) != 0) for u in unconnected):
        raise _Untransposable("grad_fn computes part of its result where no tape records it")
    mismatch = transposition.dot_product_mismatch(pairs_t, pairs_d, dtype)
    if mismatch is not None:
        raise _Untransposable(mismatch)


def _transposed(probe: _Probe, gradients: list[Gradient], vectors: list[tf.Tensor]) -> list[Any]:
    """J·vector for each watched upstream: grad_fn's ops differentiated against the vectors."""
    if not gradients:
        return [None] * len(probe.upstreams)
    try:
        return list(probe.tape.gradient([g.values for g in gradients], probe.watched, output_gradients=vectors))
    except LookupError as error:
        raise _Untransposable(str(error)) from error


# ---------------------------------------------------------------- 3. the zero term of each route


def _one_element_terms(plan: _Plan, probe: _Probe | None) -> dict[int, list[tf.Tensor]]:
    """y of one element: its derivative is grad_fn(1), embedded as the identity form does (no transpose)."""
    index = plan.outputs.differentiable[0]
    y = plan.outputs.components[index].tensor
    gradients = plan.gradients({index: plan.outputs.components[index].rebuild(tf.ones_like(y))})
    if plan.order == 1:
        gradients = _stopped_values(gradients)
    # grad_fn(1) is conj(J) for a complex y, TensorFlow's convention.
    return {index: _scalar_terms(gradients, y.dtype, y.shape, conjugate=identity.is_complex(y.dtype))}


def _transpose_terms(plan: _Plan, probe: _Probe | None) -> dict[int, list[tf.Tensor]]:
    """The zero term of each output component: J·v, the derivative of ⟨grad_fn(d), v⟩ w.r.t. d at d = 0.

    A result that no tape reaches from the upstream was proven zero by the
    route (J = 0 there): it still connects its argument, with a zero
    gradient, as tf.custom_gradient's zeros do.
    """
    probe = probe or _probe(plan, persistent=False)
    connected = [g for g, r in zip(probe.gradients, probe.reached, strict=True) if r]
    vectors = [tf.cast(g.zero(), g.values.dtype) for g in connected]
    products = _transposed(probe, connected, vectors) if connected else [None] * len(probe.upstreams)
    zero = [Gradient(g.component, tf.zeros_like(identity.stop(g.values)), g.indices)
            for g, r in zip(probe.gradients, probe.reached, strict=True) if not r]
    terms: dict[int, list[tf.Tensor]] = {}
    for i, product in zip(probe.upstreams, products, strict=True):
        terms[i] = [] if product is None else [identity.zero_with_slope(product, False)]
        terms[i] += _scalar_terms(zero, plan.outputs.components[i].tensor.dtype)
    return terms


def _stopped_values(gradients: list[Gradient]) -> list[Gradient]:
    """The gradients with their values stopped: at order 1 J is a constant, and no derivative may be sought
    inside grad_fn's ops (a symbolic gradient would walk through the stopped arguments into an op that has
    none, such as RandomGammaGrad, and raise)."""
    eager = tf.executing_eagerly()  # eagerly, only what a tape records has a path to cut (an op saved)
    todo = [k for k, g in enumerate(gradients) if not eager or _tf_internal.should_record_backprop([g.values])]
    stopped = dict(zip(todo, identity.stop_each([gradients[k].values for k in todo]), strict=True))
    return [dataclasses.replace(g, values=stopped[k]) if k in stopped else g for k, g in enumerate(gradients)]


_SCALAR = tf.TensorShape([])


def _scalar_terms(gradients: list[Gradient], dtype: tf.DType, shape: tf.TensorShape = _SCALAR,
                  conjugate: bool = False) -> list[tf.Tensor]:
    """Σ multiply_no_nan(g, v) in ``dtype``, of one element in ``shape``: the identity form's terms for a y of
    one element (of that shape), or terms that broadcast to any y."""
    return [_summed_to(identity.times_zero(tf.math.conj(g.values) if conjugate else g.values, g.zero(), dtype), shape)
            for g in gradients]


def _summed_to(product: tf.Tensor, shape: tf.TensorShape) -> tf.Tensor:
    """The sum of ``product`` in a one-element ``shape``: attached to y, its gradient needs no broadcasting."""
    if product.shape.is_fully_defined() and product.shape == shape:
        return product
    total = tf.reduce_sum(product)
    return tf.reshape(total, shape) if shape.rank else total


def _unit_upstream_terms(plan: _Plan, probe: _Probe | None) -> dict[int, list[tf.Tensor]]:
    """J built row by row from grad_fn on unit upstreams (no transpose), embedded as the identity form embeds
    a full Jacobian: term = Σ_j J[k, j]·v[j] for each output element k."""
    terms: dict[int, list[tf.Tensor]] = {}
    for i in plan.outputs.differentiable:
        y = plan.outputs.components[i].tensor
        size = y.shape.num_elements()
        rows: dict[str, list[tf.Tensor | None]] = {}
        leaves: dict[str, Gradient] = {}
        for k in range(size):
            unit = tf.reshape(tf.one_hot(k, size, dtype=y.dtype), y.shape)
            for g in plan.gradients({i: plan.outputs.components[i].rebuild(unit)}):
                if g.indices is not None:
                    reason = "its gradients are sparse (tf.IndexedSlices)"
                    raise ValueError(transposition.OPAQUE_MESSAGE.format(reason=reason))
                leaves[g.name] = g
                rows.setdefault(g.name, [None] * size)[k] = g.values
        terms[i] = [_jacobian_term(plan, leaves[name], columns, y) for name, columns in rows.items()]
    return terms


def _jacobian_term(plan: _Plan, gradient: Gradient, rows: list[tf.Tensor | None], y: tf.Tensor) -> tf.Tensor:
    """Σ_j J[k, j]·v[j] in y's shape, J[k] = conj(row k) (TensorFlow's convention for a complex y): the identity
    form's term for a full Jacobian."""
    component = gradient.component
    jacobian = tf.stack([tf.zeros_like(component.tensor, gradient.values.dtype) if row is None else row
                         for row in rows])
    jacobian = tf.math.conj(jacobian) if identity.is_complex(y.dtype) else jacobian
    if plan.order == 1:
        jacobian = identity.stop(jacobian)
    jacobian = tf.reshape(jacobian, tf.concat([tf.shape(y), tf.shape(component.tensor)], 0))  # rows may be unshaped
    return gradient_layout.zero_term(gradient.name, _FULL_JACOBIAN, y, component.tensor, jacobian, component.stopped)


_FULL_JACOBIAN = gradient_layout.Choice((gradient_layout.Layout.JACOBIAN,), static=True)

_TERMS = {
    transposition.Route.ONE_ELEMENT: _one_element_terms,
    transposition.Route.TRANSPOSE: _transpose_terms,
    transposition.Route.UNIT_UPSTREAMS: _unit_upstream_terms,
}


def _eager_signature(plan: _Plan, kwargs: dict[str, Any], require_proof: bool) -> Hashable | None:
    """In eager mode, what the route is kept by: the function (``function_identity``), the options, whether in a
    replica context, and what tf.function would key a trace of this call by (the shapes and dtypes of the
    tensors and the constant arguments). None while tracing, or where keyword arguments or an unhashable
    constant leave it unknown."""
    if kwargs or not tf.executing_eagerly():
        return None
    specs = tuple(_spec(c) for c in plan.arguments.components + plan.outputs.components)
    key = function_identity.key(plan.f), plan.order, require_proof, _replicated(), specs
    try:
        hash(key)
    except TypeError:  # a NumPy array, a list
        return None
    return key


def _spec(component: Component) -> Hashable:
    """A component as tf.function keys it: a tensor by shape and dtype (integer ones too), a constant by value."""
    if component.differentiable:
        return tuple(component.shape.as_list()), component.dtype
    value = component.value
    if isinstance(value, tf.Tensor):
        return tuple(value.shape.as_list()), value.dtype
    return value if _hashable(value) else function_identity.same(value)  # self by identity, as tf.function


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# ---------------------------------------------------------------- the pipeline


def _embed(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int,
           require_proof: bool) -> Any:
    """evaluate f → choose the route → build the zero terms → attach them to y."""
    plan = _evaluate(f, args, kwargs, order)
    if not plan.outputs.differentiable or not (plan.arguments.differentiable or plan.variables):
        return plan.outputs.structure  # nothing to differentiate: no grad_fn call, as tf.custom_gradient
    if _unwatched(plan):
        return plan.outputs.structure  # no tape or accumulator can ever ask for this call's derivative
    probe = None if tf.executing_eagerly() else _probe(plan, persistent=True, watch=not _one_element(plan))
    route = _route(plan, probe, _eager_signature(plan, kwargs, require_proof), require_proof)
    terms = _TERMS[route](plan, probe)
    if order == 1 and _EVALUATING.get() is None:
        _guard_second_derivatives(plan, terms)
    return plan.with_terms(terms)


def _unwatched(plan: _Plan) -> bool:
    """Eagerly, whether nothing records the arguments and grad_fn gives no variable's gradient: a tape is
    active, but for other tensors (a decorated call inside another's f, whose arguments were stopped)."""
    if not tf.executing_eagerly() or plan.variables:
        return False
    components = [plan.arguments.components[i] for i in plan.arguments.differentiable]
    if any(gradient_components.is_variable_or_composite(c.value) for c in components):
        return False  # a variable is watched when it is read, not as a tensor
    return not _tf_internal.gradient_possible([c.tensor for c in components])


def _guard_second_derivatives(plan: _Plan, terms: dict[int, list[tf.Tensor]]) -> None:
    """At order 1, where a second derivative could be taken, one more zero term on each output that makes it
    raise (``second_derivative_guard``). Not for calls inside a grad_fn: their derivatives are J's own."""
    arguments = [plan.arguments.components[i].tensor for i in plan.arguments.differentiable]
    if not arguments or not second_derivative_guard.needed(arguments):
        return
    guard = second_derivative_guard.zero_term(arguments)
    for i in plan.outputs.differentiable:
        terms.setdefault(i, []).append(identity.cast(guard, plan.outputs.components[i].tensor.dtype))


def _value_alone(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """values_only(): f's y, not differentiable w.r.t. the arguments or the variables f reads; no grad_fn call."""
    args, kwargs = arguments_of.positional(f, args, kwargs)
    arguments = Flattened.of(list(args), "args")
    with _tf_internal.VariableWatcher() as watcher:
        y = _call_f(f, args, kwargs)[0]
    sources = [arguments.components[i].unread for i in arguments.differentiable] + list(watcher.watched_variables())
    return value_only_mode.undifferentiable(y, sources)


def _check_superposition(plan: _Plan) -> None:
    """check_linearity=True: grad_fn on random upstreams, which needs no tape (opaque grad_fns too)."""
    outputs = plan.outputs.components
    shapes = {i: tf.zeros_like(outputs[i].tensor) for i in plan.outputs.differentiable}
    call = lambda ups: [g.values for g in plan.gradients({i: outputs[i].rebuild(d) for i, d in ups.items()})]  # noqa: E731
    numerical_linearity.check_superposition(call, shapes)


def _real_or_all_complex(plan: _Plan, index: int) -> bool:
    """Whether grad_fn(1) is J: a complex y, or real arguments (a real y has no complex derivative)."""
    if identity.is_complex(plan.outputs.components[index].tensor.dtype):
        return True
    components = [plan.arguments.components[i] for i in plan.arguments.differentiable] + plan.variables
    return not any(identity.is_complex(c.dtype) for c in components)


def _needs_embedding(f: Callable[..., Any], evaluating: _Evaluating | None, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> bool:
    """Whether a decorated call must embed its gradient: always, except inside a grad_fn of order 1.

    There every value but the upstream is a constant: the arguments were
    stopped, and the upstream is a constant too where y has one element. A
    call on the upstream (a watched tensor) is embedded, since the transpose
    differentiates it; so are variables, which a tape may watch. A call on
    constants is embedded only in a graph, where ``tf.gradients`` may still
    differentiate it without a tape (TFP's ``value_and_gradient`` does, inside
    Student-t's CDF gradient), and only where f's own grad_fn is not running:
    calling f alone ends a recursion (erfcx' = 2x·erfcx − 2/√π; a Bessel
    function's gradient at order v ± 1). "f's own" is ``function_identity``'s,
    since TFP's factory wraps f anew at every call. Inside a grad_fn of order
    2, whose arguments move with x, every call is embedded, at the order
    ``_inner_order`` gives.
    """
    if evaluating is None or evaluating.order == 2:
        return True
    leaves = tf.nest.flatten((args, kwargs))
    if any(gradient_components.is_variable_or_composite(leaf) for leaf in leaves):
        return True  # a variable, ragged or sparse value: its own recording is not asked, so it is embedded
    if not _tf_internal.should_record_backprop([leaf for leaf in leaves if isinstance(leaf, tf.Tensor)]):
        return not tf.executing_eagerly() and function_identity.key(f) not in evaluating.running
    if evaluating.depth >= MAX_DEPTH:
        raise ValueError(
            f"grad_fns call decorated functions on their upstream gradients {MAX_DEPTH} deep: gradients that call "
            "each other on the upstream without end (a psum whose gradient is a broadcast whose gradient is a "
            "psum) cannot be embedded when f is called. Give y one element, or embed a Jacobian with "
            "custom_gradient(fx, jacobian, x)."
        )
    return True


def decorate(f: Callable[..., Any], order: int = 1, check_linearity: bool = False) -> Callable[..., Any]:
    """Returns f with its grad_fn embedded as a linear map.

    The contract is documented on the public entry point,
    ``stopgrad_math.custom_gradient``, and the conventions for grad_fn and
    the limits in the README's decorator section. The result
    keeps f's name and docstring; f itself is its ``undecorated`` attribute.
    """
    arguments_of.check_options(order, check_linearity)

    # A root name scope must start with a letter, digit or '.': '_f' and '<lambda>' would be refused.
    scope = re.sub(r"[^A-Za-z0-9_.]", "_", getattr(f, "__name__", "")).lstrip("_") or "custom_gradient"

    def embedded(status: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _tf_internal.AUTOGRAPH_STATUS.set(status)
        try:
            evaluating = _EVALUATING.get()
            if not _needs_embedding(f, evaluating, args, kwargs):  # `decorated` took the nothing-records case
                return _call_f(f, args, kwargs)[0]
            with identity.name_scope(scope):
                if value_only_mode.active():
                    return _value_alone(f, args, kwargs)
                if evaluating is None:
                    return _embed(f, args, kwargs, order, check_linearity)
                inner = _inner_order(f, evaluating)
                return _boxed(evaluating, lambda: _embed(f, args, kwargs, inner, check_linearity))
        finally:
            _tf_internal.AUTOGRAPH_STATUS.reset(token)

    # AutoGraph never converts the library's code (it cannot, and would warn); f and grad_fn are converted where
    # the caller's code is (``_tf_internal.converted``), so `decorated` passes its status on. tf.custom_gradient
    # converts neither.
    unconverted = tf.autograph.experimental.do_not_convert(embedded)

    @functools.wraps(f)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        if identity.nothing_records():  # eagerly, nothing to record: f's value for the cost of a call of f
            return _call_f(f, args, kwargs)[0]
        return unconverted(_tf_internal.autograph_status(), args, kwargs)

    del decorated.__wrapped__  # AutoGraph would read f's source through it, and convert f in place of this
    if decorated.__name__ == "<lambda>":  # AutoGraph would take the wrapper for a lambda, and not find it
        decorated.__name__ = decorated.__qualname__ = "custom_gradient_of_lambda"
    decorated.undecorated = f  # type: ignore[attr-defined]  # a function attribute, as tf.function's python_function
    return decorated


def _inner_order(f: Callable[..., Any], evaluating: _Evaluating) -> int:
    """The order of a decorated call inside a grad_fn. Inside one of order 2, whose arguments move with x, a call
    is embedded at order 2 too: a grad_fn that differentiates it (Student-t's CDF, betainc's gradient through
    ``value_and_gradient``) needs its second derivative. A call of a function whose grad_fn is running already
    (erfcx' = 2x·erfcx − 2/√π) is embedded at order 1, which ends the recursion: only its first derivative
    enters a second derivative there."""
    return 2 if evaluating.order == 2 and function_identity.key(f) not in evaluating.running else 1


def _boxed(evaluating: _Evaluating, embed: Callable[[], Any]) -> Any:
    """A decorated call inside a grad_fn, embedded at ``_inner_order``'s order; while tracing, its ops are kept
    as one box for the route of the grad_fn that makes it."""
    if tf.executing_eagerly():
        return embed()
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    result = embed()
    evaluating.boxes.append(transposition.Box(frozenset(graph.get_operations()[first:])))
    return result
