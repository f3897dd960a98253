"""JAX's transforms, each as a way to get the derivative of an elementwise function (the Jacobian's diagonal)."""

import jax
import jax.numpy as jnp


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
