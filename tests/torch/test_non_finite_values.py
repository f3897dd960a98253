"""A NaN or inf never changes a finite derivative (stopgrad_math.torch): the declared derivative reaches every
element, and a non-finite value cuts only the paths that go through it. Truths: reverse-mode autodiff of the same
formula and an autograd.Function with the same backward; in forward mode the rule applied as written, in NumPy
(PyTorch's own forward rule for a matmul may multiply the NaN by the other factor's zero tangent)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from non_finite_cases import CASES, CT, TANGENT_W, TANGENT_X, assert_same, tangent_as_written  # noqa: E402
from torch_modes import COMPILED_MODES, MODES, bits, fresh_compilation  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.torch import identity  # noqa: E402


def plain(x, w):
    return x @ w.T


def _mixing(x, w):
    return x @ w.T, lambda ct: (ct @ w, ct.T @ x)


ORDERS = {1: sgm.custom_gradient(_mixing), 2: sgm.custom_gradient(_mixing, order=2)}


class Mixing(torch.autograd.Function):
    """The same rule as a Function, as its author would write it: the anchor in reverse mode."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    def backward(ctx, ct):
        x, w = ctx.saved_tensors
        return ct @ w, ct.T @ x


def _reverse(f, x, w, how):
    x, w = (t.detach().requires_grad_() for t in (x, w))
    ct = torch.tensor(CT)
    if how == "backward":
        f(x, w).backward(ct)
        return x.grad, w.grad
    return [g.detach() for g in torch.autograd.grad(f(x, w), (x, w), ct, create_graph=how == "create_graph")]


REVERSE = {
    "backward": lambda f, x, w: _reverse(f, x, w, "backward"),
    "autograd.grad": lambda f, x, w: _reverse(f, x, w, "grad"),
    "autograd.grad(create_graph)": lambda f, x, w: _reverse(f, x, w, "create_graph"),
    "func.vjp": lambda f, x, w: torch.func.vjp(f, x, w)[1](torch.tensor(CT)),
    "func.grad": lambda f, x, w: torch.func.grad(lambda x, w: (f(x, w) * torch.tensor(CT)).sum(),
                                                 argnums=(0, 1))(x, w),
    "func.jacrev": lambda f, x, w: [torch.einsum("ij...,ij->...", j, torch.tensor(CT))
                                    for j in torch.func.jacrev(f, argnums=(0, 1))(x, w)],
    "func.vmap(func.vjp) over rows": lambda f, x, w: [torch.func.vmap(
        lambda r, c: torch.func.vjp(lambda r: f(r[None], w), r)[1](c[None])[0])(x, torch.tensor(CT))],
    "compile(fullgraph) backward": lambda f, x, w: _reverse(torch.compile(f, fullgraph=True), x, w, "backward"),
    "compile(fullgraph) func.grad": lambda f, x, w: torch.compile(torch.func.grad(
        lambda x, w, ct: (f(x, w) * ct).sum(), argnums=(0, 1)), fullgraph=True)(x, w, torch.tensor(CT)),
}
"""Each maps (f, x, w) to the cotangents of x and w (a list of one: of x alone) for the cotangent CT."""


def _forward_ad(f, x, w, tangents):
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(a, torch.tensor(t)) if t is not None else a
                 for a, t in zip((x, w), tangents, strict=True)]
        return [forward_ad.unpack_dual(f(*duals)).tangent]


def _func_jvp(f, x, w, tangents):
    moving = [k for k, t in enumerate(tangents) if t is not None]

    def of_moving(*args):
        given = [x, w]
        for k, a in zip(moving, args, strict=True):
            given[k] = a
        return f(*given)

    primals = tuple((x, w)[k] for k in moving)
    return [torch.func.jvp(of_moving, primals, tuple(torch.tensor(tangents[k]) for k in moving))[1]]


FORWARD = {
    "forward_ad": _forward_ad,
    "func.jvp": _func_jvp,
}
TANGENTS = {"x alone": (TANGENT_X, None), "w alone": (None, TANGENT_W), "both": (TANGENT_X, TANGENT_W)}


@pytest.fixture(autouse=True)
def _float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _case(case):
    return [torch.tensor(a) for a in CASES[case]]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", REVERSE)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_in_reverse_mode(case, mode, order):
    """X·Wᵀ with the VJP (ct·W, ctᵀ·X): dX = ct·W never reads X, so a NaN in X leaves it finite; dW is NaN in
    the column the NaN reaches alone. The decorator once gave 0 on the NaN's row of dX and wrong finite numbers
    in dW."""
    x, w = _case(case)
    f = ORDERS[order]
    assert_same(REVERSE[mode](f, x, w), REVERSE[mode](plain, x, w), f"{case}, {mode}")
    np.testing.assert_array_equal(f(x, w), plain(x, w))  # the value, as it was (both stopped: nothing moves)


@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_is_the_function_in_reverse_mode(case):
    x, w = _case(case)
    for mode in ("backward", "autograd.grad", "compile(fullgraph) backward"):
        assert_same(REVERSE[mode](ORDERS[1], x, w), REVERSE[mode](Mixing.apply, x, w), f"{case}, {mode}")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", FORWARD)
@pytest.mark.parametrize("tangents", TANGENTS)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_with_a_nan_or_inf_is_the_rule_as_written_in_forward_mode(case, tangents, mode, order):
    """At order 1 a tangent on X alone is tX·Wᵀ, finite on the NaN's row (the decorator once gave NaN there, and
    −inf turned NaN), where PyTorch's own forward mode of X·Wᵀ gives NaN."""
    x, w = _case(case)
    given = TANGENTS[tangents]
    got, want = FORWARD[mode](ORDERS[order], x, w, given), tangent_as_written(*CASES[case], given)
    if order == 1:
        assert_same(got, [want], f"{case}, {tangents}, {mode}")
    else:
        # Order 2 differentiates the VJP's own ops at the midpoint, with PyTorch's forward rules, and its rule for a
        # matmul multiplies the NaN or inf by the zero tangent of a factor that has none, as it does for the
        # formula itself (below): the stated limit (docs/torch.md). Every element is the rule's or NaN, never a
        # wrong number.
        got = got[0].numpy()
        assert np.all(np.isnan(got) | np.isclose(got, want, rtol=1e-12, atol=0)), (case, tangents, got, want)
    if case == "nan in X" and tangents == "x alone":
        assert np.isnan(FORWARD[mode](plain, x, w, given)[0].numpy()[0]).all()  # autodiff's forward mode, beside it


def _jacobian_as_written(x, w):
    """The Jacobians w.r.t. X and W, column by column the rule as written on each basis tangent of the pair (a
    basis tangent of X has W's tangent zero, which a NaN or inf of X meets, as in autodiff of the formula)."""
    columns = []
    for k, a in enumerate((x, w)):
        jacobian = np.zeros(plain(x, w).shape + a.shape)
        for index in np.ndindex(a.shape):
            basis = np.zeros(a.shape)
            basis[index] = 1.0
            pair = (basis, np.zeros(w.shape)) if k == 0 else (np.zeros(x.shape), basis)
            jacobian[(..., *index)] = tangent_as_written(x, w, pair)
        columns.append(jacobian)
    return columns


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES)
def test_the_mixing_matmul_jacfwd_is_the_rule_on_each_basis_tangent(case, order):
    x, w = _case(case)
    want = _jacobian_as_written(*CASES[case])
    assert_same(torch.func.jacfwd(ORDERS[order], argnums=(0, 1))(x, w), want, case)
    assert_same(torch.func.jacfwd(plain, argnums=(0, 1))(x, w), want, case)  # the truth is autodiff's too


AWKWARD_X = [1.0, math.nan, math.inf, -math.inf]
COMPILED = {
    "compile(fullgraph) func.jvp": lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),))[1],
    "compile(fullgraph) func.vmap(func.grad)": lambda f, x: torch.func.vmap(torch.func.grad(f))(x),
    "compile(fullgraph) func.jacfwd": lambda f, x: torch.func.jacfwd(f)(x).diagonal(),
    "compile(fullgraph) func.vmap(func.jvp)": lambda f, x: torch.func.vmap(
        lambda x: torch.func.jvp(f, (x,), (torch.ones_like(x),))[1])(x),
}


@pytest.mark.parametrize("mode", COMPILED)
def test_forward_mode_and_vmap_under_torch_compile_carry_the_derivative_too(mode, monkeypatch):
    """Dynamo traces no Function that defines a jvp, nor its template of one under vmap: the carrier's call is
    allowed in the graph, where AOTAutograd traces it in every transform (the select it stood for gave 0)."""
    fresh_compilation(monkeypatch)
    half = sgm.custom_gradient(lambda x: (x * 1.0, lambda ct: ct * 0.5))
    identity_form = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa
    x = torch.tensor(AWKWARD_X)
    got = torch.compile(lambda x: COMPILED[mode](half, x), fullgraph=True)(x)
    np.testing.assert_array_equal(got, [0.5] * 4)
    got = torch.compile(lambda x: COMPILED[mode](identity_form, x), fullgraph=True)(x)
    np.testing.assert_array_equal(got, MODES["backward"](lambda x: torch.sigmoid(x).detach() * x, x))


class Half(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, ct):
        return ct * 0.5


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", [*MODES, *COMPILED_MODES])
def test_an_elementwise_rule_reaches_a_non_finite_x(mode, order):
    """x ↦ (x, ct·0.5) at [1, NaN, inf, −inf]: 0.5 everywhere, as the rule says and the Function gives (the
    decorator gave 0 at the three non-finite elements)."""
    half = sgm.custom_gradient(lambda x: (x * 1.0, lambda ct: ct * 0.5), order=order)
    x = torch.tensor(AWKWARD_X)
    modes = {**MODES, **COMPILED_MODES}
    np.testing.assert_array_equal(modes[mode](half, x).detach(), [0.5] * 4)
    np.testing.assert_array_equal(modes["backward"](Half.apply, x), [0.5] * 4)
    np.testing.assert_array_equal(half(x), x)


@pytest.mark.parametrize("mode", [*MODES, *COMPILED_MODES])
def test_the_identity_form_passes_gx_at_a_non_finite_x(mode):
    """log1pexp with gx = sigmoid(x): 1 at +inf, 0 at −inf, NaN at NaN (the identity form gave 0, 0, 0); the truth
    is autodiff of stop(sigmoid(x))·x."""
    f = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)  # noqa: E731
    modes = {**MODES, **COMPILED_MODES}
    x = torch.tensor(AWKWARD_X)
    got = modes[mode](f, x).detach()
    np.testing.assert_array_equal(got, MODES["backward"](lambda x: torch.sigmoid(x).detach() * x, x))
    np.testing.assert_allclose(got, [1 / (1 + np.exp(-1.0)), np.nan, 1.0, 0.0], rtol=1e-12)


GRID = [0.0, -0.0, 1e-45, -1e-45, 1.5, -2.25, 3e38, -3e38, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("slope_is_negative", [False, True])
def test_the_carrier_is_the_ordinary_ops_zero_bit_for_bit_where_they_give_one(slope_is_negative):
    """Where a is finite, a − stop(a) is the definition: c(a − stop(a)) has its value and its derivative bit for bit
    in backward, forward_ad, torch.func's jvp and vjp and under vmap, over ±0, subnormals, huge values and every
    cotangent and tangent of the grid; where a is not finite it is +0.0 with slope one, which ordinary ops cannot
    give."""
    a = torch.tensor(GRID, dtype=torch.float32)
    finite = np.isfinite(GRID)
    zeros = np.zeros(len(GRID), np.float32)
    ordinary = lambda a: a - a.detach()  # noqa: E731
    carried_zero = lambda a: identity.carried_zero(a - a.detach())  # noqa: E731
    for t in GRID:
        t = torch.full_like(a, t)
        for transform in (lambda f: f, torch.func.vmap):
            carried = transform(lambda a, t: torch.func.jvp(carried_zero, (a,), (t,)))(a, t)
            plain_ = transform(lambda a, t: torch.func.jvp(ordinary, (a,), (t,)))(a, t)
            assert np.all(bits(carried[0]) == bits(torch.tensor(zeros)))
            assert np.all(bits(carried[1]) == bits(t))
            assert np.all(bits(plain_[1])[finite] == bits(carried[1])[finite])
        with forward_ad.dual_level():
            tangent = forward_ad.unpack_dual(carried_zero(forward_ad.make_dual(a, t))).tangent
        assert np.all(bits(tangent) == bits(t))
        cotangents = [torch.func.vjp(fn, a)[1](t)[0] for fn in (carried_zero, ordinary)]
        assert np.all(bits(cotangents[0])[finite] == bits(cotangents[1])[finite])
        assert np.all(bits(cotangents[0]) == bits(t))
        leaf = a.clone().requires_grad_()
        carried_zero(leaf).backward(t)
        assert np.all(bits(leaf.grad) == bits(t))
    moving = a.clone().requires_grad_()
    zero = identity.zero_with_slope(moving, slope_is_negative)
    assert np.all(bits(zero) == bits(torch.tensor(zeros)))
    zero.sum().backward()
    np.testing.assert_array_equal(moving.grad, np.full(len(GRID), -1.0 if slope_is_negative else 1.0))
