"""Helpers shared by the test modules: execution modes and derivative probes."""

import importlib.util
import pathlib
import sys

import ml_dtypes
import numpy as np
import tensorflow as tf
from bit_patterns import bits
from mode_names import MODES  # noqa: F401  (the tests import it from here)


def sibling(name: str):
    """A test module of this folder, by its file: jax/ and torch/ hold test modules of the same names, so a bare
    ``import test_decorator_form`` would depend on the order of the folders on the path."""
    qualified = f"sibling_{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(qualified, pathlib.Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def float32_exact(values) -> list[float]:
    """Each value rounded to float32, so that hypothesis finds it unchanged in a float32 array under NumPy 1.x
    too (which compares a Python float with a float32 in double precision)."""
    return [float(np.float32(v)) for v in values]


def in_mode(fn, mode: str):
    """Returns fn run eagerly, under tf.function, or under tf.function(jit_compile=True)."""
    if mode == "eager":
        return fn
    return tf.function(fn, jit_compile=(mode == "xla"))


def vjp(fn, x, upstream=None):
    """The gradient of fn at x for the upstream gradient (ones when None)."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=upstream)


def gradient_and_second(fn, x):
    """d/dx Σ fn(x) by a tape, and the derivative of that gradient's sum by a tape around it."""
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = tf.reduce_sum(fn(x))
        gradient = inner.gradient(y, x)
    return gradient, outer.gradient(gradient, x)


def jvp(fn, x, tangent):
    """The forward-mode derivative of fn at x along tangent."""
    with tf.autodiff.ForwardAccumulator(x, tangent) as acc:
        y = fn(x)
    return acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def flushes_denormals(dtype: tf.DType, mode: str) -> bool:
    """Whether one TF subtraction flushes a subnormal of dtype to zero in mode (CPU FTZ/DAZ)."""
    tiny = np.ones([], dtype=f"uint{8 * dtype.size}").view(dtype.as_numpy_dtype)  # smallest subnormal
    zero = tf.zeros([], dtype)  # an argument, so that XLA cannot fold the subtraction away
    return float(in_mode(lambda a, z: a - z, mode)(tf.constant(tiny, dtype), zero)) == 0.0


def assert_value_exact(actual, expected):
    """Bit-equal, except where no TensorFlow arithmetic op can be.

    TensorFlow's CPU kernels flush denormals to zero in some modes (under
    XLA in some vector lanes only), so a subnormal may come back as the zero
    of its sign; and bfloat16 arithmetic returns a canonical NaN, so there a
    NaN need only stay NaN.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    wide = expected.astype(np.float64)
    subnormal = (np.abs(wide) < ml_dtypes.finfo(expected.dtype).smallest_normal) & (wide != 0)
    flushed = (actual.astype(np.float64) == 0) & (np.signbit(actual) == np.signbit(expected))
    loose_nan = np.isnan(wide) if expected.dtype == ml_dtypes.bfloat16 else np.zeros(expected.shape, bool)
    same = bits(actual) == bits(expected)
    assert np.all(same | (subnormal & flushed) | (loose_nan & np.isnan(actual.astype(np.float64)))), (actual, expected)


# Compiled, f's ops are fused with what else the program holds (grad_fn's ops, here; TFP's IdentityN there), and
# fused float32 arithmetic rounds by the fusion: measured, 1 ulp (NoncentralChi2.sample under XLA; log_bessel_ive
# under tf.function on TF 2.18) and 3 ulps (log_bessel_kve under tf.function), as TFP's own log_bessel_ive moves
# by 1 ulp between eager mode and tf.function. Eagerly every op runs alone, and the value is TFP's bit for bit.
COMPILED_ULPS = 8
