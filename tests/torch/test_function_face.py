"""``stopgrad_math.torch.Function``: an existing torch.autograd.Function, ported by changing its base class (issue
55). Each class below is run as PyTorch runs it and as the port, side by side; the truth is PyTorch's own result
where its mechanism has one (reverse mode, the double backward), and for the modes it lacks the Function's own
reverse-mode Jacobian, or an analytic derivative. The cases restated from PyTorch's suites are in
tests/torch/test_function_api_cases.py, and the real-world classes in tests/torch/test_ported_functions.py."""

import math
import pathlib
import re

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from function_shim import ported  # noqa: E402
from torch.autograd.function import once_differentiable  # noqa: E402
from torch_modes import fresh_compilation  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    fresh_compilation(monkeypatch)


# ---------------------------------------------------------------- ctx.needs_input_grad, as PyTorch sets it


class RecordsNeeds(torch.autograd.Function):
    """y = x·w + b, its backward recording ctx.needs_input_grad and guarding each gradient by it."""

    seen = []  # noqa: RUF012 (the records of one test)

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x * w + b

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        RecordsNeeds.seen.append(tuple(ctx.needs_input_grad))
        return (grad * w if ctx.needs_input_grad[0] else None, grad * x if ctx.needs_input_grad[1] else None,
                grad if ctx.needs_input_grad[2] else None)


@pytest.mark.parametrize("requiring", [(True, False, False), (False, True, True), (True, True, False),
                                       (False, False, True)], ids=str)
def test_needs_input_grad_is_true_exactly_where_the_callers_argument_requires_grad(requiring):
    """As PyTorch sets it: recorded in the backward of the Function and of the port, which must agree, and so
    must the gradients the guards let through. (A port that said True everywhere would record more.)"""
    seen, grads = [], []
    for function in (RecordsNeeds, ported(RecordsNeeds)):
        args = [torch.tensor([1.5, -2.0], requires_grad=r) for r in requiring]
        RecordsNeeds.seen = []
        function.apply(*args).sum().backward()
        seen.append(RecordsNeeds.seen)
        grads.append([a.grad for a in args])
    assert seen[0] == [requiring] and set(seen[1]) == {requiring}  # (the port's first call traces it, then runs it)
    for theirs, ours in zip(*grads, strict=True):
        assert (theirs is None and ours is None) or torch.equal(theirs, ours)


def test_in_forward_mode_needs_input_grad_is_true_where_an_argument_has_a_tangent():
    """Forward mode is the backward's transpose here, so an argument with a tangent needs its gradient: the
    tangent of y is w·ẋ alone, x's being the only tangent."""
    RecordsNeeds.seen = []
    x, w, b = torch.tensor([1.5, -2.0]), torch.tensor([3.0, 4.0]), torch.tensor([0.5, 0.5])
    with forward_ad.dual_level():
        y = ported(RecordsNeeds).apply(forward_ad.make_dual(x, torch.ones(2)), w, b)
        tangent = forward_ad.unpack_dual(y).tangent
    assert RecordsNeeds.seen[-1] == (True, False, False)
    assert torch.equal(tangent, w)


# ---------------------------------------------------------------- the API a Function is written in


class Scaled(torch.autograd.Function):
    """forward(x, scale=2.0) with setup_context; a Python number argument; extra trailing None gradients."""

    @staticmethod
    def forward(x, scale=2.0):
        return x * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None, None, None


def test_apply_binds_keywords_and_defaults_as_pytorch_does_and_takes_trailing_none_gradients():
    ours = ported(Scaled)
    x = torch.tensor([1.0, -3.0])
    for args, kwargs, scale in [((x,), {}, 2.0), ((x, 5.0), {}, 5.0), ((x,), {"scale": 7.0}, 7.0)]:
        torch.testing.assert_close(ours.apply(*args, **kwargs), x * scale, rtol=0, atol=0)
        jacobian = torch.func.jacfwd(lambda x, rest=args[1:], kwargs=kwargs: ours.apply(x, *rest, **kwargs))(x)
        torch.testing.assert_close(jacobian, scale * torch.eye(2), rtol=0, atol=0)


class TooFewGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_backward_with_too_few_gradients_raises_as_pytorch_does():
    for function in (TooFewGradients, ported(TooFewGradients)):
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            function.apply(torch.ones(2, requires_grad=True), torch.ones(2)).sum().backward()


class TopK(torch.autograd.Function):
    """Values and integer indices; the indices marked non-differentiable; backward(ctx, grad_values, grad_indices)."""

    @staticmethod
    def forward(ctx, x, k):
        values, indices = x.topk(k)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.size = x.shape[-1]
        return values, indices

    @staticmethod
    def backward(ctx, grad_values, grad_indices):
        (indices,) = ctx.saved_tensors
        return torch.zeros((*grad_values.shape[:-1], ctx.size), dtype=grad_values.dtype).scatter(
            -1, indices, grad_values), None


X = torch.tensor([[0.3, -1.2, 2.0, 0.7], [1.5, -0.4, 0.1, 0.9]], dtype=torch.float64)


def test_two_outputs_one_marked_non_differentiable_in_every_mode():
    ours = ported(TopK)
    _, indices = ours.apply(X, 2)
    assert not indices.requires_grad and indices.dtype == torch.int64
    want = torch.autograd.functional.jacobian(lambda x: TopK.apply(x, 2)[0], X)
    torch.testing.assert_close(torch.func.jacrev(lambda x: ours.apply(x, 2)[0])(X), want, rtol=0, atol=0)
    torch.testing.assert_close(torch.func.jacfwd(lambda x: ours.apply(x, 2)[0])(X), want, rtol=0, atol=0)
    weights = torch.tensor([3.0, 5.0], dtype=torch.float64)
    per_row = torch.func.vmap(torch.func.grad(lambda r: (ours.apply(r, 2)[0] * weights).sum()))(X)
    for row, got in zip(X, per_row, strict=True):  # per-sample gradients: the Function's, row by row
        row = row.clone().requires_grad_()
        (TopK.apply(row, 2)[0] * weights).sum().backward()
        assert torch.equal(got, row.grad)


class Exp2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class ExpOnce(Exp2):
    backward = staticmethod(once_differentiable(Exp2.backward))


def test_a_once_differentiable_backward_gives_first_derivatives_in_every_mode_and_refuses_a_second():
    """First derivatives: the backward's, in reverse and forward mode. A second: PyTorch raises (the backward is
    marked), and so does the port at order 1 (naming order=2), never a silent number."""
    ours, x = ported(ExpOnce), torch.tensor([0.5, -1.0], dtype=torch.float64)
    torch.testing.assert_close(torch.func.jacfwd(ours.apply)(x), torch.diag(x.exp()), rtol=0, atol=0)
    torch.testing.assert_close(torch.func.grad(lambda x: ours.apply(x).sum())(x), x.exp(), rtol=0, atol=0)
    for function, error in ((ExpOnce, RuntimeError), (ours, LookupError)):
        moving = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(function.apply(moving).sum(), moving, create_graph=True)
        with pytest.raises(error):
            grad.sum().backward()


def test_a_subclass_gives_the_double_backward_by_default_and_runs_forward_once():
    """Issue 55: second derivatives as PyTorch gives them, by default (the class's order is 2), with forward run
    once per call, as the Function runs it (a forward that counts its calls)."""
    calls = []

    class CountedExp(sgm.Function):  # Exp2's body, on the library's class with no order given
        @staticmethod
        def forward(ctx, x):
            calls.append(1)
            return Exp2.forward(ctx, x)

        backward = staticmethod(Exp2.backward)

    x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(CountedExp.apply(x).sum(), x, create_graph=True)
    assert len(calls) == 1
    torch.testing.assert_close(torch.autograd.grad(grad.sum(), x)[0], x.detach().exp(), rtol=1e-15, atol=0)
    hessian = torch.func.hessian(lambda x: CountedExp.apply(x).sum())(x.detach())
    torch.testing.assert_close(hessian, torch.diag(x.detach().exp()), rtol=1e-15, atol=0)


def test_order_2_gives_the_functions_double_backward_where_its_backward_is_differentiable():
    """d²/dx² of exp through its backward dy·y: PyTorch's double backward and the port at order=2 give exp(x)."""
    ours = ported(Exp2, order=2)
    x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(Exp2.apply(x).sum(), x, create_graph=True)
    (theirs,) = torch.autograd.grad(grad.sum(), x)
    torch.testing.assert_close(theirs, x.exp(), rtol=0, atol=0)
    for second in (torch.func.hessian(lambda x: ours.apply(x).sum())(x.detach()).diagonal(),
                   torch.autograd.grad(torch.autograd.grad(ours.apply(x).sum(), x, create_graph=True)[0].sum(),
                                       x)[0]):
        torch.testing.assert_close(second, x.detach().exp(), rtol=1e-15, atol=0)


class SquareWithOwnRules(torch.autograd.Function):
    """x² whose rules deliberately disagree, so that a test sees which ran: its backward gives 5x·g, its jvp 3x·t,
    its vmap rule adds 1 to the value."""

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 5 * x * grad

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return 3 * x * tangent

    @staticmethod
    def vmap(info, in_dims, x):
        return x * x + 1, in_dims[0]


class CubeWithJvp(torch.autograd.Function):
    """x³ with a ctx forward and its own jvp, which reads what the forward saved for it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * grad

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * tangent


def _modes_of(apply, x):
    """What each way gives: the value, backward's gradient, forward_ad's tangent, torch.func's grad, jvp and vmap
    (the last three where the class runs under torch.func)."""
    leaf = x.clone().requires_grad_(True)
    value = apply(leaf)
    value.sum().backward()
    with forward_ad.dual_level():
        tangent = forward_ad.unpack_dual(apply(forward_ad.make_dual(x, torch.ones_like(x)))).tangent
    found = {"value": value.detach(), "backward": leaf.grad, "forward_ad": tangent}
    try:
        found["func.grad"] = torch.func.grad(lambda x: apply(x).sum())(x)
        found["func.jvp"] = torch.func.jvp(apply, (x,), (torch.ones_like(x),))[1]
        found["func.vmap"] = torch.func.vmap(apply)(x)
    except RuntimeError as error:  # a forward with ctx: torch.func wants setup_context, of both
        found["func"] = str(error).split("\n")[0]
    return found


@pytest.mark.parametrize("function", [SquareWithOwnRules, CubeWithJvp], ids=lambda f: f.__name__)
def test_a_class_with_its_own_jvp_or_vmap_runs_them_as_pytorch_does(function):
    """Issue 76: such a class raised TypeError when defined, where torch.autograd.Function takes it. Its own rules
    are its author's: it runs as a torch.autograd.Function with them, every mode giving what PyTorch gives (the
    jvp's 3x where the backward says 5x, the vmap rule's +1), and route() says why."""
    ours = ported(function)
    x = torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64)
    theirs, mine = _modes_of(function.apply, x), _modes_of(ours.apply, x)
    assert theirs.keys() == mine.keys()
    for way in theirs:
        assert (theirs[way] == mine[way]) if isinstance(theirs[way], str) else torch.equal(theirs[way], mine[way]), way
    assert not ours.route(x).embedded and "its own jvp" in ours.route(x).reason


def test_compiled_a_class_with_its_own_jvp_gives_reverse_mode_and_refuses_forward_mode_naming_it():
    """Compiled with fullgraph, PyTorch refuses such a class in reverse mode ("Unsupported custom jvp"), and in a
    compiled torch.func transform it differentiates the forward, dropping the jvp and the backward without a word
    (3x and 5x become 2x). Ours gives the backward's reverse mode compiled, and refuses the transform naming the
    class."""
    ours = ported(SquareWithOwnRules)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    torch._dynamo.reset()
    compiled_jvp = torch.compile(lambda x: torch.func.jvp(SquareWithOwnRules.apply, (x,), (torch.ones_like(x),))[1],
                                 fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled_jvp(x), 2 * x)  # PyTorch's drop
    leaf = x.clone().requires_grad_(True)
    torch.compile(ours.apply, fullgraph=True, backend="aot_eager")(leaf).sum().backward()
    assert torch.equal(leaf.grad, 5 * x)
    with pytest.raises(Exception, match=r"SquareWithOwnRules.*its own jvp"):
        torch.compile(lambda x: torch.func.jvp(ours.apply, (x,), (torch.ones_like(x),))[1], fullgraph=True,
                      backend="aot_eager")(x)


def test_generate_vmap_rule_is_accepted_and_vmap_is_the_backwards():
    class Cube(sgm.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x**3

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 3 * x**2 * grad

    x = torch.tensor([1.0, -2.0, 0.5])
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(Cube.apply))(x), 3 * x**2, rtol=0, atol=0)


# ---------------------------------------------------------------- what the backward reads, as it is at each call

BACKWARD_SCALE = 2.0  # a module's global that a backward reads, rebound between calls (a schedule's factor)


def _scaled(grad):
    return grad * BACKWARD_SCALE


class ScalesByAGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * BACKWARD_SCALE


class ScalesThroughAHelper(ScalesByAGlobal):
    @staticmethod
    def backward(ctx, grad):
        return _scaled(grad)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("function", [ScalesByAGlobal, ScalesThroughAHelper], ids=lambda f: f.__name__)
def test_a_global_the_backward_reads_is_read_as_it_is_at_each_call(monkeypatch, function, order):
    """A kept proof is keyed by the backward's code and the globals it reads, as the decorator's VJP is: rebinding
    one gives the new gradient in reverse and forward mode, as torch.autograd.Function's backward reads it."""
    port = ported(function, order)
    x = torch.tensor([1.0, -2.0, 3.0])
    for scale in (2.0, 5.0, 2.0):
        monkeypatch.setitem(globals(), "BACKWARD_SCALE", scale)
        theirs = torch.autograd.grad(function.apply(x.requires_grad_()).sum(), x)[0]
        ours = torch.autograd.grad(port.apply(x.requires_grad_()).sum(), x)[0]
        assert torch.equal(theirs, torch.full((3,), scale)) and torch.equal(ours, theirs), (scale, ours, theirs)
        with forward_ad.dual_level():
            tangent = forward_ad.unpack_dual(port.apply(forward_ad.make_dual(x.detach(), torch.ones(3)))).tangent
        assert torch.equal(tangent, theirs)


# ---------------------------------------------------------------- the fall-back: torch.autograd.Function itself


class ClipGradient(torch.autograd.Function):
    """A backward that clips its cotangent: not linear in it."""

    @staticmethod
    def forward(x, bound):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.bound = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad.clamp(-ctx.bound, ctx.bound), None


class ReadsItsCotangent(torch.autograd.Function):
    """A backward that reads its cotangent's value in Python."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 if grad.sum().item() > 0 else grad * 3


WEIGHTS = torch.tensor([5.0, -0.25, 3.0], dtype=torch.float64)


def _reverse(apply, *rest):
    x = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    (apply(x, *rest) * WEIGHTS).sum().backward()
    return x.grad


@pytest.mark.parametrize("case", ["clip", "reads its cotangent"])
def test_a_backward_that_cannot_be_embedded_is_the_functions_to_the_bit_and_forward_mode_names_why(case):
    function, rest, why = {"clip": (ClipGradient, (1.0,), "clamp"),
                           "reads its cotangent": (ReadsItsCotangent, (), "cannot be traced")}[case]
    ours = ported(function)
    for _ in range(2):  # the second call takes the remembered fall-back
        assert torch.equal(_reverse(ours.apply, *rest), _reverse(function.apply, *rest))
    route = ours.route(torch.ones(3), *rest)
    assert not route.embedded and why in route.reason
    with forward_ad.dual_level(), pytest.raises(RuntimeError, match=f"{function.__name__}: forward mode.*{why}"):
        ours.apply(forward_ad.make_dual(torch.ones(3), torch.ones(3)), *rest)
    with pytest.raises(RuntimeError, match=why):
        torch.func.jvp(lambda x: ours.apply(x, *rest), (torch.ones(3),), (torch.ones(3),))


def test_under_torch_compile_a_clipping_backward_is_the_compiled_functions():
    ours = ported(ClipGradient)
    got = _reverse(torch.compile(lambda x: ours.apply(x, 1.0), fullgraph=True))
    assert torch.equal(got, _reverse(torch.compile(lambda x: ClipGradient.apply(x, 1.0), fullgraph=True)))
    assert torch.equal(got, WEIGHTS.clamp(-1.0, 1.0))


def test_under_vmap_a_clipping_backward_with_setup_context_gets_per_sample_gradients():
    """generate_vmap_rule on the fall-back: vmap of forward and backward, as PyTorch derives it."""
    xs = torch.tensor([[0.3, -1.2, 2.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    got = torch.func.vmap(torch.func.grad(lambda x: (ported(ClipGradient).apply(x, 1.0) * WEIGHTS).sum()))(xs)
    assert torch.equal(got, WEIGHTS.clamp(-1.0, 1.0).expand(2, 3))


def test_a_call_that_asks_no_derivative_runs_forward_alone_whatever_the_backward():
    assert torch.equal(ported(ClipGradient).apply(torch.ones(2), 1.0), torch.ones(2))
    with torch.no_grad():
        assert torch.equal(ported(ReadsItsCotangent).apply(torch.ones(2, requires_grad=True)), 2 * torch.ones(2))


class SavesAndMarks(torch.autograd.Function):
    """A linear layer that saves its inputs, sets an attribute and marks an index output non-differentiable."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.scale = 0.5
        y = ctx.scale * x @ w.T
        index = y.argmax(dim=1)
        ctx.mark_non_differentiable(index)
        return y, index

    @staticmethod
    def backward(ctx, grad, _):
        x, w = ctx.saved_tensors
        return ctx.scale * grad @ w, ctx.scale * grad.T @ x


def test_a_call_nothing_differentiates_costs_the_forward_alone(monkeypatch):
    """Issue 75: where nothing can ask a derivative (no argument requires grad, or grad mode off; no dual level,
    transform or compilation), the port runs the forward with its ctx, as torch.autograd.Function.apply does: no
    route, no decorated call. Its outputs are the Function's, bit for bit; a call
    that does differentiate still takes both."""
    from stopgrad_math.torch import decorator_form, function_face

    calls = []
    for module, name in ((function_face, "_route"), (decorator_form, "call_or_fall_back")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    port = ported(SavesAndMarks)
    for plain in (lambda: port.apply(x, w), lambda: _without_grad(port.apply, x, w.requires_grad_())):
        got, want = plain(), SavesAndMarks.apply(x, w.detach())
        assert not got[0].requires_grad and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert calls == []
    y, _ = port.apply(x, w)
    y.sum().backward()
    assert calls[:2] == ["_route", "call_or_fall_back"]
    assert torch.equal(w.grad, 0.5 * torch.ones(4, 2, dtype=torch.float64).T @ x)


def test_a_signature_that_fell_back_falls_back_at_once_and_no_other_class_makes_a_key(monkeypatch):
    """The fall-back is remembered by class and signature: the second call of a clipping backward traces nothing
    and is still the Function's, bit for bit; a class none of whose calls fell back makes no key at all (issue 75:
    the key reads every argument at every call)."""
    from stopgrad_math.torch import function_face, tracing

    traced, keyed = [], []
    for module, name, calls in ((tracing, "traced_vjp", traced), (function_face, "_signature", keyed)):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _o=original, _c=calls: _c.append(1) or _o(*a))
    clipping, linear = ported(ClipGradient), ported(Exp2)
    for calls in (1, 2):
        assert torch.equal(_reverse(clipping.apply, 1.0), _reverse(ClipGradient.apply, 1.0))
        assert len(traced) == 1 and len(keyed) == calls  # (traced once; remembered, then looked up)
    del keyed[:]
    _reverse(linear.apply)
    assert keyed == []


def _without_grad(function, *args):
    with torch.no_grad():
        return function(*args)


def test_the_route_of_a_linear_backward_is_embedded():
    assert ported(Exp2).route(torch.ones(2)).embedded and ported(Exp2).route(torch.ones(2)).reason == ""
    assert math.isclose(float(torch.func.jvp(ported(Exp2).apply, (torch.zeros(()),), (torch.ones(()),))[1]), 1.0)


def test_the_docs_example_runs_and_gives_the_backwards_derivatives_in_every_mode_it_shows():
    """docs/existing_code.md's PyTorch example, run as written: its jacfwd (eager and compiled) is the Jacobian of
    x ↦ x·wᵀ, and its per-sample gradient of w for row i is that row, once per output."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "existing_code.md").read_text()
    namespace = {}
    exec(re.findall(r"```python\n(.*?)```", text.split("## PyTorch")[1], re.S)[0], namespace)
    linear, x, w = namespace["Linear"].apply, namespace["x"], namespace["w"]
    want = torch.einsum("ij,kl->ikjl", torch.eye(4), w)  # d(x wᵀ)[i, k] / dx[j, l] = δij·w[k, l]
    torch.testing.assert_close(torch.func.jacfwd(linear)(x, w), want, rtol=0, atol=0)
    torch.testing.assert_close(torch.compile(torch.func.jacfwd(linear), fullgraph=True)(x, w), want)
    per_sample = torch.func.vmap(torch.func.grad(namespace["loss"]), in_dims=(None, 0))(w, x)
    torch.testing.assert_close(per_sample, x[:, None, :].expand(4, 2, 3), rtol=0, atol=0)


def test_the_readmes_example_runs_as_written():
    pytest.importorskip("jax")
    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    namespace = {}
    exec(re.findall(r"```python\n(.*?)```", text.split("## Bring your existing code")[1], re.S)[0], namespace)
    assert torch.equal(torch.func.jacfwd(namespace["Exp"].apply)(torch.zeros(2)), torch.eye(2))
    assert tuple(float(v) for v in namespace["jax"].jvp(namespace["softplus"], (100.0,), (1.0,))) == (100.0, 1.0)


def test_a_backward_raising_its_own_exception_falls_back_and_raises_it_in_the_backward_pass():
    """Issue 56's exceptions, on the class: a backward that raises an exception of its own (not supported for this
    input) is PyTorch's to run: the call gives forward's value, the backward pass raises the same exception, as the
    Function's does, and route says why."""
    class Unsupported(Exception):
        pass

    class NoGradient(sgm.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            raise Unsupported("no gradient for this input")

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    route = NoGradient.route(x)
    assert not route.embedded and "Unsupported" in route.reason
    y = NoGradient.apply(x)
    torch.testing.assert_close(y.detach(), torch.tensor([2.0, 4.0]))
    with pytest.raises(Unsupported, match="no gradient for this input"):
        y.sum().backward()


# ---------------------------------------------------------------- a forward that changes its input in place


def _doubling_in_place(ctx, x):
    x.mul_(2)  # without ctx.mark_dirty, which torch.autograd.Function forgives
    ctx.save_for_backward(x)
    return x


def _doubled_gradient(ctx, grad):
    return grad * 2


def _in_place_gradient(base, order=None, way="backward"):
    """The gradient of Σ w·C(a·1) at a = [1, 2, 3] with w = [1, 2, 3], for C doubling its input in place."""
    body = {"forward": staticmethod(_doubling_in_place), "backward": staticmethod(_doubled_gradient)}
    doubling = type("DoublingInPlace", (base,), body if order is None else {**body, "order": order})
    weights = torch.tensor([1.0, 2.0, 3.0])
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    if way == "forward_ad":
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(a.detach() * 1, torch.ones(3))
            return forward_ad.unpack_dual((doubling.apply(dual) * weights).sum()).tangent
    (doubling.apply(a * 1) * weights).sum().backward()
    return a.grad


def test_a_forward_changing_its_input_in_place_is_refused_at_order_2_and_the_mechanisms_at_order_1():
    """Issue 76: a forward that doubles its input in place without ctx.mark_dirty. torch.autograd.Function counts
    the change once (the backward's 2·w); at order=2 f ran on the argument itself, the change entered the argument's
    own derivative, and the gradient was 4·w, silently. Now refused there, naming mark_dirty and the way out; at
    order=1, where f runs on a stopped alias, the mechanism's gradient."""
    want = _in_place_gradient(torch.autograd.Function)
    assert want.tolist() == [2.0, 4.0, 6.0]
    assert torch.equal(_in_place_gradient(sgm.Function, order=1), want)
    for way in ("backward", "forward_ad"):
        with pytest.raises(RuntimeError, match=r"DoublingInPlace changed its argument .* in place .*mark_dirty"):
            _in_place_gradient(sgm.Function, way=way)  # order 2, the default


@pytest.mark.parametrize("order", [1, 2])
def test_a_forward_changing_its_input_in_place_gets_the_mechanisms_derivative_under_torch_func_and_compiled(
        order, monkeypatch):
    """Where f runs on a stopped alias at either order (one torch.func transform alone, torch.compile), the change
    stays out of the derivative, as under torch.autograd.Function: 2·w, and its JVP along ones 2·Σw = 12."""
    body = {"forward": staticmethod(_doubling_in_place), "backward": staticmethod(_doubled_gradient), "order": order}
    doubling = type("DoublingInPlace", (sgm.Function,), body)
    weights = torch.tensor([1.0, 2.0, 3.0])

    def loss(a):
        return (doubling.apply(a * 1) * weights).sum()

    assert torch.func.grad(loss)(torch.tensor([1.0, 2.0, 3.0])).tolist() == [2.0, 4.0, 6.0]
    assert float(torch.func.jvp(loss, (torch.tensor([1.0, 2.0, 3.0]),), (torch.ones(3),))[1]) == 12.0
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    fresh_compilation(monkeypatch)
    compiled = torch.compile(doubling.apply, fullgraph=True)
    assert torch.autograd.grad((compiled(a * 1) * weights).sum(), a)[0].tolist() == [2.0, 4.0, 6.0]


def test_a_decorated_f_changing_its_argument_in_place_is_refused_at_order_2():
    def doubling(x):
        x.mul_(2)
        return x * 1, lambda ct: ct * 2

    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (sgm.custom_gradient(doubling, order=1)(a * 1) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert a.grad.tolist() == [2.0, 4.0, 6.0]
    with pytest.raises(RuntimeError, match=r"doubling changed its argument args\[0\] in place"):
        sgm.custom_gradient(doubling, order=2)(a * 1)


class _KeepsARunningMean:
    """A forward that updates a running mean passed as an argument (a normalization layer's buffer), in place."""

    @staticmethod
    def forward(ctx, x, running):
        running.mul_(0.9).add_(0.1 * x.detach().mean(0))
        ctx.save_for_backward(x)
        return x * 3.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 3.0, None


def test_an_argument_no_derivative_is_taken_through_may_change_in_place_as_the_mechanisms_does():
    """A buffer changed in place is the forward's business: no refusal, the buffer updated once, the gradient the
    mechanism's, at both orders."""
    got = {}
    for name, base, order in (("mechanism", torch.autograd.Function, None), ("order 1", sgm.Function, 1),
                              ("order 2", sgm.Function, 2)):
        body = dict(vars(_KeepsARunningMean))
        body = {k: body[k] for k in ("forward", "backward")}
        keeps = type("KeepsARunningMean", (base,), body if order is None else {**body, "order": order})
        running = torch.zeros(3)
        x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], requires_grad=True)
        keeps.apply(x, running).sum().backward()
        got[name] = (running, x.grad)
    for name in ("order 1", "order 2"):
        assert torch.equal(got[name][0], got["mechanism"][0]) and torch.equal(got[name][1], got["mechanism"][1])


def test_an_inference_tensor_among_the_arguments_has_no_version_to_read_and_is_no_trouble():
    """An inference tensor tracks no version counter (reading one raises): the in-place check reads only the
    arguments a derivative is taken through, and a constant made under inference_mode passes at order=2."""
    with torch.inference_mode():
        offset = torch.ones(3)
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    shifted = sgm.custom_gradient(lambda x, c: (x + c, lambda ct: (ct, None)), order=2)
    shifted(x, offset).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


class SoftmaxSavedWithoutGrad(torch.autograd.Function):
    """A softmax whose forward runs under @torch.no_grad() and saves its output, as memory-efficient attention's
    FlashAttentionFunction saves its row statistics: its backward is softmax's VJP."""

    @staticmethod
    @torch.no_grad()
    def forward(ctx, x):
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


@pytest.mark.parametrize("compiled", [False, True])
def test_a_forward_under_no_grad_gives_every_first_derivative_at_order_2_and_refuses_a_second(compiled):
    """Issue 76: at the default order=2 such a class raised at every derivative, .backward() and route() included.
    First derivatives need nothing of the saved tensor's own derivative: they are the mechanism's in reverse mode
    and softmax's autodiff in forward mode (order 1's), eagerly and compiled; a second derivative, which reverse mode
    cannot take through the saved tensor (the Function itself gives a part of it silently), raises naming grad mode."""
    ours = ported(SoftmaxSavedWithoutGrad, order=2)  # (the class's default)
    apply = torch.compile(ours.apply, fullgraph=True) if compiled else ours.apply
    torch._dynamo.reset()
    w = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]], dtype=torch.float64)
    assert ours.route(X).embedded
    gradients = []
    for function in (SoftmaxSavedWithoutGrad.apply, apply):
        x = X.clone().requires_grad_(True)
        (function(x) * w).sum().backward()
        gradients.append(x.grad)
    truth_x = X.clone().requires_grad_(True)
    (torch.softmax(truth_x, -1) * w).sum().backward()
    torch.testing.assert_close(gradients[0], truth_x.grad, rtol=1e-12, atol=1e-14)
    if compiled:  # (Inductor's kernels round as they fuse)
        torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-12, atol=1e-14)
    else:
        assert torch.equal(gradients[1], gradients[0])
    jvp = lambda f: torch.func.jvp(f, (X,), (w,))[1]  # noqa: E731
    tangent = (torch.compile(jvp, fullgraph=True) if compiled else jvp)(ours.apply)
    torch.testing.assert_close(tangent, jvp(lambda x: torch.softmax(x, -1)), rtol=1e-12, atol=1e-14)
    hessian = torch.func.hessian(lambda x: (ours.apply(x) * w).sum())
    with pytest.raises(Exception) as raised:
        (torch.compile(hessian, fullgraph=True) if compiled else hessian)(X)
    assert "with grad mode off" in str(_context(raised.value, LookupError))


def _context(error, kind):
    while not isinstance(error, kind) and error.__context__ is not None:
        error = error.__context__
    return error


class ChannelLayerNorm(torch.autograd.Function):
    """NAFNet's LayerNormFunction, restated: a LayerNorm over the channels of N×C×H×W whose backward reads its saved
    tensors by the alias PyTorch still accepts, ``ctx.saved_variables``."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.eps = eps
        mean = x.mean(1, keepdim=True)
        variance = (x - mean).pow(2).mean(1, keepdim=True)
        y = (x - mean) / (variance + eps).sqrt()
        ctx.save_for_backward(y, variance, weight)
        return weight.view(1, -1, 1, 1) * y + bias.view(1, -1, 1, 1)

    @staticmethod
    def backward(ctx, grad):
        y, variance, weight = ctx.saved_variables
        g = grad * weight.view(1, -1, 1, 1)
        gx = (g - y * (g * y).mean(1, keepdim=True) - g.mean(1, keepdim=True)) / (variance + ctx.eps).sqrt()
        return gx, (grad * y).sum((0, 2, 3)), grad.sum((0, 2, 3)), None


def _channel_layer_norm(x, weight, bias, eps):
    mean = x.mean(1, keepdim=True)
    y = (x - mean) / ((x - mean).pow(2).mean(1, keepdim=True) + eps).sqrt()
    return weight.view(1, -1, 1, 1) * y + bias.view(1, -1, 1, 1)


@pytest.mark.filterwarnings("ignore:'saved_variables' is deprecated")
def test_saved_variables_is_read_as_saved_tensors_and_the_backward_embedded_in_every_mode():
    """Issue 76: ``ctx.saved_variables`` sent a linear backward to the fall-back (an AttributeError while proving
    it), losing forward mode, torch.func and compiled forward mode. It is saved_tensors, with PyTorch's warning:
    reverse mode is the mechanism's, forward mode autodiff's of the layer norm, eagerly and compiled."""
    generator = torch.Generator().manual_seed(0)
    x, tangent = (torch.randn(2, 3, 4, 4, dtype=torch.float64, generator=generator) for _ in range(2))
    weight, bias = (torch.randn(3, dtype=torch.float64, generator=generator) for _ in range(2))
    ours = ported(ChannelLayerNorm)
    assert ours.route(x, weight, bias, 1e-6).embedded
    with pytest.warns(DeprecationWarning, match="saved_tensors"):
        ours.apply(x.clone().requires_grad_(True), weight, bias, 1e-6).sum().backward()
    gradients = []
    for function in (ChannelLayerNorm.apply, ours.apply):
        leaf = x.clone().requires_grad_(True)
        (function(leaf, weight, bias, 1e-6) * tangent).sum().backward()
        gradients.append(leaf.grad)
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-13, atol=1e-15)
    truth = torch.func.jvp(lambda x: _channel_layer_norm(x, weight, bias, 1e-6), (x,), (tangent,))[1]
    jvp = lambda x: torch.func.jvp(lambda x: ours.apply(x, weight, bias, 1e-6), (x,), (tangent,))[1]  # noqa: E731
    torch.testing.assert_close(jvp(x), truth, rtol=1e-10, atol=1e-12)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(jvp, fullgraph=True)(x), truth, rtol=1e-10, atol=1e-12)


class SortMarked(sgm.Function):
    """A sort whose indices are marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, indices = x.sort()
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx, grad, _):
        (indices,) = ctx.saved_tensors
        return torch.zeros_like(grad).scatter(-1, indices, grad)


def test_a_call_that_marks_outputs_leaves_nothing_that_recompiles_compiled_code_beside_it():
    """Issue 76: Dynamo guards compiled code on what it reads of the library's record of marked outputs, which a
    call using mark_non_differentiable left filled: alternating such a call with a compiled one recompiled every
    time, and with fullgraph=True 12 of 20 calls raised FailOnRecompileLimitHit. The record is empty between calls:
    one compilation serves every call, and the marked output is still detached, eagerly and compiled."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    exp = ported(Exp2, order=2)
    compiled = torch.compile(lambda x: exp.apply(x) * 2, fullgraph=True, backend=counter)
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    for _ in range(12):
        values, indices = SortMarked.apply(x)
        assert values.requires_grad and not indices.requires_grad
        compiled(x)
    assert counter.frame_count == 1
    values, indices = torch.compile(SortMarked.apply, fullgraph=True, backend="aot_eager")(x)
    assert values.requires_grad and not indices.requires_grad
    (values * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([2.0, 1.0, 3.0]))


class MulUnsummed(torch.autograd.Function):
    """x (4,) times y (3, 4), as PyTorch's NumpyMul sample broadcasts them: the backward returns x's gradient in the
    broadcast shape (3, 4), which PyTorch sums to (4,)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x


class WrongShape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return grad[:1, :1]


def test_a_gradient_pytorch_sums_to_its_inputs_shape_is_summed_and_another_refused_in_pytorchs_words():
    """Issue 76: the class took each gradient in its input's shape alone (the decorator's contract), and raised
    naming the shapes where PyTorch sums a broadcast gradient to the input's shape: a class the mechanism runs.
    It is summed (``sum_to_size``, linear, so forward mode follows), and a shape PyTorch refuses raises PyTorch's
    RuntimeError, in its words."""
    x, y = torch.tensor([1.0, -2.0, 0.5, 3.0]), torch.arange(12.0).view(3, 4)
    w = torch.linspace(-1.0, 1.0, 12).view(3, 4)
    gradients = []
    for function in (MulUnsummed, ported(MulUnsummed)):
        leaf = x.clone().requires_grad_(True)
        (function.apply(leaf, y) * w).sum().backward()
        gradients.append(leaf.grad)
    assert torch.equal(gradients[0], gradients[1]) and gradients[0].shape == (4,)
    tangent = torch.func.jvp(lambda x: ported(MulUnsummed).apply(x, y), (x,), (torch.ones(4),))[1]
    assert torch.equal(tangent, y)
    errors = []
    for function in (WrongShape, ported(WrongShape)):
        with pytest.raises(RuntimeError) as raised:
            function.apply(torch.ones(2, 3, requires_grad=True)).sum().backward()
        errors.append(str(raised.value))
    assert errors[0] == errors[1] == ("Function WrongShapeBackward returned an invalid gradient at index 0 - got "
                                      "[1, 1] but expected shape compatible with [2, 3]")


# ---------------------------------------------------------------- classes the decorator could not run (issue 76)


class ReturnsItsInputDirty(torch.autograd.Function):
    """functorch's test_function_returns_input, mark_dirty in setup_context: the input changed in place (by 0) and
    returned as it is, with a jvp of its own."""

    @staticmethod
    def forward(x):
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_dirty(inputs[0])

    @staticmethod
    def backward(ctx, g):
        return g

    @staticmethod
    def jvp(ctx, t):
        return t.add_(0)


def test_mark_dirty_in_setup_context_runs_as_pytorch_runs_it():
    """It raised NotImplementedError from the port's ctx (6 of functorch's cases): mark_dirty was looked for in
    forward alone. The class now runs as a torch.autograd.Function, returning its very input, with PyTorch's
    gradients and its own jvp, and route names mark_dirty."""
    port = ported(ReturnsItsInputDirty, order=2)
    for function in (ReturnsItsInputDirty, port):
        a = torch.tensor(2.0).clone()
        assert function.apply(a) is a
        assert float(torch.func.grad(lambda x, f=function: f.apply(x.clone()))(torch.tensor(2.0))) == 1.0
        assert float(torch.func.jvp(lambda x, f=function: f.apply(x.clone()), (torch.tensor(2.0),),
                                    (torch.tensor(3.0),))[1]) == 3.0
    assert "mark_dirty" in port.route(torch.tensor(2.0)).reason


class KeywordOnlyShift(torch.autograd.Function):
    """x + shift, shift a keyword-only argument of forward."""

    @staticmethod
    def forward(x, *, shift):
        return x + shift

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return 2 * g


def test_a_keyword_only_argument_meets_pytorchs_own_errors():
    """functorch's test_kwarg_only_tensors: the port raised a TypeError of its own where the class is called; it now
    runs as a torch.autograd.Function, which takes the call and meets PyTorch's errors, word for word: vmap's
    NotImplementedError, and the one a plain call meets (torch.autograd.Function passes no keyword to forward
    there); route names the argument."""
    port = ported(KeywordOnlyShift, order=2)
    calls = (lambda f: torch.func.vmap(lambda x: f.apply(x, shift=torch.ones(3)))(torch.ones(2, 3)),
             lambda f: f.apply(torch.ones(3, requires_grad=True), shift=torch.ones(3)))
    for call in calls:  # (PyTorch's words vary by version: each is compared with this version's)
        with pytest.raises(Exception) as pytorchs:
            call(KeywordOnlyShift)
        with pytest.raises(type(pytorchs.value), match=re.escape(str(pytorchs.value).splitlines()[0])):
            call(port)
    assert "keyword-only arguments (shift)" in port.route(torch.ones(3), shift=torch.ones(3)).reason


class NumpySorted(torch.autograd.Function):
    """A sort in NumPy, as PyTorch's extending.func notes write one: the forward reads the input's values in NumPy,
    and the backward, linear, sends each cotangent back through the inverse permutation."""

    @staticmethod
    def forward(x):
        order = x.cpu().numpy().argsort()
        return torch.as_tensor(x.cpu().numpy()[order]), torch.as_tensor(order.argsort())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])

    @staticmethod
    def backward(ctx, g, _):
        (inverse,) = ctx.saved_tensors
        return g[inverse]


X_UNSORTED = torch.tensor([0.3, -1.2, 2.0, 0.7])
W = torch.tensor([1.0, 10.0, 100.0, 1000.0])
INVERSE = X_UNSORTED.argsort().argsort()


def test_a_forward_in_numpy_runs_in_every_mode_pytorch_has_and_the_port_adds_eager_forward_mode():
    """PyTorch runs a Function's forward on plain tensors; the port ran it on tensors that require grad (order=2
    runs f at x) or on torch.func's wrappers, where ``.numpy()`` raises (functorch's
    test_once_differentiable_autograd_vjp, test_no_vmap_staticmethod_and_no_generate_vmap_rule). Eagerly the call
    is now order 1's: gradient as PyTorch's, forward mode too (from the backward), and a second derivative raises
    naming the NumPy error; under torch.func the class runs as PyTorch runs it, and vmap raises PyTorch's error for
    a Function without vmap support, with the reason."""
    port = ported(NumpySorted, order=2)
    weighted = lambda f: lambda x: (f.apply(x)[0] * W).sum()  # noqa: E731
    for function in (NumpySorted, port):
        x = X_UNSORTED.clone().requires_grad_()
        weighted(function)(x).backward()
        assert torch.equal(x.grad, W[INVERSE])
        assert torch.equal(torch.func.grad(weighted(function))(X_UNSORTED), W[INVERSE])
        assert torch.equal(torch.func.jacrev(lambda x, f=function: f.apply(x)[0])(X_UNSORTED),
                           torch.eye(4)[X_UNSORTED.argsort()])
    with forward_ad.dual_level():
        tangent = forward_ad.unpack_dual(port.apply(forward_ad.make_dual(X_UNSORTED, W))[0]).tangent
    assert torch.equal(tangent, W[X_UNSORTED.argsort()])  # (PyTorch's mechanism has no jvp here)
    x = X_UNSORTED.clone().requires_grad_()
    (g,) = torch.autograd.grad(weighted(port)(x), x, create_graph=True)
    with pytest.raises(LookupError, match=r"PyTorch could not run NumpySorted on arguments it differentiates "
                                          r"\(RuntimeError: Can't call numpy\(\) on Tensor that requires grad"):
        torch.autograd.grad(g.sum() * x.sum(), x)
    with pytest.raises(RuntimeError, match=r"You tried to vmap over NumpySorted, but it does not have vmap support"
                                           r".*NumpySorted.forward could not run on the tensors of a torch.func"):
        torch.func.vmap(lambda x: port.apply(x)[0])(X_UNSORTED.expand(2, 4))


class GradientForAModule(torch.autograd.Function):
    """Dynamo's test_nn_module_dataclasses_as_io: a backward that returns a gradient for a module argument too."""

    @staticmethod
    def forward(ctx, module, x):
        return module.weight.sum() * x

    @staticmethod
    def backward(ctx, g):
        return g * 4, g * 2


def test_a_gradient_for_an_argument_that_is_no_tensor_is_pytorchs_business():
    """The port raised a ValueError of its own at the forward call, a plain one included, where PyTorch raises in
    the backward pass, and torch.compile's Function drops the gradient: it now runs as PyTorch runs it, eagerly
    and compiled, side by side."""
    module = torch.nn.Linear(1, 1, bias=False)
    port = ported(GradientForAModule, order=2)
    for function in (GradientForAModule, port):
        x = torch.ones(3, requires_grad=True)
        y = function.apply(module, x)
        assert torch.equal(y.detach(), module.weight.detach().sum() * torch.ones(3))
        with pytest.raises(RuntimeError, match="returned a gradient different than None at position 1, but the "
                                               "corresponding forward input was not a Variable"):
            y.sum().backward()
    compiled = []  # (torch.compile drops the gradient from torch 2.7 on, and raises before, as both do here)
    for function in (GradientForAModule, port):
        x = torch.ones(3, requires_grad=True)
        try:
            torch.compile(lambda x, f=function: f.apply(module, x), backend="aot_eager", fullgraph=True)(x).sum(
                ).backward()
            compiled.append(x.grad.tolist())
        except Exception:
            compiled.append("raised")
    assert compiled[0] == compiled[1]
    assert "not differentiable" in port.route(module, torch.ones(3)).reason


class ReportsItsSine(torch.autograd.Function):
    """Dynamo's test_nonlocal_list_mutation_in_autograd_function: the forward appends what it computed to a list
    the caller passes, and returns a second output that the backward ignores."""

    @staticmethod
    def forward(ctx, x, report):
        report.append(x.sin())
        return torch.cos(torch.sin(x @ x)), torch.sin(x)

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 + g2, None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_list_the_forward_appends_to_is_the_callers(compiled):
    """The port handed the forward a copy of each container argument (rebuilt around the stopped tensors), so what
    it appended was lost: the caller's list stayed empty. An argument with no tensor to stop is now the caller's
    object, eagerly and compiled, side by side with PyTorch."""
    x = torch.randn(4, 4, requires_grad=True)
    results = []
    for function in (ReportsItsSine, ported(ReportsItsSine, order=2)):
        def fn(x, function=function):
            report = []
            outputs = function.apply(x, report)
            return outputs[0] + outputs[-1], report[0]

        run = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn
        try:
            value, reported = run(x)
        except torch._dynamo.exc.Unsupported:
            if function is ReportsItsSine:  # (Dynamo before torch 2.7 refuses the Function itself)
                pytest.skip("this torch's Dynamo refuses a Function that appends to a list it is passed")
            raise
        (gradient,) = torch.autograd.grad(value.sum(), x)
        results.append((value.detach(), reported.detach(), gradient))
    for mine, pytorchs in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(mine, pytorchs)
    torch.testing.assert_close(results[1][1], x.detach().sin())


class SparseTimesDense(torch.autograd.Function):
    """pyGAT's SpecialSpmmFunction, in our words: a sparse matrix built from its values times a dense one; the
    backward gives the values' gradient at the nonzeros and the dense one's."""

    @staticmethod
    def forward(ctx, indices, values, shape, b):
        a = torch.sparse_coo_tensor(indices, values, shape)
        ctx.save_for_backward(a, b)
        ctx.rows = shape[0]
        return torch.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        at = a._indices()[0, :] * ctx.rows + a._indices()[1, :]
        return None, g.matmul(b.t()).view(-1)[at], None, a.t().matmul(g)


def test_a_sparse_function_compiles_where_pytorchs_does():
    """Under default torch.compile (Inductor) the port crashed (a torch.Size argument, then Inductor's 'Cannot access
    storage of SparseTensorImpl' on the graphs the proof traced from the sparse ops). A class whose methods use
    sparse tensors now runs as torch.autograd.Function under torch.compile, with PyTorch's gradients; eagerly it is
    as before (its backward reads the sparse tensor: the mechanism there too)."""
    indices = torch.tensor([[0, 1, 2, 2], [1, 0, 2, 0]])
    values, b = torch.tensor([0.5, -1.0, 2.0, 3.0]), torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 4.0]])
    port = ported(SparseTimesDense, order=2)
    results = []
    for function in (SparseTimesDense, port):
        loss = lambda v, d, f=function: (f.apply(indices, v, torch.Size([3, 3]), d) * torch.tensor([1.0, 2.0])).sum()  # noqa: E731
        for run in (loss, torch.compile(loss)):
            v, d = values.clone().requires_grad_(), b.clone().requires_grad_()
            results.append(torch.autograd.grad(run(v, d), (v, d)))
    dense = torch.sparse_coo_tensor(indices, values, (3, 3)).to_dense()
    truth = torch.func.grad(lambda v, d: (dense.index_put((indices[0], indices[1]), v) @ d
                                          * torch.tensor([1.0, 2.0])).sum(), (0, 1))(values, b)
    for gradients in results:
        for mine, expected in zip(gradients, truth, strict=True):
            torch.testing.assert_close(mine, expected)
