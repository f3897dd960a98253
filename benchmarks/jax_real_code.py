"""python benchmarks/jax_real_code.py: real code's custom VJPs on ``stopgrad_math.jax.custom_vjp``, as ratios to
``jax.custom_vjp`` in one run.

Six rules in the shape public projects write them, restated here, each as ``jax.custom_vjp`` (the anchor) and as
``stopgrad_math.jax.custom_vjp`` with the same ``fwd`` and ``bwd``: a linear layer (x·Wᵀ + b, three cotangents), a
straight-through quantizer whose learned scale is an argument (LSQ's shape), a sparse projection (sparsemax: sort,
cumulative sum, threshold; the gradient centred on the support), a norm guarded at the zero row
(``where(r > 0, g / r, 0)``), a linear solve as a custom root (y = A⁻¹b, its gradient by the adjoint solve), and a
fixed point whose adjoint is unrolled in a ``scan`` in the bwd (as OTT's Sinkhorn).
Each is timed for eager value + gradient, an eager call (no derivative asked) and value + gradient under ``jit``,
at a small size and at 256×512, in ``--blocks`` interleaved blocks: a ratio is the median over blocks with its
range. Writes ``results/latest-jax-real.md`` (``-gpu`` on a GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax_run
import real_code_report

import stopgrad_math.jax as sgm

ANCHOR = "jax.custom_vjp"
OURS = "stopgrad_math.jax.custom_vjp"
PHASES = ("eager value+grad", "eager, no derivative", "jit value+grad")
SHAPES = real_code_report.SHAPES
LEVELS = 7.0  # the quantizer's largest level: x / scale is rounded and clipped to [−LEVELS, LEVELS]


def _linear_fwd(x: jax.Array, weight: jax.Array, bias: jax.Array) -> tuple[jax.Array, Any]:
    return x @ weight.T + bias, (x, weight)


def _linear_bwd(residuals: Any, ct: jax.Array) -> tuple[jax.Array, ...]:
    x, weight = residuals
    return ct @ weight, ct.T @ x, ct.sum(0)


def _quantize_fwd(x: jax.Array, scale: jax.Array) -> tuple[jax.Array, Any]:
    ratio = x / scale
    return jnp.clip(jnp.round(ratio), -LEVELS, LEVELS) * scale, ratio


def _quantize_bwd(ratio: jax.Array, ct: jax.Array) -> tuple[jax.Array, ...]:
    inside = (jnp.abs(ratio) <= LEVELS).astype(ct.dtype)
    error = jnp.clip(jnp.round(ratio), -LEVELS, LEVELS) - ratio * inside
    return ct * inside, (ct * error).sum().reshape(1)


def _sparsemax(z: jax.Array) -> jax.Array:
    ranked = -jnp.sort(-z, axis=-1)
    ks = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumulative = jnp.cumsum(ranked, axis=-1) - 1
    support = jnp.sum(ranked * ks > cumulative, axis=-1, keepdims=True)
    tau = jnp.take_along_axis(cumulative, support - 1, axis=-1) / support.astype(z.dtype)
    return jnp.maximum(z - tau, 0.0)


def _sparsemax_fwd(z: jax.Array) -> tuple[jax.Array, Any]:
    out = _sparsemax(z)
    return out, out


def _sparsemax_bwd(out: jax.Array, ct: jax.Array) -> tuple[jax.Array]:
    support = out > 0
    kept = jnp.where(support, ct, 0.0)
    mean = kept.sum(-1, keepdims=True) / support.sum(-1, keepdims=True).astype(ct.dtype)
    return (jnp.where(support, kept - mean, 0.0),)


def _norm_fwd(x: jax.Array) -> tuple[jax.Array, Any]:
    r = jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True))
    return r, (x, r)


def _norm_bwd(residuals: Any, ct: jax.Array) -> tuple[jax.Array]:
    x, r = residuals
    return (jnp.where(r > 0, ct / jnp.where(r > 0, r, 1.0), 0.0) * x,)


def _solve_fwd(a: jax.Array, b: jax.Array) -> tuple[jax.Array, Any]:
    y = jnp.linalg.solve(a, b)
    return y, (a, y)


def _solve_bwd(residuals: Any, ct: jax.Array) -> tuple[jax.Array, ...]:
    a, y = residuals
    adjoint = jnp.linalg.solve(a.T, ct)  # the root's implicit gradient: one solve with Aᵀ
    return -adjoint @ y.T, adjoint


ITERATIONS = 30  # of the fixed point's forward loop, and of its adjoint's unrolled scan


def _fixed_point(a: jax.Array, b: jax.Array) -> jax.Array:
    """x = tanh(x·A + b) for each row of b, by iteration (A small enough that it contracts)."""
    return jax.lax.fori_loop(0, ITERATIONS, lambda _, x: jnp.tanh(x @ a + b), jnp.zeros_like(b))


def _fixed_point_fwd(a: jax.Array, b: jax.Array) -> tuple[jax.Array, Any]:
    x = _fixed_point(a, b)
    return x, (a, x)


def _fixed_point_bwd(residuals: Any, ct: jax.Array) -> tuple[jax.Array, ...]:
    a, x = residuals
    slope = 1 - x * x  # tanh′ at the fixed point

    def step(u: jax.Array, _: None) -> tuple[jax.Array, None]:  # u = ct + (slope·u)·Aᵀ, unrolled as OTT's Sinkhorn
        return ct + (slope * u) @ a.T, None

    u = jax.lax.scan(step, ct, None, length=ITERATIONS)[0]
    return x.T @ (slope * u), slope * u


RULES = {  # the primal, fwd and bwd
    "linear layer": (lambda x, w, b: _linear_fwd(x, w, b)[0], _linear_fwd, _linear_bwd),
    "STE quantizer, learned scale": (lambda x, s: _quantize_fwd(x, s)[0], _quantize_fwd, _quantize_bwd),
    "sparsemax": (_sparsemax, _sparsemax_fwd, _sparsemax_bwd),
    "safe norm": (lambda x: _norm_fwd(x)[0], _norm_fwd, _norm_bwd),
    "linear solve, custom root": (jnp.linalg.solve, _solve_fwd, _solve_bwd),
    "fixed point, adjoint by scan": (_fixed_point, _fixed_point_fwd, _fixed_point_bwd),
}


def functions(case: str) -> dict[str, Callable[..., jax.Array]]:
    """The case's rule as jax.custom_vjp (the anchor) and as stopgrad_math.jax.custom_vjp."""
    primal, fwd, bwd = RULES[case]
    made = {}
    for name, mechanism in ((ANCHOR, jax.custom_vjp), (OURS, sgm.custom_vjp)):
        function = mechanism(primal)
        function.defvjp(fwd, bwd)
        made[name] = function
    return made


def inputs(case: str, shape: tuple[int, int]) -> list[jax.Array]:
    rows, width = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (rows, width))
    if case == "linear layer":
        return [x, jax.random.normal(keys[1], (width, width)) / width ** 0.5, jax.random.normal(keys[2], (width,))]
    if case == "STE quantizer, learned scale":
        return [4 * x, jnp.array([0.5])]
    if case == "safe norm":
        return [x.at[0].set(0.0)]  # a zero row: the guard's case
    if case == "linear solve, custom root":  # A well conditioned, of the rows' size; b of the shape
        return [jnp.eye(rows) * rows ** 0.5 + jax.random.normal(keys[1], (rows, rows)) / rows ** 0.5, x]
    if case == "fixed point, adjoint by scan":  # A of norm about 0.3: the iteration contracts
        return [0.3 * jax.random.normal(keys[1], (width, width)) / width ** 0.5, x]
    return [x]


def program(function: Callable[..., jax.Array], phase: str, count: int) -> Callable[..., Any]:
    """What a user runs: the value and the gradients of its sum w.r.t. every argument, eagerly or under jit, or
    a call alone."""
    if phase == "eager, no derivative":
        return function
    value_and_grad = jax.value_and_grad(lambda *xs: jnp.sum(function(*xs)), argnums=tuple(range(count)))
    return jax.jit(value_and_grad) if phase == "jit value+grad" else value_and_grad


def calls(case: str, shape: tuple[int, int], phase: str) -> dict[str, Callable[[], object]]:
    """The anchor's and the port's programs of a phase on the case's inputs, compiled and warmed up."""
    xs = inputs(case, shape)
    programs = {name: program(f, phase, len(xs)) for name, f in functions(case).items()}
    made = {name: (lambda p=p: p(*xs)) for name, p in programs.items()}
    for call in made.values():
        jax.block_until_ready(call())
        jax.block_until_ready(call())
    return made


def main(argv: list[str] | None = None) -> int:
    args = real_code_report.options(__doc__, list(RULES), PHASES).parse_args(argv)
    rows = real_code_report.measured(args.cases, {name: SHAPES[name] for name in args.shapes}, args.phases,
                                     args.blocks, calls, lambda c: jax_run.block_medians(c, args.min_time), OURS,
                                     ANCHOR)
    text = real_code_report.markdown(f"JAX, real code: {OURS} against {ANCHOR}",
                                     f"Device: {jax_run.device_name()}; JAX {jax.__version__}", rows)
    gpu = jax.devices()[0].platform == "gpu"
    return real_code_report.written(args.out, f"latest-jax-real{'-gpu' if gpu else ''}.md", text)


if __name__ == "__main__":
    sys.exit(main())
