"""check_gradient: a function's reverse- and forward-mode derivatives against float64 finite differences."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from stopgrad_math.shared import tolerances
from stopgrad_math.shared.gradient_report import (
    ArgumentReport,
    GradientReport,
    assert_passed,
    central_differences,
    check_options,
    compare,
    output_weights,
    tolerance,
)
from stopgrad_math.tensorflow.identity import is_floating

__all__ = ["ArgumentReport", "GradientReport", "assert_gradient", "check_gradient"]


def _weighted_sum(fn: Callable[..., Any], args: Sequence[Any], weights: Sequence[np.ndarray]) -> tf.Tensor:
    """⟨w, fn(*args)⟩ over every floating output leaf, in float64."""
    outputs = [tf.convert_to_tensor(t) for t in tf.nest.flatten(fn(*args))]
    total = tf.constant(0.0, tf.float64)
    for out, w in zip(outputs, weights, strict=True):
        if is_floating(out.dtype):
            total += tf.reduce_sum(tf.math.multiply_no_nan(tf.cast(out, tf.float64), w))
    return total


def _output_values(fn: Callable[..., Any], args: Sequence[Any]) -> list[np.ndarray | float]:
    """fn's outputs at the point in float64 (a non-floating one as 0.0), for ``output_weights``."""
    return [np.asarray(tf.cast(out, tf.float64)) if is_floating(tf.convert_to_tensor(out).dtype) else 0.0
            for out in tf.nest.flatten(fn(*args))]


def _numeric(
    fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray], step_scale: float
) -> np.ndarray:
    """Central differences of ⟨w, fn⟩ w.r.t. every element of args[index], in that argument's dtype."""
    dtype = args[index].dtype

    def total_at(moved: np.ndarray) -> float:
        values = list(args)
        values[index] = tf.constant(moved, dtype)
        return float(_weighted_sum(fn, values, weights))

    return central_differences(total_at, np.asarray(tf.cast(args[index], tf.float64)), step_scale)


def _reverse(fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray]) -> np.ndarray:
    x = args[index]
    with tf.GradientTape() as tape:
        tape.watch(x)
        total = _weighted_sum(fn, args, weights)
    grad = tape.gradient(total, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return np.asarray(tf.cast(tf.convert_to_tensor(grad), tf.float64))


def _forward(fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray]) -> np.ndarray:
    x = args[index]
    result = np.empty(x.shape)
    for position in np.ndindex(*x.shape):
        basis = np.zeros(x.shape)
        basis[position] = 1.0
        with tf.autodiff.ForwardAccumulator(x, tf.constant(basis, x.dtype)) as acc:
            total = _weighted_sum(fn, args, weights)
        result[position] = float(acc.jvp(total, unconnected_gradients=tf.UnconnectedGradients.ZERO))
    return result


def _computed_in(fn: Callable[..., Any], args: Sequence[Any], index: int) -> str:
    """The narrowest floating dtype fn computes in from args[index] (its own included), read from the graph
    tf.function traces of it: a float64 argument cast to float32 inside computes in float32. Where fn cannot be
    traced, the argument's own dtype."""
    x = args[index]
    names = {str(x.dtype.name)}

    def of_x(moved: tf.Tensor) -> Any:
        return fn(*[moved if j == index else a for j, a in enumerate(args)])

    try:
        graph = tf.function(of_x).get_concrete_function(tf.TensorSpec(x.shape, x.dtype)).graph
    except Exception:  # fn reads values in Python, or is otherwise not traceable: its argument's dtype
        return str(x.dtype.name)
    reached = {graph.inputs[0].ref()}
    for op in graph.get_operations():
        if any(t.ref() in reached for t in op.inputs):
            reached.update(t.ref() for t in op.outputs)
            names |= {t.dtype.name for t in op.outputs if is_floating(t.dtype)}
    return tolerances.narrowest(names)


def _numeric_preferring_float64(
    fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray], step: float
) -> tuple[np.ndarray, str]:
    """In float64 where fn takes it and computes in it from the argument; else at the narrowest precision fn
    computes in from it, with the step eps^(1/3) that balances truncation and rounding there."""
    args64 = [tf.cast(a, tf.float64) if j == index else a for j, a in enumerate(args)]
    try:
        dtype = _computed_in(fn, args64, index)
        at = step if dtype == "float64" else tolerances.difference_step(dtype)
        return _numeric(fn, args64, index, weights, at), dtype
    except (TypeError, ValueError, tf.errors.InvalidArgumentError):
        # fn mixes the argument with tensors of its own dtype: difference in that dtype
        dtype = _computed_in(fn, args, index)
        return _numeric(fn, args, index, weights, tolerances.difference_step(dtype)), dtype


def _point(value: Any, index: int) -> Any:
    """An argument as the point to check at: a floating tensor wherever the value is a floating one
    (a Python float, a list of them, a NumPy array or scalar, a variable); anything else as it is."""
    if isinstance(value, tf.Tensor) or not isinstance(value, _CONVERTIBLE):
        tensor = value
    else:
        try:
            tensor = tf.convert_to_tensor(value)
        except (TypeError, ValueError):
            return value
    if isinstance(tensor, tf.Tensor) and tensor.dtype.is_complex:
        raise TypeError(f"check_gradient compares real derivatives; argument {index} is {tensor.dtype.name}: "
                        "check its real and imaginary parts as two real arguments.")
    return tensor if isinstance(tensor, tf.Tensor) and is_floating(tensor.dtype) else value


_CONVERTIBLE = (float, complex, list, tuple, np.ndarray, np.floating, np.complexfloating, tf.Variable)


def check_gradient(
    fn: Callable[..., Any],
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    step: float = 6e-6,
    seed: int = 0,
) -> GradientReport:
    """Compares fn's gradients (reverse and forward mode) with float64 central differences.

    For each floating argument, the derivative of ⟨w, fn(*args)⟩ (w fixed
    random weights over every floating output, so a single check covers the
    whole Jacobian's action) is computed by GradientTape and by one
    ForwardAccumulator per element, in the arguments' own dtype, and compared
    elementwise with central differences of fn evaluated on the arguments
    cast to float64, with a relative step ``step·max(1, |x|)``. Where fn
    cannot take float64 (it mixes x with float32 constants or variables),
    the differences are taken in x's dtype with the step eps^(1/3) and the
    report says so. The "computed" and "numeric" values in the report are
    derivatives of the weighted sum. An element passes when
    ``|computed − numeric| ≤ atol + rtol·|numeric|`` (defaults by dtype:
    rtol 1e-3 for float32, 1e-6 for float64, 3e-2 for 16-bit floats; atol =
    rtol). Outputs that are not finite at the point get weight 0. Elements
    whose finite difference is not finite (fn not finite nearby), or whose
    derivative is NaN while some output is not finite at the point (0·NaN),
    are skipped and counted; any other non-finite computed derivative where
    the finite difference is finite fails. Integer and other non-floating
    arguments are passed through unchanged; a floating point given as a
    Python float, a list, a NumPy array or scalar or a variable is checked
    as a tensor. A report passes only when something was checked: with no
    floating argument, or every element skipped, it fails.
    ``step`` must be a finite number above 0 (ValueError otherwise); complex
    arguments are refused (TypeError); inside tf.function it raises
    RuntimeError (it is eager by design: fn may be a tf.function).

    Returns:
      A GradientReport: ``passed``, ``max_abs_error``, ``max_rel_error`` and,
      per argument and mode, the worst element with both values;
      ``str(report)`` is a table.

    Examples:
        >>> def log1pexp(x):
        ...   return custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)
        >>> check_gradient(log1pexp, tf.constant([-3.0, 0.0, 5.0])).passed
        True
    """
    if not tf.executing_eagerly():
        raise RuntimeError(
            "check_gradient runs eagerly: it evaluates fn at many points and compares the numbers, which a graph "
            "being traced (tf.function) does not have. Call it outside tf.function; fn itself may be one."
        )
    check_options(step, rtol, atol)
    points = [_point(a, i) for i, a in enumerate(args)]
    floating = [i for i, a in enumerate(points) if isinstance(a, tf.Tensor) and is_floating(a.dtype)]
    weights, fn_not_finite = output_weights(_output_values(fn, points), seed)
    rows = []
    for i in floating:
        numeric, numeric_dtype = _numeric_preferring_float64(fn, points, i, weights, step)
        # at the precision fn computes in, and the leaf's (its derivative is computed at the leaf)
        leaf_tolerance = tolerance(tolerances.narrowest({numeric_dtype, points[i].dtype.name}), rtol, atol)
        for mode, derivative in (("reverse", _reverse), ("forward", _forward)):
            computed = derivative(fn, points, i, weights)
            rows.append(compare(i, mode, computed, numeric, leaf_tolerance, numeric_dtype, fn_not_finite))
    return GradientReport(tuple(rows))


def assert_gradient(fn: Callable[..., Any], *args: Any, **options: Any) -> GradientReport:
    """Raises AssertionError with check_gradient's table unless it passed; returns the report.

    Examples:
        >>> assert_gradient(lambda x: x**2, tf.constant([1.0, 2.0], tf.float64)).passed
        True
    """
    return assert_passed(check_gradient(fn, *args, **options))
