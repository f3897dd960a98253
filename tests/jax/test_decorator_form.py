"""@stopgrad_math.jax.custom_gradient (f returns (y, vjp)) under every JAX transform, against independent truths:
jax.custom_jvp with the same derivative, autodiff of a stable closed form, analytic derivatives and SciPy."""

import numpy as np
import pytest
import scipy.special

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from bit_patterns import bits  # noqa: E402
from jax_transforms import TRANSFORMS, elementwise_cases, run_on_two_host_devices  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

X = jnp.array([-1.0, 0.0, 2.0, 100.0])
SIGMOID = np.float32([0.26894143, 0.5, 0.880797, 1.0])


@sgm.custom_gradient
def log1pexp(x):
    e = jnp.exp(x)
    return jnp.log1p(e), lambda ct: ct * (1 - 1 / (1 + e))


@jax.custom_jvp
def log1pexp_jvp(x):  # the anchor: the same derivative as a JVP rule
    return jnp.log1p(jnp.exp(x))


log1pexp_jvp.defjvp(lambda p, t: (log1pexp_jvp(p[0]), t[0] * (1 - 1 / (1 + jnp.exp(p[0])))))


def _sum_of(fn):
    return lambda *a: jnp.sum(fn(*a))


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_log1pexp_has_the_vjps_derivative_under_every_transform(transform):
    got = TRANSFORMS[transform](log1pexp, X)
    np.testing.assert_allclose(got, SIGMOID, rtol=1e-6)
    np.testing.assert_array_equal(got, TRANSFORMS[transform](log1pexp_jvp, X))


@pytest.mark.parametrize("wrap", ["plain", "jit", "vmap", "vjp", "jvp", "jit(jvp)"])
def test_the_value_is_y_bit_for_bit(wrap):
    y = np.float32([-0.0, np.inf, -np.inf, np.nan, 1e-40, 3.0])  # 1e-40: a float32 subnormal
    fn = sgm.custom_gradient(lambda x: (jnp.asarray(y) * jnp.ones_like(x), lambda ct: 2.0 * ct))
    jvp = lambda x: jax.jvp(fn, (x,), (jnp.ones(6),))[0]  # noqa: E731
    x = jnp.arange(6.0)
    got = {"plain": fn, "jit": jax.jit(fn), "vmap": lambda x: jax.vmap(fn)(x[None])[0],
           "vjp": lambda x: jax.vjp(fn, x)[0], "jvp": jvp, "jit(jvp)": jax.jit(jvp)}[wrap](x)
    flushed = (np.asarray(got) == 0) & (np.abs(y) < 1.2e-38)  # XLA's CPU kernels may flush a subnormal
    assert np.all((bits(got) == bits(y)) | flushed), (got, y)
    assert bits(got)[0] == bits(y)[0] and bits(got)[3] == bits(y)[3]  # −0.0 and NaN exactly


# ---------------------------------------------------------------- full Jacobians, pytrees, arguments

A = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


def softmax_closed_form(x):
    return jnp.exp(x - jax.scipy.special.logsumexp(x))


@sgm.custom_gradient
def softmax(x):
    s = softmax_closed_form(x)
    return s, lambda ct: s * (ct - jnp.dot(ct, s))


JACOBIANS = {"jacfwd": jax.jacfwd, "jacrev": jax.jacrev, "jit(jacfwd)": lambda f: jax.jit(jax.jacfwd(f))}


@pytest.mark.parametrize("way", JACOBIANS)
def test_a_full_jacobian_against_autodiff_of_the_closed_form(way):
    x = jnp.array([0.5, -1.0, 2.0])
    jacobian = JACOBIANS[way]
    np.testing.assert_allclose(jacobian(softmax)(x), jax.jacfwd(softmax_closed_form)(x), rtol=1e-6, atol=1e-7)
    matvec = sgm.custom_gradient(lambda x: (A @ x, lambda ct: A.T @ ct))
    np.testing.assert_array_equal(jacobian(matvec)(x), A)


def test_vmap_of_a_full_jacobian_function():
    xs = jnp.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]])
    got = jax.vmap(jax.jacrev(softmax))(xs)
    np.testing.assert_allclose(got, jax.vmap(jax.jacrev(softmax_closed_form))(xs), rtol=1e-6, atol=1e-7)
    tangent = jax.vmap(lambda x: jax.jvp(softmax, (x,), (jnp.ones(3),))[1])(xs)
    np.testing.assert_allclose(tangent, jax.vmap(lambda x: jax.jvp(softmax_closed_form, (x,), (jnp.ones(3),))[1])(xs),
                               atol=1e-7)


@sgm.custom_gradient
def weighted(p, n, mode):
    """Pytrees in and out; n (an int) and mode (a string) pass through as constants."""
    assert isinstance(n, int) and mode == "sum"
    y = {"scaled": p["a"] * n, "energy": jnp.sum(p["b"] ** 2)}

    def vjp(ct):
        return {"a": ct["scaled"] * n, "b": 2 * p["b"] * ct["energy"]}, None, None

    return y, vjp


def weighted_closed_form(p, n):
    return {"scaled": p["a"] * n, "energy": jnp.sum(p["b"] ** 2)}


P = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([3.0, -4.0])}
TANGENT = {"a": jnp.array([0.5, 1.0]), "b": jnp.array([1.0, 2.0])}


def test_pytrees_of_arguments_and_outputs_and_constants_passed_through():
    loss = lambda f: lambda p: f(p)["scaled"].sum() + 3.0 * f(p)["energy"]  # noqa: E731
    got = jax.grad(loss(lambda p: weighted(p, 3, "sum")))(P)
    want = jax.grad(loss(lambda p: weighted_closed_form(p, 3)))(P)
    for key in P:
        np.testing.assert_array_equal(got[key], want[key])
    primal, tangent = jax.jit(lambda p, t: jax.jvp(lambda p: weighted(p, 3, "sum"), (p,), (t,)))(P, TANGENT)
    want_primal, want_tangent = jax.jvp(lambda p: weighted_closed_form(p, 3), (P,), (TANGENT,))
    for key in ("scaled", "energy"):
        np.testing.assert_array_equal(primal[key], want_primal[key])
        np.testing.assert_array_equal(tangent[key], want_tangent[key])


def test_none_cotangents_and_an_integer_array_argument_are_constants():
    @sgm.custom_gradient
    def f(x, k, w):
        return x * w * k.astype(x.dtype), lambda ct: (ct * w * k.astype(x.dtype), None, None)

    k = jnp.array([1, 2, 3])
    gx, gw = jax.grad(lambda x, w: f(x, k, w).sum(), argnums=(0, 1))(jnp.ones(3), jnp.full(3, 2.0))
    np.testing.assert_array_equal(gx, [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(gw, [0.0, 0.0, 0.0])  # None: no gradient for w


def test_keyword_arguments_are_constants_whose_derivative_raises_naming_them():
    @sgm.custom_gradient
    def f(x, *, scale=1.0):
        return x * scale, lambda ct: ct * scale

    through_scale = lambda s: f(2.0, scale=s)  # noqa: E731  # its truth, 2.0, is nowhere in the vjp
    in_scan = lambda s: jax.lax.scan(lambda c, _: (c + f(2.0, scale=s), None), 0.0, None, length=2)[0]  # noqa: E731
    in_fori_loop = lambda s: jax.lax.fori_loop(0, 2, lambda _, c: c + f(2.0, scale=s), 0.0)  # noqa: E731
    for differentiate in (jax.grad, jax.jacfwd, jax.hessian, lambda fn: lambda s: jax.jvp(fn, (s,), (1.0,))[1],
                          lambda fn: jax.jit(jax.grad(fn)), lambda fn: lambda s: jax.vmap(jax.grad(fn))(s[None])[0]):
        for fn in (through_scale, in_scan, in_fori_loop, jax.checkpoint(through_scale)):
            with pytest.raises(LookupError, match="scale is a keyword argument of f"):
                differentiate(fn)(jnp.float32(3.0))
    assert float(jax.grad(lambda x: f(x=x, scale=3.0))(2.0)) == 3.0  # all keywords: x is bound as positional
    assert float(jax.grad(lambda x: f(x, scale=3.0))(2.0)) == 3.0  # a constant keyword is no derivative


def test_one_argument_may_get_its_cotangent_alone_or_in_a_one_tuple():
    alone = sgm.custom_gradient(lambda x: (2 * x, lambda ct: 2 * ct))
    in_tuple = sgm.custom_gradient(lambda x: (2 * x, lambda ct: (2 * ct,)))
    assert float(jax.grad(alone)(1.0)) == float(jax.grad(in_tuple)(1.0)) == 2.0


def test_integer_outputs_pass_through_and_get_float0_cotangents():
    @sgm.custom_gradient
    def f(x):
        def vjp(ct):
            assert ct[1].dtype == jax.dtypes.float0
            return 3.0 * ct[0]
        return (3.0 * x, jnp.argmax(x)), vjp

    _, index = f(jnp.array([1.0, 5.0]))
    assert int(index) == 1
    np.testing.assert_array_equal(jax.grad(lambda x: f(x)[0].sum())(jnp.ones(2)), [3.0, 3.0])


def test_closed_over_values_are_differentiated_by_autodiff_at_both_orders():
    """What f closes over is not an argument: its derivative is autodiff's of y (order 2 computes y at stop(x))."""
    for order in (1, 2):
        def h(x, theta, order=order):
            f = sgm.custom_gradient(lambda x: (theta * jnp.sin(x), lambda ct: ct * theta * jnp.cos(x)), order=order)
            return f(x)
        got = jax.grad(h, argnums=(0, 1))(0.5, 2.0)
        want = jax.grad(lambda x, t: t * jnp.sin(x), argnums=(0, 1))(0.5, 2.0)
        np.testing.assert_allclose(got, want, rtol=1e-6)


# ---------------------------------------------------------------- linearity, proven from the jaxpr

NOT_LINEAR = {
    "clip": (lambda ct: jnp.clip(ct, -1.0, 1.0), r"max inside (p)?jit\(clip\)"),
    "relu": (lambda ct: jax.nn.relu(ct), r"custom_jvp_call of relu"),
    "normalize": (lambda ct: ct / jnp.linalg.norm(ct), r"mul inside (p)?jit\(norm\).*quadratic"),
    "affine": (lambda ct: 2 * ct + 1, r"add \(adds a term that does not depend on the cotangent"),
    "square": (lambda ct: ct * ct, r"mul \(multiplies the cotangent by itself"),
    "sign": (lambda ct: jnp.sign(ct) * jnp.abs(ct), r"sign"),
    "where": (lambda ct: jnp.where(ct > 0, ct, 0.5 * ct), r"gt \(compares the cotangent"),
    "while_loop": (lambda ct: jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, 2 * c[1]), (0, ct))[1],
                   r"while"),
    "stop_gradient": (lambda ct: jax.lax.stop_gradient(ct), r"stop_gradient"),
    "rounding": (lambda ct: jnp.round(ct), r"round .*does not know: its linearity is not proven"),
    "psum": (lambda ct: jax.lax.psum(ct, "i"), r"psum \(a collective"),
    "constant": (lambda ct: jnp.ones(3), r"does not depend on the cotangent of y and is not provably zero"),
    "ignores its cotangent": (lambda ct: jnp.full(3, 2.0), r"affine map, not a VJP"),
}

MODES = {  # each under vmap with a named axis, for psum's sake
    "grad": lambda fn, x: jax.vmap(jax.grad(_sum_of(fn)), axis_name="i")(x[None]),
    "jvp": lambda fn, x: jax.vmap(lambda x: jax.jvp(fn, (x,), (jnp.ones(3),)), axis_name="i")(x[None]),
    "jit(grad)": lambda fn, x: jax.vmap(jax.jit(jax.grad(_sum_of(fn))), axis_name="i")(x[None]),
    "hessian": lambda fn, x: jax.vmap(jax.hessian(_sum_of(fn)), axis_name="i")(x[None]),
}
NOT_DIFFERENTIATED = {  # a call no derivative reaches
    "eager": lambda fn, x: fn(x),
    "jit": lambda fn, x: jax.vmap(jax.jit(fn), axis_name="i")(x[None])[0],
    "vmap": lambda fn, x: jax.vmap(fn, axis_name="i")(x[None])[0],
    "jit(vmap)": lambda fn, x: jax.jit(jax.vmap(fn, axis_name="i"))(x[None])[0],
}


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", NOT_LINEAR)
def test_a_vjp_that_is_not_linear_is_refused_naming_the_primitive_where_a_derivative_is_asked(case, mode, order):
    vjp, message = NOT_LINEAR[case]
    fn = sgm.custom_gradient(lambda x: (2.0 * x, vjp), order=order)
    with pytest.raises(ValueError, match=message):
        MODES[mode](fn, jnp.array([0.5, -2.0, 3.0]))


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("mode", NOT_DIFFERENTIATED)
@pytest.mark.parametrize("case", [c for c in NOT_LINEAR if c != "psum"])
def test_a_vjp_that_is_not_linear_gives_the_value_where_no_derivative_is_asked(case, mode, order):
    """As jax.custom_vjp does (issue 58): its bwd runs only under a derivative, and a plain call, jit or vmap of
    JAX's own clip_gradient example returns the value. Here the VJP is judged where a derivative is asked."""
    vjp, _ = NOT_LINEAR[case]
    x = jnp.array([0.5, -2.0, 3.0])
    fn = sgm.custom_gradient(lambda x: (2.0 * x, vjp), order=order)
    anchor = jax.custom_vjp(lambda x: 2.0 * x)
    anchor.defvjp(lambda x: (2.0 * x, None), lambda _, ct: (vjp(ct),))
    np.testing.assert_array_equal(NOT_DIFFERENTIATED[mode](fn, x), NOT_DIFFERENTIATED[mode](anchor, x))
    np.testing.assert_array_equal(NOT_DIFFERENTIATED[mode](fn, x), 2.0 * x)


def test_why_collectives_are_refused():
    """A collective couples the examples of a mapped axis: for the vjp ct ↦ psum(ct·cos x) under vmap's named axis,
    J[i, j] = cos(x_i), so J·1 = 3·cos(x_i) (jax.linear_transpose gives it), while vjp(1), which the decorator
    takes for J where y has one element, is Σ_j cos(x_j). Not proven by the table, so refused."""
    x = jnp.array([0.1, 0.2, 0.3])
    vjp_of = lambda x: lambda ct: jax.lax.psum(ct * jnp.cos(x), "i")  # noqa: E731
    transposed = jax.vmap(lambda x: jax.linear_transpose(vjp_of(x), 1.0)(1.0)[0], axis_name="i")(x)
    at_one = jax.vmap(lambda x: vjp_of(x)(1.0), axis_name="i")(x)
    np.testing.assert_allclose(transposed, 3 * np.cos(x), rtol=1e-6)
    np.testing.assert_allclose(at_one, np.full(3, np.cos(x).sum()), rtol=1e-6)


def test_the_constant_that_jaxs_own_transpose_drops_silently():
    """Why the jaxpr is read first: jax.linear_transpose takes 2·ct + 1 for 2·ct."""
    (transposed,) = jax.linear_transpose(lambda ct: 2 * ct + 1, 1.0)(1.0)
    assert float(transposed) == 2.0


SPD = jnp.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])  # symmetric positive definite

LINEAR = {  # (vjp, vjp(ones) by hand: the gradient of sum(h))
    "scale and sum": (lambda ct: 3.0 * ct + ct, [4.0, 4.0, 4.0]),
    "mean": (lambda ct: jnp.full(3, jnp.mean(ct)), [1.0, 1.0, 1.0]),
    "jit": (jax.jit(lambda ct: ct * 2.0), [2.0, 2.0, 2.0]),
    "checkpoint": (jax.checkpoint(lambda ct: ct * 2.0), [2.0, 2.0, 2.0]),
    "cond": (lambda ct: jax.lax.cond(True, lambda c: -c, lambda c: jnp.zeros_like(c), ct), [-1.0, -1.0, -1.0]),
    "fori_loop": (lambda ct: jax.lax.fori_loop(0, 3, lambda i, c: 2.0 * c, ct), [8.0, 8.0, 8.0]),
    "scan": (lambda ct: jax.lax.scan(lambda c, x: (c + x, c), jnp.zeros(()), ct)[1], [0.0, 1.0, 2.0]),
    "cumsum, flip, roll": (lambda ct: jnp.roll(jnp.flip(jnp.cumsum(ct)), 1), [1.0, 3.0, 2.0]),
    "gather, scatter-add": (lambda ct: jnp.zeros(3).at[jnp.array([0, 0, 2])].add(ct[jnp.array([1, 2, 0])]),
                            [2.0, 0.0, 1.0]),
    "concatenate, pad, slice": (lambda ct: jnp.concatenate([jnp.pad(ct[:2], (1, 0))[1:], ct[2:]]), [1.0, 1.0, 1.0]),
    "where on a constant": (lambda ct: jnp.where(jnp.array([True, False, True]), ct, 0.0), [1.0, 0.0, 1.0]),
    "float16 round trip": (lambda ct: ct.astype(jnp.float16).astype(jnp.float32) * 2, [2.0, 2.0, 2.0]),
    "fft": (lambda ct: jnp.real(jnp.fft.ifft(jnp.fft.fft(ct))), [1.0, 1.0, 1.0]),
    "zeros": (lambda ct: jnp.zeros(3), [0.0, 0.0, 0.0]),
    "None": (lambda ct: None, [0.0, 0.0, 0.0]),
    # JAX's linear solvers: custom_linear_solve (cg's JAX cannot linear_transpose: J·v is built by columns)
    "solve": (lambda ct: jnp.linalg.solve(SPD, ct), list(np.linalg.solve(np.asarray(SPD, np.float64), np.ones(3)))),
    "cg, device_put": (lambda ct: jax.scipy.sparse.linalg.cg(lambda v: SPD @ v, ct, tol=1e-7)[0],
                       list(np.linalg.solve(np.asarray(SPD, np.float64), np.ones(3)))),
    "scatter into zeros": (lambda ct: jnp.zeros(3).at[0].set(ct[0]), [1.0, 0.0, 0.0]),
    "scatter, indices not known unique": (lambda ct: jnp.zeros(3).at[jnp.array([2, 0])].set(ct[:2]),
                                          [1.0, 0.0, 1.0]),
    "debug print of the cotangent": (lambda ct: (jax.debug.callback(lambda c: None, ct), 5.0 * ct)[1],
                                     [5.0, 5.0, 5.0]),
}


@pytest.mark.parametrize("case", LINEAR)
def test_linear_vjps_are_embedded_exactly_in_both_modes(case):
    vjp, want = LINEAR[case]
    fn = sgm.custom_gradient(lambda x: (2.0 * x, vjp))
    x = jnp.array([0.5, -2.0, 3.0])
    np.testing.assert_allclose(jax.grad(_sum_of(fn))(x), want, rtol=2e-6)  # vjp(1) by hand
    jacobian = jax.jacfwd(fn)(x)  # forward mode: J, whose transpose applied to ones is the same
    np.testing.assert_allclose(jacobian.T @ jnp.ones(3), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(jax.jacrev(fn)(x), jacobian, rtol=1e-6, atol=1e-7)
    in_scan = lambda x: jax.lax.scan(lambda c, _: (fn(c), None), x, None, length=1)[0]  # noqa: E731
    for gradient in (jax.jit(jax.grad(_sum_of(fn))), lambda x: jax.vmap(jax.grad(_sum_of(fn)))(x[None])[0],
                     jax.grad(_sum_of(in_scan)), jax.grad(_sum_of(jax.checkpoint(fn)))):
        np.testing.assert_allclose(gradient(x), want, rtol=2e-6)


def test_a_term_that_is_not_provably_zero_and_a_primitive_the_table_lacks_are_told_apart():
    closes_over_x = sgm.custom_gradient(lambda x: (2.0 * x, lambda ct: ct + 0.0 * x))  # NaN at an infinite x
    with pytest.raises(ValueError, match=r"add \(adds a term .* not provably zero"):
        jax.grad(_sum_of(closes_over_x))(jnp.ones(3))
    unknown = sgm.custom_gradient(lambda x: (2.0 * x, lambda ct: jnp.round(ct)))
    with pytest.raises(ValueError, match=r"uses round .*does not know: its linearity is not proven") as caught:
        jax.grad(_sum_of(unknown))(jnp.ones(3))
    assert "not linear" not in str(caught.value)


def test_a_vjp_may_branch_in_python_on_a_concrete_residual_as_custom_vjps_bwd_may():
    @sgm.custom_gradient
    def ours(x):
        return x * x, lambda g: 2 * g if x > 0 else 3 * g

    @jax.custom_vjp
    def theirs(x):
        return x * x

    theirs.defvjp(lambda x: (x * x, x), lambda x, g: (2 * g if x > 0 else 3 * g,))
    for x in (2.0, -2.0):
        assert float(ours(x)) == float(theirs(x)) == 4.0
        assert float(jax.grad(ours)(x)) == float(jax.grad(theirs)(x))
        assert float(jax.jvp(ours, (x,), (1.0,))[1]) == (2.0 if x > 0 else 3.0)  # custom_vjp has no jvp
    for fn in (ours, theirs):  # under jit the residual is a tracer for both
        with pytest.raises(jax.errors.TracerBoolConversionError):
            jax.jit(jax.grad(fn))(2.0)

    @sgm.custom_gradient
    def zero_in_one_branch(x, y):  # a known zero cotangent, from the branch taken, is no gradient
        return x * y, lambda g: (2 * g, jnp.zeros_like(g)) if x > 0 else (3 * g, y * g)

    assert jax.grad(zero_in_one_branch, argnums=(0, 1))(2.0, 3.0) == (2.0, 0.0)
    assert jax.grad(zero_in_one_branch, argnums=(0, 1))(-2.0, 3.0) == (3.0, 3.0)


def test_a_cotangent_for_a_constant_argument_is_refused():
    fn = sgm.custom_gradient(lambda x, k: (x * k, lambda ct: (ct * k, ct)))
    with pytest.raises(ValueError, match=r"cotangent for args\[1\], which is not differentiable.*Return None"):
        jax.grad(lambda x: fn(x, 3))(1.0)


# ---------------------------------------------------------------- bad input, named


def test_a_cotangent_of_another_shape_is_a_value_error_naming_the_argument_and_shapes():
    fn = sgm.custom_gradient(lambda x: (2 * x, lambda ct: jnp.sum(ct)))
    with pytest.raises(ValueError, match=r"shape \(\) for args\[0\] of shape \(3,\)"):
        jax.grad(_sum_of(fn))(jnp.ones(3))


def test_a_complex_cotangent_for_a_real_argument_is_a_type_error():
    fn = sgm.custom_gradient(lambda x: (2 * x, lambda ct: ct * 1j))
    with pytest.raises(TypeError, match=r"complex cotangent \(complex64\) for the real args\[0\]"):
        jax.grad(_sum_of(fn))(jnp.ones(3))


def test_the_wrong_number_of_cotangents_and_a_missing_vjp_are_named():
    two = sgm.custom_gradient(lambda x, y: (x * y, lambda ct: (ct * y,)))
    with pytest.raises(ValueError, match=r"returned 1 cotangent for 2 positional arguments \(args\[0\], args\[1\]\)"):
        jax.grad(two)(1.0, 2.0)
    one = sgm.custom_gradient(lambda x: (2 * x, lambda ct: (2 * ct, 3 * ct)))  # a tuple for an array: a count
    with pytest.raises(ValueError, match=r"returned 2 cotangents for 1 positional argument \(args\[0\]\)"):
        jax.grad(_sum_of(one))(jnp.ones(2))
    by_keyword = sgm.custom_gradient(lambda x, y: (x * y, lambda ct: ct * y))  # every argument a keyword: named
    with pytest.raises(ValueError, match=r"returned 1 cotangent for 2 positional arguments \(x, y\)"):
        jax.grad(lambda a: by_keyword(x=a, y=2.0))(1.0)
    no_vjp = sgm.custom_gradient(lambda x: 2 * x)
    with pytest.raises(TypeError, match="must return a pair"):
        jax.grad(no_vjp)(1.0)
    structure = sgm.custom_gradient(lambda p: (p["a"], lambda ct: {"b": ct}))
    with pytest.raises(ValueError, match=r"another structure"):
        jax.grad(structure)({"a": 1.0})


@pytest.mark.parametrize("options, error", [({"order": 3}, ValueError), ({"order": True}, ValueError),
                                            ({"check_linearity": 1}, TypeError)])
def test_options_are_checked_when_given(options, error):
    with pytest.raises(error):
        sgm.custom_gradient(**options)


# ---------------------------------------------------------------- second derivatives


def expsin_closed_form(x):
    return jnp.exp(jnp.sin(x))


def expsin(order):
    @sgm.custom_gradient(order=order)
    def f(x):
        y = jnp.exp(jnp.sin(x))
        return y, lambda ct: ct * jnp.cos(x) * y
    return f


X2 = jnp.array([0.3, -1.2, 2.0])
V2 = jnp.array([1.0, 0.5, -2.0])

SECOND = {
    "hessian": lambda f: jax.hessian(_sum_of(f))(X2),
    "hvp (forward over reverse)": lambda f: jax.jvp(jax.grad(_sum_of(f)), (X2,), (V2,))[1],
    "reverse over forward": lambda f: jax.grad(lambda x: jnp.vdot(jax.jvp(f, (x,), (V2,))[1], V2))(X2),
    "reverse over reverse": lambda f: jax.grad(lambda x: jnp.vdot(jax.grad(_sum_of(f))(x), V2))(X2),
    "jacfwd(jacrev)": lambda f: jax.jacfwd(jax.jacrev(f))(X2),
    "jit(hessian)": lambda f: jax.jit(jax.hessian(_sum_of(f)))(X2),
    "vmap(hessian)": lambda f: jax.vmap(jax.hessian(f))(X2),
}


@pytest.mark.parametrize("way", SECOND)
def test_order_2_second_derivatives_are_exact(way):
    np.testing.assert_allclose(SECOND[way](expsin(2)), SECOND[way](expsin_closed_form), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("way", SECOND)
def test_order_1_second_derivatives_raise_naming_order_2(way):
    with pytest.raises(LookupError, match=r"custom_gradient\(order=2\)"):
        SECOND[way](expsin(1))


def test_order_2_against_the_analytic_second_derivative_where_order_1_raises():
    """At a point: order 1 refuses the second derivative; order 2 gives exp(sin x)·(cos²x − sin x), whose f″ term
    (−sin x) is the one a constant J would miss."""
    f = expsin(1)
    with pytest.raises(LookupError):
        jax.hessian(f)(0.3)
    x = 0.3
    truth = jnp.exp(jnp.sin(x)) * (jnp.cos(x) ** 2 - jnp.sin(x))
    assert abs(float(jax.hessian(expsin(2))(x)) - float(truth)) < 1e-6


def test_order_1_mixed_second_derivatives_through_what_the_vjp_closes_over_raise():
    def inner_gradient(theta):  # θ reaches J only through the vjp's closure
        f = sgm.custom_gradient(lambda x: (jnp.sin(x), lambda ct: ct * jnp.cos(x) * theta))
        return jax.grad(f)(0.5)
    with pytest.raises(LookupError, match="order=2"):
        jax.grad(inner_gradient)(2.0)


def test_order_1_first_derivatives_under_an_outer_derivative_that_does_not_reach_f_are_exact():
    """A gradient penalty on θ outside the decorated call: a first derivative of f, exact, no guard raised."""
    def penalty(theta):
        g = jax.grad(lambda x: jnp.sum(log1pexp(x)) * theta)(X)
        return jnp.sum(g ** 2)
    want = jax.grad(lambda t: jnp.sum((jax.nn.sigmoid(X) * t) ** 2))(1.5)
    np.testing.assert_allclose(jax.grad(penalty)(1.5), want, rtol=1e-6)
    np.testing.assert_allclose(jax.linearize(_sum_of(log1pexp), X)[1](jnp.ones(4)), SIGMOID.sum(), rtol=1e-6)


def test_order_2_third_derivatives_raise():
    with pytest.raises(LookupError, match=r"third derivative.*order=2"):
        jax.grad(jax.grad(jax.grad(expsin(2))))(0.3)


def test_order_2_with_several_arguments_against_the_closed_forms_hessian():
    @sgm.custom_gradient(order=2)
    def f(x, y):
        value = x * y ** 2 + jnp.sin(x * y)
        c = jnp.cos(x * y)
        return value, lambda ct: (ct * (y ** 2 + y * c), ct * (2 * x * y + x * c))
    closed = lambda x, y: x * y ** 2 + jnp.sin(x * y)  # noqa: E731
    for argnums in ((0, 1), 0, 1):
        got = jax.hessian(f, argnums=argnums)(0.7, -1.3)
        want = jax.hessian(closed, argnums=argnums)(0.7, -1.3)
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-5)


# ---------------------------------------------------------------- vjps that call decorated functions


def erfcx(order):
    @sgm.custom_gradient(order=order)
    def f(x):
        y = jnp.exp(x * x) * jax.scipy.special.erfc(x)
        return y, lambda ct: ct * (2 * x * f(x) - 2 / np.sqrt(np.pi))  # its own f, inside its vjp
    return f


def test_a_vjp_that_calls_its_own_f_terminates_and_is_exact(float64):
    x = jnp.array([0.3, 1.0, 2.0, 4.0])
    xs = np.asarray(x)
    first = 2 * xs * scipy.special.erfcx(xs) - 2 / np.sqrt(np.pi)
    for order in (1, 2):
        f = erfcx(order)
        np.testing.assert_allclose(jax.grad(_sum_of(f))(x), first, rtol=1e-12)
        tangents = jax.jit(jax.vmap(lambda x, f=f: jax.jvp(f, (x,), (1.0,))[1]))(x)
        np.testing.assert_allclose(tangents, first, rtol=1e-12)
    second = 2 * scipy.special.erfcx(xs) + 2 * xs * first
    np.testing.assert_allclose(jnp.diagonal(jax.hessian(_sum_of(erfcx(2)))(x)), second, rtol=1e-12)


def test_a_vjp_that_calls_a_decorated_linear_function_on_its_cotangent():
    double = sgm.custom_gradient(lambda c: (2.0 * c, lambda ct: 2.0 * ct))
    outer = sgm.custom_gradient(lambda x: (jnp.sin(x), lambda ct: double(ct) * jnp.cos(x)))
    x = jnp.array([0.3, 1.0])
    np.testing.assert_allclose(jax.grad(_sum_of(outer))(x), 2 * jnp.cos(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(outer, (x,), (jnp.ones(2),))[1], 2 * jnp.cos(x), rtol=1e-6)


# ---------------------------------------------------------------- complex, infinite, float64


def test_complex_values_follow_jaxs_convention():
    z = jnp.array([1.0 + 2.0j, 3.0 - 1.0j])
    t = jnp.array([1.0 + 0.5j, 1.0j])
    square = sgm.custom_gradient(lambda z: (z * z, lambda ct: ct * 2 * z))
    np.testing.assert_allclose(jax.jvp(square, (z,), (t,))[1], jax.jvp(lambda z: z * z, (z,), (t,))[1])
    np.testing.assert_allclose(jax.vjp(square, z)[1](t)[0], jax.vjp(lambda z: z * z, z)[1](t)[0])
    modulus = sgm.custom_gradient(lambda z: ((z * jnp.conj(z)).real, lambda ct: ct * 2 * jnp.conj(z)))
    closed = lambda z: (z * jnp.conj(z)).real  # noqa: E731
    np.testing.assert_allclose(jax.jvp(modulus, (z,), (t,))[1], jax.jvp(closed, (z,), (t,))[1])
    np.testing.assert_allclose(jax.grad(_sum_of(modulus))(z), jax.grad(_sum_of(closed))(z))
    np.testing.assert_allclose(jax.grad(lambda z: modulus(z)[0])(z), jax.grad(lambda z: closed(z)[0])(z))


def test_an_infinite_derivative_is_inf_whatever_the_size_of_y():
    """sqrt at 0: one element takes the identity form, a larger y the transpose, whose J·v is NaN in value
    there (inf·0); its derivative, J·dv, is the rule's inf all the same, as autodiff of the formula gives."""
    root = sgm.custom_gradient(lambda x: (jnp.sqrt(x), lambda ct: ct * 0.5 / jnp.sqrt(x)))
    assert float(jax.grad(root)(0.0)) == np.inf and float(jax.jvp(root, (0.0,), (1.0,))[1]) == np.inf
    x = jnp.array([0.0, 4.0])
    for name, derivative in TRANSFORMS.items():
        np.testing.assert_array_equal(derivative(root, x), derivative(jnp.sqrt, x), err_msg=name)
        np.testing.assert_array_equal(derivative(root, x), [np.inf, 0.25], err_msg=name)
    np.testing.assert_array_equal(root(x), [0.0, 2.0])


def test_float64_against_central_differences(float64):
    x = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float64)
    f = sgm.custom_gradient(lambda x: (jnp.sin(x) * jnp.exp(x), lambda ct: ct * (jnp.cos(x) + jnp.sin(x)) * jnp.exp(x)))
    closed, xs, h = lambda v: np.sin(v) * np.exp(v), np.asarray(x), 1e-6
    differences = (closed(xs + h) - closed(xs - h)) / (2 * h)
    assert jax.grad(_sum_of(f))(x).dtype == jnp.float64
    np.testing.assert_allclose(jax.grad(_sum_of(f))(x), differences, rtol=1e-8)
    np.testing.assert_allclose(jax.jvp(f, (x,), (jnp.ones(5),))[1], differences, rtol=1e-8)


# ---------------------------------------------------------------- JAX's own custom_gradient cases, side by side


def test_jaxs_custom_gradient_cases_restated():
    """jax.custom_gradient's tests: x³ with a deliberate vjp g·x² (value 27, gradient 9), and a product whose
    vjp ignores its cotangent, which JAX takes as written (right only where the cotangent is 1) and we refuse."""
    def cube(x):
        z = x ** 2
        return z * x, lambda g: (g * z,)
    ours, theirs = sgm.custom_gradient(cube), jax.custom_gradient(cube)
    assert jax.value_and_grad(ours)(3.0) == jax.value_and_grad(theirs)(3.0) == (27.0, 9.0)
    assert float(jax.grad(lambda x: 2 * ours(x))(3.0)) == float(jax.grad(lambda x: 2 * theirs(x))(3.0)) == 18.0

    def product(x, y):
        return x * y, lambda g: (y, x)
    assert float(jax.grad(lambda x: 2 * jax.custom_gradient(product)(x, 4.0))(3.0)) == 4.0  # the truth is 8
    with pytest.raises(ValueError, match="affine map, not a VJP"):
        jax.grad(sgm.custom_gradient(product))(3.0, 4.0)


FORWARD_MODE_TABLE = {  # docs/jax.md's table, row by row: what each tool does
    "grad": lambda f: float(jax.grad(f)(100.0)),
    "jvp": lambda f: float(jax.jvp(f, (100.0,), (1.0,))[1]),
    "jacfwd": lambda f: float(jax.jacfwd(f)(jnp.array([100.0]))[0, 0]),
    "hessian": lambda f: float(jax.hessian(f)(0.0)),
    "vmap": lambda f: float(jax.vmap(jax.grad(f))(jnp.array([100.0]))[0]),
}


def _custom_vjp_log1pexp():
    f = jax.custom_vjp(lambda x: jnp.log1p(jnp.exp(x)))
    f.defvjp(lambda x: (f(x), x), lambda x, ct: (ct * (1 - 1 / (1 + jnp.exp(x))),))
    return f


def _jax_custom_gradient_log1pexp():
    return jax.custom_gradient(lambda x: (jnp.log1p(jnp.exp(x)), lambda ct: ct * (1 - 1 / (1 + jnp.exp(x)))))


@pytest.mark.parametrize("row", FORWARD_MODE_TABLE)
def test_the_forward_mode_table(row):
    run = FORWARD_MODE_TABLE[row]
    anchors = {"custom_vjp": _custom_vjp_log1pexp(), "jax.custom_gradient": _jax_custom_gradient_log1pexp()}
    for name, anchor in anchors.items():
        # hessian is forward-over-reverse: custom_vjp raises; jax.custom_gradient, measured, gives the truth
        if row in ("jvp", "jacfwd") or (row == "hessian" and name == "custom_vjp"):
            with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
                run(anchor)
        else:
            assert run(anchor) == (0.25 if row == "hessian" else 1.0)
    if row == "hessian":
        assert run(log1pexp_jvp) == 0.25 and run(sgm.custom_gradient(log1pexp.undecorated, order=2)) == 0.25
        with pytest.raises(LookupError, match="order=2"):
            run(log1pexp)
    else:
        assert run(log1pexp_jvp) == run(log1pexp) == 1.0


def test_the_non_linear_vjp_row():
    """A clipping VJP: jax.custom_vjp and jax.custom_gradient take it as written (the gradient of 3·f at 1 is
    clip(3) = 1, not the 6 of f = 2x); we refuse it."""
    clipped = lambda x: (2.0 * x, lambda ct: jnp.clip(ct, -1.0, 1.0))  # noqa: E731
    assert float(jax.grad(lambda x: 3.0 * jax.custom_gradient(clipped)(x))(1.0)) == 1.0
    as_vjp = jax.custom_vjp(lambda x: 2.0 * x)
    as_vjp.defvjp(lambda x: (2.0 * x, None), lambda _, ct: (jnp.clip(ct, -1.0, 1.0),))
    assert float(jax.grad(lambda x: 3.0 * as_vjp(x))(1.0)) == 1.0
    with pytest.raises(ValueError, match="max"):
        jax.grad(lambda x: 3.0 * sgm.custom_gradient(clipped)(x))(1.0)


# ---------------------------------------------------------------- sharded arrays, hypothesis


def test_sharded_arrays_over_two_host_devices():
    run_on_two_host_devices("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        import stopgrad_math.jax as sgm
        mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
        x = jax.device_put(jnp.linspace(-5.0, 100.0, 8), NamedSharding(mesh, PartitionSpec("batch")))
        @sgm.custom_gradient
        def f(x):
            return jnp.logaddexp(x, 0.0), lambda ct: ct * jax.nn.sigmoid(x)
        grad = jax.jit(jax.grad(lambda x: f(x).sum()))(x)
        tangent = jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1])(x)
        assert len(grad.sharding.device_set) == 2 and len(tangent.sharding.device_set) == 2
        np.testing.assert_allclose(grad, jax.nn.sigmoid(np.linspace(-5.0, 100.0, 8)), rtol=1e-6)
        np.testing.assert_array_equal(tangent, grad)
        print("ok", len(jax.devices()))
    """)


from hypothesis import given, settings  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(elementwise_cases())
def test_the_value_is_y_and_the_derivative_the_vjps_for_any_shape_dtype_and_value(case):
    """vjp(ct) = ct·g: the value is y bit for bit; the derivative is g at every element, whatever x and g hold
    (±inf, NaN), in every mode, as autodiff of x ↦ g·x gives it (jacfwd's inf·0 = NaN off the diagonal too)."""
    y, g, x = case
    fn = jax.jit(sgm.custom_gradient(lambda x: (jnp.asarray(y), lambda ct: ct * g)))
    value = np.asarray(fn(x))
    flushed = (value == 0) & (np.abs(y.astype(np.float64)) < 1e-4)  # XLA may flush a subnormal
    assert np.all((bits(value) == bits(y)) | flushed | (np.isnan(value) & np.isnan(y.astype(np.float64))))
    tangent = np.asarray(jax.jvp(fn, (x,), (np.ones_like(x),))[1]).astype(np.float64)
    cotangent = np.asarray(jax.vjp(fn, x)[1](np.ones_like(y))[0]).astype(np.float64)
    np.testing.assert_array_equal(tangent, g.astype(np.float64))
    np.testing.assert_array_equal(cotangent, g.astype(np.float64))
    truth = lambda x: g * x  # noqa: E731
    np.testing.assert_array_equal(np.float64(jax.jacfwd(fn)(x)), np.float64(jax.jacfwd(truth)(x)))
    np.testing.assert_array_equal(np.float64(jax.jacrev(fn)(x)), np.float64(jax.jacrev(truth)(x)))


class _Scaled:
    """A plain class (a flax-style module's state) whose decorated method closes over its scale."""

    def __init__(self, scale):
        self.scale = scale

    @sgm.custom_gradient
    def __call__(self, x):
        scale = self.scale
        return x * scale, lambda ct: (ct * scale * 0.5,)


def test_a_decorated_method_binds_its_instance_and_keeps_its_signature():
    """The instance is bound (its VJP returns x's cotangent alone, as tf.custom_gradient binds a method), under
    grad, jvp and jit (issue 57). Truth: half the scale, the declared gradient."""
    import inspect

    scaled = _Scaled(jnp.array([1.0, 2.0, -3.0]))
    assert list(inspect.signature(scaled.__call__).parameters) == ["x"]
    x = jnp.array([0.5, -1.0, 2.0])
    half = np.asarray(scaled.scale) * 0.5
    np.testing.assert_array_equal(jax.grad(lambda x: scaled(x).sum())(x), half)
    np.testing.assert_array_equal(jax.jvp(scaled, (x,), (jnp.ones(3),))[1], half)
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda x: scaled(x).sum()))(x), half)


def _max_pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _average_pool(x):
    return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def _layer_norm(x):
    centred = x - x.mean(-1, keepdims=True)
    return centred / jnp.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)


_CHECKPOINTED_BLOCKS = {
    "max_pool": _max_pool, "average_pool": _average_pool, "layer_norm": _layer_norm,
    "softmax": lambda x: jax.nn.softmax(x, -1), "relu": jax.nn.relu, "gelu": jax.nn.gelu,
    "conv": lambda x: jax.lax.conv_general_dilated(x, jnp.linspace(-1.0, 1.0, 18).reshape(3, 3, 2, 1), (1, 1),
                                                   "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "dense": lambda x: x @ jnp.linspace(-1.0, 1.0, 6).reshape(2, 3) + jnp.array([0.1, -0.2, 0.3]),
    "log_softmax": lambda x: jax.nn.log_softmax(x, -1), "elu": jax.nn.elu, "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh, "softplus": jax.nn.softplus,
    "leaky_relu": jax.nn.leaky_relu, "embedding": lambda x: jnp.take(x, jnp.array([3, 0, 2, 2]), axis=2),
    "cumsum": lambda x: jnp.cumsum(x, axis=2), "sort": lambda x: jnp.sort(x, axis=2),
}


@pytest.mark.parametrize("name", list(_CHECKPOINTED_BLOCKS))
def test_a_recomputed_block_at_nan_and_inf_has_the_vjps_derivative(name):
    """x holding NaN, inf and -inf: the cotangent is the VJP's, and the tangent its transpose's (JAX's autodiff of
    the pullback as a linear map), NaN and inf where those are, eagerly and under jit."""
    block = _CHECKPOINTED_BLOCKS[name]

    @sgm.custom_gradient
    def checkpointed(x):
        return block(x), lambda ct: (jax.vjp(block, x)[1](ct)[0],)

    x = np.random.default_rng(7).standard_normal((1, 4, 4, 2)).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    x = jnp.asarray(x)
    ct = jnp.asarray(np.random.default_rng(8).standard_normal(block(x).shape), jnp.float32)
    tangent = jnp.asarray(np.random.default_rng(9).standard_normal(x.shape), jnp.float32)
    pullback = jax.vjp(block, x)[1]
    backward_truth = pullback(ct)[0]
    forward_truth = jax.vjp(lambda c: pullback(c)[0], jnp.zeros_like(ct))[1](tangent)[0]
    for wrap in (lambda fn: fn, jax.jit):  # (float32: two orders of the same sums, as above)
        np.testing.assert_allclose(wrap(lambda x, ct: jax.vjp(checkpointed, x)[1](ct)[0])(x, ct), backward_truth,
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(wrap(lambda x, t: jax.jvp(checkpointed, (x,), (t,))[1])(x, tangent),
                                   forward_truth, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("transform", ["grad", "jit(grad)", "jvp", "jit(jvp)", "jacrev", "jacfwd", "vmap(grad)"])
@pytest.mark.parametrize("name", list(_CHECKPOINTED_BLOCKS))
def test_a_recomputed_block_has_the_blocks_derivative(name, transform):
    """Checkpointing as JAX users write it (issue 57): f runs a block, the VJP recomputes it and returns jax.vjp's
    pullback of it. A max pool's VJP is select_and_scatter_add of the cotangent, linear in it given the saved
    input (it was refused). Every transform the namespace claims; truth: plain autodiff of the block."""
    block = _CHECKPOINTED_BLOCKS[name]

    @sgm.custom_gradient
    def checkpointed(x):
        return block(x), lambda ct: (jax.vjp(block, x)[1](ct)[0],)

    x = jnp.asarray(np.random.default_rng(7).standard_normal((1, 4, 4, 2)), jnp.float32)
    weights = jnp.asarray(np.random.default_rng(8).standard_normal(block(x).shape), jnp.float32)
    tangent = jnp.asarray(np.random.default_rng(9).standard_normal(x.shape), jnp.float32)
    if transform == "vmap(grad)":  # per-sample gradients over a batch of two
        x = jnp.stack([x, -x])
        derivative = lambda fn: jax.vmap(jax.grad(lambda x: (fn(x) * weights).sum()))  # noqa: E731
    elif "grad" in transform:
        derivative = lambda fn: jax.grad(lambda x: (fn(x) * weights).sum())  # noqa: E731
    elif transform in ("jacrev", "jacfwd"):
        derivative = getattr(jax, transform)
    else:
        derivative = lambda fn: lambda x: jax.jvp(fn, (x,), (tangent,))[1]  # noqa: E731
    wrap = jax.jit if transform.startswith("jit") else (lambda fn: fn)
    # (float32: two orders of the same sums, a layer norm's amplified by its small variance)
    np.testing.assert_allclose(wrap(derivative(checkpointed))(x), derivative(block)(x), rtol=1e-4, atol=1e-5)
