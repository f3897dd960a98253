"""python benchmarks/torch_run.py: the PyTorch rows of the speed suite, as ratios to torch.autograd.Function in one
run.

log1pexp, value + gradient (``backward``) eagerly and under
``torch.compile(fullgraph=True)``, and the JVP (``forward_ad``) eagerly, for
the identity form against ``torch.autograd.Function`` (the anchor; with a
``jvp`` for forward mode, which then cannot be compiled), the decorator form
(its VJP alone; compiled, its proof made once, as Dynamo traces it) and plain
autodiff of ``softplus`` (the floor); and each one's value alone where
nothing differentiates, beside f alone; and under ``torch.func`` (``grad``,
``jvp``, ``vmap(grad)`` over a batch of 64 rows, ``jacfwd`` of 16 elements),
the anchor there with ``setup_context``, a ``jvp`` and a generated vmap rule. Then a training step of a small MLP
with the function as its activation (eager, compiled, inference) and the
first compiled call of that step (each in a process of its own, with an
empty kernel cache). Each cell is timed in ``--blocks``
blocks; within a block the implementations run round-robin and each block gives a median per
implementation, so a ratio is the median over blocks with its range, the
run-to-run noise. Imports PyTorch, never TensorFlow or JAX: a machine with a
CUDA build runs it on its GPU (``results/latest-torch-gpu.md``); elsewhere
``results/latest-torch.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.autograd.forward_ad as forward_ad

import stopgrad_math.torch as sgm

ANCHOR = "autograd.Function (anchor)"
NOTHING = "eager value, nothing differentiates"
FUNC_GRAD, FUNC_JVP, VMAP_GRAD, JACFWD = ("torch.func.grad", "torch.func.jvp", "vmap(grad), a batch of 64",
                                          "jacfwd, 16 elements")
TRANSFORMS = (FUNC_GRAD, FUNC_JVP, VMAP_GRAD, JACFWD)
PHASES = ("eager value+grad", "compiled value+grad", "eager jvp", NOTHING, *TRANSFORMS)
JACOBIAN_SIZE = 16  # jacfwd's n: its cost grows as n², one size is timed
BATCH = 64  # vmap(grad)'s batch: x of n elements as 64 rows (n rounded down to a multiple of 64)
F_ALONE = "f alone (no gradient machinery)"


def _value(x: torch.Tensor) -> torch.Tensor:
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


def _backward(ctx, grad):  # type: ignore[no-untyped-def]  # both anchors' rule: σ(x)·cotangent
    (x,) = ctx.saved_tensors
    return grad * torch.sigmoid(x)


class _Log1pexp(torch.autograd.Function):
    """The anchor: forward, backward and a jvp, as PyTorch's documentation writes them."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return _value(x)

    backward = staticmethod(_backward)

    @staticmethod
    def jvp(ctx, tangent):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        return tangent * torch.sigmoid(x)


class _Log1pexpNoJvp(torch.autograd.Function):
    """The anchor under torch.compile, which refuses a Function with a jvp: forward and backward alone."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        return _value(x)

    backward = staticmethod(_backward)


class _Log1pexpFace(sgm.Function):
    """The compiled anchor's class with its base changed to stopgrad_math.torch.Function (issue 55): the same
    forward and backward, and no jvp to write."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        return _value(x)

    backward = staticmethod(_backward)


class _Log1pexpFunctorch(torch.autograd.Function):
    """The anchor under torch.func, which asks of a Function every rule it uses: ``setup_context``, a ``jvp``, and a
    vmap rule (generated from the forward's ops)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):  # type: ignore[no-untyped-def, override]
        return _value(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    backward = staticmethod(_backward)
    jvp = staticmethod(_Log1pexp.jvp)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return sgm.custom_gradient(_value(x), torch.sigmoid(x), x)  # type: ignore[return-value]


@sgm.custom_gradient
def _decorated(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    return _value(x), lambda ct: ct * torch.sigmoid(x)


IMPLEMENTATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    ANCHOR: _Log1pexp.apply,
    "identity form": _identity,
    "decorator form": _decorated,
    "decorator form, order=2": sgm.custom_gradient(order=2)(_decorated.undecorated),  # J moves with x
    "stopgrad_math.torch.Function": _Log1pexpFace.apply,
    "plain autodiff (floor)": torch.nn.functional.softplus,
}
EXTRA: dict[str, dict[str, Callable[[torch.Tensor], torch.Tensor]]] = {NOTHING: {F_ALONE: _value}}
"""Rows of one phase only: where nothing differentiates, f as the decorated function computes it, the floor."""


def implementations(phase: str) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    return {**IMPLEMENTATIONS, **EXTRA.get(phase, {})}


def _value_and_grad(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], object]:
    def run(x: torch.Tensor) -> object:
        x = x.detach().requires_grad_(True)
        value = fn(x).sum()
        (grad,) = torch.autograd.grad(value, x)
        return value.detach(), grad

    return run


def _jvp(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], object]:
    def run(x: torch.Tensor) -> object:
        with forward_ad.dual_level():
            out = fn(forward_ad.make_dual(x, torch.ones_like(x)))
            return forward_ad.unpack_dual(out)

    return run


def _transformed(fn: Callable[[torch.Tensor], torch.Tensor], phase: str) -> Callable[[torch.Tensor], object]:
    """A torch.func program: the gradient of sum(fn), the JVP along ones, per-row gradients of ``BATCH`` rows, or
    the Jacobian by forward mode."""
    def total(x: torch.Tensor) -> torch.Tensor:
        return fn(x).sum()

    if phase == FUNC_GRAD:
        return lambda x: (torch.func.grad(total)(x),)
    if phase == FUNC_JVP:
        return lambda x: torch.func.jvp(fn, (x,), (torch.ones_like(x),))
    if phase == VMAP_GRAD:
        return lambda x: (torch.func.vmap(torch.func.grad(total))(x[:x.numel() // BATCH * BATCH].reshape(BATCH, -1)),)
    return lambda x: (torch.func.jacfwd(fn)(x),)


def programs(name: str, phase: str, backend: str = "inductor") -> Callable[[torch.Tensor], object]:
    """The program of a phase: value + gradient of sum(fn), fn eager or compiled (AOTAutograd compiles its backward
    too; torch.autograd.grad itself is not traced); the JVP along ones; fn's value, x not requiring grad; or a
    torch.func transform of fn (``_transformed``), the anchor there with every rule torch.func asks for."""
    fn = implementations(phase)[name]
    if phase in TRANSFORMS:
        return _transformed(_Log1pexpFunctorch.apply if name == ANCHOR else fn, phase)
    if phase == NOTHING:
        return lambda x: (fn(x),)
    if phase == "eager jvp":
        return _jvp(fn)
    if phase == "eager value+grad":
        return _value_and_grad(fn)
    return _value_and_grad(torch.compile(_Log1pexpNoJvp.apply if name == ANCHOR else fn, fullgraph=True,
                                         backend=backend))


def _synchronize(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize()


def block_medians(calls: dict[str, Callable[[], object]], x: torch.Tensor, min_time: float,
                  rounds: int = 7) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    count = 0
    while count < rounds or sum(map(sum, times.values())) < min_time * len(calls):
        for name, call in calls.items():
            _synchronize(x)
            start = time.perf_counter()
            call()
            _synchronize(x)
            times[name].append(time.perf_counter() - start)
        count += 1
    return {name: statistics.median(values) for name, values in times.items()}


def run_cell(n: int, phase: str, blocks: int, min_time: float, device: str, backend: str = "inductor") -> list[dict]:
    x = torch.linspace(-20.0, 100.0, n, dtype=torch.float32, device=device)
    return _timed_rows({name: programs(name, phase, backend) for name in implementations(phase)}, x, n, phase,
                       blocks, min_time)


def _timed_rows(programs_of: dict[str, Callable[[torch.Tensor], object]], x: torch.Tensor, n: int, phase: str,
                blocks: int, min_time: float, rounds: int = 7) -> list[dict]:
    """Each program on x, compiled and warmed up by two calls, then timed in ``blocks`` blocks: a row apiece."""
    calls = {name: (lambda p=p: p(x)) for name, p in programs_of.items()}
    for call in calls.values():
        call()
        call()
    per_block = [block_medians(calls, x, min_time, rounds) for _ in range(blocks)]
    return [_row(n, phase, name, per_block) for name in calls]


# ---------------------------------------------------------------- a training step, and the first compile

STEPS = ("MLP step, eager", "MLP step, compiled", "MLP inference, eager")
FIRST_COMPILE = "MLP step, first compiled call"


def _mlp(activation: Callable[[torch.Tensor], torch.Tensor], width: int,
         device: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.Tensor]]:
    """Three linear layers of ``width``, ``activation`` after each: the function as a new user's activation."""
    generator = torch.Generator().manual_seed(0)
    weights = [(torch.randn(width, width, generator=generator) / width**0.5).to(device).requires_grad_(True)
               for _ in range(3)]

    def forward(x: torch.Tensor) -> torch.Tensor:
        for w in weights:
            x = activation(x @ w)
        return x

    return forward, weights


def step_programs(name: str, phase: str, width: int, device: str,
                  backend: str = "inductor") -> Callable[[torch.Tensor], object]:
    """A step: the loss and its gradient w.r.t. the weights (eager, or the forward compiled); or the forward
    alone without grad (inference)."""
    forward, weights = _mlp(_Log1pexpNoJvp.apply if name == ANCHOR else IMPLEMENTATIONS[name], width, device)
    if phase == "MLP inference, eager":
        def infer(x: torch.Tensor) -> object:
            with torch.no_grad():
                return forward(x)
        return infer
    if phase == "MLP step, compiled":
        forward = torch.compile(forward, fullgraph=True, backend=backend)

    def step(x: torch.Tensor) -> object:
        loss = forward(x).square().mean()
        return loss.detach(), torch.autograd.grad(loss, weights)

    return step


def step_cell(phase: str, batch: int, width: int, blocks: int, min_time: float, device: str,
              backend: str = "inductor") -> list[dict]:
    x = torch.linspace(-3.0, 3.0, batch * width, device=device).reshape(batch, width)
    return _timed_rows({name: step_programs(name, phase, width, device, backend) for name in IMPLEMENTATIONS}, x,
                       batch * width, phase, blocks, min_time, rounds=3)


def first_compile_seconds(name: str, batch: int, width: int, device: str, backend: str) -> float:
    """Seconds of the first call of ``name``'s compiled step, in this process: the compiler's own start-up paid
    first (a tiny function compiled), then a fresh Dynamo with Inductor's and AOTAutograd's graph caches off."""
    torch.compile(lambda t: (t * 2.0).sin(), fullgraph=True, backend=backend)(torch.ones(3, device=device))
    torch._dynamo.reset()
    x = torch.linspace(-3.0, 3.0, batch * width, device=device).reshape(batch, width)
    caches = {"fx_graph_cache": False, "autotune_local_cache": False}  # Inductor's compiled graphs, kept on disk
    caches = {k: v for k, v in caches.items() if hasattr(torch._inductor.config, k)}
    step = step_programs(name, "MLP step, compiled", width, device, backend)
    with torch._inductor.config.patch(caches), torch._functorch.config.patch(enable_autograd_cache=False):
        start = time.perf_counter()
        step(x)
        _synchronize(x)
        return time.perf_counter() - start


def first_compile_rows(batch: int, width: int, device: str, rounds: int, backend: str) -> list[dict]:
    """The first compiled call of each implementation's step, each in a process of its own with an empty
    Inductor cache directory, so that no implementation finds kernels another compiled, or a run before (a
    user's first compile of a new model finds none); ``rounds`` rounds, implementations in turn."""
    per_round = []
    for _ in range(rounds):
        seconds = {}
        for name in IMPLEMENTATIONS:
            with tempfile.TemporaryDirectory() as cache:
                command = [sys.executable, __file__, "--first-compile", name, "--batch", str(batch), "--width",
                           str(width), "--compile-backend", backend]
                result = subprocess.run(command, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                                        capture_output=True, text=True, check=True)
            seconds[name] = float(result.stdout.strip().splitlines()[-1])
        per_round.append(seconds)
    return [_row(batch * width, FIRST_COMPILE, name, per_round) for name in IMPLEMENTATIONS]


def _row(n: int, phase: str, name: str, per_block: list[dict[str, float]]) -> dict:
    ratios = [block[name] / block[ANCHOR] for block in per_block]
    row = {"n": n, "phase": phase, "implementation": name, "seconds": statistics.median(b[name] for b in per_block),
           "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    print(f"n={n:>9} {phase:>30} {name:>26}: {row['seconds'] * 1e6:12.1f} us  "
          f"{row['ratio']:.3f}x [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]", flush=True)
    return row


def _cell_text(row: dict) -> str:
    return f"{_time(row['seconds'])}, {row['ratio']:.2f}× [{row['ratio_min']:.2f}–{row['ratio_max']:.2f}]"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms" if seconds < 10 else (
        f"{seconds:.1f} s")


def markdown(rows: list[dict], device: str, batch: int = 0, width: int = 0, backend: str = "inductor") -> str:
    sizes = sorted({row["n"] for row in rows if row["phase"] in PHASES and row["phase"] != JACFWD})
    lines = [f"# PyTorch: log1pexp eagerly, compiled and under torch.func, {device}", "",
             f"torch {torch.__version__}. Median seconds of calls; ratio to `{ANCHOR}` as the median over blocks of "
             "interleaved calls, with its range over the blocks (run-to-run noise). Compiled: log1pexp under "
             f"`torch.compile(fullgraph=True, backend={backend!r})`, its backward compiled by AOTAutograd, the anchor "
             "without its `jvp` (which `torch.compile` refuses). Under torch.func the anchor has `setup_context`, a "
             "`jvp` and a generated vmap rule, which torch.func asks of a Function.", ""]
    for phase in [p for p in PHASES if any(r["phase"] == p for r in rows)]:
        phase_sizes = [JACOBIAN_SIZE] if phase == JACFWD else sizes
        columns = [f"n = {n}" if phase == JACFWD else f"n = {n:.0e}" for n in phase_sizes]
        lines += [f"## {phase}", "", "| implementation | " + " | ".join(columns) + " |",
                  "|---|" + "---|" * len(phase_sizes)]
        for name in implementations(phase):
            cells = [next(_cell_text(r) for r in rows
                          if r["n"] == n and r["phase"] == phase and r["implementation"] == name)
                     for n in phase_sizes]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    steps = [phase for phase in (*STEPS, FIRST_COMPILE) if any(r["phase"] == phase for r in rows)]
    if steps:
        lines += [f"## A training step: an MLP of three {width}×{width} layers, the function as the activation, "
                  f"batch {batch}", "",
                  "A step is the loss and its gradient w.r.t. the weights; compiled, the forward under "
                  "`torch.compile(fullgraph=True)`; inference, the forward under `no_grad`. The first compiled call "
                  "(its compile time) is timed in a process of its own per implementation and round, after the "
                  "compiler's start-up, with an empty Inductor cache directory (no kernel compiled before), the "
                  "ratio the median over rounds.", "",
                  "| implementation | " + " | ".join(steps) + " |", "|---|" + "---|" * len(steps)]
        for name in IMPLEMENTATIONS:
            cells = [next(_cell_text(r) for r in rows if r["phase"] == phase and r["implementation"] == name)
                     for phase in steps]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def device_name(device: str) -> str:
    if device == "cuda":
        return f"GPU: {torch.cuda.get_device_name()}"
    return f"CPU: {platform.machine()}, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="default: 1e3–1e6 (CPU), 1e6–1e8 (GPU)")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per block")
    parser.add_argument("--batch", type=int, default=256, help="the training step's batch (0: no step rows)")
    parser.add_argument("--width", type=int, default=1024, help="the training step's layer width")
    parser.add_argument("--steps-only", action="store_true", help="the training step's rows alone")
    parser.add_argument("--phases", nargs="*", default=PHASES, choices=PHASES, help="default: every phase")
    parser.add_argument("--compile-rounds", type=int, default=3, help="rounds of the first-compile row")
    parser.add_argument("--compile-backend", default="inductor",
                        help="every compiled row's backend (aot_eager: no kernels built, for a quick check)")
    parser.add_argument("--first-compile", default=None, help=argparse.SUPPRESS)  # one child of that row
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.first_compile:
        print(first_compile_seconds(args.first_compile, args.batch, args.width, device, args.compile_backend))
        return 0
    sizes = args.sizes or ([10**6, 10**7, 10**8] if device == "cuda" else [10**3, 10**5, 10**6])
    cells = [(n, phase) for n in sizes for phase in args.phases if phase != JACFWD]
    cells += [(JACOBIAN_SIZE, JACFWD)] if JACFWD in args.phases else []
    rows = [] if args.steps_only else [row for n, phase in cells
                                       for row in run_cell(n, phase, args.blocks, args.min_time, device,
                                                           args.compile_backend)]
    if args.batch:
        rows += [row for phase in STEPS
                 for row in step_cell(phase, args.batch, args.width, args.blocks, args.min_time, device,
                                      args.compile_backend)]
        rows += first_compile_rows(args.batch, args.width, device, args.compile_rounds, args.compile_backend)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "latest-torch-gpu" if device == "cuda" else "latest-torch"
    text = markdown(rows, device_name(device), args.batch, args.width, args.compile_backend)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"device": device_name(device), "torch": torch.__version__,
                                                  "rows": rows}))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
