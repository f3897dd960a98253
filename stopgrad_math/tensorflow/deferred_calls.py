"""A decorated call on the upstream inside a grad_fn of order 1: TensorFlow's custom gradient, asked when needed.

The decorator calls grad_fn when f is called, so a decorated call inside a
grad_fn is made then too. Embedding it would call its own grad_fn at once,
and grad_fns that call each other on the upstream (a psum whose gradient is
a broadcast whose gradient is a psum) would never end. At order 1 nothing
needs that call's derivative but the transpose of the grad_fn that makes
it, and the first derivative of J·v built from it: both are reverse- or
forward-mode products of a linear map, which TensorFlow's own custom
gradient gives when it is asked, as ``tf.custom_gradient`` gives them to
TFP:

  reverse mode      the call's grad_fn on the cotangent, called when the
                    backward pass reaches it (decorated calls on its
                    upstream there are deferred again, so the chain ends
                    where the derivatives asked for end)
  forward mode      autodiff of f's own ops (TensorFlow's rule for a
                    custom gradient), equal to the product with J where f
                    is linear in that argument

While tracing, the call is kept as a deferred ``transposition.Box``: the
route reads f's own ops on the upstream, which must be linear for the
calling grad_fn to be, and passes the upstream through the custom gradient
op itself. Variables and ragged or sparse values are embedded as before
(``nested_calls``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared.grad_fn_signature import signature
from stopgrad_math.tensorflow import evaluation, gradient_components, nested_calls, transposition
from stopgrad_math.tensorflow.evaluation import Plan
from stopgrad_math.tensorflow.gradient_components import Flattened


def deferred(f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             evaluating: nested_calls.Evaluating) -> Any:
    """f's value, with a custom gradient that calls f's grad_fn when a derivative is asked (module docstring)."""
    args, kwargs = arguments_of.positional(f, args, kwargs)
    arguments = Flattened.of(list(args), "args")
    index = arguments.differentiable
    made: list[Flattened] = []  # the outputs, as f returned them

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def call(*tensors: tf.Tensor) -> tuple[list[tf.Tensor], Callable[..., Any]]:
        y, grad_fn = evaluation.call_f(f, tuple(arguments.with_tensors(dict(zip(index, tensors, strict=True)))),
                                       kwargs)
        outputs = evaluation.outputs_of(y)
        made.append(outputs)

        def gradients(*upstreams: tf.Tensor | None, variables: list[tf.Variable] | None = None) -> Any:
            takes_variables = variables is not None and signature(grad_fn).takes_variables
            read = [gradient_components.of(v.name, v) for v in variables or []] if takes_variables else []
            plan = Plan(f, outputs, grad_fn, arguments, read, order=1, deferred=True)
            found = {g.component.name: g for g in plan.gradients_at(dense_upstreams(outputs, upstreams))}
            of_arguments = [_tensor(found.get(arguments.components[i].name)) for i in index]
            if variables is None:
                return of_arguments
            if not takes_variables:  # a derivative of J·v, linear in a vector that is zero: none w.r.t. variables
                return of_arguments, [None] * len(variables)
            return of_arguments, [_tensor(found.get(c.name)) for c in read]

        return [outputs.components[i].tensor for i in outputs.differentiable], gradients

    results = call(*[arguments.components[i].tensor for i in index])
    outputs = made[-1]
    if results and not tf.executing_eagerly():
        evaluating.boxes.append(transposition.Box(frozenset({results[0].op}), deferred=True))
    return outputs.with_tensors(dict(zip(outputs.differentiable, results, strict=True)))


def dense_upstreams(outputs: Flattened, upstreams: tuple[tf.Tensor | None, ...]) -> dict[int, tf.Tensor]:
    """The upstream of each differentiable output, by index, a None (an output that reaches nothing) as zeros.

    TensorFlow fills zeros itself for a floating output that reaches nothing, in every mode tested (eager,
    tf.function, XLA, TF1 graphs, tape.jacobian with and without pfor, forward mode); a None is read as the
    zero it stands for wherever one is passed."""
    return {i: tf.zeros_like(outputs.components[i].tensor) if u is None else u
            for i, u in zip(outputs.differentiable, upstreams, strict=True)}


def _tensor(gradient: Any) -> Any:
    """A checked gradient as TensorFlow takes it back: dense, tf.IndexedSlices, or None."""
    if gradient is None or gradient.indices is None:
        return None if gradient is None else gradient.values
    return tf.IndexedSlices(gradient.values, gradient.indices, tf.shape(gradient.component.unread, tf.int64))
