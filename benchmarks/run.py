"""python benchmarks/run.py: time every case, write results/latest.md and results/latest.png.

Each figure is the median of repeated calls after warm-up, and is also given
as a ratio to tf.custom_gradient measured in the same run, since absolute
times drift on shared machines; within a cell the implementations are timed
round-robin, so that drift affects all of them alike. Peak memory is the rise of TF's peak allocation
above the current one during value + gradient (TF's BFC allocator, on the CPU
too); XLA's own buffers on the CPU are not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF's BFC allocator on the CPU keeps the same allocation statistics as on a GPU.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import numpy as np
import tensorflow as tf

import stopgrad_math as sgm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import cases
import report

SIZES = (1, 10**3, 10**5, 10**6)
MODES = ("eager", "function", "xla")
PHASES = ("forward", "value+grad")


def sync() -> None:
    if tf.config.list_logical_devices("GPU"):
        tf.test.experimental.sync_devices()


def median_seconds(call, min_time: float) -> float:
    return interleaved_medians({"call": call}, min_time)["call"]


def interleaved_medians(calls: dict, min_time: float, min_rounds: int = 7, max_rounds: int = 300) -> dict:
    """Median seconds of each call, timed round-robin so that drift hits all of them alike."""
    for call in calls.values():  # warm-up: traces, compiles, fills caches
        call()
        call()
    sync()
    times: dict = {name: [] for name in calls}
    rounds = 0
    while rounds < min_rounds or (sum(map(sum, times.values())) < min_time * len(calls) and rounds < max_rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            sync()
            times[name].append(time.perf_counter() - start)
        rounds += 1
    return {name: statistics.median(values) for name, values in times.items()}


def value_and_grad(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, x)


def compiled(fn, mode):
    # Wrapped in a lambda: tf.function applied directly to a tf.custom_gradient
    # function has autograph compile the inner f and fails when differentiated.
    return fn if mode == "eager" else tf.function(lambda x: fn(x), jit_compile=(mode == "xla"))


def served(fn, mode, x):
    """fn compiled for mode and traced inside values_only(), as an exported serving signature is."""
    function = compiled(fn, mode)
    with sgm.values_only():
        function(x)  # the trace kept for every later call with x's signature
    return function


class PeakMemory:
    """Bytes by which TF's peak allocation rises above the current one while a call runs."""

    def __init__(self):
        self.gpu = bool(tf.config.list_logical_devices("GPU"))
        self.device = "GPU:0" if self.gpu else "CPU:0"

    def measure(self, call) -> int:
        tf.config.experimental.reset_memory_stats(self.device)
        base = tf.config.experimental.get_memory_info(self.device)["current"]
        call()
        sync()
        return tf.config.experimental.get_memory_info(self.device)["peak"] - base


def memcpy_bandwidth(nbytes: int = 256 * 2**20) -> float:
    """Bytes per second read plus written by a large NumPy copy on this machine."""
    source = np.ones(nbytes // 8)
    target = np.empty_like(source)
    seconds = median_seconds(lambda: np.copyto(target, source), min_time=0.5)
    return 2 * nbytes / seconds


def serving_medians(implementations, calls, mode, x, min_time) -> dict:
    """Forward only under values_only() for ours, timed round-robin with plain f's forward alone (plain f's time
    kept under the same key): heavier calls between them would cool the caches of one and not the other."""
    functions = {name: served(fn, mode, x) for name, fn in implementations.items() if name in report.SERVED}
    serving = {(name, report.VALUES_ONLY): lambda f=f, x=x: f(x) for name, f in functions.items()}
    if not serving or report.PLAIN not in implementations:
        return {}
    serving[(report.PLAIN, report.VALUES_ONLY)] = calls[(report.PLAIN, "forward")]
    return interleaved_medians(serving, min_time)


def run_case(case, sizes, min_time, memory: PeakMemory) -> list[dict]:
    rows = []
    for n in sizes:
        implementations, x = case.setup(n)
        for mode in MODES:
            calls = {}
            for name, fn in implementations.items():
                forward = compiled(fn, mode)
                both = compiled(lambda x, fn=fn: value_and_grad(fn, x), mode)
                calls[(name, "forward")] = lambda f=forward, x=x: f(x)
                calls[(name, "value+grad")] = lambda f=both, x=x: f(x)
                if mode == "eager" and hasattr(fn, "undecorated"):  # the same f, undecorated
                    calls[(name, "undecorated_forward")] = lambda f=fn.undecorated, x=x: f(x)[0]
            medians = interleaved_medians(calls, min_time)
            if mode != "eager":
                medians.update(serving_medians(implementations, calls, mode, x, min_time))
            for name in implementations:
                row = {"case": case.name, "n": n, "implementation": name, "mode": mode}
                row.update({phase: t for (impl, phase), t in medians.items() if impl == name})
                both = calls[(name, "value+grad")]
                row["peak_bytes"] = memory.measure(both) if n == max(sizes) else None
                rows.append(row)
                print(f"{case.name:>9} n={n:>8} {mode:>8} {name:>27}: "
                      f"{row['forward'] * 1e6:9.1f} us  {row['value+grad'] * 1e6:9.1f} us", flush=True)
    return rows


def _device_name(gpu: bool) -> str:
    if gpu:
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        return "GPU: " + details.get("device_name", "unknown")
    return f"CPU: {platform.machine()}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--min-time", type=float, default=0.6, help="seconds of repeats per cell")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--baseline", default=None, help="rows to compare with (default: results/baseline.json)")
    parser.add_argument("--cases", nargs="*", default=None, help="the cases to run, by name (default: every one)")
    args = parser.parse_args(argv)
    memory = PeakMemory()
    device = _device_name(memory.gpu)
    chosen = [case for case in cases.CASES if args.cases is None or case.name in args.cases]
    rows = [row for case in chosen for row in run_case(case, args.sizes, args.min_time, memory)]
    bandwidth = memcpy_bandwidth()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "-gpu" if memory.gpu else ""
    baseline_path = pathlib.Path(args.baseline or pathlib.Path(__file__).parent / "results" / f"baseline{suffix}.json")
    baseline = json.loads(baseline_path.read_text())["rows"] if baseline_path.exists() else None
    text = report.markdown(rows, chosen, device, bandwidth, tf.__version__, baseline, gpu=memory.gpu)
    (out / f"latest{suffix}.md").write_text(text)
    (out / f"latest{suffix}.json").write_text(json.dumps({"device": device, "bandwidth": bandwidth, "rows": rows}))
    report.plot(rows, out / f"latest{suffix}.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
