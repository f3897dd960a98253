"""The stop-gradient identity: the one code path that every other piece calls.

A tensor with value ``f`` and derivative ``g`` with respect to ``x`` is

    h = stop(f) − multiply_no_nan(stop(g), stop(x) − x)

The subtracted term is exactly +0.0 in value: ``stop(x) − x`` is +0.0 for every
finite x (IEEE 754: a − a is +0.0 under round-to-nearest), and
``multiply_no_nan(g, +0.0)`` is +0.0 even where g is inf or NaN. Subtracting
+0.0 leaves every float unchanged, −0.0, inf and NaN included, so the value is
``f`` bit for bit. Its derivative is ``g``, and because ``multiply_no_nan``
also guards the backward product, a zero upstream gradient gives a zero
gradient even where g is inf.

Complex tensors get the same identity. TensorFlow's convention for them is
that the gradient of a holomorphic h with derivative g is conj(g)·upstream,
and its forward derivative g·tangent; MulNoNan's gradient does not conjugate,
so for complex g the product is written out in real parts, each a
multiply_no_nan, and TensorFlow's own real/imag/complex gradients conjugate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record

FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
COMPLEX = (tf.complex64, tf.complex128)


def is_floating(dtype: tf.DType) -> bool:
    """Whether the dtype is a real floating type."""
    return dtype.base_dtype in FLOATS


def is_inexact(dtype: tf.DType) -> bool:
    """Whether the identity can carry a gradient in this dtype (real floating or complex)."""
    return dtype.base_dtype in FLOATS + COMPLEX


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


def _is_finite(x: tf.Tensor) -> tf.Tensor:
    if x.dtype.is_complex:
        return tf.math.is_finite(tf.math.real(x)) & tf.math.is_finite(tf.math.imag(x))
    return tf.math.is_finite(x)


def nothing_records() -> bool:
    """True when executing eagerly with no GradientTape or ForwardAccumulator.

    Then nothing computed now can ever be differentiated, so the identity can
    return the value alone.
    """
    return tf.executing_eagerly() and not record.could_possibly_record()


def zero_with_slope(x: tf.Tensor, slope_is_negative: bool) -> tf.Tensor:
    """Returns x − stop(x) (or stop(x) − x): exactly +0.0, slope ±1 where x is finite."""
    still = tf.stop_gradient(x)
    zero = still - x if slope_is_negative else x - still
    # inf − inf is NaN: no op sequence can keep both an exact +0.0 value and a
    # gradient at a non-finite element, so there the value wins. multiply_no_nan
    # by a 1/0 mask is that select: its gradient is one op, where tf.where's
    # computes both branches and reduces the unused one (11 ops in eager).
    finite = tf.cast(_is_finite(still), x.dtype)  # real 1/0: no conjugation to get wrong
    return tf.math.multiply_no_nan(zero, finite)


def zero_with_gradient(x: tf.Tensor | tf.Variable) -> tf.Tensor:
    """Returns u = x − stop(x): exactly +0.0 in value, derivative 1 w.r.t. x.

    This is the ``u`` of the identity ``stop(f) + stop(g)·u``, public so that
    users can write identities of their own.

    Value: +0.0 everywhere, with the shape and dtype of ``x``, also where x
    is inf or NaN. Derivative: the identity map (reverse and forward mode) at
    every finite element of x; at an element that is inf or NaN the value is
    kept and the derivative there is zero, since x − stop(x) would be NaN.

    Args:
      x: a floating or complex Tensor or tf.Variable.

    Returns:
      A Tensor of zeros shaped like ``x`` whose gradient w.r.t. ``x`` is 1.

    Example:

    >>> x = tf.constant([1.0, 2.0])
    >>> with tf.GradientTape() as tape:
    ...   tape.watch(x)
    ...   u = zero_with_gradient(x)
    >>> u.numpy(), tape.gradient(u, x).numpy()
    (array([0., 0.], dtype=float32), array([1., 1.], dtype=float32))
    """
    return zero_with_slope(inexact_tensor(x, "zero_with_gradient's x", complex_too=True), slope_is_negative=False)


def negative_zero_term(g: tf.Tensor, x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Returns multiply_no_nan(g, stop(x) − x) in ``dtype``: +0.0, slope −g.

    Broadcasts g against x as multiplication does. The caller subtracts the
    (reduced) result from the value, which is why the slope is negated: the
    value stays bit-exact (f − (+0.0) == f) and the derivative is +g.
    """
    return times_zero(g, zero_with_slope(x, slope_is_negative=True), dtype)


def times_zero(g: tf.Tensor, zero: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """multiply_no_nan(g, zero) in ``dtype``, broadcasting: +0.0 for a zero of any sign, slope g."""
    if dtype.is_complex:
        return _complex_product(g, zero, dtype)
    return tf.math.multiply_no_nan(g, tf.cast(zero, dtype))  # tf.cast returns a tensor of that dtype as it is


def _complex_product(g: tf.Tensor, zero: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """g·zero in ``dtype`` (complex) from real multiply_no_nans: +0.0 in both parts, slope g."""
    part = dtype.real_dtype
    g_re, g_im = tf.math.real(g), tf.math.imag(g)
    z_re = tf.cast(tf.math.real(zero), part)  # real() of a real tensor is the tensor itself
    real, imag = tf.math.multiply_no_nan(g_re, z_re), tf.math.multiply_no_nan(g_im, z_re)
    if zero.dtype.is_complex:
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
        result = result - term
    if not tf.executing_eagerly():  # a term chosen at run time has no static shape, yet broadcasts to value
        result.set_shape(value.shape)
    return result
