"""@stopgrad_math.torch.custom_gradient (the decorator form) in every PyTorch mode, against independent truths:
analytic derivatives, PyTorch's autodiff of the closed form, and its autodiff of stable formulas. Under
torch.compile: test_decorator_compiled.py, and here where a test's body is the same (CALLS)."""

import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch_modes import COMPILED_MODES, MODES, bits, ours  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

X = torch.tensor([-1.0, 0.0, 2.0, 100.0])
FIRST_ORDER_MODES = {k: v for k, v in MODES.items() if k != "autograd.grad(create_graph)"}


@sgm.custom_gradient
def log1pexp(x):
    e = torch.exp(x)
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), lambda ct: ct * (1 - 1 / (1 + e))


@pytest.mark.parametrize("mode", FIRST_ORDER_MODES)
def test_log1pexp_has_the_vjps_derivative_in_every_mode(mode):
    torch.testing.assert_close(MODES[mode](log1pexp, X), torch.sigmoid(X), rtol=1e-6, atol=0)


def test_an_autograd_function_with_a_backward_alone_has_no_forward_mode_where_the_decorator_has():
    class Log1pexp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.logaddexp(x, torch.zeros(()))

        @staticmethod
        def backward(ctx, ct):
            return ct * torch.sigmoid(ctx.saved_tensors[0])

    with pytest.raises(NotImplementedError):
        MODES["forward_ad"](Log1pexp.apply, X)
    torch.testing.assert_close(MODES["forward_ad"](log1pexp, X), torch.sigmoid(X))


@pytest.mark.parametrize("wrap", ["plain", "forward_ad", "func.vmap", "func.jvp"])
def test_the_value_is_y_bit_for_bit(wrap):
    @sgm.custom_gradient
    def f(x):
        y = torch.stack([x * -1.0, torch.exp(x), x / 0.0])  # −0.0, inf and NaN among the values
        return y, lambda ct: ct[0] * -1.0 + ct[1] * torch.exp(x)

    x = torch.tensor([0.0, 1.5, -2.0, 800.0])
    expected = f.undecorated(x)[0]
    if wrap == "plain":
        got = f(x)
    elif wrap == "forward_ad":
        with forward_ad.dual_level():
            got = forward_ad.unpack_dual(f(forward_ad.make_dual(x, torch.ones_like(x)))).primal
    elif wrap == "func.vmap":
        got = torch.func.vmap(f, out_dims=1)(x)
    else:
        got = torch.func.jvp(f, (x,), (torch.ones_like(x),))[0]
    np.testing.assert_array_equal(bits(got), bits(expected))


A = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, 1.0]], dtype=torch.float64)


@sgm.custom_gradient
def tanh_of_a_map(x):  # y = tanh(A x), with its VJP written by hand: a full Jacobian
    y = torch.tanh(A @ x)
    return y, lambda ct: A.T @ (ct * (1 - y**2))


def _closed_form(x):
    return torch.tanh(A @ x)


JACOBIANS = {
    "func.jacrev": torch.func.jacrev,
    "func.jacfwd": torch.func.jacfwd,
    "autograd.functional.jacobian": lambda f: lambda x: torch.autograd.functional.jacobian(f, x),
    "autograd.functional.jacobian(forward)": lambda f: lambda x: torch.autograd.functional.jacobian(
        f, x, vectorize=True, strategy="forward-mode"),
}


@pytest.mark.parametrize("way", JACOBIANS)
def test_a_full_jacobian_against_autodiff_of_the_closed_form(way):
    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64)
    torch.testing.assert_close(JACOBIANS[way](tanh_of_a_map)(x), torch.func.jacrev(_closed_form)(x))


def test_vmap_of_a_full_jacobian():
    xs = torch.tensor([[0.3, -0.8, 1.1], [1.0, 0.5, -2.0]], dtype=torch.float64)
    got = torch.func.vmap(torch.func.jacfwd(tanh_of_a_map))(xs)
    torch.testing.assert_close(got, torch.func.vmap(torch.func.jacrev(_closed_form))(xs))


def test_nests_of_arguments_and_outputs_and_constants_passed_through():
    @sgm.custom_gradient
    def f(p, n, label):
        assert n == 3 and label == "scale"
        a, b = p["a"], p["b"]
        return (a * b, {"sum": a + b}), lambda ct: ({"a": ct[0] * b + ct[1]["sum"], "b": ct[0] * a + ct[1]["sum"]},
                                                    None, None)

    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])

    def total(a, b):
        product, sums = f({"a": a, "b": b}, 3, "scale")
        return (product * 2.0 + sums["sum"]).sum()

    for grad in (torch.func.grad(total, argnums=(0, 1)), torch.func.jacfwd(total, argnums=(0, 1))):
        got = grad(a, b)
        torch.testing.assert_close(got, (2.0 * b + 1.0, 2.0 * a + 1.0))


def test_none_cotangents_and_an_integer_argument_are_constants():
    @sgm.custom_gradient
    def f(x, k):
        return x * k, lambda ct: (ct * k, None)

    x, k = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3, 4])
    f(x, k).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 4.0]))


def test_a_cotangent_for_an_integer_argument_that_is_not_zero_is_refused():
    @sgm.custom_gradient
    def f(x, k):
        return x * k, lambda ct: (ct * k, ct.to(torch.int64))

    with pytest.raises(ValueError, match=r"rounds the cotangent to torch\.int64\), on the path to the cotangent for "
                                         r"args\[1\]"):
        f(torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3, 4]))


def test_an_integer_output_passes_through():
    @sgm.custom_gradient
    def f(x):
        return (x * 2.0, torch.argmax(x)), lambda ct: ct[0] * 2.0

    x = torch.tensor([1.0, 3.0, 2.0], requires_grad=True)
    y, index = f(x)
    y.sum().backward()
    assert int(index) == 1 and x.grad.tolist() == [2.0, 2.0, 2.0]


CALLS = {"eager": lambda fn: fn, "compile(fullgraph)": lambda fn: torch.compile(fn, fullgraph=True)}


@pytest.mark.parametrize("call", CALLS)
def test_module_parameters_and_keyword_arguments_read_inside_f_get_ordinary_autodiff(call):
    """The VJP gives the cotangents of the positional arguments alone; what else f reads (a module's weights, a
    keyword argument) is differentiated by PyTorch's autodiff of y, as anything f closes over."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2).double()

    @sgm.custom_gradient
    def f(x, *, scale):
        y = torch.tanh(layer(x)) * scale
        return y, lambda ct: (ct * scale * (1 - torch.tanh(layer(x)) ** 2)) @ layer.weight

    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    CALLS[call](lambda x, scale: f(x, scale=scale).sum())(x, scale).backward()
    ours = [x.grad, scale.grad, layer.weight.grad, layer.bias.grad]
    for t in (x, scale, layer.weight, layer.bias):
        t.grad = None
    (torch.tanh(layer(x)) * scale).sum().backward()
    for got, truth in zip(ours, [x.grad, scale.grad, layer.weight.grad, layer.bias.grad], strict=True):
        torch.testing.assert_close(got, truth)


@pytest.mark.parametrize("call", CALLS)
def test_a_module_trained_with_an_optimizer_follows_the_closed_forms_training(call):
    def train(activation):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs, targets = torch.randn(32, 2), torch.randn(32, 1)
        loss_of = CALLS[call](lambda: ((model[1](activation(model[0](inputs))) - targets) ** 2).mean())
        for _ in range(20):
            optimizer.zero_grad()
            loss = loss_of()
            loss.backward()
            optimizer.step()
        return loss.detach(), [p.detach() for p in model.parameters()]

    ours, ours_parameters = train(log1pexp)
    truth, truth_parameters = train(torch.nn.functional.softplus)
    torch.testing.assert_close(ours, truth)
    for got, expected in zip(ours_parameters, truth_parameters, strict=True):
        torch.testing.assert_close(got, expected)


NOT_LINEAR = {  # the VJP, and what the ValueError names
    "clamp": (lambda x: lambda ct: (ct * x).clamp(-1.0, 1.0), "clamp"),
    "an added constant": (lambda x: lambda ct: ct * x + 1.0, "add"),
    "the cotangent squared": (lambda x: lambda ct: ct * ct * x, "mul"),
    "abs": (lambda x: lambda ct: (ct * x).abs(), "abs"),
    "division by the cotangent": (lambda x: lambda ct: x / ct, "div"),
    "an op the table lacks": (lambda x: lambda ct: torch.erf(ct) * x, "erf"),
}


@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.grad", "func.jacfwd", "func.vmap(func.grad)"])
@pytest.mark.parametrize("case", NOT_LINEAR)
def test_a_vjp_that_is_not_linear_is_refused_naming_the_op_in_every_mode(case, mode):
    make_vjp, op = NOT_LINEAR[case]

    @sgm.custom_gradient
    def f(x):
        return x * x, make_vjp(x)

    with pytest.raises(ValueError, match=rf"vjp of f .*\b{op}\b.*cotangent for args\[0\]"):
        MODES[mode](f, X[:3].clone())


def test_a_term_that_does_not_depend_on_the_cotangent_is_refused_as_affine():
    @sgm.custom_gradient
    def f(x):
        return x * x, lambda ct: 2.0 * x

    with pytest.raises(ValueError, match="does not depend on the cotangent of y and is not provably zero"):
        f(X.clone().requires_grad_(True))


def test_a_vjp_that_reads_a_value_in_python_is_traced_eagerly_and_refused_under_torch_func_naming_why():
    @sgm.custom_gradient
    def f(x):
        return x * 2.0, lambda ct: ct * 2.0 if bool(x.sum() > 0) else ct * 3.0

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    f(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="may not read a tensor's value in Python"):
        torch.func.grad(lambda x: f(x).sum())(x.detach())


class _TripledWithExtraNones(torch.autograd.Function):
    """A backward that returns more gradients than forward took inputs, the extras None: PyTorch drops them."""

    @staticmethod
    def forward(ctx, x):
        return 2.0 * x

    @staticmethod
    def backward(ctx, g):
        return 3.0 * g, None, None


ALL_MODES = {**MODES, **COMPILED_MODES}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_extra_trailing_none_cotangents_are_dropped_as_pytorch_drops_them(mode):
    """The VJP's (3·ct, None, None) for one argument is its (3·ct,), in every mode, as the Function with that
    backward gives in reverse mode (its truth); the decorator once refused it."""
    tripled = sgm.custom_gradient(lambda x: (2.0 * x, lambda ct: (3.0 * ct, None, None)))
    x = torch.tensor([1.0, -2.0, 0.5])
    torch.testing.assert_close(ALL_MODES[mode](tripled, x), torch.full_like(x, 3.0), rtol=0, atol=0)
    torch.testing.assert_close(ALL_MODES["backward"](_TripledWithExtraNones.apply, x), torch.full_like(x, 3.0),
                               rtol=0, atol=0)


def test_an_extra_cotangent_that_is_not_none_is_refused_as_pytorch_refuses_it():
    f = sgm.custom_gradient(lambda x: (2.0 * x, lambda ct: (3.0 * ct, ct)))
    with pytest.raises(ValueError, match=r"returned 2 cotangents for 1 positional argument"):
        f(torch.ones(2, requires_grad=True))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile(fullgraph)"])
def test_a_backward_with_one_parameter_per_output_is_told_the_vjp_gets_one_tuple(compiled):
    """A Function's backward(dw, dv) for two outputs, passed as the VJP as it is: a TypeError that says the VJP
    gets one tuple of cotangents and how to write it, not Python's bare missing argument; written that way, it
    gives the Function's gradient (3 + 5 along ones)."""
    def backward(dw, dv):
        return 3.0 * dw + 5.0 * dv

    as_is = sgm.custom_gradient(lambda x: ((2.0 * x, 4.0 * x), backward))
    ported = sgm.custom_gradient(lambda x: ((2.0 * x, 4.0 * x), lambda cts: backward(*cts)))

    def gradient(f, x):
        x = x.detach().requires_grad_(True)
        def total(x):
            return sum(y.sum() for y in f(x))

        (torch.compile(total, fullgraph=True) if compiled else total)(x).backward()
        return x.grad

    with pytest.raises(Exception) as raised:  # compiled: Dynamo's own error, with ours as its context
        gradient(as_is, torch.ones(3))
    error = ours(raised.value, TypeError)
    assert isinstance(error, TypeError), raised.value
    assert re.search(r"takes 2 positional parameters.*one: the cotangent of y.*backward\(\*cts\)", str(error))
    torch.testing.assert_close(gradient(ported, torch.ones(3)), torch.full((3,), 8.0), rtol=0, atol=0)


def test_the_wrong_number_of_cotangents_a_wrong_shape_and_a_missing_vjp_are_named():
    def make(vjp):
        return sgm.custom_gradient(lambda x, z: (x * z, vjp))

    x, z = torch.ones(2, requires_grad=True), torch.ones(2)
    with pytest.raises(ValueError, match=r"returned 1 cotangent for 2 positional arguments \(args\[0\], args\[1\]\)"):
        make(lambda ct: ct)(x, z)
    with pytest.raises(ValueError, match=r"shape \(3,\) for args\[0\] of shape \(2,\)"):
        make(lambda ct: (torch.ones(3) * ct.sum(), None))(x, z)
    with pytest.raises(TypeError, match="complex cotangent"):
        make(lambda ct: (ct * 1j, None))(x, z)
    with pytest.raises(TypeError, match=r"must return a pair \(y, vjp\)"):
        sgm.custom_gradient(lambda x: x)(x)


@pytest.mark.parametrize("options, error", [({"order": 3}, ValueError), ({"order": True}, ValueError),
                                            ({"check_linearity": "yes"}, TypeError)])
def test_options_are_checked_when_given(options, error):
    with pytest.raises(error):
        sgm.custom_gradient(**options)


# ---------------------------------------------------------------- second derivatives


def _sin_decorated(order):
    @sgm.custom_gradient(order=order)
    def sin(x):
        return torch.sin(x), lambda ct: ct * torch.cos(x)

    return sin


def _second(way, f, x):
    g = lambda x: torch.exp(f(x)).sum()  # noqa: E731  # exp(sin x): its Hessian needs sin's own second derivative
    if way == "func.hessian":
        return torch.func.hessian(g)(x).diagonal()
    if way == "func.jacfwd(func.grad)":
        return torch.func.jacfwd(torch.func.grad(g))(x).diagonal()
    if way == "func.grad(func.grad)":
        return torch.func.grad(lambda x: torch.func.grad(g)(x).sum())(x)
    x = x.clone().requires_grad_(True)
    first = torch.autograd.grad(g(x), x, create_graph=True)[0]
    return torch.autograd.grad(first.sum(), x)[0]


SECOND = ["func.hessian", "func.jacfwd(func.grad)", "func.grad(func.grad)", "autograd.grad(create_graph)"]
X64 = torch.tensor([0.3, 1.2, -0.7, 2.5], dtype=torch.float64)


def _analytic_second(x):  # d²/dx² exp(sin x) = exp(sin x)·(cos²x − sin x)
    return torch.exp(torch.sin(x)) * (torch.cos(x) ** 2 - torch.sin(x))


@pytest.mark.parametrize("way", SECOND)
def test_order_2_second_derivatives_are_exact(way):
    torch.testing.assert_close(_second(way, _sin_decorated(2), X64), _analytic_second(X64))


@pytest.mark.parametrize("way", SECOND)
def test_order_1_second_derivatives_raise_naming_order_2(way):
    with pytest.raises(LookupError, match=r"order=1.*custom_gradient\(order=2\)"):
        _second(way, _sin_decorated(1), X64)


@pytest.mark.parametrize("mode", MODES)
def test_order_2_first_derivatives_are_the_vjps_in_every_mode(mode):
    torch.testing.assert_close(MODES[mode](_sin_decorated(2), X64), torch.cos(X64))


def test_order_1_first_derivatives_under_an_outer_transform_that_does_not_differentiate_are_exact():
    got = torch.func.vmap(torch.func.grad(lambda x: torch.exp(_sin_decorated(1)(x))))(X64)
    torch.testing.assert_close(got, torch.exp(torch.sin(X64)) * torch.cos(X64))


def _sin_computed_without_grad(order, how):
    """sin whose VJP closes over cos(x) computed as a Function's forward computes: under no_grad (or
    ``inference_mode``), or detached (a stop its author wrote)."""
    @sgm.custom_gradient(order=order)
    def sin(x):
        if how == "detach":
            c = torch.cos(x).detach()
        else:
            with {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(
                    how, lambda: torch.set_grad_enabled(False))():
                c = torch.cos(x)
        return torch.sin(x), lambda ct: ct * c

    return sin


@pytest.mark.parametrize("how", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("way", SECOND)
def test_order_2_with_a_forward_without_grad_mode_raises_at_a_second_derivative_never_a_fraction_of_it(way, how):
    """The VJP reads cos(x) computed with grad mode off: reverse mode has no record of its dependence on x, so
    order=2 cannot be exact (torch.func.hessian gave half the term, create_graph none): a LookupError when the
    second derivative is taken, naming grad mode and what to do, and neither order (each would refuse it too). The
    same f in grad mode is exact (above)."""
    if how == "inference_mode" and way == "autograd.grad(create_graph)":  # autograd saves no inference tensor,
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):  # in a Function's backward too
            _second(way, _sin_computed_without_grad(2, how), X64)
        return
    with pytest.raises(LookupError, match=r"with grad mode off \(no_grad.*compute that tensor in grad mode") as raised:
        _second(way, _sin_computed_without_grad(2, how), X64)
    assert "order=" not in str(raised.value)


@pytest.mark.parametrize("how", ["no_grad", "set_grad_enabled(False)"])
@pytest.mark.parametrize("mode", [m for m in MODES if m != "autograd.grad(create_graph)"])
def test_order_2_with_a_forward_without_grad_mode_gives_order_1s_first_derivatives_in_every_mode(mode, how):
    """Issue 76: a Function's forward that computes what it saves under no_grad (a flash attention, a perturbed
    top-k) is a common pattern. A first derivative needs nothing of that tensor's own derivative, so at order 2 it
    is exact, as at order 1, in every mode (a plain backward raised before); only a second derivative raises
    (above)."""
    torch.testing.assert_close(MODES[mode](_sin_computed_without_grad(2, how), X64), torch.cos(X64), rtol=0, atol=0)
    x = X64.clone().requires_grad_(True)
    first = torch.autograd.grad(_sin_computed_without_grad(2, how)(x).sum(), x, create_graph=True)[0]
    torch.testing.assert_close(first, torch.cos(X64), rtol=0, atol=0)  # recorded, the first derivative is exact


def test_order_2_with_a_forward_without_grad_mode_under_torch_compile_raises_at_a_second_derivative_alone():
    """Compiled too: the proof made as Dynamo traces f finds the tensor computed with grad mode off and embeds the
    call at order 1, whose first derivatives are exact, and a compiled torch.func.hessian raises our LookupError
    (torch 2.6's Dynamo refuses f's no_grad under func.hessian before, with its own Unsupported, as loud)."""
    sin = _sin_computed_without_grad(2, "no_grad")
    g = lambda x: torch.exp(sin(x)).sum()  # noqa: E731
    torch._dynamo.reset()
    x = X64.clone().requires_grad_(True)
    torch.compile(sin, fullgraph=True)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(X64), rtol=0, atol=0)
    tangent = torch.compile(lambda x: torch.func.jvp(sin, (x,), (torch.ones_like(x),))[1], fullgraph=True)(X64)
    torch.testing.assert_close(tangent, torch.cos(X64), rtol=0, atol=0)
    with pytest.raises(Exception) as raised:
        torch.compile(torch.func.hessian(g), fullgraph=True)(X64)
    error = ours(raised.value, LookupError)
    if not isinstance(error, LookupError) and tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 8):
        assert isinstance(raised.value, torch._dynamo.exc.Unsupported)
        return
    assert "with grad mode off" in str(error)


@pytest.mark.parametrize("way", ["func.hessian", "func.jacrev(func.grad)"])
def test_order_1_under_torch_compile_raises_at_a_second_derivative_never_zero(way):
    """Compiled, order 1 holds J constant in the arguments: a compiled second derivative by torch.func gave 0
    without a word (issue 76's work); it raises the guard's LookupError naming order=2, as eagerly, and order=2
    gives it exactly."""
    g = lambda f: lambda x: torch.exp(f(x)).sum()  # noqa: E731
    second = {"func.hessian": lambda h: torch.func.hessian(h),
              "func.jacrev(func.grad)": lambda h: torch.func.jacrev(torch.func.grad(h))}[way]
    torch._dynamo.reset()
    with pytest.raises(Exception) as raised:
        torch.compile(second(g(_sin_decorated(1))), fullgraph=True)(X64)
    assert "order=2" in str(ours(raised.value, LookupError))
    torch._dynamo.reset()
    exact = torch.compile(second(g(_sin_decorated(2))), fullgraph=True)(X64)
    torch.testing.assert_close(exact.diagonal(), _analytic_second(X64))


@pytest.mark.parametrize("how", ["no_grad", "grad mode"])
def test_order_2_forward_over_forward_raises_naming_the_compositions_that_are_exact(how):
    """At order 2 the declared derivative is an autograd.Function's (``identity.mapped_zero``), and an outer
    torch.func jvp does not differentiate a Function's jvp (PyTorch's own Function gives 0 there, below): refused,
    naming hessian; jacrev over jacfwd, whose inner derivative is the same jvp, is exact."""
    def sin_in_grad_mode(x):
        return torch.sin(x), lambda ct: ct * torch.cos(x)

    sin = _sin_computed_without_grad(2, how) if how == "no_grad" else sgm.custom_gradient(sin_in_grad_mode, order=2)
    g = lambda x: torch.exp(sin(x)).sum()  # noqa: E731
    with pytest.raises(LookupError, match=r"jacfwd of jacfwd.*torch\.func\.hessian"):
        torch.func.jacfwd(torch.func.jacfwd(g))(X64)
    if how == "grad mode":
        torch.testing.assert_close(torch.func.jacrev(torch.func.jacfwd(g))(X64).diagonal(), _analytic_second(X64))

    class Sin(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return torch.sin(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def jvp(ctx, tangent):
            return tangent * torch.cos(ctx.saved_tensors[0])

    silent = torch.func.jacfwd(torch.func.jacfwd(lambda x: torch.exp(Sin.apply(x)).sum()))(X64).diagonal()
    assert not torch.allclose(silent, _analytic_second(X64))  # the mechanism misses the term without a word


def test_order_2_takes_a_detach_in_f_as_the_stop_its_author_wrote():
    """cos(x).detach() makes J constant by the rule as written: every second-derivative way gives that rule's
    Hessian, the one of exp(s) with s' = stop(cos x), alike in forward and reverse mode, and nothing is refused."""
    x = X64.clone()
    want = torch.exp(torch.sin(x)) * torch.cos(x) ** 2  # without the −sin(x) term that J's own derivative adds
    for way in SECOND:
        torch.testing.assert_close(_second(way, _sin_computed_without_grad(2, "detach"), X64), want)


class _SinDetachingInItsBackward(torch.autograd.Function):
    """The truth for the test below: PyTorch's double backward of the same backward, detach and all."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, ct):
        (x,) = ctx.saved_tensors
        return ct * torch.cos(x).detach()


@pytest.mark.parametrize("stop", ["detach()", ".data"])
def test_order_2_takes_a_detach_in_the_vjp_as_the_stop_its_author_wrote(stop):
    """The VJP stops the cos(x) it closes over (``c.detach()``, ``c.data``): every second-derivative way gives the
    rule's Hessian, as the Function's double backward does. From torch 2.14 make_fx records detach as alias, and a
    graph run later took it for the identity: the Hessian through the stop ([0.83, −2.03, 0.65] for [1.23, 0.33,
    0.31]), silently; the stops are recorded with a marker now (``aten_graphs._StopsRecorded``)."""
    @sgm.custom_gradient(order=2)
    def sin(x):
        c = torch.cos(x)
        return torch.sin(x), lambda ct: ct * (c.detach() if stop == "detach()" else c.data)

    x = X64.clone().requires_grad_(True)
    first = torch.autograd.grad(torch.exp(_SinDetachingInItsBackward.apply(x)).sum(), x, create_graph=True)[0]
    want = torch.autograd.grad(first.sum(), x)[0]
    torch.testing.assert_close(want, torch.exp(torch.sin(X64)) * torch.cos(X64) ** 2)
    for way in SECOND:
        torch.testing.assert_close(_second(way, sin, X64), want)


@pytest.mark.parametrize("way", ["func.hessian", "create_graph"])
def test_order_2_reads_a_weight_under_no_grad_as_a_constant_of_the_arguments(way):
    """A tensor f computes under no_grad from something other than its arguments (a weight that requires grad) is
    not followed: its term is not a derivative w.r.t. the arguments, and the Hessian w.r.t. them is exact, under
    torch.func (``Watch``) and eagerly (``EagerWatch``, which tells the weight from the arguments by its graph)."""
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)

    @sgm.custom_gradient(order=2)
    def scaled_square(x):
        with torch.no_grad():
            s = (w * w).sum()
        return (s * x * x).sum() / 2, lambda ct: ct * s * x

    if way == "func.hessian":
        assert torch.func.hessian(scaled_square)(X64).diagonal().tolist() == [14.0] * 4
        return
    x = X64.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(scaled_square(x), x, create_graph=True)
    assert torch.autograd.grad(gradient.sum(), x)[0].tolist() == [14.0] * 4


def test_order_2_third_derivatives_raise_under_torch_func():
    g = lambda x: torch.exp(_sin_decorated(2)(x)).sum()  # noqa: E731
    with pytest.raises(LookupError, match="third derivative"):
        torch.func.jacfwd(torch.func.hessian(g))(X64)


def test_order_2_third_derivatives_by_create_graph_differentiate_the_vjps_ops_again():
    """Each backward at order 2 runs the VJP's ops with what it closes over as it is, so a third backward pass
    differentiates them once more: the closed form's third derivative, for a VJP whose ops are sin's derivative
    (it missed terms while order 2 evaluated the VJP at a midpoint)."""
    def third(f):
        x = X64.clone().requires_grad_(True)
        first = torch.autograd.grad(torch.exp(f(x)).sum(), x, create_graph=True)[0]
        second = torch.autograd.grad(first.sum(), x, create_graph=True)[0]
        return torch.autograd.grad(second.sum(), x)[0]

    torch.testing.assert_close(third(_sin_decorated(2)), third(torch.sin))


def test_a_vjp_that_calls_its_own_f_terminates_and_is_exact():
    @sgm.custom_gradient
    def exp(x):  # exp' = exp: the VJP calls the decorated function itself
        return torch.exp(x), lambda ct: ct * exp(x)

    torch.testing.assert_close(torch.func.grad(lambda x: exp(x).sum())(X64), torch.exp(X64))


def test_a_vjp_that_calls_a_decorated_linear_function_on_its_cotangent():
    @sgm.custom_gradient
    def double(u):
        return 2.0 * u, lambda ct: 2.0 * ct

    @sgm.custom_gradient
    def f(x):
        return torch.sin(x), lambda ct: double(ct) * 0.5 * torch.cos(x)

    torch.testing.assert_close(MODES["func.jvp"](f, X64), torch.cos(X64))


# ---------------------------------------------------------------- values and kinds


def test_an_infinite_derivative_is_infinite_as_plain_autodiffs_whatever_the_size_of_y():
    @sgm.custom_gradient
    def root_sum(x):
        return torch.sqrt(x).sum(), lambda ct: ct * 0.5 / torch.sqrt(x)

    @sgm.custom_gradient
    def root(x):
        return torch.sqrt(x), lambda ct: ct * 0.5 / torch.sqrt(x)

    x = torch.tensor([0.0, 4.0])
    assert torch.func.grad(root_sum)(x).tolist() == [math.inf, 0.25]
    assert torch.func.jvp(root_sum, (x,), (torch.tensor([1.0, 0.0]),))[1].item() == math.inf
    # J·v is inf·0 = NaN at J's infinite entry: the carrier keeps +0.0 and passes J·dv, inf as sqrt's own (this
    # gave NaN, and before the carrier a silent 0); the other element exact
    for got in (torch.func.jvp(root, (x,), (torch.ones(2),))[1], torch.func.vjp(root, x)[1](torch.ones(2))[0]):
        assert got.tolist() == [math.inf, 0.25]
        assert got.tolist() == torch.func.vjp(torch.sqrt, x)[1](torch.ones(2))[0].tolist()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_floating_dtype_gets_the_vjps_value_in_that_dtype(dtype):
    x = torch.tensor([-3.0, 0.0, 1.5, 20.0], dtype=dtype)
    for grad in (torch.func.grad(lambda x: log1pexp(x).sum()), lambda x: MODES["forward_ad"](log1pexp, x)):
        got = grad(x)
        assert got.dtype == dtype
        torch.testing.assert_close(got, 1 - 1 / (1 + torch.exp(x)))  # the VJP's formula, rounded in dtype


def test_a_loss_scaled_half_precision_cotangent_keeps_a_finite_gradient():
    """Mixed precision scales the loss by 2**15: each cotangent is finite in float16, their sum is not. The
    carrier of a non-finite J·v must not sum the cotangents before multiplying them by 0 (found by Keras's
    mixed_float16 training, whose loss scaling then skipped every step)."""
    x = torch.linspace(-3.0, 3.0, 512, dtype=torch.float16).reshape(64, 8).requires_grad_(True)
    cotangent = torch.full((64, 8), 2.0**15, dtype=torch.float16)
    (got,) = torch.autograd.grad(log1pexp(x), x, cotangent)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, cotangent * (1 - 1 / (1 + torch.exp(x.detach()))))


def test_complex_values_follow_pytorchs_convention():
    z0 = torch.tensor([0.5 + 1.0j, -1.0 + 0.25j], dtype=torch.complex128)

    @sgm.custom_gradient
    def square(z):  # holomorphic: PyTorch's VJP is conj(2z)·ct
        return z * z, lambda ct: ct * (2 * z).conj()

    def real_part(z):
        return square(z).real.sum()

    torch.testing.assert_close(torch.func.grad(real_part)(z0), torch.func.grad(lambda z: (z * z).real.sum())(z0))
    tangent = torch.tensor([1.0 + 0.5j, -0.25j], dtype=torch.complex128)
    torch.testing.assert_close(torch.func.jvp(square, (z0,), (tangent,))[1], 2 * z0 * tangent)


def test_float64_against_central_differences():
    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64)
    jacobian = torch.func.jacfwd(tanh_of_a_map)(x)
    step = 1e-6
    for j in range(3):
        e = torch.zeros(3, dtype=torch.float64)
        e[j] = step
        column = (_closed_form(x + e) - _closed_form(x - e)) / (2 * step)
        torch.testing.assert_close(jacobian[:, j], column, rtol=1e-7, atol=1e-9)


class _Boom(Exception):
    """An exception of the user's own."""


def _raising_vjp(error):
    def f(x):
        def vjp(ct):
            raise error
        return x * 2.0, vjp
    return f


_EXCEPTION_MODES = {
    "backward": lambda fn, x: fn(x.clone().requires_grad_(True)).sum().backward(),
    "func.grad": lambda fn, x: torch.func.grad(lambda x: fn(x).sum())(x),
    "func.jvp": lambda fn, x: torch.func.jvp(fn, (x,), (x,)),
    "vmap(func.grad)": lambda fn, x: torch.func.vmap(torch.func.grad(lambda x: fn(x).sum()))(x[None]),
}


@pytest.mark.parametrize("mode", _EXCEPTION_MODES)
@pytest.mark.parametrize("error", [_Boom("inside the vjp"), ZeroDivisionError("division by zero")],
                         ids=["the user's class", "ZeroDivisionError"])
def test_an_exception_the_vjp_raises_passes_through_unchanged(error, mode):
    """Issue 56: the VJP's own exception came back as the decorator's ValueError ("cannot be traced eagerly",
    with advice that did not apply), so `except Boom:` missed it. It passes through as from a Function's
    backward, eagerly and under torch.func; a read of the cotangent's value is still the decorator's refusal."""
    x = torch.tensor([0.5, 1.5])
    with pytest.raises(type(error)) as raised:
        _EXCEPTION_MODES[mode](sgm.custom_gradient(_raising_vjp(error)), x)
    assert raised.value is error
    reads_the_cotangent = sgm.custom_gradient(lambda x: (x * 2.0, lambda ct: (ct * float(ct.sum()),)))
    with pytest.raises(ValueError, match=r"The vjp of <lambda> cannot be traced"):
        _EXCEPTION_MODES[mode](reads_the_cotangent, x)


class _HalvedGradient(torch.nn.Module):
    """A module whose decorated forward closes over its weight: the VJP's gradient is half the weight's."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64))

    @sgm.custom_gradient
    def forward(self, x):
        weight = self.weight.detach()
        return x * weight, lambda ct: ct * weight * 0.5


@pytest.mark.parametrize("mode", [m for m in [*MODES, *COMPILED_MODES] if "vmap" not in m])  # (vmap: per scalar)
def test_a_decorated_module_forward_binds_the_module_and_keeps_its_signature(mode):
    """The module is bound, as tf.custom_gradient binds a method, not an argument whose cotangent the VJP must
    give; its forward's signature is f's, bound (issue 57). Truth: half the weight, the declared gradient."""
    import inspect

    module = _HalvedGradient()
    assert list(inspect.signature(module.forward).parameters) == ["x"]
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    if mode in COMPILED_MODES and tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 13):
        with pytest.raises(Exception, match="is not a constant"):  # a documented limit: torch 2.6's Dynamo hands
            COMPILED_MODES[mode](module, x)                           # the proof no module
        return
    derivative = (MODES | COMPILED_MODES)[mode](module, x)
    torch.testing.assert_close(derivative, module.weight.detach() * 0.5, rtol=0, atol=0)
