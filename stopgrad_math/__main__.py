"""python -m stopgrad_math: the log1pexp story, one table for each framework that is installed.

log1pexp(x) = log(1 + exp(x)) written naively overflows for x ≳ 88.7 in
float32: its value becomes inf and its autodiff gradient exp(x) / (1 + exp(x))
becomes inf / inf = NaN, although the true gradient is sigmoid(x) = 1.0. With
stopgrad_math the value comes from a stable formula and the gradient is
sigmoid(x), embedded with the stop-gradient identity, in each framework's
namespace.

Exits with status 1 if any stopgrad_math gradient or value differs from the
exact answer (computed in float64 with NumPy and rounded to float32), and with
status 2 if no framework is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

POINTS = (-20.0, 0.0, 20.0, 88.0, 100.0, 1000.0)

Columns = dict[str, tuple[np.ndarray, np.ndarray]]  # {column: (values, gradients)}


def exact(points: tuple[float, ...] = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """softplus and sigmoid in float64, rounded to float32."""
    x = np.array(points, np.float64)
    return np.logaddexp(0.0, x).astype(np.float32), (1 / (1 + np.exp(-x))).astype(np.float32)


def tensorflow_columns(points: tuple[float, ...] = POINTS) -> Columns:
    """The naive formula and ``stopgrad_math.custom_gradient`` under ``tf.GradientTape``."""
    import tensorflow as tf

    import stopgrad_math as sgm

    def naive(x: tf.Tensor) -> tf.Tensor:
        return tf.math.log(1.0 + tf.math.exp(x))

    def stable(x: tf.Tensor) -> tf.Tensor:
        # log(1 + exp(x)) = max(x, 0) + log1p(exp(−|x|)), which never overflows.
        value = tf.maximum(x, 0.0) + tf.math.log1p(tf.math.exp(-tf.abs(x)))
        return sgm.custom_gradient(value, tf.math.sigmoid(x), x)

    def value_and_gradient(fn: Callable[[tf.Tensor], tf.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        x = tf.constant(points, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return y.numpy(), tape.gradient(y, x).numpy()

    return {"naive": value_and_gradient(naive), "stopgrad_math": value_and_gradient(stable)}


def jax_columns(points: tuple[float, ...] = POINTS) -> Columns:
    """The naive formula and ``stopgrad_math.jax.custom_gradient`` under ``jax.vmap(jax.value_and_grad)``."""
    import jax
    import jax.numpy as jnp

    import stopgrad_math.jax as sgm

    def naive(x: jax.Array) -> jax.Array:
        return jnp.log(1.0 + jnp.exp(x))

    def stable(x: jax.Array) -> Any:  # custom_gradient's type covers its decorator form too
        value = jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))
        return sgm.custom_gradient(value, jax.nn.sigmoid(x), x)

    def value_and_gradient(fn: Callable[[jax.Array], Any]) -> tuple[np.ndarray, np.ndarray]:
        values, gradients = jax.vmap(jax.value_and_grad(fn))(jnp.array(points, jnp.float32))
        return np.asarray(values), np.asarray(gradients)

    return {"naive": value_and_gradient(naive), "stopgrad_math": value_and_gradient(stable)}


def torch_columns(points: tuple[float, ...] = POINTS) -> Columns:
    """The naive formula and ``stopgrad_math.torch.custom_gradient`` under ``torch.func.vmap(torch.func.grad)``."""
    import torch

    import stopgrad_math.torch as sgm

    def naive(x: torch.Tensor) -> torch.Tensor:
        return torch.log(1.0 + torch.exp(x))

    def stable(x: torch.Tensor) -> Any:  # custom_gradient's type covers its decorator form too
        value = torch.clamp(x, min=0.0) + torch.log1p(torch.exp(-torch.abs(x)))
        return sgm.custom_gradient(value, torch.sigmoid(x), x)

    def value_and_gradient(fn: Callable[[torch.Tensor], Any]) -> tuple[np.ndarray, np.ndarray]:
        x = torch.tensor(points, dtype=torch.float32)
        gradients = torch.func.vmap(torch.func.grad(fn))(x)
        return fn(x).numpy(), gradients.numpy()

    return {"naive": value_and_gradient(naive), "stopgrad_math": value_and_gradient(stable)}


# Each framework: the module that tells whether it is installed, its namespace, and its columns.
FRAMEWORKS: dict[str, tuple[str, str, Callable[[tuple[float, ...]], Columns]]] = {
    "TensorFlow": ("tensorflow", "stopgrad_math", tensorflow_columns),
    "JAX": ("jax", "stopgrad_math.jax", jax_columns),
    "PyTorch": ("torch", "stopgrad_math.torch", torch_columns),
}


def installed() -> list[str]:
    """The frameworks of ``FRAMEWORKS`` that can be imported here."""
    return [name for name, (module, _, _) in FRAMEWORKS.items() if importlib.util.find_spec(module) is not None]


def render(title: str, columns: Columns, points: tuple[float, ...] = POINTS) -> str:
    header = f"{'x':>8} |" + "".join(f" {name + ' value':>20} {name + ' grad':>19} |" for name in columns)
    lines = [title, header, "-" * len(header)]
    for i, x in enumerate(points):
        cells = "".join(f" {v[i]:>20.8g} {g[i]:>19.8g} |" for v, g in columns.values())
        lines.append(f"{x:>8g} |{cells}")
    return "\n".join(lines)


def wrong_points(columns: Columns, points: tuple[float, ...] = POINTS) -> list[float]:
    """The x at which stopgrad_math's value or gradient is not the exact one, bit for bit."""
    ours, truth = columns["stopgrad_math"], columns["exact"]
    return [x for i, x in enumerate(points) if ours[0][i] != truth[0][i] or ours[1][i] != truth[1][i]]


def main() -> int:
    frameworks = installed()
    if not frameworks:
        print("No framework is installed: pip install 'stopgrad_math[tf]', 'stopgrad_math[jax]' or "
              "'stopgrad_math[torch]'.")
        return 2
    failed = []
    for name in frameworks:
        _, namespace, columns_of = FRAMEWORKS[name]
        columns = {**columns_of(POINTS), "exact": exact(POINTS)}
        print(render(f"{name} ({namespace}): log1pexp(x) = log(1 + exp(x)), float32, value and gradient", columns))
        wrong = wrong_points(columns)
        if wrong:
            print(f"FAIL: {namespace} differs from the exact answer at x = {wrong}\n")
            failed.append(name)
        else:
            print(f"OK: {namespace} matches the exact value and gradient at every x; the naive gradient is NaN at "
                  "x = 100.\n")
    missing = [name for name in FRAMEWORKS if name not in frameworks]
    if missing:
        print(f"Not installed, so not shown: {', '.join(missing)}.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
