"""custom_gradient(fx, gx, x): tfp's signature, exact for every output shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math import _tf_internal, decorator, gradient_layout, identity, inference, shape_checks

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


def _require_both(gx: Any, x: Any) -> None:
    if x is None or gx is None:
        raise TypeError(
            "custom_gradient takes a function, as @custom_gradient or custom_gradient(f) (the decorator form), "
            "or fx, gx and x, as custom_gradient(fx, gx, x) (the identity form); got fx "
            f"{'without gx and x' if x is None and gx is None else 'without gx' if gx is None else 'without x'}. "
            "For a value with no gradient at all, use stop_gradient(fx)."
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

    Two forms, one stop-gradient identity underneath. This is what a call
    needs; the README, the front page of this reference, has the rest: *What
    gx means*, *The decorator form* (linearity, higher order, what a grad_fn
    may contain) and *How it stays exact*.

    **Identity form** (``custom_gradient(fx, gx, x)``, tfp's signature): a
    Tensor with the value of ``fx`` bit for bit (−0.0, inf and NaN included)
    and the derivative ``gx`` with respect to ``x``:

        h = stop(fx) − Σ multiply_no_nan(stop(gx), stop(x) − x)

    The shape of each gx says what it holds, the first that fits:
    ``fx.shape + x.shape``, the full Jacobian; ``gx * x`` broadcasting to
    exactly ``fx.shape``, elementwise; a one-element ``fx`` with gx
    broadcasting to ``x.shape``, its gradient; otherwise tfp's rule, gx is
    the gradient of ``reduce_sum(h)``. Anything else raises ValueError while
    tracing; shapes unknown while tracing are decided at run time by the
    same rules. Complex values follow TensorFlow's convention (the gradient
    is conj(gx)·upstream). A zero upstream gives a zero gradient even where
    gx is inf; an element of x that is inf or NaN keeps the value and gets
    no gradient.

    **Decorator form** (``@custom_gradient``, ``@custom_gradient(order=2)``):
    a drop-in for ``tf.custom_gradient`` and keras ``ops.custom_gradient``.
    ``f(*args, **kwargs)`` returns ``(y, grad_fn)``, grad_fn a vector-Jacobian
    product in TensorFlow's, JAX's, Keras's or torch's signature (optionally
    taking ``variables``). It is embedded as the linear map J it is the
    transpose of, so the value is y bit for bit and the derivative exact for
    any function, in reverse and forward mode:

        h = y − (J·v − stop(J·v)),  v = stop(x) − x,  J·v = ∂/∂d ⟨grad_fn(d), v⟩ at d = 0

    grad_fn must be linear in the upstream: its ops are read (while tracing;
    eagerly from a trace at the first call with each input signature) and
    classified by one table, and a non-linear op raises ValueError naming
    it. Where y has one element J is grad_fn(1); where an op's gradient is
    not its transpose, a y of at most 16 elements gets J from grad_fn on
    unit upstreams, and a larger one raises ValueError. grad_fn runs when f
    is called and may call decorated functions, f itself included.
    Arguments may be tensors, variables of any kind, ragged and sparse
    tensors, in nested structures; other values are passed to f as they
    are, and with nothing differentiable y is returned without a call of
    grad_fn. Second derivatives need ``order=2``.

    In eager mode with no tape or accumulator active, the value is returned
    as it is.

    Args:
      fx: floating or complex Tensor, the value f(x); or, alone, the
        function to decorate.
      gx: the derivative of f at x, with the structure of ``x``; a leaf may
        be None for an argument that gets no gradient. Converted to fx's
        dtype.
      x: a floating or complex Tensor or tf.Variable, or any nested
        structure of them. May differ from fx in precision.
      fx_gx_manually_stopped: if True, fx and gx are not wrapped in
        stop_gradient (tfp's partial custom gradient).
      name: name scope for the ops.
      order: decorator form only: 1, or 2 for exact second derivatives.
      check_linearity: decorator form only: refuse a grad_fn whose linearity
        cannot be proven from its ops (one that cannot be traced), rather
        than test it numerically.

    Returns:
      A Tensor equal to ``fx`` whose derivative w.r.t. ``x`` is ``gx``; in the
      decorator form, the decorated function (or a decorator, when called
      with keyword arguments only).

    Raises:
      TypeError: fx, x or gx is not floating or complex, or complex for a
        real fx; fx is given without gx and x (neither form); f does not
        return (y, grad_fn).
      ValueError: the structure or a shape of gx does not fit x and fx;
        grad_fn returns the wrong number, shape or dtype of gradients, or is
        detectably not linear.

    Examples:
        The decorator form, where tf.custom_gradient's forward mode gives NaN:

        >>> @custom_gradient
        ... def log1pexp(x):
        ...   e = tf.exp(x)
        ...   return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))
        >>> x = tf.constant(100.0)
        >>> with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)) as acc:
        ...   y = log1pexp(x)
        >>> float(acc.jvp(y))
        1.0

        The identity form: log(1 + exp(x)) with its exact gradient at x = 100.

        >>> x = tf.constant([0.0, 100.0])
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   y = custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)
        >>> tape.gradient(y, x).numpy()
        array([0.5, 1. ], dtype=float32)
    """
    if gx is None and x is None:
        if fx is None:
            decorator.check_options(order, check_linearity)
            return lambda f: decorator.decorate(f, order=order, check_linearity=check_linearity)
        if callable(fx):
            return decorator.decorate(fx, order=order, check_linearity=check_linearity)
    if order != 1 or check_linearity:
        raise ValueError("order and check_linearity belong to the decorator form, custom_gradient(f).")
    _require_both(gx, x)
    with identity.name_scope(name or "custom_gradient"):
        fx = _tensor_like(fx, "fx")
        fx = fx if isinstance(fx, tf.Tensor) else tf.convert_to_tensor(fx, name="fx")
        _require_inexact(fx.dtype, "fx", fx.dtype)
        planned = [_planned(fx, label, g, x_leaf) for label, g, x_leaf in _pairs(gx, x) if g is not None]
        if identity.nothing_records():
            return fx
        if inference.active():
            return inference.undifferentiable(fx, [x_leaf for *_, x_leaf in planned])
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


def scaled_identity(x: tf.Tensor | tf.Variable, scale: Any) -> tf.Tensor:
    """Value x exactly, derivative ``scale`` broadcast against x (never read as a Jacobian).

    scale may be floating or integer (an integer scale is exact in x's dtype).
    """
    x = identity.inexact_tensor(x, "scale_gradient's x")
    scale = _tensor_like(scale, "scale", dtype_hint=x.dtype)
    if not (identity.is_floating(scale.dtype) or scale.dtype.is_integer):
        raise TypeError(f"scale_gradient's scale must be a floating or integer tensor; got {scale.dtype.name}.")
    scale = shape_checks.broadcast_checked(scale, x, "scale", "x")
    if identity.nothing_records():
        return x
    if inference.active():
        return inference.undifferentiable(x, [x])
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
