"""The ``order=2`` zero term: grad_fn as a recorded backward, the order-1 term's tangent as its forward.

At ``order=2`` f runs on its arguments as they are, so the tensors grad_fn
reads (f's intermediates c) depend on x, and y is stopped. Each
differentiable output gets one more tensor z, −0.0 everywhere, and

    h = stop(y) + z,    reverse:  z̄ ↦ grad_fn(z̄)    forward:  ẋ ↦ J(c)·ẋ

``y + (−0.0)`` is y bit for bit (−0.0 and NaN included). The backward is
recorded on every tape (and, in a graph, registered for ``tf.gradients``),
so a first derivative is ``grad_fn(ȳ)`` itself, as ``tf.custom_gradient``
gives it, and a tape over that tape differentiates grad_fn's ops through c:
the second derivative is the Jacobian of the declared gradient, not
symmetrized. The forward function is the order-1 term's tangent (the route's
``J·v`` differentiated at ``v̇ = −ẋ``) computed with c held, because c was made
before the accumulator that computes it: no derivative of grad_fn's own
reaches a first derivative, in either mode, and an outer tape or accumulator
sees the ops and differentiates them through c (reverse-over-forward and
forward-over-forward are exact too). grad_fn's derivative enters second
derivatives only.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal, identity
from stopgrad_math.tensorflow.evaluation import Plan
from stopgrad_math.tensorflow.grad_fn_conventions import Gradient

Terms = dict[int, list[tf.Tensor]]

_REGISTERED = itertools.count()  # a graph's backward is registered by a fresh name per traced call


def attached(plan: Plan, order_1_terms: Callable[[dict[str, tf.Tensor]], Terms],
             gradients_at: Callable[[dict[int, tf.Tensor]], list[Gradient]] | None = None) -> Any:
    """f's value with the recorded term on each differentiable output. ``order_1_terms(ẋ)`` gives the tangents
    of the order-1 terms at the tangents ẋ (by component name): the forward function, called only where an
    accumulator asks. ``gradients_at``: the backward's grad_fn(upstreams), by default ``plan.gradients_at``."""
    outputs = [plan.outputs.components[i] for i in plan.outputs.differentiable]
    arguments = [plan.arguments.components[i] for i in plan.arguments.differentiable] + plan.variables
    inputs = [c.tensor for c in arguments]
    zeros = [_negative_zeros(c.tensor) for c in outputs]

    def backward(*upstreams: tf.Tensor | None) -> list[Any]:
        dense = {i: tf.zeros_like(zeros[k]) if u is None else u
                 for k, (i, u) in enumerate(zip(plan.outputs.differentiable, upstreams, strict=True))}
        return by_input((gradients_at or plan.gradients_at)(dense), arguments)

    def forward(*tangents: tf.Tensor | None) -> list[tf.Tensor]:
        moving = {c.name: tf.zeros_like(x) if t is None else t for c, x, t in zip(arguments, inputs, tangents,
                                                                                   strict=True)}
        terms = order_1_terms(moving)  # −J·ẋ each, the tangents of the order-1 terms that h subtracts
        return [identity.attach(tf.zeros_like(z), terms.get(i, [])) for z, i in
                zip(zeros, plan.outputs.differentiable, strict=True)]

    zeros = recorded("stopgrad_math_order_2", zeros, inputs, backward, forward)
    summed = {i: tf.raw_ops.AddV2(x=c.tensor, y=z) for i, c, z in
              zip(plan.outputs.differentiable, outputs, zeros, strict=True)}
    return plan.outputs.with_tensors(summed)


def grad_fn_recorded(plan: Plan) -> Any:
    """Eagerly, where one tape alone can ask a derivative (``decorator_form``'s reverse path): f's value, each
    differentiable output passed through an Identity recorded with grad_fn as its backward, as
    tf.custom_gradient records it, but for two negations: the backward is −grad_fn(−ȳ), the order-1 terms' own
    reverse mode (h subtracts J·v, and v = stop(x) − x), whose bits differ from grad_fn(ȳ)'s in the sign of a
    NaN that J makes and of a zero that a sum of opposite zeros makes (a complex product's parts). No
    accumulator watches, so none asks for a forward function."""
    outputs = plan.outputs.differentiable
    arguments = [plan.arguments.components[i] for i in plan.arguments.differentiable]
    passed = [tf.identity(plan.outputs.components[i].tensor) for i in outputs]  # the same bits, a new tensor

    def backward(*upstreams: tf.Tensor | None) -> list[Any]:
        negated = {i: tf.zeros_like(p) if u is None else -u for i, p, u in zip(outputs, passed, upstreams,
                                                                              strict=True)}
        gradients = plan.gradients_at(negated)
        return by_input([dataclasses.replace(g, values=-g.values) for g in gradients], arguments)

    _tf_internal.record_operation("stopgrad_math_reverse", passed, [c.tensor for c in arguments], backward)
    return plan.outputs.with_tensors(dict(zip(outputs, passed, strict=True)))


def recorded(name: str, zeros: list[tf.Tensor], inputs: list[tf.Tensor], backward: Callable[..., list[Any]],
             forward: Callable[..., list[tf.Tensor]]) -> list[tf.Tensor]:
    """``zeros`` as the outputs of an op of ``inputs`` recorded on every tape and accumulator, with these backward
    and forward functions (and, in a graph, registered for ``tf.gradients``)."""
    if not tf.executing_eagerly():  # tf.gradients, and a traced function's gradient, read a registered op
        zeros = _registered(zeros, inputs, backward)
    _tf_internal.record_operation(name, zeros, inputs, backward, forward)
    return zeros


def _negative_zeros(y: tf.Tensor) -> tf.Tensor:
    """−0.0 in y's shape and dtype (both parts of a complex one): y + (−0.0) is y for every y, −0.0 and NaN too."""
    # From a NumPy array, never a Python float: TensorFlow's eager cache of converted Python scalars keys −0.0
    # and 0.0 alike, so tf.constant(-0.0) is +0.0 after a user's tf.constant(0.0), and turns every later
    # tf.constant(0.0) of the user's into −0.0 (1 / it then −inf).
    negative_zero = complex(-0.0, -0.0) if identity.is_complex(y.dtype) else -0.0
    return tf.fill(tf.shape(y), tf.constant(np.array(negative_zero, y.dtype.as_numpy_dtype)))


def by_input(gradients: list[Gradient], arguments: list[Any]) -> list[Any]:
    """grad_fn's gradients in the order of the recorded inputs: None where it gave none, tf.IndexedSlices where
    it gave rows."""
    by_name = {g.name: g for g in gradients}
    result: list[Any] = []
    for component in arguments:
        g = by_name.get(component.name)
        if g is None or g.indices is None:
            result.append(None if g is None else g.values)
        else:
            result.append(tf.IndexedSlices(g.values, g.indices, tf.shape(component.tensor, out_type=g.indices.dtype)))
    return result


def _registered(zeros: list[tf.Tensor], inputs: list[tf.Tensor], backward: Callable[..., list[Any]]
                ) -> list[tf.Tensor]:
    """The zeros passed through an IdentityN whose gradient is ``backward``, as tf.custom_gradient does in a
    graph: a symbolic gradient reads the registry, not the tapes."""
    name = f"StopgradMathRecorded_{next(_REGISTERED)}"

    def gradient(_: tf.Operation, *upstreams: tf.Tensor) -> list[Any]:
        return [None] * len(zeros) + backward(*upstreams[:len(zeros)])

    tf.RegisterGradient(name)(gradient)
    # Unrecorded: an accumulator would give the zeros IdentityN's tangent (zero), which the recorded forward
    # function could not replace; the tapes and accumulators get the recorded op alone.
    with tf.compat.v1.get_default_graph().gradient_override_map({"IdentityN": name}), _tf_internal.stop_recording():
        passed = tf.raw_ops.IdentityN(input=zeros + inputs)
    return list(passed[:len(zeros)])
