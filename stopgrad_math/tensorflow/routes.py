"""The decorator's second stage: the route of a call, decided from the ops grad_fn applies to its upstream.

While tracing, the ops are those the probe's grad_fn made
(``evaluation.probe``). In eager mode grad_fn is traced into a graph once per
decorated function and input signature, and the route is kept by that
signature, as ``tf.function`` keeps a trace: later calls trace nothing.
``transposition`` reads the ops and chooses; where grad_fn cannot be traced
(it reads tensor values in Python), ``numerical_linearity`` decides from tests
on random upstreams instead. Whether J can be read off grad_fn(1) or unit
upstreams depends on y's size, the dtypes and a replica context, decided here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import tensorflow as tf

from stopgrad_math.shared import bounded_cache, function_identity
from stopgrad_math.tensorflow import identity, numerical_linearity, transposition
from stopgrad_math.tensorflow.evaluation import Plan, Probe
from stopgrad_math.tensorflow.gradient_components import Component

# Eager mode: the route per decorated function (``function_identity``) and input signature.
ROUTES_KEPT = 1024
_ROUTES: bounded_cache.BoundedCache[Chosen] = bounded_cache.BoundedCache(ROUTES_KEPT)

_UNTRACEABLE = (
    "grad_fn cannot be traced into a graph (it reads tensor values in Python), "
    "so its linearity cannot be proven from its ops, and check_linearity=True asks for that proof."
)


@dataclasses.dataclass(frozen=True)
class Chosen:
    """A call's route, and for ``Route.REVERSE_ONLY`` why J·v cannot be read off grad_fn (forward mode's
    refusal)."""

    route: transposition.Route
    opaque: str = ""
    # Eagerly: whether grad_fn's ops were read (not tested numerically), and what its trace refused (a wrong
    # gradient for an argument a tape or an accumulator watches), raised at every call of the signature.
    traced: bool = False
    refused: tuple[str, ...] = ()


def route(plan: Plan, probe: Probe | None, kwargs: dict[str, Any], require_proof: bool) -> Chosen:
    """The route for this call: from the ops of the probe while tracing; in eager mode from a trace of grad_fn
    made once per function and input signature (or, where grad_fn cannot be traced, from numerical tests)."""
    one, small = one_element(plan), _small(plan)
    if probe is not None:
        return _chosen(probe.findings(plan), one, small)
    key = _eager_signature(plan, kwargs, require_proof)
    chosen = _ROUTES.get(key) if key is not None else None
    if chosen is None:
        found = _traced_findings(plan)
        if found is None:
            if require_proof:
                raise ValueError(_UNTRACEABLE)
            chosen = Chosen(numerical_linearity.tested_route(plan, one, small))
        else:
            refused = tuple(plan.refused.values())  # what the trace, a graph, kept to refuse where asked
            plan.refused.clear()
            chosen = dataclasses.replace(_chosen(found, one, small), traced=True, refused=refused)
        if key is not None:
            _ROUTES.put(key, chosen)
    return chosen


def _chosen(found: list[transposition.Finding], one: bool, small: bool) -> Chosen:
    chosen = transposition.choose_route(found, one, small)
    reverse_only = chosen is transposition.Route.REVERSE_ONLY
    return Chosen(chosen, transposition.opaque_reason(found) if reverse_only else "")


def _traced_findings(plan: Plan) -> list[transposition.Finding] | None:
    """Eager mode: grad_fn traced into a graph on upstreams of y's shapes, its ops read; None where it cannot be.
    In a replica context every replica traces it on its first call, so a collective in it meets the others'."""
    outputs = plan.outputs.components
    specs = [tf.TensorSpec(outputs[i].tensor.shape, outputs[i].tensor.dtype) for i in plan.outputs.differentiable]

    watch = not one_element(plan)  # as the probe watches them while tracing

    def call(upstreams: list[tf.Tensor]) -> tuple[list[tf.Tensor], list[transposition.Box]]:
        plan.boxes.clear()
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(upstreams if watch else [])
            gradients = plan.gradients_at(dict(zip(plan.outputs.differentiable, upstreams, strict=True)))
        return [g.values for g in gradients], list(plan.boxes)

    return transposition.trace(call, specs)


def one_element(plan: Plan) -> bool:
    """Whether J is grad_fn(1): y's only differentiable output is a dense tensor of one element known while
    tracing, grad_fn(1) is J for its dtypes, and no replica context maps other replicas' upstreams."""
    differentiable = plan.outputs.differentiable
    if len(differentiable) != 1:
        return False
    output = plan.outputs.components[differentiable[0]]
    if not (isinstance(output.value, tf.Tensor) and output.value.shape.num_elements() == 1):
        return False
    return _real_or_all_complex(plan, differentiable[0]) and not transposition.replicated()


def _small(plan: Plan) -> bool:
    """Whether J can be built from unit upstreams: a few output elements known while tracing, dense gradients
    of a real function or of a complex one with complex arguments (J is then conj(grad_fn(e_k)))."""
    outputs = [plan.outputs.components[i] for i in plan.outputs.differentiable]
    sizes = [c.value.shape.num_elements() if isinstance(c.value, tf.Tensor) else None for c in outputs]
    known = [n for n in sizes if n is not None]
    if len(known) < len(sizes) or sum(known) > transposition.SMALL_Y or transposition.replicated():
        return False
    return all(_real_or_all_complex(plan, i) for i in plan.outputs.differentiable)


def _real_or_all_complex(plan: Plan, index: int) -> bool:
    """Whether grad_fn(1) is J: a complex y, or real arguments (a real y has no complex derivative)."""
    if identity.is_complex(plan.outputs.components[index].tensor.dtype):
        return True
    components = [plan.arguments.components[i] for i in plan.arguments.differentiable] + plan.variables
    return not any(identity.is_complex(c.dtype) for c in components)


def _eager_signature(plan: Plan, kwargs: dict[str, Any], require_proof: bool) -> Hashable | None:
    """In eager mode, what the route is kept by: the function (``function_identity``), the options, whether in a
    replica context, and what tf.function would key a trace of this call by (the shapes and dtypes of the
    tensors and the constant arguments). None where keyword arguments or an unhashable constant leave it
    unknown."""
    if kwargs:
        return None
    specs = tuple(_spec(c) for c in plan.arguments.components + plan.outputs.components)
    # (the arguments no tape watches too: a wrong gradient grad_fn gives for a watched one is refused by the trace)
    key = function_identity.key(plan.f), plan.order, require_proof, transposition.replicated(), plan.unasked, specs
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
