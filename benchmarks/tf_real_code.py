"""python benchmarks/tf_real_code.py: real code's custom gradients on ``stopgrad_math.custom_gradient``, as ratios to
``tf.custom_gradient`` in one run.

Five rules in the shape public projects write them, restated here, each decorated with ``tf.custom_gradient`` (the
anchor) and with ``stopgrad_math.custom_gradient`` (the same function): a linear layer (x·Wᵀ + b, three
gradients), a straight-through quantizer whose learned scale is an argument (LSQ's shape), a sparse projection
(sparsemax: sort, cumulative sum, threshold; the gradient centred on the support), a norm guarded at the zero row
(``where(r > 0, g / r, 0)``), and a linear solve as a custom root (y = A⁻¹b, its gradient by the adjoint solve).
Each is timed for eager value + gradient (one ``GradientTape``), an eager call with no tape, and value + gradient
under ``tf.function``, at a small size and at 256×512, in ``--blocks`` interleaved blocks: a ratio is the median
over blocks with its range. Writes ``results/latest-tf-real.md``.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import real_code_report
import tensorflow as tf
from run import interleaved_medians

import stopgrad_math as sgm

ANCHOR = "tf.custom_gradient"
OURS = "stopgrad_math.custom_gradient"
PHASES = ("eager value+grad", "eager, no tape", "tf.function value+grad")
SHAPES = real_code_report.SHAPES
LEVELS = 7.0  # the quantizer's largest level: x / scale is rounded and clipped to [−LEVELS, LEVELS]


def _linear(x: tf.Tensor, weight: tf.Tensor, bias: tf.Tensor) -> Any:
    def grad(ct: tf.Tensor) -> Any:
        return ct @ weight, tf.transpose(ct) @ x, tf.reduce_sum(ct, 0)

    return x @ tf.transpose(weight) + bias, grad


def _quantize(x: tf.Tensor, scale: tf.Tensor) -> Any:
    ratio = x / scale
    rounded = tf.clip_by_value(tf.round(ratio), -LEVELS, LEVELS)

    def grad(ct: tf.Tensor) -> Any:
        inside = tf.cast(tf.abs(ratio) <= LEVELS, ct.dtype)
        return ct * inside, tf.reshape(tf.reduce_sum(ct * (rounded - ratio * inside)), [1])

    return rounded * scale, grad


def _sparsemax(z: tf.Tensor) -> Any:
    ranked = tf.sort(z, axis=-1, direction="DESCENDING")
    ks = tf.range(1, tf.shape(z)[-1] + 1, dtype=z.dtype)
    cumulative = tf.cumsum(ranked, axis=-1) - 1
    support = tf.reduce_sum(tf.cast(ranked * ks > cumulative, tf.int32), axis=-1, keepdims=True)
    tau = tf.gather(cumulative, support - 1, batch_dims=1) / tf.cast(support, z.dtype)
    out = tf.maximum(z - tau, 0.0)
    inside = out > 0

    def grad(ct: tf.Tensor) -> Any:
        kept = tf.where(inside, ct, 0.0)
        mean = tf.reduce_sum(kept, -1, keepdims=True) / tf.cast(tf.reduce_sum(tf.cast(inside, tf.int32), -1,
                                                                               keepdims=True), ct.dtype)
        return tf.where(inside, kept - mean, 0.0)

    return out, grad


def _norm(x: tf.Tensor) -> Any:
    r = tf.sqrt(tf.reduce_sum(x * x, axis=1, keepdims=True))

    def grad(ct: tf.Tensor) -> Any:
        return tf.where(r > 0, ct / tf.where(r > 0, r, 1.0), 0.0) * x

    return r, grad


def _solve(a: tf.Tensor, b: tf.Tensor) -> Any:
    y = tf.linalg.solve(a, b)

    def grad(ct: tf.Tensor) -> Any:
        adjoint = tf.linalg.solve(a, ct, adjoint=True)  # the root's implicit gradient: one solve with Aᵀ
        return -adjoint @ tf.transpose(y), adjoint

    return y, grad


RULES: dict[str, Callable[..., Any]] = {
    "linear layer": _linear,
    "STE quantizer, learned scale": _quantize,
    "sparsemax": _sparsemax,
    "safe norm": _norm,
    "linear solve, custom root": _solve,
}


def functions(case: str) -> dict[str, Callable[..., tf.Tensor]]:
    """The case's function decorated by tf.custom_gradient (the anchor) and by stopgrad_math.custom_gradient."""
    return {ANCHOR: tf.custom_gradient(RULES[case]), OURS: sgm.custom_gradient(RULES[case])}


def inputs(case: str, shape: tuple[int, int]) -> list[tf.Tensor]:
    rows, width = shape
    generator = tf.random.Generator.from_seed(0)
    x = generator.normal((rows, width))
    if case == "linear layer":
        return [x, generator.normal((width, width)) / width ** 0.5, generator.normal((width,))]
    if case == "STE quantizer, learned scale":
        return [4 * x, tf.constant([0.5])]
    if case == "safe norm":
        return [tf.concat([tf.zeros((1, width)), x[1:]], 0)]  # a zero row: the guard's case
    if case == "linear solve, custom root":  # A well conditioned, of the rows' size; b of the shape
        return [tf.eye(rows) * rows ** 0.5 + generator.normal((rows, rows)) / rows ** 0.5, x]
    return [x]


def program(function: Callable[..., tf.Tensor], phase: str) -> Callable[..., Any]:
    """What a user runs: the value and the gradients of its sum w.r.t. every argument under one tape, eagerly or
    in a tf.function, or a call alone."""
    if phase == "eager, no tape":
        return function

    def value_and_grad(*xs: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(xs)
            value = tf.reduce_sum(function(*xs))
        return value, tape.gradient(value, xs)

    return tf.function(value_and_grad) if phase == "tf.function value+grad" else value_and_grad


def calls(case: str, shape: tuple[int, int], phase: str) -> dict[str, Callable[[], object]]:
    """The anchor's and the port's programs of a phase on the case's inputs (``interleaved_medians`` warms them
    up)."""
    xs = inputs(case, shape)
    programs = {name: program(f, phase) for name, f in functions(case).items()}
    return {name: (lambda p=p: p(*xs)) for name, p in programs.items()}


def main(argv: list[str] | None = None) -> int:
    args = real_code_report.options(__doc__, list(RULES), PHASES).parse_args(argv)
    rows = real_code_report.measured(args.cases, {name: SHAPES[name] for name in args.shapes}, args.phases,
                                     args.blocks, calls, lambda c: interleaved_medians(c, args.min_time), OURS,
                                     ANCHOR)
    versions = f"Device: CPU: {platform.machine()}, {os.cpu_count()} threads; TensorFlow {tf.__version__}"
    text = real_code_report.markdown(f"TensorFlow, real code: {OURS} against {ANCHOR}", versions, rows)
    return real_code_report.written(args.out, "latest-tf-real.md", text)


if __name__ == "__main__":
    sys.exit(main())
