"""A real tensorflow_probability.substrates.jax pipeline with a known gradient inside: a model's log-probability
using log1pexp, its gradient and JVP against autodiff of the stable formula, and a short jitted HMC chain.

TFP 0.25's JAX substrate imports with JAX 0.4.35 to 0.6.2 (it uses an API JAX removed in 0.7), so these tests
run in the oldest environment (``make test-oldest``) and are skipped, saying why, on a newer JAX.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from packaging.version import Version  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

if Version(jax.__version__) >= Version("0.7"):
    pytest.skip(f"TFP 0.25's JAX substrate does not import with JAX {jax.__version__} (0.4.35 to 0.6.2 only): "
                "run in make test-oldest", allow_module_level=True)

from tensorflow_probability.substrates import jax as tfp  # noqa: E402

tfd = tfp.distributions
DATA = jnp.array([0.5, 3.0, 1.2, 7.5, 2.2])


def log1pexp(x):
    return sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)


def log_prob(theta, softplus=log1pexp):
    """Poisson counts with rate softplus(theta) under a normal prior: softplus is where the known gradient is."""
    rate = softplus(theta)
    return tfd.Normal(0.0, 10.0).log_prob(theta) + jnp.sum(tfd.Gamma(1.0 + DATA, 1.0).log_prob(rate))


@pytest.mark.parametrize("theta", [-3.0, 0.5, 40.0, 100.0])
def test_the_log_prob_has_the_stable_formulas_gradient_and_jvp(theta):
    want = jax.grad(lambda t: log_prob(t, jax.nn.softplus))(theta)
    np.testing.assert_allclose(jax.grad(log_prob)(theta), want, rtol=1e-5)
    np.testing.assert_allclose(jax.jvp(log_prob, (theta,), (1.0,))[1], want, rtol=1e-5)
    assert np.isfinite(jax.grad(log_prob)(theta))


def test_tfps_own_custom_gradient_on_jax_gives_the_mean_in_forward_mode():
    """The wrong JVP the issue measured, as it is: each element gets the mean of the four sigmoids."""
    x = jnp.array([-1.0, 0.0, 2.0, 100.0])
    theirs = jax.jvp(lambda x: tfp.math.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x), (x,),
                     (jnp.ones(4),))[1]
    np.testing.assert_allclose(theirs, np.full(4, np.mean(jax.nn.sigmoid(x))), rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(log1pexp, (x,), (jnp.ones(4),))[1], jax.nn.sigmoid(x), rtol=1e-6)


def test_a_short_jitted_hmc_chain_matches_the_one_on_the_stable_formula():
    """The same seed and kernel on the library's log1pexp and on softplus: the same chain, to rounding."""
    def chain(softplus):
        kernel = tfp.mcmc.HamiltonianMonteCarlo(lambda t: log_prob(t, softplus), step_size=0.05, num_leapfrog_steps=5)
        run = jax.jit(lambda seed: tfp.mcmc.sample_chain(20, jnp.float32(1.0), kernel=kernel, trace_fn=None,
                                                         seed=seed))
        return run(jax.random.PRNGKey(0))

    ours, stable = chain(log1pexp), chain(jax.nn.softplus)
    np.testing.assert_allclose(ours, stable, rtol=1e-4)
    assert np.all(np.isfinite(ours)) and np.unique(np.asarray(ours)).size > 1  # it moved
