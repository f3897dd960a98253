"""A VJP written as PyTorch users write a Function's ``backward`` (issue 43): under ``no_grad``, with
``@once_differentiable``, branching on grad mode, masking through ``.data``, changing the cotangent in place.
The decorator embeds the map such a backward applies; each is checked in every mode against PyTorch's autodiff
of the closed form, never against the library. Reads of the cotangent's value are refused eagerly, as under
torch.func; non-finite values stay at the elements they reach, as in plain autodiff."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch.autograd.function import once_differentiable  # noqa: E402
from torch_modes import COMPILED_MODES, MODES, fresh_compilation  # noqa: E402
from torch_modes import ours as torch_modes_ours  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

X = torch.tensor([0.4, -1.3, 2.2, 0.9], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    fresh_compilation(monkeypatch)  # each test compiles anew: one f after another would reach the recompile limit
FIRST_ORDER = [m for m in MODES if m != "autograd.grad(create_graph)"]


def _no_grad(x):
    def vjp(ct):
        with torch.no_grad():
            return ct * torch.cos(x)
    return vjp


def _no_grad_decorator(x):
    @torch.no_grad()
    def vjp(ct):
        return ct * torch.cos(x)
    return vjp


def _grad_disabled(x):
    def vjp(ct):
        with torch.set_grad_enabled(False):
            return ct * torch.cos(x)
    return vjp


def _inference_mode(x):
    def vjp(ct):
        with torch.inference_mode():
            return ct * torch.cos(x)
    return vjp


def _once_differentiable(x):
    @once_differentiable
    def vjp(ct):
        return ct * torch.cos(x)
    return vjp


def _branch_on_grad_mode(x):
    def vjp(ct):  # a backward runs without grad mode: the first branch is never the rule
        if torch.is_grad_enabled():
            return ct * torch.sin(x + 1)
        return ct * torch.cos(x)
    return vjp


def _branch_on_requires_grad(x):
    def vjp(ct):  # a backward's cotangent does not require grad
        if ct.requires_grad:
            return ct * torch.sin(x + 1)
        return ct * torch.cos(x)
    return vjp


def _in_place(x):
    def vjp(ct):
        return ct.mul_(torch.cos(x))
    return vjp


def _detached(x):
    def vjp(ct):
        return ct.detach() * torch.cos(x)
    return vjp


AS_BACKWARD = {  # each VJP's map is ct·cos(x): the decorated function is sin's value with sin's derivative
    "with torch.no_grad()": _no_grad,
    "@torch.no_grad()": _no_grad_decorator,
    "set_grad_enabled(False)": _grad_disabled,
    "inference_mode": _inference_mode,
    "@once_differentiable": _once_differentiable,
    "a branch on torch.is_grad_enabled()": _branch_on_grad_mode,
    "a branch on ct.requires_grad": _branch_on_requires_grad,
    "ct changed in place": _in_place,
    "ct.detach()": _detached,
}


def _decorated(make_vjp, order=1):
    @sgm.custom_gradient(order=order)
    def sin(x):
        return torch.sin(x), make_vjp(x)
    return sin


@pytest.mark.parametrize("mode", FIRST_ORDER)
@pytest.mark.parametrize("case", AS_BACKWARD)
def test_a_vjp_written_as_a_backward_gets_the_derivative_of_the_map_a_backward_applies(case, mode):
    torch.testing.assert_close(MODES[mode](_decorated(AS_BACKWARD[case]), X), MODES[mode](torch.sin, X))


def test_a_mask_written_through_data_is_the_map_a_backward_applies():
    """PyTorch's test_data_in_bwd: ``g.data[x < 0] = 0`` in the backward of relu-like masking."""
    @sgm.custom_gradient
    def masked(x):
        def vjp(ct):
            g = ct.clone()
            g.data[x < 0] = 0
            return g
        return torch.relu(x), vjp

    for mode in ("backward", "autograd.grad", "forward_ad"):
        torch.testing.assert_close(MODES[mode](masked, X), MODES[mode](torch.relu, X))


@pytest.mark.parametrize("case", ["with torch.no_grad()", "@once_differentiable",
                                  "a branch on torch.is_grad_enabled()"])
def test_order_2_of_a_vjp_written_as_a_backward_has_the_exact_second_derivative(case):
    sin = _decorated(AS_BACKWARD[case], order=2)
    want = torch.func.hessian(lambda x: torch.exp(torch.sin(x)).sum())(X)
    torch.testing.assert_close(torch.func.hessian(lambda x: torch.exp(sin(x)).sum())(X), want)


def test_a_decorated_call_inside_a_vjp_under_no_grad():
    @sgm.custom_gradient
    def double(u):
        return u * 2.0, lambda ct: ct * 2.0

    @sgm.custom_gradient
    def f(x):
        def vjp(ct):
            with torch.no_grad():
                return double(ct) * x
        return x * x, vjp

    for mode in FIRST_ORDER:
        torch.testing.assert_close(MODES[mode](f, X), 2.0 * X)


COMPILABLE = [c for c in AS_BACKWARD if c != "@once_differentiable"]  # Dynamo cannot trace it applied inside f
# torch 2.6's Dynamo cannot apply the @torch.no_grad() decorator to a function defined inside the compiled one either
DYNAMO_DECORATES_INSIDE = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 7)


@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.parametrize("case", COMPILABLE)
def test_under_torch_compile_a_vjp_written_as_a_backward_gets_the_derivative_of_its_map(case, mode):
    """f and its VJP closing over nothing from outside: the map traced as a backward runs, and its transpose, run
    inside the compiled graph (AOTAutograd differentiates their ATen ops)."""
    if case == "@torch.no_grad()" and not DYNAMO_DECORATES_INSIDE:
        with pytest.raises(RuntimeError):  # Dynamo's own InternalTorchDynamoError (NotImplementedError), on 2.6
            COMPILED_MODES[mode](_decorated(AS_BACKWARD[case]), X)
        return
    torch.testing.assert_close(COMPILED_MODES[mode](_decorated(AS_BACKWARD[case]), X), torch.cos(X))


WEIGHT = torch.tensor([1.5, -0.5, 2.0, 0.25], dtype=torch.float64)  # a global from outside f
OUTSIDE_CASES = [c for c in COMPILABLE if c != "@torch.no_grad()" or DYNAMO_DECORATES_INSIDE]


def _scaled(make_vjp, read_weight):
    """sin(x)·w with the map ct ↦ ct·w·cos(x), w read from outside f at each call by ``read_weight``."""
    @sgm.custom_gradient
    def scaled_sin(x):
        vjp = make_vjp(x)
        return torch.sin(x) * read_weight(), lambda ct: vjp(ct * read_weight())
    return scaled_sin


@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.parametrize("case", OUTSIDE_CASES)
def test_under_torch_compile_a_vjp_written_as_a_backward_reading_an_outside_tensor_is_exact(case, mode):
    """A VJP that reads a tensor from outside f (a global weight here), written as a backward: the tensor is an
    input of the map's graphs, read at each call where f's code reads it, so a change in place and a global
    rebound are both seen by the next call."""
    global WEIGHT
    scaled_sin = _scaled(AS_BACKWARD[case], lambda: WEIGHT)
    kept = WEIGHT
    try:
        for change in (lambda: None, lambda: WEIGHT.mul_(-2.0), lambda: WEIGHT.copy_(torch.arange(4.0))):
            change()
            torch.testing.assert_close(COMPILED_MODES[mode](scaled_sin, X), WEIGHT * torch.cos(X))
        WEIGHT = torch.tensor([3.0, 1.0, -1.0, 0.5], dtype=torch.float64)
        torch.testing.assert_close(COMPILED_MODES[mode](scaled_sin, X), WEIGHT * torch.cos(X))
    finally:
        WEIGHT = kept.copy_(torch.tensor([1.5, -0.5, 2.0, 0.25], dtype=torch.float64))


def _closing_over(weight):
    return _scaled(_no_grad, lambda: weight)


def test_under_torch_compile_two_decorated_functions_of_one_code_each_read_their_own_outside_tensor():
    """One code, two closures over different weights (and a third over one weight twice, then two): each call
    reads its own cells, never a proof's or another function's."""
    first, second = torch.full((4,), 2.0, dtype=torch.float64), torch.full((4,), -3.0, dtype=torch.float64)
    f, g = _closing_over(first), _closing_over(second)
    x = X.clone().requires_grad_(True)
    torch.compile(lambda x: (f(x) + 10.0 * g(x)).sum(), fullgraph=True)(x).backward()
    torch.testing.assert_close(x.grad, (first + 10.0 * second) * torch.cos(X))

    def twice(a, b):
        @sgm.custom_gradient
        def product(x):
            def vjp(ct):
                with torch.no_grad():
                    return ct * a * b
            return x * a * b, vjp
        return product

    for a, b in ((first, first), (first, second)):
        x = X.clone().requires_grad_(True)
        product = twice(a, b)
        torch.compile(lambda x, product=product: product(x).sum(), fullgraph=True)(x).backward()
        torch.testing.assert_close(x.grad, a * b)


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([0.5, 2.0, -1.0, 3.0], dtype=torch.float64))


def test_under_torch_compile_a_module_parameter_read_in_a_backward_style_vjp_is_exact_and_current():
    """f closes over a module and its VJP reads ``layer.weight`` under no_grad: the parameter is read at each call
    (an optimizer's step between calls is seen). y's value keeps its ordinary autodiff w.r.t. the parameter, as
    eagerly: sin(x) from each of the two steps."""
    layer = _Scale()
    scaled_sin = _scaled(_no_grad, lambda: layer.weight)
    step = torch.compile(lambda x: scaled_sin(x).sum(), fullgraph=True)
    for _ in range(2):
        x = X.clone().requires_grad_(True)
        step(x).backward()
        torch.testing.assert_close(x.grad, layer.weight.detach() * torch.cos(X))
        with torch.no_grad():
            layer.weight.mul_(-1.5)
    torch.testing.assert_close(layer.weight.grad, 2.0 * torch.sin(X))


@pytest.mark.parametrize("mode", COMPILED_MODES)
@pytest.mark.parametrize("case", ["with torch.no_grad()", "a branch on torch.is_grad_enabled()", "ct.detach()"])
def test_under_torch_compile_order_2_of_a_vjp_written_as_a_backward_has_its_first_derivative(case, mode):
    """At order=2 the graphs read x moving (AOTAutograd then differentiates J·v through it) and the outside weight
    live; the first derivative is the map. (A second derivative through a compiled backward is PyTorch's own
    refusal, test_decorator_compiled.py.)"""
    scaled_sin = _scaled(AS_BACKWARD[case], lambda: WEIGHT)
    order_2 = sgm.custom_gradient(scaled_sin.undecorated, order=2)
    torch.testing.assert_close(COMPILED_MODES[mode](order_2, X), WEIGHT * torch.cos(X))
    plain = _decorated(AS_BACKWARD[case], order=2)
    torch.testing.assert_close(COMPILED_MODES[mode](plain, X), torch.cos(X))


def test_torch_func_hessian_compiled_of_an_order_2_vjp_written_as_a_backward_is_exact():
    """torch.func.hessian traced by Dynamo (no compiled backward differentiated again): the second derivative
    through the registered graphs, against PyTorch's Hessian of the closed form."""
    scaled_sin = sgm.custom_gradient(_scaled(_no_grad, lambda: WEIGHT).undecorated, order=2)
    want = torch.func.hessian(lambda x: torch.exp(torch.sin(x) * WEIGHT).sum())(X)
    got = torch.compile(torch.func.hessian(lambda x: torch.exp(scaled_sin(x)).sum()), fullgraph=True)(X)
    torch.testing.assert_close(got, want)


def test_under_torch_compile_an_outside_tensor_the_decorator_cannot_reach_is_refused_naming_why():
    """A limit: a weight read through a list's item is found by no name of f's code, so the VJP would be
    differentiated as Dynamo traces it; written under no_grad that is not the map, and it is refused, never
    embedded with a zero derivative."""
    weights = [WEIGHT.clone()]
    scaled_sin = _scaled(_no_grad, lambda: weights[0])
    with pytest.raises(RuntimeError, match=r"vjp of scaled_sin computes without grad mode .* did not"):
        COMPILED_MODES["compile(fullgraph) backward"](scaled_sin, X)


# ---------------------------------------------------------------- reads of the cotangent


READS = {
    "item": lambda ct: ct * ct.sum().item(),
    "float": lambda ct: ct / max(float(ct.norm()), 1.0),
    "int": lambda ct: ct * int(ct[0]),
    "bool": lambda ct: ct * 2.0 if bool(ct.sum() >= 0) else ct * -2.0,
    "a Python branch": lambda ct: ct * 2.0 if ct.sum() >= 0 else ct * -2.0,
    "tolist": lambda ct: ct * ct.tolist()[0],
    "numpy": lambda ct: ct * float(ct.numpy()[0]),
}


@pytest.mark.parametrize("read", READS)
def test_a_read_of_the_cotangents_value_is_refused_eagerly_naming_the_vjp(read):
    """Traced at a zero cotangent, the branch taken for zero would be embedded as if it were the map (a
    clip-by-norm would become the identity)."""
    f = sgm.custom_gradient(lambda x: (x * 2.0, READS[read]))
    x = X.clone().requires_grad_(True)
    with pytest.raises(ValueError, match=r"vjp of <lambda> .* may not read its cotangent's value in Python"):
        f(x).sum().backward()


def test_reading_the_values_the_vjp_closes_over_is_allowed_eagerly():
    @sgm.custom_gradient
    def sin(x):
        def vjp(ct):  # .numpy(), float() and a branch, all on what the VJP closes over, inside it
            cosine = torch.as_tensor(np.cos(x.numpy()))
            return ct * cosine if float(x.abs().max()) > 0 else ct * 0.0
        return torch.sin(x), vjp

    torch.testing.assert_close(MODES["backward"](sin, X), torch.cos(X))


def test_a_compiled_function_called_inside_a_vjp_is_named():
    doubled = torch.compile(lambda ct: ct * 2.0)
    f = sgm.custom_gradient(lambda x: (x * 2.0, doubled))
    with pytest.raises(ValueError, match=r"vjp of <lambda> calls a function compiled with torch\.compile"):
        MODES["backward"](f, X)


# ---------------------------------------------------------------- non-finite values stay where they are


@sgm.custom_gradient
def _sin(x):
    return torch.sin(x), lambda ct: ct * torch.cos(x)


def _reverse(f, x, ct):
    x = x.clone().requires_grad_(True)
    f(x).backward(ct)
    return x.grad


def _forward(f, x, tangent):
    with forward_ad.dual_level():
        return forward_ad.unpack_dual(f(forward_ad.make_dual(x, tangent))).tangent


NON_FINITE = {  # (x, cotangent or tangent)
    "a NaN cotangent element": (X, torch.tensor([math.nan, 1.0, 1.0, 1.0], dtype=torch.float64)),
    "an inf cotangent element": (X, torch.tensor([1.0, -math.inf, 1.0, 1.0], dtype=torch.float64)),
    "an inf element of x (NaN in the VJP's J)": (torch.tensor([math.inf, 1.0, 2.0, 3.0], dtype=torch.float64),
                                                  torch.ones(4, dtype=torch.float64)),
}


@pytest.mark.parametrize("way", [_reverse, _forward], ids=["backward", "forward_ad"])
@pytest.mark.parametrize("case", NON_FINITE)
def test_a_non_finite_value_reaches_the_elements_plain_autodiff_reaches(case, way):
    x, direction = NON_FINITE[case]
    got, want = way(_sin, x, direction), way(torch.sin, x, direction)
    np.testing.assert_array_equal(np.isfinite(got.numpy()), np.isfinite(want.numpy()))
    finite = np.isfinite(want.numpy())
    torch.testing.assert_close(got[finite], want[finite])


def test_a_matrix_vjp_with_an_infinite_element_is_not_finite_only_where_it_reaches():
    a = torch.tensor([[1.0, 2.0, 0.0], [0.0, math.inf, 0.0], [0.0, 0.0, 3.0]], dtype=torch.float64)

    @sgm.custom_gradient
    def product(x):
        return a @ x, lambda ct: ct @ a

    x = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    got = _reverse(product, x, torch.ones(3, dtype=torch.float64))
    assert np.isfinite(got.numpy()).tolist() == [True, False, True]
    torch.testing.assert_close(got[[0, 2]], torch.tensor([1.0, 3.0], dtype=torch.float64))
    tangent = _forward(product, x, torch.ones(3, dtype=torch.float64))
    assert np.isfinite(tangent.numpy()).tolist() == [True, False, True]


def test_the_identity_form_gives_an_inf_cotangent_times_a_finite_gx_as_inf_as_jax_and_tensorflow_do():
    g = torch.tensor([2.0, -3.0, 4.0], dtype=torch.float64)
    cotangent = torch.tensor([math.inf, math.inf, 1.0], dtype=torch.float64)
    got = _reverse(lambda x: sgm.custom_gradient(torch.sin(x), g, x), X[:3], cotangent)
    torch.testing.assert_close(got, torch.tensor([math.inf, -math.inf, 4.0], dtype=torch.float64))


# ---------------------------------------------------------------- the order=1 guard raises only where a term is missed


def _penalty_gradient(f, w, x, reach_x=False):
    """A gradient penalty as WGAN-GP writes it: the first derivative w.r.t. x recorded (create_graph), its norm
    penalized, and the penalty differentiated w.r.t. a weight w outside f (and, with ``reach_x``, w.r.t. x too)."""
    w = w.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    [first] = torch.autograd.grad((w * f(x)).sum(), x, create_graph=True)
    penalty = ((first.norm() - 1.0) ** 2)
    return torch.autograd.grad(penalty, [w, x] if reach_x else [w])


def test_a_gradient_penalty_wrt_a_weight_outside_f_is_exact_at_order_1():
    w = torch.tensor([0.5, -1.5, 2.0, 1.0], dtype=torch.float64)
    [got] = _penalty_gradient(_sin, w, X)
    [want] = _penalty_gradient(torch.sin, w, X)
    torch.testing.assert_close(got, want)


def test_a_gradient_penalty_that_reaches_x_still_raises_at_order_1_naming_order_2():
    w = torch.tensor([0.5, -1.5, 2.0, 1.0], dtype=torch.float64)
    with pytest.raises(LookupError, match=r"custom_gradient\(order=2\)"):
        _penalty_gradient(_sin, w, X, reach_x=True)


def test_a_gradient_penalty_under_torch_func_wrt_a_weight_outside_f_is_exact_at_order_1():
    def penalty(f):
        def of_w(w):
            first = torch.func.grad(lambda x: (w * f(x)).sum())(X)
            return (first.norm() - 1.0) ** 2
        return torch.func.grad(of_w)(torch.tensor([0.5, -1.5, 2.0, 1.0], dtype=torch.float64))

    torch.testing.assert_close(penalty(_sin), penalty(torch.sin))


def test_a_vjp_that_returns_none_for_every_argument_has_a_zero_second_derivative_without_raising():
    @sgm.custom_gradient
    def held(x):
        return torch.sin(x), lambda ct: None

    second = torch.func.grad(lambda x: torch.func.grad(lambda x: held(x).sum())(x).sum())(X)
    torch.testing.assert_close(second, torch.zeros_like(X))


@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_under_torch_compile_a_vjp_with_literal_tensors_written_as_a_backward(mode):
    """Literals made inside f and the VJP (torch.tensor(...), as Keras's ops make from numbers) are rebuilt by ops in
    the compiled maps, where a tensor constant would be a real tensor among Dynamo's fake ones."""
    @sgm.custom_gradient
    def sin(x):
        def vjp(ct):
            with torch.no_grad():
                return ct * torch.cos(x) * torch.tensor(2.0, dtype=x.dtype) / torch.tensor(2, dtype=torch.int32)
        return torch.sin(x), vjp

    torch.testing.assert_close(COMPILED_MODES[mode](sin, X), torch.cos(X))


@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_under_torch_compile_a_helper_of_another_module_reads_its_own_global_never_fs(mode):
    """The VJP, written as a backward, calls a helper from another module that reads that module's WEIGHT; this
    module has a WEIGHT too (issue 59). Compiled, the result is the helper's weight times cos(x), or a refusal
    naming why: never this module's WEIGHT."""
    import outside_reads_helper

    helper = outside_reads_helper.scaled_by_weight

    @sgm.custom_gradient
    def scaled_sin(x):
        c = torch.cos(x)

        def vjp(ct):
            with torch.no_grad():
                return helper(ct) * c
        return torch.sin(x) * helper(torch.ones_like(x)), vjp

    want = outside_reads_helper.WEIGHT * torch.cos(X)
    assert not torch.equal(WEIGHT, outside_reads_helper.WEIGHT)
    try:
        got = COMPILED_MODES[mode](scaled_sin, X)
    except Exception as error:  # a refusal: ours, naming the outside tensor it cannot reach
        assert "from outside" in str(torch_modes_ours(error, ValueError)), error
        return
    torch.testing.assert_close(got, want)
