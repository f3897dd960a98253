"""stopgrad_math.torch.custom_gradient(fx, gx, x) in every PyTorch mode, against independent truths: autodiff of a
stable formula (softplus), closed forms and float64 finite differences."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from torch_modes import COMPILED_MODES, DTYPES, MODES, bits, elementwise_cases  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

X = torch.tensor([-1.0, 0.0, 2.0, 100.0])


def log1pexp(x):
    return sgm.custom_gradient(torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), torch.sigmoid(x), x)


def softplus(x):  # the stable formula, differentiated by PyTorch itself
    return torch.nn.functional.softplus(x)


@pytest.mark.parametrize("mode", [*MODES, *COMPILED_MODES])
def test_log1pexp_has_the_exact_derivative_in_every_mode(mode):
    run = {**MODES, **COMPILED_MODES}[mode]
    got = run(log1pexp, X)
    torch.testing.assert_close(got, torch.sigmoid(X), rtol=1e-6, atol=0)
    torch.testing.assert_close(got, run(softplus, X), rtol=1e-6, atol=0)
    assert float(got[-1].detach()) == 1.0


def test_the_naive_formulas_nan_at_100_is_what_the_library_fixes():
    x = torch.tensor(100.0, requires_grad=True)
    (naive,) = torch.autograd.grad(torch.log(1 + torch.exp(x)), x)
    assert math.isnan(float(naive))
    assert float(torch.autograd.grad(log1pexp(x), x)[0]) == 1.0


def test_compiled_with_fullgraph_has_no_graph_break_and_the_eager_value():
    """fullgraph=True raises at a graph break; the compiled value is the eager one bit for bit."""
    torch._dynamo.reset()
    compiled = torch.compile(log1pexp, fullgraph=True)
    x = torch.linspace(-5.0, 100.0, 9)
    assert np.array_equal(bits(compiled(x)), bits(log1pexp(x)))
    explanation = torch._dynamo.explain(log1pexp)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("mode", ["eager", "compiled", "func.jvp", "func.jvp of func.jvp"])
def test_the_value_is_fx_bit_for_bit(mode):
    """Through each fast path (eager, compiled, under one torch.func derivative) and the ordinary ops (under nested
    torch.func derivatives, where no fast path stands in)."""
    fx = torch.tensor([-0.0, math.inf, -math.inf, math.nan, 1e-40, 3.0])  # 1e-40: a float32 subnormal
    x = torch.arange(1.0, 7.0)
    fn = lambda x: sgm.custom_gradient(fx, 2.0 * x, x)  # noqa: E731
    ones = torch.ones_like(x)
    if mode == "func.jvp":
        value = torch.func.jvp(fn, (x,), (ones,))[0]
    elif mode == "func.jvp of func.jvp":
        value = torch.func.jvp(lambda x: torch.func.jvp(fn, (x,), (ones,))[0], (x,), (ones,))[0]
    else:
        value = (torch.compile(fn, fullgraph=True) if mode == "compiled" else fn)(x.requires_grad_(True))
    assert np.array_equal(bits(value), bits(fx))


def test_where_nothing_differentiates_the_value_is_fx_bit_for_bit_in_a_tensor_of_its_own():
    """No argument requires grad, no forward-mode level, transform or compilation: the identity's terms are skipped
    and fx is returned; the value is fx's bits (−0.0, inf, NaN, subnormal) and writing into it leaves fx alone, as
    the identity's own result would. With x requiring grad (the identity computed), the same bits."""
    fx = torch.tensor([-0.0, math.inf, -math.inf, math.nan, 1e-40, 3.0])
    x = torch.arange(1.0, 7.0)
    value = sgm.custom_gradient(fx, 2.0 * x, x)
    assert np.array_equal(bits(value), bits(fx)) and not value.requires_grad
    value.add_(1.0)
    assert np.array_equal(bits(fx), bits(torch.tensor([-0.0, math.inf, -math.inf, math.nan, 1e-40, 3.0])))
    with torch.no_grad():
        assert np.array_equal(bits(sgm.custom_gradient(fx, 2.0 * x, x.clone().requires_grad_(True))), bits(fx))
    assert np.array_equal(bits(sgm.custom_gradient(fx, 2.0 * x, x.clone().requires_grad_(True))), bits(fx))


@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.jvp", "func.vjp"])
def test_an_infinite_gx_gives_an_infinite_derivative_of_its_sign(mode):
    """sqrt at 0 has derivative inf; the value 0 is kept. −inf gives −inf, a NaN gx NaN: never a finite number."""
    gx = torch.tensor([math.inf, -math.inf, math.nan, 2.0])
    fn = lambda x: sgm.custom_gradient(torch.zeros(4), gx, x)  # noqa: E731
    got = MODES[mode](fn, torch.ones(4))
    assert got[0] == math.inf and got[1] == -math.inf and math.isnan(got[2]) and got[3] == 2.0
    assert np.array_equal(bits(fn(torch.ones(4))), bits(torch.zeros(4)))
    sqrt = lambda x: sgm.custom_gradient(torch.sqrt(x), 0.5 / torch.sqrt(x), x)  # noqa: E731
    assert float(MODES[mode](sqrt, torch.zeros(1))) == math.inf


@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.vjp", "func.jvp", "compile"])
def test_an_inf_or_nan_x_gets_gx_times_the_cotangent_or_tangent_as_any_element_does(mode):
    """At an inf or NaN element of x the identity passes gx times the cotangent or tangent, an inf or NaN one
    included, as autodiff of stop(gx)·x does and as on JAX and TensorFlow (it passed nothing there: a select;
    before that, nan_to_num's derivative, which multiplies by the mask, gave NaN)."""
    x = torch.tensor([math.inf, -math.inf, math.nan, math.inf, 1.0])
    direction = torch.tensor([math.inf, math.nan, -math.inf, 1.0, math.inf])
    fn = lambda x: sgm.custom_gradient(torch.zeros(5), torch.full((5,), 3.0), x)  # noqa: E731
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True)
        mode = "backward"
    if mode == "backward":
        leaf = x.clone().requires_grad_(True)
        fn(leaf).backward(direction)
        got = leaf.grad
    elif mode == "forward_ad":
        with forward_ad.dual_level():
            got = forward_ad.unpack_dual(fn(forward_ad.make_dual(x, direction))).tangent
    elif mode == "func.vjp":
        got = torch.func.vjp(fn, x)[1](direction)[0]
    else:
        got = torch.func.jvp(fn, (x,), (direction,))[1]
    want = 3.0 * direction  # autodiff of stop(gx)·x, in each mode
    assert np.array_equal(got.numpy(), want.numpy(), equal_nan=True)
    assert got.tolist()[3:] == [3.0, math.inf] and math.isnan(got[1])


@pytest.mark.parametrize("mode", ["func.jvp", "func.vjp"])
def test_a_non_finite_complex_gx_gives_a_nan_derivative_never_a_finite_one(mode):
    gx = torch.tensor([complex(math.inf, 0.0), 2.0 + 1.0j], dtype=torch.complex64)
    fn = lambda z: sgm.custom_gradient(torch.zeros(2, dtype=torch.complex64), gx, z)  # noqa: E731
    z = torch.ones(2, dtype=torch.complex64)
    got = MODES[mode](fn, z)
    assert torch.isnan(got[0]).any() and complex(got[1]) == (2.0 + 1.0j if mode == "func.jvp" else 2.0 - 1.0j)
    assert np.array_equal(bits(torch.view_as_real(fn(z))), bits(torch.zeros(2, 2)))


def test_an_infinite_gx_along_a_negative_tangent_is_minus_inf():
    fn = lambda x: sgm.custom_gradient(torch.zeros(2), torch.tensor([math.inf, -math.inf]), x)  # noqa: E731
    tangent = torch.func.jvp(fn, (torch.ones(2),), (-torch.ones(2),))[1]
    assert tangent.tolist() == [-math.inf, math.inf]


@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.jacrev", "func.vmap(func.grad)"])
def test_an_infinite_or_nan_element_of_x_keeps_the_value_and_gets_gx(mode):
    x = torch.tensor([math.inf, 1.0, math.nan])
    fn = lambda x: sgm.custom_gradient(torch.ones_like(x), 3.0 * torch.ones_like(x), x)  # noqa: E731
    assert fn(x).tolist() == [1.0, 1.0, 1.0]
    assert fn(x.clone().requires_grad_(True)).tolist() == [1.0, 1.0, 1.0]  # the value, where the identity runs
    assert MODES[mode](fn, x).tolist() == [3.0, 3.0, 3.0] == MODES[mode](lambda x: 3.0 * x, x).tolist()


A = torch.tensor([[1.0, 2.0, 0.5], [-3.0, 0.25, 4.0]])


@pytest.mark.parametrize("jacobian", [torch.func.jacfwd, torch.func.jacrev])
def test_a_full_jacobian_gx(jacobian):
    fn = lambda x: sgm.custom_gradient(A @ x, A, x)  # noqa: E731
    assert torch.equal(jacobian(fn)(torch.tensor([1.0, -1.0, 2.0])), A)


def test_a_jacobian_gx_of_a_zero_dimensional_x_sums_no_axis():
    g = torch.tensor([1.0, -2.0, 3.0])
    fn = lambda x: sgm.custom_gradient(g * x, g, x)  # noqa: E731
    assert torch.equal(torch.func.jacrev(fn)(torch.tensor(2.0)), g)
    assert torch.equal(torch.func.jacfwd(fn)(torch.tensor(2.0)), g)


def test_a_scalar_fx_with_its_gradient():
    fn = lambda x: sgm.custom_gradient((x**2).sum(), 2.0 * x, x)  # noqa: E731
    x = torch.tensor([1.0, -2.0, 3.0])
    assert torch.equal(torch.func.grad(fn)(x), 2.0 * x)
    assert float(torch.func.jvp(fn, (x,), (torch.ones(3),))[1]) == float(2.0 * x.sum())


def test_tfps_rule_for_a_gx_of_xs_shape_and_a_vector_fx():
    """fx of 3 elements, x of 2, gx of x's shape: the gradient of sum(h) is gx (tfp's rule)."""
    gx = torch.tensor([5.0, -7.0])
    fn = lambda x: sgm.custom_gradient(torch.ones(3) * x.sum(), gx, x)  # noqa: E731
    torch.testing.assert_close(torch.func.grad(lambda x: fn(x).sum())(torch.tensor([1.0, 2.0])), gx)


def test_nests_of_x_with_a_none_leaf():
    def fn(params):
        fx = params["a"] * params["b"][0]
        return sgm.custom_gradient(fx, {"a": 3.0 * torch.ones(2), "b": (None,)}, params)

    params = {"a": torch.tensor([1.0, 2.0]), "b": (torch.tensor(4.0),)}
    got = torch.func.grad(lambda p: fn(p).sum())(params)
    assert got["a"].tolist() == [3.0, 3.0] and float(got["b"][0]) == 0.0  # None: no gradient


def test_float64_against_finite_differences():
    x = torch.linspace(-2.0, 2.0, 7, dtype=torch.float64)
    fn = lambda x: sgm.custom_gradient(torch.sin(x) * torch.exp(x), (torch.cos(x) + torch.sin(x)) * torch.exp(x), x)  # noqa: E731
    f, xs, h = lambda v: np.sin(v) * np.exp(v), x.numpy(), 1e-6
    exact = (f(xs + h) - f(xs - h)) / (2 * h)  # central differences in NumPy
    for mode in ("backward", "forward_ad", "func.jacrev"):
        got = MODES[mode](fn, x)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), exact, rtol=1e-8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.jvp", "func.jacrev"])
def test_every_floating_dtype_against_the_stable_formula(dtype, mode):
    x = torch.tensor([-4.0, 0.0, 3.0, 60.0], dtype=DTYPES[dtype])
    got = MODES[mode](log1pexp, x)
    assert got.dtype == x.dtype
    assert torch.equal(got, torch.sigmoid(x))  # gx is the closed form, passed through exactly
    assert np.array_equal(bits(log1pexp(x)), bits(torch.logaddexp(x, torch.zeros((), dtype=x.dtype))))


@pytest.mark.parametrize("mode", ["func.jvp", "func.vjp", "forward_ad", "backward"])
def test_complex_values_follow_pytorchs_convention(mode):
    """exp with its own derivative, complex tangents and cotangents: as PyTorch's autodiff of exp (JVP g·t, VJP
    conj(g)·ct)."""
    z = torch.tensor([0.3 + 1.0j, -1.0 + 0.5j], dtype=torch.complex128)
    t = torch.tensor([1.0 - 2.0j, 0.5 + 0.25j], dtype=torch.complex128)
    fn = lambda z: sgm.custom_gradient(torch.exp(z), torch.exp(z), z)  # noqa: E731
    if mode == "func.jvp":
        got, want = (torch.func.jvp(f, (z,), (t,))[1] for f in (fn, torch.exp))
    elif mode == "func.vjp":
        got, want = (torch.func.vjp(f, z)[1](t)[0] for f in (fn, torch.exp))
    elif mode == "forward_ad":
        got, want = (MODES["forward_ad"](f, z) for f in (fn, torch.exp))
    else:
        got, want = ((lambda z: torch.autograd.grad(f(z), z, t)[0])(z.clone().requires_grad_(True))
                     for f in (fn, torch.exp))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_the_second_derivative_through_a_stopped_gx_is_zero():
    """The documented limit, as on TensorFlow and JAX: gx is held constant."""
    assert torch.equal(torch.func.hessian(lambda x: log1pexp(x).sum())(X[:3]), torch.zeros(3, 3))
    x = torch.tensor(0.5, requires_grad=True)
    (first,) = torch.autograd.grad(log1pexp(x), x, create_graph=True)
    (second,) = torch.autograd.grad(first, x, allow_unused=True)  # the derivative's graph: the carrier's zeros
    assert second is None or float(second) == 0.0


def _x_stopped_by_hand(x, y):  # h = x·y, dh/dx = 2y by hand, dh/dy = x by autodiff through fx
    still = x.detach()
    return sgm.custom_gradient(still * y, 2 * y, x, fx_gx_manually_stopped=True)


def test_a_manual_stop_kept_is_embedded_with_its_mixed_second_derivative():
    """fx and gx stopped w.r.t. x and live in y: dh/dx = 2y = 10, dh/dy = x = 3, Hessian [[0, 2], [2, 0]]."""
    x, y = torch.tensor(3.0, requires_grad=True), torch.tensor(5.0, requires_grad=True)
    assert [float(d) for d in torch.autograd.grad(_x_stopped_by_hand(x, y), (x, y))] == [10.0, 3.0]
    hessian = torch.func.hessian(_x_stopped_by_hand, argnums=(0, 1))(torch.tensor(3.0), torch.tensor(5.0))
    assert [[float(d) for d in row] for row in hessian] == [[0.0, 2.0], [2.0, 0.0]]


def test_a_manually_stopped_fx_or_gx_that_backward_reaches_x_through_is_a_value_error_naming_it():
    """Unrefused, a live fx would double the first derivative; the autograd graph is walked in reverse mode."""
    x = torch.tensor(0.7, requires_grad=True)
    with pytest.raises(ValueError, match="fx moves with x"):
        sgm.custom_gradient(torch.sin(x), torch.cos(x).detach(), x, fx_gx_manually_stopped=True)
    with pytest.raises(ValueError, match="the gradient for x moves with x"):
        sgm.custom_gradient(torch.sin(x).detach(), torch.cos(x), x, fx_gx_manually_stopped=True)
    through_a_view = x.view(1) * 1.0  # x's AccumulateGrad node several steps down
    with pytest.raises(ValueError, match="fx moves with x"):
        sgm.custom_gradient(torch.sin(through_a_view)[0], torch.tensor(1.0), x, fx_gx_manually_stopped=True)


def test_the_manual_stop_is_not_checked_in_forward_mode_a_documented_limit():
    """forward_ad and torch.func record no graph to walk: the live fx's own derivative adds to the embedded one
    (cos + cos at 0.7), which is why the check exists where it can."""
    fn = lambda x: sgm.custom_gradient(torch.sin(x), torch.cos(x).detach(), x, fx_gx_manually_stopped=True)  # noqa: E731
    x = torch.tensor(0.7, dtype=torch.float64)
    assert float(torch.func.jvp(fn, (x,), (torch.ones(()),))[1]) == pytest.approx(2 * math.cos(0.7), rel=1e-12)


def test_partial_custom_gradient_differentiates_both_in_every_mode():
    def h(x, y):
        return sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)

    x, y = torch.tensor(3.0), torch.tensor(5.0)
    assert [float(d) for d in torch.func.grad(h, argnums=(0, 1))(x, y)] == [10.0, 3.0]
    assert [float(d) for d in torch.func.jacfwd(h, argnums=(0, 1))(x, y)] == [10.0, 3.0]
    assert [[float(d) for d in row] for row in torch.func.hessian(h, argnums=(0, 1))(x, y)] == [[0.0, 2.0],
                                                                                               [2.0, 0.0]]


def test_an_integer_x_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"x must be floating or complex.*int32"):
        sgm.custom_gradient(torch.ones(2), torch.ones(2), torch.tensor([1, 2], dtype=torch.int32))


def test_a_complex_gx_for_a_real_fx_is_a_type_error():
    with pytest.raises(TypeError, match="real function has no complex derivative"):
        sgm.custom_gradient(torch.ones(2), torch.ones(2, dtype=torch.complex64), torch.ones(2))


def test_a_gx_of_no_layout_is_a_value_error_naming_the_shapes():
    with pytest.raises(ValueError, match=r"gradient for x fits no layout: fx has shape \(2,\), x has shape \(3,\) "
                                         r"and its gradient has shape \(4,\)"):
        sgm.custom_gradient(torch.ones(2), torch.ones(4), torch.ones(3))


@pytest.mark.parametrize("shape", [(3,), (1,), (0,), (2, 3), (1, 1), (4, 1, 2), ()], ids=str)
def test_one_shape_for_fx_x_and_gx_takes_the_layout_the_table_gives(shape):
    """The shortcut past the layout table (one known shape of rank 1 or more: elementwise) against the table, and
    not taken for a 0-d shape, where the table gives the Jacobian."""
    from stopgrad_math.shared import layouts
    from stopgrad_math.torch import identity_form

    x = torch.ones(shape, requires_grad=True)
    layout, _, _ = identity_form._checked(torch.zeros(shape), "x", torch.ones(shape), x)
    assert layout is layouts.candidates("x", shape, shape, shape).layouts[0]
    assert identity_form._one_static_shape(torch.zeros(shape), x, torch.ones(shape)) == (shape != ())


def test_gx_of_another_structure_is_a_value_error():
    with pytest.raises(ValueError, match="gx must have the structure of x"):
        sgm.custom_gradient(torch.ones(2), {"a": torch.ones(2)}, {"b": torch.ones(2)})


def test_fx_without_gx_and_x_is_a_type_error_naming_both_forms():
    with pytest.raises(TypeError, match=r"without gx and x.*stop_gradient"):
        sgm.custom_gradient(torch.ones(2))


@settings(max_examples=60, deadline=None)
@given(elementwise_cases())
def test_the_value_is_fx_and_the_derivative_gx_for_any_shape_dtype_and_value(case):
    fx64, gx64, x64, dtype = case
    fx, gx, x = (torch.tensor(a, dtype=dtype) for a in (fx64, gx64, x64))
    fn = lambda x: sgm.custom_gradient(fx, gx, x)  # noqa: E731
    value = fn(x)
    # NaN stays NaN; its payload may not in bfloat16, where PyTorch's own fx − 0.0 makes every NaN the canonical one
    both_nan = torch.isnan(value) & torch.isnan(fx)
    assert np.array_equal(bits(value)[~both_nan.numpy()], bits(fx)[~both_nan.numpy()])
    assert torch.equal(torch.isnan(value), torch.isnan(fx))
    tangent = torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1].double().numpy()
    cotangent = torch.func.vjp(fn, x)[1](torch.ones_like(fx))[0].double().numpy()
    g = gx.double().numpy()
    np.testing.assert_array_equal(tangent, g)  # an inf element of x too: value kept, derivative gx
    np.testing.assert_array_equal(cotangent, g)
