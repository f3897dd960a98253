"""@stopgrad_math.torch.custom_gradient under torch.compile(fullgraph=True): Dynamo traces the embedding, and the
VJP's linearity is proven once per compilation, as Dynamo traces the call. Each against an independent truth
(analytic derivatives, PyTorch's autodiff of the closed form or of a stable formula). A module's parameters read
inside f, and a training loop, compiled: test_decorator_form.py (CALLS)."""

import gc
import math
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from packaging.version import Version  # noqa: E402
from test_ported_functions import RIGHT_HAND_SIDES, WELL_CONDITIONED, LinearSolve, linear_solve  # noqa: E402
from torch_modes import COMPILED_MODES, bits, fresh_compilation, ours  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

X = torch.tensor([-1.0, 0.0, 2.0, 100.0])


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    fresh_compilation(monkeypatch)  # each test compiles anew (and proves anew): nothing carried over from another


def compiled(fn, **options):
    return torch.compile(fn, fullgraph=True, **options)


@sgm.custom_gradient
def log1pexp(x):
    e = torch.exp(x)
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), lambda ct: ct * (1 - 1 / (1 + e))


@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_log1pexp_has_the_vjps_derivative_with_no_graph_break(mode):
    torch.testing.assert_close(COMPILED_MODES[mode](log1pexp, X), torch.sigmoid(X), rtol=1e-6, atol=0)


def test_the_value_is_the_compiled_y_bit_for_bit():
    @sgm.custom_gradient
    def f(x):
        y = torch.stack([x * -1.0, torch.exp(x), x / 0.0])  # −0.0, inf and NaN among the values
        return y, lambda ct: ct[0] * -1.0 + ct[1] * torch.exp(x)

    x = torch.tensor([0.0, 1.5, -2.0, 800.0], requires_grad=True)
    np.testing.assert_array_equal(bits(compiled(f)(x).detach()), bits(compiled(lambda x: f.undecorated(x)[0])(x)))


def test_a_full_jacobian_row_by_row_against_autodiff_of_the_closed_form():
    a = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]], dtype=torch.float64)

    @sgm.custom_gradient
    def tanh_of_a_map(x):
        y = torch.tanh(a @ x)
        return y, lambda ct: a.T @ (ct * (1 - y**2))

    x = torch.tensor([0.3, -0.8, 1.1], dtype=torch.float64, requires_grad=True)
    y = compiled(tanh_of_a_map)(x)
    rows = torch.stack([torch.autograd.grad(y, x, row, retain_graph=True)[0] for row in torch.eye(2).double()])
    torch.testing.assert_close(rows, torch.func.jacrev(lambda x: torch.tanh(a @ x))(x))


def test_nests_integer_arguments_and_outputs_and_constants_passed_through():
    @sgm.custom_gradient
    def f(p, k, label):
        assert label == "scale"
        a, b = p["a"], p["b"]
        y = (a * b * k, {"sum": a + b}, torch.argmax(a))
        return y, lambda ct: ({"a": ct[0] * b * k + ct[1]["sum"], "b": ct[0] * a * k + ct[1]["sum"]}, None, None)

    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, -1.0], requires_grad=True)
    k = torch.tensor([2, 3])

    def total(a, b):
        product, sums, index = f({"a": a, "b": b}, k, "scale")
        return (product * 2.0 + sums["sum"]).sum(), index

    loss, index = compiled(total)(a, b)
    loss.backward()
    assert int(index) == 1
    torch.testing.assert_close(a.grad, 2.0 * b.detach() * k + 1.0)
    torch.testing.assert_close(b.grad, 2.0 * a.detach() * k + 1.0)


def test_a_module_and_an_object_passed_as_arguments_pass_through_from_torch_2_13():
    """Non-tensor arguments reach the proof as themselves (Dynamo guards them by identity): a module, and the self
    of a decorated method. Documented limits: torch 2.6's Dynamo hands over no module or object (it raises, saying
    it is not a constant; close over it instead), and an object made inside the compiled function is, to the
    proof, Dynamo's stand-in for it, whose attributes are not set yet (the proof raises, naming the attribute)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)

    @sgm.custom_gradient
    def f(x, module):
        return module(x), lambda ct: (ct @ module.weight, None)

    class Scaler:
        def __init__(self, scale):
            self.scale = scale

        @sgm.custom_gradient
        def __call__(self, x):
            return x * self.scale, lambda ct: (None, ct * self.scale)

    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    scaler = Scaler(3.0)
    if Version(torch.__version__.split("+")[0]) < Version("2.13"):
        for fn in (lambda x: f(x, layer).sum(), lambda x: scaler(x).sum()):
            with pytest.raises(Exception, match="is not a constant"):
                compiled(fn)(x)
        return
    compiled(lambda x: f(x, layer).sum() + scaler(x).sum())(x).backward()
    torch.testing.assert_close(x.grad, layer.weight.detach().sum(0) + 3.0)
    with pytest.raises(Exception, match="has no attribute 'scale'"):
        compiled(lambda x: Scaler(3.0)(x).sum())(x)


def test_a_vjp_that_is_not_linear_is_refused_naming_the_op():
    @sgm.custom_gradient
    def f(x):
        return x * x, lambda ct: (ct * x).clamp(-1.0, 1.0)

    with pytest.raises(Exception) as raised:
        compiled(f)(X.clone().requires_grad_(True))
    assert isinstance(ours(raised.value, ValueError), ValueError)
    assert "clamp" in str(raised.value) and "cotangent for args[0]" in str(raised.value)


def test_a_vjp_that_reads_a_value_in_python_is_refused_naming_why():
    @sgm.custom_gradient
    def f(x):
        return x * 2.0, lambda ct: ct * 2.0 if bool(x.sum() > 0) else ct * 3.0

    with pytest.raises(Exception, match=r"cannot be traced under torch\.compile.*may not read a tensor's value"):
        compiled(f)(torch.tensor([1.0, 2.0], requires_grad=True))


def test_the_proof_is_made_again_for_another_shape():
    """A VJP linear at one shape and not at another: a proof kept across shapes would embed the second."""
    @sgm.custom_gradient
    def f(x):
        return x * 2.0, lambda ct: ct * 2.0 if ct.shape[0] < 3 else (ct * 2.0).abs()

    fn = compiled(f)
    fn(torch.ones(2, requires_grad=True)).sum().backward()
    with pytest.raises(Exception, match=r"\babs\b"):
        fn(torch.ones(3, requires_grad=True))


@sgm.custom_gradient
def _linear_of_module(x, m):
    w = m.weight
    return x @ w.t(), lambda ct: (ct @ w, None)


@pytest.mark.skipif(Version(torch.__version__).release < (2, 13), reason="a module argument: the limit below")
def test_a_module_passed_to_f_is_not_kept_alive_by_a_compiled_proof():
    """Issue 56: the compiled proof's key held f's non-tensor arguments, so a module passed to f lived on (+228 MiB
    for five modules of 32 MiB) until 256 newer proofs pushed its key out."""
    linear = _linear_of_module

    alive = []
    for _ in range(3):
        m = torch.nn.Linear(4, 3, dtype=torch.float64)
        alive.append(weakref.ref(m))
        x = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64).reshape(2, 4).requires_grad_(True)
        compiled(lambda x, m: linear(x, m))(x, m).sum().backward()
        torch.testing.assert_close(x.grad, torch.ones(2, 3, dtype=torch.float64) @ m.weight.detach())
        del m
    gc.collect()
    assert [ref() for ref in alive] == [None, None, None]


@pytest.mark.skipif(Version(torch.__version__).release >= (2, 13), reason="Dynamo passes a module from 2.13")
def test_before_torch_2_13_a_module_passed_to_f_is_refused_by_dynamo():
    """torch 2.6's Dynamo cannot give the proof a module among f's arguments as a constant; close over it."""
    x = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(Exception, match="is not a constant"):
        compiled(lambda x, m: _linear_of_module(x, m))(x, torch.nn.Linear(4, 3, dtype=torch.float64))


def test_dynamo_reset_drops_the_graphs_and_proofs_made_for_compiled_calls():
    """Issue 56: each compilation registered two graphs for good, which survived ``torch._dynamo.reset()``; they
    and the proofs go with Dynamo's own caches, at the next compilation."""
    from stopgrad_math.torch import compiled_graphs, compiled_proof

    def scaled(scale):  # a new proof at each round: the scale is in the key
        @sgm.custom_gradient
        def f(x):
            c = torch.cos(x)
            return torch.sin(x), lambda ct: ct * c * scale
        return f

    sizes = []
    for scale in (1.0, 2.0, 3.0, 4.0):
        torch._dynamo.reset()
        x = X.clone().requires_grad_(True)
        compiled(scaled(scale))(x).sum().backward()
        torch.testing.assert_close(x.grad, scale * torch.cos(X), rtol=1e-6, atol=0)
        sizes.append((len(compiled_graphs.COMPILED), len(compiled_proof._PROVEN_WHILE_COMPILING)))
    assert sizes == [sizes[0]] * 4 and sizes[0][0] == 2  # (two proofs a round: for any size, then this one)


_WEIGHTS = torch.linspace(1.0, 2.0, 7)


@sgm.custom_gradient
def _linear_below_six_elements(x):
    w = _WEIGHTS[: x.shape[0]]  # a tensor from outside: the VJP is differentiated as Dynamo traces it
    return x * w, lambda ct: ct * w if ct.shape[0] < 6 else (ct * w).abs()


def test_a_vjp_that_is_linear_at_some_sizes_alone_is_refused_at_the_others_when_compiled():
    """Eagerly a 7-element call is refused naming abs; compiled after calls of 2 to 5 elements (Dynamo's sizes then
    dynamic, the proof made for any size, its condition that the VJP's branch holds, below 6 elements: two graphs,
    where a proof per size would make four), the 7-element call must be refused too, not given abs's
    derivative."""
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    fn = compiled(_linear_below_six_elements, backend="aot_eager")
    for n in (2, 3, 4, 5):
        x = (-torch.ones(n)).requires_grad_(True)
        fn(x).backward(-torch.ones(n))
        torch.testing.assert_close(x.grad, -_WEIGHTS[:n])
    assert dynamo_utils.counters["stats"]["unique_graphs"] <= 2
    with pytest.raises(Exception, match=r"\babs\b"):
        fn((-torch.ones(7)).requires_grad_(True)).backward(-torch.ones(7))


@sgm.custom_gradient
def _scaled_by_size_less_five(x):
    w = _WEIGHTS[: x.shape[0]]
    return x * w, lambda ct: ct * w * (ct.shape[0] - 5)


@pytest.mark.parametrize("sizes", [(3, 4, 5, 7), (5, 6, 7, 4)])
def test_a_number_made_from_a_size_is_no_literal_zero_of_the_proof_for_any_size(sizes):
    """A VJP scaled by (n - 5): zero at 5 elements, and not at any other. The proof for any size sees a number of
    the size, never a literal 0, so every size gets (n - 5)·w (float64 autodiff of that formula: the truth)."""
    fn = compiled(_scaled_by_size_less_five)
    for n in sizes:
        x = torch.linspace(-1.0, 1.0, n, requires_grad=True)
        fn(x).sum().backward()
        torch.testing.assert_close(x.grad, (n - 5) * _WEIGHTS[:n])


def test_dynamic_shapes_are_specialized_so_each_shape_is_proven():
    fn = compiled(log1pexp, dynamic=True)
    for n in (3, 5):
        x = torch.linspace(-3.0, 3.0, n, requires_grad=True)
        fn(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()))


def test_order_2_first_derivatives_are_the_vjps():
    @sgm.custom_gradient(order=2)
    def f(x):
        return torch.exp(torch.sin(x)), lambda ct: ct * torch.exp(torch.sin(x)) * torch.cos(x)

    x = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    compiled(f)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.exp(torch.sin(x.detach())) * torch.cos(x.detach()))


def test_second_derivatives_through_a_compiled_call_are_refused_by_pytorch_a_documented_limit():
    """AOTAutograd does not differentiate a compiled backward again, with or without the decorator: the error is
    PyTorch's, never a wrong number."""
    x = torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True)
    for fn in (lambda x: torch.exp(torch.sin(x)), lambda x: log1pexp(torch.sin(x))):
        (first,) = torch.autograd.grad(compiled(fn)(x).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(first.sum(), x)


def test_a_vjp_that_calls_its_own_f_terminates_and_is_exact():
    two_over_root_pi = 2.0 / math.sqrt(math.pi)

    @sgm.custom_gradient
    def erfcx(x):  # erfcx'(x) = 2x·erfcx(x) − 2/√π
        return torch.special.erfcx(x), lambda ct: ct * (2.0 * x * erfcx(x) - two_over_root_pi)

    x = torch.tensor([-0.5, 0.0, 1.5, 30.0], dtype=torch.float64, requires_grad=True)
    compiled(erfcx)(x).sum().backward()
    xd = x.detach()
    torch.testing.assert_close(x.grad, 2.0 * xd * torch.special.erfcx(xd) - two_over_root_pi)


def test_a_one_element_y_keeps_an_infinite_derivative():
    @sgm.custom_gradient
    def f(x):
        return torch.sqrt(x).sum(), lambda ct: ct * 0.5 / torch.sqrt(x)

    x = torch.tensor([0.0, 4.0], requires_grad=True)
    compiled(f)(x).backward()
    assert x.grad.tolist() == [math.inf, 0.25]


def test_one_compiled_program_proves_a_decorated_function_once_for_its_calls(monkeypatch):
    """Three calls of one f on one shape in a compiled program (an activation in three layers): one proof, each
    call's gradient exact."""
    from stopgrad_math.torch import compiled_proof

    proofs = []
    original = compiled_proof._proof_of_f
    monkeypatch.setattr(compiled_proof, "_proof_of_f",
                        lambda *args, **options: proofs.append(1) or original(*args, **options))
    weights = [torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64) * k for k in (1.0, 0.5, 2.0)]

    def net(x):
        for w in weights:
            x = log1pexp(x @ w)
        return x.sum()

    def plain(x):
        for w in weights:
            x = torch.nn.functional.softplus(x @ w)
        return x.sum()

    x = torch.tensor([[0.3, -0.7], [1.5, 0.1]], dtype=torch.float64)
    mine, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled(net)(mine).backward()
    plain(theirs).backward()
    torch.testing.assert_close(mine.grad, theirs.grad)
    assert len(proofs) == 1


def _compiled_over_sizes(f, sizes, backend="inductor"):
    """The gradient of sum(f) compiled (fullgraph), called at each size twice; the graphs Dynamo made."""
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()
    loss = compiled(lambda x: f(x).sum(), backend=backend)
    for n in [*sizes, *sizes]:
        x = torch.linspace(-3.0, 3.0, n, dtype=torch.float64, requires_grad=True)
        loss(x).backward()
        torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()), rtol=0, atol=1e-15)
    return dynamo_utils.counters["stats"]["unique_graphs"]


SLOPE = torch.tensor(1.0, dtype=torch.float64)  # a tensor from outside f, read at each call


@sgm.custom_gradient
def log1pexp_times_slope(x):
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), lambda ct: ct * torch.sigmoid(x) * SLOPE


def test_thirty_two_calls_over_sixteen_sizes_prove_once_for_any_size():
    """A VJP closing over an outside tensor is differentiated as Dynamo traces it, and its proof is made for the
    shapes' ranks alone: Dynamo guards no size, and its automatic dynamic shapes compile one more graph after the
    first (the 9th size reached the recompile limit, which fullgraph=True raises)."""
    assert _compiled_over_sizes(log1pexp_times_slope, range(2, 18)) <= 3


def test_a_vjp_embedded_through_registered_graphs_compiles_sizes_as_a_plain_function_does():
    """A VJP that closes over no outside tensor is embedded through graphs of its map, made for any size on
    symbolic stand-ins: over sixteen sizes Dynamo compiles as many graphs as for the same function undecorated
    (its first size, then dynamic sizes), with the recompile limit set to 4, which a graph per size would pass
    (fullgraph=True raises there). The VJP written as a backward (under no_grad) too. Recompiles are Dynamo's,
    whatever the backend: ``aot_eager`` runs AOTAutograd's graphs without building Inductor's kernels."""
    import torch._dynamo.config as dynamo_config

    @sgm.custom_gradient
    def no_grad_log1pexp(x):
        def vjp(ct):
            with torch.no_grad():
                return ct * torch.sigmoid(x)
        return torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), vjp

    def plain(x):
        return torch.logaddexp(x, torch.zeros((), dtype=x.dtype))

    # Dynamo's own patch: on torch 2.13 the limit is an alias of cache_size_limit, which a plain setattr breaks
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # (torch 2.6)
    with dynamo_config.patch(**{limit: 4}):
        counts = []
        for f in (plain, log1pexp, no_grad_log1pexp):
            torch._dynamo.reset()
            counts.append(_compiled_over_sizes(f, range(2, 18), "aot_eager"))
    assert counts[1:] == [counts[0]] * 2 and counts[0] <= 3


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", ["activation", "weighted", "mixed"])
def test_compiled_the_value_and_gradient_are_the_eager_decorators_over_the_grid(case, dtype, backend):
    """x, the weight and the cotangent each over ±0, subnormal, huge, ±inf and NaN. AOTAutograd's graph run as it
    is (``aot_eager``) gives the eager decorator's bits (its ordinary ops, whose selects and carrier compiled code
    must choose alike). Inductor's kernels do their own arithmetic on the same ops: y is the compiled f's bits,
    and the gradient the eager one up to rounding (torch 2.6 divides by a constant as a product by its
    reciprocal) and a NaN's sign (where a VJP adds two NaN terms, its kernel may keep the other's), with inf and
    NaN where eager has them. Each against the analytic gradient where every value is finite."""
    from test_eager_fast_path import _product_cases, _value_and_gradient, corners, same_bits

    every = corners(dtype, False)
    x, w, cotangent = (t.reshape(-1).contiguous() for t in torch.meshgrid(every, every, every, indexing="ij"))
    fn = _product_cases(dtype, w)[case]
    eager = _value_and_gradient(fn, x, cotangent)
    got = _value_and_gradient(compiled(fn, backend=backend), x, cotangent)
    if backend == "aot_eager":
        same_bits(got[0], eager[0])
        same_bits(got[1], eager[1])
    else:
        same_bits(got[0], compiled(lambda x: fn.undecorated(x)[0])(x))
        torch.testing.assert_close(got[1], eager[1], equal_nan=True)
        assert torch.equal(got[1].isnan(), eager[1].isnan()) and torch.equal(got[1].isinf(), eager[1].isinf())
    finite = x.isfinite() & w.isfinite() & cotangent.isfinite()
    want = {"activation": cotangent * torch.sigmoid(x), "mixed": cotangent / 3.0 - cotangent * 0.5}.get(
        case, cotangent * w)
    torch.testing.assert_close(got[1][finite], want[finite])


def _graphs_over_floats(f, values, order_of_truth, fullgraph=True):
    """sum(f(x, s)) compiled, its gradient at each value of s checked against ``order_of_truth(s)``; the graphs
    Dynamo made."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    loss = torch.compile(lambda x, s: f(x, s).sum(), fullgraph=fullgraph, backend="aot_eager")
    for s in values:
        x = torch.linspace(-1.0, 1.0, 3, dtype=torch.float64, requires_grad=True)
        loss(x, s).backward()
        torch.testing.assert_close(x.grad, order_of_truth(s), rtol=0, atol=1e-15)
    return dynamo_utils.counters["stats"]["unique_graphs"]


_SCALES = [0.5, 1.5, 0.0, -3.0, 2.5, 4.0, 8.0, 16.0, 32.0, 64.0]  # past the recompile limit, were each a graph
_W3 = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)  # a tensor from outside: the VJP is as Dynamo traces it


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("outside", [False, True], ids=["graphs", "as written"])
def test_a_changing_python_float_compiles_as_a_plain_function_does(order, outside):
    """A float argument that changes between calls is a symbol to Dynamo after the first change; the decorator's
    proof takes it as one too, so the calls compile as many graphs as the plain function's (no
    ``assume_constant_result`` conversion error, no graph per value), and each value's gradient is s·w, 0.0
    included (a symbol is never read as a literal zero). Both routes: the VJP's graphs registered (it reads its
    arguments alone) and the VJP differentiated as written (it reads a tensor from outside)."""
    weights = _W3 if outside else torch.ones(3, dtype=torch.float64)

    @sgm.custom_gradient(order=order)
    def scaled(x, s):
        w = _W3 if outside else 1.0
        return x * w * s, lambda ct: (ct * w * s, None)

    plain = _graphs_over_floats(lambda x, s: x * weights * s, _SCALES, lambda s: s * weights)
    assert _graphs_over_floats(scaled, _SCALES, lambda s: s * weights) == plain


@sgm.custom_gradient
def _linear_below_one(x, s):
    return x * _W3 * s, lambda ct: (ct * _W3 * s if s < 1.0 else (ct * _W3 * s).abs(), None)


def test_a_vjp_branching_on_a_changing_float_is_refused_where_its_branch_is_not_the_proven_one():
    """The proof for any float reads the symbol at one value (0.5): at s = 2.0 the VJP takes the branch through
    abs, and the call raises, naming the float and how to specialize it, rather than give abs's derivative (with
    or without fullgraph, as a refusal of the proof does). Values on the proven branch get s·w."""
    assert _graphs_over_floats(_linear_below_one, [0.25, 0.5, 0.75], lambda s: s * _W3) >= 1
    for fullgraph in (True, False):
        with pytest.raises(Exception, match="specialize_float"):
            _graphs_over_floats(_linear_below_one, [0.25, 0.5, 2.0], lambda s: s * _W3, fullgraph=fullgraph)


def _solve_steps(fn, a, b):
    """The solves (LU factorizations) the forward of one compiled value + gradient step of ``fn(a, b)`` runs, and
    its gradients."""
    step = compiled(fn)
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    step(a, b).sum().backward()  # (compiled here)
    a.grad = b.grad = None
    with torch.profiler.profile() as profile:
        step(a, b).sum().backward()
    return sum(1 for e in profile.events() if e.name == "aten::linalg_lu_factor_ex" and not _in_backward(e)), (
        a.grad, b.grad)


def _in_backward(event):
    while event is not None:
        if "Backward" in event.name:
            return True
        event = event.cpu_parent
    return False


def test_a_compiled_custom_root_solves_as_often_as_torch_autograd_function():
    """Issue 75: the zero term's shapes were read from J·v's graph, whose solves the compiler kept for their
    error checks (ops with an effect): two more solves at every step (1.95× the anchor at 256×512). A solve
    y = A⁻¹b with its adjoint gradient, at order 2 (the compiled carrier): one solve in the forward, f's, as
    torch.autograd.Function of the same rule (the backward's are the partitioner's choice: torch 2.14 solves for y
    again there, where 2.13 keeps it); the gradients are autodiff's of torch.linalg.solve. The solve, its Function
    and its matrices are the ported ones (test_ported_functions)."""
    a, b = WELL_CONDITIONED, RIGHT_HAND_SIDES
    anchor, _ = _solve_steps(LinearSolve.apply, a, b)
    ours, gradients = _solve_steps(sgm.custom_gradient(linear_solve.undecorated, order=2), a, b)
    assert ours == anchor == 1
    for got, want in zip(gradients, _solve_steps(torch.linalg.solve, a, b)[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
