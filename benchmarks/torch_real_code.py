"""python benchmarks/torch_real_code.py: real code's Functions, with their base class changed, as ratios to
torch.autograd.Function in one run.

Five classes in the shape public projects write them, restated here: PyTorch's documented linear layer (two
arguments and a bias, ``needs_input_grad`` guarding each gradient), a straight-through quantizer whose learned
scale is an argument (LSQ's shape: x's gradient passes where x is in range, the scale gets the rounding error's),
a norm guarded at the zero row (``where(r > 0, g / r, 0)``), a sparse projection (sparsemax: sort, cumulative
sum, threshold; the gradient centred on the support) and a linear solve as a custom root (y = A⁻¹b, its gradient
by the adjoint solve). Each is timed as ``torch.autograd.Function`` (the
anchor) and as ``stopgrad_math.torch.Function`` (the same body), for eager value + gradient, an eager call nothing
differentiates, and value + gradient under ``torch.compile(fullgraph=True)``, at a small size and at 256×512, in
``--blocks`` interleaved blocks: a ratio is the median over blocks with its range. Writes
``results/latest-torch-real.md`` (``-gpu`` on a CUDA build with a GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import real_code_report
import torch
import torch_run

import stopgrad_math.torch as sgm

ANCHOR = torch_run.ANCHOR
OURS = "stopgrad_math.torch.Function"
PHASES = ("eager value+grad", "eager, nothing differentiates", "compiled value+grad")
SHAPES = real_code_report.SHAPES


def _linear_forward(ctx, x, weight, bias):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(x, weight, bias)
    return x @ weight.T + bias


def _linear_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, weight, _ = ctx.saved_tensors
    grad_x = grad @ weight if ctx.needs_input_grad[0] else None
    grad_weight = grad.T @ x if ctx.needs_input_grad[1] else None
    grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
    return grad_x, grad_weight, grad_bias


LEVELS = 7.0  # the quantizer's largest level: x / scale is rounded and clipped to [−LEVELS, LEVELS]


def _quantize_forward(ctx, x, scale):  # type: ignore[no-untyped-def]
    ratio = x / scale
    ctx.save_for_backward(ratio)
    return torch.round(ratio).clamp(-LEVELS, LEVELS) * scale


def _quantize_backward(ctx, grad):  # type: ignore[no-untyped-def]
    (ratio,) = ctx.saved_tensors
    inside = (ratio.abs() <= LEVELS).to(grad.dtype)
    error = torch.round(ratio).clamp(-LEVELS, LEVELS) - ratio * inside
    return grad * inside, (grad * error).sum().reshape(1)


def _norm_forward(ctx, x):  # type: ignore[no-untyped-def]
    r = x.norm(dim=1, keepdim=True)
    ctx.save_for_backward(x, r)
    return r


def _norm_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, r = ctx.saved_tensors
    return torch.where(r > 0, grad / r, torch.zeros_like(r)) * x


def _sparsemax_forward(ctx, z):  # type: ignore[no-untyped-def]
    ranked = torch.sort(z, dim=-1, descending=True).values
    ks = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cumulative = ranked.cumsum(-1) - 1
    support = (ranked * ks > cumulative).sum(-1, keepdim=True)
    out = torch.clamp(z - cumulative.gather(-1, support - 1) / support.to(z.dtype), min=0)
    ctx.save_for_backward(out)
    return out


def _sparsemax_backward(ctx, grad):  # type: ignore[no-untyped-def]
    (out,) = ctx.saved_tensors
    support = out > 0
    kept = torch.where(support, grad, 0.0)
    mean = kept.sum(-1, keepdim=True) / support.sum(-1, keepdim=True).to(grad.dtype)
    return torch.where(support, kept - mean, 0.0)


def _solve_forward(ctx, a, b):  # type: ignore[no-untyped-def]
    y = torch.linalg.solve(a, b)
    ctx.save_for_backward(a, y)
    return y


def _solve_backward(ctx, grad):  # type: ignore[no-untyped-def]
    a, y = ctx.saved_tensors
    adjoint = torch.linalg.solve(a.mT, grad)  # the root's implicit gradient: one solve with Aᵀ
    return -adjoint @ y.mT, adjoint


_BODIES = {
    "linear layer": (_linear_forward, _linear_backward),
    "STE quantizer, learned scale": (_quantize_forward, _quantize_backward),
    "safe norm": (_norm_forward, _norm_backward),
    "sparsemax": (_sparsemax_forward, _sparsemax_backward),
    "linear solve, custom root": (_solve_forward, _solve_backward),
}


def classes(case: str) -> dict[str, type]:
    """The case's body as torch.autograd.Function (the anchor) and as stopgrad_math.torch.Function."""
    forward, backward = _BODIES[case]
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return {ANCHOR: type(case.title().replace(" ", ""), (torch.autograd.Function,), dict(methods)),
            OURS: type(case.title().replace(" ", ""), (sgm.Function,), dict(methods))}


def inputs(case: str, shape: tuple[int, int], device: str) -> list[torch.Tensor]:
    rows, width = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=generator)
    if case == "linear layer":
        weight = torch.randn(width, width, generator=generator) / width ** 0.5
        made = [x, weight, torch.randn(width, generator=generator)]
    elif case == "safe norm":
        x[0] = 0.0  # a zero row: the guard's case
        made = [x]
    elif case == "sparsemax":
        made = [x]
    elif case == "linear solve, custom root":  # A well conditioned, of the rows' size; b of the shape
        made = [torch.eye(rows) * rows ** 0.5 + torch.randn(rows, rows, generator=generator) / rows ** 0.5, x]
    else:
        made = [4 * x, torch.tensor([0.5])]
    return [t.to(device) for t in made]


def program(function: type, phase: str, backend: str = "inductor") -> Callable[[list[torch.Tensor]], object]:
    """What a user runs: a call and the gradients of its sum (the call compiled with fullgraph=True: AOTAutograd
    compiles its backward too), or a call alone."""
    if phase == "eager, nothing differentiates":
        return lambda xs: function.apply(*xs)
    apply = torch.compile(function.apply, fullgraph=True, backend=backend) if phase == "compiled value+grad" else (
        function.apply)

    def value_and_grad(xs: list[torch.Tensor]) -> object:
        leaves = [x.detach().requires_grad_() for x in xs]
        return torch.autograd.grad(apply(*leaves).sum(), leaves)

    return value_and_grad


def calls(case: str, shape: tuple[int, int], phase: str, device: str,
          backend: str = "inductor") -> dict[str, Callable[[], object]]:
    """Both classes' programs of a phase on the case's inputs, compiled and warmed up."""
    xs = inputs(case, shape, device)
    torch._dynamo.reset()  # (each class's apply is one code object to Dynamo: a compile per class and size)
    programs = {name: program(function, phase, backend) for name, function in classes(case).items()}
    made = {name: (lambda p=p: p(xs)) for name, p in programs.items()}
    for call in made.values():
        call()
        call()
    return made


def main(argv: list[str] | None = None) -> int:
    parser = real_code_report.options(__doc__, list(_BODIES), PHASES)
    parser.add_argument("--compile-backend", default="inductor")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    on_device = torch.empty(0, device=device)  # what each block synchronizes on
    rows = real_code_report.measured(
        args.cases, {name: SHAPES[name] for name in args.shapes}, args.phases, args.blocks,
        lambda case, shape, phase: calls(case, shape, phase, device, args.compile_backend),
        lambda c: torch_run.block_medians(c, on_device, args.min_time), OURS, ANCHOR)
    text = real_code_report.markdown(f"PyTorch, real code: {OURS} against torch.autograd.Function",
                                     f"Device: {torch_run.device_name(device)}; torch {torch.__version__}", rows)
    return real_code_report.written(args.out, f"latest-torch-real{'-gpu' if device == 'cuda' else ''}.md", text)


if __name__ == "__main__":
    sys.exit(main())
