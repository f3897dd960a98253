"""The decorator standing in for tf.custom_gradient inside TFP's own custom-gradient factory, side by side.

TFP builds its TensorFlow gradients with ``tf.custom_gradient``, called from one factory
(``tensorflow_probability.python.internal.custom_gradient``) each time a decorated function runs. Patching
that one name runs TFP's real code on the library: Student-t's CDF gradient, which differentiates betainc
with ``value_and_gradient`` inside its grad_fn (a tape in eager mode, ``tf.gradients`` in a graph); von
Mises' implicit sample gradient; and mixture-same-family's ``PreventGradient`` on the upstream.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from helpers import MODES
from tensorflow_probability.python.internal import custom_gradient as tfp_factory

import stopgrad_math

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
    namespace = types.SimpleNamespace(**{name: getattr(tf, name) for name in dir(tf) if not name.startswith("__")})
    namespace.custom_gradient = stopgrad_math.custom_gradient
    tfp_factory.tf = namespace
    try:
        return _run(fn, args, mode)
    finally:
        tfp_factory.tf = tf


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


@pytest.mark.parametrize("mode", MODES)
def test_mixture_same_family_prevent_gradient_on_a_larger_y_is_refused(mode):
    """The stated limit: PreventGradient on the upstream of a y over 16 elements raises, naming the op."""
    with pytest.raises(ValueError, match="PreventGradient"):
        _ours_and_tfps(_mixture_sample_gradient(17), (np.float32([-1.0, 2.0]),), mode)


def test_mixture_same_familys_second_derivative_raises_as_tfps():
    """TFP's PreventGradient in the grad_fn makes tf.custom_gradient raise on a second derivative; the decorator
    holds J constant at order=1, and its guard raises there instead (stopgrad_math.second_derivative_guard)."""
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
