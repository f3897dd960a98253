"""Shared by the JAX tests: JAX's transforms, each as a way to get the derivative of an elementwise function (the
Jacobian's diagonal); awkward elementwise cases for hypothesis; a run on two host devices."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def _sum_of(fn):
    return lambda x: jnp.sum(fn(x))


def _jvp_along_ones(fn):
    return lambda x: jax.jvp(fn, (x,), (jnp.ones_like(x),))[1]


TRANSFORMS = {
    "grad": lambda fn, x: jax.grad(_sum_of(fn))(x),
    "value_and_grad": lambda fn, x: jax.value_and_grad(_sum_of(fn))(x)[1],
    "vjp": lambda fn, x: jax.vjp(fn, x)[1](jnp.ones_like(x))[0],
    "jvp": lambda fn, x: _jvp_along_ones(fn)(x),
    "jacfwd": lambda fn, x: jnp.diagonal(jax.jacfwd(fn)(x)),
    "jacrev": lambda fn, x: jnp.diagonal(jax.jacrev(fn)(x)),
    "vmap(grad)": lambda fn, x: jax.vmap(jax.grad(fn))(x),
    "jit(grad)": lambda fn, x: jax.jit(jax.grad(_sum_of(fn)))(x),
    "jit(jvp)": lambda fn, x: jax.jit(_jvp_along_ones(fn))(x),
    "vmap(jit(jvp))": lambda fn, x: jax.vmap(jax.jit(_jvp_along_ones(fn)))(x),
}
"""Each maps (fn, x) to the derivative of an elementwise fn at x along ones; vmap's variants call fn on scalars."""


AWKWARD = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, 3e4, 1e-30]


@st.composite
def elementwise_cases(draw):
    """(value, derivative, x) of one shape and one of the half, bfloat16 and single dtypes: the first two from
    AWKWARD, x finite, ±inf or NaN."""
    dtype = draw(st.sampled_from([jnp.float16, jnp.bfloat16, jnp.float32]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    values = st.sampled_from(AWKWARD)
    value, derivative = (np.array(draw(hnp.arrays(np.float64, shape, elements=values)), dtype) for _ in range(2))
    xs = st.sampled_from([0.5, -1.0, 2.0, np.inf, -np.inf, np.nan])
    x = np.array(draw(hnp.arrays(np.float64, shape, elements=xs)), dtype)
    return value, derivative, x


def run_on_two_host_devices(code: str) -> None:
    """Runs ``code`` in a fresh Python with two CPU devices (set before JAX starts); it must print "ok 2"."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "2"]
