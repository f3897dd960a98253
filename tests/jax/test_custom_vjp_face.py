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


def _recording_what_jax_knows(make):
    """A pair (x·y, x) whose fwd records the perturbed flags it is given and whose bwd records which cotangents are
    symbolic zeros; it skips y's cotangent where y is not perturbed, as JAX allows."""
    seen = []

    def fwd(x, y):
        seen.append(("perturbed", x.perturbed, y.perturbed))
        return (x.value * y.value, x.value), (x.value, y.value, y.perturbed)

    def bwd(residuals, cotangents):
        x, y, y_perturbed = residuals
        seen.append(("zero", *(isinstance(ct, custom_derivatives.SymbolicZero) for ct in cotangents)))
        g, h = (jnp.zeros_like(x) if isinstance(ct, custom_derivatives.SymbolicZero) else ct for ct in cotangents)
        return g * y + h, g * x if y_perturbed else None

    pair = make(lambda x, y: (x * y, x))
    pair.defvjp(fwd, bwd, symbolic_zeros=True)
    return pair, seen


SYMBOLIC_ZERO_WAYS = {
    "grad x": lambda f: jax.grad(lambda x, y: f(x, y)[0])(2.0, 5.0),
    "grad y": lambda f: jax.grad(lambda x, y: f(x, y)[0], 1)(2.0, 5.0),
    "grad both, both outputs": lambda f: jax.grad(lambda x, y: sum(f(x, y)), (0, 1))(2.0, 5.0),
    "jit(grad y)": lambda f: jax.jit(jax.grad(lambda x, y: f(x, y)[0], 1))(2.0, 5.0),
    "grad(jit) x": lambda f: jax.grad(lambda x, y: jax.jit(f)(x, y)[0])(2.0, 5.0),
    "jacrev(jit)": lambda f: jax.jacrev(jax.jit(f))(2.0, 5.0),
    "vmap(grad x)": lambda f: jax.vmap(jax.grad(lambda x, y: f(x, y)[0]))(jnp.ones(2), jnp.ones(2)),
    "grad of a scan": lambda f: jax.grad(lambda x: jax.lax.scan(lambda c, _: (f(c, 3.0)[0], None), x, None,
                                                                 length=2)[0])(2.0),
}


@pytest.mark.parametrize("way", SYMBOLIC_ZERO_WAYS)
def test_symbolic_zeros_gives_fwd_and_bwd_what_jax_gives_them(way):
    """Issue 76: ours marked every argument perturbed under jit, and never gave the bwd a SymbolicZero, which JAX's
    own tests assert (7 of them). With symbolic_zeros the call is jax.custom_vjp's, so fwd and bwd see, and the
    derivatives are, JAX's own, side by side in every nesting."""
    (ours, mine), (theirs, jaxs) = _recording_what_jax_knows(sgm.custom_vjp), _recording_what_jax_knows(
        jax.custom_vjp)
    run = SYMBOLIC_ZERO_WAYS[way]
    assert jax.tree.map(lambda a: np.asarray(a).tolist(), run(ours)) == \
        jax.tree.map(lambda a: np.asarray(a).tolist(), run(theirs))
    assert mine == jaxs and len(mine) > 0


@pytest.mark.parametrize("mode", ["jvp", "jit(jvp)", "jacfwd", "linearize", "hessian"])
def test_symbolic_zeros_forward_mode_raises_naming_it(mode):
    """The price of JAX's symbolic zeros: they exist only in JAX's reverse mode, so forward mode raises, with
    jax.custom_vjp's own words first and then the reason, wherever JAX would raise (it used to give forward mode
    with flags and cotangents that were not JAX's)."""
    pair = _recording_what_jax_knows(sgm.custom_vjp)[0]
    first = lambda x: pair(x, 5.0)[0]  # noqa: E731
    runs = {"jvp": lambda: jax.jvp(first, (2.0,), (1.0,)),
            "jit(jvp)": lambda: jax.jit(lambda x: jax.jvp(first, (x,), (1.0,)))(2.0),
            "jacfwd": lambda: jax.jacfwd(first)(2.0), "linearize": lambda: jax.linearize(first, 2.0)[1](1.0),
            "hessian": lambda: jax.hessian(first)(2.0)}
    with pytest.raises(TypeError, match=r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp function: the "
                                        r"bwd of <lambda> .*symbolic_zeros=True"):
        runs[mode]()


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


def _tan_valued_sine(make):
    """JAX's test_optimize_remat_gh21303: fun is tan, fwd's primal output sin, and the bwd cos·g: which value a
    call gives shows which function gave it."""
    f = make(jnp.tan)
    f.defvjp(lambda x: (jnp.sin(x), (x,)), lambda residuals, g: (jnp.cos(residuals[0]) * g,), optimize_remat=True)
    return f


def test_with_optimize_remat_the_value_is_funs_and_the_derivative_the_bwds():
    """Issue 76: with optimize_remat, where JAX drops the residuals (a remat's forward pass) its value is fun's; ours
    gave fwd's there (0.003408 where JAX gives 0.003419). The option promises that the two agree, so ours gives
    fun's in every call; the derivative is the bwd's, in reverse mode as JAX's and in forward mode."""
    ours, theirs = _tan_valued_sine(sgm.custom_vjp), _tan_valued_sine(jax.custom_vjp)
    squared = lambda f: lambda x: jax.remat(f)(x) ** 2  # noqa: E731
    (mine, my_gradient), (jaxs, jax_gradient) = (jax.value_and_grad(squared(f))(3.2) for f in (ours, theirs))
    assert float(mine) == float(jaxs) == float(jnp.tan(jnp.float32(3.2)) ** 2)
    assert float(my_gradient) == pytest.approx(float(jax_gradient), rel=1e-6)
    assert float(my_gradient) == pytest.approx(2 * np.tan(3.2) * np.cos(3.2), rel=1e-5)  # 2·y·(the bwd's cos)
    y, tangent = jax.jvp(ours, (3.2,), (1.0,))
    assert float(y) == float(jnp.tan(jnp.float32(3.2))) and float(tangent) == pytest.approx(np.cos(3.2), rel=1e-6)


def _sine_with_a_custom_vmap_fwd(make):
    """JAX's test_optimize_remat_custom_vmap: a fwd that is a jax.custom_batching.custom_vmap, which JAX cannot
    differentiate (jax.custom_vjp never differentiates a fwd, but the decorator's order 2 does)."""
    f = make(lambda x, y: jnp.sin(x) * y)

    @jax.custom_batching.custom_vmap
    def fwd(x, y):
        return f(x, y), (jnp.cos(x), jnp.sin(x), y)

    @fwd.def_vmap
    def fwd_batched(axis_size, in_batched, x, y):
        del axis_size, in_batched
        return (f(x, y), (jnp.cos(x), jnp.sin(x), y)), (True, (True, True, True))

    f.defvjp(fwd, lambda residuals, g: (residuals[0] * g * residuals[2], residuals[1] * g))
    return f


def test_a_fwd_jax_cannot_differentiate_gives_first_derivatives_and_refuses_a_second_naming_why():
    """Issue 76: at the default order=2, the decorator runs fwd at x to differentiate what it saves, and a fwd that
    JAX cannot differentiate made every derivative raise, first ones included, which need none of it. Such a call is
    now order 1's: its first derivatives are the bwd's, side by side with jax.custom_vjp's, in forward mode too; a
    second derivative raises, naming JAX's error."""
    ours, theirs = _sine_with_a_custom_vmap_fwd(sgm.custom_vjp), _sine_with_a_custom_vmap_fwd(jax.custom_vjp)
    x, y = jnp.linspace(0.0, 1.0, 5), jnp.linspace(2.0, 5.0, 5)
    gradients = [jax.jit(jax.vmap(jax.grad(f, (0, 1))))(x, y) for f in (ours, theirs)]
    for mine, jaxs in zip(*gradients, strict=True):
        np.testing.assert_allclose(mine, jaxs, rtol=1e-6)
    np.testing.assert_allclose(gradients[0][0], jnp.cos(x) * y, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(lambda x, y: jax.jvp(ours, (x, y), (1.0, 0.0))[1]))(x, y),
                               jnp.cos(x) * y, rtol=1e-6)
    with pytest.raises(LookupError, match=r"A second derivative through <lambda> would miss the term .* JAX could "
                                          r"not run <lambda> on arguments it differentiates \(ValueError: "
                                          r"Linearization failed"):
        jax.jit(jax.vmap(jax.grad(jax.grad(ours))))(x, y)


@pytest.mark.parametrize("make", [sgm.custom_vjp, jax.custom_vjp], ids=["stopgrad_math", "jax.custom_vjp"])
def test_a_bare_cotangent_for_a_custom_node_of_one_leaf(make):
    """JAX's test_symbolic_zero_custom_vjp_custom_pytree, without symbolic zeros: the bwd gives one array for an
    argument that is a registered node holding one array, which JAX takes (a leaf stands for a subtree of one
    leaf); ours called it a cotangent of another structure."""

    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, x):
            self.x = x

        def tree_flatten(self):
            return [self.x], None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    f = make(lambda box, y: box.x * y)
    f.defvjp(lambda box, y: (box.x * y, (box, y)), lambda res, g: (res[1] * g, res[0].x * g))
    gradient = jax.grad(f)(Box(jnp.array(72.0)), jnp.array(73.0))
    assert isinstance(gradient, Box) and float(gradient.x) == 73.0
    if make is sgm.custom_vjp:
        assert float(jax.jvp(lambda y: f(Box(jnp.array(72.0)), y), (73.0,), (1.0,))[1]) == 72.0
