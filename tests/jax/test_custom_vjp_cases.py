"""JAX's own CustomVJPTest (tests/custom_api_test.py, jax-v0.10.2), restated case by case, side by side: each
case runs through ``jax.custom_vjp`` and through ``stopgrad_math.jax.custom_vjp``, the same fun, fwd and bwd,
against the analytic truth.

Where the two differ, the difference is one the issue allows, and is tested as itself:
- forward mode and a tracer closed over or passed as a non-differentiated argument work on ours where
  custom_vjp raises;
- a bwd that is not linear in its cotangent (``clip``) or is affine (a cotangent that ignores it) makes ours hand
  the call to ``jax.custom_vjp`` itself: reverse mode is the same to the bit, forward mode raises custom_vjp's
  TypeError naming the bwd and the op;
- a derivative of a bwd (a second derivative, ``grad`` of a function that takes a ``grad``) raises at
  ``order=1``, naming ``order=2``, which gives it exactly; at ``order=2`` a third one raises.

Not restated: the cases that read JAX's internals (jaxpr printing, DCE, ``optimize_remat``'s jaxpr); the
symbolic-zero cases, where ours is jax.custom_vjp itself, are in tests/jax/test_custom_vjp_face.py."""

import re

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402


def _ours(order=1, nondiff_argnums=()):
    return lambda fun: sgm.custom_vjp(fun, nondiff_argnums=nondiff_argnums, order=order)


def _theirs(order=1, nondiff_argnums=()):
    del order  # custom_vjp differentiates its bwd to any order
    return lambda fun: jax.custom_vjp(fun, nondiff_argnums=nondiff_argnums)


BOTH = {"jax.custom_vjp": _theirs, "stopgrad_math": _ours}
both = pytest.mark.parametrize("make", BOTH.values(), ids=BOTH)
SECOND_DERIVATIVE_AT_ORDER_1 = "A second derivative through .*decorated at order=1.*custom_gradient\\(order=2\\)"


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=2e-6,
                               atol=1e-7)


def _sin_with_twice_its_derivative(make):
    """sin, whose VJP is 2·cos·ct: the custom gradient is not the autodiff one, so a test sees which ran."""
    f = make()(jnp.sin)
    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda cos_x, ct: (2 * cos_x * ct,))
    return f


# ---------------------------------------------------------------- the same on both


@both
def test_basic_jit_and_value_and_grad(make):  # test_basic, test_jit
    f, x = _sin_with_twice_its_derivative(make), 3.0
    close(f(x), np.sin(x))
    close(jax.value_and_grad(f)(x), (np.sin(x), 2 * np.cos(x)))
    close(jax.jit(jax.jit(f))(x), np.sin(x))
    close(jax.jit(jax.grad(f))(x), 2 * np.cos(x))
    close(jax.grad(jax.jit(f))(x), 2 * np.cos(x))


@both
def test_vmap_in_every_nesting_with_grad(make):  # test_vmap
    f = _sin_with_twice_its_derivative(make)
    x, xx = np.arange(3.0), np.arange(6.0).reshape(2, 3)
    close(jax.vmap(jax.vmap(f))(xx), np.sin(xx))
    close(jax.vmap(jax.value_and_grad(f))(x), (np.sin(x), 2 * np.cos(x)))
    close(jax.vmap(jax.vmap(jax.grad(f)))(xx), 2 * np.cos(xx))
    close(jax.grad(lambda x: jax.vmap(jax.vmap(f))(x).sum())(xx), 2 * np.cos(xx))
    close(jax.vmap(jax.grad(lambda x: jax.vmap(f)(x).sum()))(xx), 2 * np.cos(xx))


@both
def test_pytree_argument_and_output(make):  # test_pytrees
    f = make()(lambda p: {"out": jnp.sin(p["x"])})
    f.defvjp(lambda p: ({"out": jnp.sin(p["x"])}, {"cos": jnp.cos(p["x"])}),
             lambda r, ct: ({"x": 2 * r["cos"] * ct["out"]},))
    close(jax.grad(lambda p: f(p)["out"])({"x": 3.0})["x"], 2 * np.cos(3.0))


@both
def test_python_control_flow_on_concrete_values_in_fun_fwd_and_bwd(make):  # test_python_control_flow(_bwd)
    def branching(x):
        return jnp.sin(x) if x > 0 else jnp.cos(x)

    for fun in (branching, lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x)):
        f = make()(fun)
        f.defvjp(lambda x: (branching(x), x), lambda x, ct: (2 * ct,) if x > 0 else (3 * ct,))
        close(jax.value_and_grad(f)(2.0), (np.sin(2.0), 2.0))
        close(jax.value_and_grad(f)(-2.0), (np.cos(-2.0), 3.0))


@both
def test_a_keyword_argument_is_bound_by_the_signature_and_differentiated(make):  # test_kwargs
    f = make()(lambda x, y, c=1.0: c * (x + y))
    f.defvjp(lambda x, y, c=1.0: (c * (x + y), (x, y, c)), lambda r, ct: (r[2] * ct, r[2] * ct, (r[0] + r[1]) * ct))
    loss = lambda x, y, c: jnp.square(f(x, y, c=c))  # noqa: E731
    close(loss(10.0, 5.0, 2.0), 900.0)
    close(jax.grad(loss, argnums=(0, 1, 2))(10.0, 5.0, 2.0), (120.0, 120.0, 900.0))  # 2·c(x+y)·(c, c, x+y)


def _in_a_scan(f):
    return lambda x: lax.scan(lambda carry, _: (f(carry), None), x, None, length=1)[0]


@both
def test_in_a_scan_and_vmapped(make):  # test_initial_style, test_initial_style_vmap
    f = _sin_with_twice_its_derivative(make)
    close(jax.grad(_in_a_scan(f))(3.0), 2 * np.cos(3.0))
    tripled = make()(lambda x: 3 * x)
    tripled.defvjp(lambda x: (3 * x, jnp.cos(x)), lambda cos_x, ct: (2 * cos_x * ct,))
    x = np.arange(3.0)
    close(jax.vmap(_in_a_scan(tripled))(x), 3 * x)
    close(jax.grad(lambda x: jax.vmap(_in_a_scan(tripled))(x).sum())(x), 2 * np.cos(x))


@both
def test_a_closed_over_array_constant_in_a_vmapped_scan(make):  # test_initial_style_vmap_3
    weights = jnp.arange(1.0, 4.0)
    f = make()(lambda x: 3 * x * jnp.sum(weights))
    f.defvjp(lambda x: (3 * x * jnp.sum(weights), jnp.cos(x)), lambda cos_x, ct: (2 * cos_x * ct,))
    x = np.arange(3.0)
    close(jax.vmap(_in_a_scan(f))(x), 18 * x)
    close(jax.grad(lambda x: jax.vmap(_in_a_scan(f))(x).sum())(x), 2 * np.cos(x))


@both
def test_a_grad_of_a_vmap_inside_a_scan(make):  # test_initial_style_vmap_2
    total = make()(lambda x: jnp.sum(x))
    total.defvjp(lambda x: (jnp.sum(x), jnp.full_like(x, 2.0)), lambda twos, ct: (twos * ct,))
    step = lambda carry, _: (carry, jax.grad(lambda x: jax.vmap(total)(x).sum())(carry))  # noqa: E731
    _, grads = lax.scan(step, jnp.ones((10, 3)), jnp.arange(4))
    close(grads, np.full((4, 10, 3), 2.0))


@both
def test_non_differentiated_function_arguments(make):  # test_nondiff_argnums, _argnames, _argnums_argnames
    app = make(nondiff_argnums=(0, 1))(lambda f, g, x: f(x) + g(x))
    app.defvjp(lambda f, g, x: (f(x) + g(x), jnp.cos(x)), lambda f, g, cos_x, ct: (cos_x * ct,))
    double = lambda x: 2 * x  # noqa: E731
    close(app(double, double, 1.0), 4.0)
    close(jax.value_and_grad(lambda x: app(double, double, x))(1.0), (4.0, np.cos(1.0)))


@both
def test_closed_over_vmap_tracers(make):  # test_closed_over_vmap_tracer, test_closed_over_tracer3
    def scaled_by(x):
        f = make()(lambda y: x * y)
        f.defvjp(lambda y: (x * y, (x, jnp.cos(y))), lambda r, ct: (r[1] * ct * r[0],))
        return f

    close(jax.vmap(lambda x: scaled_by(x)(3.0))(np.arange(3.0)), 3 * np.arange(3.0))
    close(jax.vmap(lambda x: jax.grad(scaled_by(x))(3.0))(np.arange(3.0)), np.cos(3.0) * np.arange(3.0))


@both
def test_a_vjp_closure_as_the_residual_nests(make):  # test_nestable_vjp
    square = lambda x: x**2  # noqa: E731
    g = make()(square)
    g.defvjp(lambda x: jax.vjp(square, x), lambda square_vjp, ct: square_vjp(ct))
    close(jax.vjp(g, 1.0)[1](1.0), (2.0,))
    close(jax.jit(lambda x: jax.vjp(g, x)[1])(1.0)(3.0), (6.0,))


@both
def test_a_collective_over_a_named_vmap_axis(make):  # test_initial_style_vmap_with_collective
    f = make()(lambda x: lax.psum(x, "i"))
    f.defvjp(lambda x: (lax.psum(x, "i"), None), lambda _, ct: (ct,))

    def staged_then_run(x):
        closed = jax.make_jaxpr(f)(x)
        return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x)[0]

    out = jax.vmap(lambda _, x: staged_then_run(x), axis_name="i", in_axes=(0, None), out_axes=None)(
        jnp.arange(4.0), 2.0)
    close(out, 8.0)


@both
def test_a_bwd_or_fwd_closing_over_an_outer_tracer_under_jit_and_vmap(make):  # test_{bwd,fwd}_closes_over_tracer
    def inner_grad(y, in_bwd):
        f = make()(lambda x: 2.0 * jnp.sin(x))
        if in_bwd:
            f.defvjp(lambda x: (2.0 * jnp.sin(x), ()), lambda _, ct: (2.0 * jnp.cos(y) * ct,))
        else:
            f.defvjp(lambda x: (2.0 * jnp.sin(x), y), lambda y, ct: (2.0 * jnp.cos(y) * ct,))
        return jax.grad(f)(1.0)

    ys = np.arange(3.0)
    for in_bwd in (True, False):
        fn = lambda y: inner_grad(y, in_bwd)  # noqa: B023, E731
        close(jax.jit(fn)(2.0), 2 * np.cos(2.0))
        close(jax.vmap(fn)(ys), 2 * np.cos(ys))
        close(jax.jit(jax.vmap(fn))(ys), 2 * np.cos(ys))
        close(jax.vmap(jax.jit(fn))(ys), 2 * np.cos(ys))


@both
def test_an_integer_argument_gets_a_float0_cotangent(make):  # test_float0, test_float0_bwd_none
    f = make()(lambda x, i: 2.0 * x)
    f.defvjp(lambda x, i: (2.0 * x, None), lambda _, ct: (3.0 * ct, None))
    dx, di = jax.grad(f, allow_int=True, argnums=(0, 1))(2.0, 3)
    close(dx, 3.0)
    assert di.dtype == jax.dtypes.float0
    g = make()(lambda i, x: jnp.sin(x))
    g.defvjp(lambda i, x: (jnp.sin(x), jnp.cos(x)), lambda cos_x, ct: (None, 2 * cos_x * ct))
    close(jax.grad(g, 1)(jnp.array([1, 2]), 3.0), 2 * np.cos(3.0))


@both
def test_under_remat(make):  # test_remat
    f = _sin_with_twice_its_derivative(make)
    g = jax.remat(lambda x: f(f(x)))
    close(g(2.0), np.sin(np.sin(2.0)))
    close(jax.grad(g)(2.0), 4 * np.cos(np.sin(2.0)) * np.cos(2.0))


@both
def test_none_cotangents_for_some_arguments(make):  # test_bwd_nones, _vmap, _pytree
    f = make()(lambda x, y: x * jnp.sin(y))
    f.defvjp(lambda x, y: (x * jnp.sin(y), jnp.cos(y)), lambda cos_y, ct: (None, 2 * cos_y * ct))
    close(jax.grad(lambda x: f(x, x))(3.0), 2 * np.cos(3.0))
    close(jax.grad(lambda x: jax.vmap(f)(x, x).sum())(np.arange(3.0)), 2 * np.cos(np.arange(3.0)))
    g = make()(lambda xs, y: xs[0] * xs[1] * jnp.sin(y))
    g.defvjp(lambda xs, y: (xs[0] * xs[1] * jnp.sin(y), jnp.cos(y)), lambda cos_y, ct: (None, 2 * cos_y * ct))
    close(jax.grad(lambda x: g((x, x), x))(3.0), 2 * np.cos(3.0))


@both
def test_none_leaves_in_the_cotangent_and_in_the_argument(make):  # test_nones_..._returned_by_bwd, #8356
    f = make()(lambda x: x[0])
    f.defvjp(lambda x: (x[0], None), lambda _, ct: ((ct, (None, None)),))
    grads = jax.grad(f)((1.0, (2.0, 3.0)))
    close(jax.tree_util.tree_leaves(grads), [1.0, 0.0, 0.0])
    grads = jax.grad(f)((1.0, (2.0, None)))
    assert grads[1][1] is None
    close(jax.tree_util.tree_leaves(grads), [1.0, 0.0])


@both
def test_a_function_returning_none_in_a_vmapped_vjp_inside_a_scan(make):  # test_custom_vjp_closure_4521
    g = make()(lambda x, y: None)
    g.defvjp(lambda x, y: (None, y), lambda residuals, ct: pytest.fail("no cotangent reaches it"))

    def body(xs, _):
        vjp = jax.vjp(lambda xs, y: jax.vmap(g, in_axes=(0, None), out_axes=None)(xs, y), xs, jnp.zeros(1))[1]
        vjp(None)
        return xs, None

    close(lax.scan(body, jnp.ones(5), None, 100)[0], np.ones(5))


@both
def test_a_vmapped_scan_checked_to_second_order(make):  # test_custom_vjp_scan_batching_edge_case (#5832)
    mul = make(order=2)(lambda x, coeff: x * coeff)
    mul.defvjp(lambda x, coeff: (x * coeff, (x, coeff)), lambda r, ct: (ct * r[1], (r[0] * ct).sum()))
    scan_over = lambda x, coeff: lax.scan(lambda x, _: (mul(x, coeff), None), x, jnp.arange(3))[0]  # noqa: E731
    batched = jax.vmap(scan_over, in_axes=(0, None))
    x = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    dx, dcoeff = jax.vjp(batched, x, jnp.float32(1.0))[1](np.ones((3, 2), np.float32))
    close(dx, np.ones((3, 2)))
    close(dcoeff, 3 * x.sum())
    check_grads(batched, (x, jnp.float32(1.0)), order=2, modes=["rev"])


@both
def test_a_closure_over_a_vmapped_value_checked_against_finite_differences(make):  # test_closure_with_vmap2
    def h(z):
        def per_x(x):
            g = make()(lambda y: x * y)
            g.defvjp(lambda y: (x * y, x), lambda x, ct: (x * ct,))
            return g(z)

        return jax.vmap(per_x)(jnp.arange(3.0, dtype=jnp.float32)).sum()

    check_grads(h, (jnp.float32(3.14),), order=1, modes=["rev"])
    close(jax.grad(h)(jnp.float32(3.14)), 3.0)


@both
def test_a_custom_pytree_cotangent_and_a_list_of_cotangents(make):  # test_pytrees_not_required_..., _list_or_tuple
    class Box(list):
        pass

    jax.tree_util.register_pytree_node(Box, lambda box: (list(box), None), lambda _, children: Box(children))
    first = make()(lambda box: box[0])
    first.defvjp(lambda box: (box[0], None), lambda _, ct: (Box([ct]),))
    close(jax.grad(first)(Box([1.0]))[0], 1.0)
    product = make()(lambda x, y: x * y)
    product.defvjp(lambda x, y: (x * y, (x, y)), lambda r, ct: [ct * r[1], r[0] * ct])
    close(jax.grad(product, argnums=(0, 1))(1.0, 2.0), (2.0, 1.0))


@both
def test_a_vmapped_vjp_called_twice(make):  # test_vmap_vjp_called_twice (#14728)
    f = make()(lambda x: x)
    f.defvjp(lambda x: (x, None), lambda _, ct: (ct,))
    vjp = jax.vjp(jax.vmap(f), jnp.array([3.0]))[1]
    close(vjp(jnp.array([3.0])), ([3.0],))
    close(vjp(jnp.array([3.0])), ([3.0],))


@both
def test_two_outputs_and_two_arguments(make):  # test_dce, its derivatives
    f = make()(lambda x, y: (jnp.sin(x), x + jnp.cos(y)))
    f.defvjp(lambda x, y: ((jnp.sin(x), x + jnp.cos(y)), (jnp.cos(x), jnp.sin(y))),
             lambda r, cts: (2.0 * r[0] * cts[0] + 1.5 * cts[1], -0.5 * r[1] * cts[1]))
    x, y = 0.1, -1.3
    close(jax.grad(lambda x, y: f(x, y)[0], argnums=(0, 1))(x, y), (2 * np.cos(x), 0.0))
    close(jax.grad(lambda x, y: f(x, y)[1], argnums=(0, 1))(x, y), (1.5, -0.5 * np.sin(y)))


@both
def test_a_closure_converted_function_and_its_constants(make):  # test_closure_convert(_mixed_consts), linear bwd
    def cos_after(fn, x):
        converted, constants = jax.closure_convert(fn, x)
        return apply(converted, x, *constants)

    apply = make(nondiff_argnums=(0,))(lambda fn, x, *constants: jnp.cos(fn(x, *constants)))
    apply.defvjp(lambda fn, x, *constants: (jnp.cos(fn(x, *constants)), constants),
                 lambda fn, constants, ct: (
                     17.0 * ct * jnp.ones(2), *(42.0 * ct * jnp.ones_like(c) for c in constants)))
    c, x = 2.0 * jnp.ones(2), jnp.ones(2)
    close(cos_after(lambda x: jnp.sum((x - c) ** 2), x), np.cos(2.0))
    g_c, g_x = jax.grad(lambda c, x: cos_after(lambda x: jnp.sum((x - c) ** 2), x), argnums=(0, 1))(c, x)
    close((g_c, g_x), (np.full(2, 42.0), np.full(2, 17.0)))


# ---------------------------------------------------------------- both refuse


@both
@pytest.mark.parametrize("bwd", [lambda _, ct: (ct, ct), lambda _, ct: 2.0 * ct], ids=["two", "bare"])
def test_a_bwd_giving_two_cotangents_or_a_bare_one_for_one_argument(make, bwd):  # test_vjp_rule_inconsistent_
    """test_vjp_rule_inconsistent_pytree_structures_error, test_vjp_bwd_returns_non_tuple_error: raised where a
    derivative is taken, not by a plain call, under jit too (issue 76: ours raised in jax.make_jaxpr and jit of a
    plain call, where JAX never runs the bwd; test_pretty_print, test_initial_style_vmap_with_collective)."""
    f = make()(lambda x: x + 1.0)
    f.defvjp(lambda x: (x + 1.0, None), bwd)
    assert float(jax.jit(f)(2.0)) == 3.0 and "custom_vjp_call" in str(jax.make_jaxpr(f)(2.0))
    with pytest.raises(TypeError, match=re.escape("Custom VJP bwd rule must produce an output with the same "
                                                  "container (pytree) structure as the args tuple of the primal "
                                                  "function, and in particular must produce a tuple")):
        jax.grad(f)(2.0)


@both
def test_a_cotangent_of_another_shape(make):  # test_bwd_rule_shape_mismatch
    """JAX's words, so that a search for the error finds JAX's answer (issue 76: ours named args[1] its own way)."""
    f = make()(lambda x, y: x)
    f.defvjp(lambda x, y: (x, None), lambda _, ct: (jnp.zeros(3), jnp.zeros(3)))
    with pytest.raises(ValueError, match=re.escape("at output[1] the bwd rule produced an output of type float32[3] "
                                                   "corresponding to an input of type float32[4], so the shapes do "
                                                   "not match")):
        jax.grad(lambda x, y: f(x, y * y).sum(), 1)(jnp.ones(3), jnp.ones(4))


def test_a_bwd_jax_would_refuse_makes_forward_mode_name_it():
    """Ours hands such a call to jax.custom_vjp: its forward mode raises, with JAX's words and then the bwd's fault,
    eagerly and under jit, linearize and a scan (where JAX's bare TypeError came from its compiler before)."""
    f = _ours()(lambda x, y: x)
    f.defvjp(lambda x, y: (x, None), lambda _, ct: (jnp.zeros(3), jnp.zeros(3)))
    forward = lambda y: f(jnp.ones(3), y * y).sum()  # noqa: E731
    y, dy = jnp.ones(4), jnp.ones(4)
    for run in (lambda: jax.jvp(forward, (y,), (dy,)), lambda: jax.jit(lambda y: jax.jvp(forward, (y,), (dy,)))(y),
                lambda: jax.linearize(forward, y)[1](dy),
                lambda: jax.jvp(lambda y: lax.scan(lambda c, _: (c, forward(c)), y, None, length=2)[1].sum(), (y,),
                                (dy,)),
                lambda: jax.jvp(jax.checkpoint(forward), (y,), (dy,))):
        with pytest.raises(TypeError, match=r"forward-mode autodiff .* the bwd of <lambda> could not be embedded "
                                            r"\(.*at output\[1\].*float32\[3\] corresponding to an input of type "
                                            r"float32\[4\]"):
            run()


@both
@pytest.mark.parametrize("fwd, found", [
    (lambda x: ((x, x), None), "container/pytree structure:\n    (float32[], float32[])\nwhile"),
    (lambda x: (jnp.zeros((3,)), None), "shapes/dtypes of:\n    float32[3]\nwhile")], ids=["structure", "shape"])
def test_a_fwd_whose_output_is_not_funs(make, fwd, found):  # test_fwd_rule_primal_out_type_doesnt_match_primal_
    """In JAX's words, where JAX has run fun (in a scan; issue 76: ours raised an error of its own)."""  # error_message
    f = make()(lambda x: x)
    f.defvjp(fwd, lambda _, ct: (ct,))
    with pytest.raises(TypeError, match=re.escape("the fwd rule output's first element had " + found)):
        jax.grad(_in_a_scan(f))(jnp.float32(1.0))


@both
def test_a_missing_argument_is_a_type_error_naming_it(make):  # test_resolve_kwargs_error_message
    f = make()(lambda x, y: x + y)
    f.defvjp(lambda x, y: pytest.fail("not called"), lambda r, ct: pytest.fail("not called"))
    words = ("The input arguments to the custom_vjp-decorated function <lambda> could not be resolved to "
             "positional-only arguments. Binding failed with the error:\n" if make is _ours else "")  # (JAX's from
    with pytest.raises(TypeError, match=re.escape(words + "missing a required argument: 'y'")):  # 0.5 on)
        f(0.5)


# ---------------------------------------------------------------- the deliberate differences


def test_forward_mode_works_on_ours_where_custom_vjp_raises():  # test_jvp_error
    theirs, ours = (_sin_with_twice_its_derivative(make) for make in BOTH.values())
    for jvp in (lambda f: jax.jvp(f, (3.0,), (1.0,))[1], lambda f: jax.jvp(jax.jit(f), (3.0,), (1.0,))[1],
                lambda f: jax.jvp(jax.vmap(f), (jnp.arange(3.0),), (jnp.ones(3),))[1]):
        with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
            jvp(theirs)
    close(jax.jvp(ours, (3.0,), (1.0,))[1], 2 * np.cos(3.0))
    close(jax.jvp(jax.jit(ours), (3.0,), (1.0,))[1], 2 * np.cos(3.0))
    close(jax.jvp(jax.vmap(ours), (jnp.arange(3.0),), (jnp.ones(3),))[1], 2 * np.cos(jnp.arange(3.0)))


def test_a_tracer_closed_over_or_passed_undifferentiated_works_on_ours():  # test_closed_over_tracer_error_message,
    def closing_over(make, x):                                               # test_nondiff_arg_tracer_error
        f = make()(lambda y: x * y)
        f.defvjp(lambda y: (x * y, None), lambda _, ct: (x * ct,))
        return f(3.0)

    with pytest.raises(Exception, match=r"closed-over value|unexpected tracer|UnexpectedTracer"):
        jax.grad(lambda x: closing_over(_theirs, x))(2.0)
    close(jax.grad(lambda x: closing_over(_ours, x))(2.0), 3.0)  # autodiff of y through the closure
    close(jax.jit(jax.grad(lambda x: closing_over(_ours, x)))(2.0), 3.0)

    def passed(make):
        f = make(nondiff_argnums=(0,))(lambda x, y: x * y)
        f.defvjp(lambda x, y: (x * y, jnp.cos(y)), lambda x, cos_y, ct: (cos_y * ct,))
        return jax.jit(lambda x, y: f(x, y))

    with pytest.raises(Exception, match="custom_vjp"):
        passed(_theirs)(2.0, 3.0)
    close(passed(_ours)(2.0, 3.0), 6.0)
    close(jax.grad(passed(_ours), 1)(2.0, 3.0), np.cos(3.0))


@both
def test_a_keyword_only_argument_cannot_be_placed(make):  # test_resolve_kwargs
    f = make()(lambda x, y, *, z=None: x + y)
    f.defvjp(lambda x, y, z=None: (x + y, None), lambda _, ct: (ct, ct))
    with pytest.raises(TypeError, match=r"could not be resolved to positions"):
        f(0.5, 0.1, z=1.0)
    if make is _ours:  # (JAX's words from 0.5 on)
        with pytest.raises(TypeError, match=r"function <lambda> could not be resolved to positional-only arguments"
                                            r".*\nThe following keyword arguments could not be resolved to "
                                            r"positions: z"):
            f(0.5, 0.1, z=1.0)


# ---------------------------------------------------------------- the fall-back: jax.custom_vjp itself


def _clipped_between(make, x):
    f = make()(lambda lo, hi, x: x)
    f.defvjp(lambda lo, hi, x: (x, (lo, hi)), lambda r, ct: (None, None, jnp.clip(ct, r[0], r[1])))
    return f(-0.1, x + 0.1, x)


def test_a_bwd_not_linear_in_its_cotangent_is_custom_vjps_in_reverse_mode_and_forward_mode_names_it():
    """test_clip_gradient (#2784): the bwd clips its cotangent, so ours hands the call to jax.custom_vjp: the
    same gradient, eagerly, under jit and vmap; forward mode raises custom_vjp's TypeError, naming the bwd and
    the op; route says so without running the call; and the plain decorator still refuses it, naming the op."""
    for transform in (lambda g: g, jax.jit):
        assert float(transform(jax.grad(lambda x: _clipped_between(_ours, x)))(0.1)) == \
            float(transform(jax.grad(lambda x: _clipped_between(_theirs, x)))(0.1)) == np.float32(0.2)
    xs = jnp.array([0.1, 0.5, 2.0])
    assert np.array_equal(jax.vmap(jax.grad(lambda x: 5.0 * _clipped_between(_ours, x)))(xs),
                          jax.vmap(jax.grad(lambda x: 5.0 * _clipped_between(_theirs, x)))(xs))
    with pytest.raises(TypeError, match=r"forward-mode autodiff.*the bwd of <lambda> could not be embedded.*clip"):
        jax.jvp(lambda x: _clipped_between(_ours, x), (0.1,), (1.0,))
    clip = _ours()(lambda lo, hi, x: x)
    clip.defvjp(lambda lo, hi, x: (x, (lo, hi)), lambda r, ct: (None, None, jnp.clip(ct, r[0], r[1])))
    route = clip.route(-0.1, 0.2, 0.1)
    assert not route.embedded and "clip" in route.reason
    assert _sin_with_twice_its_derivative(_ours).route(1.0).embedded
    with pytest.raises(ValueError, match=r"not linear in its cotangent.*clip"):
        jax.grad(sgm.custom_gradient(lambda x: (x, lambda ct: (jnp.clip(ct, -0.1, 0.2),))))(0.1)


@pytest.mark.parametrize("bwd", [lambda r, ct: (2.0,), lambda r, ct: (17.0 * r,)], ids=["constant", "of x"])
def test_a_bwd_that_ignores_its_cotangent_falls_back_and_the_decorator_refuses_it_as_affine(bwd):
    """test_float0, test_closure_convert: an affine bwd is jax.custom_vjp's on ours (the same gradient); the
    decorator refuses it, naming an affine map."""
    theirs, ours = (make()(lambda x: x) for make in BOTH.values())
    for f in (theirs, ours):
        f.defvjp(lambda x: (x, x), bwd)
    assert float(jax.grad(ours)(1.0)) == float(jax.grad(theirs)(1.0))
    assert "does not depend on the cotangent of y and is not provably zero" in ours.route(1.0).reason
    with pytest.raises(ValueError, match="an affine map"):  # test_custom_gradient_2: the vjp (y, x), not (y·ct, x·ct)
        jax.grad(sgm.custom_gradient(lambda x, y: (x * y, lambda ct: (y, x))), argnums=(0, 1))(3.0, 4.0)


def test_a_second_derivative_raises_at_order_1_and_is_exact_at_order_2():  # test_initial_style,
    with pytest.raises(LookupError, match=SECOND_DERIVATIVE_AT_ORDER_1):     # test_custom_gradient
        jax.grad(jax.grad(_in_a_scan(_sin_with_twice_its_derivative(_ours))))(3.0)
    for make in (_theirs, _ours):  # d/dx of the vjp 2·cos x: −2 sin 3
        exact = _sin_with_twice_its_derivative(lambda make=make: make(order=2))
        close(jax.grad(jax.grad(_in_a_scan(exact)))(3.0), -2 * np.sin(3.0))
    half_square = sgm.custom_gradient(lambda x: (x**2, lambda ct: (ct * x,)), order=2)  # the vjp x·ct: 1
    assert float(jax.grad(jax.grad(half_square))(3.0)) == 1.0
    assert float(jax.grad(jax.grad(jax.custom_gradient(lambda x: (x**2, lambda ct: (ct * x,)))))(3.0)) == 1.0


def _twice(f):
    return lambda x: f(f(x))


def test_where_fwds_output_is_read_again_a_second_derivative_keeps_the_declared_derivative_on_ours():
    """test_remat_higher_order, test_invariance. custom_vjp differentiates fwd by autodiff at the outer level, so
    where the second derivative reads fwd's output (sin's, in the residual cos(sin x) of f∘f; a value taken
    through value_and_grad) it sees sin′ = cos where the declared derivative is 2·cos. Ours at order=2 keeps it:
    (f∘f)″ = f″(f(x))·f′(x)² + f′(f(x))·f″(x) with f′ = 2 cos, f″ = −2 sin. remat changes neither; a third
    derivative raises at order=2."""
    x, sin_x = 2.0, np.sin(2.0)
    declared = -8 * np.sin(sin_x) * np.cos(x) ** 2 - 4 * np.cos(sin_x) * np.sin(x)
    autodiff_of_fwd = -4 * np.sin(sin_x) * np.cos(x) ** 2 - 4 * np.cos(sin_x) * np.sin(x)
    theirs, ours = (_sin_with_twice_its_derivative(lambda make=make: make(order=2)) for make in (_theirs, _ours))
    for g in (_twice, lambda f: jax.remat(_twice(f))):
        close(jax.grad(jax.grad(g(theirs)))(x), autodiff_of_fwd)
        close(jax.grad(jax.grad(g(ours)))(x), declared)
    close(jax.grad(jax.remat(jax.grad(_twice(ours))))(x), declared)
    with pytest.raises(LookupError, match=r"A third derivative .*order=2"):
        jax.grad(jax.grad(jax.grad(jax.remat(_twice(ours)))))(x)

    def value_through_value_and_grad(make):
        f = make(order=2)(lambda x: jnp.cos(2 * x) / 2.0)
        f.defvjp(lambda x: (jnp.cos(2 * x) / 2.0, None), lambda _, ct: (3 * ct,))
        return jax.grad(lambda x: jax.value_and_grad(f)(x)[0])(1.0)

    close(value_through_value_and_grad(_theirs), -np.sin(2.0))  # autodiff of cos(2x)/2
    close(value_through_value_and_grad(_ours), 3.0)  # the declared derivative


def test_a_derivative_of_a_function_that_takes_a_grad_raises_at_order_1():  # test_bwd_closes_over_tracer,
    def outer_variable_in_bwd(order):                                         # test_invariance
        def inner_grad(y):
            f = _ours(order=order)(lambda x: 2.0 * jnp.sin(x))
            f.defvjp(lambda x: (2.0 * jnp.sin(x), ()), lambda _, ct: (2.0 * jnp.cos(y) * ct,))
            return jax.grad(f)(1.0)

        return jax.grad(inner_grad)(4.0)

    with pytest.raises(LookupError, match=SECOND_DERIVATIVE_AT_ORDER_1):
        outer_variable_in_bwd(order=1)
    close(outer_variable_in_bwd(order=2), -2 * np.sin(4.0))
    f = _ours()(lambda x: jnp.cos(2 * x) / 2.0)
    f.defvjp(lambda x: (jnp.cos(2 * x) / 2.0, None), lambda _, ct: (3 * ct,))
    with pytest.raises(LookupError, match=SECOND_DERIVATIVE_AT_ORDER_1):  # the gradient taken inside is used
        jax.grad(lambda x: jax.value_and_grad(f)(x)[1])(1.0)
    with pytest.raises(LookupError, match=SECOND_DERIVATIVE_AT_ORDER_1):  # the limit: forward mode evaluates all
        jax.jvp(lambda x: jax.value_and_grad(f)(x)[0], (1.0,), (1.0,))


def test_a_gradient_taken_inside_and_dropped_is_not_a_second_derivative():  # test_invariance
    """The gradient computed and dropped inside (a value_and_grad whose value alone is used) is not differentiated,
    and a first derivative through it is the bwd's, at order=1 and, three levels deep, at order=2: ours raised,
    as its guard raised where the tangent was formed; it now raises where the tangent is used (reverse mode
    transposes it, and nothing reaches it). Side by side with jax.custom_vjp, whose fwd calls f, as in JAX's case
    (where fwd computes the value itself, custom_vjp differentiates fwd at the outer level, and ours keeps the
    declared derivative: test_where_fwds_output_is_read_again_...)."""
    for make, order in ((_theirs, 2), (_ours, 1), (_ours, 2)):
        f = make(order=order)(lambda x: jnp.cos(2 * x) / 2.0)
        f.defvjp(lambda x, f=f: (f(x), None), lambda _, ct: (3 * ct,))
        value = lambda g: lambda x: jax.value_and_grad(g)(x)[0]  # noqa: E731
        levels = [value(f)] if order == 1 else [value(f), value(value(f))]
        for g in levels:
            assert float(jax.grad(g)(1.0)) == 3.0 and float(jax.jit(jax.grad(g))(1.0)) == 3.0
            assert float(jax.grad(_in_a_scan(g))(1.0)) == 3.0
