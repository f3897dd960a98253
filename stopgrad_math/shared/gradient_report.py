"""The report of a gradient check, and how a derivative is judged against finite differences: shared by the
TensorFlow and JAX checkers (NumPy only)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stopgrad_math.shared import tolerances


@dataclasses.dataclass(frozen=True)
class ArgumentReport:
    """How one argument's derivative, in one mode, compares with finite differences."""

    argument: int
    mode: str  # "reverse" or "forward"
    passed: bool
    max_abs_error: float
    max_rel_error: float
    worst_index: tuple[int, ...] | None
    computed: float  # the derivative under test at the worst element
    numeric: float  # the finite-difference derivative there
    checked: int  # elements compared
    skipped: int  # elements where fn or its finite difference is not finite
    numeric_dtype: str  # float64, or the narrowest dtype fn computes in from the argument
    leaf: str = ""  # where in the argument, for a nest or pytree: "['scale']", "[0]"


@dataclasses.dataclass(frozen=True)
class GradientReport:
    """The result of ``check_gradient``: ``passed`` and one row per argument and mode."""

    rows: tuple[ArgumentReport, ...]

    @property
    def passed(self) -> bool:
        """Every row passed, and something was checked: a report of nothing never passes."""
        return sum(row.checked for row in self.rows) > 0 and all(row.passed for row in self.rows)

    @property
    def max_abs_error(self) -> float:
        return max((row.max_abs_error for row in self.rows), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((row.max_rel_error for row in self.rows), default=0.0)

    def __str__(self) -> str:
        if not self.rows:
            return "nothing was checked: fn has no floating argument"
        header = f"{'arg':>10} {'mode':>8} {'ok':>3} {'max abs err':>12} {'max rel err':>12} {'worst at':>10}"
        header += f" {'computed':>13} {'numeric':>13} {'checked':>8} {'skipped':>8} {'differences in':>14}"
        legend = "computed, numeric: the derivative of ⟨w, fn(*args)⟩ at the worst element, w fixed random weights"
        lines = [header]
        for r in self.rows:
            where = "-" if r.worst_index is None else str(list(r.worst_index))
            lines.append(
                f"{str(r.argument) + r.leaf:>10} {r.mode:>8} {'yes' if r.passed else 'NO':>3} {r.max_abs_error:>12.4g} "
                f"{r.max_rel_error:>12.4g} {where:>10} {r.computed:>13.6g} {r.numeric:>13.6g} "
                f"{r.checked:>8} {r.skipped:>8} {r.numeric_dtype:>14}"
            )
        return "\n".join([*lines, legend])


def compare(argument: int, mode: str, computed: np.ndarray, numeric: np.ndarray, tolerance: tuple[float, float],
             numeric_dtype: str, fn_not_finite: bool) -> ArgumentReport:
    rtol, atol = tolerance
    valid = np.isfinite(numeric)
    if fn_not_finite:  # 0·NaN from an output left out: that element cannot be judged
        valid &= ~np.isnan(computed)
    error = np.where(valid, np.abs(computed - numeric), 0.0)
    error = np.where(valid & ~np.isfinite(computed), np.inf, error)
    relative = error / np.maximum(np.abs(numeric), np.finfo(np.float64).tiny)
    bad = error > atol + rtol * np.abs(np.where(valid, numeric, 0.0))
    if not valid.any():  # nothing to judge in this mode; the report passes only if something else was checked
        return ArgumentReport(argument, mode, True, 0.0, 0.0, None, np.nan, np.nan, 0, int(valid.size), numeric_dtype)
    worst = np.unravel_index(np.argmax(np.where(valid, error, -1.0)), error.shape)
    return ArgumentReport(
        argument, mode, not bad.any(), float(error.max()), float(relative[valid].max()),
        tuple(int(i) for i in worst), float(computed[worst]), float(numeric[worst]),
        int(valid.sum()), int((~valid).sum()), numeric_dtype,
    )


def tolerance(dtype: Any, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """(rtol, atol) for a leaf of ``dtype``: the table's finite-differences tolerance where rtol is not given, and
    atol as rtol where it is not given."""
    rtol = tolerances.rtol(dtype, "finite_differences") if rtol is None else rtol
    return rtol, rtol if atol is None else atol


def assert_passed(report: GradientReport) -> GradientReport:
    """``assert_gradient``'s check: AssertionError with the report's table unless it passed; the report."""
    if not report.passed:
        raise AssertionError(f"gradient check failed:\n{report}")
    return report


def check_options(step: Any, rtol: Any, atol: Any) -> None:
    if not (isinstance(step, (int, float)) and np.isfinite(step) and step > 0):
        raise ValueError(f"check_gradient's step must be a finite number above 0; got {step!r}.")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
            raise ValueError(f"check_gradient's {name} must be a finite number of 0 or more; got {value!r}.")


def central_differences(total_at: Callable[[np.ndarray], float], x: np.ndarray, step_scale: float) -> np.ndarray:
    """Central differences of a scalar function of x (``total_at``: the point in float64 → the value) w.r.t.
    every element of x, with the relative step ``step_scale·max(1, |x|)``; NaN (skipped) where x is not finite,
    which no step moves."""
    result = np.full(x.shape, np.nan)
    for position in np.ndindex(x.shape):
        if not np.isfinite(x[position]):
            continue
        step = step_scale * max(1.0, float(abs(x[position])))
        shifted = []
        for sign in (1.0, -1.0):
            moved = x.copy()
            moved[position] += sign * step
            shifted.append(total_at(moved))
        result[position] = (shifted[0] - shifted[1]) / (2 * step)
    return result


def output_weights(values: Sequence[np.ndarray | float], seed: int) -> tuple[list[np.ndarray], bool]:
    """Random weights in [0.5, 1.5] for fn's outputs at the point (``values``: each in float64, a non-floating
    one as a stand-in), zero where the output is not finite; and whether any output is not finite."""
    rng = np.random.default_rng(seed)
    weights, any_not_finite = [], False
    for value in values:
        finite = np.isfinite(value)
        any_not_finite |= not np.all(finite)
        weights.append(np.where(finite, rng.uniform(0.5, 1.5, np.shape(value)), 0.0))
    return weights, any_not_finite
