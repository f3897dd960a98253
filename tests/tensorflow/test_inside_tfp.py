"""The decorator standing in for tf.custom_gradient inside TFP's own custom-gradient factory, side by side.

TFP's factory (``tfp_patch``) wraps each decorated function anew at every call, and its functions' gradients
call other decorated functions: Student-t's CDF gradient differentiates betainc with ``value_and_gradient``
inside its grad_fn (a tape in eager mode, ``tf.gradients`` in a graph); a Bessel function's gradient calls
itself at order v ± 1; von Mises' sample gradient is implicit; mixture-same-family puts ``PreventGradient`` on
the upstream; the sharded log-prob parts pair a psum whose gradient is a broadcast with a broadcast whose
gradient is a psum (``tfp_distributed_cases.py``, on two replicas). ``test_tfp_sweep`` runs every function that
reaches the factory; this module holds the cases that once regressed, and the limits.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
import tfp_inside
from helpers import COMPILED_ULPS, MODES
from tfp_patch import on_the_library

tfd = tfp.distributions
ALL_MODES = [*MODES, "tf1"]


def _run(fn, args, mode):
    """fn(*args) as numbers, in one mode (TF1: a graph with tf.gradients-style tapes in a session)."""
    if mode == "tf1":
        with tf.Graph().as_default():
            result = fn(*[tf.constant(np.asarray(a)) for a in args])
            with tf.compat.v1.Session() as session:
                return session.run(result)
    wrapped = fn if mode == "eager" else tf.function(fn, jit_compile=mode == "xla")
    return tf.nest.map_structure(np.asarray, wrapped(*[tf.constant(a) for a in args]))


def _on_the_library(fn, args, mode):
    """fn's numbers with TFP's factory on the library's decorator."""
    with on_the_library():
        return _run(fn, args, mode)


def _ours_and_tfps(fn, args, mode):
    """fn's numbers with TFP's factory on the library's decorator, and on tf.custom_gradient."""
    return _on_the_library(fn, args, mode), _run(fn, args, mode)


def _gradient(value, sources):
    with tf.GradientTape() as tape:
        tape.watch(sources)
        y = value(*sources)
    return tape.gradient(y, sources)


def _student_t_cdf_gradient(df, x):
    return _gradient(lambda d, t: tfd.StudentT(d, 0.0, 1.0).cdf(t), [df, x])


@pytest.mark.parametrize("mode", ALL_MODES)
def test_student_t_cdf_gradient_differentiates_betainc_inside_its_grad_fn(mode):
    df, x = np.float32([2.5, 4.0, 30.0, 0.7]), np.float32([-1.0, 0.5, 2.0, -3.0])
    got, want = _ours_and_tfps(_student_t_cdf_gradient, (df, x), mode)
    np.testing.assert_allclose(got[1], tfd.StudentT(df, 0.0, 1.0).prob(x), rtol=1e-5)  # dF/dx is the density
    for ours, tfps in zip(got, want, strict=True):
        np.testing.assert_allclose(ours, tfps, rtol=1e-6)
        assert np.all(np.isfinite(ours))


def _von_mises_sample_gradient(concentration):
    return _gradient(lambda c: tfd.VonMises(0.0, c).sample(5, seed=(1, 2)), [concentration])[0]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_von_mises_implicit_sample_gradient(mode):
    got, want = _ours_and_tfps(_von_mises_sample_gradient, (np.float32([0.5, 2.0, 10.0]),), mode)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # XLA sums five samples in its own order
    assert np.any(got != 0)


def _mixture_sample_gradient(n):
    def gradient(loc):
        mixture = lambda m: tfd.MixtureSameFamily(tfd.Categorical(logits=[0.0, 1.0]),  # noqa: E731
                                                  tfd.Normal(m, 1.0), reparameterize=True)
        return _gradient(lambda m: mixture(m).sample(n, seed=(1, 2)), [loc])[0]

    return gradient


@pytest.mark.parametrize("mode", ALL_MODES)
def test_mixture_same_family_prevent_gradient_on_the_upstream_of_a_small_y(mode):
    """The reparameterized sample's grad_fn is PreventGradient(upstream): for a y of up to 16 elements the
    decorator builds its Jacobian from unit upstreams."""
    got, want = _ours_and_tfps(_mixture_sample_gradient(4), (np.float32([-1.0, 2.0]),), mode)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.any(got != 0)


def _mixture_sample_tangent(n):
    def tangent(loc):
        mixture = tfd.MixtureSameFamily(tfd.Categorical(logits=[0.0, 1.0]), tfd.Normal(loc, 1.0),
                                        reparameterize=True)
        with tf.autodiff.ForwardAccumulator(loc, tf.ones_like(loc)) as accumulator:
            sample = mixture.sample(n, seed=(1, 2))
        return accumulator.jvp(sample)

    return tangent


@pytest.mark.parametrize("mode", MODES)
def test_mixture_same_family_prevent_gradient_on_a_larger_y_gives_reverse_mode_alone(mode):
    """PreventGradient on the upstream of a y over 16 elements: reverse mode is TFP's own, grad_fn(upstream), bit
    for bit; forward mode, whose transpose PreventGradient hides, raises naming the op (the stated limit)."""
    got, want = _ours_and_tfps(_mixture_sample_gradient(17), (np.float32([-1.0, 2.0]),), mode)
    np.testing.assert_array_equal(got, want)
    assert np.any(got != 0)
    with pytest.raises(ValueError, match=r"Forward mode .*PreventGradient"):
        _on_the_library(_mixture_sample_tangent(17), (np.float32([-1.0, 2.0]),), mode)


def test_mixture_same_familys_second_derivative_raises_as_tfps():
    """TFP's PreventGradient in the grad_fn makes tf.custom_gradient raise on a second derivative; the decorator
    holds J constant at order=1, and its guard raises there instead
    (stopgrad_math.tensorflow.second_derivative_guard)."""
    def second(loc):
        with tf.GradientTape() as outer:
            outer.watch(loc)
            with tf.GradientTape() as inner:
                inner.watch(loc)
                mixture = tfd.MixtureSameFamily(tfd.Categorical(logits=[0.0, 1.0]), tfd.Normal(loc, 1.0),
                                                reparameterize=True)
                total = tf.reduce_sum(tf.sin(mixture.sample(4, seed=(1, 2))))
            first = inner.gradient(total, loc)
        return outer.gradient(first, loc)

    with pytest.raises(LookupError, match="Second derivative is not implemented"):
        _run(second, (np.float32([-1.0, 2.0]),), "eager")
    with pytest.raises(LookupError, match=r"custom_gradient\(order=2\)"):
        _on_the_library(second, (np.float32([-1.0, 2.0]),), "eager")


# ---------------------------------------------------------------- the functions that regressed (issue 31)
# Through TFP's factory, which wraps f anew at every call, the rule that ends a recursion took each wrapper for a
# new function (RecursionError under tf.function) and eager mode traced grad_fn at every call (75x TFP's time).

_Z = tfp_inside.POINT
REGRESSED = tfp_inside.REGRESSED
_value_and_gradient = tfp_inside.value_and_gradient


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REGRESSED)
def test_the_functions_that_regressed_give_tfps_value_and_gradient(name, mode):
    """Value bit for bit eagerly (within COMPILED_ULPS compiled, where fusion rounds), gradient to float32's
    rounding (XLA and the transpose sum in their own order), and the gradient checked against float64 central
    differences of TFP's own value, an independent truth."""
    fn = REGRESSED[name]
    got, want = _ours_and_tfps(_value_and_gradient(fn), (_Z,), mode)
    if mode == "eager":
        assert np.asarray(got[0]).view(np.uint32) == np.asarray(want[0]).view(np.uint32)
    else:
        np.testing.assert_array_max_ulp(np.asarray(got[0]), np.asarray(want[0]), maxulp=COMPILED_ULPS)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    step = 1e-3
    numeric = [(float(tf.reduce_sum(fn(tf.constant(_Z + step * e, tf.float32)))) -
                float(tf.reduce_sum(fn(tf.constant(_Z - step * e, tf.float32))))) / (2 * step) for e in np.eye(3)]
    np.testing.assert_allclose(got[1], numeric, rtol=5e-2, atol=1e-3)


def test_a_recursive_bessel_gradient_under_tf_function_ends_its_recursion():
    """log_bessel_kve's gradient calls log_bessel_kve at v ± 1 on constants: each call is a fresh wrapper from
    TFP's factory, and the same function (``function_identity``), so it is called alone, not embedded again."""
    fn = tf.function(_value_and_gradient(REGRESSED["log_bessel_kve([1.5, 2.5, 0.5], z)"]))
    with on_the_library() as calls:
        fn(tf.constant(_Z))
    # The call and its gradient's calls at v ± 1, embedded once, theirs called alone (16 on TFP 0.25); it was
    # without end, until Python's recursion limit.
    assert 2 <= calls.count <= 32


def test_eager_calls_after_the_first_trace_nothing(monkeypatch):
    """The route is kept per function and signature across TFP's fresh wrappers: a second eager call traces no
    grad_fn (it traced one at every call)."""
    from stopgrad_math.shared import bounded_cache
    from stopgrad_math.tensorflow import routes, transposition

    traced = []
    original = transposition.trace
    monkeypatch.setattr(transposition, "trace", lambda *a: traced.append(1) or original(*a))
    monkeypatch.setattr(routes, "_ROUTES", bounded_cache.BoundedCache(routes.ROUTES_KEPT))
    with on_the_library():
        fn = _value_and_gradient(REGRESSED["log_bessel_ive([1.5, 2.5, 0.5], z)"])
        fn(tf.constant(_Z))
        first = len(traced)
        fn(tf.constant(_Z))
    assert first >= 1 and len(traced) == first


# ---------------------------------------------------------------- TFP's collective cases in a replica context

_FORWARD = "global and local variables, forward mode"


def _collective_cases(mode, tmp_path):
    """``tfp_distributed_cases.py`` in a process of its own (its docstring says why): name → truth, TFP's numbers
    and ours, each one list per replica (or the error raised)."""
    import json
    import pathlib
    import subprocess
    import sys

    tests = pathlib.Path(__file__).parent
    out = tmp_path / f"{mode}.json"
    path = os.pathsep.join([str(tests), str(tests.parent / "project"), str(tests.parents[1] / "benchmarks")])
    result = subprocess.run([sys.executable, str(tests / "tfp_distributed_cases.py"), mode, str(out)],
                            capture_output=True, text=True, cwd=tests, env={**os.environ, "PYTHONPATH": path},
                            check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def _assert_rows_close(got, want, rtol, name):
    assert isinstance(got, list), f"{name}: {got}"
    assert len(got) == len(want), name
    for got_row, want_row in zip(got, want, strict=True):
        for g, w in zip(got_row, want_row, strict=True):
            np.testing.assert_allclose(np.asarray(g, float), np.asarray(w, float), rtol=rtol, atol=1e-14,
                                       err_msg=name)


@pytest.mark.parametrize("mode", ["eager", "function", "tf1"])
def test_tfps_collective_cases_on_two_replicas_are_exact_as_tfps(mode, tmp_path):
    """TFP's distribute_lib and generic collective cases (sharded log-prob parts with global and local variables,
    a dict, a batch, an integer variable, disconnected variables; psum functions; reductions with collectives)
    through the decorator in TFP's factory: the truth on every replica, as TFP as it is. They were refused
    ("8 deep": psum's gradient is a broadcast whose gradient is a psum) in graphs, and in eager mode each
    replica got its own gradient for a global variable, silently, before that. Truth: plain autodiff of the
    formula summed over the replicas' rows, on one device.

    The stated limit, TensorFlow's: under tf.function and in a TF1 graph, forward mode through a replica
    context's all-reduce carries no tangent (a bare ``all_reduce`` alike), so the forward-mode case gets only the
    global variable's own part, with TFP as it is as with the library."""
    found = _collective_cases(mode, tmp_path)
    assert len(found) == 17
    for name, case in found.items():
        if name == _FORWARD and mode != "eager":
            truth_without_collectives = [[-0.5]] * 2  # (d/dw log N(w; 0, 1) = −w = −1) · (t_w = 0.5)
            _assert_rows_close(case["tfp"], truth_without_collectives, 1e-14, name)
            _assert_rows_close(case["ours"], truth_without_collectives, 1e-14, name)
            continue
        _assert_rows_close(case["ours"], case["truth"], 1e-12, name)
        _assert_rows_close(case["ours"], case["tfp"], 1e-12, name)


def test_student_t_cdf_second_derivative_at_order_2_differentiates_betaincs_gradient_to_second_order():
    """Student-t's CDF gradient in df is betainc's gradient in (a, b), taken by value_and_gradient inside
    grad_fn: a second derivative needs betainc's second derivative, so a call inside a grad_fn of order 2 is
    embedded at order 2 too (at order 1 its J was a constant there: 0.0042 for the truth 0.0208). The truth:
    float64 central differences of TFP's own first derivative; TFP's second derivative is the same here."""
    df, t = np.float32([2.5, 4.0, 7.0]), np.float32([0.2, 0.5, 0.8])

    def second(df, t, dtype=tf.float32):
        df = tf.constant(df, dtype)
        with tf.GradientTape() as outer:
            outer.watch(df)
            with tf.GradientTape() as inner:
                inner.watch(df)
                y = tf.reduce_sum(tfd.StudentT(df, 0.0, 1.0).cdf(tf.constant(t, dtype)))
            first = tf.reduce_sum(inner.gradient(y, df))
        return outer.gradient(first, df).numpy(), first.numpy()

    with on_the_library(order=2):
        got = second(df, t)[0]
    h = 1e-5
    truth = [(second(df.astype(np.float64) + h * e, t, tf.float64)[1] -
              second(df.astype(np.float64) - h * e, t, tf.float64)[1]) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(got, truth, rtol=1e-2, atol=1e-5)
    np.testing.assert_allclose(got, second(df, t)[0], rtol=1e-3)  # TFP's own
