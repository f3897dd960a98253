"""python -m stopgrad_math: the log1pexp story in one table.

log1pexp(x) = log(1 + exp(x)) written naively overflows for x ≳ 88.7 in
float32: its value becomes inf and its autodiff gradient exp(x) / (1 + exp(x))
becomes inf / inf = NaN, although the true gradient is sigmoid(x) = 1.0. With
stopgrad_math the value comes from a stable formula and the gradient is
sigmoid(x), embedded with the stop-gradient identity.

Exits with status 1 if any stopgrad_math gradient or value differs from the
exact answer (computed in float64 and rounded to float32).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import stopgrad_math

POINTS = (-20.0, 0.0, 20.0, 88.0, 100.0, 1000.0)


def naive_log1pexp(x: tf.Tensor) -> tf.Tensor:
    return tf.math.log(1.0 + tf.math.exp(x))


def stable_log1pexp(x: tf.Tensor) -> tf.Tensor:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(−|x|)), which never overflows.
    value = tf.maximum(x, 0.0) + tf.math.log1p(tf.math.exp(-tf.abs(x)))
    return stopgrad_math.custom_gradient(value, tf.math.sigmoid(x), x)


def value_and_gradient(fn: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor) -> tuple[np.ndarray, np.ndarray]:
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x).numpy()


def table(points: tuple[float, ...] = POINTS) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Returns {column: (values, gradients)} for naive, stopgrad_math and exact."""
    x = tf.constant(points, tf.float32)
    x64 = tf.constant(points, tf.float64)
    exact = (
        tf.math.softplus(x64).numpy().astype(np.float32),
        tf.math.sigmoid(x64).numpy().astype(np.float32),
    )
    return {
        "naive": value_and_gradient(naive_log1pexp, x),
        "stopgrad_math": value_and_gradient(stable_log1pexp, x),
        "exact": exact,
    }


def render(columns: dict[str, tuple[np.ndarray, np.ndarray]], points: tuple[float, ...] = POINTS) -> str:
    header = f"{'x':>8} |" + "".join(f" {name + ' value':>20} {name + ' grad':>19} |" for name in columns)
    lines = ["log1pexp(x) = log(1 + exp(x)), float32: value and gradient", header, "-" * len(header)]
    for i, x in enumerate(points):
        cells = "".join(f" {v[i]:>20.8g} {g[i]:>19.8g} |" for v, g in columns.values())
        lines.append(f"{x:>8g} |{cells}")
    return "\n".join(lines)


def main() -> int:
    columns = table()
    print(render(columns))
    ours, exact = columns["stopgrad_math"], columns["exact"]
    wrong = [x for i, x in enumerate(POINTS) if ours[0][i] != exact[0][i] or ours[1][i] != exact[1][i]]
    if wrong:
        print(f"\nFAIL: stopgrad_math differs from the exact answer at x = {wrong}")
        return 1
    print("\nOK: stopgrad_math matches the exact value and gradient at every x; the naive gradient is NaN at x = 100.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
