"""The order-1 decorator's guard: a second derivative w.r.t. its arguments raises instead of missing a term.

At ``order=1`` the decorator holds grad_fn's Jacobian J constant in x, so a
second derivative misses the term through J's own dependence on x (for
``exp(f(x))`` it gives exp(f)·f′² where the truth is exp(f)·(f′² + f″)).
Where a tape or accumulator could take that derivative, every differentiable
output gets one more zero term, a scalar:

    z = multiply_no_nan(ζ(s, q), 0),   s = 2 + multiply_no_nan(P(sign(u)), 0),   q = 1 + u,   u = −Σ (stop(x) − x)

with ζ the Hurwitz zeta function and P a PreventGradient. The first
derivative walks z → ζ → q → u → x and adds −0.0 to each argument's
gradient (the sign of every gradient is kept): TensorFlow registers no
derivative of ζ w.r.t. s, so nothing flows into s and P is never asked. The
gradient w.r.t. q that this walk builds, −s·ζ(s + 1, q)·0, reads s through a
negation, so a second derivative w.r.t. x walks from it into P, which raises
this module's message. A ForwardAccumulator computes the derivative of every
op as it runs, P's too, which would raise on a first derivative; sign(u) has a
zero derivative, so P gets no tangent. That is also why forward-over-reverse
is not caught: its second derivative is the accumulator's, made of the same
forward derivatives.

The guard is built only where TensorFlow itself says a higher-order gradient
is possible (two tapes, a persistent tape, or a tape and an accumulator
watching an argument; tf.function asks the same to choose its gradient
functions), eagerly and while tracing. It is never built for a graph that
no such tape watches while it is traced: a traced function called under a
persistent tape has its backward pass differentiated for a first
derivative, which would reach P. There the term stays missing (the TensorFlow
page's limit, docs/tensorflow.md).
"""

from __future__ import annotations

import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal, identity

MESSAGE = (
    "stopgrad_math.custom_gradient at order=1 holds grad_fn's Jacobian constant in the arguments, so a second "
    "derivative (a tape over a tape, a persistent tape's gradient of a gradient) would miss the term through "
    "grad_fn's own dependence on them. Decorate with custom_gradient(order=2) for exact second derivatives."
)


def needed(arguments: list[tf.Tensor]) -> bool:
    """Whether a tape or accumulator could take a second derivative w.r.t. these tensors."""
    return _tf_internal.higher_order_gradient_possible(arguments)


def zero_term(arguments: list[tf.Tensor], message: str = MESSAGE) -> tf.Tensor:
    """The guard: +0.0 in float32, first derivative −0.0 w.r.t. each argument, second derivative raising
    ``message``."""
    # u = −Σ c(stop(x) − x): +0.0 reaches the carrier c, which passes it at every element (inf and NaN too),
    # and stop(x) − x negates it: what reaches x is −0.0 everywhere, which no sum changes.
    u = -tf.add_n([tf.reduce_sum(_as_float32(identity.zero_with_slope(x, True))) for x in arguments])
    prevented = tf.raw_ops.PreventGradient(input=tf.math.sign(u), message=message)
    s = 2.0 + identity.multiply_no_nan(prevented, tf.constant(0.0))
    zeta = tf.math.zeta(s, 1.0 + u)
    return identity.multiply_no_nan(zeta, tf.zeros_like(zeta))


def _as_float32(zero: tf.Tensor) -> tf.Tensor:
    """Zeta takes float32 or float64: every argument's zero meets it as a float32 (a complex one's real part)."""
    return identity.cast(tf.math.real(zero) if identity.is_complex(zero.dtype) else zero, tf.float32)
