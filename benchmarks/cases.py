"""The benchmark cases: each implementation of each case as a function of one input tensor.

Every implementation of a case computes the same value and the same gradient,
so the timings compare the cost of the custom-gradient mechanism alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

import stopgrad_math as sgm

ANCHOR = "tf.custom_gradient"


Implementations = dict[str, Callable[[tf.Tensor], tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    description: str
    setup: Callable[[int], tuple[Implementations, tf.Tensor]]  # n -> (implementations, input)
    bytes_moved: Callable[[int], int]  # minimal bytes read and written by value + gradient


# ---------------------------------------------------------------- log1pexp, elementwise


@tf.custom_gradient
def _tf_log1pexp(x):
    return tf.math.softplus(x), lambda dy: dy * tf.math.sigmoid(x)


@sgm.custom_gradient
def _sgm_log1pexp(x):
    return tf.math.softplus(x), lambda dy: dy * tf.math.sigmoid(x)


@keras.ops.custom_gradient
def _keras_log1pexp(x):
    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        return upstream * tf.math.sigmoid(x)

    return tf.math.softplus(x), grad


ORDER_2 = "stopgrad_math decorator, order=2"

_LOG1PEXP_IMPLEMENTATIONS = {
    "stopgrad_math identity": lambda x: sgm.custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x),
    "stopgrad_math decorator": _sgm_log1pexp,
    ORDER_2: sgm.custom_gradient(order=2)(_sgm_log1pexp.undecorated),
    ANCHOR: _tf_log1pexp,
    "tfp.math.custom_gradient": lambda x: tfp.math.custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x),
    "keras ops.custom_gradient": _keras_log1pexp,
    "plain autodiff (floor)": tf.math.softplus,
}

LOG1PEXP = Case(
    "log1pexp",
    "y = softplus(x) with the gradient sigmoid(x), elementwise; n = number of elements",
    lambda n: (_LOG1PEXP_IMPLEMENTATIONS, tf.linspace(-20.0, 120.0, n)),
    lambda n: 3 * 4 * n,  # read x, write y and the gradient
)


# ---------------------------------------------------------------- log1pexp from exp: the honest worst case
# softplus and sigmoid are costly ops that hide the identity's overhead; here the gradient costs one
# division more than the value, so the mechanism's own cost shows.


def _log1pexp_parts(x):
    e = tf.exp(x)
    return tf.math.log(1 + e), 1 - 1 / (1 + e)


def _log1pexp_from_exp(x):
    e = tf.exp(x)
    return tf.math.log(1 + e), lambda dy: dy * (1 - 1 / (1 + e))


def _keras_log1pexp_from_exp(x):
    value, grad = _log1pexp_from_exp(x)
    return value, lambda *args, upstream=None: grad(args[0] if upstream is None else upstream)


_sgm_log1pexp_from_exp = sgm.custom_gradient(_log1pexp_from_exp)

_LOG1PEXP_EXP_IMPLEMENTATIONS = {
    "stopgrad_math identity": lambda x: sgm.custom_gradient(*_log1pexp_parts(x), x),
    "stopgrad_math decorator": _sgm_log1pexp_from_exp,
    ORDER_2: sgm.custom_gradient(order=2)(_log1pexp_from_exp),
    ANCHOR: tf.custom_gradient(_log1pexp_from_exp),
    "tfp.math.custom_gradient": lambda x: tfp.math.custom_gradient(*_log1pexp_parts(x), x),
    "keras ops.custom_gradient": keras.ops.custom_gradient(_keras_log1pexp_from_exp),
    "plain autodiff (floor)": lambda x: tf.math.log(1 + tf.exp(x)),
}

LOG1PEXP_EXP = Case(
    "log1pexp_exp",
    "y = log(1 + e) with the gradient 1 − 1/(1 + e), e = exp(x), elementwise; n = number of elements",
    lambda n: (_LOG1PEXP_EXP_IMPLEMENTATIONS, tf.linspace(-20.0, 20.0, n)),  # exp(x) stays finite
    lambda n: 3 * 4 * n,
)


# ---------------------------------------------------------------- matmul, a VJP that is not elementwise

_WIDTH = 64
_W = tf.constant(np.random.default_rng(0).normal(size=(_WIDTH, _WIDTH)) / 8, tf.float32)


def _matmul_vjp(dy):
    return tf.matmul(dy, _W, transpose_b=True)


@tf.custom_gradient
def _tf_matmul(x):
    return tf.matmul(x, _W), _matmul_vjp


@sgm.custom_gradient
def _sgm_matmul(x):
    return tf.matmul(x, _W), _matmul_vjp


@keras.ops.custom_gradient
def _keras_matmul(x):
    def grad(*args, upstream=None):
        return _matmul_vjp(args[0] if upstream is None else upstream)

    return tf.matmul(x, _W), grad


_MATMUL_IMPLEMENTATIONS = {
    "stopgrad_math decorator": _sgm_matmul,
    ORDER_2: sgm.custom_gradient(order=2)(_sgm_matmul.undecorated),
    ANCHOR: _tf_matmul,
    "keras ops.custom_gradient": _keras_matmul,
    "plain autodiff (floor)": lambda x: tf.matmul(x, _W),
}


def _rows(n):
    return max(n // _WIDTH, 1)


MATMUL = Case(
    "matmul",
    f"y = x @ W with W {_WIDTH}x{_WIDTH}, gradient dy @ W^T; x is [n/{_WIDTH}, {_WIDTH}] (n = 1: one row)",
    lambda n: (_MATMUL_IMPLEMENTATIONS, tf.reshape(tf.linspace(-1.0, 1.0, _rows(n) * _WIDTH), [-1, _WIDTH])),
    lambda n: 3 * 4 * _rows(n) * _WIDTH,
)


# ---------------------------------------------------------------- a straight-through quantizer, scale closed over
# Real code's shape (larq's ste_sign, a fake-quant): the rule reads x, and f a learned scale it closes over.

_SCALE = tf.Variable(0.1, trainable=False)  # learned elsewhere; read by f and grad_fn, differentiated by neither


def _quantize(x):
    scale = tf.convert_to_tensor(_SCALE)
    return tf.round(x / scale) * scale, lambda dy: dy * tf.cast(tf.abs(x) <= 1.0, dy.dtype)


def _keras_quantize(x):
    value, grad = _quantize(x)
    return value, lambda *args, upstream=None: grad(args[0] if upstream is None else upstream)


_QUANTIZER_IMPLEMENTATIONS = {
    "stopgrad_math decorator": sgm.custom_gradient(_quantize),
    ORDER_2: sgm.custom_gradient(order=2)(_quantize),
    ANCHOR: tf.custom_gradient(_quantize),
    "keras ops.custom_gradient": keras.ops.custom_gradient(_keras_quantize),
    "plain autodiff (floor)": lambda x: _straight_through(x, tf.cast(tf.abs(x) <= 1.0, x.dtype)),
}


def _straight_through(x, inside):
    """The STE by hand: the quantized value, the derivative ``inside``."""
    passed = x * inside
    return passed + tf.stop_gradient(_quantize(x)[0] - passed)

QUANTIZER = Case(
    "quantizer",
    "straight-through quantizer y = round(x / s)·s, s a variable f reads, gradient dy·[|x| ≤ 1]; n = elements",
    lambda n: (_QUANTIZER_IMPLEMENTATIONS, tf.linspace(-2.0, 2.0, n)),
    lambda n: 3 * 4 * n,
)


# ---------------------------------------------------------------- a scalar log-likelihood over n points


def _logistic_parts(theta, data):
    features, labels = data[0], data[1]
    eta = theta * features
    value = tf.reduce_sum(labels * eta - tf.math.softplus(eta))
    gradient = tf.reduce_sum((labels - tf.math.sigmoid(eta)) * features)
    return value, gradient


def _loglik_implementations(data: tf.Tensor) -> Implementations:
    """log p(labels | θ·features) as a function of θ, for one fixed data set."""

    @tf.custom_gradient
    def tf_anchor(theta):
        value, gradient = _logistic_parts(theta, data)
        return value, lambda dy: dy * gradient

    @sgm.custom_gradient
    def decorated(theta):
        value, gradient = _logistic_parts(theta, data)
        return value, lambda dy: dy * gradient

    def plain(theta):
        eta = theta * data[0]
        return tf.reduce_sum(data[1] * eta - tf.math.softplus(eta))

    return {
        "stopgrad_math identity": lambda theta: sgm.custom_gradient(*_logistic_parts(theta, data), theta),
        "stopgrad_math decorator": decorated,
        ANCHOR: tf_anchor,
        "tfp.math.custom_gradient": lambda theta: tfp.math.custom_gradient(*_logistic_parts(theta, data), theta),
        "plain autodiff (floor)": plain,
    }


def _loglik_setup(n: int) -> tuple[Implementations, tf.Tensor]:
    rng = np.random.default_rng(1)
    data = tf.constant(np.stack([rng.normal(size=n), rng.integers(0, 2, n)]), tf.float32)
    return _loglik_implementations(data), tf.constant(0.3)


LOGLIK = Case(
    "loglik",
    "scalar logistic log-likelihood of θ over n data points, value and gradient in one pass",
    _loglik_setup,
    lambda n: 2 * 4 * n,  # read features and labels
)

# ---------------------------------------------------------------- an embedding table with a sparse gradient

TABLE_ROWS, TABLE_WIDTH = 10**6, 64
_TABLES: dict[tuple[int, int], tf.Variable] = {}


def table(rows: int = TABLE_ROWS) -> tf.Variable:
    """The embedding table, made once per size (256 MiB at 1e6 rows)."""
    if (rows, TABLE_WIDTH) not in _TABLES:
        _TABLES[(rows, TABLE_WIDTH)] = tf.Variable(tf.random.stateless_normal([rows, TABLE_WIDTH], [2, 3]))
    return _TABLES[(rows, TABLE_WIDTH)]


CLOSED_OVER = ", table closed over"


def _embedding_implementations(ids: tf.Tensor, closed_over: tf.Variable) -> Implementations:
    """Rows of the table for fixed ids, as a function of the table; grad_fn gives tf.IndexedSlices.

    Passed as an argument, the table is read whole (as tf.custom_gradient reads it; TF copies a variable
    on each read once sparse ops have touched it). Closed over, with its gradient from `variables`, it is
    only gathered.
    """

    def lookup(table):
        rows = tf.gather(table, ids)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            return tf.IndexedSlices(upstream, ids, tf.shape(table, out_type=tf.int64))

        return rows, grad

    dense_shape = tf.constant(closed_over.shape.as_list(), tf.int64)  # tf.shape of a variable reads it in eager

    def lookup_closed_over(ids):
        rows = tf.gather(closed_over, ids)

        def grad(dy, variables=None):
            return None, [tf.IndexedSlices(dy, ids, dense_shape)]

        return rows, grad

    ours_closed, anchor_closed = sgm.custom_gradient(lookup_closed_over), tf.custom_gradient(lookup_closed_over)
    return {
        "stopgrad_math decorator": sgm.custom_gradient(lookup),
        "stopgrad_math decorator" + CLOSED_OVER: lambda table: ours_closed(ids),
        ANCHOR: tf.custom_gradient(lookup),
        ANCHOR + CLOSED_OVER: lambda table: anchor_closed(ids),
        "keras ops.custom_gradient": keras.ops.custom_gradient(lookup),
        "plain autodiff (floor)": lambda table: tf.gather(table, ids),
    }


def embedding_setup(n: int, rows: int = TABLE_ROWS) -> tuple[Implementations, tf.Variable]:
    ids = tf.constant(np.random.default_rng(4).integers(0, rows, n), tf.int32)
    return _embedding_implementations(ids, table(rows)), table(rows)


EMBEDDING = Case(
    "embedding",
    f"rows of a {TABLE_ROWS:g}x{TABLE_WIDTH} float32 table for n ids, gradient tf.IndexedSlices (sparse)",
    embedding_setup,
    lambda n: 3 * 4 * TABLE_WIDTH * n,  # read the rows, write them and their gradient
)

CASES = (LOG1PEXP, LOG1PEXP_EXP, MATMUL, QUANTIZER, LOGLIK, EMBEDDING)
