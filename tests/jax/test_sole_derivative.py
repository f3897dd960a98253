"""Issue 75 on JAX: under one eager derivative alone (``sole_derivative``), f runs once, on the primal values under
the eval trace, as jax.custom_vjp runs its fwd. It gives the general way's bits (f at x for the residuals, again at
stop(x) for y) in every mode it serves, at both orders (but a compiled loop's residuals at order 2, which XLA may
round otherwise through the JVP trace: there it agrees to rounding); it is not taken where a second derivative, a
batching or a staging trace can reach the call; and f reading a value differentiated besides its arguments is made
the general way, with the right derivative."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import jax_real_code  # noqa: E402
from bit_patterns import bits  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402
from stopgrad_math.jax import decorator_form, sole_derivative  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(jax._src.core, "trace_ctx"),
                                reason="JAX before 0.4.36 keeps a stack of trace levels: every call is general")


@pytest.fixture
def taken(monkeypatch):
    """Whether each differentiated call ran f below its derivative (a list, one entry per call)."""
    seen: list[bool] = []
    original = sole_derivative.trace_below
    monkeypatch.setattr(sole_derivative, "trace_below", lambda: seen.append(original() is not None) or original())
    return seen


def general_way(monkeypatch, compute):
    """What ``compute()`` gives with no call run below its derivative."""
    with monkeypatch.context() as patched:
        patched.setattr(sole_derivative, "trace_below", lambda: None)
        return compute()


def assert_same_bits(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(bits(g), bits(w))


def _pulled_back(y, pullback):
    """The pullback of a cosine cotangent of y's shape."""
    return pullback(jnp.cos(jnp.arange(y.size, dtype=jnp.float32)).reshape(y.shape))


MODES = {  # each differentiates a function of several arguments at the top level, eagerly
    "value_and_grad": lambda fn, xs: jax.value_and_grad(lambda *a: jnp.sum(fn(*a)), range(len(xs)))(*xs),
    "vjp": lambda fn, xs: _pulled_back(*jax.vjp(fn, *xs)),
    "jvp": lambda fn, xs: jax.jvp(fn, tuple(xs), tuple(jnp.sin(1.0 + jnp.arange(x.size, dtype=x.dtype)).reshape(
        x.shape) for x in xs)),
    "linearize": lambda fn, xs: jax.linearize(fn, *xs)[1](*(jnp.ones_like(x) for x in xs)),
    "jacrev": lambda fn, xs: jax.jacrev(fn, range(len(xs)))(*xs),
}


def ported(case, order):
    """A rule of the real-code benchmark on stopgrad_math.jax.custom_vjp, at this order."""
    primal, fwd, bwd = jax_real_code.RULES[case]
    function = sgm.custom_vjp(primal, order=order)
    function.defvjp(fwd, bwd)
    return function


def anchored(case):
    """The rule as jax.custom_vjp, the mechanism it replaces."""
    primal, fwd, bwd = jax_real_code.RULES[case]
    function = jax.custom_vjp(primal)
    function.defvjp(fwd, bwd)
    return function


def stages_a_loop(case, xs):
    """Whether the rule's primal runs a compiled loop (a while_loop or scan, as fori_loop makes)."""
    return any(e.primitive.name in ("while", "scan") for e in jax.make_jaxpr(jax_real_code.RULES[case][0])(*xs).eqns)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", jax_real_code.RULES)
def test_a_ported_rule_gives_the_general_ways_bits_in_each_mode_it_serves(monkeypatch, taken, case, mode, order):
    """Bit for bit with the general way, but where order 2's general way takes the residuals from f at x through
    the JVP trace and f runs a compiled loop: XLA compiles the loop JVP'd, primal and tangent in one body, and its
    primal need not round as the loop alone does (on an AVX2-only CPU it does not). There the port runs fwd as
    jax.custom_vjp runs it, and agrees with the general way and the anchor to float32's rounding."""
    xs = jax_real_code.inputs(case, (4, 6))
    fn = ported(case, order)
    got = MODES[mode](fn, xs)
    assert taken and all(taken)
    want = general_way(monkeypatch, lambda: MODES[mode](fn, xs))
    if order == 1 or not stages_a_loop(case, xs):
        assert_same_bits(got, want)
        return
    anchor = MODES[mode](anchored(case), xs) if mode not in ("jvp", "linearize") else want  # (no forward mode)
    for g, w, a in zip(*(jax.tree_util.tree_leaves(t) for t in (got, want, anchor)), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(g, a, rtol=1e-6, atol=1e-7)


def softplus(x):  # the rule selects between two branches, one overflowing where it is not taken
    return jnp.logaddexp(x, 0.0), lambda ct: (ct * jnp.where(x < -9.0, jnp.exp(x), jax.nn.sigmoid(x)),)


def scaled_pair(x, a):  # two arguments, two outputs
    return (a * jnp.sin(x), x * x), lambda cts: (cts[0] * a * jnp.cos(x) + 2 * cts[1] * x, jnp.sum(cts[0] * jnp.sin(x)))


AWKWARD = [0.0, -0.0, 1.0, -1.5, 100.0, -100.0, 88.0, 1e-30, float("inf"), float("-inf"), float("nan")]


@settings(max_examples=25, deadline=None)
@given(shape=st.sampled_from([(), (0,), (1,), (3,), (2, 3)]), dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
       order=st.sampled_from([1, 2]), values=st.lists(st.sampled_from(AWKWARD), min_size=6, max_size=6))
def test_awkward_values_shapes_and_dtypes_give_the_general_ways_bits(shape, dtype, order, values):
    x = jnp.asarray(np.resize(np.asarray(values, np.float32), shape), dtype)
    a = jnp.asarray(values[0] if np.isfinite(values[0]) else 2.0, dtype)
    with pytest.MonkeyPatch.context() as monkeypatch:
        cases = [(sgm.custom_gradient(softplus, order=order), (x,))]
        if dtype == jnp.float32:  # (in bfloat16 the sum of a's cotangent rounds it: refused on both ways)
            cases.append((sgm.custom_gradient(scaled_pair, order=order), (x, a)))
        for fn, args in cases:
            def both(fn=fn, args=args):
                return [jax.value_and_grad(lambda *xs: jnp.sum(jax.tree_util.tree_leaves(fn(*xs))[0]),
                                           range(len(args)))(*args),
                        jax.jvp(fn, args, tuple(jnp.ones_like(v) for v in args))]
            assert_same_bits(both(), general_way(monkeypatch, both))


def test_the_gradient_is_the_declared_one_against_the_closed_form():
    """The truth is the rule's formula, not the library: sigmoid where x ≥ −9, exp below."""
    x = jnp.array([100.0, -20.0, 0.0, 88.0, -0.0])
    for order in (1, 2):
        fn = sgm.custom_gradient(softplus, order=order)
        got = jax.grad(lambda x, fn=fn: jnp.sum(fn(x)))(x)
        np.testing.assert_allclose(got, [1.0, np.exp(-20.0), 0.5, 1.0, 0.5], rtol=1e-6)


NOT_TAKEN = {  # each reaches the call through a second derivative, a batching or a staging trace
    "jit(grad)": lambda fn, x: jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(x),
    "hessian": lambda fn, x: jax.hessian(lambda x: jnp.sum(fn(x)))(x),
    "grad(grad)": lambda fn, x: jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(fn(x)))(x)))(x),
    "vmap(grad)": lambda fn, x: jax.vmap(jax.grad(lambda x: jnp.sum(fn(x))))(x[None]),
    "jacfwd": lambda fn, x: jax.jacfwd(fn)(x),
    "grad of a scan": lambda fn, x: jax.grad(lambda x: jax.lax.scan(lambda c, _: (c + jnp.sum(fn(x)), None), 0.0,
                                                                      None, length=2)[0])(x),
    "grad of a checkpoint": lambda fn, x: jax.grad(jax.checkpoint(lambda x: jnp.sum(fn(x))))(x),
}


@pytest.mark.parametrize("way", NOT_TAKEN)
def test_not_taken_where_anything_but_one_eager_derivative_reaches_the_call(taken, way):
    NOT_TAKEN[way](sgm.custom_gradient(softplus, order=2), jnp.array([0.5, -1.0, 2.0]))
    assert taken and not any(taken)


def test_f_runs_once_on_concrete_values_as_jax_custom_vjps_fwd_does():
    """Under an eager grad, jax.custom_vjp runs fwd once, on concrete arrays; so does ours, at both orders."""
    for make, orders in ((jax.custom_vjp, [None]), (sgm.custom_vjp, [1, 2])):
        for order in orders:
            seen: list[type] = []

            def fwd(x, seen=seen):
                seen.append(type(x))
                return jnp.sin(x), jnp.cos(x)

            fn = make(jnp.sin) if order is None else make(jnp.sin, order=order)
            fn.defvjp(fwd, lambda cos_x, ct: (ct * cos_x,))
            gradient = jax.grad(lambda x, fn=fn: jnp.sum(fn(x)))(jnp.arange(3.0))
            np.testing.assert_allclose(gradient, np.cos(np.arange(3.0)), rtol=1e-6)
            assert len(seen) == 1 and not issubclass(seen[0], jax.core.Tracer), (make, order, seen)


def test_a_value_differentiated_besides_the_arguments_is_made_the_general_way(taken):
    """f closes over theta, which grad differentiates: under the eval trace JAX's escaped-tracer check raises,
    and the call is made the general way (f running again), with theta's derivative autodiff's of y."""
    runs = []

    def h(x, theta):
        def f(x):
            runs.append(1)
            return theta * jnp.sin(x), lambda ct: (ct * theta * jnp.cos(x),)
        return jnp.sum(sgm.custom_gradient(f, order=2)(x))

    x, theta = jnp.array([0.5, 1.5]), jnp.array(2.0)
    got = jax.grad(h, argnums=(0, 1))(x, theta)
    np.testing.assert_allclose(got[0], 2.0 * np.cos([0.5, 1.5]), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.sum(np.sin([0.5, 1.5])), rtol=1e-6)
    assert taken == [True] and len(runs) == 3  # below (escaped), then at x and at stop(x)


def test_a_vjp_closing_over_a_differentiated_value_f_never_touches_is_run_below(monkeypatch, taken):
    """f's VJP closes over w, which grad differentiates, but f's own ops never touch it (no escape to catch): f
    runs below, the VJP keeps w as it is, and the derivatives are the rule's, dx = w·ct, and y's autodiff w.r.t.
    w, 0 (y = 3x), bit for bit as on the general way."""
    def h(x, w):
        def f(x):
            return x * 3.0, lambda ct: (ct * w,)
        return jnp.sum(sgm.custom_gradient(f, order=2)(x))

    x, w = jnp.array([1.0, 2.0]), jnp.array(0.5)
    got = jax.grad(h, argnums=(0, 1))(x, w)
    assert taken == [True]
    np.testing.assert_array_equal(got[0], [0.5, 0.5])
    np.testing.assert_array_equal(got[1], 0.0)
    assert_same_bits(got, general_way(monkeypatch, lambda: jax.grad(h, argnums=(0, 1))(x, w)))


def test_the_compiled_embedding_is_shared_with_the_general_way(monkeypatch):
    """Both ways key one embedding: f's residuals are concrete below and tracers on the general way, of one
    signature."""
    monkeypatch.setattr(decorator_form, "_EMBEDDINGS", decorator_form.bounded_cache.BoundedCache(8))
    fn = sgm.custom_gradient(softplus, order=2)
    x = jnp.array([0.5, -1.0])
    jax.grad(lambda x: jnp.sum(fn(x)))(x)
    general_way(monkeypatch, lambda: jax.grad(lambda x: jnp.sum(fn(x)))(x))
    assert len(decorator_form._EMBEDDINGS) == 1
