"""python benchmarks/tfp_inside.py: TFP's own functions with the decorator standing in for tf.custom_gradient
inside TFP's custom-gradient factory (``tfp_patch``), timed against TFP as it is; writes
results/latest-tfp-inside.md.

Each cell is ``tfp.math.value_and_gradient`` of the function's sum, eagerly and under ``tf.function`` (ours traced
with the decorator in the factory, then called), per call after the first two (which trace grad_fn once per
function and signature). The two are timed round-robin within a block; the ratio is the median over blocks, with
the range across blocks, since absolute times drift on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from run import interleaved_medians
from tfp_patch import on_the_library

tfd = tfp.distributions
POINT = np.float32([0.5, 2.0, 5.0])

# The functions whose gradients regressed through TFP's factory: Bessel gradients call themselves at v ± 1,
# Student-t's CDF gradient differentiates betainc inside its grad_fn.
REGRESSED = {
    "NoncentralChi2(3, [1, 2, 3]).log_cdf": lambda z: tfd.NoncentralChi2(3.0, [1.0, 2.0, 3.0]).log_cdf(z),
    "NoncentralChi2(3, [1, 2, 3]).log_prob": lambda z: tfd.NoncentralChi2(3.0, [1.0, 2.0, 3.0]).log_prob(z),
    "log_bessel_ive([1.5, 2.5, 0.5], z)": lambda z: tfp.math.log_bessel_ive([1.5, 2.5, 0.5], z),
    "log_bessel_kve([1.5, 2.5, 0.5], z)": lambda z: tfp.math.log_bessel_kve([1.5, 2.5, 0.5], z),
    "StudentT([2.5, 4, 7]).cdf": lambda z: tfd.StudentT([2.5, 4.0, 7.0], 0.0, 1.0).cdf(z),
    "betainc([1, 2, 3], [2, 3, 0.5], z / 6)": lambda z: tfp.math.betainc([1.0, 2.0, 3.0], [2.0, 3.0, 0.5], z / 6),
}


def value_and_gradient(fn):
    """Eager value and gradient of fn's sum, as TFP's own tests take them."""
    return lambda z: tfp.math.value_and_gradient(lambda t: tf.reduce_sum(fn(t)), z)


def _ours(call):
    def patched():
        with on_the_library():
            return call()
    return patched


MODES = ("eager", "tf.function")


def _calls(fn, z, mode: str) -> dict:
    """TFP's call and ours, in the mode: eagerly ours runs with the decorator in the factory; under tf.function
    ours is traced with it there (its first call), and then called as it is."""
    if mode == "eager":
        call = lambda: value_and_gradient(fn)(z)  # noqa: E731
        return {"tfp": call, "ours": _ours(call)}
    theirs, ours = (tf.function(value_and_gradient(fn)) for _ in range(2))
    _ours(lambda: ours(z))()
    return {"tfp": lambda: theirs(z), "ours": lambda: ours(z)}


def measure(blocks: int, min_time: float) -> list[dict]:
    rows = []
    z = tf.constant(POINT)
    for name, fn in REGRESSED.items():
        for mode in MODES:
            calls = _calls(fn, z, mode)
            medians = [interleaved_medians(calls, min_time, min_rounds=3) for _ in range(blocks)]
            ratios = [m["ours"] / m["tfp"] for m in medians]
            rows.append({"function": name, "mode": mode, "tfp": statistics.median(m["tfp"] for m in medians),
                         "ours": statistics.median(m["ours"] for m in medians), "ratio": statistics.median(ratios),
                         "low": min(ratios), "high": max(ratios)})
            print(f"{name:>42}, {mode:>11}: ratio {rows[-1]['ratio']:.2f} ({rows[-1]['low']:.2f}-"
                  f"{rows[-1]['high']:.2f})", flush=True)
    return rows


def markdown(rows: list[dict], blocks: int) -> str:
    lines = [
        "# TFP inside: the decorator in TFP's custom-gradient factory", "",
        f"TensorFlow {tf.__version__}, TFP {tfp.__version__}, CPU, {os.cpu_count()} cores. "
        "`tfp.math.value_and_gradient` of the sum, eagerly and under `tf.function`, per call after the first two; "
        f"the ratio is ours / TFP's, the median of {blocks} round-robin blocks, with the range across blocks. "
        "Target: within 3x (issue 75).", "",
        "| function | mode | TFP (ms) | ours (ms) | ours / TFP | range |", "|---|---|---|---|---|---|",
    ]
    lines += [f"| `{r['function']}` | {r['mode']} | {r['tfp'] * 1e3:.2f} | {r['ours'] * 1e3:.2f} | "
              f"{r['ratio']:.2f}x | {r['low']:.2f}-{r['high']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of repeats per block")
    args = parser.parse_args(argv)
    text = markdown(measure(args.blocks, args.min_time), args.blocks)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest-tfp-inside.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
