"""custom_root, custom_fixed_point and implicit_reparameterization in TensorFlow, against closed forms, autodiff
through a converged unrolled solver and TensorFlow's own implicit gradients: tapes, forward accumulators, nested
tapes and forward over reverse, eagerly, under tf.function, under XLA and in TF1 graphs."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import gradient_and_second, in_mode, jvp, vjp

import stopgrad_math as sgm
from stopgrad_math.tensorflow.solves import linear_solve  # the implicit functions' declared solve

_DOUBLE = tf.float64
_X = np.random.default_rng(0).normal(size=(20, 5))  # (NumPy: each graph makes its own constant of them)
_Y = np.random.default_rng(1).normal(size=20)


def _optimality(w, lam):  # the gradient of ½|Xw − y|² + ½λ|w|²
    return tf.linalg.matvec(_X, tf.linalg.matvec(_X, w) - _Y, transpose_a=True) + lam * w


def _closed_form(lam):  # its solution, differentiated by plain autodiff: the truth
    normal = tf.matmul(_X, _X, transpose_a=True) + lam * tf.eye(5, dtype=_DOUBLE)
    return tf.linalg.solve(normal, tf.linalg.matvec(_X, _Y, transpose_a=True)[:, None])[:, 0]


def _ridge(order=2):
    @sgm.custom_root(_optimality, order=order)
    def ridge(init, lam):  # the normal equations (SciPy's solver below cannot be differentiated)
        return _closed_form(lam)
    return lambda lam: ridge(tf.zeros(5, _DOUBLE), lam)


def _jacobian(fn, x, pfor=True):
    with tf.GradientTape(persistent=not pfor) as tape:  # (rows by a loop: pfor cannot vectorize a Python loop)
        tape.watch(x)
        y = fn(x)
    return tape.jacobian(y, x, experimental_use_pfor=pfor)


def test_ridge_derivatives_in_every_mode_are_the_closed_forms(mode):
    ridge, lam = _ridge(), tf.constant(2.0, _DOUBLE)
    truth = _jacobian(_closed_form, lam)
    np.testing.assert_allclose(in_mode(ridge, mode)(lam), _closed_form(lam), rtol=1e-10)
    np.testing.assert_allclose(in_mode(lambda lam: _jacobian(ridge, lam), mode)(lam), truth, rtol=1e-9)
    np.testing.assert_allclose(in_mode(lambda lam: jvp(ridge, lam, tf.constant(0.5, _DOUBLE)), mode)(lam),
                               0.5 * truth, rtol=1e-9)


def test_the_hessian_of_a_loss_through_the_root_is_the_closed_forms(mode):
    ridge = _ridge()
    target = tf.linspace(tf.constant(-0.5, _DOUBLE), 0.5, 5)

    def loss(f):
        return lambda lam: tf.reduce_sum((f(lam) - target) ** 2)

    for value in (0.5, 2.0):
        lam = tf.constant(value, _DOUBLE)
        truth = gradient_and_second(loss(_closed_form), lam)
        for got in (in_mode(lambda lam: gradient_and_second(loss(ridge), lam), mode)(lam),
                    in_mode(lambda lam: jvp(lambda lam: vjp(loss(ridge), lam), lam, tf.constant(1.0, _DOUBLE)),
                            mode)(lam)):
            np.testing.assert_allclose(got[-1] if isinstance(got, tuple) else got, truth[1], rtol=1e-8)


def test_tf1_graphs_with_tf_gradients():
    with tf.Graph().as_default():
        lam = tf.compat.v1.placeholder(_DOUBLE, shape=[])
        first = tf.gradients(tf.reduce_sum(_ridge()(lam) ** 2), lam)[0]
        second = tf.gradients(first, lam)[0]
        truth_first = tf.gradients(tf.reduce_sum(_closed_form(lam) ** 2), lam)[0]
        truth_second = tf.gradients(truth_first, lam)[0]
        with tf.compat.v1.Session() as session:
            got = session.run([first, second, truth_first, truth_second], {lam: 2.0})
    np.testing.assert_allclose(got[:2], got[2:], rtol=1e-8)


def test_order_1_refuses_a_second_derivative_and_order_2_a_third():
    lam = tf.constant(2.0, _DOUBLE)
    first = _ridge(order=1)
    np.testing.assert_allclose(vjp(lambda lam: tf.reduce_sum(first(lam) ** 2), lam),
                               vjp(lambda lam: tf.reduce_sum(_closed_form(lam) ** 2), lam), rtol=1e-9)
    with pytest.raises(LookupError, match="order=2"):
        gradient_and_second(lambda lam: first(lam) ** 2, lam)
    ridge = _ridge()
    with pytest.raises(LookupError, match="third derivative through custom_root"):
        with tf.GradientTape() as third:
            third.watch(lam)
            second = gradient_and_second(lambda lam: ridge(lam) ** 2, lam)[1]
        third.gradient(second, lam)


def test_a_scipy_solver_runs_eagerly_on_stopped_values_and_is_never_differentiated():
    """SciPy's root finder on z³ + z = θ elementwise (z' = 1 / (3z² + 1), z'' = −6z z'³)."""
    optimize = pytest.importorskip("scipy.optimize")

    def optimality(z, theta):
        return z ** 3 + z - theta

    @sgm.custom_root(optimality)
    def cubic(init, theta):
        return optimize.root(lambda z: optimality(z, theta.numpy()), init.numpy(), tol=1e-14).x

    theta = tf.constant([0.5, 2.0, -3.0], _DOUBLE)
    solved = lambda theta: cubic(tf.zeros(3, _DOUBLE), theta)  # noqa: E731
    z = solved(theta).numpy()
    np.testing.assert_allclose(z ** 3 + z, theta, rtol=1e-12)
    slope = 1 / (3 * z ** 2 + 1)
    gradient, second = gradient_and_second(solved, theta)
    np.testing.assert_allclose(gradient, slope, rtol=1e-10)
    np.testing.assert_allclose(jvp(solved, theta, tf.ones(3, _DOUBLE)), slope, rtol=1e-10)
    np.testing.assert_allclose(second, -6 * z * slope ** 3, rtol=1e-9, atol=1e-14)


_W = 0.2 * np.random.default_rng(2).normal(size=(4, 4))


def _layer(z, x):
    return tf.tanh(tf.linalg.matvec(_W, z) + x)


def _unrolled(x):  # the truth: autodiff through the iteration, run to convergence in float64
    z = tf.zeros(4, _DOUBLE)
    for _ in range(300):
        z = _layer(z, x)
    return z


def test_a_deep_equilibrium_fixed_point_against_the_unrolled_iteration():
    @sgm.custom_fixed_point(_layer)
    def equilibrium(init, x):  # to a tolerance read in Python
        z, previous = _layer(init, x), init
        while float(tf.reduce_max(tf.abs(z - previous))) > 1e-15:
            z, previous = _layer(z, x), z
        return z

    x = tf.constant([0.3, -0.5, 1.0, 0.1], _DOUBLE)
    fixed = lambda x: equilibrium(tf.zeros(4, _DOUBLE), x)  # noqa: E731
    np.testing.assert_allclose(fixed(x), _unrolled(x), rtol=1e-12)
    truth = _jacobian(_unrolled, x)
    np.testing.assert_allclose(_jacobian(fixed, x), truth, rtol=1e-8, atol=1e-12)
    columns = [jvp(fixed, x, e) for e in tf.eye(4, dtype=_DOUBLE)]
    np.testing.assert_allclose(tf.stack(columns, 1), truth, rtol=1e-8, atol=1e-12)
    squared = lambda f: lambda x: f(x) ** 2  # noqa: E731
    np.testing.assert_allclose(gradient_and_second(squared(fixed), x)[1], gradient_and_second(squared(_unrolled), x)[1],
                               rtol=1e-7, atol=1e-12)


def _exponential_cdf(z, rate):
    return 1 - tf.exp(-rate * z)


def test_exponential_draws_first_and_second_derivatives_are_the_closed_forms(mode):
    """z = −log(1 − u) / λ: dz/dλ = −z/λ, d²z/dλ² = 2z/λ², for a scalar rate (summed) and one rate per draw."""
    z = tf.constant([0.5, 2.0, 1e-3, 7.0], _DOUBLE)
    draws = lambda rate: sgm.implicit_reparameterization(z, _exponential_cdf, rate, order=2)  # noqa: E731
    rate = tf.constant(2.0, _DOUBLE)
    np.testing.assert_array_equal(in_mode(draws, mode)(rate), z)
    gradient, second = in_mode(lambda rate: gradient_and_second(draws, rate), mode)(rate)
    np.testing.assert_allclose(gradient, -tf.reduce_sum(z) / rate, rtol=1e-14)
    np.testing.assert_allclose(second, 2 * tf.reduce_sum(z) / rate ** 2, rtol=1e-13)
    np.testing.assert_allclose(in_mode(lambda rate: jvp(draws, rate, tf.constant(1.0, _DOUBLE)), mode)(rate),
                               -z / rate, rtol=1e-14)
    rates = tf.constant([0.5, 1.0, 2.0, 4.0], _DOUBLE)
    np.testing.assert_allclose(in_mode(lambda rates: _jacobian(draws, rates), mode)(rates),
                               np.diag(-z / rates), rtol=1e-14)


@pytest.mark.parametrize("concentration", [1.7, [0.3, 1.0, 2.5, 7.0, 0.9, 15.0]], ids=["scalar", "per draw"])
def test_gamma_draws_match_tf_random_gammas_own_implicit_gradients(concentration):
    """tf.random.gamma differentiates its draws implicitly; the same draws through the Gamma CDF (the regularized
    incomplete gamma function) give its derivatives, for a scalar concentration of six draws (summed back) and one
    per draw."""
    concentration = tf.constant(concentration, _DOUBLE)

    def reference(a):
        return tf.random.stateless_gamma([6], seed=[3, 4], alpha=a, dtype=_DOUBLE)

    def ours(a):
        return sgm.implicit_reparameterization(reference(a), lambda z, a: tf.math.igamma(a, z), a)

    np.testing.assert_array_equal(ours(concentration), reference(concentration))
    truth = _jacobian(reference, concentration)
    np.testing.assert_allclose(_jacobian(ours, concentration), truth, rtol=1e-6)
    np.testing.assert_allclose(jvp(ours, concentration, tf.ones_like(concentration)),
                               tf.reduce_sum(tf.reshape(truth, [6, -1]), axis=1), rtol=1e-6)


def test_through_a_vectorized_map_the_first_derivative_is_exact_and_a_second_raises_naming_pfor():
    """pfor's conversion drops a registered gradient, which order 2 records: traced as its loop body, the root is
    embedded as at order 1 (it gave 0 silently), and under a second tape the gradient through the map raises,
    saying why (order 1's guard, which pfor's gradient reaches even for the first derivative there)."""
    lams = tf.constant([0.5, 1.0, 2.0], _DOUBLE)

    def first(fn):
        with tf.GradientTape() as tape:
            tape.watch(lams)
            total = tf.reduce_sum(tf.vectorized_map(fn, lams) ** 2)
        return tape.gradient(total, lams)

    np.testing.assert_allclose(first(_ridge()), first(_closed_form), rtol=1e-9)
    with pytest.raises(Exception, match=r"pfor's loop body"), tf.GradientTape() as outer:  # (TF wraps it: StagingError)
        outer.watch(lams)
        outer.gradient(first(_ridge()), lams)


def _cg(matvec, b):
    """Conjugate gradients in a while_loop, stopping on a tolerance that reads b: not linear op by op."""
    def step(x, r, p, rr):
        ap = matvec(p)
        alpha = rr / tf.tensordot(p, ap, 1)
        r_next = r - alpha * ap
        rr_next = tf.tensordot(r_next, r_next, 1)
        return x + alpha * p, r_next, r_next + rr_next / rr * p, rr_next

    bb = tf.tensordot(b, b, 1)
    return tf.while_loop(lambda x, r, p, rr: rr > 1e-28 * bb, step, (tf.zeros_like(b), b, b, bb),
                         maximum_iterations=50)[0]


def _richardson(matvec, b):
    """Richardson's iteration in a while_loop to a tolerance that reads b (for _A, whose eigenvalues lie in
    [2.5, 6])."""
    return tf.while_loop(lambda x: tf.norm(matvec(x) - b) > 1e-13 * tf.norm(b),
                         lambda x: (x + (b - matvec(x)) / 6.0,), (tf.zeros_like(b),), maximum_iterations=500)[0]


def _cg_five_steps(matvec, b):
    """Five CG steps, no tolerance: exact for the 5×5 normal equations, 0/0 = NaN for b = 0."""
    x, r = tf.zeros_like(b), b
    p, rr = r, tf.tensordot(r, r, 1)
    for _ in range(5):
        ap = matvec(p)
        alpha = rr / tf.tensordot(p, ap, 1)
        x, r = x + alpha * p, r - alpha * ap
        rr, rr_before = tf.tensordot(r, r, 1), rr
        p = r + rr / rr_before * p
    return x


@pytest.mark.parametrize("solve", [_cg, _cg_five_steps], ids=["to a tolerance", "five steps"])
def test_a_root_whose_solve_stops_on_a_tolerance_is_exact_in_every_mode(mode, solve):
    """The caller's solve is declared linear (linear_solve), as jaxopt's contract says it is: reverse and forward
    mode and the Hessian of a loss through the root against the closed form. Order 2's motion of z solves for a
    right-hand side that is zero in value: it is not handed to the solver (five CG steps would give 0/0 there)."""
    ridge = sgm.custom_root(_optimality, solve)(lambda init, lam: _closed_form(lam))
    lam, target = tf.constant(2.0, _DOUBLE), tf.linspace(tf.constant(-0.5, _DOUBLE), 0.5, 5)
    at = lambda lam: ridge(tf.zeros(5, _DOUBLE), lam)  # noqa: E731
    truth = _jacobian(_closed_form, lam)
    np.testing.assert_allclose(in_mode(lambda lam: _jacobian(at, lam, pfor=False), mode)(lam), truth, rtol=1e-9)
    np.testing.assert_allclose(in_mode(lambda lam: jvp(at, lam, tf.constant(0.5, _DOUBLE)), mode)(lam),
                               0.5 * truth, rtol=1e-9)
    loss = lambda f: lambda lam: tf.reduce_sum((f(lam) - target) ** 2)  # noqa: E731
    for got, want in zip(in_mode(lambda lam: gradient_and_second(loss(at), lam), mode)(lam),
                         gradient_and_second(loss(_closed_form), lam), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-8)
    one = tf.constant(1.0, _DOUBLE)
    forward_over = lambda inner: in_mode(lambda lam: jvp(inner, lam, one), mode)(lam)  # noqa: E731
    if mode != "eager" and solve is _cg:  # TensorFlow cannot build a graph's while_loop under a tape and an
        with pytest.raises(TypeError, match="variant"):  # accumulator (nor under two), and says so
            forward_over(lambda lam: vjp(loss(at), lam))
        return
    np.testing.assert_allclose(forward_over(lambda lam: vjp(loss(at), lam)),
                               gradient_and_second(loss(_closed_form), lam)[1], rtol=1e-8)
    with pytest.raises(Exception, match="forward over forward"):  # it gave 0: refused
        forward_over(lambda lam: jvp(loss(at), lam, one))


def test_a_zero_upstream_or_tangent_gives_zero_where_the_solver_gives_nan_at_zero(mode):
    """A solve is linear: at b = 0 it is 0, and the declared solve does not run the solver there (five CG steps
    give 0/0). The truth: autodiff of the closed form, whose derivative along a zero is 0."""
    assert np.isnan(_cg_five_steps(lambda v: v, tf.zeros(5, _DOUBLE))).all()  # the solver itself, at b = 0
    ridge = sgm.custom_root(_optimality, _cg_five_steps)(lambda init, lam: _closed_form(lam))
    at = lambda lam: ridge(tf.zeros(5, _DOUBLE), lam)  # noqa: E731
    lam, zero = tf.constant(2.0, _DOUBLE), tf.constant(0.0, _DOUBLE)
    np.testing.assert_array_equal(in_mode(lambda lam: vjp(at, lam, tf.zeros(5, _DOUBLE)), mode)(lam), 0.0)
    np.testing.assert_array_equal(in_mode(lambda lam: jvp(at, lam, zero), mode)(lam), np.zeros(5))
    np.testing.assert_allclose(in_mode(lambda lam: vjp(at, lam), mode)(lam),  # and a non-zero one as before
                               tf.reduce_sum(_jacobian(_closed_form, lam)), rtol=1e-9)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_a_zero_upstream_on_one_replica_gives_zero_there_under_a_mirrored_strategy(traced):
    """Two replicas, one whose upstream is zero (a loss that does not read z there) and one whose is ones: 0 on the
    first, the closed form's gradient on the second; each replica's declared solve checks its own b."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ridge = sgm.custom_root(_optimality, _cg_five_steps)(lambda init, lam: _closed_form(lam))

    def replica(lam):
        scale = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, _DOUBLE)
        return vjp(lambda lam: ridge(tf.zeros(5, _DOUBLE), lam), lam, scale * tf.ones(5, _DOUBLE))

    run = lambda lam: strategy.run(replica, (lam,))  # noqa: E731
    got = strategy.experimental_local_results((tf.function(run) if traced else run)(tf.constant(2.0, _DOUBLE)))
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_allclose(got[1], tf.reduce_sum(_jacobian(_closed_form, tf.constant(2.0, _DOUBLE))), rtol=1e-9)


def test_a_zero_upstream_in_a_tf1_graph_gives_zero():
    ridge = sgm.custom_root(_optimality, _cg_five_steps)(lambda init, lam: _closed_form(lam))
    with tf.Graph().as_default():
        lam = tf.compat.v1.placeholder(_DOUBLE, shape=[])
        gradient = tf.gradients(ridge(tf.zeros(5, _DOUBLE), lam), lam, grad_ys=tf.zeros(5, _DOUBLE))[0]
        with tf.compat.v1.Session() as session:
            assert session.run(gradient, {lam: 2.0}) == 0.0


# ---------------------------------------------------------------- the declared-linear solve (not public)
_A = np.array([[4.0, 1.0, 0.5], [1.0, 5.0, 1.0], [0.0, 1.0, 3.0]])


def _jacobi(matvec, b):
    """Jacobi's iteration to a tolerance read in Python, eagerly: no graph can hold it."""
    diagonal = tf.stack([tf.tensordot(e, matvec(e), 1) for e in tf.unstack(tf.eye(3, dtype=b.dtype))])
    x = tf.zeros_like(b)
    while float(tf.norm(matvec(x) - b)) > 1e-14 * float(tf.norm(b)):
        x += (b - matvec(x)) / diagonal
    return x


def _matvec(a):
    return lambda v: tf.linalg.matvec(a, v)


def test_linear_solve_with_a_python_loop_eagerly_in_both_modes_and_in_the_operator():
    """x = A⁻¹b: dx/db = A⁻¹ by a tape and an accumulator, the first derivative of |x|² in A against
    tf.linalg.solve differentiated, and its second derivative in A refused (x is held in dA·x)."""
    a, b = tf.constant(_A), tf.constant([1.0, -2.0, 0.5], _DOUBLE)
    solved = lambda a, b: linear_solve(_matvec(a), b, _jacobi, transpose_solve=_jacobi)  # noqa: E731
    plain = lambda a, b: tf.linalg.solve(a, b[:, None])[:, 0]  # noqa: E731
    np.testing.assert_allclose(solved(a, b), plain(a, b), rtol=1e-13)
    np.testing.assert_allclose(_jacobian(lambda b: solved(a, b), b, pfor=False), np.linalg.inv(_A), rtol=1e-12)
    np.testing.assert_allclose(jvp(lambda b: solved(a, b), b, tf.constant([0.0, 1.0, 0.0], _DOUBLE)),
                               np.linalg.inv(_A)[:, 1], rtol=1e-12)
    squared = lambda f: lambda a: tf.reduce_sum(f(a, b) ** 2)  # noqa: E731
    np.testing.assert_allclose(vjp(squared(solved), a), vjp(squared(plain), a), rtol=1e-12)
    np.testing.assert_allclose(jvp(squared(solved), a, tf.ones_like(a)), jvp(squared(plain), a, tf.ones_like(a)),
                               rtol=1e-12)
    with pytest.raises(Exception, match="second derivative in the matrix"):  # x is held in dA·x: refused
        gradient_and_second(squared(solved), a)
    with pytest.raises(ValueError, match="transpose_solve"), tf.GradientTape() as tape:
        tape.watch(b)
        tape.gradient(linear_solve(_matvec(a), b, _jacobi), b)


def _solved_by(solve_in_grad_fn):
    @sgm.custom_gradient
    def f(x):  # y = A⁻¹x, its VJP A⁻ᵀ·upstream by an iterative solve
        return tf.linalg.solve(tf.constant(_A), x[:, None])[:, 0], solve_in_grad_fn
    return f


def test_a_python_loop_solve_inside_a_grad_fn_is_embedded_through_linear_solve():
    """Eagerly the grad_fn is traced to read its ops, where a Python loop cannot run: the declared solve stands
    for it. Without linear_solve the same grad_fn cannot be proven linear from its ops."""
    x, truth = tf.constant([1.0, -2.0, 0.5], _DOUBLE), np.linalg.inv(_A)
    transposed = _matvec(tf.constant(_A.T))
    declared = _solved_by(lambda ct: linear_solve(transposed, ct, _jacobi, transpose_solve=_jacobi))
    np.testing.assert_allclose(_jacobian(declared, x, pfor=False), truth, rtol=1e-12)
    np.testing.assert_allclose(jvp(declared, x, tf.constant([1.0, 0.0, 0.0], _DOUBLE)), truth[:, 0], rtol=1e-12)


def test_a_while_loop_solve_inside_a_grad_fn_is_embedded_through_linear_solve(mode):
    x, truth = tf.constant([1.0, -2.0, 0.5], _DOUBLE), np.linalg.inv(_A)
    transposed = _matvec(tf.constant(_A.T))
    declared = _solved_by(lambda ct: linear_solve(transposed, ct, _richardson,
                                                      transpose_solve=_richardson))
    np.testing.assert_allclose(in_mode(lambda x: _jacobian(declared, x, pfor=False), mode)(x), truth, rtol=1e-10)
    tangent = tf.constant([0.0, 0.0, 1.0], _DOUBLE)
    np.testing.assert_allclose(in_mode(lambda x: jvp(declared, x, tangent), mode)(x), truth[:, 2], rtol=1e-10)
    with pytest.raises(ValueError, match="cannot be embedded"):
        in_mode(lambda x: jvp(_solved_by(lambda ct: _richardson(transposed, ct)), x, tangent), mode)(x)


def test_linear_solve_in_a_tf1_graph_with_tf_gradients():
    with tf.Graph().as_default():
        b = tf.constant([1.0, -2.0, 0.5], _DOUBLE)
        x = linear_solve(_matvec(tf.constant(_A)), b, _richardson, transpose_solve=_richardson)
        rows = [tf.gradients(x[k], b)[0] for k in range(3)]
        with tf.compat.v1.Session() as session:
            np.testing.assert_allclose(session.run(tf.stack(rows)), np.linalg.inv(_A), rtol=1e-10)


def test_a_declared_solve_whose_operator_reads_the_upstream_is_refused_naming_it():
    """Declared linear in b alone: an operator made from the upstream makes grad_fn nonlinear in it."""
    @sgm.custom_gradient
    def f(x):
        return 2.0 * x, lambda ct: linear_solve(lambda v: (1.0 + ct * ct) * v, ct, _richardson, symmetric=True)

    x = tf.constant([1.0, -2.0, 0.5], _DOUBLE)
    with pytest.raises(ValueError, match="matvec reads the upstream"):
        tf.function(lambda x: jvp(f, x, tf.ones_like(x)))(x)
    with pytest.raises(ValueError, match="matvec reads the upstream"):  # eagerly, read where the solve stands in
        jvp(f, x, tf.ones_like(x))


def test_a_root_with_a_declared_solve_is_refused_as_pfors_loop_body(mode):
    """pfor converts the declared solve's op and drops its registered gradient: a gradient through the map gave a
    wrong derivative (zeros under tf.function), so the call is refused there, naming the way out."""
    ridge = sgm.custom_root(_optimality, _cg)(lambda init, lam: _closed_form(lam))
    lams = tf.constant([0.5, 2.0, 3.0], _DOUBLE)
    mapped = lambda lams: tf.vectorized_map(lambda lam: tf.reduce_sum(ridge(tf.zeros(5, _DOUBLE), lam)), lams)  # noqa: E731
    for refused in (lambda lams: vjp(mapped, lams),
                    lambda lams: _jacobian(lambda lam: ridge(tf.zeros(5, _DOUBLE), lam), lams[0])):
        with pytest.raises(Exception) as raised:
            in_mode(refused, mode)(lams)
        chain = [raised.value]
        while chain[-1].__cause__ or chain[-1].__context__:  # (a jacobian by pfor wraps it in its own error)
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        assert any("pfor's loop body" in str(error) for error in chain), chain
