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

A call runs four stages, in this order:

1. evaluate (``evaluation``): f on stopped arguments, grad_fn on watched zero
   upstreams while tracing;
2. route (``routes``): which of the three ways above, from grad_fn's ops;
3. terms (here): the zero term of each output, one function per route;
4. attach (here): the terms added to y, and a guard on second derivatives.

Eagerly, where one tape alone watches the arguments, its one question is
reverse mode's: the transpose route then records grad_fn as the backward
(``recorded_term.grad_fn_recorded``) instead of forming J·v at every call.

Decorated calls inside a grad_fn are ``nested_calls``'. Every zero is the
identity module's; what is carried of each kind of argument is
``gradient_components``'; how grad_fn is called and read is
``grad_fn_conventions``'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.tensorflow import (
    _tf_internal,
    deferred_calls,
    evaluation,
    gradient_components,
    gradient_layout,
    identity,
    nested_calls,
    recorded_term,
    routes,
    second_derivative_guard,
    transposition,
    value_only_mode,
)
from stopgrad_math.tensorflow.evaluation import Plan, Probe
from stopgrad_math.tensorflow.grad_fn_conventions import Gradient

# ---------------------------------------------------------------- 3. terms: the zero term of each route


@dataclasses.dataclass(frozen=True)
class _Along:
    """What a route's terms are built along: the identity's zero v = stop(x) − x of each argument (the terms
    are +0.0, derivative J), or, at ``order=2``, given tangents ẋ by component name (the terms are −J·ẋ, the
    order-1 terms' tangent at v̇ = −ẋ, which ``recorded_term``'s forward function returns)."""

    tangents: dict[str, tf.Tensor] | None = None

    def vector(self, gradient: Gradient) -> tf.Tensor:
        """v, or −ẋ, where the gradient applies: the component, or its gathered rows."""
        if self.tangents is None:
            return gradient.zero()
        tangent = -self.tangents[gradient.name]
        return tangent if gradient.indices is None else tf.gather(tangent, gradient.indices)

    def carried(self, product: tf.Tensor) -> tf.Tensor:
        """J·v as a term: +0.0 in value with J·v's derivative; J·ẋ itself, a tangent."""
        return identity.zero_with_derivative_of(product) if self.tangents is None else product


_ZEROS = _Along()


def _one_element_terms(plan: Plan, probe: Probe | None, along: _Along = _ZEROS) -> dict[int, list[tf.Tensor]]:
    """y of one element: its derivative is grad_fn(1), embedded as the identity form does (no transpose)."""
    index = plan.outputs.differentiable[0]
    y = plan.outputs.components[index].tensor
    gradients = plan.gradients({index: plan.outputs.components[index].rebuild(tf.ones_like(y))})
    if plan.order == 1:
        gradients = _stopped_values(gradients)
    # grad_fn(1) is conj(J) for a complex y, TensorFlow's convention.
    return {index: _scalar_terms(gradients, y.dtype, along, y.shape, conjugate=identity.is_complex(y.dtype))}


def _transpose_terms(plan: Plan, probe: Probe | None, along: _Along = _ZEROS) -> dict[int, list[tf.Tensor]]:
    """The zero term of each output component: J·v, the derivative of ⟨grad_fn(d), v⟩ w.r.t. d at d = 0.

    A result that no tape reaches from the upstream was proven zero by the
    route (J = 0 there): it still connects its argument, with a zero
    gradient, as tf.custom_gradient's zeros do.
    """
    probe = probe or evaluation.probe(plan, persistent=False)
    connected = probe.connected
    vectors = [tf.cast(along.vector(g), g.values.dtype) for g in connected]
    products = probe.transposed(connected, vectors)
    zero = [Gradient(g.component, tf.zeros_like(identity.stop(g.values)), g.indices)
            for g, r in zip(probe.gradients, probe.reached, strict=True) if not r]
    terms: dict[int, list[tf.Tensor]] = {}
    for i, product in zip(probe.upstreams, products, strict=True):
        terms[i] = [] if product is None else [along.carried(product)]
        terms[i] += _scalar_terms(zero, plan.outputs.components[i].tensor.dtype, along)
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


def _scalar_terms(gradients: list[Gradient], dtype: tf.DType, along: _Along, shape: tf.TensorShape = _SCALAR,
                  conjugate: bool = False) -> list[tf.Tensor]:
    """Σ multiply_no_nan(g, v) in ``dtype``, of one element in ``shape``: the identity form's terms for a y of
    one element (of that shape), or terms that broadcast to any y."""
    return [_summed_to(identity.times_zero(tf.math.conj(g.values) if conjugate else g.values, along.vector(g), dtype),
                       shape) for g in gradients]


def _summed_to(product: tf.Tensor, shape: tf.TensorShape) -> tf.Tensor:
    """The sum of ``product`` in a one-element ``shape``: attached to y, its gradient needs no broadcasting."""
    if product.shape.is_fully_defined() and product.shape == shape:
        return product
    total = tf.reduce_sum(product)
    return tf.reshape(total, shape) if shape.rank else total


def _unit_upstream_terms(plan: Plan, probe: Probe | None, along: _Along = _ZEROS) -> dict[int, list[tf.Tensor]]:
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
        terms[i] = [_jacobian_term(plan, leaves[name], columns, y, along) for name, columns in rows.items()]
    return terms


def _jacobian_term(plan: Plan, gradient: Gradient, rows: list[tf.Tensor | None], y: tf.Tensor,
                   along: _Along) -> tf.Tensor:
    """Σ_j J[k, j]·v[j] in y's shape, J[k] = conj(row k) (TensorFlow's convention for a complex y): the identity
    form's term for a full Jacobian."""
    component = gradient.component
    jacobian = tf.stack([tf.zeros_like(component.tensor, gradient.values.dtype) if row is None else row
                         for row in rows])
    jacobian = tf.math.conj(jacobian) if identity.is_complex(y.dtype) else jacobian
    if plan.order == 1:
        jacobian = identity.stop(jacobian)
    jacobian = tf.reshape(jacobian, tf.concat([tf.shape(y), tf.shape(component.tensor)], 0))  # rows may be unshaped
    if along.tangents is not None:
        product = identity.times_zero(jacobian, along.vector(gradient), y.dtype)
        return gradient_layout.contracted(gradient_layout.Layout.JACOBIAN, product, y, component.tensor)
    return gradient_layout.zero_term(gradient.name, _FULL_JACOBIAN, y, component.tensor, jacobian, component.stopped)


_FULL_JACOBIAN = gradient_layout.Choice((gradient_layout.Layout.JACOBIAN,), static=True)

_TERMS = {
    transposition.Route.ONE_ELEMENT: _one_element_terms,
    transposition.Route.TRANSPOSE: _transpose_terms,
    transposition.Route.UNIT_UPSTREAMS: _unit_upstream_terms,
}


# ---------------------------------------------------------------- 4. attach: the pipeline


PFOR_ORDER_2 = ("{name} is decorated at order=2, but it is traced as pfor's loop body (tf.vectorized_map, a "
                "jacobian by pfor), whose conversion drops order 2's registered gradient: there it is embedded as at "
                "order=1, its first derivatives exact, and a second derivative would miss the term through grad_fn's "
                "own dependence on the arguments. Take second derivatives inside the mapped function.")


def _embed(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], order: int,
           require_proof: bool) -> Any:
    """evaluate f → choose the route → build the zero terms → attach them to y. Traced as pfor's loop body,
    ``order=2`` is order 1's, with its guard: order 2 records grad_fn as a registered gradient, which pfor's
    conversion drops (a gradient through ``tf.vectorized_map`` was 0), where order 1's terms are ordinary ops."""
    order, guard_message = _order_here(f, order)
    plan = evaluation.evaluate(f, args, kwargs, order)
    if not plan.outputs.differentiable or not (plan.arguments.differentiable or plan.variables):
        return plan.outputs.structure  # nothing to differentiate: no grad_fn call, as tf.custom_gradient
    if _unwatched(plan):
        return plan.outputs.structure  # no tape or accumulator can ever ask for this call's derivative
    probe = None if tf.executing_eagerly() else evaluation.probe(plan, persistent=True,
                                                                 watch=not routes.one_element(plan))
    chosen = _chosen_route(plan, probe, kwargs, require_proof)
    route = chosen.route
    if order == 1 and route is transposition.Route.TRANSPOSE and chosen.traced and _reverse_alone(plan):
        return recorded_term.grad_fn_recorded(plan)  # the tape's one question: J's transpose on ȳ, grad_fn(ȳ)
    if order == 2:
        return _recorded_order_2(plan, probe, route)
    if route is transposition.Route.REVERSE_ONLY:
        terms = _recorded_terms(plan, _refusing_forward_mode(
            transposition.FORWARD_MODE_MESSAGE.format(reason=chosen.opaque)))
    elif route is transposition.Route.TRANSPOSE and plan.variables and tf.executing_eagerly():
        terms = _recorded_terms(plan, _transposed_forward_mode(plan))
    else:
        terms = _TERMS[route](plan, probe)
    _refusal_terms(plan, terms)
    if nested_calls.current() is None:
        _guard_second_derivatives(plan, terms, guard_message)
    return plan.with_terms(terms)


def _order_here(f: Callable[..., Any], order: int) -> tuple[int, str]:
    """The order a call is embedded at, and what its guard says of a derivative beyond it: order 1's where order 2
    is traced as pfor's loop body."""
    if order == 2 and _tf_internal.in_pfor_loop_body():
        return 1, PFOR_ORDER_2.format(name=getattr(f, "__name__", "f"))
    return order, second_derivative_guard.MESSAGE


def _chosen_route(plan: Plan, probe: Probe | None, kwargs: dict[str, Any], require_proof: bool) -> routes.Chosen:
    """The call's route, or the refusal it carries: eagerly, a wrong gradient for a watched argument (raised at the
    call, naming it); at ``order=2``, a grad_fn no tape can transpose (J's own derivative needs J·v as well)."""
    chosen = routes.route(plan, probe, kwargs, require_proof)
    if chosen.refused:
        raise ValueError(chosen.refused[0])
    if chosen.route is transposition.Route.REVERSE_ONLY and plan.order == 2:
        raise ValueError(transposition.OPAQUE_MESSAGE.format(reason=chosen.opaque))
    return chosen


def _recorded_order_2(plan: Plan, probe: Probe | None, route: transposition.Route) -> Any:
    """``order=2``: grad_fn recorded as the backward, the route's order-1 terms' tangent as the forward. The
    transpose route's tangent needs a probe made now (a tape made inside the forward function would record
    nothing), but for no accumulator: eagerly, where one tape alone watches, none can ask, and none is made."""
    if probe is None and route is transposition.Route.TRANSPOSE:
        if _one_tape_alone(plan):
            return recorded_term.attached(plan, _unasked_tangents)
        probe = evaluation.probe(plan, persistent=True)
    terms = lambda tangents: _TERMS[route](plan, probe, _Along(tangents))  # noqa: E731
    if route is transposition.Route.TRANSPOSE and probe is not None and not tf.executing_eagerly() \
            and probe.masks_a_select():
        # A traced call's JVP is TensorFlow's transpose of its backward, taken twice, through the registered
        # gradients, where grad_fn's ops as written give a discarded 0 / 0 back as NaN: the backward is then the
        # masked J·v transposed back.
        return recorded_term.attached(plan, terms, probe.transposed_back)
    return recorded_term.attached(plan, terms)


def _unasked_tangents(tangents: dict[str, tf.Tensor]) -> dict[int, list[tf.Tensor]]:
    """The forward function where no accumulator watched the call: TensorFlow asks it only of a watching one."""
    raise AssertionError("stopgrad_math: a forward function was asked where no accumulator watched the call.")


def _unwatched(plan: Plan) -> bool:
    """Eagerly, whether nothing records the arguments and grad_fn gives no variable's gradient: a tape is
    active, but for other tensors (a decorated call inside another's f, whose arguments were stopped)."""
    if not tf.executing_eagerly() or plan.variables:
        return False
    components = [plan.arguments.components[i] for i in plan.arguments.differentiable]
    if any(gradient_components.is_variable_or_composite(c.value) for c in components):
        return False  # a variable is watched when it is read, not as a tensor
    return not _tf_internal.gradient_possible([c.tensor for c in components])


def _one_tape_alone(plan: Plan) -> bool:
    """Eagerly, whether one tape alone can ask this call's derivative, once: one GradientTape, not persistent,
    watches the arguments, and no accumulator (``_tf_internal.one_tape_alone``), grad_fn gives no variable's
    gradient, and no decorated call or replica context is around it. Then no tangent can be asked of the call."""
    if not tf.executing_eagerly() or plan.variables or nested_calls.current() is not None or transposition.replicated():
        return False
    return _tf_internal.one_tape_alone([plan.arguments.components[i].tensor for i in plan.arguments.differentiable])


def _reverse_alone(plan: Plan) -> bool:
    """At ``order=1``, whether the one derivative that can be asked is reverse mode's (``_one_tape_alone``) and y
    carries no path of autodiff's (to a variable f reads, which the route's terms add to).

    Then that derivative is J's transpose applied to ȳ, which for a grad_fn proven linear (the transpose route) is
    grad_fn itself, computed when the tape asks, as tf.custom_gradient computes it. The route's J·v would cost a
    transpose through grad_fn at every call (about 7 ms of a quantizer's eager step) for the tape to transpose it
    back; ``test_eager_reverse_path`` holds the two to the same bits.
    """
    outputs = [plan.outputs.components[i].tensor for i in plan.outputs.differentiable]
    return _one_tape_alone(plan) and not _tf_internal.should_record_backprop(outputs)


def _recorded_terms(plan: Plan, forward: Callable[[list[tf.Tensor]], Callable[..., list[tf.Tensor]]]
                    ) -> dict[int, list[tf.Tensor]]:
    """One +0.0 term per output, recorded (``recorded_term.recorded``) with grad_fn(upstream) as its backward,
    tf.custom_gradient's reverse mode, and ``forward(zeros)`` as its forward function. grad_fn is linear, so the
    backward is J's transpose exactly; a second derivative is refused by order 1's guard, as on every route.

    Two routes take it: where grad_fn's upstream passes ops no tape follows and y is too large for unit upstreams,
    J·v cannot be formed, and forward mode raises (``_refusing_forward_mode``: tf.custom_gradient's own forward
    mode raises a LookupError there, or gives no tangent where TensorFlow's forward mode of the layer gives none,
    as for ResizeBilinear); and eagerly at order 1, where grad_fn gives variables' gradients, the transpose's
    J·v would read the variables live in grad_fn, and a tape would differentiate J through them times v = 0 (NaN
    where the upstream is inf), so J·ẋ is formed where an accumulator asks (``_transposed_forward_mode``)."""
    outputs = plan.outputs.differentiable
    arguments = [plan.arguments.components[i] for i in plan.arguments.differentiable] + plan.variables
    zeros = [tf.zeros_like(plan.outputs.components[i].tensor) for i in outputs]

    def backward(*upstreams: tf.Tensor | None) -> list[Any]:
        # attach subtracts the terms: each term's upstream is −u, and grad_fn gets u back, bit for bit.
        asked = {i: -(tf.zeros_like(z) if d is None else d) for i, z, d in zip(outputs, zeros, upstreams, strict=True)}
        return recorded_term.by_input(plan.gradients_at(asked), arguments)

    terms = recorded_term.recorded("stopgrad_math_recorded", zeros, [c.tensor for c in arguments], backward,
                                   forward(zeros))
    return {i: [term] for i, term in zip(outputs, terms, strict=True)}


def _refusing_forward_mode(message: str) -> Callable[[list[tf.Tensor]], Callable[..., list[tf.Tensor]]]:
    """The reverse-only terms' forward function: a ValueError with ``message`` where an accumulator asks (the
    zeros, the terms, are what a forward function gives tangents of: the mutant that gives zeros reads them)."""

    def made(zeros: list[tf.Tensor]) -> Callable[..., list[tf.Tensor]]:
        def forward(*tangents: tf.Tensor | None) -> list[tf.Tensor]:
            raise ValueError(message)

        return forward

    return made


def _transposed_forward_mode(plan: Plan) -> Callable[[list[tf.Tensor]], Callable[..., list[tf.Tensor]]]:
    """The forward function of order 1's recorded terms: each term's tangent, J·(−ẋ), read off grad_fn's transpose
    by a probe made now (a tape made inside the forward function would record nothing)."""
    probe = evaluation.probe(plan, persistent=True)
    arguments = [plan.arguments.components[i] for i in plan.arguments.differentiable] + plan.variables

    def made(zeros: list[tf.Tensor]) -> Callable[..., list[tf.Tensor]]:
        def forward(*tangents: tf.Tensor | None) -> list[tf.Tensor]:
            moving = {c.name: tf.zeros_like(c.tensor) if t is None else t
                      for c, t in zip(arguments, tangents, strict=True)}
            terms = _TERMS[transposition.Route.TRANSPOSE](plan, probe, _Along(moving))
            # (each recorded term stands for the route's terms, whose tangent is their sum: attach subtracts)
            return [-identity.attach(tf.zeros_like(z), terms.get(i, []))
                    for z, i in zip(zeros, plan.outputs.differentiable, strict=True)]

        return forward

    return made


def _refusal_terms(plan: Plan, terms: dict[int, list[tf.Tensor]]) -> None:
    """In a graph, grad_fn's wrong gradient for an argument (``Plan.refused``) is refused where that argument's
    derivative is asked: one more zero term on each output, whose derivative w.r.t. that argument raises the
    refusal (``_refused``: where tf.gradients, a tape or an accumulator reaches it), and which asks nothing of the
    other arguments."""
    for name, message in plan.refused.items():
        component = next(c for c in plan.arguments.components if c.name == name)
        zero = identity.zero_with_slope(component.tensor, False)  # +0.0 at every element, slope 1
        zero = tf.math.real(zero) if identity.is_complex(zero.dtype) else zero
        refusal = _refused(tf.reduce_sum(zero), message)
        for i in plan.outputs.differentiable:
            terms.setdefault(i, []).append(identity.cast(refusal, plan.outputs.components[i].tensor.dtype))


def _refused(zero: tf.Tensor, message: str) -> tf.Tensor:
    """``zero``, whose derivative raises ``message`` as a ValueError: tf.custom_gradient's, which tf.gradients, the
    tapes and the accumulators all ask (a PreventGradient's LookupError would say "Gradient explicitly disabled").
    Traced by ``tf.saved_model.save``, which traces every registered gradient to save it (and where raising would
    fail the save, which tf.custom_gradient's would not), the derivative raises ``message`` where it runs, an
    InvalidArgumentError: a reloaded model refuses the argument's gradient where it is asked."""

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def refused(zero: tf.Tensor) -> Any:
        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            if _tf_internal.saving():
                with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
                    return tf.zeros_like(upstream)
            raise ValueError(message)

        return tf.identity(zero), gradient

    return refused(zero)


def _guard_second_derivatives(plan: Plan, terms: dict[int, list[tf.Tensor]], message: str) -> None:
    """At order 1, where a second derivative could be taken, one more zero term on each output that makes it
    raise ``message`` (``second_derivative_guard``). Not for calls inside a grad_fn: their derivatives are J's
    own."""
    arguments = [plan.arguments.components[i].tensor for i in plan.arguments.differentiable]
    if not arguments or not second_derivative_guard.needed(arguments):
        return
    guard = second_derivative_guard.zero_term(arguments, message)
    for i in plan.outputs.differentiable:
        terms.setdefault(i, []).append(identity.cast(guard, plan.outputs.components[i].tensor.dtype))


def _inside_a_grad_fn(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                      evaluating: nested_calls.Evaluating, how: nested_calls.Call, require_proof: bool) -> Any:
    """A decorated call made while a grad_fn runs: on the upstream at order 1 deferred (its gradient asked when
    needed), else embedded at the order ``inner_order`` gives and kept as one box for the route."""
    if how is nested_calls.Call.DEFERRED:
        return deferred_calls.deferred(f, args, kwargs, evaluating)
    inner = nested_calls.inner_order(f, evaluating)
    return nested_calls.boxed(evaluating, lambda: _embed(f, args, kwargs, inner, require_proof))


def decorate(f: Callable[..., Any], order: int = 1, check_linearity: bool = False) -> Callable[..., Any]:
    """Returns f with its grad_fn embedded as a linear map.

    The contract is documented on the public entry point,
    ``stopgrad_math.custom_gradient``, and the conventions for grad_fn and
    the limits on the TensorFlow page of the docs (``docs/tensorflow.md``).
    The result keeps f's name and docstring; f itself is its ``undecorated``
    attribute.
    """
    arguments_of.check_options(order, check_linearity)

    # A root name scope must start with a letter, digit or '.': '_f' and '<lambda>' would be refused.
    scope = re.sub(r"[^A-Za-z0-9_.]", "_", getattr(f, "__name__", "")).lstrip("_") or "custom_gradient"

    def embedded(status: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _tf_internal.AUTOGRAPH_STATUS.set(status)
        try:
            evaluating = nested_calls.current()
            how = nested_calls.how(f, evaluating, args, kwargs)
            # Inside a grad_fn of order 1, a call on constants is f's value alone, which ends a recursion.
            if how is nested_calls.Call.VALUE:
                return evaluation.call_f(f, args, kwargs)[0]
            with identity.name_scope(scope):
                if value_only_mode.active():
                    return evaluation.value_alone(f, args, kwargs)
                if evaluating is None:
                    return _embed(f, args, kwargs, order, check_linearity)
                return _inside_a_grad_fn(f, args, kwargs, evaluating, how, check_linearity)
        finally:
            _tf_internal.AUTOGRAPH_STATUS.reset(token)

    # AutoGraph never converts the library's code (it cannot, and would warn); f and grad_fn are converted where
    # the caller's code is (``_tf_internal.converted``), so `decorated` passes its status on. tf.custom_gradient
    # converts neither.
    unconverted = tf.autograph.experimental.do_not_convert(embedded)

    @functools.wraps(f)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        if identity.nothing_records():  # eagerly, nothing to record: f's value for the cost of a call of f
            return evaluation.call_f(f, args, kwargs)[0]
        return unconverted(_tf_internal.autograph_status(), args, kwargs)

    del decorated.__wrapped__  # AutoGraph would read f's source through it, and convert f in place of this
    with contextlib.suppress(TypeError, ValueError):  # (a callable without a signature keeps the wrapper's)
        # f's signature, which Keras reads (it passes a layer's call `training` where the call takes it)
        decorated.__signature__ = inspect.signature(f)  # type: ignore[attr-defined]
    if decorated.__name__ == "<lambda>":  # AutoGraph would take the wrapper for a lambda, and not find it
        decorated.__name__ = decorated.__qualname__ = "custom_gradient_of_lambda"
    decorated.undecorated = f  # type: ignore[attr-defined]  # a function attribute, as tf.function's python_function
    return decorated
