"""Checks that a grad_fn is linear in the upstream gradient, and the route of one that cannot be traced.

Any stop-gradient identity makes the backward pass linear in the upstream
gradient: h's derivative is a fixed linear map J, and J·v is read off grad_fn
by differentiating it at d = 0. A grad_fn that is not linear (gradient
clipping, normalization) cannot be expressed: J·v would silently be its
linearization at zero. These checks catch that: the cheap ones always, where
the values are known while tracing (in eager mode a one-element y's grad_fn(0)
once per input signature, as a trace would be), the superposition test on
request. Where grad_fn cannot be traced into a graph (it reads tensor values
in Python), its ops cannot be read, and ``tested_route`` decides the route
from numerical evidence instead: a sample, not a proof.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from stopgrad_math.shared import tolerances
from stopgrad_math.tensorflow import _tf_internal, evaluation, identity, transposition
from stopgrad_math.tensorflow.evaluation import Plan, Probe, Untransposable

_NOT_LINEAR = (
    "a custom gradient must be linear in the upstream gradient (clipping or normalizing "
    "the gradient cannot be expressed by a stop-gradient identity)"
)


def check_at_zero(gradients: Sequence[tf.Tensor], names: Sequence[str]) -> None:
    """Raises ValueError where grad_fn(0) is known and finite but not zero."""
    for gradient, name in zip(gradients, names, strict=True):
        value = tf.get_static_value(gradient)
        if value is not None and np.any(np.isfinite(value) & (value != 0)):
            raise ValueError(f"grad_fn(0) is not zero for {name}: {_NOT_LINEAR}.")


def random_like(t: tf.Tensor, seed: list[int]) -> tf.Tensor:
    part = t.dtype.real_dtype
    draw = tf.random.stateless_normal(tf.shape(t), seed, dtype=part)
    if not t.dtype.is_complex:
        return draw
    return tf.complex(draw, tf.random.stateless_normal(tf.shape(t), [seed[0], seed[1] + 7], dtype=part))


def check_superposition(
    call: Callable[[dict[int, tf.Tensor]], list[tf.Tensor]], upstreams: dict[int, tf.Tensor], seed: int = 0
) -> None:
    """Raises if call(a·d1 + d2) differs from a·call(d1) + call(d2) for random d1, d2.

    ``call`` maps upstream gradients (one tensor per output that has one,
    keyed as ``upstreams``) to a list of gradients. In eager mode the check
    raises at once; in a graph it runs with the graph
    (tf.errors.InvalidArgumentError).
    """
    d1, d2 = ({i: random_like(d, [seed, k]) for i, d in upstreams.items()} for k in (1, 2))
    a = 1.7
    mixed = {i: a * d1[i] + d2[i] for i in upstreams}
    for lhs, g1, g2 in zip(call(mixed), call(d1), call(d2), strict=True):
        rhs = a * g1 + g2
        # An infinite derivative makes both sides ±inf or NaN there (inf − inf): compare where both are finite.
        finite = identity.is_finite(lhs) & identity.is_finite(rhs)
        lhs, rhs = tf.where(finite, lhs, tf.zeros_like(lhs)), tf.where(finite, rhs, tf.zeros_like(rhs))
        rtol = tolerances.rtol(lhs.dtype, "superposition")
        scale = tf.reduce_max(tf.abs(tf.concat([tf.reshape(rhs, [-1]), tf.zeros([1], rhs.dtype)], 0)))
        atol = rtol * scale
        tf.debugging.assert_near(lhs, rhs, rtol=rtol, atol=atol, message=f"grad_fn is not linear: {_NOT_LINEAR}")


def tested_route(plan: Plan, one_element: bool, small: bool) -> transposition.Route:
    """Where grad_fn cannot be traced: grad_fn(0) = 0, superposition on random upstreams, and for the transpose
    a dot-product test; unit upstreams where the transpose fails and y is ``small``."""
    outputs = plan.outputs.components
    check_superposition(lambda ups: [g.values for g in plan.gradients_at(ups)],
                        {i: tf.zeros_like(outputs[i].tensor) for i in plan.outputs.differentiable})
    if one_element:
        return transposition.Route.ONE_ELEMENT
    probe = evaluation.probe(plan, persistent=True)
    check_at_zero([g.values for g in probe.gradients], [g.name for g in probe.gradients])
    try:
        (_transpose_of_transpose_test if transposition.replicated() else _dot_product_test)(plan, probe)
    except Untransposable as reason:
        if not small:
            raise ValueError(transposition.OPAQUE_MESSAGE.format(reason=reason)) from None
        return transposition.Route.UNIT_UPSTREAMS
    return transposition.Route.TRANSPOSE


def _dot_product_test(plan: Plan, probe: Probe) -> None:
    """⟨T(a), b⟩ = ⟨a, grad_fn(b)⟩ for random a, b, T the tape's transpose; else Untransposable."""
    connected = probe.connected
    a = [random_like(g.values, [1, k]) for k, g in enumerate(connected)]
    b = _random_upstreams(probe)
    with _tf_internal.stop_recording():  # numbers to compare, nothing for the caller's tapes to keep
        transposed = probe.transposed(connected, a)
    direct = _grad_fn_at(plan, probe, b)
    pairs_t = [(t, b_i) for t, b_i in zip(transposed, b.values(), strict=True) if t is not None]
    pairs_d = [(a_g, direct[g.name]) for a_g, g in zip(a, connected, strict=True)]
    mismatch = transposition.dot_product_mismatch(pairs_t, pairs_d, _dtype(plan))
    if mismatch is not None:
        raise Untransposable(mismatch)


def _random_upstreams(probe: Probe) -> dict[int, tf.Tensor]:
    return {i: random_like(w, [2, k]) for k, (i, w) in enumerate(probe.upstreams.items())}


def _grad_fn_at(plan: Plan, probe: Probe, upstreams: dict[int, tf.Tensor]) -> dict[str, tf.Tensor]:
    """grad_fn on ``upstreams``, by component; Untransposable where a part no tape records is not zero."""
    # Not under stop_recording, which would stop the tapes grad_fn makes itself (a nested derivative).
    direct = {g.name: g.values for g in plan.gradients_at(upstreams)}
    if any(np.any(np.asarray(direct[g.name]) != 0) for g in probe.gradients if g not in probe.connected):
        raise Untransposable("grad_fn computes part of its result where no tape records it")
    return direct


def _dtype(plan: Plan) -> tf.DType:
    return plan.outputs.components[plan.outputs.differentiable[0]].tensor.dtype


def _transpose_of_transpose_test(plan: Plan, probe: Probe) -> None:
    """In a replica context: T'(b) = grad_fn(b) for a random b, T' the tape's transpose of T, T the tape's
    transpose of grad_fn; else Untransposable. Each replica compares its own vectors.

    What the route needs is that a backward pass through J·v = T(v) gives grad_fn: that T' is grad_fn. The
    dot-product test is that condition for one inner product over every replica's values, which declared
    gradients need not follow: TFP's reduce-without-broadcast psum counts its result once, not once per
    replica, and its declared gradient is the identity.
    """
    connected = probe.connected
    a = [tf.zeros_like(g.values) for g in connected]  # T is linear: T' is the same at any a
    b = _random_upstreams(probe)
    with tf.GradientTape() as tape:
        tape.watch(a)
        transposed = probe.transposed(connected, a)
    pairs = [(t, b_i) for t, b_i in zip(transposed, b.values(), strict=True) if t is not None]
    back = tape.gradient([t for t, _ in pairs], a, output_gradients=[b_i for _, b_i in pairs]) if pairs else a
    direct = _grad_fn_at(plan, probe, b)
    rtol = tolerances.rtol(_dtype(plan), "transpose")
    for g, got in zip(connected, back, strict=True):
        want = np.asarray(direct[g.name])
        got = np.zeros_like(want) if got is None else np.asarray(got)
        if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
            raise Untransposable("its values are not finite at the sample, so the transpose's transpose compares "
                                 "nothing")
        scale = max(float(np.max(np.abs(want), initial=0.0)), np.finfo(np.float64).tiny)
        if np.max(np.abs(got - want), initial=0.0) > rtol * scale:
            raise Untransposable("the tape sees only part of it (the transpose of its transpose is not grad_fn)")
