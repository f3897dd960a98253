"""The JAX decorator's second-derivative guard (stopgrad_math.jax.second_derivative_guard) in every nesting of a
loop with JAX's transforms: at order=1 a second derivative raises naming order=2; at order=2 it equals autodiff of
the same function written plainly, and the third raises. First derivatives pass the guard in every nesting.

Differentiating a scan or fori_loop partially evaluates the loop's body to hoist what is loop-invariant, and JAX
inlines a jax.custom_jvp there without its rule: a fence built as one was silently 0 in these nestings."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402


def _sine(x):
    return jnp.sin(x), lambda g: g * jnp.cos(x)


def _product(a, b):
    return a * b, lambda g: (g * b, g * a)


SINE = {1: sgm.custom_gradient(_sine), 2: sgm.custom_gradient(_sine, order=2)}
PRODUCT = {1: sgm.custom_gradient(_product), 2: sgm.custom_gradient(_product, order=2)}


def _in_scan(cell):
    return lambda x: jax.lax.scan(lambda c, _: (cell(c), None), x, None, length=2)[0]


def _in_fori_loop(cell):
    return lambda x: jax.lax.fori_loop(0, 2, lambda i, c: cell(c), x)


def _scan_in_scan(cell):
    return _in_scan(_in_scan(cell))


def _jit_in_scan(cell):
    return _in_scan(jax.jit(cell))


def _scan_in_jit(cell):
    return jax.jit(_in_scan(cell))


def _checkpoint_in_scan(cell):
    return _in_scan(jax.checkpoint(cell))


def _cond_in_fori_loop(cell):
    return _in_fori_loop(lambda c: jax.lax.cond(c > -10.0, cell, lambda c: c, c))


LOOPS = {
    "scan": _in_scan, "fori_loop": _in_fori_loop, "scan in scan": _scan_in_scan, "jit in scan": _jit_in_scan,
    "scan in jit": _scan_in_jit, "checkpoint in scan": _checkpoint_in_scan, "cond in fori_loop": _cond_in_fori_loop,
}

# Each: a scalar function's second derivative, and its third (for order=2's guard).
SECOND = {
    "grad(grad)": lambda fn: jax.grad(jax.grad(fn)),
    "hessian": jax.hessian,
    "jacfwd(grad)": lambda fn: jax.jacfwd(jax.grad(fn)),
    "jacrev(jacfwd)": lambda fn: jax.jacrev(jax.jacfwd(fn)),
    "jvp(grad)": lambda fn: lambda x: jax.jvp(jax.grad(fn), (x,), (jnp.ones_like(x),))[1],
    "jit(grad(grad))": lambda fn: jax.jit(jax.grad(jax.grad(fn))),
    "vmap(grad(grad))": lambda fn: lambda x: jax.vmap(jax.grad(jax.grad(fn)))(x[None])[0],
}

# The cells, and the same function written plainly: its autodiff is the truth.
CELLS = {
    "sin": (lambda order: SINE[order], jnp.sin),
    "two arguments": (lambda order: lambda c: PRODUCT[order](c, c + 0.5), lambda c: c * (c + 0.5)),
}

X = jnp.float32(0.7)


@pytest.mark.parametrize("second", SECOND)
@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("cell", CELLS)
def test_order_1_raises_and_order_2_is_exact_in_every_nesting(cell, loop, second):
    decorated, plain = CELLS[cell]
    take = SECOND[second]
    with pytest.raises(LookupError, match=r"order=1.*custom_gradient\(order=2\)"):
        take(LOOPS[loop](decorated(1)))(X)
    want = take(LOOPS[loop](plain))(X)
    np.testing.assert_allclose(take(LOOPS[loop](decorated(2)))(X), want, rtol=2e-5)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("cell", CELLS)
def test_first_derivatives_pass_the_guard_and_a_third_raises_at_order_2(cell, loop):
    decorated, plain = CELLS[cell]
    want = jax.grad(LOOPS[loop](plain))(X)
    for order in (1, 2):
        np.testing.assert_allclose(jax.grad(LOOPS[loop](decorated(order)))(X), want, rtol=1e-6)
        np.testing.assert_allclose(jax.jacfwd(LOOPS[loop](decorated(order)))(X), want, rtol=1e-6)
    with pytest.raises(LookupError, match="third derivative"):
        jax.grad(jax.grad(jax.grad(LOOPS[loop](decorated(2)))))(X)


def test_a_while_loop_forward_over_forward_raises_at_order_1():
    # while_loop has no reverse mode: its second derivative is jacfwd's, over a while whose body JAX also hoists
    def in_while(x):
        return jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, SINE[1](c[1])), (0, x))[1]

    with pytest.raises(LookupError, match="order=2"):
        jax.jacfwd(jax.jacfwd(in_while))(X)


def test_the_fence_is_one_fence_for_a_batch_and_folds_away_under_jit():
    fn = jax.jit(jax.vmap(jax.grad(SINE[1])))
    np.testing.assert_allclose(fn(jnp.array([0.1, 0.2])), jnp.cos(jnp.array([0.1, 0.2])), rtol=1e-6)
    hlo = fn.lower(jnp.array([0.1, 0.2])).compile().as_text()
    assert "stopgrad_math_fence" not in hlo
