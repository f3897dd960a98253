"""The PyTorch decorator's eager machinery (issue 44): a VJP proven once per signature, with a key as strict as the
JAX namespace's compiled embeddings; no derivative work where nothing differentiates; safe from several threads;
bounded. Every gradient is checked against its closed form, never against the library."""

import contextvars
import gc
import linecache
import math
import threading
import types
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rebound_helpers  # noqa: E402
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from packaging.version import Version  # noqa: E402
from torch.fx.graph_module import _loader  # noqa: E402
from torch_modes import MODES, counted_traces  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.shared import bounded_cache  # noqa: E402
from stopgrad_math.torch import kept_proofs  # noqa: E402

X = torch.tensor([0.4, -1.3, 2.2, 0.9], dtype=torch.float64)
SCALE = 3.0  # a global a VJP reads: reassigning it must make a new proof


@pytest.fixture(autouse=True)
def _fresh_proofs(monkeypatch):
    monkeypatch.setattr(kept_proofs, "_PROOFS", bounded_cache.BoundedCache(kept_proofs.PROOFS_KEPT))


@pytest.fixture
def traces(monkeypatch):
    """The number of VJP traces made (each proof, or each call traced anew)."""
    return counted_traces(monkeypatch)


def _scaled_sin(scale):
    """sin with its derivative times ``scale`` (a Python number in the VJP's closure)."""
    @sgm.custom_gradient
    def f(x):
        c = torch.cos(x)
        return torch.sin(x), lambda ct: ct * c * scale
    return f


def _gradient(f, x):
    x = x.detach().clone().requires_grad_(True)
    f(x).sum().backward()
    return x.grad


def _func_gradient(f, x):
    return torch.func.grad(lambda x: f(x).sum())(x)


def test_a_global_of_a_helper_read_through_its_module_is_read_as_it_is_at_each_call(monkeypatch):
    """A VJP calling ``rebound_helpers.scale``, whose global is rebound between calls: each gradient is the one
    the rule gives with the global's value at that call, in reverse and forward mode."""
    decorated = sgm.custom_gradient(lambda x: (x * 1.0, lambda ct: (rebound_helpers.scale(ct),)))
    x = torch.tensor([1.0, -2.0])
    for factor in (2.0, 5.0, 2.0):
        monkeypatch.setattr(rebound_helpers, "FACTOR", factor)
        gradient = torch.autograd.grad(decorated(x.requires_grad_()).sum(), x)[0]
        with forward_ad.dual_level():
            tangent = forward_ad.unpack_dual(decorated(forward_ad.make_dual(x.detach(), torch.ones(2)))).tangent
        assert torch.equal(gradient, torch.full((2,), factor)) and torch.equal(tangent, gradient)


def test_a_known_signature_traces_nothing_and_reads_this_calls_tensors(traces):
    f = _scaled_sin(2.0)
    _gradient(f, X)
    made = traces[0]
    for x in (X, X * 3.0, -X):  # other values, one signature: the proof is reused, this call's cos(x) is read
        torch.testing.assert_close(_gradient(f, x), 2.0 * torch.cos(x), rtol=0, atol=0)
    assert traces[0] == made == 1


TRANSFORMS = ("func.grad", "func.vjp", "func.jvp", "func.jacfwd", "func.jacrev", "func.vmap(func.grad)",
              "func.vmap(func.jvp)")


@pytest.mark.parametrize("mode", TRANSFORMS)
def test_under_a_transform_a_known_signature_traces_nothing_and_reads_this_calls_tensors(mode, traces):
    """Issue 56: under torch.func the proof was made anew at every call (10–40 ms); it is kept per signature, the
    shapes as the call sees them (one sample's under vmap), and reads each call's wrapped tensors."""
    f = _scaled_sin(2.0)
    for x in (X, X * 3.0, -X):
        torch.testing.assert_close(MODES[mode](f, x), 2.0 * torch.cos(x), rtol=0, atol=0)
    assert traces[0] == 1


def test_one_proof_serves_eager_calls_and_transforms_of_one_signature_and_a_new_shape_makes_another(traces):
    f = _scaled_sin(2.0)
    for mode in ("backward", "func.grad", "func.jvp", "forward_ad", "func.jacrev"):
        torch.testing.assert_close(MODES[mode](f, X), 2.0 * torch.cos(X), rtol=0, atol=0)
    assert traces[0] == 1
    longer = torch.linspace(-2, 2, 7, dtype=torch.float64)
    torch.testing.assert_close(MODES["func.grad"](f, longer), 2.0 * torch.cos(longer), rtol=0, atol=0)
    torch.testing.assert_close(MODES["func.vmap(func.grad)"](f, longer), 2.0 * torch.cos(longer), rtol=0, atol=0)
    assert traces[0] == 3  # a 7-element x, and one sample of it (a 0-d x) under vmap


def test_a_new_closure_value_shape_dtype_or_global_makes_a_new_proof(traces):
    torch.testing.assert_close(_gradient(_scaled_sin(2), X), 2.0 * torch.cos(X), rtol=0, atol=0)
    torch.testing.assert_close(_gradient(_scaled_sin(5), X), 5.0 * torch.cos(X), rtol=0, atol=0)
    assert traces[0] == 2  # an int is keyed by value (it may be a size, an axis, a count)
    f = _scaled_sin(2.0)
    longer, single = torch.linspace(-2, 2, 7, dtype=torch.float64), X.float()
    torch.testing.assert_close(_gradient(f, longer), 2.0 * torch.cos(longer), rtol=0, atol=0)
    torch.testing.assert_close(_gradient(f, single), 2.0 * torch.cos(single), rtol=0, atol=0)
    assert traces[0] == 4

    @sgm.custom_gradient
    def global_scaled(x):
        return torch.sin(x), lambda ct: ct * torch.cos(x) * SCALE

    global SCALE
    try:
        for scale in (3.0, 7.0):
            SCALE = scale
            torch.testing.assert_close(_gradient(global_scaled, X), scale * torch.cos(X), rtol=0, atol=0)
    finally:
        SCALE = 3.0
    assert traces[0] == 6


_FLOATS = (2.0, -3.5, 0.0, -0.0, 1e-300, 0.1)  # each a float the proof's symbol was not traced at (0.5)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "autograd.grad(create_graph)"])
def test_a_changing_float_in_the_closure_is_one_proof_giving_each_values_gradient(mode, traces):
    """Issue 56: a Python float the VJP closes over (a learning rate, a temperature) is a symbol of the proof, not
    part of its key: six values, one proof, and each call's gradient is s·cos(x) (0.0 included: a symbol is
    never read as a literal zero). Before, each value was a new proof (23–38 ms a call)."""
    for scale in _FLOATS:
        torch.testing.assert_close(MODES[mode](_scaled_sin(scale), X), scale * torch.cos(X), rtol=0, atol=0)
    assert traces[0] == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["backward", "forward_ad", "func.grad", "func.jvp", "func.vmap(func.grad)"])
def test_a_float_taken_as_a_symbol_gives_the_vjps_own_bits(mode, dtype, monkeypatch):
    """The proof's graphs take the float as a Python number, as the VJP does (a 0-d tensor would round otherwise
    in float16): over a grid of awkward x (±0, ±inf, NaN) and floats (0.1, −0.0, one float16 cannot hold), the
    kept proof gives the bits (signs of zero, NaN included) of the VJP traced at every call with the float as a
    literal."""
    grid = torch.tensor([0.0, -0.0, 1e-3, -2.5, np.inf, -np.inf, np.nan, 6e4], dtype=dtype)
    for scale in (0.1, 1e-9, 3.0):
        kept = MODES[mode](_scaled_sin(scale), grid)
        with monkeypatch.context() as patched:
            patched.setattr(kept_proofs, "known", lambda *args: None)
            traced = MODES[mode](_scaled_sin(scale), grid)
        assert torch.equal(torch.signbit(kept), torch.signbit(traced)), (scale, kept, traced)
        torch.testing.assert_close(kept, traced, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("scale", [0.0, -0.0])
def test_a_zero_float_in_the_closure_gives_what_a_function_with_that_backward_gives(scale):
    """A float symbol is never read as a literal zero: at s = ±0.0 the gradient is ct·cos(x)·s, NaN where cos(x)
    is, as the torch.autograd.Function with that backward gives it, signs of zero included (a literal ``ct * 0.0``
    written in the VJP is a proven zero instead)."""
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(torch.cos(x))
            return torch.sin(x)

        @staticmethod
        def backward(ctx, ct):
            (c,) = ctx.saved_tensors
            return ct * c * scale

    grid = torch.tensor([0.0, -0.0, 1e-3, -2.5, np.inf, -np.inf, np.nan, 6e4], dtype=torch.float64)
    for _ in range(2):  # the proof's first call, then the kept one
        ours, anchor = _gradient(_scaled_sin(scale), grid), _gradient(Scaled.apply, grid)
        numbers = ~torch.isnan(anchor)  # (a NaN's sign is the identity's: its negations, docs/torch.md)
        assert torch.equal(torch.signbit(ours[numbers]), torch.signbit(anchor[numbers])), (ours, anchor)
        torch.testing.assert_close(ours, anchor, rtol=0, atol=0, equal_nan=True)


def _softened(s):
    """A VJP that reads its float: ``math.exp`` of it, and a branch on it (abs, not linear, where s ≥ 1)."""
    @sgm.custom_gradient
    def f(x):
        c = torch.cos(x)
        return torch.sin(x), lambda ct: ct * c * math.exp(s) if s < 1.0 else (ct * c).abs()
    return f


def test_a_vjp_that_reads_its_float_is_proven_per_value_and_refused_where_that_value_is_not_linear(traces):
    """The trace with the float as a symbol reads it (a guard of its ShapeEnv): that signature is then proven
    per value of its floats, as before, so each value gets its own gradient, and a value whose branch is not
    linear is refused naming the op, as a trace at every call refuses it."""
    for s in (0.25, -1.0, 0.25):
        torch.testing.assert_close(_gradient(_softened(s), X), math.exp(s) * torch.cos(X), rtol=0, atol=0)
    assert traces[0] == 3  # the symbolic trace, then one per value
    with pytest.raises(ValueError, match="abs"):
        _gradient(_softened(2.0), X)


def test_a_vjp_that_reads_a_closed_over_value_or_holds_an_object_is_traced_at_every_call(traces):
    def reading(scale):
        @sgm.custom_gradient
        def f(x):
            return torch.sin(x), lambda ct: ct * torch.cos(x) * float(scale)  # a value read: no proof by shapes
        return f

    def holding(scale):
        box = {"scale": scale}  # mutable: no key can capture it

        @sgm.custom_gradient
        def f(x):
            return torch.sin(x), lambda ct: ct * torch.cos(x) * box["scale"]
        return f

    for make in (reading, holding):
        for scale in (2.0, -4.0, 2.0):
            torch.testing.assert_close(_gradient(make(torch.tensor(scale) if make is reading else scale), X),
                                       scale * torch.cos(X), rtol=0, atol=0)
    assert traces[0] >= 6  # each call traced (the first by shapes too, which failed)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "autograd.grad(create_graph)"])
def test_the_kept_proof_gives_what_a_trace_at_every_call_gives_bit_for_bit(mode, monkeypatch):
    f = _scaled_sin(2.0)
    grid = torch.tensor([0.0, -0.0, 1e-300, -2.5, np.inf, -np.inf, np.nan, 1e300], dtype=torch.float64)
    kept = [MODES[mode](f, grid) for _ in range(2)]
    monkeypatch.setattr(kept_proofs, "known", lambda *args: None)
    traced = MODES[mode](f, grid)
    for result in kept:
        torch.testing.assert_close(result, traced, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(traced[[0, 1, 2, 3, 7]], 2.0 * torch.cos(grid[[0, 1, 2, 3, 7]]), rtol=0, atol=0)


def test_order_2_hessians_from_a_kept_proof_are_exact(traces):
    def scaled(s):
        @sgm.custom_gradient(order=2)
        def f(x):
            c = torch.cos(x)
            return torch.sin(x), lambda ct: ct * c * s
        return f

    for x, s in ((X, 1.0), (X * 2.0, 1.0), (X, -2.5)):  # (a float in the closure: one proof for every value)
        f = scaled(s)
        hessian = torch.func.hessian(lambda v, f=f: f(v).sum())(x)
        torch.testing.assert_close(hessian, torch.diag(-torch.sin(x) * s))
        v = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(v).sum(), v, create_graph=True)
        (second,) = torch.autograd.grad(g.sum(), v)
        torch.testing.assert_close(second, -torch.sin(x) * s)
    assert traces[0] == 1


@pytest.mark.parametrize("mode", ["backward", "func.grad", "func.jvp", "func.vmap(func.grad)"])
def test_kept_proofs_hold_no_tensor_of_a_past_call_and_are_bounded(mode, monkeypatch):
    """Each proof holds graphs traced on stand-ins: no tensor of the call (nor a transform's wrapper of one), so
    what the cache holds is bounded by its entries' graphs, not by the tensors' bytes."""
    monkeypatch.setattr(kept_proofs, "_PROOFS", bounded_cache.BoundedCache(4))
    closed_over = []

    @sgm.custom_gradient
    def f(x):
        c = torch.cos(x)
        closed_over.append(weakref.ref(c))
        return torch.sin(x), lambda ct: ct * c

    for n in range(1, 9):  # eight signatures (under vmap, a 2 × n batch of n-element rows)
        x = torch.linspace(-1, 1, n, dtype=torch.float64)
        x = torch.stack([x, -x]) if "vmap" in mode else x
        got = MODES[mode](lambda r: f(r).sum(), x) if "vmap" in mode else MODES[mode](f, x)
        torch.testing.assert_close(got, torch.cos(x), rtol=0, atol=0)
    gc.collect()
    assert all(ref() is None for ref in closed_over)
    assert len(kept_proofs._PROOFS) == 4


def test_where_nothing_differentiates_the_call_is_f_alone_and_the_vjp_is_not_called():
    called = []

    @sgm.custom_gradient
    def f(x):
        def vjp(ct):
            called.append(ct)
            return ct * torch.cos(x)
        return torch.sin(x), vjp

    y = f(X)
    assert not y.requires_grad and torch.equal(y, torch.sin(X))
    with torch.no_grad():
        y = f(X.clone().requires_grad_(True))
    assert not y.requires_grad and torch.equal(y, torch.sin(X))
    with torch.inference_mode():
        assert torch.equal(f(X), torch.sin(X))
    assert called == []
    for mode in ("backward", "forward_ad", "func.grad", "func.jvp", "func.vmap(func.grad)"):
        torch.testing.assert_close(MODES[mode](f, X), torch.cos(X), rtol=0, atol=0)
    with forward_ad.dual_level():  # a dual argument without requires_grad still gets its derivative
        dual = forward_ad.make_dual(X, torch.ones_like(X))
        torch.testing.assert_close(forward_ad.unpack_dual(f(dual)).tangent, torch.cos(X), rtol=0, atol=0)


def test_eight_threads_of_eager_calls_get_exact_gradients():
    """make_fx keeps global state: two traces at once failed with ``CURRENT_PATCHER is None``. Each thread has its
    own shapes (proofs made at once) and a VJP that is traced at every call."""
    @sgm.custom_gradient
    def kept(x):
        c = torch.cos(x)
        return torch.sin(x), lambda ct: ct * c

    @sgm.custom_gradient
    def traced(x):
        s = torch.tensor(2.0)
        return torch.sin(x), lambda ct: ct * torch.cos(x) * float(s)

    errors, done = [], []

    def work(k):
        try:
            for step in range(12):
                x = torch.linspace(-2, 2, 3 + k + step % 3, dtype=torch.float64)
                torch.testing.assert_close(_gradient(kept, x), torch.cos(x), rtol=0, atol=0)
                torch.testing.assert_close(_gradient(traced, x), 2.0 * torch.cos(x), rtol=0, atol=0)
            done.append(k)
        except Exception as error:  # reported below, with its thread
            errors.append((k, repr(error)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(done) == list(range(8))


def test_fx_source_caches_and_memory_stay_flat_over_many_eager_calls():
    """Each traced module left its source in FX's cache and in linecache, never freed: 3 entries a call."""
    import tracemalloc

    f = _scaled_sin(2.0)

    @sgm.custom_gradient
    def traced(x):
        s = torch.tensor(2.0)
        return torch.sin(x), lambda ct: ct * torch.cos(x) * float(s)

    x = X.clone().requires_grad_(True)
    for fn in (f, traced):
        fn(x).sum().backward()
    sizes = len(_loader.eval_cache), len(linecache.cache)
    for _ in range(6000):
        f(x).sum().backward()
    for _ in range(100):
        traced(x).sum().backward()
    tracemalloc.start()  # (it slows every allocation: over the last 4000 calls, once warm)
    gc.collect()
    first, _ = tracemalloc.get_traced_memory()
    for _ in range(4000):
        f(x).sum().backward()
    gc.collect()
    last, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (len(_loader.eval_cache), len(linecache.cache)) == sizes
    assert last - first < 256 * 1024, (first, last)


def test_new_proofs_leave_nothing_in_pytorchs_caches_or_the_threads_context(monkeypatch):
    """Issue 56: each new proof left an FX source in FX's cache and in linecache (its J·v factor's graph, made
    outside the lock that drops them), an entry in fake tensors' dispatch cache (the new number by value), and four
    context variables in the thread's context (make_fx's config patches, torch 2.13): with the proofs bounded,
    a hundred new signatures leave every count as it was."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(kept_proofs, "_PROOFS", bounded_cache.BoundedCache(4))

    def scaled(scale):
        @sgm.custom_gradient
        def f(x):
            c = torch.cos(x)
            return torch.sin(x), lambda ct: ct * (c * scale)  # one product: J·v = v · c·scale, a factor's graph
        return f

    def counts():
        return (len(_loader.eval_cache), len(linecache.cache), len(FakeTensorMode.cache),
                len(contextvars.copy_context()))

    for k in range(8):  # (an int in the closure is keyed by value: each a new proof)
        _gradient(scaled(100 + k), X)
    gc.collect()
    before = counts()
    for k in range(100):
        torch.testing.assert_close(_gradient(scaled(1 + k), X), (1.0 + k) * torch.cos(X), rtol=0, atol=0)
    gc.collect()
    assert counts() == before


@pytest.mark.parametrize("vjp", ["a product (the reverse fast path)", "not a product"])
def test_in_anomaly_mode_a_new_proof_is_made_and_a_second_derivative_raises_the_guards_error(vjp):
    """``set_detect_anomaly(True)``: the engine's check for NaN asked a fake tensor's value while the transpose was
    traced, so the first call failed (GuardOnDataDependentSymNode); and the fast path's node had a ``name``
    attribute shadowing the node's own method, which anomaly mode calls when a backward raises (TypeError in
    place of the guard's LookupError). torch 2.6 loses the error of a hook on a Function's backward graph in
    anomaly mode itself (a Function of PyTorch's alone does the same): its RuntimeError is the limit there."""
    @sgm.custom_gradient
    def f(x):
        c = torch.cos(x)
        return torch.sin(x), (lambda ct: ct * c) if vjp.startswith("a product") else (lambda ct: (ct * c).neg().neg())

    with torch.autograd.set_detect_anomaly(True):
        torch.testing.assert_close(_gradient(f, X), torch.cos(X), rtol=0, atol=0)
        v = X.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(v).sum(), v, create_graph=True)
        torch.testing.assert_close(g, torch.cos(X), rtol=0, atol=0)
        pytorch_loses_it = Version(torch.__version__).release < (2, 13) and vjp.startswith("a product")
        with pytest.raises(RuntimeError if pytorch_loses_it else LookupError,
                           match="anomaly metadata" if pytorch_loses_it else "order=2"):
            g.sum().backward()
    assert not torch.is_anomaly_enabled()


class Config:
    scale = 2.0  # a class attribute a VJP reads: reassigning it must make a new proof


def test_a_reassigned_class_attribute_makes_a_new_proof_and_a_dtype_in_the_closure_is_keyed(traces):
    @sgm.custom_gradient
    def f(x):
        dtype = x.dtype
        return torch.sin(x), lambda ct: (ct * torch.cos(x) * Config.scale).to(dtype)

    try:
        for scale in (2.0, 5.0, 5.0):
            Config.scale = scale
            torch.testing.assert_close(_gradient(f, X), scale * torch.cos(X), rtol=0, atol=0)
    finally:
        Config.scale = 2.0
    assert traces[0] == 2


self_holding = types.ModuleType("self_holding")  # holds itself, as torch.torch is torch
self_holding.factor = 2.0
self_holding.self_holding = self_holding


def test_a_module_attribute_that_is_the_module_is_keyed_and_its_reassignment_makes_a_new_proof(traces):
    """The key takes a module's attribute that is the module itself as such (its attributes are in the key
    already); reassigning that attribute to another module is another key."""
    @sgm.custom_gradient
    def f(x):
        return torch.sin(x), lambda ct: ct * torch.cos(x) * self_holding.self_holding.factor

    other = types.ModuleType("other")
    other.factor = 5.0
    try:
        for holder, scale in ((self_holding, 2.0), (other, 5.0), (other, 5.0), (self_holding, 2.0)):
            self_holding.self_holding = holder
            torch.testing.assert_close(_gradient(f, X), scale * torch.cos(X), rtol=0, atol=0)
    finally:
        self_holding.self_holding = self_holding
    assert traces[0] == 2


def _flattened_scale(m):
    """x ↦ x·m.reshape(-1): the VJP reshapes the closed-over m itself, a view where m is contiguous and a copy
    where it is not, so its traced graph depends on m's strides."""
    @sgm.custom_gradient
    def f(x):
        return x * m.reshape(-1), lambda ct: ct * m.reshape(-1)
    return f


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_closed_over_tensor_of_other_strides_makes_a_new_proof(compiled, traces, monkeypatch):
    """A square w and then w.t(): one shape and dtype, other strides. A proof keyed without strides would reuse the
    graph traced for w (a view of contiguous memory) on w.t(), which raises or reads the wrong layout; each gets
    its own proof and the gradient m.reshape(-1) (issue 59)."""
    from torch_modes import fresh_compilation

    fresh_compilation(monkeypatch)
    w = torch.arange(9.0, dtype=torch.float64).reshape(3, 3)
    for m in (w, w.t(), w):
        f = _flattened_scale(m)
        f = torch.compile(f, fullgraph=True) if compiled else f
        x = torch.ones(9, dtype=torch.float64, requires_grad=True)
        f(x).sum().backward()
        assert torch.equal(x.grad, m.reshape(-1)), m.stride()
    if not compiled:
        assert traces[0] == 2  # w, then w.t(); w again reuses its own


def test_a_function_subclass_keeps_its_backwards_proof_and_reads_each_calls_saved_tensors_and_attributes(traces):
    """stopgrad_math.torch.Function's VJP closes over the ctx's parts (its saved tensors, its attributes as pairs),
    not the ctx: its proof is kept by signature, as a decorated VJP's, and each call reads its own tensors and
    values. (Closing over the ctx object traced the backward at every call, about 140 times a Function's cost.)
    Under torch.func.grad, which proves each call: in reverse mode alone a call of a proven signature defers its
    proof (``test_deferred_term``)."""
    class ScaledExp(sgm.Function):
        @staticmethod
        def forward(ctx, x, scale):
            y = x.exp()
            ctx.save_for_backward(y)
            ctx.scale = scale
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y * ctx.scale, None

    _func_gradient(lambda x: ScaledExp.apply(x, 2.0), X)
    made = traces[0]
    for x in (X, X * 3.0, -X):
        torch.testing.assert_close(_func_gradient(lambda x: ScaledExp.apply(x, 2.0), x), 2.0 * torch.exp(x), rtol=0,
                                   atol=0)
    assert traces[0] == made == 1
    torch.testing.assert_close(_func_gradient(lambda x: ScaledExp.apply(x, 5.0), X), 5.0 * torch.exp(X), rtol=0, atol=0)
    assert traces[0] == 2  # another attribute value: another proof
