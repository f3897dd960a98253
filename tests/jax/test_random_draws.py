"""A draw in f (a noisy scale): JAX draws from a key, so f run again on the same key draws the same noise, and the
value and the derivative are one draw's in every mode, both forms, both orders, eagerly and under jit. A typed
key (``jax.random.key``) and a raw one (``PRNGKey``) are taken as jax.custom_vjp takes them, as an argument and
in the residuals. The truth is the noise drawn from the key, here, apart from any decorator."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

X = jnp.array([0.5, -1.5, 2.0, 0.25])
V = jnp.array([1.0, -2.0, 0.5, 3.0])
KEYS = {"typed key": jax.random.key(7), "raw key": jax.random.PRNGKey(7)}


def _noise(key):
    return jax.random.normal(key, X.shape)


def _decorated(order):
    @sgm.custom_gradient(order=order)
    def noisy_scale(x, key):
        noise = _noise(key)
        return x * noise, lambda grad: (grad * noise, None)

    return noisy_scale


def _custom_vjp(make, order=None):
    scale = make(lambda x, key: x * _noise(key)) if order is None else make(lambda x, key: x * _noise(key),
                                                                             order=order)
    scale.defvjp(lambda x, key: (x * _noise(key), _noise(key)), lambda noise, grad: (grad * noise, None))
    return scale


FORMS = {"decorator order=1": lambda: _decorated(1), "decorator order=2": lambda: _decorated(2),
         "custom_vjp order=1": lambda: _custom_vjp(sgm.custom_vjp, 1),
         "custom_vjp order=2": lambda: _custom_vjp(sgm.custom_vjp, 2)}
MODES = {
    "grad": lambda fn, key: jax.grad(lambda x: (fn(x, key) * V).sum())(X),
    "jit(grad)": lambda fn, key: jax.jit(jax.grad(lambda x: (fn(x, key) * V).sum()))(X),
    "jvp": lambda fn, key: jax.jvp(lambda x: fn(x, key), (X,), (V,))[1],
    "jit(jvp)": lambda fn, key: jax.jit(lambda x: jax.jvp(lambda x: fn(x, key), (x,), (V,))[1])(X),
    "jacfwd": lambda fn, key: jax.jacfwd(lambda x: fn(x, key))(X) @ V,
    "jacrev": lambda fn, key: jax.jacrev(lambda x: fn(x, key))(X) @ V,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("form", FORMS)
def test_the_value_and_derivative_are_the_keys_draw(form, key, mode):
    fn = FORMS[form]()
    noise = _noise(KEYS[key])
    assert jnp.array_equal(fn(X, KEYS[key]), X * noise)
    assert jnp.allclose(MODES[mode](fn, KEYS[key]), noise * V, rtol=1e-6, atol=0)


@pytest.mark.parametrize("key", KEYS)
def test_custom_vjp_with_a_key_in_its_residuals_is_jaxs_in_reverse_mode(key):
    theirs, ours = _custom_vjp(jax.custom_vjp), _custom_vjp(sgm.custom_vjp)
    assert jnp.array_equal(jax.grad(lambda x: (theirs(x, KEYS[key]) * V).sum())(X),
                           jax.grad(lambda x: (ours(x, KEYS[key]) * V).sum())(X))


@pytest.mark.parametrize("key", KEYS)
def test_vmap_over_keys_gives_each_keys_draw(key):
    keys = jax.random.split(KEYS[key], 3)
    fn = _custom_vjp(sgm.custom_vjp)
    gradients = jax.vmap(lambda k: jax.grad(lambda x: fn(x, k).sum())(X))(keys)
    assert jnp.array_equal(gradients, jax.vmap(_noise)(keys))
