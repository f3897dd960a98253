"""TFP's collective cases, restated: sharded log-prob parts, psum functions and reductions with collectives.

TFP tests them in ``internal/distribute_lib_test.py`` and the collective reductions of ``math/generic_test.py``.
Here each runs on two replicas of ``tf.distribute.MirroredStrategy`` (two logical CPUs), in float64, three ways:
TFP as it is (``tf.custom_gradient`` behind its factory), TFP with the library's decorator in its factory
(``tfp_patch.on_the_library``), and the truth, plain autodiff of the same formula written without sharding, on
one device. psum's declared gradient is a broadcast and a broadcast's is a psum, so a grad_fn calls the other
decorated function on its upstream, without end.

Run as ``python tfp_distributed_cases.py MODE OUT.json`` (MODE ``eager`` or ``function``), in a process of its
own: TensorFlow's collective executor, once a strategy ran eagerly, cannot run another under ``tf.function`` in
the same process (instance keys restart), and an error between an eager replica's collectives cancels it for
every later run. ``test_inside_tfp.py`` starts it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import logical_cpus  # noqa: F401  (two logical CPUs)
import mutants
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow_probability.python.internal import distribute_lib
from tfp_patch import on_the_library

mutants.apply_the_one_named()  # under make test-mutants, the one its test runs under: this process is the test's
tfd = tfp.distributions
REPLICAS = 2
AXIS = "i"

W = np.array(1.0)
X = np.array([[0.0, 1.0], [2.0, 3.0]])  # one row per replica
DATA = np.array([[2.0, 2.5], [1.5, 2.0]])
W_BATCH = np.array([[1.0, -0.5], [0.3, 2.0], [0.7, -1.0]])
X_BATCH = np.array([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]])  # replica r's x: [3]
DATA_BATCH = np.array([2.0, -1.0])
COUNTS = np.array([[1, 0], [0, 1]], np.int32)
T_W, T_X = np.array(0.5), np.array([[1.0, -2.0], [0.5, 3.0]])  # tangents


def _normal(loc, value):
    return tfd.Normal(tf.cast(loc, tf.float64), tf.constant(1.0, tf.float64)).log_prob(value)


def _gradient(fn: Callable[..., tf.Tensor], *values: tf.Tensor) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        tape.watch(values)
        y = fn(*values)
    return tape.gradient(y, list(values))


def _forward(fn: Callable[..., tf.Tensor], values: list[tf.Tensor], tangents: list[tf.Tensor]) -> tf.Tensor:
    with tf.autodiff.ForwardAccumulator(values, tangents) as accumulator:
        y = fn(*values)
    return accumulator.jvp(y)


def _value_and_gradient(fn: Callable[..., tf.Tensor]) -> Callable[..., list[tf.Tensor]]:
    return lambda *values: [fn(*values), *_gradient(fn, *values)]


def _sharded(parts: Callable[[Any], Any], axes: Any) -> Callable[..., tf.Tensor]:
    """The log prob of TFP's sharded parts: each sharded part summed over the replicas."""
    def log_prob(values: Any) -> tf.Tensor:
        return tf.add_n(tf.nest.flatten(distribute_lib.make_sharded_log_prob_parts(parts, axes)(values)))
    return log_prob


# ---------------------------------------------------------------- the cases: per replica, and the truth


def _global_parts(values):
    w, data = values
    return [_normal(0.0, w), tf.reduce_sum(_normal(w, data))]


def _local_parts(values):
    x, data = values
    return [tf.reduce_sum(_normal(0.0, x)), tf.reduce_sum(_normal(x, data))]


def _global_and_local_parts(values):
    w, x, data = values
    return [_normal(0.0, w), tf.reduce_sum(_normal(w, x)), tf.reduce_sum(_normal(x, data))]


def _dict_parts(values):
    return {"w": _normal(0.0, values["w"]), "x": tf.reduce_sum(_normal(values["w"], values["x"])),
            "data": tf.reduce_sum(_normal(values["x"], values["data"]))}


def _batched_parts(values):  # w of [3, 2]: a global value that is not a scalar, and squares for curvature
    w, x, data = values
    return [tf.reduce_sum(_normal(tf.zeros([2], tf.float64), w), -1), _normal(tf.reduce_sum(w, -1) ** 2, x),
            _normal(x ** 2, data)]


def _integer_parts(values):
    x, counts = values
    return [tf.reduce_sum(_normal(0.0, x)), tf.reduce_sum(tfd.Bernoulli(logits=x).log_prob(counts))]


def _disconnected_parts(values):
    w, x = values
    return [_normal(0.0, w), tf.reduce_sum(_normal(0.0, x))]


def _psum_function(in_axes, out_axes):
    return distribute_lib.make_psum_function(lambda a, b: a * b, in_axes, out_axes, out_dtype=tf.float64)


def _reduction(name):
    """The reduction over both axes of each replica's x and over the replicas (TF's pmax needs an all-gather)."""
    if name == "generic reduce_weighted_logsumexp":
        return lambda x: tfp.math.reduce_weighted_logsumexp(x, axis=[0, 1], experimental_named_axis=AXIS,
                                                            experimental_allow_all_gather=True)
    if name == "generic reduce_logmeanexp":
        return lambda x: tfp.math.reduce_logmeanexp(x, axis=[0, 1], experimental_named_axis=AXIS,
                                                    experimental_allow_all_gather=True)
    if name == "reduce_logsumexp":
        return lambda x: distribute_lib.reduce_logsumexp(x, axis=[0, 1], named_axis=AXIS, allow_all_gather=True)
    reduce = getattr(distribute_lib, name)
    return lambda x: reduce(x, axis=[0, 1], named_axis=AXIS)


def _unsharded_reduction(name):
    """The same reduction over every replica's rows at once (x of [R, 3, 2])."""
    reduce = {"reduce_sum": tf.reduce_sum, "reduce_mean": tf.reduce_mean, "reduce_logsumexp": tf.reduce_logsumexp,
              "generic reduce_weighted_logsumexp": tf.reduce_logsumexp,
              "generic reduce_logmeanexp": lambda x, axis: tf.reduce_logsumexp(x, axis) - np.log(x.shape.num_elements())
              }[name]
    return lambda x: reduce(x, axis=[0, 1, 2])


REDUCTIONS = ["reduce_sum", "reduce_mean", "reduce_logsumexp", "generic reduce_weighted_logsumexp",
              "generic reduce_logmeanexp"]
X_REDUCED = np.arange(REPLICAS * 6, dtype=np.float64).reshape(REPLICAS, 3, 2) / 5


def cases() -> dict[str, tuple[Callable[..., Any], tuple[bool, ...], tuple[Any, ...], Any]]:
    """name → (replica function, which arguments are sharded (their rows) or global, the arguments, the truth
    as one value per replica). The truths are plain autodiff on one device, of the formula summed over the
    replicas' rows."""
    c: dict[str, Any] = {}

    def full(w, x):  # Σ over replicas of the global-and-local log prob
        return _normal(0.0, w) + tf.reduce_sum(_normal(w, x)) + tf.reduce_sum(_normal(x, DATA))

    gw, gx = _gradient(full, tf.constant(W), tf.constant(X))

    c["global variable"] = (
        lambda w, data: _gradient(lambda w: _sharded(_global_parts, [None, AXIS])([w, data]), w),
        (False, True), (W, DATA),
        [_gradient(lambda w: _normal(0.0, w) + tf.reduce_sum(_normal(w, DATA)), tf.constant(W))] * REPLICAS)
    local = _gradient(lambda x: tf.reduce_sum(_normal(0.0, x)) + tf.reduce_sum(_normal(x, DATA)), tf.constant(X))[0]
    c["local variable"] = (
        lambda x, data: _gradient(lambda x: _sharded(_local_parts, [AXIS, AXIS])([x, data]), x),
        (True, True), (X, DATA), [[local[r]] for r in range(REPLICAS)])
    c["global and local variables"] = (
        lambda w, x, data: _gradient(lambda w, x: _sharded(_global_and_local_parts, [None, AXIS, AXIS])(
            [w, x, data]), w, x),
        (False, True, True), (W, X, DATA), [[gw, gx[r]] for r in range(REPLICAS)])
    c["global and local variables, a dict"] = (
        lambda w, x, data: _gradient(lambda w, x: _sharded(_dict_parts, {"w": None, "x": AXIS, "data": AXIS})(
            {"w": w, "x": x, "data": data}), w, x),
        (False, True, True), (W, X, DATA), [[gw, gx[r]] for r in range(REPLICAS)])
    c["global and local variables, forward mode"] = (
        lambda w, x, data, tw, tx: _forward(lambda w, x: _sharded(_global_and_local_parts, [None, AXIS, AXIS])(
            [w, x, data]), [w, x], [tw, tx]),
        (False, True, True, False, True), (W, X, DATA, T_W, T_X),
        [_forward(full, [tf.constant(W), tf.constant(X)], [tf.constant(T_W), tf.constant(T_X)])] * REPLICAS)

    def full_batch(w, x):  # x of [3, R]: replica r's x is column r
        return (tf.reduce_sum(_normal(tf.zeros([2], tf.float64), w), -1)
                + tf.reduce_sum(_normal(tf.reduce_sum(w, -1, keepdims=True) ** 2, x), -1)
                + tf.reduce_sum(_normal(x ** 2, DATA_BATCH), -1))

    bw, bx = _gradient(full_batch, tf.constant(W_BATCH), tf.constant(X_BATCH.T))
    c["global and local variables, batched"] = (
        lambda w, x, data: _gradient(lambda w, x: _sharded(_batched_parts, [None, AXIS, AXIS])([w, x, data]), w, x),
        (False, True, True), (W_BATCH, X_BATCH, DATA_BATCH), [[bw, bx[:, r]] for r in range(REPLICAS)])
    integer = _gradient(lambda x: tf.reduce_sum(_normal(0.0, x))
                        + tf.reduce_sum(tfd.Bernoulli(logits=x).log_prob(COUNTS)), tf.constant(X))[0]
    c["a local integer variable"] = (
        lambda x, counts: _gradient(lambda x: _sharded(_integer_parts, [AXIS, AXIS])([x, counts]), x),
        (True, True), (X, COUNTS), [[integer[r]] for r in range(REPLICAS)])
    c["disconnected variables"] = (
        lambda w, x: _gradient(lambda w, x: _sharded(_disconnected_parts, [None, AXIS])([w, x]), w, x),
        (False, True), (W, X), [[-W, -X[r]] for r in range(REPLICAS)])

    # a·b by make_psum_function: value and gradients (of the value's sum), per replica.
    y = np.array(2.0)
    psum_truths = {  # in_axes, out_axes → per replica r: value, d/dx, d/dy
        ((AXIS, AXIS), AXIS): lambda r: [np.sum(X * DATA, 0), DATA[r], X[r]],  # d/dx_r Σ_s x_s·y_s = y_r
        ((AXIS, None), AXIS): lambda r: [np.sum(X, 0) * y, np.full(2, y), np.sum(X)],  # y's sums every replica's
        ((AXIS, AXIS), None): lambda r: [X[r] * DATA[r], DATA[r], X[r]],
        ((AXIS, None), None): lambda r: [X[r] * y, np.full(2, y), np.sum(X[r])],  # each replica's own term
    }
    for (in_axes, out_axes), truth in psum_truths.items():
        both = in_axes[1] is not None
        c[f"psum function, in_axes {in_axes}, out_axes {out_axes}"] = (
            _value_and_gradient(_psum_function(in_axes, out_axes)), (True, both), (X, DATA if both else y),
            [truth(r) for r in range(REPLICAS)])

    for name in REDUCTIONS:
        whole = tf.constant(X_REDUCED)
        expected_value = _unsharded_reduction(name)(whole)
        expected_gradient = _gradient(_unsharded_reduction(name), whole)[0]
        c[f"reduction {name}"] = (
            _value_and_gradient(_reduction(name)), (True,), (X_REDUCED,),
            [[expected_value, expected_gradient[r]] for r in range(REPLICAS)])
    return c


# ---------------------------------------------------------------- running them


_STRATEGY: dict[str, tf.distribute.Strategy] = {}  # one for every case: a new one starts the instance keys anew


def _run(fn: Callable[..., Any], sharded: tuple[bool, ...], arguments: tuple[np.ndarray, ...],
         mode: str) -> list[list[np.ndarray]]:
    """fn on every replica, each given its row of a sharded argument; one list of numbers per replica."""
    devices = [f"/cpu:{r}" for r in range(REPLICAS)]
    if mode == "tf1":
        with tf.Graph().as_default():
            strategy = tf.compat.v1.distribute.MirroredStrategy(devices)

            def replica(*inputs):
                row = tf.distribute.get_replica_context().replica_id_in_sync_group
                return fn(*[tf.gather(t, row) if s else t for t, s in zip(inputs, sharded, strict=True)])

            with strategy.scope():
                results = strategy.run(replica, tuple(tf.constant(a) for a in arguments))
                per_replica = [strategy.experimental_local_results(r) for r in tf.nest.flatten(results)]
            with tf.compat.v1.Session() as session:
                per_replica = session.run(per_replica)
    else:
        strategy = _STRATEGY.setdefault("eager", tf.distribute.MirroredStrategy(devices))

        def rows(value):
            return strategy.experimental_distribute_values_from_function(
                lambda context: tf.constant(value[context.replica_id_in_sync_group]))

        inputs = tuple(rows(a) if s else tf.constant(a) for a, s in zip(arguments, sharded, strict=True))
        call = fn if mode == "eager" else tf.function(fn, autograph=False)
        results = strategy.run(call, inputs)
        per_replica = [strategy.experimental_local_results(r) for r in tf.nest.flatten(results)]
    return [[np.asarray(p[r]).tolist() for p in per_replica] for r in range(REPLICAS)]


def _outcome(fn, sharded, arguments, mode) -> Any:
    try:
        return _run(fn, sharded, arguments, mode)
    except Exception as error:  # recorded: the test says which must not fail
        return f"{type(error).__name__}: {str(error)[:400]}"


def main(mode: str, out: str) -> None:
    found = {}
    for name, (fn, sharded, arguments, truth) in cases().items():
        tfps = _outcome(fn, sharded, arguments, mode)
        with on_the_library():
            ours = _outcome(fn, sharded, arguments, mode)
        found[name] = {"truth": [[np.asarray(v).tolist() for v in tf.nest.flatten(row)] for row in truth],
                       "tfp": tfps, "ours": ours}
    with open(out, "w") as file:
        json.dump(found, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
