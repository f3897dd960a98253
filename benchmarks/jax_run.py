"""python benchmarks/jax_run.py: the JAX rows of the speed suite, as ratios to jax.custom_jvp in one run.

log1pexp under ``jit`` (value + gradient, JVP) and eagerly (value + gradient
without ``jit``), for the identity form and the decorator (at ``order=1`` and
``order=2``, whose J moves with x) against
``jax.custom_jvp`` (the anchor), ``jax.custom_vjp`` (no JVP) and plain
autodiff of ``softplus`` (the floor). Each cell is timed in ``--blocks``
blocks; within a block the implementations run round-robin (drift hits all
alike) and each block gives a median per implementation, so a ratio is
reported as the median over blocks with its range, which is the run-to-run
noise. Beside each jitted ratio: the number of kernels in XLA's optimized HLO
(fusions, reductions, sorts and custom calls of the entry computation), which
says whether a difference is structural. Imports JAX, never TensorFlow: a
machine with JAX's CUDA build alone runs it on its GPU
(``results/latest-jax-gpu.md``); elsewhere ``results/latest-jax.md``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import stopgrad_math.jax as sgm

ANCHOR = "jax.custom_jvp (anchor)"
JITTED = ("value+grad", "jvp")
EAGER = "eager value+grad"  # no jit: what a call costs where each op is dispatched on its own
PHASES = (*JITTED, EAGER)


@jax.custom_jvp
def _log1pexp_jvp(x):
    return jnp.logaddexp(x, 0.0)


_log1pexp_jvp.defjvp(lambda primals, tangents: (_log1pexp_jvp(primals[0]), tangents[0] * jax.nn.sigmoid(primals[0])))

_log1pexp_vjp = jax.custom_vjp(lambda x: jnp.logaddexp(x, 0.0))
_log1pexp_vjp.defvjp(lambda x: (jnp.logaddexp(x, 0.0), x), lambda x, ct: (ct * jax.nn.sigmoid(x),))


@sgm.custom_gradient
def _log1pexp_decorated(x):
    return jnp.logaddexp(x, 0.0), lambda ct: ct * jax.nn.sigmoid(x)


_log1pexp_face = sgm.custom_vjp(lambda x: jnp.logaddexp(x, 0.0))  # jax.custom_vjp's fwd and bwd, on the decorator
_log1pexp_face.defvjp(lambda x: (jnp.logaddexp(x, 0.0), x), lambda x, ct: (ct * jax.nn.sigmoid(x),))


IMPLEMENTATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    ANCHOR: _log1pexp_jvp,
    "identity form": lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x),
    "decorator": _log1pexp_decorated,
    "decorator, order=2": sgm.custom_gradient(order=2)(_log1pexp_decorated.undecorated),
    "jax.custom_vjp": _log1pexp_vjp,
    "stopgrad_math.jax.custom_vjp": _log1pexp_face,
    "plain autodiff (floor)": jax.nn.softplus,
}
NO_JVP = {"jax.custom_vjp"}  # jax.custom_vjp cannot be used in forward mode


def programs(fn: Callable[[jax.Array], jax.Array], phase: str) -> Callable[[jax.Array], object]:
    """The program of a phase: value + gradient of sum(fn), jitted or eager, or the jitted JVP along ones."""
    if phase == EAGER:
        return jax.value_and_grad(lambda x: jnp.sum(fn(x)))
    if phase == "value+grad":
        return jax.jit(jax.value_and_grad(lambda x: jnp.sum(fn(x))))
    return jax.jit(lambda x: jax.jvp(fn, (x,), (jnp.ones_like(x),)))


def kernels(program: Callable[[jax.Array], object], x: jax.Array) -> int:
    """Kernels XLA launches for the program: fusions, reductions, sorts and custom calls in its entry computation."""
    text = program.lower(x).compile().as_text()  # type: ignore[attr-defined]
    entry = text[text.index("ENTRY"):]
    entry = entry[:entry.index("\n}")]
    return len(re.findall(r"= \S+ (fusion|reduce|sort|custom-call|convolution|dot)\(", entry))


def block_medians(calls: dict[str, Callable[[], object]], min_time: float, rounds: int = 7) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    count = 0
    while count < rounds or sum(map(sum, times.values())) < min_time * len(calls):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
        count += 1
    return {name: statistics.median(values) for name, values in times.items()}


def run_cell(n: int, phase: str, blocks: int, min_time: float) -> list[dict]:
    x = jnp.linspace(-20.0, 100.0, n, dtype=jnp.float32)
    compiled = {name: programs(fn, phase) for name, fn in IMPLEMENTATIONS.items()
                if not (phase == "jvp" and name in NO_JVP)}
    calls = {name: (lambda p=p: p(x)) for name, p in compiled.items()}
    for call in calls.values():  # compile and warm up
        jax.block_until_ready(call())
        jax.block_until_ready(call())
    per_block = [block_medians(calls, min_time) for _ in range(blocks)]
    rows = []
    for name in calls:
        ratios = [block[name] / block[ANCHOR] for block in per_block]
        rows.append({"n": n, "phase": phase, "implementation": name,
                     "seconds": statistics.median(block[name] for block in per_block),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "kernels": None if phase == EAGER else kernels(compiled[name], x)})
        print(f"n={n:>9} {phase:>16} {name:>24}: {rows[-1]['seconds'] * 1e6:10.1f} us  "
              f"{rows[-1]['ratio']:.3f}x [{rows[-1]['ratio_min']:.3f}, {rows[-1]['ratio_max']:.3f}]  "
              f"{rows[-1]['kernels']} kernels", flush=True)
    return rows


def markdown(rows: list[dict], device: str) -> str:
    sizes = sorted({row["n"] for row in rows})
    lines = [f"# JAX: log1pexp under jit and eagerly, {device}", "",
             f"JAX {jax.__version__}. Median seconds of calls; ratio to `{ANCHOR}` as the median over "
             "blocks of interleaved calls, with its range over the blocks (run-to-run noise); kernels: XLA's "
             "optimized HLO of the jitted program.", ""]
    for phase in PHASES:
        lines += [f"## {phase}", "", "| implementation | " + " | ".join(f"n = {n:.0e}" for n in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for name in IMPLEMENTATIONS:
            cells = []
            for n in sizes:
                row = next((r for r in rows if r["n"] == n and r["phase"] == phase and r["implementation"] == name),
                           None)
                cells.append("n/a (no forward mode)" if row is None else
                             f"{row['seconds'] * 1e6:.1f} µs, {row['ratio']:.2f}× "
                             f"[{row['ratio_min']:.2f}–{row['ratio_max']:.2f}]"
                             + ("" if row["kernels"] is None else f", {row['kernels']} kernels"))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def device_name() -> str:
    device = jax.devices()[0]
    if device.platform == "gpu":
        return f"GPU: {device.device_kind}"
    return f"CPU: {platform.machine()}, {jax.device_count()} device(s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="default: 1e3–1e6 (CPU), 1e6–1e8 (GPU)")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per block")
    args = parser.parse_args(argv)
    gpu = jax.devices()[0].platform == "gpu"
    sizes = args.sizes or ([10**6, 10**7, 10**8] if gpu else [10**3, 10**5, 10**6])
    rows = [row for n in sizes for phase in PHASES for row in run_cell(n, phase, args.blocks, args.min_time)]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "latest-jax-gpu" if gpu else "latest-jax"
    text = markdown(rows, device_name())
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"device": device_name(), "jax": jax.__version__, "rows": rows}))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
