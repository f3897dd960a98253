"""The stop-gradient identity: the one code path that every other piece calls.

A tensor with value ``f`` and derivative ``g`` with respect to ``x`` is

    h = stop(f) − multiply_no_nan(stop(g), c(stop(x) − x))

with c the carrier (``carried_zero``), which maps inf and NaN to +0.0 and
passes its operand's derivative at every element: c(stop(x) − x) is +0.0
for every x. The subtracted term is exactly +0.0 in value:
``multiply_no_nan(g, +0.0)`` is +0.0 even where g is inf or NaN. Subtracting
+0.0 leaves every float unchanged, −0.0, inf and NaN included, so the value is
``f`` bit for bit. Its derivative is ``g`` at every element, where x is inf
or NaN too (stop(x) − x alone would be NaN there, and every select that
mended the value would cut the derivative), and because ``multiply_no_nan``
also guards the backward product, a zero upstream gradient gives a zero
gradient even where g is inf. Where x is finite, stop(x) − x is +0.0
already and c changes nothing: eagerly, on a host tensor, it is left out.

Complex tensors get the same identity. TensorFlow's convention for them is
that the gradient of a holomorphic h with derivative g is conj(g)·upstream,
and its forward derivative g·tangent; MulNoNan's gradient does not conjugate,
so for complex g the product is written out in real parts, each a
multiply_no_nan, and TensorFlow's own real/imag/complex gradients conjugate.
"""

from __future__ import annotations

import cmath
import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.tensorflow import _tf_internal

FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
COMPLEX = (tf.complex64, tf.complex128)
# Hashed: DType's == is slow, and eager mode asks for every call.
_FLOATING, _COMPLEX, _INEXACT = frozenset(FLOATS), frozenset(COMPLEX), frozenset(FLOATS + COMPLEX)


def is_floating(dtype: tf.DType) -> bool:
    """Whether the dtype is a real floating type."""
    return dtype in _FLOATING or dtype.base_dtype in _FLOATING


def is_complex(dtype: tf.DType) -> bool:
    """dtype.is_complex, without DType's slow comparisons."""
    return (dtype if dtype in _INEXACT else dtype.base_dtype) in _COMPLEX  # base_dtype: a TF1 reference dtype


def is_inexact(dtype: tf.DType) -> bool:
    """Whether the identity can carry a gradient in this dtype (real floating or complex)."""
    return dtype in _INEXACT or dtype.base_dtype in _INEXACT


def to_tensor(value: Any, what: str, dtype_hint: tf.DType | None = None) -> tf.Tensor:
    """``value`` as a tensor (a variable read), or TypeError naming ``what``.

    ``dtype_hint`` applies to Python values only: TensorFlow casts a NumPy
    value to the hint, which drops an imaginary part with no more than a
    warning. NumPy values keep their dtype, for the caller to check.
    """
    if isinstance(value, tf.Tensor):
        return value
    hint = None if isinstance(value, (np.ndarray, np.generic)) else dtype_hint
    try:
        return tf.convert_to_tensor(value, dtype_hint=hint)
    except (TypeError, ValueError) as error:
        kind = type(value).__name__
        message = f"{what} must be a tensor or convertible to one; the {kind} {value!r:.60} is not: {error}"
        raise TypeError(message) from error


def inexact_tensor(value: Any, what: str, dtype_hint: tf.DType | None = None, complex_too: bool = False) -> tf.Tensor:
    """``value`` as a floating (or, with ``complex_too``, complex) tensor; TypeError naming ``what`` otherwise."""
    tensor = to_tensor(value, what, dtype_hint)
    allowed = is_inexact(tensor.dtype) if complex_too else is_floating(tensor.dtype)
    if not allowed:
        kinds = "floating or complex" if complex_too else "floating (float16, bfloat16, float32 or float64)"
        raise TypeError(f"{what} must be a {kinds} tensor; got {tensor.dtype.name}.")
    return tensor


# The identity's own ops are issued as tf.raw_ops: the same graph ops as tf.subtract, tf.stop_gradient or
# tf.math.multiply_no_nan, without their dispatch, conversion and type-promotion layers, which cost eager
# mode two to three times the op itself. Every operand here is already a tensor of the right dtype.


def stop(x: tf.Tensor) -> tf.Tensor:
    """stop_gradient of a tensor.

    No tape or accumulator records it (as with tf.stop_gradient), so nothing
    computed from the result is taken for connected to what it came from.
    """
    return stop_each([x])[0]


def stop_each(tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """tf.stop_gradient of each tensor.

    tf.stop_gradient is an op run with every tape and accumulator paused, so
    that none records it and nothing computed from its result is taken for
    connected to its input. A graph keeps its StopGradient ops, which
    ``tf.gradients`` and a function's gradient read; eagerly, where an op's
    dispatch is most of the cost at small sizes, one IdentityN run the same
    way stops several tensors at once.
    """
    if len(tensors) <= 1 or not tf.executing_eagerly():
        return [tf.stop_gradient(t) for t in tensors]
    with _tf_internal.stop_recording():
        return list(tf.raw_ops.IdentityN(input=tensors))


# The integer type of each floating type's width, for the bitcast in `unreachable`.
_SAME_WIDTH_INTEGER = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32, tf.float64: tf.int64}


def unreachable(stopped: list[tf.Tensor]) -> list[tf.Tensor]:
    """Stopped tensors (``stop_each``'s) made unreachable for a symbolic gradient too.

    ``tf.gradients`` (and the gradient of a traced function) looks for the ops
    between x and y by following every consumer of x, through StopGradient
    too, and raises at any such op that has no gradient (RandomGammaGrad),
    even where no gradient would flow into it. Its search ends only at a
    tensor that cannot have a gradient, an integer one: so in a graph each
    tensor passes through a bitcast to integers and back, the same bits and
    no copy (a complex one part by part: XLA bitcasts no complex type).
    Eagerly they are returned as they are: a tape records nothing that was
    stopped.
    """
    if tf.executing_eagerly():
        return stopped
    return [_through_integers(t) for t in stopped]


def _through_integers(t: tf.Tensor) -> tf.Tensor:
    if is_complex(t.dtype):
        return tf.complex(_through_integers(tf.math.real(t)), _through_integers(tf.math.imag(t)))
    dtype = t.dtype.base_dtype
    return tf.raw_ops.Bitcast(input=tf.raw_ops.Bitcast(input=t, type=_SAME_WIDTH_INTEGER[dtype]), type=dtype)


def subtract(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """a − b, broadcasting, for tensors of one dtype."""
    return tf.raw_ops.Sub(x=a, y=b)


def multiply_no_nan(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """a·b, and +0.0 where b is zero (whatever a is), broadcasting, for tensors of one dtype.

    Its gradient does not conjugate: for complex operands it is TensorFlow's
    convention only where b is real-valued (see ``times_zero``).
    """
    return tf.raw_ops.MulNoNan(x=a, y=b)


def cast(x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """x in ``dtype``; x itself where it has that dtype already."""
    same = x.dtype is dtype or x.dtype == dtype  # `is` first: DTypes are interned, and == is slow in eager
    return x if same else tf.raw_ops.Cast(x=x, DstT=dtype)


def is_finite(x: tf.Tensor) -> tf.Tensor:
    """Elementwise: not inf or NaN (a complex element: neither part)."""
    if is_complex(x.dtype):
        return tf.math.is_finite(tf.math.real(x)) & tf.math.is_finite(tf.math.imag(x))
    return tf.raw_ops.IsFinite(x=x)


def name_scope(name: str) -> contextlib.AbstractContextManager[Any]:
    """tf.name_scope while building a graph; nothing in eager mode, where op names are not kept."""
    return contextlib.nullcontext() if tf.executing_eagerly() else tf.name_scope(name)


def nothing_records() -> bool:
    """True when executing eagerly with no GradientTape or ForwardAccumulator.

    Then nothing computed now can ever be differentiated, so the identity can
    return the value alone.
    """
    return tf.executing_eagerly() and not _tf_internal.could_possibly_record()


def zero_with_slope(x: tf.Tensor, slope_is_negative: bool, stopped: tf.Tensor | None = None) -> tf.Tensor:
    """Returns c(x − stop(x)) (or c(stop(x) − x)): exactly +0.0, slope ±1 at every element, inf and NaN too.

    ``stopped`` is stop(x) where the caller has it already. c is ``carried_zero``.
    """
    still = stop(x) if stopped is None else stopped
    zero = subtract(still, x) if slope_is_negative else subtract(x, still)
    if _finite_in_host_memory(x):  # x, not still: the caller's tensor may have been read on the host before
        return zero  # +0.0 everywhere already, so c would change no bit of it or of its derivatives
    return carried_zero(zero)


def _finite_part_passing_derivatives(a: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
    finite = tf.raw_ops.Cast(x=is_finite(a), DstT=a.dtype)  # real 1/0: no conjugation to get wrong
    return multiply_no_nan(a, finite), lambda upstream: upstream


# A function, not the bare custom gradient: a ForwardAccumulator takes the bare one's tangent from its ops
# (eagerly too), where a function's forward derivative is the transpose of its registered gradient. A
# SavedModel keeps the function with its gradient, and XLA inlines it.
_carrier = tf.function(tf.custom_gradient(_finite_part_passing_derivatives), autograph=False, reduce_retracing=True)


def carried_zero(a: tf.Tensor) -> tf.Tensor:
    """``a`` where it is finite, +0.0 where it is inf or NaN; its derivative is a's at every element, in every mode.

    For a zero such as x − stop(x) (NaN where x is not finite) it is +0.0
    everywhere with x's derivative everywhere. Ordinary ops cannot give this:
    every op that maps a NaN value to 0 (a select, multiply_no_nan) also
    masks the derivative there. The carrier computes the masked value with
    ordinary ops and registers a gradient that passes the upstream unchanged:
    reverse mode gives a's cotangent, forward mode (the transpose) a's
    tangent. Where a is finite that is the ops' own derivative bit for bit.
    """
    return _carrier(a)


def zero_with_derivative_of(a: tf.Tensor) -> tf.Tensor:
    """c(a − stop(a)): +0.0, derivative a's at every element, where a's value is inf or NaN too.

    The decorator's zero of J·v: where J holds a NaN or inf, J·v is NaN in
    value (NaN·0), yet its derivative, J's product with the argument's, cuts
    only the paths through that element of J.
    """
    return zero_with_slope(a, slope_is_negative=False)


def _finite_in_host_memory(x: tf.Tensor) -> bool:
    """Whether x is an eager tensor in host memory with every element finite.

    Then x − stop(x) is +0.0 everywhere, and the carrier would change no bit
    of the value or of any derivative: one NumPy pass over x costs less than
    calling the carrier's function eagerly. A graph keeps the carrier (there
    it costs no more than the finite mask it replaced), as does a tensor in
    device memory (reading it would wait for the device). An eager tensor
    captured while tracing is a constant of the graph, so its values are
    known there too.
    """
    if tf.is_symbolic_tensor(x) or "CPU" not in x.backing_device:
        return False
    try:
        values = np.asarray(x)  # a view of the buffer, where .numpy() copies it (half the cost at 1e6 elements)
    except ValueError:  # TensorFlow's __array__ of a 0-d bfloat16 tensor returns a NumPy scalar
        values = x.numpy()
    if values.size <= 16:  # a few elements: Python's isfinite beats two cold NumPy calls
        isfinite = cmath.isfinite if values.dtype.kind == "c" else math.isfinite
        return all(map(isfinite, values.ravel().tolist()))
    return bool(np.isfinite(values).all())


def zero_with_gradient(x: tf.Tensor | tf.Variable) -> tf.Tensor:
    """Returns u = x − stop(x): exactly +0.0 in value, derivative 1 w.r.t. x.

    This is the ``u`` of the identity ``stop(f) + stop(g)·u``, public so that
    users can write identities of their own.

    Value: +0.0 everywhere, with the shape and dtype of ``x``, also where x
    is inf or NaN. Derivative: the identity map (reverse and forward mode) at
    every element of x, inf and NaN included.

    Args:
      x: a floating or complex Tensor or tf.Variable.

    Returns:
      A Tensor of zeros shaped like ``x`` whose gradient w.r.t. ``x`` is 1.

    Examples:
        >>> x = tf.constant([1.0, 2.0])
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(x)
        ...   u = zero_with_gradient(x)
        >>> u.numpy(), tape.gradient(u, x).numpy()
        (array([0., 0.], dtype=float32), array([1., 1.], dtype=float32))
    """
    return zero_with_slope(inexact_tensor(x, "zero_with_gradient's x", complex_too=True), slope_is_negative=False)


def negative_zero_term(g: tf.Tensor, x: tf.Tensor, dtype: tf.DType, stopped: tf.Tensor | None = None) -> tf.Tensor:
    """Returns multiply_no_nan(g, stop(x) − x) in ``dtype``: +0.0, slope −g (``stopped``: stop(x), if made).

    Broadcasts g against x as multiplication does. The caller subtracts the
    (reduced) result from the value, which is why the slope is negated: the
    value stays bit-exact (f − (+0.0) == f) and the derivative is +g.
    """
    return times_zero(g, zero_with_slope(x, slope_is_negative=True, stopped=stopped), dtype)


def times_zero(g: tf.Tensor, zero: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """multiply_no_nan(g, zero) in ``dtype``, broadcasting: +0.0 for a zero of any sign, slope g."""
    if is_complex(dtype):
        return _complex_product(g, zero, dtype)
    return multiply_no_nan(g, cast(zero, dtype))


def _complex_product(g: tf.Tensor, zero: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """g·zero in ``dtype`` (complex) from real multiply_no_nans: +0.0 in both parts, slope g."""
    part = dtype.real_dtype
    g_re, g_im = tf.math.real(g), tf.math.imag(g)
    z_re = tf.cast(tf.math.real(zero), part)  # real() of a real tensor is the tensor itself
    real, imag = tf.math.multiply_no_nan(g_re, z_re), tf.math.multiply_no_nan(g_im, z_re)
    if is_complex(zero.dtype):
        z_im = tf.cast(tf.math.imag(zero), part)
        real -= tf.math.multiply_no_nan(g_im, z_im)
        imag += tf.math.multiply_no_nan(g_re, z_im)
    return tf.complex(real, imag)


def attach(value: tf.Tensor, zero_terms: list[tf.Tensor]) -> tf.Tensor:
    """Returns value − Σ zero_terms, each term exactly +0.0: the value, bit-exact.

    Each term broadcasts to ``value``'s shape; its gradient flows to the
    tensors it was built from.
    """
    result = value
    for term in zero_terms:
        result = subtract(result, term)
    if not tf.executing_eagerly():  # a term chosen at run time has no static shape, yet broadcasts to value
        result.set_shape(value.shape)
    return result
