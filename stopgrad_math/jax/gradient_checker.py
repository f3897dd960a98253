"""check_gradient in JAX: a function's reverse- and forward-mode derivatives against central differences."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stopgrad_math import tolerances
from stopgrad_math.gradient_report import GradientReport, central_differences, check_options, compare, output_weights

__all__ = ["GradientReport", "assert_gradient", "check_gradient"]


def _floating(value: Any) -> bool:
    return isinstance(value, jax.Array) and bool(jnp.issubdtype(value.dtype, jnp.floating))


def _weighted_sum(fn: Callable[..., Any], args: Sequence[Any], weights: Sequence[np.ndarray]) -> jax.Array:
    """⟨w, fn(*args)⟩ over every floating output leaf, in the widest float JAX has on (float64 with x64)."""
    wide = jax.dtypes.canonicalize_dtype(jnp.float64)
    total = jnp.zeros((), wide)
    for out, w in zip(jax.tree_util.tree_leaves(fn(*args)), weights, strict=True):
        if _floating(out):
            total = total + jnp.sum(jnp.where(w == 0, 0.0, out.astype(wide) * w.astype(wide)))
    return total


def _output_values(fn: Callable[..., Any], args: Sequence[Any]) -> list[np.ndarray | float]:
    """fn's output leaves at the point in float64 (a non-floating one as zeros), for ``output_weights``."""
    return [np.asarray(out, np.float64) if _floating(out) else np.zeros(np.shape(out))
            for out in jax.tree_util.tree_leaves(fn(*args))]


def _numeric(fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray],
             step_scale: float) -> np.ndarray:
    """Central differences of ⟨w, fn⟩ w.r.t. every element of args[index], the point moved in NumPy."""

    def total_at(moved: np.ndarray) -> float:
        values = list(args)
        values[index] = jnp.asarray(moved, args[index].dtype)
        return float(_weighted_sum(fn, values, weights))

    return central_differences(total_at, np.asarray(args[index], np.float64), step_scale)


def _differences(fn: Callable[..., Any], args: Sequence[Any], index: int, weights: Sequence[np.ndarray],
                 step: float) -> tuple[np.ndarray, str]:
    """In float64 where JAX has it on (x64) and fn takes it; else in the argument's dtype, with the step
    eps^(1/3) that balances truncation and rounding there."""
    wide = jax.dtypes.canonicalize_dtype(jnp.float64)
    if wide == jnp.float64:
        widened = [a.astype(wide) if j == index else a for j, a in enumerate(args)]
        try:
            return _numeric(fn, widened, index, weights, step), "float64"
        except TypeError:  # fn mixes the argument with arrays of its own dtype in a way JAX refuses
            pass
    dtype = args[index].dtype
    eps = float(jnp.finfo(dtype).eps)  # type: ignore[no-untyped-call]  # jnp.finfo knows bfloat16, np.finfo not
    return _numeric(fn, args, index, weights, eps ** (1 / 3)), str(dtype)


def _point(value: Any, index: int) -> Any:
    """An argument as the point to check at: a floating array wherever the value is a floating one."""
    if isinstance(value, (float, list, tuple, np.ndarray, np.floating, np.complexfloating, jax.Array)):
        try:
            array = jnp.asarray(value)
        except (TypeError, ValueError):
            return value
        if jnp.issubdtype(array.dtype, jnp.complexfloating):
            raise TypeError(f"check_gradient compares real derivatives; argument {index} is {array.dtype}: "
                            "check its real and imaginary parts as two real arguments.")
        return array if jnp.issubdtype(array.dtype, jnp.floating) else value
    return value


def check_gradient(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
                   step: float = 6e-6, seed: int = 0) -> GradientReport:
    """Compares fn's derivatives (``jax.grad`` and ``jax.jacfwd``) with central finite differences.

    As the TensorFlow namespace's ``check_gradient``: for each floating
    argument, the derivative of ⟨w, fn(*args)⟩ (w fixed random weights over
    every floating output leaf; the report's computed and numeric values are
    derivatives of this weighted sum) is compared elementwise with central
    differences. The differences are taken in float64 where JAX has float64
    on (``jax_enable_x64``), else in the argument's dtype with the step
    eps^(1/3); the report says which. Tolerances and the rules for
    non-finite values are the TensorFlow checker's; a report of nothing
    checked never passes.

    Examples:
        >>> def log1pexp(x):
        ...   return custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
        >>> check_gradient(log1pexp, jnp.array([-3.0, 0.0, 5.0])).passed
        True
    """
    check_options(step, rtol, atol)
    points = [_point(a, i) for i, a in enumerate(args)]
    weights, fn_not_finite = output_weights(_output_values(fn, points), seed)
    rows = []
    for i in (i for i, a in enumerate(points) if _floating(a)):
        rtol_i = tolerances.rtol(points[i].dtype, "finite_differences") if rtol is None else rtol
        tolerance = (rtol_i, rtol_i if atol is None else atol)
        numeric, numeric_dtype = _differences(fn, points, i, weights, step)

        def total(x: jax.Array, i: int = i) -> jax.Array:
            return _weighted_sum(fn, [x if j == i else a for j, a in enumerate(points)], weights)

        for mode, derivative in (("reverse", jax.grad(total)), ("forward", jax.jacfwd(total))):
            computed = np.asarray(derivative(points[i]), np.float64)
            rows.append(compare(i, mode, computed, numeric, tolerance, numeric_dtype, fn_not_finite))
    return GradientReport(tuple(rows))


def assert_gradient(fn: Callable[..., Any], *args: Any, **options: Any) -> GradientReport:
    """Raises AssertionError with check_gradient's table unless it passed; returns the report.

    Examples:
        >>> assert_gradient(lambda x: x**2, jnp.array([1.0, 2.0])).passed
        True
    """
    report = check_gradient(fn, *args, **options)
    if not report.passed:
        raise AssertionError(f"gradient check failed:\n{report}")
    return report
