"""custom_gradient(fx, gx, x): tfp's signature, exact for every output shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math.shared import arguments
from stopgrad_math.tensorflow import (
    _tf_internal,
    decorator_form,
    gradient_layout,
    identity,
    shape_checks,
    value_only_mode,
)

# (label, layout choice, gx, x) for one argument; gx and x are tensors or variables.
_Planned = tuple[str, gradient_layout.Choice, Any, Any]


def _require_inexact(dtype: tf.DType, what: str, fx_dtype: tf.DType, label: str = "") -> None:
    """fx, x and gx are floating or complex; a real fx takes only real x and gx. ``what`` names the value,
    with ``{}`` for the argument's ``label`` (formatted only for an error)."""
    if dtype is fx_dtype and identity.is_inexact(dtype):  # the common case, in one test (dtypes are interned)
        return
    what = what.format(label)
    if not identity.is_inexact(dtype):
        raise TypeError(
            f"custom_gradient needs a floating or complex {what} (float16, bfloat16, float32, float64, "
            f"complex64 or complex128); got {dtype.name}."
        )
    if identity.is_complex(dtype) and not identity.is_complex(fx_dtype):
        raise TypeError(
            f"custom_gradient got a complex {what} for a real fx ({fx_dtype.name}): a complex derivative "
            "needs a complex fx."
        )


def _tensor_like(value: Any, what: str, dtype_hint: tf.DType | None = None) -> tf.Tensor | tf.Variable:
    """A tensor, or a variable as it is (read only if the identity is built)."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    return identity.to_tensor(value, f"custom_gradient's {what}", dtype_hint)


def _pairs(gx: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """Returns (name, gx leaf, x leaf) for each leaf of x; x's structure names them."""
    if not tf.nest.is_nested(x):
        return [("x", gx, x)]
    x_paths = _tf_internal.flatten_with_joined_string_paths(x)
    gx_paths = _tf_internal.flatten_with_joined_string_paths(gx) if tf.nest.is_nested(gx) else []
    # Same paths means the same structure, a list and a tuple being alike.
    if [path for path, _ in x_paths] != [path for path, _ in gx_paths]:
        raise ValueError(f"gx must have the structure of x.\n  x:  {x}\n  gx: {gx}")
    return [(f"x[{path}]", g, leaf) for (path, leaf), (_, g) in zip(x_paths, gx_paths, strict=True)]


def custom_gradient(
    fx: Any = None,
    gx: Any = None,
    x: Any = None,
    fx_gx_manually_stopped: bool = False,
    name: str | None = None,
    *,
    order: int = 1,
    check_linearity: bool = False,
) -> tf.Tensor | Callable[..., Any]:
    """Embeds a known gradient: ``custom_gradient(fx, gx, x)`` or ``@custom_gradient``.

    **Identity form**, tfp's signature: a Tensor with the value of ``fx``
    bit for bit and the derivative ``gx`` with respect to ``x`` (a tensor,
    variable or nested structure; ``gx`` has its structure). The shape of
    each gx says what it holds: ``fx.shape + x.shape`` is the Jacobian; a gx
    that broadcasts with x to ``fx.shape`` is elementwise; for a one-element
    fx it is the gradient; otherwise, as in tfp, the gradient of ``sum(fx)``.

    **Decorator form**, a drop-in for ``tf.custom_gradient``: ``f(*args)``
    returns ``(y, grad_fn)``, and the decorated f has the value y and
    grad_fn's derivative, in reverse and forward mode. grad_fn must be
    linear in its upstream, which is proven from its ops (a ValueError names
    any other); ``order=2`` makes second derivatives exact.

    Every argument, error and limit: [custom_gradient in full](custom_gradient.md).

    Args:
      fx: the value f(x); or, alone, the function to decorate.
      gx: the derivative of f at x (None: no gradient for that leaf).
      x: what the derivative is with respect to.
      fx_gx_manually_stopped: fx and gx are used as given, unstopped.
      name: name scope for the ops.
      order: decorator form: 2 for exact second derivatives.
      check_linearity: decorator form: refuse a grad_fn that cannot be traced.

    Returns:
      fx with derivative gx; or the decorated function.

    Examples:
        >>> @custom_gradient
        ... def log1pexp(x):
        ...   e = tf.exp(x)
        ...   return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))
        >>> x = tf.constant(100.0)
        >>> with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)) as acc:
        ...   y = log1pexp(x)   # tf.custom_gradient gives NaN here
        >>> float(acc.jvp(y))
        1.0
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)
        >>> float(tape.gradient(y, x))
        1.0
    """
    decorated = arguments.decorator_form(fx, gx, x, order, check_linearity, decorator_form.decorate)
    if decorated is not None:
        return decorated
    with identity.name_scope(name or "custom_gradient"):
        fx = _tensor_like(fx, "fx")
        fx = fx if isinstance(fx, tf.Tensor) else tf.convert_to_tensor(fx, name="fx")
        _require_inexact(fx.dtype, "fx", fx.dtype)
        planned = [_planned(fx, label, g, x_leaf) for label, g, x_leaf in _pairs(gx, x) if g is not None]
        if identity.nothing_records():
            return fx
        if value_only_mode.active():
            return value_only_mode.undifferentiable(fx, [x_leaf for *_, x_leaf in planned])
        return _embed(fx, planned, fx_gx_manually_stopped)


def _planned(fx: tf.Tensor, label: str, g: Any, x: Any) -> _Planned:
    """(label, layout choice, g, x) for one argument, converted and checked against fx."""
    dtype = fx.dtype
    x = _tensor_like(x, label)
    g = g if isinstance(g, tf.Tensor) else _tensor_like(g, f"the gradient for {label}", dtype_hint=dtype)
    _require_inexact(x.dtype, "{}", dtype, label)
    _require_inexact(g.dtype, "gradient for {}", dtype, label)
    shape = _tf_internal.shape_tuple
    return label, gradient_layout.candidates(label, shape(fx), shape(x), shape(g)), g, x


def numeric_scale(scale: tf.Tensor | tf.Variable, function: str) -> tf.Tensor | tf.Variable:
    """``scale`` where it is floating or integer; TypeError naming ``function``'s scale otherwise."""
    if not (identity.is_floating(scale.dtype) or scale.dtype.is_integer):
        raise TypeError(f"{function}'s scale must be a floating or integer tensor; got {scale.dtype.name}.")
    return scale


def scaled_identity(x: tf.Tensor | tf.Variable, scale: Any) -> tf.Tensor:
    """Value x exactly, derivative ``scale`` broadcast against x (never read as a Jacobian).

    scale may be floating or integer (an integer scale is exact in x's dtype).
    """
    x = identity.inexact_tensor(x, "scale_gradient's x")
    scale = numeric_scale(_tensor_like(scale, "scale", dtype_hint=x.dtype), "scale_gradient")
    scale = shape_checks.broadcast_checked(scale, x, "scale", "x")
    if identity.nothing_records():
        return x
    if value_only_mode.active():
        return value_only_mode.undifferentiable(x, [x])
    scale, x_stop = identity.stop_each([identity.cast(scale, x.dtype), x])
    return identity.attach(x_stop, [identity.negative_zero_term(scale, x, x.dtype, x_stop)])


def _embed(fx: tf.Tensor, planned: list[_Planned], manually_stopped: bool) -> tf.Tensor:
    xs = [x if isinstance(x, tf.Tensor) else tf.convert_to_tensor(x) for *_, x in planned]
    gs = [identity.cast(g, fx.dtype) for _, _, g, _ in planned]
    if manually_stopped:
        x_stops = identity.stop_each(xs)
    else:
        fx, *rest = identity.stop_each([fx, *gs, *xs])
        gs, x_stops = rest[: len(gs)], rest[len(gs) :]
    terms = [gradient_layout.zero_term(label, choice, fx, x, g, x_stop)
             for (label, choice, *_), x, g, x_stop in zip(planned, xs, gs, x_stops, strict=True)]
    return identity.attach(fx, terms)
