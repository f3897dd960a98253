"""Issue 75 on PyTorch: eagerly, where reverse mode alone can ask (no torch.func transform, compilation or
forward-mode level), the decorator at ``order=2`` (``stopgrad_math.torch.Function``'s default) records one node
whose backward is the proven VJP between two negations (``recorded_term``), where its ordinary ops made a zero
term of about six ops and a carrier Function. It is a fast path of the definition: each first and second
derivative here is the ordinary ops', bit for bit (−0.0, NaN's sign), with the path forced off for the
reference, and the path is taken (counted). A ``stopgrad_math.torch.Function``'s call runs its own node
(``deferred_term``), whose first derivatives are its backward's, as PyTorch's Function gives them.

The VJPs restated from real code: the ported Functions of ``test_ported_functions`` (sparsemax, a gradient
multiplier, a learned-step quantizer, PyTorch's documented linear layer, a top-k mask, eigh's two cotangents) at
awkward cotangents, and decorated functions: an elementwise rule at awkward inputs, two outputs of which one is
unused, a complex sine, half precision, and one that reads a weight besides its argument; and hypothesis's
shapes, dtypes and awkward values.
"""

from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from bit_patterns import bits  # noqa: E402
from function_shim import ported  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from test_ported_functions import PAIRS  # noqa: E402
from torch_modes import bits as tensor_bits  # noqa: E402
from torch_modes import elementwise_cases, fresh_compilation  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.torch import deferred_term, recorded_term  # noqa: E402

AWKWARD = [0.5, 100.0, -0.0, 0.0, -3.0, float("inf"), -float("inf"), float("nan"), 1e-310, -2.5e300]


def _awkward_like(t):
    values = torch.tensor(AWKWARD, dtype=torch.float64).repeat(t.numel() // len(AWKWARD) + 1)[:t.numel()]
    return values.reshape(t.shape).to(t.dtype)


def _log1pexp(x):
    e = torch.exp(x)
    return torch.log1p(e), lambda ct: ct * (1 - 1 / (1 + e))


def _sin_cos(x):  # the cosine left unused below: its cotangent is None
    return (torch.sin(x), torch.cos(x)), lambda cts: cts[0] * torch.cos(x) - cts[1] * torch.sin(x)


def _complex_sin(x):
    return torch.sin(x), lambda ct: ct * torch.cos(x).conj()


WEIGHT = torch.tensor([1.5, -2.0, 0.25], dtype=torch.float64, requires_grad=True)


def _weighted(x):  # reads a weight that requires grad: y keeps its autodiff w.r.t. it
    return WEIGHT * torch.tanh(x), lambda ct: ct * WEIGHT * (1 - torch.tanh(x) ** 2)


X = torch.tensor([0.3, -1.2, 2.0, -0.0, 0.0, 40.0], dtype=torch.float64)
DECORATED = {  # f, its argument, which outputs are used
    "log1pexp at awkward inputs": (_log1pexp, torch.tensor(AWKWARD, dtype=torch.float64), None),
    "two outputs, one unused": (_sin_cos, X, [0]),
    "complex sine": (_complex_sin, torch.complex(X, X.flip(0)), None),
    "float16": (_log1pexp, X.to(torch.float16), None),
    "reads a weight": (_weighted, X[:3], None),
}


def _used(out, which):
    outs = out if isinstance(out, tuple) else (out,)
    return [outs[k] for k in (which if which is not None else range(len(outs)))]


def _first_and_second(call, args, moving, which, cotangent):
    """The gradients w.r.t. the moving arguments at ``cotangent(output)``, and the gradient of their weighted sum
    (a double backward), each as bits; and how often the node was made."""
    args = [a.detach().clone().requires_grad_(k in moving) if isinstance(a, torch.Tensor) else a
            for k, a in enumerate(args)]
    outputs = _used(call(*args), which)
    cotangents = [cotangent(o) for o in outputs]
    firsts = torch.autograd.grad(outputs, [args[k] for k in moving], cotangents, create_graph=True,
                                 allow_unused=True)
    penalty = sum((g.real.square() * 0.5).sum() for g in firsts if g is not None and g.requires_grad)
    seconds = [None] * len(moving) if not torch.is_tensor(penalty) else torch.autograd.grad(
        penalty, [args[k] for k in moving], allow_unused=True)
    again = torch.autograd.grad(_used(call(*args), which), [args[k] for k in moving], cotangents, allow_unused=True)
    return [None if g is None else bits(torch.view_as_real(g.detach()) if g.is_complex() else g.detach())
            for g in (*firsts, *seconds, *again)]


def _both(monkeypatch, call, args, moving, which, cotangent):
    made = []
    recorded, deferred = recorded_term.recorded, deferred_term.Call.attached
    monkeypatch.setattr(recorded_term, "recorded", lambda *a: made.append(1) or recorded(*a))
    monkeypatch.setattr(deferred_term.Call, "attached", lambda *a: made.append(1) or deferred(*a))  # (a Function's)
    fast = _first_and_second(call, args, moving, which, cotangent)
    taken = len(made)
    monkeypatch.setattr(recorded_term, "reverse_alone", lambda: False)
    ordinary = _first_and_second(call, args, moving, which, cotangent)
    return fast, ordinary, taken, len(made) - taken


def _assert_same(fast, ordinary):
    assert len(fast) == len(ordinary)
    for a, b in zip(fast, ordinary, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert (a == b).all()


def _same_values(fast, ordinary):
    """Equal as numbers (−0.0 and +0.0 alike), NaN where NaN."""
    for a, b in zip(fast, ordinary, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            as_floats = [t.view(f"float{8 * t.dtype.itemsize}") for t in (a, b)]
            assert np.array_equal(*as_floats, equal_nan=True)


@pytest.mark.parametrize("cotangent", ["normal", "awkward"])
@pytest.mark.parametrize("case", PAIRS)
def test_a_ported_function_gives_pytorchs_first_derivatives_and_the_ordinary_ops_second(monkeypatch, case,
                                                                                      cotangent):
    """A Function's class runs its node (``deferred_term``): its first derivatives are its backward's own, bit for
    bit as PyTorch's Function of the same methods gives them (where the ordinary ops' −Jᵀ(−ȳ) may differ in the
    sign of a zero or a NaN), and its second derivatives the ordinary ops' numbers."""
    _, function, args, moving = PAIRS[case]
    apply = ported(function.__self__, order=2).apply
    cotangents = {"normal": lambda o: torch.randn(o.shape, generator=torch.Generator().manual_seed(3),
                                                  dtype=o.dtype),
                  "awkward": _awkward_like}[cotangent]
    fast, ordinary, taken, taken_after = _both(monkeypatch, apply, args, moving, None, cotangents)
    anchor = _first_and_second(function, args, moving, None, cotangents)
    count = len(moving)
    _assert_same(fast[:count] + fast[2 * count:], anchor[:count] + anchor[2 * count:])
    _same_values(fast[count:2 * count], ordinary[count:2 * count])
    assert taken == 2 and taken_after == 0  # the path, twice; and forced off for the reference


@pytest.mark.parametrize("case", DECORATED)
def test_a_decorated_function_gives_the_ordinary_ops_derivatives_bit_for_bit(monkeypatch, case):
    f, x, which = DECORATED[case]
    decorated = sgm.custom_gradient(f, order=2)
    fast, ordinary, taken, _ = _both(monkeypatch, decorated, (x,), (0,), which, _awkward_like)
    _assert_same(fast, ordinary)
    assert taken == 2


def test_a_weight_read_besides_the_arguments_keeps_its_autodiff_through_the_node():
    decorated = sgm.custom_gradient(_weighted, order=2)
    x = X[:3].clone().requires_grad_(True)
    WEIGHT.grad = None
    decorated(x).sum().backward()
    torch.testing.assert_close(WEIGHT.grad, torch.tanh(X[:3]), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, WEIGHT.detach() * (1 - torch.tanh(X[:3]) ** 2), rtol=0, atol=0)


def test_an_in_place_change_of_what_the_vjp_reads_raises_as_the_carrier_does():
    def scaled(x, s):
        return x * s, lambda ct: (ct * s, None)

    decorated = sgm.custom_gradient(scaled, order=2)
    x, s = X.clone().requires_grad_(True), X.clone() + 1.0
    y = decorated(x, s)
    s.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("where", ["order 1", "forward-mode level", "torch.func", "compiled"])
def test_the_path_is_not_taken_where_another_derivative_can_ask(monkeypatch, where):
    made = []
    recorded = recorded_term.recorded
    monkeypatch.setattr(recorded_term, "recorded", lambda *a: made.append(1) or recorded(*a))
    x = X.clone().requires_grad_(True)
    decorated = sgm.custom_gradient(_log1pexp, order=1 if where == "order 1" else 2)
    if where == "forward-mode level":
        with torch.autograd.forward_ad.dual_level():
            decorated(x).sum().backward()
    elif where == "torch.func":
        torch.func.grad(lambda x: decorated(x).sum())(X)
    elif where == "compiled":
        fresh_compilation(monkeypatch)
        torch.compile(lambda x: decorated(x).sum(), backend="eager", fullgraph=True)(x).backward()
    else:
        decorated(x).sum().backward()
    assert made == []
    decorated(x).sum().backward()  # (and where it is, it is counted)
    assert made == ([] if where == "order 1" else [1])


@settings(max_examples=40, deadline=None)
@given(elementwise_cases())
def test_any_shape_dtype_and_awkward_values_give_the_ordinary_ops_bits(case):
    """A VJP of two arguments (x elementwise, a scale by a sum) that closes over an awkward derivative, at an
    awkward cotangent, in every float dtype (bfloat16 too) and shape (0-d and empty too)."""
    value, derivative, x, dtype = case
    fx, g, ct = (torch.tensor(a, dtype=dtype) for a in (value, derivative, value))

    def f(x, s):
        return fx * 1.0, lambda ct: (ct * g, (ct * g).sum().reshape(s.shape))

    decorated = sgm.custom_gradient(f, order=2)

    def gradients():
        xs = [torch.tensor(x, dtype=dtype, requires_grad=True), torch.ones((), dtype=dtype, requires_grad=True)]
        return [tensor_bits(d) for d in torch.autograd.grad(decorated(*xs), xs, ct)]

    made = []
    recorded = recorded_term.recorded
    with mock.patch.object(recorded_term, "recorded", lambda *a: made.append(1) or recorded(*a)):
        fast = gradients()
    with mock.patch.object(recorded_term, "reverse_alone", lambda: False):
        ordinary = gradients()
    assert made == [1]
    for a, b in zip(fast, ordinary, strict=True):
        assert a.shape == b.shape and (a == b).all()
