"""python benchmarks/torch_implicit.py: implicit functions in PyTorch, ``stopgrad_math.torch``'s against
torchopt's and autodiff through the unrolled solver, as ratios in one run.

Ridge regression's solution in its regularization (a root of the objective's gradient; the solver the normal
equations, the same for every implementation; the adjoint solve dense for ours and by torchopt's ``solve_inv``),
at a small size and at 256×512: eager value + gradient (reverse mode, which torchopt has), eager forward mode
(``forward_ad``, which torchopt has not) and value + gradient under ``torch.compile(fullgraph=True)`` (which
torchopt's Function is not traced by: n/a), in ``--blocks`` interleaved blocks. Each cell is ours: its time and
its ratio to each other implementation (the median over blocks); torchopt is skipped where it is not installed
(``pip install stopgrad_math[bench]``). Writes ``results/latest-torch-implicit.md``.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections.abc import Callable
from typing import Any

import real_code_report
import torch
import torch.autograd.forward_ad as forward_ad
import torch_run

import stopgrad_math.torch as sgm

OURS = "stopgrad_math.torch"
PHASES = ("eager value+grad", "eager jvp", "compiled value+grad")
CASES = ("ridge regression, dense",)


def _problem(shape: tuple[int, int]) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor],
                                              torch.Tensor, torch.Tensor]:
    """The residual F(w, λ), the solver (init, λ) ↦ w, init and λ."""
    rows, width = shape
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, width, generator=generator), torch.randn(rows, generator=generator)

    def gradient(w: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        return x.T @ (x @ w - y) + lam * w

    def normal_equations(init: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve(x.T @ x + lam * torch.eye(width), x.T @ y)

    return gradient, normal_equations, torch.zeros(width), torch.tensor(2.0)


def implementations(shape: tuple[int, int]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """λ ↦ w, by each implementation that is installed."""
    residual, solver, init, _ = _problem(shape)
    ours = sgm.custom_root(residual)(solver)
    made: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        OURS: lambda lam: ours(init, lam), "autodiff, unrolled": lambda lam: solver(init, lam)}
    if importlib.util.find_spec("torchopt") is not None:
        import torchopt

        theirs = torchopt.diff.implicit.custom_root(residual, argnums=1, solve=torchopt.linear_solve.solve_inv())(
            solver)
        made["torchopt"] = lambda lam: theirs(init, lam)
    return made


def program(function: Callable[[torch.Tensor], torch.Tensor], phase: str) -> Callable[[torch.Tensor], Any]:
    """The value and the gradient of the solution's sum, or its JVP along one; eagerly or compiled."""
    if phase == "eager jvp":
        def jvp(lam: torch.Tensor) -> torch.Tensor:
            with forward_ad.dual_level():
                return forward_ad.unpack_dual(function(forward_ad.make_dual(lam, torch.ones_like(lam)))).tangent
        return jvp

    def value_and_grad(lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        live = lam.detach().requires_grad_()
        value = function(live).sum()
        return value, torch.autograd.grad(value, live)[0]

    if phase == "compiled value+grad":
        compiled = torch.compile(lambda lam: function(lam).sum(), fullgraph=True)

        def compiled_value_and_grad(lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            live = lam.detach().requires_grad_()
            value = compiled(live)
            return value, torch.autograd.grad(value, live)[0]
        return compiled_value_and_grad
    return value_and_grad


def cell(size: str, phase: str, blocks: int, min_time: float) -> dict[str, Any]:
    shape = real_code_report.SHAPES[size]
    lam = _problem(shape)[3]
    calls = {}
    for name, function in implementations(shape).items():
        if name == "torchopt" and phase != "eager value+grad":
            continue  # an autograd.Function without jvp, which Dynamo does not trace whole
        made = program(function, phase)
        calls[name] = lambda made=made: made(lam)
        calls[name]()
        calls[name]()
    per_block = [torch_run.block_medians(calls, lam, min_time) for _ in range(blocks)]
    ratios = {name: statistics.median(b[OURS] / b[name] for b in per_block) for name in calls if name != OURS}
    made_cell = {"case": CASES[0], "size": size, "phase": phase,
                 "seconds": statistics.median(b[OURS] for b in per_block), "ratios": ratios}
    print(made_cell, flush=True)
    return made_cell


def markdown(cells: list[dict[str, Any]]) -> str:
    title = f"PyTorch, implicit functions: {OURS} against torchopt and the unrolled solver"
    versions = f"Device: {torch_run.device_name('cpu')}; torch {torch.__version__}"
    return real_code_report.ratio_tables(title, versions, cells, ["torchopt", "autodiff, unrolled"])


def main(argv: list[str] | None = None) -> int:
    args = real_code_report.options(__doc__, CASES, PHASES).parse_args(argv)
    cells = [cell(size, phase, args.blocks, args.min_time) for size in args.shapes for phase in args.phases]
    return real_code_report.written(args.out, "latest-torch-implicit.md", markdown(cells))


if __name__ == "__main__":
    sys.exit(main())
