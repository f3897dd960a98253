"""PyTorch's own tests of torch.autograd.Function (functorch's TestAutogradFunction and Dynamo's
test_autograd_function.py, read in PyTorch's repository), restated in our words where a decorator can express
them: each Function is run as PyTorch runs it and through the decorator by the Function API shim
(tests/torch/function_shim.py), beside the analytic truth of its rule (the derivative its backward defines, which for
some is deliberately not its forward's). The Function gives reverse mode alone (most of them have no jvp nor
vmap rule); the decorator must give the truth in every mode. The cases a decorator cannot express, and the
differences, are classified in docs/torch.md."""

import enum
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from function_shim import ported, through_decorator  # noqa: E402
from torch.autograd.function import once_differentiable  # noqa: E402
from torch_modes import MODES  # noqa: E402

X = torch.tensor([0.3, -1.2, 2.0, 0.7, 1.5, -0.4], dtype=torch.float64)
EVERY_MODE = ["backward", "autograd.grad", "forward_ad", "func.grad", "func.jvp", "func.jacrev", "func.jacfwd",
              "func.vmap(func.grad)"]


class Doubled(torch.autograd.Function):
    """Its backward passes the gradient through: the rule is 1, not its forward's 2."""

    @staticmethod
    def forward(ctx, x):
        return x + x

    @staticmethod
    def backward(ctx, grad):
        return grad


class Shaken(torch.autograd.Function):
    """Doubled, with classmethods."""

    @classmethod
    def forward(cls, ctx, x):
        return x + x

    @classmethod
    def backward(cls, ctx, grad):
        return grad


class TripledSaved(torch.autograd.Function):
    """Saves its output, and scales the gradient by √(its element count)."""

    @staticmethod
    def forward(ctx, x):
        result = x + x + x
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        return grad * math.sqrt(result.numel())


class ScaledByAttribute(torch.autograd.Function):
    """sin's value, a rule 3 kept on the context as an attribute."""

    @staticmethod
    def forward(ctx, x):
        ctx.scale = 3.0
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale


class HalvedOnce(torch.autograd.Function):
    """The identity, its gradient halved by a backward that is @once_differentiable (run under no_grad)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return grad * 0.5


class StrideRead(torch.autograd.Function):
    """Its backward reads the cotangent's stride, metadata and not a value."""

    @staticmethod
    def forward(ctx, x):
        return torch.add(x, x)

    @staticmethod
    def backward(ctx, grad):
        return grad * grad.stride()[-1]


class TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone(), x.clone()

    @staticmethod
    def backward(ctx, grad1, grad2):
        return grad1 + grad2


class Choice(enum.Enum):
    SIN = 0
    COS = 1


class ByEnum(torch.autograd.Function):
    """A non-tensor argument chooses the value; the rule is 1."""

    @staticmethod
    def forward(ctx, x, choice):
        return x.sin() if choice is Choice.SIN else x.cos()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class MaskedThroughData(torch.autograd.Function):
    """relu, its backward masking the gradient through .data."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        result = grad.clone()
        result.data[x < 0] = 0
        return result


class BranchOnRequiresGrad(torch.autograd.Function):
    """A backward that branches on its cotangent requiring grad, which it never does in a backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if grad.requires_grad:
            return grad * x.exp()
        return grad * x.cos()


class NumpyCube(torch.autograd.Function):
    """x³ computed in NumPy; the backward, @once_differentiable, reads NumPy values kept on the context."""

    @staticmethod
    def forward(x):
        x_np = x.detach().cpu().numpy()
        return torch.tensor(x_np**3, device=x.device), x_np

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.x_np = output[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, grad_np):
        return grad * torch.tensor(3 * ctx.x_np**2, device=grad.device)


class LinearWithSetupContext(torch.autograd.Function):
    """A linear layer: forward and setup_context apart, a backward that reads needs_input_grad."""

    @staticmethod
    def forward(x, weight, bias):
        return x.mm(weight.t()) + bias.unsqueeze(0).expand(x.shape[0], -1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, weight, _ = ctx.saved_tensors
        grads = [None, None, None]
        if ctx.needs_input_grad[0]:
            grads[0] = grad.mm(weight)
        if ctx.needs_input_grad[1]:
            grads[1] = grad.t().mm(x)
        if ctx.needs_input_grad[2]:
            grads[2] = grad.sum(0)
        return tuple(grads)


# case: (the function of x, built from the Function's apply, and the analytic derivative of its rule along ones)
CASES = {
    "Doubled (backward passes the gradient)": (lambda apply: apply, lambda x: torch.ones_like(x)),
    "Shaken (classmethods)": (lambda apply: apply, lambda x: torch.ones_like(x)),
    "TripledSaved (save_for_backward)": (lambda apply: apply, lambda x: torch.full_like(x, math.sqrt(x.numel()))),
    "ScaledByAttribute (an attribute on ctx)": (lambda apply: apply, lambda x: torch.full_like(x, 3.0)),
    "HalvedOnce (@once_differentiable)": (lambda apply: apply, lambda x: torch.full_like(x, 0.5)),
    "StrideRead (the cotangent's stride)": (lambda apply: apply, lambda x: torch.ones_like(x)),
    "TwoOutputs": (lambda apply: lambda x: sum(apply(x)), lambda x: torch.full_like(x, 2.0)),
    "ByEnum (a non-tensor argument)": (lambda apply: lambda x: apply(x, Choice.COS), lambda x: torch.ones_like(x)),
    "MaskedThroughData (.data in backward)": (lambda apply: apply, lambda x: (x > 0).to(x.dtype)),
    "BranchOnRequiresGrad": (lambda apply: apply, lambda x: torch.cos(x)),
    "NumpyCube (NumPy, @once_differentiable)": (lambda apply: lambda x: apply(x)[0], lambda x: 3 * x**2),
}
FUNCTIONS = {"Doubled (backward passes the gradient)": Doubled, "Shaken (classmethods)": Shaken,
             "TripledSaved (save_for_backward)": TripledSaved,
             "ScaledByAttribute (an attribute on ctx)": ScaledByAttribute,
             "HalvedOnce (@once_differentiable)": HalvedOnce, "StrideRead (the cotangent's stride)": StrideRead,
             "TwoOutputs": TwoOutputs, "ByEnum (a non-tensor argument)": ByEnum,
             "MaskedThroughData (.data in backward)": MaskedThroughData,
             "BranchOnRequiresGrad": BranchOnRequiresGrad, "NumpyCube (NumPy, @once_differentiable)": NumpyCube}
NUMPY_IN_FORWARD = {"NumpyCube (NumPy, @once_differentiable)"}  # reads values in f: eager modes only, as PyTorch's
NOT_UNDER_VMAP = {  # limits, each tested as such below
    "StrideRead (the cotangent's stride)": "under vmap each call's cotangent is 0-d, which has no stride[-1]",
    "MaskedThroughData (.data in backward)": "a boolean-mask index cannot be traced by shapes alone",
}


def _modes(case):
    if case in NUMPY_IN_FORWARD:
        return ["backward", "autograd.grad", "forward_ad"]
    return [m for m in EVERY_MODE if not (case in NOT_UNDER_VMAP and m.startswith("func.vmap"))]


@pytest.mark.parametrize("case", CASES)
def test_the_function_gives_its_rule_in_reverse_mode(case):
    """The anchor: PyTorch's Function itself, against the analytic truth of its rule, with a contiguous cotangent
    (as Dynamo's stride test gives it: sum's backward would give an expanded one, of stride 0)."""
    make, truth = CASES[case]
    x = X.clone().requires_grad_(True)
    [got] = torch.autograd.grad(make(FUNCTIONS[case].apply)(x), x, torch.ones_like(X))
    torch.testing.assert_close(got, truth(X))


@pytest.mark.parametrize("case, mode", [(c, m) for c in CASES for m in _modes(c)])
def test_the_function_through_the_decorator_gives_its_rule_in_every_mode(case, mode):
    """MODES take the derivative along ones; under vmap each call sees one element, so a rule that reads the
    shape (TripledSaved's √numel) sees one element there, as PyTorch's own vmap shows a rule."""
    make, truth = CASES[case]
    want = torch.cat([truth(X[k:k + 1]) for k in range(len(X))]) if mode.startswith("func.vmap") else truth(X)
    torch.testing.assert_close(MODES[mode](make(through_decorator(FUNCTIONS[case])), X), want)


def _linear(x, weight, bias):
    return x.mm(weight.t()) + bias


@pytest.mark.parametrize("mode", ["backward", "func.jacrev", "func.jacfwd"])
def test_a_linear_layer_with_setup_context_and_needs_input_grad(mode):
    """Each argument's Jacobian through the decorator against PyTorch's autodiff of the same formula."""
    generator = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 3, generator=generator, dtype=torch.float64),
            torch.randn(4, 3, generator=generator, dtype=torch.float64),
            torch.randn(4, generator=generator, dtype=torch.float64)]
    apply = through_decorator(LinearWithSetupContext)
    for position in range(3):
        def at(value, fn, position=position):
            return fn(*[value if k == position else a for k, a in enumerate(args)])

        if mode == "backward":
            ours, truth = (torch.autograd.functional.jacobian(lambda v, fn=fn: at(v, fn), args[position])
                           for fn in (apply, _linear))
        else:
            jacobian = getattr(torch.func, mode.removeprefix("func."))
            ours, truth = (jacobian(lambda v, fn=fn: at(v, fn))(args[position]) for fn in (apply, _linear))
        torch.testing.assert_close(ours, truth)


def test_the_function_and_the_decorator_give_the_linear_layers_gradients_side_by_side():
    generator = torch.Generator().manual_seed(1)
    args = [torch.randn(2, 3, generator=generator, dtype=torch.float64, requires_grad=True),
            torch.randn(4, 3, generator=generator, dtype=torch.float64, requires_grad=True),
            torch.randn(4, generator=generator, dtype=torch.float64, requires_grad=True)]
    ct = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    theirs = torch.autograd.grad(LinearWithSetupContext.apply(*args), args, ct)
    ours = torch.autograd.grad(through_decorator(LinearWithSetupContext)(*args), args, ct)
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want)


class ScaledWithAMask(torch.autograd.Function):
    """Two outputs, the second (a mask, in the input's dtype) marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        mask = (x > 0).to(x.dtype)
        ctx.mark_non_differentiable(mask)
        return x * 3.0, mask

    @staticmethod
    def backward(ctx, grad, grad_mask):
        return grad * 3.0


@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.jacrev", "func.jacfwd"])
def test_an_output_marked_non_differentiable_has_no_derivative_and_the_other_its_rule(mode):
    apply = through_decorator(ScaledWithAMask)
    x = X.clone().requires_grad_(True)
    assert not ScaledWithAMask.apply(x)[1].requires_grad and not apply(x)[1].requires_grad
    torch.testing.assert_close(MODES[mode](lambda x: apply(x)[0] + apply(x)[1], X), torch.full_like(X, 3.0))


# ---------------------------------------------------------------- the differences, each tested as what it is


@pytest.mark.parametrize("case", NOT_UNDER_VMAP)
def test_under_vmap_a_rule_that_reads_a_stride_or_masks_by_a_boolean_index_raises(case):
    """Limits under vmap, raised and never a silent wrong number: a 0-d cotangent has no stride[-1] (PyTorch's
    own vmap shows the rule the same 0-d tensor), and a boolean mask's result has a shape that depends on values,
    which the decorator's trace by shapes cannot follow (write torch.where): there the call falls back to
    torch.autograd.Function, which PyTorch refuses under torch.func for a forward that takes ctx."""
    make, _ = CASES[case]
    with pytest.raises((IndexError, ValueError, RuntimeError), match=r"index out of range|setup_context"):
        MODES["func.vmap(func.grad)"](make(through_decorator(FUNCTIONS[case])), X)


class UnmaterializedGrads(torch.autograd.Function):
    """set_materialize_grads(False): the backward gets None for an output the loss does not use."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        return x.clone(), y.clone()

    @staticmethod
    def backward(ctx, gx, gy):
        return gx, (torch.full_like(gx, math.nan) if gy is None else gy)


def test_set_materialize_grads_false_is_not_honoured_the_decorator_materializes_zeros():
    """Deliberate: the decorator traces a VJP on a cotangent for every floating output (zeros where unused), so
    a backward written for None sees zeros; the Function gives it None. The gradient of the used output is the
    same."""
    x, y = torch.tensor([2.0], requires_grad=True), torch.tensor([3.0], requires_grad=True)
    (UnmaterializedGrads.apply(x, y)[0] ** 2).sum().backward()
    theirs = (x.grad.clone(), y.grad.clone())
    x.grad = y.grad = None
    (through_decorator(UnmaterializedGrads)(x, y)[0] ** 2).sum().backward()
    torch.testing.assert_close(x.grad, theirs[0])
    assert np.isnan(theirs[1].item()) and y.grad.item() == 0.0


class TimesThreeInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(3)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def test_mark_dirty_falls_back_to_the_function_exact_in_reverse_mode_and_forward_mode_raises_naming_it():
    """A forward that marks its argument dirty changes it in place, which the decorator's f may not: the class is
    run by torch.autograd.Function (its forward names mark_dirty), so reverse mode is PyTorch's to the bit, and
    forward mode raises, naming mark_dirty."""
    ours = ported(TimesThreeInPlace)
    grads = []
    for function in (TimesThreeInPlace, ours):
        x = torch.tensor([1.0, -2.0], requires_grad=True)
        y = function.apply(x * 1.0)
        (y * torch.tensor([5.0, 7.0])).sum().backward()
        grads.append((y.detach(), x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert not ours.route(torch.ones(2)).embedded and "mark_dirty" in ours.route(torch.ones(2)).reason
    with torch.autograd.forward_ad.dual_level(), pytest.raises(RuntimeError, match="mark_dirty"):
        ours.apply(torch.autograd.forward_ad.make_dual(torch.ones(2), torch.ones(2)) * 1.0)


class AbsOfGradient(torch.autograd.Function):
    """A backward that is not linear in its cotangent (``abs``): stopgrad_math.torch.Function cannot embed it, so
    the class runs as a torch.autograd.Function, with and without setup_context."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad.abs()


def test_a_fallback_under_a_transform_in_a_compiled_function_raises_where_pytorch_drops_the_backward():
    """Compiled, PyTorch differentiates a Function's forward inside torch.func.grad and drops its backward
    (pytorch#193279): the Function itself gives clone's gradient w there, where eagerly (the truth, its rule) it
    gives |w|. A class that falls back to PyTorch's mechanism there raises, naming the issue; eagerly it gives |w|;
    compiled without a transform, reverse mode is PyTorch's rule."""
    w = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    x = torch.tensor([0.5, 0.25, -1.0], dtype=torch.float64)
    ours = ported(AbsOfGradient)
    assert not ours.route(x).embedded

    def grad_of(apply):
        return torch.func.grad(lambda x: (apply(x) * w).sum())

    assert torch.equal(grad_of(AbsOfGradient.apply)(x), w.abs())
    assert torch.equal(torch.compile(grad_of(AbsOfGradient.apply), fullgraph=True)(x), w)  # PyTorch's drop
    assert torch.equal(grad_of(ours.apply)(x), w.abs())
    with pytest.raises(Exception, match="193279"):
        torch.compile(grad_of(ours.apply), fullgraph=True, backend="aot_eager")(x)
    moving = x.clone().requires_grad_(True)
    (torch.compile(ours.apply, fullgraph=True, backend="aot_eager")(moving) * w).sum().backward()
    assert torch.equal(moving.grad, w.abs())


def test_a_fallback_in_forward_mode_in_a_compiled_function_raises_where_pytorch_gives_the_forwards_derivative():
    """Compiled, PyTorch gives forward mode of a Function without a jvp as its forward's derivative (clone's, 1),
    where eagerly it raises: the declared rule (|·| of the cotangent) is dropped without a word. A class that falls
    back raises there, naming the class and why it falls back; eagerly it raises too."""
    x = torch.tensor([0.5, 0.25, -1.0], dtype=torch.float64)
    ours = ported(AbsOfGradient)
    forward_ad = torch.autograd.forward_ad

    def tangent_of(apply):
        def tangent(x):
            with forward_ad.dual_level():
                return forward_ad.unpack_dual(apply(forward_ad.make_dual(x, -torch.ones_like(x)))).tangent
        return tangent

    assert torch.equal(torch.compile(tangent_of(AbsOfGradient.apply), fullgraph=True, backend="aot_eager")(x),
                       -torch.ones_like(x))  # PyTorch's drop
    for run in (tangent_of(ours.apply), torch.compile(tangent_of(ours.apply), fullgraph=True, backend="aot_eager")):
        with pytest.raises(Exception, match=r"AbsOfGradient.*(abs|linear)") as raised:
            run(x)
        assert "forward" in str(raised.value)
