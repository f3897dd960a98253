"""custom_gradient(fx, gx, x): tfp's signature, exact for every output shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.util import nest

from stopgrad_math import decorator, gradient_layout, identity

_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _require_float(dtype: tf.DType, what: str) -> None:
    if dtype.base_dtype not in _FLOATS:
        raise TypeError(
            f"custom_gradient needs a floating {what} (float16, bfloat16, float32 or float64); got {dtype.name}."
        )


def _tensor_like(value: Any, what: str, dtype_hint: tf.DType | None = None) -> tf.Tensor | tf.Variable:
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    try:
        return tf.convert_to_tensor(value, dtype_hint=dtype_hint)
    except (TypeError, ValueError) as error:
        raise TypeError(f"custom_gradient could not convert {what} to a Tensor: {error}") from error


def _pairs(gx: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """Returns (name, gx leaf, x leaf) for each leaf of x; x's structure names them."""
    if not tf.nest.is_nested(x):
        return [("x", gx, x)]
    x_paths = nest.flatten_with_joined_string_paths(x)
    gx_paths = nest.flatten_with_joined_string_paths(gx) if tf.nest.is_nested(gx) else []
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
) -> tf.Tensor | Callable:
    """Embeds a known gradient: ``custom_gradient(fx, gx, x)`` or ``@custom_gradient``.

    Two forms, one identity underneath:

    * ``custom_gradient(fx, gx, x)``: tfp's signature; documented below.
    * ``@custom_gradient`` (or ``@custom_gradient(order=2)``) on a function
      returning ``(y, grad_fn)``: a drop-in for ``tf.custom_gradient`` and
      keras ``ops.custom_gradient``, exact for any function; see
      ``stopgrad_math.decorator.decorate`` for its contract.

    The identity form returns a Tensor with the value of ``fx`` and the
    derivative ``gx`` w.r.t. ``x``.

    The stop-gradient identity, one term per argument:

        h = stop(fx) − Σ multiply_no_nan(stop(gx), stop(x) − x)

    Each term is exactly +0.0, so ``h`` equals ``fx`` bit for bit in every
    floating dtype, −0.0, inf and NaN included, whatever ``gx`` and ``x``
    hold; its derivative w.r.t. ``x`` is ``gx``. (Two caveats that no
    TensorFlow arithmetic op escapes: where the CPU kernels flush denormals
    to zero, a subnormal fx comes back as the zero of its sign; and bfloat16
    arithmetic returns a NaN as the canonical NaN.)

    The shape of each ``gx`` says what it holds (the first layout that fits):

    * ``fx.shape + x.shape``: the full Jacobian, d h[i] / d x[j] = gx[i, j].
    * ``gx * x`` broadcasts to exactly ``fx.shape``: elementwise,
      d h[i] / d x[i] = gx[i], summed over the axes along which x is
      broadcast (a scalar x with a vector fx, a per-row parameter).
    * ``fx`` has one element and ``gx.shape == x.shape``: dh/dx = gx.
    * otherwise ``gx.shape == x.shape`` takes tfp's rule: the gradient of
      ``reduce_sum(h)`` is gx, each element of h getting gx / size(fx).

    Any other shape, or a gx whose structure differs from x's, raises
    ValueError while tracing. With these layouts the vector-Jacobian product
    is right for any upstream gradient, and ForwardAccumulator, jacobian,
    vectorized_map, tf.function, XLA and SavedModel all see the same
    derivative, since the identity is made of ordinary ops. For a scalar fx
    the result is the same as ``tfp.math.custom_gradient``'s.

    A zero upstream gradient gives a zero gradient even where gx is inf. At an
    element of x that is inf or NaN the value is kept and that element gets no
    gradient (x − stop(x) would be NaN there). The second derivative through
    a stopped gx is zero (None from a tape); with
    ``fx_gx_manually_stopped=True`` fx and gx are used as given, so any
    gradient paths left in them are the caller's (an unstopped g(x) makes
    the second derivative 2·g', the derivative of f + g(x)·u, as in tfp). In eager mode with no tape
    or accumulator active, ``fx`` is returned as it is.

    Args:
      fx: floating Tensor, the value f(x).
      gx: the derivative of f at x, with the structure of ``x``; a leaf may
        be None for an argument that gets no gradient. Converted to fx's
        dtype.
      x: a floating Tensor or tf.Variable, or any nested structure of them.
        May differ from fx in floating dtype.
      fx_gx_manually_stopped: if True, fx and gx are not wrapped in
        stop_gradient (tfp's partial custom gradient).
      name: name scope for the ops.

    Returns:
      A Tensor equal to ``fx`` whose derivative w.r.t. ``x`` is ``gx``.

    Raises:
      TypeError: fx, x or gx is not floating.
      ValueError: the structure or a shape of gx does not fit x and fx.

    Example: log(1 + exp(x)) with its exact gradient at x = 100.

    >>> x = tf.constant([0.0, 100.0])
    >>> with tf.GradientTape() as tape:
    ...   tape.watch(x)
    ...   y = custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)
    >>> tape.gradient(y, x).numpy()
    array([0.5, 1. ], dtype=float32)
    """
    if gx is None and x is None:
        if fx is None:
            return lambda f: decorator.decorate(f, order=order, check_linearity=check_linearity)
        if callable(fx):
            return decorator.decorate(fx, order=order, check_linearity=check_linearity)
    if order != 1 or check_linearity:
        raise ValueError("order and check_linearity belong to the decorator form, custom_gradient(f).")
    with tf.name_scope(name or "custom_gradient"):
        fx = tf.convert_to_tensor(fx, name="fx")
        _require_float(fx.dtype, "fx")
        planned = []
        for label, g, x_leaf in _pairs(gx, x):
            if g is None:
                continue
            x_leaf = _tensor_like(x_leaf, label)
            g = _tensor_like(g, f"the gradient for {label}", dtype_hint=fx.dtype)
            _require_float(x_leaf.dtype, label)
            _require_float(g.dtype, f"gradient for {label}")
            layout = gradient_layout.choose(label, fx.shape, x_leaf.shape, g.shape)
            planned.append((label, layout, g, x_leaf))
        if identity.nothing_records():
            return fx
        return _embed(fx, planned, fx_gx_manually_stopped)


def _embed(fx: tf.Tensor, planned: list, manually_stopped: bool) -> tf.Tensor:
    maybe_stop = (lambda t: t) if manually_stopped else tf.stop_gradient
    terms = []
    for label, layout, g, x_leaf in planned:
        x_leaf = tf.convert_to_tensor(x_leaf)
        g = maybe_stop(g if g.dtype == fx.dtype else tf.cast(g, fx.dtype))
        g = gradient_layout.checked(layout, label, fx, x_leaf, g)
        term = identity.negative_zero_term(g, x_leaf, fx.dtype)
        terms.append(gradient_layout.contract(layout, term, fx, x_leaf.shape.rank))
    return identity.attach(maybe_stop(fx), terms)
