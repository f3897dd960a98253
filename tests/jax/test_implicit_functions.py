"""custom_root, custom_fixed_point, implicit_reparameterization and linear_solve in JAX, against closed forms and
autodiff through a converged unrolled solver, in every mode: grad, jvp, jacfwd, jacrev, hessian, vmap, jit, scan."""

import numpy as np
import pytest
import scipy.optimize

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402

# ---------------------------------------------------------------- ridge regression (jaxopt #474's case)
_X = np.random.default_rng(0).normal(size=(20, 5))
_Y = np.random.default_rng(1).normal(size=20)


def _optimality(w, lam):  # the gradient of ½|Xw − y|² + ½λ|w|²
    return _X.T @ (_X @ w - _Y) + lam * w


def _closed_form(lam):  # its solution, differentiated by plain autodiff: the truth
    return jnp.linalg.solve(_X.T @ _X + lam * jnp.eye(5), _X.T @ _Y)


def _cg(matvec, b):
    return jax.scipy.sparse.linalg.cg(matvec, b, tol=1e-13)[0]


def _ridge(solve=None, order=2):
    @sgm.custom_root(_optimality, solve, order=order)
    def ridge(init, lam):  # gradient descent from init: its autodiff is not the solution's derivative
        step = 1.0 / (np.linalg.norm(_X, 2) ** 2 + lam)
        return jax.lax.fori_loop(0, 3000, lambda _, w: w - step * _optimality(w, lam), init)
    return ridge


_SOLVES = {"dense": None, "cg": _cg}


@pytest.mark.parametrize("solve", _SOLVES)
def test_ridge_derivatives_in_every_mode_are_the_closed_forms(float64, solve):
    ridge = _ridge(_SOLVES[solve])
    init, lam = jnp.zeros(5), 2.0
    truth = jax.jacrev(_closed_form)(lam)
    np.testing.assert_allclose(ridge(init, lam), _closed_form(lam), rtol=1e-10)
    np.testing.assert_allclose(jax.jacrev(ridge, 1)(init, lam), truth, rtol=1e-9)
    np.testing.assert_allclose(jax.jacfwd(ridge, 1)(init, lam), truth, rtol=1e-9)  # jaxopt raises here
    np.testing.assert_allclose(jax.jvp(lambda lam: ridge(init, lam), (lam,), (0.5,))[1], 0.5 * truth, rtol=1e-9)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(ridge, 1))(init, lam), truth, rtol=1e-9)
    np.testing.assert_array_equal(jax.grad(lambda init: ridge(init, lam).sum())(init), np.zeros(5))  # init: none


@pytest.mark.parametrize("solve", _SOLVES)
def test_the_hessian_of_a_loss_through_the_root_is_the_closed_forms(float64, solve):
    ridge = _ridge(_SOLVES[solve])
    target = jnp.linspace(-0.5, 0.5, 5)

    def loss(lam, f):
        return jnp.sum((f(lam) - target) ** 2)

    implicit, closed = (lambda lam: ridge(jnp.zeros(5), lam)), _closed_form
    for lam in (0.5, 2.0):
        truth = jax.hessian(loss)(lam, closed)
        np.testing.assert_allclose(jax.hessian(loss)(lam, implicit), truth, rtol=1e-8)
        np.testing.assert_allclose(jax.jit(jax.hessian(loss), static_argnums=1)(lam, implicit), truth, rtol=1e-8)
        np.testing.assert_allclose(jax.grad(jax.grad(loss))(lam, implicit), truth, rtol=1e-8)
        np.testing.assert_allclose(jax.jacfwd(jax.jacfwd(loss))(lam, implicit), truth, rtol=1e-8)


def test_vmap_over_the_parameter_and_a_root_in_a_scan_body(float64):
    ridge = _ridge()
    lams = jnp.array([0.5, 1.0, 4.0])
    gradient = jax.grad(lambda lam, f: jnp.sum(f(lam) ** 2))
    implicit = lambda lam: ridge(jnp.zeros(5), lam)  # noqa: E731
    np.testing.assert_allclose(jax.vmap(lambda lam: gradient(lam, implicit))(lams),
                               jax.vmap(lambda lam: gradient(lam, _closed_form))(lams), rtol=1e-9)

    def summed(scale, f):
        return jax.lax.scan(lambda total, lam: (total + jnp.sum(f(scale * lam)), None), 0.0, lams)[0]

    np.testing.assert_allclose(jax.grad(summed)(1.5, implicit), jax.grad(summed)(1.5, _closed_form), rtol=1e-9)
    np.testing.assert_allclose(jax.jvp(lambda s: summed(s, implicit), (1.5,), (1.0,))[1],
                               jax.jvp(lambda s: summed(s, _closed_form), (1.5,), (1.0,))[1], rtol=1e-9)


def test_order_1_refuses_a_second_derivative_and_order_2_a_third(float64):
    loss = lambda f: lambda lam: jnp.sum(f(jnp.zeros(5), lam) ** 2)  # noqa: E731
    first = loss(_ridge(order=1))
    np.testing.assert_allclose(jax.grad(first)(2.0), jax.grad(lambda lam: jnp.sum(_closed_form(lam) ** 2))(2.0))
    with pytest.raises(LookupError, match="order=2"):
        jax.hessian(first)(2.0)
    with pytest.raises(LookupError, match="third derivative"):
        jax.grad(jax.grad(jax.grad(loss(_ridge()))))(2.0)


def test_a_numpy_solver_runs_eagerly_on_concrete_values_and_is_never_differentiated(float64):
    """SciPy's root finder on a nonlinear system, z³ + z = θ elementwise (z' = 1 / (3z² + 1), z'' = −6z z'³)."""
    def optimality(z, theta):
        return z ** 3 + z - theta

    @sgm.custom_root(optimality)
    def cubic(init, theta):
        solution = scipy.optimize.root(lambda z: np.asarray(optimality(z, np.asarray(theta))), np.asarray(init),
                                       tol=1e-14)
        return jnp.asarray(solution.x)

    theta = jnp.array([0.5, 2.0, -3.0])
    z = cubic(jnp.zeros(3), theta)
    np.testing.assert_allclose(z ** 3 + z, theta, rtol=1e-12)
    slope = 1 / (3 * z ** 2 + 1)
    np.testing.assert_allclose(jax.grad(lambda t: cubic(jnp.zeros(3), t).sum())(theta), slope, rtol=1e-10)
    np.testing.assert_allclose(jax.jvp(lambda t: cubic(jnp.zeros(3), t), (theta,), (jnp.ones(3),))[1], slope,
                               rtol=1e-10)
    np.testing.assert_allclose(jax.hessian(lambda t: cubic(jnp.zeros(3), t).sum())(theta),
                               np.diag(-6 * z * slope ** 3), rtol=1e-9, atol=1e-14)


# ---------------------------------------------------------------- a deep-equilibrium fixed point
_W = 0.4 * np.random.default_rng(2).normal(size=(4, 4)) / 2


def _layer(z, x, w):
    return jnp.tanh(w @ z + x)


def _unrolled(x, w):  # the truth: autodiff through the iteration, run to convergence in float64
    return jax.lax.fori_loop(0, 300, lambda _, z: _layer(z, x, w), jnp.zeros(4))


@pytest.mark.parametrize("solve", _SOLVES)
def test_a_deep_equilibrium_fixed_point_against_the_unrolled_iteration(float64, solve):
    @sgm.custom_fixed_point(_layer, _SOLVES[solve] and _gmres)
    def equilibrium(init, x, w):
        return jax.lax.while_loop(lambda zs: jnp.max(jnp.abs(zs[1] - zs[0])) > 1e-15,
                                  lambda zs: (zs[1], _layer(zs[1], x, w)), (init, _layer(init, x, w)))[1]

    x, w = jnp.array([0.3, -0.5, 1.0, 0.1]), jnp.asarray(_W)
    fixed = lambda x, w: equilibrium(jnp.zeros(4), x, w)  # noqa: E731
    np.testing.assert_allclose(fixed(x, w), _unrolled(x, w), rtol=1e-12)
    for argnums in (0, 1):
        truth = jax.jacrev(_unrolled, argnums)(x, w)
        np.testing.assert_allclose(jax.jacrev(fixed, argnums)(x, w), truth, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(jax.jacfwd(fixed, argnums)(x, w), truth, rtol=1e-8, atol=1e-12)
    loss = lambda f: lambda x: jnp.sum(f(x, w) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.hessian(loss(fixed))(x), jax.hessian(loss(_unrolled))(x), rtol=1e-7, atol=1e-12)
    batch = x + jnp.array([[0.0], [0.5], [-1.0]])
    np.testing.assert_allclose(jax.vmap(jax.grad(loss(fixed)))(batch), jax.vmap(jax.grad(loss(_unrolled)))(batch),
                               rtol=1e-8, atol=1e-12)


def _gmres(matvec, b):
    return jax.scipy.sparse.linalg.gmres(matvec, b, tol=1e-14, atol=0.0)[0]


# ---------------------------------------------------------------- linear_solve
def _jacobi(matvec, b):
    """A hand-written iterative solve whose stopping test reads b: not linear op by op (a while_loop)."""
    diagonal = jax.vmap(lambda e: jnp.dot(e, matvec(e)))(jnp.eye(b.shape[0]))
    return jax.lax.while_loop(lambda x: jnp.linalg.norm(matvec(x) - b) > 1e-12 * jnp.linalg.norm(b),
                              lambda x: x + (b - matvec(x)) / diagonal, jnp.zeros_like(b))


_A = np.array([[4.0, 1.0, 0.5], [1.0, 5.0, 1.0], [0.0, 1.0, 3.0]])


def _solved_by(solve_in_vjp):
    @sgm.custom_gradient
    def f(x):  # y = A⁻¹x, its VJP Aᵀ⁻¹ ct by an iterative solve
        return jnp.linalg.solve(_A, x), lambda ct: solve_in_vjp(ct)
    return f


def test_a_while_loop_solve_inside_a_vjp_is_embedded_through_linear_solve(float64):
    x = jnp.array([1.0, -2.0, 0.5])
    declared = _solved_by(lambda ct: sgm.linear_solve(lambda v: _A.T @ v, ct, _jacobi, transpose_solve=_jacobi))
    truth = np.linalg.inv(_A)
    np.testing.assert_allclose(jax.jacrev(declared)(x), truth, rtol=1e-10)
    np.testing.assert_allclose(jax.jacfwd(declared)(x), truth, rtol=1e-10)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(declared))(x), truth, rtol=1e-10)
    with pytest.raises(ValueError, match="while"):
        jax.jacfwd(_solved_by(lambda ct: _jacobi(lambda v: _A.T @ v, ct)))(x)


def test_a_root_whose_solve_is_a_while_loop_in_forward_mode(float64):
    ridge = _ridge(_jacobi)
    truth = jax.jacrev(_closed_form)(2.0)
    np.testing.assert_allclose(jax.jacfwd(ridge, 1)(jnp.zeros(5), 2.0), truth, rtol=1e-8)
    np.testing.assert_allclose(jax.jacrev(ridge, 1)(jnp.zeros(5), 2.0), truth, rtol=1e-8)


def _cg_steps(matvec, b):
    """CG, one step per unknown and no tolerance, as written by hand: exact for a symmetric positive definite
    operator, and 0/0 = NaN at b = 0."""
    x, r = jnp.zeros_like(b), b
    p = r
    for _ in range(b.shape[0]):
        applied = matvec(p)
        alpha = (r @ r) / (p @ applied)
        x, r_next = x + alpha * p, r - alpha * applied
        p, r = r_next + (r_next @ r_next) / (r @ r) * p, r_next
    return x


def test_a_zero_cotangent_or_tangent_gives_zero_where_the_solver_gives_nan_at_zero(float64):
    """A solve is linear: at b = 0 it is 0 (``linear_solve`` does not call the solver there). The truth: autodiff
    of the closed form, whose derivative along a zero is 0."""
    symmetric = _A + _A.T
    assert np.isnan(_cg_steps(lambda v: symmetric @ v, jnp.zeros(3))).all()  # the solver itself, at b = 0
    ridge = _ridge(_cg_steps)
    implicit = lambda lam: ridge(jnp.zeros(5), lam)  # noqa: E731
    truth = jax.jacrev(_closed_form)(2.0)
    pullback = jax.vjp(implicit, 2.0)[1]
    np.testing.assert_array_equal(pullback(jnp.zeros(5))[0], 0.0)
    np.testing.assert_array_equal(jax.grad(lambda lam: 0.0 * implicit(lam).sum())(2.0), 0.0)
    np.testing.assert_array_equal(jax.jvp(implicit, (2.0,), (0.0,))[1], np.zeros(5))
    np.testing.assert_array_equal(jax.jit(lambda t: jax.jvp(implicit, (2.0,), (t,))[1])(0.0), np.zeros(5))
    rows = jnp.stack([jnp.zeros(5), jnp.ones(5), jnp.zeros(5)])  # under vmap, a zero row beside one that is not
    np.testing.assert_allclose(jax.vmap(lambda ct: pullback(ct)[0])(rows), [0.0, truth.sum(), 0.0], rtol=1e-9)
    scanned = jax.jit(lambda rows: jax.lax.scan(lambda carry, ct: (carry, pullback(ct)[0]), 0.0, rows)[1])
    np.testing.assert_allclose(scanned(rows), [0.0, truth.sum(), 0.0], rtol=1e-9)  # the cond in a scan's body
    np.testing.assert_allclose(jax.hessian(lambda lam: jnp.sum(implicit(lam) ** 2))(2.0),
                               jax.hessian(lambda lam: jnp.sum(_closed_form(lam) ** 2))(2.0), rtol=1e-8)
    solved = lambda b: sgm.linear_solve(lambda v: symmetric @ v, b, _cg_steps, symmetric=True)  # noqa: E731
    np.testing.assert_array_equal(solved(jnp.zeros(3)), np.zeros(3))
    b = jnp.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(solved(b), np.linalg.solve(symmetric, b), rtol=1e-10)
    np.testing.assert_array_equal(jax.jvp(solved, (b,), (jnp.zeros(3),))[1], np.zeros(3))
    np.testing.assert_allclose(jax.jacrev(solved)(b), np.linalg.inv(symmetric), rtol=1e-10)


# ---------------------------------------------------------------- implicit reparameterization
def _exponential_cdf(z, rate):
    return 1 - jnp.exp(-rate * z)


def test_exponential_draws_first_and_second_derivatives_are_the_closed_forms(float64):
    """z = −log(1 − u) / λ: dz/dλ = −z/λ, d²z/dλ² = 2z/λ², for a vector of draws and a scalar rate (summed) or
    one rate per draw."""
    z = jnp.array([0.5, 2.0, 1e-3, 7.0])
    draws = lambda rate: sgm.implicit_reparameterization(z, _exponential_cdf, rate, order=2)  # noqa: E731
    rate = 2.0
    np.testing.assert_array_equal(draws(rate), z)
    np.testing.assert_allclose(jax.jacrev(draws)(rate), -z / rate, rtol=1e-14)
    np.testing.assert_allclose(jax.jacfwd(draws)(rate), -z / rate, rtol=1e-14)
    np.testing.assert_allclose(jax.grad(lambda r: draws(r).sum())(rate), -z.sum() / rate, rtol=1e-14)
    np.testing.assert_allclose(jax.jacfwd(jax.jacrev(draws))(rate), 2 * z / rate ** 2, rtol=1e-13)
    np.testing.assert_allclose(jax.jacrev(jax.jacrev(draws))(rate), 2 * z / rate ** 2, rtol=1e-13)
    rates = jnp.array([0.5, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(jax.jacfwd(draws)(rates), np.diag(-z / rates), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(lambda r: draws(r).sum())))(rates), -z.sum() / rates,
                               rtol=1e-14)


@pytest.mark.parametrize("concentration", [1.7, [0.3, 1.0, 2.5, 7.0, 0.9, 15.0]], ids=["scalar", "per draw"])
def test_gamma_draws_match_jax_random_gammas_own_implicit_gradients(float64, concentration):
    """jax.random.gamma differentiates its draws implicitly; the same draws through the Gamma CDF (the
    regularized incomplete gamma function) give its derivatives, for a scalar concentration of six draws (summed
    back) and one per draw."""
    key, concentration = jax.random.PRNGKey(3), jnp.asarray(concentration)

    def reference(a):
        return jax.random.gamma(key, a, shape=(6,))

    def ours(a):
        return sgm.implicit_reparameterization(reference(a), lambda z, a: jax.scipy.special.gammainc(a, z), a)

    truth = jax.jacrev(reference)(concentration)
    np.testing.assert_array_equal(ours(concentration), reference(concentration))
    np.testing.assert_allclose(jax.jacrev(ours)(concentration), truth, rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(ours)(concentration), truth, rtol=1e-6)
