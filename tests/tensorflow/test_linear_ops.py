"""The op table: every entry names a real TensorFlow op and gets its kind; each rule on real ops."""

import pytest
import tensorflow as tf

from stopgrad_math.tensorflow import linear_ops
from stopgrad_math.tensorflow.linear_ops import Kind

ENTRIES = (
    [(name, Kind.VALUE_FREE) for name in linear_ops.VALUE_FREE]
    + [(name, Kind.OPAQUE) for name in linear_ops.OPAQUE]
    + [(name, Kind.NONLINEAR) for name in linear_ops.NONLINEAR]
    + [(name, Kind.NONLINEAR) for name in linear_ops.COLLECTIVES]
    + [(name, Kind.LINEAR) for name in linear_ops.STRUCTURAL | linear_ops.PRODUCTS | linear_ops.QUOTIENTS
       | linear_ops.SUMS | linear_ops.SELECTS | linear_ops.SOLVES]
)


class _FakeOp:
    """An op of a given type with three float inputs, for the table lookup alone."""

    def __init__(self, op_type):
        self.type = op_type
        self.inputs = [tf.constant(1.0)] * 3  # the gradient registry is asked by type
        self.outputs = [tf.constant(1.0)]
        self._gradient_function = None

    def get_attr(self, name):
        raise ValueError(name)


def _carrying(name):
    """Inputs that carry the upstream where the op is linear: the values of a select, every term of a sum."""
    if name in linear_ops.SELECTS:
        return [False, True, True]
    if name in linear_ops.SOLVES:  # the right-hand side
        return [False, True, False]
    return [True] * 3 if name in linear_ops.SUMS else [True, False, False]


@pytest.mark.parametrize(("name", "kind"), sorted(ENTRIES), ids=[name for name, _ in sorted(ENTRIES)])
def test_every_entry_is_a_tensorflow_op_of_its_kind(name, kind):
    from tensorflow.compiler.tf2xla.python import xla  # noqa: F401  # registers the Xla* ops
    from tensorflow.python.framework import op_def_registry

    assert op_def_registry.get(name) is not None, f"{name} is no TensorFlow op"  # a misspelled entry never matches
    verdict = linear_ops.classify(_FakeOp(name), _carrying(name))
    if kind is Kind.LINEAR:  # a linear op that registers no gradient is opaque to the tape
        assert verdict.kind in (Kind.LINEAR, Kind.OPAQUE), verdict
        assert verdict.kind is Kind.LINEAR or "no registered gradient" in verdict.why
    else:
        assert verdict.kind is kind, verdict


def test_an_op_not_in_the_table_is_untrusted():
    assert linear_ops.classify(_FakeOp("Bitcast"), [True]).kind is Kind.UNTRUSTED
    assert linear_ops.classify(_FakeOp("RandomGammaGrad"), [True]).kind is Kind.UNTRUSTED


def _verdicts(grad_fn, shape=(None,)):
    """linear_ops' verdict on each op grad_fn makes from the upstream d (its only carrying input: d itself)."""
    found = []

    @tf.function(autograph=False)
    def trace(d):
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        result = grad_fn(d)
        for op in graph.get_operations()[first:]:
            flags = [t is d or (t.op.type not in ("Const", "Placeholder") and t.dtype.is_floating) for t in op.inputs]
            if any(flags):
                found.append((op.type, linear_ops.classify(op, flags).kind))
        return result

    trace.get_concrete_function(tf.TensorSpec(shape))
    return found


W = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
SQUARE = tf.constant([[3.0, 0.0, 0.0], [1.0, 4.0, 0.0], [0.5, 1.0, 5.0]])  # lower triangular, well conditioned


@pytest.mark.parametrize(
    "grad_fn, op, kind",
    [
        (lambda d: 3.0 * d, "Mul", Kind.LINEAR),
        (lambda d: d * d, "Mul", Kind.NONLINEAR),
        (lambda d: tf.linalg.matvec(W, d), "MatMul", Kind.LINEAR),
        (lambda d: d / 2.0, "RealDiv", Kind.LINEAR),
        (lambda d: 2.0 / d, "RealDiv", Kind.NONLINEAR),
        (lambda d: d + tf.zeros([3]), "AddV2", Kind.LINEAR),
        (lambda d: d + 1.0, "AddV2", Kind.NONLINEAR),
        (lambda d: tf.where([True, False, True], d, 0.0), "SelectV2", Kind.LINEAR),
        (lambda d: tf.where([True, False, True], d, 1.0), "SelectV2", Kind.NONLINEAR),
        (lambda d: tf.linalg.solve(SQUARE, d[:, None])[:, 0], "MatrixSolve", Kind.LINEAR),
        (lambda d: tf.linalg.solve(tf.linalg.diag(d), SQUARE), "MatrixSolve", Kind.NONLINEAR),
        (lambda d: tf.linalg.triangular_solve(SQUARE, d[:, None])[:, 0], "MatrixTriangularSolve", Kind.LINEAR),
        (lambda d: tf.cast(d, tf.float64), "Cast", Kind.LINEAR),
        (lambda d: tf.cast(d, tf.int32), "Cast", Kind.NONLINEAR),
        (lambda d: tf.pad(d, [[1, 0]], constant_values=0.0), "Pad", Kind.LINEAR),
        (lambda d: tf.pad(d, [[1, 0]], constant_values=2.0), "PadV2", Kind.NONLINEAR),
        (lambda d: tf.stop_gradient(d), "StopGradient", Kind.OPAQUE),
        (lambda d: tf.nn.relu(d), "Relu", Kind.NONLINEAR),
        (lambda d: tf.reshape(d, tf.shape(d)), "Shape", Kind.VALUE_FREE),
        (lambda d: tf.custom_gradient(lambda a: (a, lambda g: g))(d), "IdentityN", Kind.OPAQUE),
    ],
)
def test_each_rule_on_real_ops(grad_fn, op, kind):
    assert (op, kind) in _verdicts(grad_fn)


def test_zero_is_decided_from_the_ops_that_make_it():
    @tf.function(autograph=False)
    def trace(x):
        assert linear_ops.is_zero(tf.zeros_like(x))
        assert linear_ops.is_zero(tf.reshape(tf.fill(tf.shape(x), 0.0), [-1]))
        assert linear_ops.is_zero(tf.constant([0.0, -0.0]))
        assert not linear_ops.is_zero(tf.ones_like(x))
        assert not linear_ops.is_zero(x * 0.0)  # 0·inf is NaN: a product is never taken for zero
        return x

    trace.get_concrete_function(tf.TensorSpec(None))


@pytest.mark.parametrize("how", ["eager", "tf.function", "XLA"])
def test_a_grad_fn_that_solves_is_embedded_in_both_modes(how):
    """An implicit gradient's adjoint solve (A⁻ᵀ·ct) in grad_fn, which tf.custom_gradient runs: reverse mode is
    A⁻ᵀw and forward mode A⁻¹v, against NumPy's inverse."""
    import numpy as np

    import stopgrad_math as sgm

    matrix = tf.cast(SQUARE + tf.transpose(SQUARE), tf.float64)  # full, not triangular

    @sgm.custom_gradient
    def solve(b):
        return tf.linalg.solve(matrix, b), lambda ct: tf.linalg.solve(matrix, ct, adjoint=True)

    b, v, w = (tf.constant(c, tf.float64) for c in ([[1.0], [2.0], [3.0]], [[0.5], [-1.0], [2.0]],
                                                    [[1.5], [0.25], [-2.0]]))

    def both(b):
        with tf.autodiff.ForwardAccumulator(b, v) as forward, tf.GradientTape() as tape:
            tape.watch(b)
            y = solve(b)
            loss = tf.reduce_sum(w * y)
        return forward.jvp(y), tape.gradient(loss, b)

    compiled = {"eager": both, "tf.function": tf.function(both), "XLA": tf.function(both, jit_compile=True)}
    tangent, gradient = compiled[how](b)
    inverse = np.linalg.inv(matrix.numpy())
    np.testing.assert_allclose(tangent, inverse @ v.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gradient, inverse.T @ w.numpy(), rtol=1e-12)
