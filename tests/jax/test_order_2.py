"""Issue 58 on JAX: ``order=2`` keeps ``order=1``'s first derivatives bit for bit, its second derivative is the
Jacobian of the declared gradient (as jax.custom_vjp's reverse over reverse gives it, unsymmetrized), and a VJP is
judged where a derivative is asked.

The cases are rules people write custom gradients for, restated: a norm guarded at the zero vector, a softplus
whose rule selects between two branches (one overflowing where it is not taken), a logsumexp with an infinite
operand, a cross-entropy whose declared gradient w.r.t. the targets assumes they sum to one (so it is no gradient
of a function, and its Jacobian is not symmetric), and a clip of the cotangent.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402


def guarded_norm(x):
    norm = jnp.sqrt(jnp.sum(x * x))
    positive = norm > 0
    return norm, lambda ct: (ct * jnp.where(positive, x / jnp.where(positive, norm, 1.0), 0.0),)


def selected_softplus(x):  # the rule's untaken branch, exp(x), overflows at x = 100 in float32
    return jnp.sum(jnp.logaddexp(x, 0.0)), lambda ct: (ct * jnp.where(x < -9.0, jnp.exp(x), jax.nn.sigmoid(x)),)


def logsumexp(x):
    y = jnp.log(jnp.sum(jnp.exp(x)))
    return y, lambda ct: (ct * jnp.exp(x - y),)


def cross_entropy(logits, targets):  # d/dtargets = −log_softmax, whatever the targets sum to
    log_p = jax.nn.log_softmax(logits)
    return -jnp.sum(targets * log_p), lambda ct: (ct * (jnp.exp(log_p) - targets), -ct * log_p)


def elementwise_softplus(x):  # a vector output: J·v is the embedded linear map, not vjp(1)
    return jnp.logaddexp(x, 0.0), lambda ct: (ct * jnp.where(x < -9.0, jnp.exp(x), jax.nn.sigmoid(x)),)


def as_custom_vjp(rule):
    """The same rule as jax.custom_vjp: the anchor where it works (reverse mode, its compositions)."""
    anchor = jax.custom_vjp(lambda *args: rule(*args)[0])
    anchor.defvjp(lambda *args: (rule(*args)[0], args), lambda args, ct: tuple(rule(*args)[1](ct)))
    return anchor


FIRST_DERIVATIVES = {  # of a function with a scalar value
    "grad": lambda fn, x: jax.grad(fn)(x),
    "jit(grad)": lambda fn, x: jax.jit(jax.grad(fn))(x),
    "jacrev": lambda fn, x: jax.jacrev(fn)(x),
    "jacfwd": lambda fn, x: jax.jacfwd(fn)(x),
    "jvp": lambda fn, x: jnp.stack([jax.jvp(fn, (x,), (e,))[1] for e in jnp.eye(x.size, dtype=x.dtype)]),
    "vmap(grad)": lambda fn, x: jax.vmap(jax.grad(fn))(x[None])[0],
    "grad under an outer jvp": lambda fn, x: jax.jvp(jax.grad(fn), (x,), (jnp.ones_like(x),))[0],
    "value's jacfwd beside grad": lambda fn, x: jax.jacfwd(lambda x: (fn(x), jax.grad(fn)(x)))(x)[0],
}
POINTS = {
    "guarded norm at zero": (guarded_norm, np.zeros(3, np.float32)),
    "guarded norm": (guarded_norm, np.array([3.0, 4.0, 0.0], np.float32)),
    "selected softplus at 100": (selected_softplus, np.array([100.0], np.float32)),
    "selected softplus at -20": (selected_softplus, np.array([-20.0], np.float32)),
    "logsumexp with +inf": (logsumexp, np.array([0.0, np.inf, 1.0], np.float32)),
}


@pytest.mark.parametrize("mode", FIRST_DERIVATIVES)
@pytest.mark.parametrize("point", POINTS)
def test_order_2_gives_order_1s_first_derivative_bit_for_bit(point, mode):
    """Under an outer derivative order=1 raises (the outer one would be a second derivative), so there the first
    derivative is compared with order=1's by the same transform alone."""
    rule, x = POINTS[point]
    alone = {"grad under an outer jvp": "grad", "value's jacfwd beside grad": "jacfwd"}.get(mode, mode)
    first = FIRST_DERIVATIVES[alone](sgm.custom_gradient(rule, order=1), jnp.asarray(x))
    second = FIRST_DERIVATIVES[mode](sgm.custom_gradient(rule, order=2), jnp.asarray(x))
    np.testing.assert_array_equal(bits(second), bits(first))


@pytest.mark.parametrize("point", POINTS)
def test_the_first_derivative_is_the_rules_as_jax_custom_vjp_gives_it(point):
    """The independent truth: the rule evaluated by hand, and jax.custom_vjp's reverse mode of it."""
    rule, x = POINTS[point]
    x = jnp.asarray(x)
    declared = rule(x)[1](jnp.ones((), x.dtype))[0]
    np.testing.assert_array_equal(jax.grad(as_custom_vjp(rule))(x), declared)
    np.testing.assert_array_equal(jax.grad(sgm.custom_gradient(rule, order=2))(x), declared)


def test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows():
    x = jnp.array([100.0, -20.0, 0.0, 88.0], jnp.float32)
    for way in (lambda fn: jax.grad(lambda x: jnp.sum(fn(x)))(x), lambda fn: jax.jvp(fn, (x,), (jnp.ones(4),))[1],
                lambda fn: jnp.diagonal(jax.jacfwd(fn)(x)), lambda fn: jax.vmap(jax.grad(fn))(x),
                lambda fn: jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(x)):  # (eager grad runs f below: no J's tangent)
        first, second = (way(sgm.custom_gradient(elementwise_softplus, order=order)) for order in (1, 2))
        np.testing.assert_array_equal(bits(second), bits(first))
        np.testing.assert_array_equal(second, jnp.where(x < -9.0, jnp.exp(x), jax.nn.sigmoid(x)))


def finite_differences_of(gradient, x, step=1e-6):
    """The Jacobian of a declared gradient by central differences in float64: column k is its change along e_k."""
    x = np.asarray(x, np.float64)
    columns = [(np.asarray(gradient(x + step * e)) - np.asarray(gradient(x - step * e))) / (2 * step)
               for e in np.eye(x.size)]
    return np.stack(columns, axis=-1)


SECOND_DERIVATIVES = {  # of a function of one flat argument; each gives the Jacobian of its gradient
    "hessian": lambda fn, x: jax.hessian(fn)(x),
    "jacfwd(grad)": lambda fn, x: jax.jacfwd(jax.grad(fn))(x),
    "jacrev(grad)": lambda fn, x: jax.jacrev(jax.grad(fn))(x),
    "jit(hessian)": lambda fn, x: jax.jit(jax.hessian(fn))(x),
    "vmap(hessian)": lambda fn, x: jax.vmap(jax.hessian(fn))(x[None])[0],
    "hvp rows": lambda fn, x: jnp.stack([jax.jvp(jax.grad(fn), (x,), (e,))[1] for e in jnp.eye(x.size)], -1),
    "in fori_loop": lambda fn, x: jax.hessian(lambda x: jax.lax.fori_loop(0, 1, lambda _, c: c + fn(x), 0.0))(x),
}


def flat_cross_entropy(z):
    value, vjp = cross_entropy(z[:3], z[3:])
    return value, lambda ct: (jnp.concatenate(vjp(ct)),)


@pytest.mark.parametrize("way", SECOND_DERIVATIVES)
def test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized(float64, way):
    """t5x's rule declares softmax − t and −log_softmax: ∂/∂t of the first is −1, ∂/∂logits of the second is
    −(I − softmax), so the Hessian of the pair is not symmetric. jax.custom_vjp's reverse over reverse and finite
    differences of the rule give that Jacobian; order=2 gives it in every composition (it gave their average)."""
    z = jnp.array([1.0, 2.0, 0.5, 0.2, 0.5, 0.3], jnp.float64)
    declared = lambda z: flat_cross_entropy(jnp.asarray(z))[1](1.0)[0]  # noqa: E731
    truth = finite_differences_of(declared, z)
    anchor = jax.jacrev(jax.grad(as_custom_vjp(flat_cross_entropy)))(z)
    ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(flat_cross_entropy, order=2), z)
    np.testing.assert_allclose(anchor, truth, atol=1e-8)
    np.testing.assert_allclose(ours, anchor, rtol=1e-12, atol=1e-14)
    assert not np.allclose(ours, ours.T, atol=0.1)  # the cross blocks differ: −1 against −0.735 and so on


@pytest.mark.parametrize("way", ["hessian", "jacrev(grad)", "hvp rows"])
def test_second_derivatives_of_the_guarded_rules_are_autodiff_of_the_rule(float64, way):
    """The truth is JAX's autodiff of the rule as a function, by the outer transform's mode: at the zero vector the
    guarded norm's rule has no derivative, forward mode masks the untaken branch (0) and reverse mode does not (NaN:
    0·∞ through the norm's sqrt), and jax.custom_vjp's reverse over reverse gives the same NaN."""
    outer = jax.jacrev if way == "jacrev(grad)" else jax.jacfwd
    for rule, x in [(guarded_norm, [3.0, 4.0, 1.0]), (guarded_norm, [0.0, 0.0, 0.0]),
                    (selected_softplus, [0.7]), (selected_softplus, [-30.0])]:
        x = jnp.asarray(x, jnp.float64)
        ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(rule, order=2), x)
        np.testing.assert_allclose(ours, outer(lambda x, rule=rule: rule(x)[1](1.0)[0])(x), rtol=1e-12, atol=1e-15)
        if way == "jacrev(grad)":
            np.testing.assert_allclose(ours, jax.jacrev(jax.grad(as_custom_vjp(rule)))(x), rtol=1e-12, atol=1e-15)


def test_the_second_derivative_of_a_vector_output_is_the_jacobian_of_its_declared_jacobian():
    """A rule that is no derivative of its value: y = x·x[::-1] with the declared J = diag(x[::-1]) (the product
    rule's other half left out). Its second derivative ∂J_ij/∂x_k is 1 where j = i and k = n−1−i; jax.custom_vjp's
    jacrev(jacrev) gives the same; the true function's would add the other half."""
    def half_product(x):
        return x * x[::-1], lambda ct: (ct * x[::-1],)

    x = jnp.array([1.0, 2.0, 3.0])
    truth = np.zeros((3, 3, 3))
    for i in range(3):
        truth[i, i, 2 - i] = 1.0
    anchor = jax.jacrev(jax.jacrev(as_custom_vjp(half_product)))(x)
    np.testing.assert_array_equal(anchor, truth)
    for way in (jax.jacfwd(jax.jacrev(sgm.custom_gradient(half_product, order=2))),
                jax.jacrev(jax.jacrev(sgm.custom_gradient(half_product, order=2))),
                jax.jacfwd(jax.jacfwd(sgm.custom_gradient(half_product, order=2)))):
        np.testing.assert_array_equal(way(x), truth)


def test_what_f_closes_over_gets_autodiff_with_the_arguments_held_and_an_argument_gets_the_whole_jacobian():
    """The decided limit (issue 58): the derivative w.r.t. a value f closes over is autodiff of f at stop(x), so
    its own derivative w.r.t. x is 0, while ∂/∂θ of the declared ∂/∂x is the rule's; passed as an argument whose
    cotangent the VJP returns, θ gets the whole Jacobian, jax.custom_vjp's."""
    x, theta = 0.7, 1.3

    def closing_over(x, theta):
        return sgm.custom_gradient(lambda x: (theta * jnp.sin(x), lambda ct: (ct * theta * jnp.cos(x),)),
                                   order=2)(x)

    def rule(x, theta):
        return theta * jnp.sin(x), lambda ct: (ct * theta * jnp.cos(x), ct * jnp.sin(x))

    closed = jax.jacrev(jax.grad(closing_over, argnums=(0, 1)), argnums=(0, 1))(x, theta)
    assert float(closed[0][1]) == pytest.approx(np.cos(x))  # d/dθ of the declared d/dx
    assert float(closed[1][0]) == 0.0  # d/dx of autodiff's d/dθ at stop(x): the limit
    passed = jax.jacrev(jax.grad(sgm.custom_gradient(rule, order=2), argnums=(0, 1)), argnums=(0, 1))(x, theta)
    anchor = jax.jacrev(jax.grad(as_custom_vjp(rule), argnums=(0, 1)), argnums=(0, 1))(x, theta)
    np.testing.assert_allclose(np.array(passed), np.array(anchor), rtol=1e-6)
    assert float(passed[1][0]) == pytest.approx(np.cos(x))


def clip_gradient(lo, hi, x):  # JAX's documented example: a bwd that clips its cotangent
    return x, lambda ct: (None, None, jnp.clip(ct, lo, hi))


@pytest.mark.parametrize("order", [1, 2])
def test_a_vjp_that_clips_gives_the_value_where_no_derivative_is_asked_and_is_refused_where_one_is(order):
    f = sgm.custom_gradient(clip_gradient, order=order)
    x = jnp.array([1.0, -2.0])
    for call in (lambda: f(-0.5, 0.5, x), lambda: jax.jit(f)(-0.5, 0.5, x),
                 lambda: jax.vmap(f, (None, None, 0))(-0.5, 0.5, x[:, None])[:, 0]):
        np.testing.assert_array_equal(call(), x)
    with pytest.raises(ValueError, match=r"clip_gradient is not linear.*max"):
        jax.grad(lambda x: jnp.sum(f(-0.5, 0.5, x)))(x)
    with pytest.raises(ValueError, match=r"clip_gradient is not linear"):
        jax.jvp(lambda x: f(-0.5, 0.5, x), (x,), (x,))
