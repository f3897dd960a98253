"""``stopgrad_math.jax.custom_vjp``: an existing ``jax.custom_vjp``'s fun, fwd and bwd, unchanged (issue 55), in
the modes jax.custom_vjp lacks. JAX's own cases, side by side with jax.custom_vjp, are in
tests/jax/test_custom_vjp_cases.py; here the truth is analytic, or jax.custom_vjp's reverse mode where it has one,
or autodiff of a stable formula."""

import functools
import pathlib
import re

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import custom_derivatives  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402


def _log1pexp(make, **options):
    """log(1 + eˣ), its fwd calling the function itself (as JAX's docs write one), its bwd g·σ(x)."""
    f = make(lambda x: jnp.log1p(jnp.exp(x)), **options)
    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))
    return f


XS = jnp.array([-3.0, 0.5, 30.0])


def test_every_first_order_mode_gives_the_bwds_derivative_eagerly_under_jit_and_vmap():
    ours = _log1pexp(sgm.custom_vjp)
    want = np.asarray(jax.nn.sigmoid(XS))
    for transform in (lambda g: g, jax.jit):
        np.testing.assert_array_equal(transform(jax.vmap(jax.grad(ours)))(XS), want)
        np.testing.assert_array_equal(transform(lambda x: jax.jvp(ours, (x,), (jnp.ones(3),))[1])(XS), want)
        np.testing.assert_array_equal(np.diag(transform(jax.jacfwd(ours))(XS)), want)
        np.testing.assert_array_equal(np.diag(transform(jax.jacrev(ours))(XS)), want)
        np.testing.assert_array_equal(transform(lambda x: jax.linearize(ours, x)[1](jnp.ones(3)))(XS), want)
    theirs = _log1pexp(jax.custom_vjp)
    np.testing.assert_array_equal(jax.vmap(jax.grad(ours))(XS), jax.vmap(jax.grad(theirs))(XS))


def test_a_hessian_is_exact_by_default_and_raises_at_order_1_naming_order_2():
    """σ′(x) = σ(x)(1 − σ(x)): the derivative of the bwd, as jax.custom_vjp's grad of grad gives it (issue 55: the
    class defaults to order=2, as jax.custom_vjp is differentiable twice)."""
    with pytest.raises(LookupError, match=r"order=2"):
        jax.hessian(_log1pexp(sgm.custom_vjp, order=1))(0.5)
    sigmoid = jax.nn.sigmoid(XS)
    want = np.asarray(sigmoid * (1 - sigmoid))
    ours, theirs = _log1pexp(sgm.custom_vjp), _log1pexp(jax.custom_vjp)
    np.testing.assert_allclose(jax.vmap(jax.hessian(ours))(XS), want, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(jax.grad(jax.grad(theirs)))(XS), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.jacfwd(jax.grad(ours))))(XS), want, rtol=1e-6)


def test_nondiff_argnames_and_a_keyword_argument_are_placed_by_the_signature():
    @functools.partial(sgm.custom_vjp, nondiff_argnames=("power",))
    def powered(x, power=3):
        return x**power

    powered.defvjp(lambda x, power: (x**power, x), lambda power, x, g: (g * power * x ** (power - 1),))
    assert float(jax.jvp(lambda x: powered(x, power=2), (3.0,), (1.0,))[1]) == 6.0
    assert float(jax.grad(powered)(2.0)) == 12.0


def test_a_method_takes_its_instance_as_a_non_differentiated_argument():
    class Scaler:
        def __init__(self, scale):
            self.scale = scale

        @functools.partial(sgm.custom_vjp, nondiff_argnums=(0,))
        def __call__(self, x):
            return self.scale * x

    Scaler.__call__.defvjp(lambda self, x: (self.scale * x, None), lambda self, _, g: (2 * self.scale * g,))
    assert float(jax.jvp(Scaler(3.0), (1.0,), (1.0,))[1]) == 6.0  # the bwd's 2·scale, not autodiff's scale


def _recording_perturbed(make):
    """x·y whose fwd records the perturbed flags it is given; its bwd skips y's cotangent where y is not perturbed,
    as JAX allows."""
    seen = []

    def fwd(x, y):
        seen.append((x.perturbed, y.perturbed))
        return x.value * y.value, (x.value, y.value, y.perturbed)

    def bwd(residuals, g):
        assert not isinstance(g, custom_derivatives.SymbolicZero)
        x, y, y_perturbed = residuals
        return g * y, g * x if y_perturbed else None

    product = make(lambda x, y: x * y)
    product.defvjp(fwd, bwd, symbolic_zeros=True)
    return product, seen


def test_symbolic_zeros_gives_fwd_primals_perturbed_as_jax_where_it_can_be_known():
    """Issue 76: every argument was marked perturbed. Where an argument can never be differentiated (a concrete value,
    or one vmap batches), it is not perturbed, as JAX says; under jit, where a derivative may be taken later,
    every argument is (JAX, deciding as it differentiates, may say false there), so a fwd that drops what a
    non-perturbed argument's cotangent needs never loses a gradient taken after all."""
    ways = {"grad x": lambda f: jax.grad(f)(2.0, 5.0), "grad y": lambda f: jax.grad(f, 1)(2.0, 5.0),
            "grad both": lambda f: jax.grad(f, (0, 1))(2.0, 5.0),
            "vmap(grad x)": lambda f: jax.vmap(jax.grad(f))(jnp.ones(2), jnp.ones(2)),
            "jvp x": lambda f: jax.jvp(lambda x: f(x, 5.0), (2.0,), (1.0,))[1]}
    for way, run in ways.items():
        (ours, mine), (theirs, jaxs) = _recording_perturbed(sgm.custom_vjp), _recording_perturbed(jax.custom_vjp)
        if way != "jvp x":  # (jax.custom_vjp has no forward mode)
            assert jax.tree.map(float, jax.tree.map(jnp.sum, run(ours))) == \
                jax.tree.map(float, jax.tree.map(jnp.sum, run(theirs)))
            assert set(mine) == set(jaxs), way
        else:
            assert float(run(ours)) == 5.0 and set(mine) == {(True, False)}
    ours, mine = _recording_perturbed(sgm.custom_vjp)
    assert jax.jit(jax.grad(ours, 1))(2.0, 5.0) == 2.0  # (under jit both perturbed: y's gradient is there)
    assert set(mine) == {(True, True)}


def test_a_custom_jvp_inside_fun_is_not_preferred_in_any_mode():
    """Decided (docs/existing_code.md): the bwd defines every mode. fun is a custom_jvp whose rule says 10; the
    bwd says 2: grad, jvp and jacfwd all give 2 (jax.custom_vjp's grad gives 2 as well, and has no jvp)."""
    inner = jax.custom_jvp(lambda x: 2.0 * x)
    inner.defjvp(lambda primals, tangents: (inner(primals[0]), 10.0 * tangents[0]))
    ours, theirs = sgm.custom_vjp(inner), jax.custom_vjp(inner)
    for f in (ours, theirs):
        f.defvjp(lambda x: (inner(x), None), lambda _, g: (2.0 * g,))
    assert float(jax.grad(ours)(1.0)) == float(jax.grad(theirs)(1.0)) == 2.0
    assert float(jax.jvp(ours, (1.0,), (1.0,))[1]) == float(jax.jacfwd(ours)(1.0)) == 2.0


def test_a_call_that_asks_no_derivative_runs_whatever_the_bwd():
    """A bwd that clips its cotangent: a plain call, under jit and vmap, gives fun's value (JAX's own
    clip_gradient example), as jax.custom_vjp does."""
    clip = sgm.custom_vjp(lambda lo, hi, x: x)
    clip.defvjp(lambda lo, hi, x: (x, (lo, hi)), lambda r, g: (None, None, jnp.clip(g, *r)))
    assert float(clip(-1.0, 1.0, 3.0)) == 3.0
    np.testing.assert_array_equal(jax.jit(jax.vmap(lambda x: clip(-1.0, 1.0, x)))(XS), XS)


def test_a_plain_eager_call_runs_fun_alone_as_jax_custom_vjp_does():
    """Issue 75: eagerly, on concrete values, no derivative of the call can be asked, and jax.custom_vjp runs fun
    alone, neither fwd nor bwd; so does ours, at fun's cost, with fun's value where fwd's output differs from it
    (here on purpose) and a bwd that raises never reached."""
    ran = []

    def fun(x):
        ran.append("fun")
        return x + 1.0

    def fwd(x):
        ran.append("fwd")
        return x + 2.0, x

    def bwd(x, g):
        raise AssertionError("a plain call ran the bwd")

    ours, theirs = sgm.custom_vjp(fun), jax.custom_vjp(fun)
    for f in (ours, theirs):
        f.defvjp(fwd, bwd)
    mine = ours(XS)
    assert ran == ["fun"]
    np.testing.assert_array_equal(mine, theirs(XS))
    np.testing.assert_array_equal(mine, np.asarray(XS) + np.float32(1.0))
    assert ran == ["fun", "fun"]


def test_the_docs_example_runs_and_gives_the_bwds_derivative():
    text = (pathlib.Path(__file__).parents[2] / "docs" / "existing_code.md").read_text()
    namespace = {}
    exec(re.findall(r"```python\n(.*?)```", text.split("## JAX")[1], re.S)[0], namespace)
    f = namespace["log1pexp"]
    np.testing.assert_allclose(jax.jvp(f, (3.0,), (1.0,))[1], jax.nn.sigmoid(3.0), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(f)))(XS), jax.nn.sigmoid(XS), rtol=1e-6)


def _cross_entropy_of(make):
    """A cross-entropy with a z-loss as t5x writes it: ``fun`` through logsumexp, ``fwd`` through the shifted
    exponentials it saves for the ``bwd``, so that the two round differently, and differ at a +inf logit."""
    def fun(logits, targets, z_loss):
        log_z = jax.nn.logsumexp(logits, axis=-1)
        return -jnp.sum(targets * (logits - log_z[..., None]), axis=-1) + z_loss * log_z**2

    def fwd(logits, targets, z_loss):
        top = logits.max(axis=-1, keepdims=True)
        exponentials = jnp.exp(logits - top)
        total = exponentials.sum(axis=-1, keepdims=True)
        log_softmax = logits - top - jnp.log(total)
        log_z = (jnp.log(total) + top)[..., 0]
        loss = -jnp.sum(targets * log_softmax, axis=-1) + z_loss * log_z**2
        return loss, (targets, z_loss, exponentials / total, log_softmax, log_z)

    def bwd(residuals, g):
        targets, z_loss, softmax, log_softmax, log_z = residuals
        g = g[..., None]
        return (g * ((1.0 + 2.0 * z_loss * log_z[..., None]) * softmax - targets), -g * log_softmax,
                jnp.zeros_like(z_loss))

    loss = make(fun)
    loss.defvjp(fwd, bwd)
    return loss


LOGITS = {"finite": jnp.array([[2.0, -1.0, 0.5, 3.25], [0.1, 0.2, -7.0, 1e-3]]),
          "huge": jnp.array([[80.0, -1.0, 0.5, 88.5], [-90.0, 0.2, -7.0, 1e-3]]),
          "+inf": jnp.array([[jnp.inf, -1.0, 0.5, 3.25], [0.1, 0.2, -7.0, 1e-3]])}
TARGETS = jnp.array([[0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]])


@pytest.mark.parametrize("logits", LOGITS)
def test_the_value_is_funs_where_nothing_differentiates_and_fwds_where_something_does(logits):
    """Issue 76: jax.custom_vjp runs fun for a call nothing differentiates, under jit and vmap too, and fwd's primal
    output where something does. Ours gave fwd's output under jit (the last bit of t5x's cross-entropy, and NaN where
    JAX gives fun's inf at a +inf logit): now each, bit for bit, side by side, and the derivative is the bwd's."""
    ours, theirs = _cross_entropy_of(sgm.custom_vjp), _cross_entropy_of(jax.custom_vjp)
    x = LOGITS[logits]
    plain = {
        "jit": lambda f: jax.jit(f)(x, TARGETS, 1e-4),
        "vmap": lambda f: jax.vmap(f, in_axes=(0, 0, None))(x, TARGETS, 1e-4),
        "jit(vmap)": lambda f: jax.jit(jax.vmap(f, in_axes=(0, 0, None)))(x, TARGETS, 1e-4),
    }
    for way, run in plain.items():
        np.testing.assert_array_equal(run(ours), run(theirs), err_msg=way)
    differentiated = {  # (value, gradient): the value bit for bit; the gradient the bwd's, as the transpose rounds
        "value_and_grad": lambda f: jax.value_and_grad(lambda x: f(x, TARGETS, 1e-4).sum())(x),
        "jit(value_and_grad)": lambda f: jax.jit(jax.value_and_grad(lambda x: f(x, TARGETS, 1e-4).sum()))(x),
        "vjp": lambda f: (lambda y, pull: (y, pull(jnp.ones_like(y))[0]))(*jax.vjp(lambda x: f(x, TARGETS, 1e-4),
                                                                                   x)),
    }
    for way, run in differentiated.items():
        (mine, my_gradient), (jaxs, jax_gradient) = run(ours), run(theirs)
        np.testing.assert_array_equal(mine, jaxs, err_msg=way)
        np.testing.assert_allclose(my_gradient, jax_gradient, rtol=1e-6, atol=1e-7, err_msg=way)
    y, tangent = jax.jvp(lambda x: ours(x, TARGETS, 1e-4), (x,), (jnp.ones_like(x),))  # (no jvp of theirs)
    np.testing.assert_array_equal(y, differentiated["vjp"](theirs)[0])
    if logits == "finite":
        np.testing.assert_allclose(tangent, jax.jacrev(lambda x: theirs(x, TARGETS, 1e-4))(x).sum((1, 2)),
                                   rtol=1e-5, atol=1e-7)  # (a sum of terms that cancel to 2e-4)


def _cast_scaled(clipped):
    """A function of a dtype, a function and a Python int read in Python (a count, as odeint's or a chunked loss's),
    all among nondiff_argnums, and x; its bwd scales the cotangent, or clips it."""
    scaled = sgm.custom_vjp(lambda dtype, fn, n, x: fn(x).astype(dtype) * n, nondiff_argnums=(0, 1, 2))

    def fwd(dtype, fn, n, x):
        return fn(x).astype(dtype) * (n if n > 1 else 1), jnp.cos(x)

    def bwd(dtype, fn, n, cos, g):
        return (jnp.clip(g, -1.0, 1.0) * cos * n if clipped else g * cos * n,)

    scaled.defvjp(fwd, bwd)
    return scaled


@pytest.mark.parametrize("clipped", [False, True])
def test_route_takes_a_dtype_a_function_and_an_int_among_nondiff_argnums_as_the_call_does(clipped):
    """Issue 76: route() traced every argument by shape, and raised JAX's TypeError for a dtype or a function among
    nondiff_argnums, and TracerBoolConversionError for an int read in Python, where the call itself works. It
    takes them as the call does, and says what the call does (the gradient tells: 3·cos x, or JAX's own)."""
    scaled = _cast_scaled(clipped)
    route = scaled.route(jnp.float32, jnp.sin, 3, XS)
    assert route.embedded is not clipped and ("clip" in route.reason) is clipped
    gradient = jax.grad(lambda x: scaled(jnp.float32, jnp.sin, 3, x).sum())(XS)
    np.testing.assert_allclose(gradient, 3.0 * jnp.cos(XS), rtol=1e-6)
