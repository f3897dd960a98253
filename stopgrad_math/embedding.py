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

    Two forms, one stop-gradient identity underneath.

    **Decorator form** (``@custom_gradient``, ``@custom_gradient(order=2)``):
    a drop-in for ``tf.custom_gradient`` and keras ``ops.custom_gradient``.
    ``f(*args, **kwargs)`` returns ``(y, grad_fn)``; grad_fn maps upstream
    gradients to the gradients of the args (a vector-Jacobian product). The
    result has the value y bit for bit and the Jacobian J that grad_fn is the
    transpose of, embedded as a linear map, so it is exact for any function
    (matmuls, reductions, several outputs), in reverse and forward mode.
    Second derivatives through it need ``order=2`` (with the default
    ``order=1`` they are None, unconnected).

        h = y − (J·v − stop(J·v)),  v = stop(x) − x,  J·v = ∂/∂d ⟨grad_fn(d), v⟩ at d = 0

    Where y has one element (a loss, a log-likelihood), J is grad_fn(1) and
    the identity form embeds it: no transpose, so a grad_fn that TensorFlow
    cannot differentiate (tf.numpy_function, PreventGradient) and infinite
    derivatives work there. Where the transpose would not see all of
    grad_fn (checked while tracing, and eagerly at the first call with each
    input signature), a y of at most 16 elements gets J from grad_fn on
    unit upstreams, and a larger one raises ValueError.

    * grad_fn may be written ``grad(upstream)``, ``grad(*upstreams)`` (TF),
      ``grad(upstream)`` taking y's structure (JAX), ``grad(*args,
      upstream=None)`` or ``grad(*args, upstream)`` (keras, torch), and
      ``grad(*upstreams, variables=None)`` returning ``(grads, grad_vars)``.
      It returns a gradient per argument, in the arguments' structure (a
      dict for a dict, matched by key), or a flat list in tf.nest's order
      (dict keys sorted), one per leaf or per differentiable leaf; None means
      "no gradient". A gradient may be tf.IndexedSlices, and stays sparse:
      J·v is formed on the gathered rows alone.
    * Arguments and outputs may be floating or complex tensors, variables of
      any kind (tf.Variable, keras.Variable, mirrored, AutoCast, sharded),
      tf.RaggedTensor (its flat_values carry the gradient), tf.SparseTensor
      and tf.IndexedSlices (their values), in nested lists, tuples and dicts.
      Python numbers, strings, None, NumPy arrays, integer tensors and
      callables are passed through as constants; any other type raises
      TypeError naming the argument. With nothing differentiable in the
      arguments or in y, y is returned and grad_fn is not called.
    * f is evaluated at stop(x): variables read inside f keep their ordinary
      autodiff gradient, unless grad_fn takes ``variables``, which then gives
      them. Keyword arguments are constants, except when every argument is a
      keyword: then those naming positional parameters are bound to them.
      Nothing is registered in a global gradient registry.
    * **Linearity.** Any stop-gradient identity makes the backward pass
      linear in the upstream gradient, and calls grad_fn when f is called
      (with upstream 0, and 1 for a one-element y), not in the backward pass.
      A grad_fn that clips or normalizes cannot be expressed: its
      linearization would be embedded. grad_fn(0) ≠ 0 where that is known
      while tracing (in eager mode, checked at the first call with each input
      signature, as a trace would be) raises ValueError, as does a result
      that does not depend on the upstream and is not zero (the zero map,
      J = 0, is accepted); ``check_linearity=True`` also compares
      grad_fn(a·d1 + d2) with a·grad_fn(d1) + grad_fn(d2).
    * **Higher order.** ``order=2`` evaluates J at the midpoint
      stop(x) + u/2 (equal to x in value) of the integral form
      h = stop(y) + ∫₀¹ J(stop(x) + t·u)·u dt, which makes second
      derivatives (Hessians, Hessian-vector products, forward-over-reverse)
      exact when grad_fn is built from differentiable ops. It calls f once
      (twice when f reads variables), and the first derivative turns NaN
      where grad_fn's own derivative is not finite (log1pexp's
      1 − 1/(1 + exp(x)) at x = 100), which is why it is not the default.
      tf.custom_gradient differentiates grad_fn's ops instead, which is not
      the second derivative of f either.
    * grad_fn may call decorated functions, f itself included (a recursive
      derivative): it runs with the arguments stopped, and a call there on
      constants returns its value alone, which ends the recursion (two
      deep at ``order=2``). Calls on the upstream are embedded; without end
      they raise ValueError.
    * In eager mode with no tape or accumulator active, f's y is returned
      as it is.

    Examples:
        >>> @custom_gradient
        ... def log1pexp(x):
        ...   e = tf.exp(x)
        ...   return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))
        >>> x = tf.constant(100.0)
        >>> with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)) as acc:
        ...   y = log1pexp(x)
        >>> float(acc.jvp(y))  # tf.custom_gradient gives NaN here
        1.0

    **Identity form** (``custom_gradient(fx, gx, x)``): tfp's signature.
    Returns a Tensor with the value of ``fx`` and the derivative ``gx``
    w.r.t. ``x``.

    The stop-gradient identity, one term per argument:

        h = stop(fx) − Σ multiply_no_nan(stop(gx), stop(x) − x)

    Each term is exactly +0.0, so ``h`` equals ``fx`` bit for bit in every
    floating and complex dtype, −0.0, inf and NaN included, whatever ``gx``
    and ``x`` hold; its derivative w.r.t. ``x`` is ``gx``. (Two caveats that no
    TensorFlow arithmetic op escapes: where the CPU kernels flush denormals
    to zero, a subnormal fx comes back as the zero of its sign; and bfloat16
    arithmetic returns a NaN as the canonical NaN.)

    The shape of each ``gx`` says what it holds (the first layout that fits):

    * ``fx.shape + x.shape``: the full Jacobian, d h[i] / d x[j] = gx[i, j].
    * ``gx * x`` broadcasts to exactly ``fx.shape``: elementwise,
      d h[i] / d x[i] = gx[i], summed over the axes along which x is
      broadcast (a scalar x with a vector fx, a per-row parameter).
    * ``fx`` has one element and gx broadcasts to ``x.shape``: dh/dx = gx,
      broadcast (a scalar gx, or a Python float, for every element of x).
    * otherwise gx broadcasts to ``x.shape`` and takes tfp's rule: the
      gradient of ``reduce_sum(h)`` is gx, each element of h getting
      gx / size(fx).

    Any other shape, or a gx whose structure differs from x's, raises
    ValueError while tracing. Where shapes are only partly known while
    tracing (``TensorSpec(None)``, a batch dimension of None), the layouts
    the known dimensions allow are kept and the graph takes the first that
    the run-time shapes fit, so eager and graph agree for the same shapes; a
    run-time misfit raises InvalidArgumentError with the same words (under
    XLA, which cannot assert, compilation fails). With these layouts the
    vector-Jacobian product is right for any upstream gradient, and
    ForwardAccumulator, jacobian, vectorized_map, tf.function, XLA and
    SavedModel all see the same derivative, since the identity is made of
    ordinary ops. For a scalar fx the result is the same as
    ``tfp.math.custom_gradient``'s.

    Complex fx, gx and x follow TensorFlow's convention for a holomorphic
    function with derivative gx: the gradient is conj(gx)·upstream, the
    forward derivative gx·tangent. A complex fx may have real arguments; a
    real fx takes only real gx and x.

    A zero upstream gradient gives a zero gradient even where gx is inf. At an
    element of x that is inf or NaN the value is kept and that element gets no
    gradient (x − stop(x) would be NaN there). The second derivative through
    a stopped gx is zero (None from a tape); with
    ``fx_gx_manually_stopped=True`` fx and gx are used as given, so any
    gradient paths left in them are the caller's (an unstopped g(x) makes
    the second derivative 2·g', the derivative of f + g(x)·u, as in tfp). In eager mode with no tape
    or accumulator active, ``fx`` is returned as it is.

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
      check_linearity: decorator form only: test grad_fn for linearity.

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
        log(1 + exp(x)) with its exact gradient at x = 100.

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
    return label, gradient_layout.candidates(label, fx.shape, x.shape, g.shape), g, x


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
