"""The helpers of stopgrad_math.torch in every PyTorch mode, against analytic derivatives."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_modes import COMPILED_MODES, MODES, bits  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

X = torch.tensor([0.4, -1.6, 2.5])


def test_stop_gradient_over_a_nest():
    p = {"a": torch.tensor(3.0, requires_grad=True), "b": torch.tensor(5.0, requires_grad=True)}
    y = p["a"] * sgm.stop_gradient(p)["b"] + sgm.stop_gradient(p)["a"] ** 2
    assert [float(d) for d in torch.autograd.grad(y, (p["a"], p["b"]), allow_unused=True)[:1]] == [5.0]
    assert torch.autograd.grad(y, p["b"], allow_unused=True)[0] is None
    out = sgm.stop_gradient({"k": None, "n": 2.0, "t": (p["a"],)})
    assert out["k"] is None and float(out["n"]) == 2.0 and not out["t"][0].requires_grad


def test_stop_gradient_where_refuses_a_float_mask_and_a_mask_that_does_not_broadcast():
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        sgm.stop_gradient_where(X, torch.ones(3))
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not broadcast to x's \(3,\)"):
        sgm.stop_gradient_where(X, torch.tensor([True, False]))


def test_straight_through_keeps_the_value_and_negative_zero_and_refuses_other_structures():
    assert torch.equal(sgm.straight_through(torch.round(X), X), torch.round(X))
    assert bits(sgm.straight_through(torch.tensor(-0.0), torch.tensor(3.0))) == bits(torch.tensor(-0.0))
    with pytest.raises(ValueError, match="same structure"):
        sgm.straight_through({"a": X}, {"b": X})
    out = sgm.straight_through({"a": torch.round(X)}, {"a": X})
    assert torch.equal(out["a"], torch.round(X))


def test_straight_through_with_a_non_finite_backward_keeps_the_value_and_passes_slope_one_there():
    fn = lambda x: sgm.straight_through(torch.zeros(2), x)  # noqa: E731
    x = torch.tensor([math.inf, 1.0])
    for mode in ("backward", "forward_ad", "func.jvp", "func.vjp"):  # slope one at inf too, as autodiff of x has it
        assert MODES[mode](fn, x).tolist() == [1.0, 1.0] == MODES[mode](lambda x: x * 1.0, x).tolist()
    assert fn(x).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("scale", [0.1, 3.0, -2.5])
def test_scale_and_reverse_gradient(scale):
    for mode in ("backward", "forward_ad", "func.jacrev"):
        torch.testing.assert_close(MODES[mode](lambda x: sgm.scale_gradient(x, scale), X),
                                   torch.full((3,), scale), rtol=0, atol=0)
        torch.testing.assert_close(MODES[mode](lambda x: sgm.reverse_gradient(x, scale), X),
                                   torch.full((3,), -scale), rtol=0, atol=0)
    assert torch.equal(sgm.scale_gradient(X, scale), X)


def test_scale_gradient_per_element_and_over_a_nest():
    scale = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(MODES["func.jvp"](lambda x: sgm.scale_gradient(x, scale), X), scale)
    got = torch.func.grad(lambda p: sum(v.sum() for v in sgm.scale_gradient(p, 0.5).values()))({"a": X, "b": X})
    assert got["a"].tolist() == [0.5] * 3 and got["b"].tolist() == [0.5] * 3
    with pytest.raises(ValueError, match=r"scale of shape \(2,\) does not broadcast to x's \(3,\)"):
        sgm.scale_gradient(X, torch.ones(2))


def test_magic_box_derivatives_at_every_order():
    """τ = θ²: d box = 2θ, d² box = (2θ)² + 2, d³ box = (2θ)³ + 12θ, at θ = 0.3; value exactly 1."""
    theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    box = sgm.magic_box(theta**2)
    assert float(box.detach()) == 1.0
    (first,) = torch.autograd.grad(box, theta, create_graph=True)
    (second,) = torch.autograd.grad(first, theta, create_graph=True)
    (third,) = torch.autograd.grad(second, theta)
    t = 0.3
    assert (float(first), float(second), float(third)) == pytest.approx((2 * t, (2 * t) ** 2 + 2,
                                                                         (2 * t) ** 3 + 12 * t), rel=1e-12)
    fn = lambda x: sgm.magic_box(x**2).sum()  # noqa: E731
    want = torch.diag((2 * X) ** 2 + 2)
    torch.testing.assert_close(torch.func.hessian(fn)(X), want)
    torch.testing.assert_close(torch.func.jacrev(torch.func.jacfwd(fn))(X), want)
    assert float(sgm.magic_box(torch.tensor(math.inf))) == 1.0


def test_partial_custom_gradient_mixed_second_derivatives():
    """f = x·y with dh/dx = 2y (custom), dh/dy = x (autodiff); ∂²h/∂x∂y = ∂²h/∂y∂x = 2 (∂g/∂y)."""
    h = lambda x, y: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)  # noqa: E731
    x, y = torch.tensor(3.0), torch.tensor(5.0)
    assert float(torch.func.grad(torch.func.grad(h, argnums=0), argnums=1)(x, y)) == 2.0
    assert float(torch.func.grad(torch.func.grad(h, argnums=1), argnums=0)(x, y)) == 2.0
    assert float(torch.func.jvp(lambda y: torch.func.grad(h)(x, y), (y,), (torch.ones(()),))[1]) == 2.0


def test_zero_with_gradient_is_plus_zero_with_slope_one():
    x = torch.tensor([-0.0, 2.0, math.inf])
    assert np.array_equal(bits(sgm.zero_with_gradient(x)), bits(torch.zeros(3)))  # +0.0 at −0.0 and inf too
    for mode in ("backward", "forward_ad", "func.jvp", "compile(fullgraph) backward"):
        got = {**MODES, **COMPILED_MODES}[mode](sgm.zero_with_gradient, x)
        assert got.tolist() == [1.0, 1.0, 1.0]  # slope one at inf too, as autodiff of x has it


# Elementwise uses of every helper, with the derivative (the Jacobian's diagonal) each must have at X.
ELEMENTWISE = {
    "stop_gradient": (sgm.stop_gradient, torch.zeros(3)),
    "stop_gradient_where": (lambda x: sgm.stop_gradient_where(x, x > 0), torch.tensor([0.0, 1.0, 0.0])),
    "straight_through": (lambda x: sgm.straight_through(torch.round(x), x), torch.ones(3)),
    "scale_gradient": (lambda x: sgm.scale_gradient(x, 0.1), torch.full((3,), 0.1)),
    "reverse_gradient": (lambda x: sgm.reverse_gradient(x, 2.0), torch.full((3,), -2.0)),
    "zero_with_gradient": (sgm.zero_with_gradient, torch.ones(3)),
    "magic_box": (lambda x: sgm.magic_box(x**2), 2 * X),
    "partial_custom_gradient": (lambda x: sgm.partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x,
                                                                      torch.ones_like(x) * 3.0), torch.full((3,), 6.0)),
}


def _zeros_where_unconnected(got, x):
    return torch.zeros_like(x) if got is None else got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("helper", ELEMENTWISE)
def test_every_helper_in_every_mode(helper, mode):
    fn, want = ELEMENTWISE[helper]
    if helper == "stop_gradient" and mode in ("backward", "autograd.grad", "autograd.grad(create_graph)"):
        fn = lambda x, fn=fn: fn(x) + 0 * x  # noqa: E731  # a graph for backward to start from
    if helper == "stop_gradient" and mode == "forward_ad":
        assert _zeros_where_unconnected(MODES[mode](fn, X), X).tolist() == [0.0] * 3
        return
    torch.testing.assert_close(MODES[mode](fn, X).detach(), want, rtol=1e-6, atol=0)


def test_every_helper_compiled_with_fullgraph_in_one_graph():
    """All the helpers in one function under torch.compile(fullgraph=True): no graph break, the eager derivatives."""
    def everything(x):
        return torch.stack([fn(x) for fn, _ in ELEMENTWISE.values()])

    torch._dynamo.reset()
    x = X.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(torch.compile(everything, fullgraph=True)(x).sum(), x)
    torch.testing.assert_close(got, sum(want for _, want in ELEMENTWISE.values()), rtol=1e-6, atol=0)


# The second derivative each elementwise use has at X: zero but for magic_box(x²), (2x)² + 2 (partial's custom
# gradient 2y is held constant in x, as documented).
SECOND = {name: torch.zeros(3) for name in ELEMENTWISE} | {"magic_box": (2 * X) ** 2 + 2}


@pytest.mark.parametrize("helper", [h for h in ELEMENTWISE if h != "stop_gradient"])
def test_every_helper_under_hessian(helper):
    fn, _ = ELEMENTWISE[helper]
    torch.testing.assert_close(torch.func.hessian(lambda x: fn(x).sum())(X).diagonal(), SECOND[helper],
                               rtol=1e-5, atol=0)


@pytest.mark.parametrize("call", [
    lambda: sgm.scale_gradient(torch.tensor([1, 2]), 0.5),
    lambda: sgm.magic_box(torch.tensor(1)),
    lambda: sgm.zero_with_gradient("x"),
    lambda: sgm.reverse_gradient(X, "big"),
])
def test_values_without_a_derivative_are_type_errors(call):
    with pytest.raises(TypeError):
        call()
