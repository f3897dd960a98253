"""Issue 58 on PyTorch: ``order=2`` keeps ``order=1``'s first derivatives bit for bit, and its second derivative is
the Jacobian of the declared gradient, as PyTorch's double backward of the same rule written as an
``autograd.Function`` gives it (unsymmetrized), eagerly, under ``torch.func`` and under ``torch.compile``.

The rules, restated: a norm guarded at the zero vector, a softplus whose rule selects between two branches (one
overflowing where it is not taken), a logsumexp with an infinite operand, and a cross-entropy whose declared
gradient w.r.t. the targets assumes they sum to one (no gradient of a function: its Jacobian is not symmetric).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stopgrad_math.torch as sgm  # noqa: E402


def guarded_norm(x):
    norm = torch.sqrt(torch.sum(x * x))
    positive = norm > 0
    return norm, lambda ct: (ct * torch.where(positive, x / torch.where(positive, norm, 1.0), 0.0),)


def selected_softplus(x):  # the rule's untaken branch, exp(x), overflows at x = 100 in float32
    return (torch.nn.functional.softplus(x).sum(),
            lambda ct: (ct * torch.where(x < -9.0, torch.exp(x), torch.sigmoid(x)),))


def logsumexp(x):
    y = torch.log(torch.sum(torch.exp(x)))
    return y, lambda ct: (ct * torch.exp(x - y),)


def cross_entropy(z):  # logits z[:3], targets z[3:]; d/dtargets = −log_softmax, whatever the targets sum to
    log_p = torch.log_softmax(z[:3], 0)
    return -(z[3:] * log_p).sum(), lambda ct: (torch.cat([ct * (log_p.exp() - z[3:]), -ct * log_p]),)


def elementwise_softplus(x):  # a vector output: J·v is the embedded linear map, not vjp(1)
    return (torch.nn.functional.softplus(x),
            lambda ct: (ct * torch.where(x < -9.0, torch.exp(x), torch.sigmoid(x)),))


def as_function(rule):
    """The rule as an autograd.Function whose backward is the VJP: the anchor (double backward differentiates the
    backward's ops, forward mode is absent)."""
    class Rule(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return rule(x)[0]

        @staticmethod
        def backward(ctx, ct):
            (x,) = ctx.saved_tensors
            return rule(x)[1](ct)[0]

    return Rule.apply


def _backward(fn, x):
    x = x.clone().requires_grad_(True)
    fn(x).sum().backward()
    return x.grad


def _autograd_grad(fn, x):
    return torch.autograd.grad(fn(x), x)[0]


FIRST_DERIVATIVES = {  # of a function with a scalar value
    "backward": _backward,
    "autograd.grad": lambda fn, x: _autograd_grad(fn, x.clone().requires_grad_(True)),
    "func.grad": lambda fn, x: torch.func.grad(fn)(x),
    "func.jacrev": lambda fn, x: torch.func.jacrev(fn)(x),
    "func.jacfwd": lambda fn, x: torch.func.jacfwd(fn)(x),
    "func.vmap(grad)": lambda fn, x: torch.func.vmap(torch.func.grad(fn))(x[None])[0],
    "grad under an outer jvp": lambda fn, x: torch.func.jvp(torch.func.grad(fn), (x,), (torch.ones_like(x),))[0],
    "compiled backward": lambda fn, x: _backward(torch.compile(fn, fullgraph=True), x),
    "compiled func.grad": lambda fn, x: torch.compile(torch.func.grad(fn), fullgraph=True)(x),
}
POINTS = {
    "guarded norm at zero": (guarded_norm, [0.0, 0.0, 0.0]),
    "guarded norm": (guarded_norm, [3.0, 4.0, 0.0]),
    "selected softplus at 100": (selected_softplus, [100.0]),
    "selected softplus at -20": (selected_softplus, [-20.0]),
    "logsumexp with +inf": (logsumexp, [0.0, np.inf, 1.0]),
}


def bits(tensor):
    return tensor.detach().numpy().view(np.uint32)


@pytest.mark.parametrize("mode", FIRST_DERIVATIVES)
@pytest.mark.parametrize("point", POINTS)
def test_order_2_gives_order_1s_first_derivative_bit_for_bit(point, mode):
    """Under an outer derivative order=1 raises (that is a second derivative), so there the first derivative is
    compared with order=1's by the same transform alone; the rule by hand is the truth for all of them, sign of
    zero included (order=1's identity gives −0.0 where the rule gives +0.0; order=2 gives the rule's, as the
    Function's backward does)."""
    rule, x = POINTS[point]
    x = torch.tensor(x, dtype=torch.float32)
    torch._dynamo.reset()
    alone = "func.grad" if mode == "grad under an outer jvp" else mode
    first = FIRST_DERIVATIVES[alone](sgm.custom_gradient(rule, order=1), x)
    second = FIRST_DERIVATIVES[mode](sgm.custom_gradient(rule, order=2), x)
    np.testing.assert_array_equal(second.detach().numpy(), first.detach().numpy())  # (−0.0 == +0.0, NaN == NaN)
    if mode != "func.jacfwd":  # (forward mode's J·e_k meets a NaN of J at every element, at both orders)
        declared = rule(x)[1](torch.ones(()))[0].numpy()
        np.testing.assert_array_equal(second.detach().numpy(), declared)
        np.testing.assert_array_equal(np.signbit(second.detach().numpy()) | np.isnan(declared),
                                      np.signbit(declared) | np.isnan(declared))


@pytest.mark.parametrize("point", POINTS)
def test_the_first_derivative_is_the_functions_backward_bit_for_bit_but_nan_payloads(point):
    rule, x = POINTS[point]
    x = torch.tensor(x, dtype=torch.float32)
    ours, theirs = _backward(sgm.custom_gradient(rule, order=2), x), _backward(as_function(rule), x)
    np.testing.assert_array_equal(ours.isnan().numpy(), theirs.isnan().numpy())
    np.testing.assert_array_equal(bits(ours)[~ours.isnan().numpy()], bits(theirs)[~theirs.isnan().numpy()])


def _backward_under_a_dual_level(fn, x):
    """Reverse mode while a forward-mode level is open: eagerly, the carrier's route rather than the one node
    (``recorded_term``) that serves reverse mode alone."""
    with torch.autograd.forward_ad.dual_level():
        return _backward(fn, x)


def test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows():
    x = torch.tensor([100.0, -20.0, 0.0, 88.0])
    want = torch.where(x < -9.0, torch.exp(x), torch.sigmoid(x))
    for way in (lambda fn: _backward(fn, x), lambda fn: _backward_under_a_dual_level(fn, x),
                lambda fn: torch.func.jvp(fn, (x,), (torch.ones(4),))[1],
                lambda fn: torch.func.jacfwd(fn)(x).diagonal(), lambda fn: torch.func.vmap(torch.func.grad(fn))(x)):
        first, second = (way(sgm.custom_gradient(elementwise_softplus, order=order)) for order in (1, 2))
        np.testing.assert_array_equal(second.numpy(), first.numpy())
        np.testing.assert_array_equal(bits(second), bits(want))


def _double_backward(fn, x):
    """The Jacobian of fn's gradient by create_graph, row by row (row i: the derivative of gradient i)."""
    x = x.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(fn(x), x, create_graph=True)
    return torch.stack([torch.autograd.grad(gradient[i], x, retain_graph=True)[0] for i in range(x.numel())])


SECOND_DERIVATIVES = {  # each the Jacobian of the gradient, row i the derivative of gradient i
    "create_graph": _double_backward,
    "func.hessian": lambda fn, x: torch.func.hessian(fn)(x),
    "func.jacfwd(grad)": lambda fn, x: torch.func.jacfwd(torch.func.grad(fn))(x),
    "func.jacrev(grad)": lambda fn, x: torch.func.jacrev(torch.func.grad(fn))(x),
    "func.jacrev(jacfwd)": lambda fn, x: torch.func.jacrev(torch.func.jacfwd(fn))(x),
    "func.vmap(hessian)": lambda fn, x: torch.func.vmap(torch.func.hessian(fn))(x[None])[0],
    "compiled func.hessian": lambda fn, x: torch.compile(torch.func.hessian(fn), fullgraph=True)(x),
}


def finite_differences_of(gradient, x, step=1e-6):
    """The Jacobian of a declared gradient by central differences in float64, row i the derivative of entry i."""
    columns = [(gradient(x + step * e) - gradient(x - step * e)) / (2 * step) for e in torch.eye(x.numel(),
                                                                                               dtype=x.dtype)]
    return torch.stack(columns, dim=-1)


@pytest.mark.parametrize("way", SECOND_DERIVATIVES)
def test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized(way):
    """The Function's double backward and finite differences of the rule give the non-symmetric Jacobian; order=2
    gives it in every way (it gave the average of it and its transpose)."""
    z = torch.tensor([1.0, 2.0, 0.5, 0.2, 0.5, 0.3], dtype=torch.float64)
    truth = finite_differences_of(lambda z: cross_entropy(z)[1](torch.ones((), dtype=z.dtype))[0], z)
    anchor = _double_backward(as_function(cross_entropy), z)
    torch.testing.assert_close(anchor, truth, rtol=0, atol=1e-8)
    torch._dynamo.reset()
    ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(cross_entropy, order=2), z)
    torch.testing.assert_close(ours, anchor, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(ours, ours.T, atol=0.1)


@pytest.mark.parametrize("way", ["create_graph", "func.hessian", "func.jacrev(grad)"])
def test_second_derivatives_of_the_guarded_rules_against_the_functions_double_backward(way):
    """Reverse over reverse differentiates the rule as the Function's double backward does (at the zero vector the
    guarded norm's rule has no derivative: NaN, from 0·∞ through the norm's sqrt); forward over reverse as
    torch.func.jacfwd differentiates the rule (0 there: forward mode masks the branch not taken)."""
    for rule, x in [(guarded_norm, [3.0, 4.0, 1.0]), (guarded_norm, [0.0, 0.0, 0.0]),
                    (selected_softplus, [0.7]), (selected_softplus, [-30.0])]:
        x = torch.tensor(x, dtype=torch.float64)
        ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(rule, order=2), x)
        declared = lambda x, rule=rule: rule(x)[1](torch.ones((), dtype=x.dtype))[0]  # noqa: E731
        truth = torch.func.jacfwd(declared)(x) if way == "func.hessian" else _double_backward(as_function(rule), x)
        torch.testing.assert_close(ours, truth, rtol=1e-12, atol=1e-15, equal_nan=True)


def test_the_second_derivative_of_a_vector_output_is_the_jacobian_of_its_declared_jacobian():
    """y = x·flip(x) with the declared J = diag(flip(x)) (half of the product rule): the Hessian of w·y is
    ∂(w ⊙ flip(x))/∂x, which is not symmetric for unequal weights; the Function's double backward gives it."""
    def half_product(x):
        return x * x.flip(0), lambda ct: (ct * x.flip(0),)

    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    w = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    truth = torch.tensor([[0.0, 0.0, 1.0], [0.0, 10.0, 0.0], [100.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(_double_backward(lambda x: (w * as_function(half_product)(x)).sum(), x), truth)
    ours = sgm.custom_gradient(half_product, order=2)
    for way in SECOND_DERIVATIVES:
        torch._dynamo.reset()
        torch.testing.assert_close(SECOND_DERIVATIVES[way](lambda x: (w * ours(x)).sum(), x), truth)


def test_what_f_closes_over_gets_autodiff_with_the_arguments_held():
    """The decided limit (issue 58): the derivative w.r.t. a tensor f closes over is autodiff of f at stop(x), so
    its own derivative w.r.t. x is 0, while ∂/∂θ of the declared ∂/∂x is the rule's."""
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    theta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    h = sgm.custom_gradient(lambda x: (theta * torch.sin(x), lambda ct: (ct * theta * torch.cos(x),)), order=2)
    d_x, d_theta = torch.autograd.grad(h(x), (x, theta), create_graph=True)
    assert float(d_theta) == pytest.approx(float(torch.sin(x)))
    assert float(torch.autograd.grad(d_x, theta, retain_graph=True)[0]) == pytest.approx(float(torch.cos(x)))
    assert d_theta.grad_fn is None  # the limit: sin(stop(x)), a constant to every later derivative


def test_a_sampler_draws_once_at_order_2_as_its_function_does():
    """order=2 runs f twice (the VJP's residuals at x, the value at stop(x)): a forward that samples drew twice,
    so the value used one noise and the gradient another, without a word. The second call now replays the first's
    random state: value, gradient and the generator's state after the call are those of the Function, which runs
    forward once."""
    def noisy(x):
        noise = torch.randn_like(x)
        return x + noise, lambda ct: (ct * noise,)

    class Noisy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            noise = torch.randn_like(x)
            ctx.save_for_backward(noise)
            return x + noise

        @staticmethod
        def backward(ctx, ct):
            return ct * ctx.saved_tensors[0]

    runs = []
    for fn in (Noisy.apply, sgm.custom_gradient(noisy, order=2)):
        torch.manual_seed(0)
        x = torch.zeros(5, requires_grad=True)
        y = fn(x)
        y.sum().backward()
        runs.append((y.detach(), x.grad, torch.rand(3)))  # (what the generator draws next)
    for theirs, ours in zip(*runs, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(runs[1][0], runs[1][1])  # the value's noise is the gradient's
    torch.manual_seed(0)
    noise = torch.randn(5)
    torch.manual_seed(0)
    gradient = torch.func.grad(lambda x: sgm.custom_gradient(noisy, order=2)(x).sum())(torch.zeros(5))
    torch.testing.assert_close(gradient, noise, rtol=0, atol=0)


def test_f_runs_once_at_order_2_unless_it_reads_a_tensor_that_requires_grad_from_elsewhere():
    """order=2 ran f twice eagerly (the VJP's residuals at x, the value at stop(x)): a forward that updates state
    (running statistics) updated it twice. f now runs once where it reads nothing else that requires grad, in
    every mode; where it reads a weight it runs again at stop(x), so that the weight keeps its autodiff."""
    calls = []

    def counted(x):
        calls.append(1)
        return x.sin().sum(), lambda ct: (ct * x.cos(),)

    ours = sgm.custom_gradient(counted, order=2)
    x = torch.tensor([0.3, 0.5], dtype=torch.float64)
    for way in (lambda: ours(x.clone().requires_grad_(True)).backward(), lambda: _double_backward(ours, x),
                lambda: torch.func.grad(ours)(x), lambda: torch.func.hessian(ours)(x),
                lambda: torch.func.vmap(torch.func.grad(ours))(x[None]), lambda: ours(x),
                lambda: _dual_tangent(ours, x, torch.ones_like(x)), lambda: torch.func.jvp(ours, (x,), (x,)),
                lambda: torch.func.jacfwd(ours)(x)):
        calls.clear()
        way()
        assert len(calls) == 1
    weight = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)

    def weighted(x):
        calls.append(1)
        return (weight * x.sin()).sum(), lambda ct: (ct * weight * x.cos(),)

    calls.clear()
    sgm.custom_gradient(weighted, order=2)(x.clone().requires_grad_(True)).backward()
    assert len(calls) == 2
    torch.testing.assert_close(weight.grad, x.sin().sum())


def test_a_weight_that_shares_an_arguments_autograd_node_keeps_its_path_at_order_2():
    """x and w are two outputs of one node (an unbind of a tensor that requires grad): f given x reads w from
    outside. Eagerly, where reverse mode alone can differentiate, whether y reads a weight is read off y's graph
    (``unrecorded.EagerWatch``): x's own edge ends the walk, w's reaches the node through another output, so f runs
    again at stop(x) and w's path to the base is kept. The base's gradient is analytic: x's declared 3·x² (the
    rule, not autodiff of x²·w) and w's Σx²."""
    base = torch.tensor([[0.5, -1.5], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    x, w = (base * 1.0).unbind(0)

    def reads_w(x):
        return (x * x * w).sum(), lambda ct: (ct * 3.0 * x * x,)

    (gradient,) = torch.autograd.grad(sgm.custom_gradient(reads_w, order=2)(x), base)
    x0 = base.detach()[0]
    torch.testing.assert_close(gradient, torch.stack([3.0 * x0 * x0, x0 * x0]), rtol=0, atol=0)


def test_the_eager_watch_follows_no_op_run_in_grad_mode(monkeypatch):
    """At order 2, plainly eager, f's ops in grad mode are not followed one by one (``EagerWatch``): what a forward of
    many ops costs above the forward is the torch function mode's call, whatever it computes. Counted by the
    operands read: the same for a forward of 3 ops and of 30."""
    from stopgrad_math.torch import unrecorded

    def many(count):
        def f(x):
            y = x
            for _ in range(count):
                y = y * 1.0
            return y.sum(), lambda ct: (ct * torch.ones_like(x),)
        return sgm.custom_gradient(f, order=2)

    reads = []
    original = unrecorded.tensors

    def counted(values):
        reads.append(1)
        return original(values)

    counts = []
    for count in (3, 30):
        calls = many(count)
        calls(torch.ones(2, dtype=torch.float64, requires_grad=True)).backward()  # (the proof, made once)
        reads.clear()
        with monkeypatch.context() as patched:
            patched.setattr(unrecorded, "tensors", counted)
            calls(torch.ones(2, dtype=torch.float64, requires_grad=True)).backward()
        counts.append(len(reads))
    assert counts[0] == counts[1]


def test_a_tensor_computed_in_grad_mode_from_one_computed_without_it_is_lost_too():
    """m is computed from x with grad mode off, z = m·x in grad mode: z requires grad (through x) but misses m's
    dependence on x, so a second derivative through the VJP that reads z raises, eagerly and under torch.func, as
    where the VJP reads m itself; the first derivative is the declared one."""
    def forward(x):
        with torch.no_grad():
            m = x * 2.0
        z = m * x
        return z.sum(), lambda ct: (ct * z,)

    f = sgm.custom_gradient(forward, order=2)
    x = torch.tensor([0.5, -1.5], dtype=torch.float64)
    leaf = x.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(f(leaf), leaf, create_graph=True)
    torch.testing.assert_close(gradient, 2.0 * x * x, rtol=0, atol=0)
    with pytest.raises(LookupError, match="grad mode off"):
        torch.autograd.grad(gradient.sum(), leaf)
    with pytest.raises(LookupError, match="grad mode off"):
        torch.func.hessian(f)(x)


def _dual_tangent(fn, x, tangent):
    import torch.autograd.forward_ad as forward_ad

    with forward_ad.dual_level():
        return forward_ad.unpack_dual(fn(forward_ad.make_dual(x, tangent))).tangent


def test_a_closed_over_tensor_with_a_tangent_keeps_it_at_order_2():
    """f reads θ, which carries a forward-mode tangent (or is a torch.func jvp's primal): y must keep θ's tangent,
    so f runs again at stop(x); the JVP is θ̇·Σ sin x + θ·Σ cos x·ẋ."""
    import torch.autograd.forward_ad as forward_ad

    x = torch.tensor([0.3, 0.5], dtype=torch.float64)
    theta = torch.tensor(1.5, dtype=torch.float64)
    want = float(0.25 * x.sin().sum() + 1.5 * x.cos().sum())
    with forward_ad.dual_level():
        moving_theta = forward_ad.make_dual(theta, torch.tensor(0.25, dtype=torch.float64))
        closing = sgm.custom_gradient(lambda x: ((moving_theta * x.sin()).sum(),
                                                 lambda ct: (ct * moving_theta * x.cos(),)), order=2)
        got = forward_ad.unpack_dual(closing(forward_ad.make_dual(x, torch.ones_like(x)))).tangent
    assert float(got) == pytest.approx(want, rel=1e-14)

    def of_both(x, theta):
        return sgm.custom_gradient(lambda x: ((theta * x.sin()).sum(), lambda ct: (ct * theta * x.cos(),)),
                                   order=2)(x)

    _, tangent = torch.func.jvp(of_both, (x, theta), (torch.ones_like(x), torch.tensor(0.25, dtype=torch.float64)))
    assert float(tangent) == pytest.approx(want, rel=1e-14)


def test_a_forward_that_updates_a_running_statistic_updates_it_once_at_order_2():
    running = torch.zeros(2)

    def tracked(x):
        running.mul_(0.9).add_(0.1 * x.detach())
        return x * 3.0, lambda ct: (ct * 3.0,)

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    sgm.custom_gradient(tracked, order=2)(x).sum().backward()
    torch.testing.assert_close(running, torch.tensor([0.1, 0.2]))
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 3.0]))


def _pulled_back(y, pullback):
    return pullback(torch.linspace(-2.0, 2.0, y.numel(), dtype=y.dtype).reshape(y.shape))[0]


_REVERSE_ALONE = {
    "func.grad": lambda fn, x: torch.func.grad(lambda x: fn(x).sum())(x),
    "vmap(func.grad)": lambda fn, x: torch.func.vmap(torch.func.grad(lambda x: fn(x).sum()))(x.reshape(2, -1)),
    "func.vjp": lambda fn, x: _pulled_back(*torch.func.vjp(fn, x)),
    "jacrev": lambda fn, x: torch.func.jacrev(fn)(x),
}


@pytest.mark.parametrize("way", list(_REVERSE_ALONE))
@pytest.mark.parametrize("rule", [elementwise_softplus, selected_softplus, logsumexp])
def test_under_one_reverse_transform_alone_f_runs_at_stop_x_with_the_watched_calls_bits(rule, way, monkeypatch):
    """Issue 56: under one grad or vjp transform (vmaps around or inside it), nothing under the wrappers requiring
    grad, no second derivative can be taken, so order=2 runs f once at stop(x), as order=1 does, without the
    watch of what f computes: what the VJP closes over has the same values, and the first derivative the same
    bits as where f runs at x under the watch. A leaf requiring grad under the wrappers runs f at x."""
    from stopgrad_math.torch import eager_fast_path

    seen = []

    def spied(x):
        seen.append(x.requires_grad)
        return rule(x)

    ours = sgm.custom_gradient(spied, order=2)
    x = torch.tensor([-3.0, -0.5, 0.0, 0.25, 2.0, 40.0], dtype=torch.float64)
    fast = _REVERSE_ALONE[way](ours, x)
    assert seen and not any(seen)  # x stopped in f
    seen.clear()
    monkeypatch.setattr(eager_fast_path, "reverse_transforms_alone", lambda *a: False)
    watched = _REVERSE_ALONE[way](ours, x)
    assert seen and all(seen)  # x at the transform's level in f
    np.testing.assert_array_equal(fast.numpy().view(np.int64), watched.numpy().view(np.int64))
    monkeypatch.undo()
    seen.clear()
    leaf = x.clone().requires_grad_(True)
    _REVERSE_ALONE[way](ours, leaf)
    assert seen and all(seen)


def test_the_operands_read_off_directly_are_pytrees_tensors_in_order():
    """``unrecorded.tensors`` skips pytree's walk for an op's usual operands (issue 75's eager cost); over every kind
    of value an op or a Function is called with, its answer is the walk's, tensor for tensor."""
    from collections import namedtuple

    from torch.utils import _pytree as pytree

    from stopgrad_math.torch import unrecorded

    pair = namedtuple("pair", "a b")
    a, b = torch.ones(2), torch.nn.Parameter(torch.zeros(3))
    cases = [(a, 2, 0.5, None, "mean", torch.float32), (a, b), (a, (True, False)), (a, torch.Size([2])),
             (pair(a, b),), ([a, b], 1), ({"weight": b}, a), ((a, (b,)),), (torch.device("cpu"), 3j), ()]
    for values in cases:
        want = [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
        got = unrecorded.tensors(values)
        assert len(got) == len(want) and all(g is w for g, w in zip(got, want, strict=True)), values
