"""A forward that draws random numbers (a perturbed top-k, a noisy scale): the value and the derivative are one
draw's, in every mode, both forms, both orders, eager and compiled, or a clear error; never the derivative of
another draw.

The truth is the rule's Jacobian at the noise drawn from the same seed, computed here apart from any decorator.
Compiled, Inductor draws as eager code does (``fallback_random``), so the same seed is the same noise; where a
call falls back to ``torch.autograd.Function`` the check is that value and gradient agree (a noisy scale at 1,
whose value is its gradient)."""

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch_modes import ours  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.shared.linearity import NotEmbeddable  # noqa: E402

SAMPLES, K, SIGMA, SEED = 4, 2, 0.5, 3
X = torch.tensor([0.3, -0.2, 0.1, 0.05], dtype=torch.float64)
W = torch.tensor([1.0, 2.0, -3.0, 4.0], dtype=torch.float64)  # a cotangent
V = torch.tensor([0.5, -1.0, 2.0, 1.5], dtype=torch.float64)  # a tangent


def _draw(x):
    """The top-k indicators of each perturbed copy of x, and the noise that perturbed it."""
    noise = torch.randn(SAMPLES, *x.shape, dtype=x.dtype)
    chosen = (x + SIGMA * noise).topk(K, dim=-1).indices
    return torch.zeros_like(noise).scatter(-1, chosen, 1.0), noise


def _truth():
    """The value and Jacobian of the seed's draw: J = E[indicators ⊗ noise] / σ (Berthet et al.'s estimator)."""
    torch.manual_seed(SEED)
    indicators, noise = _draw(X)
    return indicators.mean(0), indicators.T @ noise / (SAMPLES * SIGMA)


class PerturbedTopK(torch.autograd.Function):
    """As written against torch.autograd.Function: the draw saved for the backward."""

    @staticmethod
    def forward(ctx, x):
        indicators, noise = _draw(x)
        ctx.save_for_backward(indicators, noise)
        return indicators.mean(0)

    @staticmethod
    def backward(ctx, grad):
        indicators, noise = ctx.saved_tensors
        return ((indicators @ grad)[:, None] * noise).mean(0) / SIGMA


class OursTopK(sgm.Function):
    forward = PerturbedTopK.forward
    backward = PerturbedTopK.backward


class OursTopKOrder1(OursTopK):
    order = 1


def _decorated(order):
    @sgm.custom_gradient(order=order)
    def perturbed_top_k(x):
        indicators, noise = _draw(x)
        return indicators.mean(0), lambda grad: ((indicators @ grad)[:, None] * noise).mean(0) / SIGMA

    return perturbed_top_k


FORMS = {"Function order=2": OursTopK.apply, "Function order=1": OursTopKOrder1.apply,
         "decorator order=2": _decorated(2), "decorator order=1": _decorated(1)}


def _reverse(fn, x):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    (y * W).sum().backward()
    return y.detach(), x.grad


def _forward(fn, x):
    with forward_ad.dual_level():
        y, tangent = forward_ad.unpack_dual(fn(forward_ad.make_dual(x, V)))
    return y, tangent


REVERSE = {
    "backward": _reverse,
    "autograd.grad(create_graph)": lambda fn, x: (
        lambda x: (lambda y: (y.detach(), torch.autograd.grad((y * W).sum(), x, create_graph=True)[0]))(fn(x)))(
        x.clone().requires_grad_(True)),
    "func.vjp": lambda fn, x: (lambda y, pull: (y, pull(W)[0]))(*torch.func.vjp(fn, x)),
}
FORWARD = {
    "forward_ad": _forward,
    "func.jvp": lambda fn, x: torch.func.jvp(fn, (x,), (V,)),
}


@pytest.mark.parametrize("mode", REVERSE)
@pytest.mark.parametrize("form", ["torch.autograd.Function", *FORMS])
def test_reverse_mode_is_the_values_draws_eagerly(form, mode):
    fn = PerturbedTopK.apply if form == "torch.autograd.Function" else FORMS[form]
    if form == "torch.autograd.Function" and mode == "func.vjp":
        pytest.skip("a Function without setup_context does not run under torch.func")
    torch.manual_seed(SEED)
    y, gradient = REVERSE[mode](fn, X)
    value, jacobian = _truth()
    assert torch.equal(y, value)
    torch.testing.assert_close(gradient, jacobian.T @ W, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", FORWARD)
@pytest.mark.parametrize("form", FORMS)
def test_forward_mode_is_the_values_draws_eagerly(form, mode):
    torch.manual_seed(SEED)
    y, tangent = FORWARD[mode](FORMS[form], X)
    value, jacobian = _truth()
    assert torch.equal(y, value)
    torch.testing.assert_close(tangent, jacobian @ V, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_a_jacobian_by_torch_func_is_the_values_draws(form):
    torch.manual_seed(SEED)
    jacobian = torch.func.jacrev(FORMS[form])(X)
    torch.testing.assert_close(jacobian, _truth()[1], rtol=1e-12, atol=1e-12)


@pytest.fixture
def eager_random():
    """Inductor draws as eager code does, so a seed gives compiled code the noise it gives the truth."""
    import torch._inductor.config

    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("form", ["torch.autograd.Function", "Function order=1", "decorator order=1"])
def test_compiled_reverse_mode_is_the_values_draws(form, eager_random):
    """At order 1 the vjp is embedded as Dynamo traces it, reading the noise the value was computed from (the
    proof's graphs, holding f's ops, would draw again)."""
    fn = PerturbedTopK.apply if form == "torch.autograd.Function" else FORMS[form]
    torch.manual_seed(SEED)
    y, gradient = _reverse(torch.compile(fn, fullgraph=True), X)
    value, jacobian = _truth()
    assert torch.equal(y, value)
    torch.testing.assert_close(gradient, jacobian.T @ W, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["forward_ad", "func.jvp", "func.grad"])
@pytest.mark.parametrize("form", ["Function order=1", "decorator order=1"])
def test_compiled_forward_mode_and_transforms_are_the_values_draws_at_order_1(form, mode, eager_random):
    fn = FORMS[form]
    run = (lambda x: torch.func.grad_and_value(lambda x: (fn(x) * W).sum())(x)[::-1]) if mode == "func.grad" \
        else (lambda x: FORWARD[mode](fn, x))
    torch.manual_seed(SEED)
    y, derivative = torch.compile(run, fullgraph=True)(X)
    value, jacobian = _truth()
    assert torch.equal(y, (value * W).sum() if mode == "func.grad" else value)
    torch.testing.assert_close(derivative, jacobian.T @ W if mode == "func.grad" else jacobian @ V,
                               rtol=1e-12, atol=1e-12)


class NoisyScale(sgm.Function):
    """x times a standard normal draw: at x = 1 its value is its gradient."""

    @staticmethod
    def forward(ctx, x):
        noise = torch.randn_like(x)
        ctx.save_for_backward(noise)
        return x * noise

    @staticmethod
    def backward(ctx, grad):
        (noise,) = ctx.saved_tensors
        return grad * noise


def test_compiled_a_function_at_order_2_falls_back_with_the_values_draw():
    """Compiled at order 2 the vjp's graphs would draw again: the class falls back to torch.autograd.Function,
    whose backward reads the value's draw (under the default Inductor, whose draws are not eager code's)."""
    torch._dynamo.reset()
    x = torch.ones(6, requires_grad=True)
    y = torch.compile(NoisyScale.apply, fullgraph=True)(x)
    y.sum().backward()
    assert torch.equal(y.detach(), x.grad)


@pytest.mark.parametrize("mode", ["backward", "func.grad", "forward_ad"])
def test_compiled_the_decorator_at_order_2_raises_naming_the_draw_and_order_1(mode):
    torch._dynamo.reset()
    fn = _decorated(2)
    run = {"backward": lambda x: _reverse(torch.compile(fn, fullgraph=True), x),
           "func.grad": torch.compile(lambda x: torch.func.grad(lambda x: (fn(x) * W).sum())(x), fullgraph=True),
           "forward_ad": torch.compile(lambda x: _forward(fn, x), fullgraph=True)}[mode]
    with pytest.raises(Exception) as raised:
        run(X)
    error = ours(raised.value, NotEmbeddable)
    assert isinstance(error, NotEmbeddable)
    assert "random draw (aten::randn)" in str(error) and "order=1" in str(error)


def _dropped(order, training):
    """Dropout whose VJP reads the kept mask: at x = 1 the value is the gradient (0, or 1/(1-p))."""
    @sgm.custom_gradient(order=order)
    def dropped(x):
        y = torch.nn.functional.dropout(x, 0.5, training=training)
        return y, lambda grad: grad * (y != 0) * 2.0 if training else grad

    return dropped


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("training", [True, False])
def test_compiled_dropout_is_one_mask_and_dropout_off_draws_nothing(training, order):
    """A dropout (an op tagged as seeded) is a draw; one off (``training=False``; an attention with dropout 0) draws
    nothing and is embedded at either order."""
    torch._dynamo.reset()
    x = torch.ones(64, requires_grad=True)
    run = torch.compile(_dropped(order, training), fullgraph=True)
    if training and order == 2:
        with pytest.raises(Exception, match="random draw"):
            run(x)
        return
    y = run(x)
    y.sum().backward()
    assert torch.equal(y.detach(), x.grad)
    assert training == bool((x.grad == 0).any())
