"""python benchmarks/jax_implicit.py: implicit functions in JAX, ``stopgrad_math.jax``'s against jaxopt's and
optimistix's and autodiff through the unrolled solver, as ratios in one run.

Two problems: ridge regression's solution in its regularization (a root of the objective's gradient, its
Jacobian formed densely; the solver the normal equations, the same for every implementation but optimistix,
whose Newton solver is its own), and a deep-equilibrium fixed point ``z = tanh(z·A + b)`` per row of b (the
solver 60 iterations; the adjoint solve matrix-free, GMRES). Each at a small size and at 256×512, eagerly and
under ``jit``: value + gradient (reverse mode, which jaxopt has) and a JVP (forward mode, which optimistix has and
jaxopt has not), in ``--blocks`` interleaved blocks. Each cell is ours: its time and its ratio to each other
implementation (the median over blocks); jaxopt and optimistix are skipped where they are not installed
(``pip install stopgrad_math[bench]``). Writes ``results/latest-jax-implicit.md``.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax_run
import real_code_report

import stopgrad_math.jax as sgm

OURS = "stopgrad_math.jax"
PHASES = ("eager value+grad", "jit value+grad", "eager jvp", "jit jvp")
CASES = ("ridge regression, dense", "fixed point, GMRES")
ITERATIONS = 60


def _gmres(matvec: Callable[[jax.Array], jax.Array], b: jax.Array) -> jax.Array:
    return jax.scipy.sparse.linalg.gmres(matvec, b, tol=1e-6, restart=20, maxiter=5)[0]


def _problem(case: str, shape: tuple[int, int]) -> tuple[Callable[..., jax.Array], Callable[..., jax.Array],
                                                         jax.Array, Any]:
    """The residual F(z, θ), the solver (init, θ) ↦ z, init and θ."""
    rows, width = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    if case == "ridge regression, dense":
        x, y = jax.random.normal(keys[0], (rows, width)), jax.random.normal(keys[1], (rows,))

        def gradient(w: jax.Array, lam: jax.Array) -> jax.Array:
            return x.T @ (x @ w - y) + lam * w

        def normal_equations(init: jax.Array, lam: jax.Array) -> jax.Array:
            return jnp.linalg.solve(x.T @ x + lam * jnp.eye(width), x.T @ y)

        return gradient, normal_equations, jnp.zeros(width), jnp.asarray(2.0)
    a = 0.3 * jax.random.normal(keys[0], (width, width)) / width ** 0.5

    def layer(z: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.tanh(z @ a + b)

    def iterated(init: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, ITERATIONS, lambda _, z: layer(z, b), init)

    b = jax.random.normal(keys[1], (rows, width))
    return (lambda z, b: layer(z, b) - z), iterated, jnp.zeros((rows, width)), b


def implementations(case: str, shape: tuple[int, int]) -> dict[str, Callable[[Any], jax.Array]]:
    """θ ↦ z, by each implementation that is installed."""
    residual, solver, init, _ = _problem(case, shape)
    solve = _gmres if case == "fixed point, GMRES" else None
    made: dict[str, Callable[[Any], jax.Array]] = {
        OURS: lambda theta: sgm.custom_root(residual, solve)(solver)(init, theta),
        "autodiff, unrolled": lambda theta: solver(init, theta)}
    if importlib.util.find_spec("jaxopt") is not None:
        from jaxopt import implicit_diff
        from jaxopt import linear_solve as jaxopt_solves

        jaxopt_solve = jaxopt_solves.solve_gmres if solve is not None else jaxopt_solves.solve_lu
        made["jaxopt"] = lambda theta: implicit_diff.custom_root(residual, solve=jaxopt_solve)(solver)(init, theta)
    if importlib.util.find_spec("optimistix") is not None:
        import optimistix

        # (tolerances float32 meets: at 1e-6 Newton's steps never end on ridge regression at 256×512)
        method = optimistix.Newton(rtol=1e-4, atol=1e-4) if solve is None else optimistix.FixedPointIteration(
            rtol=1e-4, atol=1e-4)
        if solve is None:
            made["optimistix"] = lambda theta: optimistix.root_find(residual, method, init, args=theta).value
        else:
            import lineax  # the adjoint solve matrix-free as ours (its default forms the Jacobian: 64 GiB at 256×512)

            adjoint = optimistix.ImplicitAdjoint(linear_solver=lineax.GMRES(rtol=1e-6, atol=1e-6, restart=20,
                                                                           max_steps=100))
            made["optimistix"] = lambda theta: optimistix.fixed_point(
                lambda z, b: residual(z, b) + z, method, init, args=theta, max_steps=ITERATIONS * 4,
                adjoint=adjoint).value
    return made


def program(function: Callable[[Any], jax.Array], phase: str) -> Callable[[Any], Any]:
    """The value and the gradient of the solution's sum, or its JVP along ones; eagerly or under jit."""
    if "jvp" in phase:
        made = lambda theta: jax.jvp(function, (theta,), (jnp.ones_like(theta),))  # noqa: E731
    else:
        made = jax.value_and_grad(lambda theta: jnp.sum(function(theta)))
    return jax.jit(made) if phase.startswith("jit") else made


def cell(case: str, size: str, phase: str, blocks: int, min_time: float) -> dict[str, Any]:
    shape = real_code_report.SHAPES[size]
    theta = _problem(case, shape)[3]
    calls = {}
    for name, function in implementations(case, shape).items():
        if name == "jaxopt" and "jvp" in phase:
            continue  # a custom_vjp: no forward mode
        made = program(function, phase)
        calls[name] = lambda made=made: made(theta)
        jax.block_until_ready(calls[name]())
        jax.block_until_ready(calls[name]())
    per_block = [jax_run.block_medians(calls, min_time) for _ in range(blocks)]
    ratios = {name: statistics.median(b[OURS] / b[name] for b in per_block) for name in calls if name != OURS}
    made_cell = {"case": case, "size": size, "phase": phase, "seconds": statistics.median(b[OURS] for b in per_block),
                 "ratios": ratios}
    print(made_cell, flush=True)
    return made_cell


def markdown(cells: list[dict[str, Any]]) -> str:
    title = f"JAX, implicit functions: {OURS} against jaxopt, optimistix and the unrolled solver"
    versions = f"Device: {jax_run.device_name()}; JAX {jax.__version__}"
    return real_code_report.ratio_tables(title, versions, cells, ["jaxopt", "optimistix", "autodiff, unrolled"])


def main(argv: list[str] | None = None) -> int:
    args = real_code_report.options(__doc__, CASES, PHASES).parse_args(argv)
    cells = [cell(case, size, phase, args.blocks, args.min_time)
             for case in args.cases for size in args.shapes for phase in args.phases]
    gpu = jax.devices()[0].platform == "gpu"
    return real_code_report.written(args.out, f"latest-jax-implicit{'-gpu' if gpu else ''}.md", markdown(cells))


if __name__ == "__main__":
    sys.exit(main())
