"""custom_root, custom_fixed_point and implicit_reparameterization in PyTorch, against closed forms and autodiff
through a converged unrolled solver, in every mode: backward, create_graph, forward_ad, torch.func and
torch.compile(fullgraph=True)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

_DOUBLE = torch.float64
_X = torch.as_tensor(np.random.default_rng(0).normal(size=(20, 5)))
_Y = torch.as_tensor(np.random.default_rng(1).normal(size=20))


def _optimality_of(x, y):  # the gradient of ½|Xw − y|² + ½λ|w|², closing over the data as users write it
    return lambda w, lam: x.T @ (x @ w - y) + lam * w


def _closed_form(lam):  # its solution, differentiated by plain autodiff: the truth
    return torch.linalg.solve(_X.T @ _X + lam * torch.eye(5, dtype=_DOUBLE), _X.T @ _Y)


def _by_columns(matvec, b):
    """A matrix-free solve that builds the operator it is handed from its columns (linear op by op)."""
    columns = torch.func.vmap(matvec)(torch.eye(b.shape[0], dtype=b.dtype))
    return torch.linalg.solve(columns.mT, b)


_SOLVES = {"dense": None, "by columns": _by_columns}


def _ridge(solve=None, order=2):
    optimality = _optimality_of(_X, _Y)

    @sgm.custom_root(optimality, solve, order=order)
    def ridge(init, lam):  # the normal equations, solved under no_grad (SciPy's solver below cannot be differentiated)
        return torch.linalg.solve(_X.T @ _X + lam * torch.eye(5, dtype=_DOUBLE), _X.T @ _Y)
    return ridge


def _lam(value=2.0, requires_grad=False):
    return torch.tensor(value, dtype=_DOUBLE, requires_grad=requires_grad)


@pytest.mark.parametrize("solve", _SOLVES)
def test_ridge_derivatives_in_every_mode_are_the_closed_forms(solve):
    ridge, init, lam = _ridge(_SOLVES[solve]), torch.zeros(5, dtype=_DOUBLE), _lam()
    truth = torch.func.jacrev(_closed_form)(lam)
    torch.testing.assert_close(ridge(init, lam), _closed_form(lam), rtol=1e-10, atol=0)
    torch.testing.assert_close(torch.func.jacrev(ridge, argnums=1)(init, lam), truth, rtol=1e-9, atol=1e-15)
    torch.testing.assert_close(torch.func.jacfwd(ridge, argnums=1)(init, lam), truth, rtol=1e-9, atol=1e-15)
    live = _lam(requires_grad=True)
    ridge(init, live).sum().backward()
    torch.testing.assert_close(live.grad, truth.sum(), rtol=1e-9, atol=1e-15)
    with fwAD.dual_level():  # torchopt's autograd.Function has no forward mode
        tangent = fwAD.unpack_dual(ridge(init, fwAD.make_dual(lam, torch.tensor(0.5, dtype=_DOUBLE)))).tangent
    torch.testing.assert_close(tangent, 0.5 * truth, rtol=1e-9, atol=1e-15)
    assert not ridge(torch.zeros(5, dtype=_DOUBLE, requires_grad=True), lam).requires_grad  # init gets none


def test_a_compiled_step_gives_the_closed_forms_gradient():
    ridge = _ridge()
    loss = lambda lam: (ridge(torch.zeros(5, dtype=_DOUBLE), lam) ** 2).sum()  # noqa: E731
    truth = torch.func.grad(lambda lam: (_closed_form(lam) ** 2).sum())(_lam())
    torch.testing.assert_close(torch.compile(torch.func.grad(loss), fullgraph=True)(_lam()), truth, rtol=1e-9,
                               atol=0)
    live = _lam(requires_grad=True)
    torch.compile(loss, fullgraph=True)(live).backward()
    torch.testing.assert_close(live.grad, truth, rtol=1e-9, atol=0)


@pytest.mark.parametrize("solve", _SOLVES)
def test_the_hessian_of_a_loss_through_the_root_is_the_closed_forms(solve):
    ridge = _ridge(_SOLVES[solve])
    target = torch.linspace(-0.5, 0.5, 5, dtype=_DOUBLE)

    def loss(f):
        return lambda lam: ((f(lam) - target) ** 2).sum()

    implicit = loss(lambda lam: ridge(torch.zeros(5, dtype=_DOUBLE), lam))
    for value in (0.5, 2.0):
        truth = torch.func.hessian(loss(_closed_form))(_lam(value))
        torch.testing.assert_close(torch.func.hessian(implicit)(_lam(value)), truth, rtol=1e-8, atol=0)
        torch.testing.assert_close(torch.func.jacfwd(torch.func.grad(implicit))(_lam(value)), truth, rtol=1e-8,
                                   atol=0)
        live = _lam(value, requires_grad=True)
        first, = torch.autograd.grad(implicit(live), live, create_graph=True)
        second, = torch.autograd.grad(first, live)
        torch.testing.assert_close(second, truth, rtol=1e-8, atol=0)


def test_vmap_over_the_parameter():
    ridge = _ridge()
    lams = torch.tensor([0.5, 1.0, 4.0], dtype=_DOUBLE)
    implicit = lambda lam: (ridge(torch.zeros(5, dtype=_DOUBLE), lam) ** 2).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(implicit))(lams),
                               torch.func.vmap(torch.func.grad(lambda lam: (_closed_form(lam) ** 2).sum()))(lams),
                               rtol=1e-9, atol=0)


def test_order_1_refuses_a_second_derivative_and_order_2_a_third():
    loss = lambda f: lambda lam: (f(torch.zeros(5, dtype=_DOUBLE), lam) ** 2).sum()  # noqa: E731
    first = loss(_ridge(order=1))
    torch.testing.assert_close(torch.func.grad(first)(_lam()),
                               torch.func.grad(lambda lam: (_closed_form(lam) ** 2).sum())(_lam()), rtol=1e-9, atol=0)
    with pytest.raises(LookupError, match="order=2"):
        torch.func.hessian(first)(_lam())
    with pytest.raises(LookupError, match="third derivative"):
        torch.func.grad(torch.func.grad(torch.func.grad(loss(_ridge()))))(_lam())


def test_a_scipy_solver_runs_eagerly_on_detached_values_and_is_never_differentiated():
    """SciPy's root finder on z³ + z = θ elementwise (z' = 1 / (3z² + 1), z'' = −6z z'³)."""
    optimize = pytest.importorskip("scipy.optimize")

    def optimality(z, theta):
        return z ** 3 + z - theta

    @sgm.custom_root(optimality)
    def cubic(init, theta):
        found = optimize.root(lambda z: optimality(z, theta.numpy()), init.numpy(), tol=1e-14)
        return torch.as_tensor(found.x)

    theta = torch.tensor([0.5, 2.0, -3.0], dtype=_DOUBLE)
    z = cubic(torch.zeros(3, dtype=_DOUBLE), theta)
    torch.testing.assert_close(z ** 3 + z, theta, rtol=1e-12, atol=0)
    slope = 1 / (3 * z ** 2 + 1)
    live = theta.clone().requires_grad_()
    cubic(torch.zeros(3, dtype=_DOUBLE), live).sum().backward()
    torch.testing.assert_close(live.grad, slope, rtol=1e-10, atol=0)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(cubic(torch.zeros(3, dtype=_DOUBLE), fwAD.make_dual(theta, torch.ones(3,
                                                                                             dtype=_DOUBLE)))).tangent
    torch.testing.assert_close(tangent, slope, rtol=1e-10, atol=0)
    live = theta.clone().requires_grad_()
    first, = torch.autograd.grad(cubic(torch.zeros(3, dtype=_DOUBLE), live).sum(), live, create_graph=True)
    second, = torch.autograd.grad(first.sum(), live)
    torch.testing.assert_close(second, -6 * z * slope ** 3, rtol=1e-9, atol=1e-14)


# ---------------------------------------------------------------- a deep-equilibrium fixed point
_W = torch.as_tensor(0.2 * np.random.default_rng(2).normal(size=(4, 4)))


def _layer_of(w):
    return lambda z, x: torch.tanh(w @ z + x)


def _unrolled(x):  # the truth: autodiff through the iteration, run to convergence in float64
    z = torch.zeros(4, dtype=_DOUBLE)
    for _ in range(300):
        z = torch.tanh(_W @ z + x)
    return z


def test_a_deep_equilibrium_fixed_point_against_the_unrolled_iteration():
    layer = _layer_of(_W)

    @sgm.custom_fixed_point(layer)
    def equilibrium(init, x):  # to a tolerance read in Python
        z, previous = layer(init, x), init
        while (z - previous).abs().max().item() > 1e-15:
            z, previous = layer(z, x), z
        return z

    x = torch.tensor([0.3, -0.5, 1.0, 0.1], dtype=_DOUBLE)
    fixed = lambda x: equilibrium(torch.zeros(4, dtype=_DOUBLE), x)  # noqa: E731
    torch.testing.assert_close(fixed(x), _unrolled(x), rtol=1e-12, atol=0)
    truth = torch.autograd.functional.jacobian(_unrolled, x)
    live = x.clone().requires_grad_()
    jacobian = torch.stack([torch.autograd.grad(fixed(live)[k], live)[0] for k in range(4)])
    torch.testing.assert_close(jacobian, truth, rtol=1e-8, atol=1e-12)
    with fwAD.dual_level():
        columns = [fwAD.unpack_dual(fixed(fwAD.make_dual(x, e))).tangent for e in torch.eye(4, dtype=_DOUBLE)]
    torch.testing.assert_close(torch.stack(columns, 1), truth, rtol=1e-8, atol=1e-12)
    loss = lambda f: lambda x: (f(x) ** 2).sum()  # noqa: E731
    live = x.clone().requires_grad_()
    first, = torch.autograd.grad(loss(fixed)(live), live, create_graph=True)
    hessian = torch.stack([torch.autograd.grad(first[k], live, retain_graph=True)[0] for k in range(4)])
    torch.testing.assert_close(hessian, torch.autograd.functional.hessian(loss(_unrolled), x), rtol=1e-7,
                               atol=1e-12)


def test_a_matrix_free_solve_that_is_not_linear_op_by_op_is_refused_naming_the_op():
    """CG's step sizes are ratios of the cotangent's products: not linear op by op, and PyTorch has no
    declared-linear solve; the refusal names the op rather than giving a wrong derivative."""
    def cg(matvec, b):
        x, r = torch.zeros_like(b), b.clone()
        p = r
        for _ in range(5):
            step = (r @ r) / (p @ matvec(p))
            x, r_next = x + step * p, r - step * matvec(p)
            p, r = r_next + (r_next @ r_next) / (r @ r) * p, r_next
        return x

    live = _lam(requires_grad=True)
    with pytest.raises(ValueError, match="not linear in its cotangent"):
        _ridge(cg)(torch.zeros(5, dtype=_DOUBLE), live).sum().backward()


# ---------------------------------------------------------------- implicit reparameterization
def _exponential_cdf(z, rate):
    return 1 - torch.exp(-rate * z)


def test_exponential_draws_first_and_second_derivatives_are_the_closed_forms():
    """z = −log(1 − u) / λ: dz/dλ = −z/λ, d²z/dλ² = 2z/λ², for a scalar rate (summed) and one rate per draw."""
    z = torch.tensor([0.5, 2.0, 1e-3, 7.0], dtype=_DOUBLE)
    draws = lambda rate: sgm.implicit_reparameterization(z, _exponential_cdf, rate, order=2)  # noqa: E731
    rate = _lam()
    assert torch.equal(draws(rate), z)
    torch.testing.assert_close(torch.func.jacrev(draws)(rate), -z / rate, rtol=1e-14, atol=0)
    torch.testing.assert_close(torch.func.jacfwd(draws)(rate), -z / rate, rtol=1e-14, atol=0)
    torch.testing.assert_close(torch.func.jacfwd(torch.func.jacrev(draws))(rate), 2 * z / rate ** 2, rtol=1e-13,
                               atol=0)
    live = _lam(requires_grad=True)
    first, = torch.autograd.grad(draws(live).sum(), live, create_graph=True)
    torch.testing.assert_close(first, -z.sum() / rate, rtol=1e-14, atol=0)
    torch.testing.assert_close(torch.autograd.grad(first, live)[0], 2 * z.sum() / rate ** 2, rtol=1e-13, atol=0)
    rates = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=_DOUBLE)
    torch.testing.assert_close(torch.func.jacfwd(draws)(rates), torch.diag(-z / rates), rtol=1e-14, atol=0)


def test_gamma_draws_match_torch_rsamples_own_gradient_in_the_rate():
    """Gamma(a, rate) draws through their CDF, the regularized incomplete gamma function of rate·z, against
    rsample's gradient in the rate, one rate per draw (PyTorch has no derivative of igamma in the concentration)."""
    concentration = torch.tensor([0.3, 1.0, 2.5, 7.0], dtype=_DOUBLE)
    rate = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=_DOUBLE, requires_grad=True)
    torch.manual_seed(3)
    drawn = torch.distributions.Gamma(concentration, rate).rsample()
    truth, = torch.autograd.grad(drawn.sum(), rate)  # each draw moves with its own rate alone

    def cdf(z, rate):
        return torch.special.gammainc(concentration, rate * z)

    ours = sgm.implicit_reparameterization(drawn.detach(), cdf, rate)
    assert torch.equal(ours, drawn.detach())
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), rate)[0], truth, rtol=1e-9, atol=0)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(sgm.implicit_reparameterization(
            drawn.detach(), cdf, fwAD.make_dual(rate.detach(), torch.ones(4, dtype=_DOUBLE)))).tangent
    torch.testing.assert_close(tangent, truth, rtol=1e-9, atol=0)
