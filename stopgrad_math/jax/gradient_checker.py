"""check_gradient in JAX: a function's reverse- and forward-mode derivatives against central differences."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from stopgrad_math.shared import tolerances
from stopgrad_math.shared.gradient_report import (
    GradientReport,
    assert_passed,
    central_differences,
    check_options,
    compare,
    output_weights,
    tolerance,
)

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


@dataclasses.dataclass
class _Point:
    """The arguments' leaves, flat, and how to put them back; each checked leaf is moved alone."""

    leaves: list[Any]
    paths: list[tuple[Any, ...]]
    structure: Any

    @classmethod
    def of(cls, args: Sequence[Any]) -> _Point:
        pairs, structure = jax.tree_util.tree_flatten_with_path(tuple(args))
        leaves = [_leaf_point(value, path) for path, value in pairs]
        return cls(leaves, [path for path, _ in pairs], structure)

    def args(self, index: int | None = None, value: Any = None) -> tuple[Any, ...]:
        leaves = list(self.leaves)
        if index is not None:
            leaves[index] = value
        return tuple(jax.tree_util.tree_unflatten(self.structure, leaves))

    def label(self, index: int) -> tuple[int, str]:
        """(the argument's position, the leaf's path inside it)."""
        path = self.paths[index]
        return int(path[0].idx), jax.tree_util.keystr(path[1:])


def _leaf_point(value: Any, path: tuple[Any, ...]) -> Any:
    """A leaf as the point to check at: a floating array wherever the value is a floating one."""
    if isinstance(value, (float, np.ndarray, np.floating, np.complexfloating, jax.Array)):
        array = jnp.asarray(value)
        if jnp.issubdtype(array.dtype, jnp.complexfloating):
            raise TypeError(f"check_gradient compares real derivatives; argument {path[0].idx}"
                            f"{jax.tree_util.keystr(path[1:])} is {array.dtype}: check its real and imaginary parts "
                            "as two real arguments.")
        return array if jnp.issubdtype(array.dtype, jnp.floating) else value
    return value


def _numeric(fn: Callable[..., Any], point: _Point, index: int, weights: Sequence[np.ndarray],
             step_scale: float) -> np.ndarray:
    """Central differences of ⟨w, fn⟩ w.r.t. every element of leaf ``index``, the point moved in NumPy."""
    dtype = point.leaves[index].dtype

    def total_at(moved: np.ndarray) -> float:
        return float(_weighted_sum(fn, point.args(index, jnp.asarray(moved, dtype)), weights))

    return central_differences(total_at, np.asarray(point.leaves[index], np.float64), step_scale)


def _reached_dtypes(jaxpr: Any, tainted: set[Any]) -> set[str]:
    """The floating dtypes of the values a jaxpr computes from ``tainted`` (its variables), in order; inside an
    equation with an inner jaxpr (jit, scan, custom_jvp), every value of the inner jaxpr."""
    names: set[str] = set()
    for eqn in jaxpr.eqns:
        if not any(not isinstance(v, core.Literal) and v in tainted for v in eqn.invars):
            continue
        tainted.update(eqn.outvars)
        names |= {str(v.aval.dtype) for v in eqn.outvars if hasattr(v.aval, "dtype")}
        for inner in _inner_jaxprs(list(eqn.params.values())):
            names |= _reached_dtypes(inner, set(inner.invars))
    return names


def _inner_jaxprs(values: list[Any]) -> list[Any]:
    """The jaxprs among an equation's parameters (a ClosedJaxpr's own, and in tuples: cond's branches)."""
    found = []
    for value in values:
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns"):
            found.append(inner)
        elif isinstance(value, (tuple, list)):
            found += _inner_jaxprs(list(value))
    return found


def _computed_in(fn: Callable[..., Any], point: _Point, index: int) -> str:
    """The narrowest floating dtype fn computes in from leaf ``index`` (its own included), read from its jaxpr:
    a float64 argument cast to float32 inside computes in float32."""
    leaf = point.leaves[index]
    closed = jax.make_jaxpr(lambda moved: fn(*point.args(index, moved)))(leaf)
    return tolerances.narrowest({str(leaf.dtype), *_reached_dtypes(closed.jaxpr, set(closed.jaxpr.invars))})


def _differences(fn: Callable[..., Any], point: _Point, index: int, weights: Sequence[np.ndarray],
                 step: float) -> tuple[np.ndarray, str]:
    """In float64 where JAX has it on (x64) and fn computes in it from the leaf; else at the narrowest precision
    fn computes in from it, with the step eps^(1/3) that balances truncation and rounding there."""
    wide = jax.dtypes.canonicalize_dtype(jnp.float64)
    if wide == jnp.float64:
        leaves = list(point.leaves)
        leaves[index] = leaves[index].astype(wide)
        widened = dataclasses.replace(point, leaves=leaves)
        try:
            dtype = _computed_in(fn, widened, index)
            at = step if dtype == "float64" else tolerances.difference_step(dtype)
            return _numeric(fn, widened, index, weights, at), dtype
        except TypeError:  # fn mixes the argument with arrays of its own dtype in a way JAX refuses
            pass
    dtype = _computed_in(fn, point, index)
    return _numeric(fn, point, index, weights, tolerances.difference_step(dtype)), dtype


def check_gradient(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
                   step: float = 6e-6, seed: int = 0) -> GradientReport:
    """Compares fn's derivatives (``jax.grad`` and ``jax.jacfwd``) with central finite differences.

    As the TensorFlow namespace's ``check_gradient``: for each floating
    leaf of the arguments (pytrees, as ``jax.grad`` takes them: a tuple of
    arrays is two leaves, each checked and reported by its path), the
    derivative of ⟨w, fn(*args)⟩ (w fixed random weights over every
    floating output leaf; the report's computed and numeric values are
    derivatives of this weighted sum) is compared elementwise with central
    differences. The differences are taken in float64 where JAX has float64
    on (``jax_enable_x64``) and fn computes in it, else at the narrowest
    precision fn's jaxpr computes in from the argument, with the step
    eps^(1/3) and that precision's tolerance; the report says which.
    Tolerances and the rules for non-finite values are the TensorFlow
    checker's; a report of nothing checked never passes.

    Examples:
        >>> def log1pexp(x):
        ...   return custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
        >>> check_gradient(log1pexp, jnp.array([-3.0, 0.0, 5.0])).passed
        True
    """
    check_options(step, rtol, atol)
    point = _Point.of(args)
    weights, fn_not_finite = output_weights(_output_values(fn, point.args()), seed)
    rows = []
    for index in (k for k, leaf in enumerate(point.leaves) if _floating(leaf)):
        numeric, numeric_dtype = _differences(fn, point, index, weights, step)
        # at the precision fn computes in, and the leaf's (its derivative is computed at the leaf)
        leaf_tolerance = tolerance(tolerances.narrowest({numeric_dtype, str(point.leaves[index].dtype)}), rtol, atol)

        def total(x: jax.Array, index: int = index) -> jax.Array:
            return _weighted_sum(fn, point.args(index, x), weights)

        argument, leaf = point.label(index)
        for mode, derivative in (("reverse", jax.grad(total)), ("forward", jax.jacfwd(total))):
            computed = np.asarray(derivative(point.leaves[index]), np.float64)
            row = compare(argument, mode, computed, numeric, leaf_tolerance, numeric_dtype, fn_not_finite)
            rows.append(dataclasses.replace(row, leaf=leaf))
    return GradientReport(tuple(rows))


def assert_gradient(fn: Callable[..., Any], *args: Any, **options: Any) -> GradientReport:
    """Raises AssertionError with check_gradient's table unless it passed; returns the report.

    Examples:
        >>> assert_gradient(lambda x: x**2, jnp.array([1.0, 2.0])).passed
        True
    """
    return assert_passed(check_gradient(fn, *args, **options))
