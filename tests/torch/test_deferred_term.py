"""Issue 75 on PyTorch: a Function's eager call in reverse mode alone, its signature proven at an earlier call, makes
no proof (``deferred_term``): its one node runs the backward as it is, and proves it where a derivative needs the
proof (``create_graph=True``, or a backward that answers for other arguments than the proof kept).

The truths are PyTorch's own Function of the same methods (``torch.autograd.Function``, for first derivatives, and
for double backwards where PyTorch's is right), analytic derivatives, and the ordinary ops' bits
(``test_recorded_term``, which runs this path too). Each test runs several calls of one signature: the first
proves, the later ones defer.
"""

import re
import sys

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from torch_modes import bits as tensor_bits  # noqa: E402
from torch_modes import elementwise_cases  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.torch import decorator_form, unrecorded  # noqa: E402

X = torch.tensor([0.5, -1.5, 2.0, -0.0, 3.0], dtype=torch.float64)
CALLS = 3  # of one signature: the first proves it, the others defer


def _both(forward, backward, order=2):
    """The methods as torch.autograd.Function (the anchor) and as stopgrad_math.torch.Function."""
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return (type("Anchor", (torch.autograd.Function,), dict(methods)),
            type("Ported", (sgm.Function,), {**methods, "order": order}))


def _square_forward(ctx, x):
    ctx.save_for_backward(x)
    return x * x


def _proofs_counted(monkeypatch):
    made = []
    proven = decorator_form._proven_call
    monkeypatch.setattr(decorator_form, "_proven_call", lambda *a, **k: made.append(1) or proven(*a, **k))
    return made


def _gradient(function, x, *others):
    x = x.clone().requires_grad_(True)
    y = function.apply(x, *others)
    return y.grad_fn, torch.autograd.grad(y, x, torch.linspace(-1.0, 2.0, y.numel(), dtype=y.dtype).reshape(y.shape))


def test_a_proven_signature_makes_no_proof_at_its_later_calls_and_gives_pytorchs_gradient(monkeypatch):
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

    anchor, ported = _both(_square_forward, backward)
    made = _proofs_counted(monkeypatch)
    for _ in range(CALLS):
        node, gradient = _gradient(ported, X)
        assert type(node).__name__ == "_DeferredBackward"
        torch.testing.assert_close(gradient, _gradient(anchor, X)[1], rtol=0, atol=0)
    assert len(made) == 1
    _gradient(ported, X[:3])  # another shape: another signature, proven once
    _gradient(ported, X[:3])
    assert len(made) == 2


def test_a_second_derivative_is_the_embeddings_where_the_backward_detaches_its_cotangent():
    """The cotangent's path is linear, so its derivative is 2x although the backward detaches it (PyTorch's own
    double backward has none there); x's is 2·v. Both analytic, at the proving call and the deferring ones."""
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g.detach()

    _, ported = _both(_square_forward, backward)
    for _ in range(CALLS):
        x = X.clone().requires_grad_(True)
        v = torch.linspace(-1.0, 2.0, 5, dtype=torch.float64).requires_grad_(True)
        (g,) = torch.autograd.grad(ported.apply(x), x, v, create_graph=True)
        torch.testing.assert_close(g, 2 * X * v.detach(), rtol=0, atol=0)
        by_v, by_x = torch.autograd.grad(g.sum(), [v, x])
        torch.testing.assert_close(by_v, 2 * X, rtol=0, atol=0)
        torch.testing.assert_close(by_x, 2 * v.detach(), rtol=0, atol=0)


def _exp_saved_without_grad(ctx, x):
    with torch.no_grad():
        e = torch.exp(x)
    ctx.save_for_backward(e)
    return e


def _times_saved(ctx, g):
    (e,) = ctx.saved_tensors
    return g * e


@pytest.mark.parametrize("case", ["order 1", "saved without grad mode"])
def test_a_second_derivative_beyond_what_is_embedded_raises_at_every_call(case):
    forward, order, message = {
        "order 1": (_square_forward, 1, "order=2"),
        "saved without grad mode": (_exp_saved_without_grad, 2, unrecorded.UNRECORDED.format(name="Ported")[:60]),
    }[case]
    backward = _times_saved if case != "order 1" else (lambda ctx, g: 2 * ctx.saved_tensors[0] * g)
    anchor, ported = _both(forward, backward, order)
    for _ in range(CALLS):
        x = X.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(ported.apply(x).sum(), x, create_graph=True)
        torch.testing.assert_close(g, torch.autograd.grad(anchor.apply(x).sum(), x)[0], rtol=0, atol=0)
        with pytest.raises(LookupError, match=re.escape(message)):
            torch.autograd.grad(g.sum(), x)


def _weighted_forward(ctx, x, w):
    ctx.save_for_backward(w)
    return x * w


def _weighted_backward(ctx, g):
    (w,) = ctx.saved_tensors
    return OPERATION(g, w), None


OPERATION = torch.mul  # rebound below


def test_an_in_place_change_of_a_saved_tensor_raises_as_pytorchs_does():
    anchor, ported = _both(_weighted_forward, _weighted_backward)
    for function in (anchor, *[ported] * CALLS):
        w = X + 1.0
        y = function.apply(X.clone().requires_grad_(True), w)
        w.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()



def _saving_output_forward(ctx, x):
    y = x.exp()
    ctx.save_for_backward(y)
    return y


def _saved_output_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * y


def test_an_output_the_forward_saved_changed_in_place_raises_as_pytorchs_does():
    """The node returns the forward's own output (no copy of its elements), so a change in place of it is seen by
    the backward that reads it, as with PyTorch's Function, whose output is the tensor it saved."""
    anchor, ported = _both(_saving_output_forward, _saved_output_backward)
    for function in (anchor, *[ported] * CALLS):
        y = function.apply(X.clone().requires_grad_(True))
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def _returning_input_forward(ctx, x):
    return x


def _doubling_backward(ctx, g):
    return 2 * g


def test_an_output_that_is_the_input_is_a_copy_and_a_change_in_place_of_it_leaves_the_input_as_it_was():
    """PyTorch returns a view of the input and refuses its change in place; the node returns a copy (never x's own
    elements, which a change in place would then change), at every call."""
    anchor, ported = _both(_returning_input_forward, _doubling_backward)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        anchor.apply(X.clone().requires_grad_(True)).add_(1.0)
    for call in range(CALLS):
        x = X.clone().requires_grad_(True)
        y = ported.apply(x)
        assert type(y.grad_fn).__name__ == "_DeferredBackward" or call == 0  # (the first call proves)
        y.add_(1.0)
        torch.testing.assert_close(x.detach(), X, rtol=0, atol=0)
        torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.full_like(X, 2.0), rtol=0, atol=0)


OUTSIDE = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)  # a weight the forward reads from outside


def _outside_forward(ctx, x):
    ctx.save_for_backward(x)
    return x * x * OUTSIDE


def _outside_backward(ctx, g):
    (x,) = ctx.saved_tensors
    return 2 * x * OUTSIDE.detach() * g


def test_a_weight_the_forward_reads_from_outside_keeps_its_path_through_the_node(monkeypatch):
    """y of such a forward is computed at stop(x), with autodiff's path to the weight (Σx², analytic), which the
    node passes its cotangent on to; x's gradient is the backward's (2·3·x), at the deferring calls too."""
    made = _proofs_counted(monkeypatch)
    _, ported = _both(_outside_forward, _outside_backward)
    for _ in range(CALLS):
        x = X.clone().requires_grad_(True)
        gx, gw = torch.autograd.grad(ported.apply(x).sum(), [x, OUTSIDE])
        torch.testing.assert_close(gx, 6.0 * X, rtol=0, atol=0)
        torch.testing.assert_close(gw, (X * X).sum(), rtol=0, atol=0)
    assert len(made) == 1


PASS_WEIGHT = True


def _scaled_forward(ctx, x, w):
    ctx.save_for_backward(x, w)
    return x * w


def _scaled_backward(ctx, g):  # answers for w as a global says
    x, w = ctx.saved_tensors
    return g * w, (g * x if PASS_WEIGHT else None)


@pytest.mark.parametrize("first", [True, False])
def test_a_backward_that_answers_for_other_arguments_at_a_later_call_is_proven_again(monkeypatch, first):
    anchor, ported = _both(_scaled_forward, _scaled_backward)
    w = torch.tensor([2.0, -3.0, 0.5, 1.0, -0.0], dtype=torch.float64)
    for passes in (first, first, not first, not first, first):
        monkeypatch.setattr(sys.modules[__name__], "PASS_WEIGHT", passes)
        gradients = []
        for function in (anchor, ported):
            x, v = X.clone().requires_grad_(True), w.clone().requires_grad_(True)
            gradients.append(torch.autograd.grad(function.apply(x, v).sum(), [x, v], allow_unused=True))
        for a, b in zip(*gradients, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=0, atol=0)


def _sign_backward(ctx, g):  # not linear in g: the class runs as torch.autograd.Function
    (x,) = ctx.saved_tensors
    return g.abs() * 2 * x


def test_a_class_whose_backward_falls_back_gives_pytorchs_double_backward_at_every_call():
    anchor, ported = _both(_square_forward, _sign_backward)
    results = []
    for function in (anchor, *[ported] * CALLS):
        x = X.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(function.apply(x).sum(), x, create_graph=True)
        results.append((g.detach(), torch.autograd.grad(g.sum(), x)[0]))
    for g, second in results[1:]:
        torch.testing.assert_close(g, results[0][0], rtol=0, atol=0)
        torch.testing.assert_close(second, results[0][1], rtol=0, atol=0)
    assert not ported.route(X).embedded


def test_route_proves_a_signature_whose_calls_defer(monkeypatch):
    """A global the backward reads, rebound after the signature was proven, makes the backward not linear: ``route``
    proves again and says so; a deferring call's gradient is PyTorch's own (the backward as it is), and its second
    derivative, which would not be the class's, raises naming why."""
    anchor, ported = _both(_weighted_forward, _weighted_backward)
    w = X + 1.0
    for _ in range(CALLS):
        _gradient(ported, X, w)
    assert ported.route(X, w).embedded
    monkeypatch.setattr(sys.modules[__name__], "OPERATION", lambda g, w: g.abs() * w)
    node, gradient = _gradient(ported, X, w)
    assert type(node).__name__ == "_DeferredBackward"
    torch.testing.assert_close(gradient, _gradient(anchor, X, w)[1], rtol=0, atol=0)
    x = X.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="cannot be embedded at this one"):
        torch.autograd.grad(ported.apply(x, w).sum(), x, create_graph=True)
    route = ported.route(X, w)
    assert not route.embedded and "abs" in route.reason


def _scaled_by_saved_forward(ctx, x, s, d):
    ctx.save_for_backward(d)
    return x * 1.0 + s * 0.0


def _scaled_by_saved_backward(ctx, g):  # x's gradient elementwise, s's a sum: an awkward derivative d, saved
    (d,) = ctx.saved_tensors
    return g * d, (g * d).sum().reshape(()), None


@settings(max_examples=40, deadline=None)
@given(elementwise_cases())
def test_any_shape_dtype_and_awkward_values_give_pytorchs_bits_at_every_call(case):
    """Hypothesis's shapes (0-d and empty too), float dtypes (bfloat16 too), awkward derivatives (±0, ±inf, NaN,
    subnormal) and cotangents: each call's gradients, bit for bit, are PyTorch's own Function's."""
    value, derivative, x, dtype = case
    d, ct = (torch.tensor(a, dtype=dtype) for a in (derivative, value))
    anchor, ported = _both(_scaled_by_saved_forward, _scaled_by_saved_backward)
    for function in (anchor, *[ported] * CALLS):
        xs = [torch.tensor(x, dtype=dtype, requires_grad=True), torch.ones((), dtype=dtype, requires_grad=True)]
        got = [tensor_bits(g) for g in torch.autograd.grad(function.apply(*xs, d), xs, ct)]
        if function is anchor:
            want = got
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()


def _multiply_forward(ctx, x, scale):
    ctx.scale = scale
    return x.clone()


def _multiply_backward(ctx, g):  # fairseq's gradient multiplier: a float set on ctx, new at each call
    return g * ctx.scale, None


def test_a_new_float_at_each_call_defers_and_gives_that_calls_gradient(monkeypatch):
    """The signature takes a float by its type, so a learning-rate-like scale new at each call defers its proof, and
    each call's gradient is its own scale's, as PyTorch's Function gives it (a node that kept the first call's
    backward, or its ctx, would give the first scale)."""
    anchor, ported = _both(_multiply_forward, _multiply_backward)
    made = _proofs_counted(monkeypatch)
    for scale in (0.5, -3.0, 1e-310, float("inf"), 0.25):
        node, gradient = _gradient(ported, X, scale)
        assert type(node).__name__ == "_DeferredBackward"
        want = _gradient(anchor, X, scale)[1]
        assert [tensor_bits(g).tolist() for g in gradient] == [tensor_bits(g).tolist() for g in want]
    assert len(made) == 1


def _thread_calls(anchor, ported, k, failures):
    """Thread k's 24 calls (``test_threads_...``): thread 2 asks second derivatives, thread 3 route() too."""
    shapes = [X, X[:3], torch.cat([X, X])]
    try:
        for i in range(24):
            x0 = shapes[(i + k) % 3] * (1.0 + 0.125 * k)
            if k == 3 and i % 4 == 0:
                assert ported.route(x0).embedded
            x = x0.clone().requires_grad_(True)
            v = torch.linspace(-1.0, 2.0, x0.numel(), dtype=torch.float64)
            expected = torch.autograd.grad(anchor.apply(x), x, v)[0]
            v.requires_grad_(k == 2)
            (g,) = torch.autograd.grad(ported.apply(x), x, v, create_graph=k == 2)
            torch.testing.assert_close(g, expected, rtol=0, atol=0)
            if k == 2:
                by_v, by_x = torch.autograd.grad(g.sum(), [v, x])
                torch.testing.assert_close(by_v, 2 * x0, rtol=0, atol=0)
                torch.testing.assert_close(by_x, 2 * v.detach(), rtol=0, atol=0)
    except Exception as error:  # (reported by the test's thread)
        failures.append(error)


def test_threads_proving_and_deferring_one_class_at_once_each_get_pytorchs_gradient():
    """Four threads call one class at once, on three shapes in turns (each signature proven by whichever thread
    comes first, deferred by the others), one of them asking second derivatives (proven in its backward: 2·v and
    2x, analytic), another asking route() (which proves: a thread-local flag): every first derivative is PyTorch's
    Function's bits, and nothing raises."""
    import threading

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

    anchor, ported = _both(_square_forward, backward)
    failures: list[Exception] = []
    threads = [threading.Thread(target=_thread_calls, args=(anchor, ported, k, failures)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
