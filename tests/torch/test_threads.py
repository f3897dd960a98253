"""PyTorch's decorator beside compiled code in other threads (issue 56). PyTorch keeps "compiling" and "an FX trace
is running" as flags of the process: while one thread compiled, another's eager call took the compiled path, and
while one thread traced a VJP, another's compiled calls raised. Each result is checked against its closed form."""

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from torch_modes import counted_traces  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402
from stopgrad_math.shared import bounded_cache  # noqa: E402
from stopgrad_math.torch import kept_proofs  # noqa: E402

X = torch.tensor([0.4, -1.3, 2.2, 0.9], dtype=torch.float64)
DYNAMO_MARKS_ITS_COMPILATIONS = hasattr(torch.compiler, "_compile_session_context")
"""Whether Dynamo sets "compiling" for the process while it compiles. Before (torch 2.6) PyTorch's own limits
meet a thread beside a compilation: a compiled call raises, a plain compiled function's too (FX's flag of the
compilation's trace read as an FX trace of it); and a backward raising in a Function's backward graph loses its
error to anomaly mode, which AOTAutograd turns on for the process while it traces (the limit of
``test_torch_proofs_kept``'s anomaly test)."""


@pytest.fixture(autouse=True)
def _fresh_proofs(monkeypatch):
    monkeypatch.setattr(kept_proofs, "_PROOFS", bounded_cache.BoundedCache(kept_proofs.PROOFS_KEPT))


@sgm.custom_gradient
def sine(x):
    c = torch.cos(x)
    return torch.sin(x), lambda ct: ct * c


def _gradient(f, x):
    x = x.detach().clone().requires_grad_(True)
    f(x).sum().backward()
    return x.grad


def _second_derivative_raises_the_guards_error(x):
    v = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sine(v).sum(), v, create_graph=True)
    with pytest.raises(LookupError, match="order=2"):
        g.sum().backward()


def test_an_eager_call_while_another_thread_compiles_is_eager(monkeypatch):
    """Dynamo's "compiling" flag, set here as a compilation in another thread sets it for the whole process: the
    eager call keeps its guard, its kept proofs, eagerly and under torch.func, and its exact gradient."""
    traces = counted_traces(monkeypatch)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()  # what every thread reads while one compiles
    for x in (X, 2.0 * X):
        torch.testing.assert_close(_gradient(sine, x), torch.cos(x), rtol=0, atol=0)
        torch.testing.assert_close(torch.func.grad(lambda t: sine(t).sum())(x), torch.cos(x), rtol=0, atol=0)
        _second_derivative_raises_the_guards_error(x)
    assert traces[0] == 1  # one proof, kept, for all six calls


def test_another_threads_compiled_call_runs_while_a_vjp_is_traced():
    """The VJP runs inside its first trace (make_fx), while FX's flag of a running trace is set: a compiled
    function called from another thread then raised "using FX to symbolically trace a dynamo-optimized
    function"."""
    doubled = torch.compile(lambda t: torch.sin(t) * 2.0, fullgraph=True)
    doubled(X)
    results, errors = [], []

    def call_compiled():
        try:
            results.append(doubled(X))
        except Exception as error:  # reported below
            errors.append(repr(error))

    @sgm.custom_gradient
    def f(x):
        def vjp(ct):
            thread = threading.Thread(target=call_compiled)
            thread.start()
            thread.join()
            return ct * torch.cos(x)
        return torch.sin(x), vjp

    torch.testing.assert_close(_gradient(f, X), torch.cos(X), rtol=0, atol=0)
    assert errors == [] and len(results) == 1
    torch.testing.assert_close(results[0], torch.sin(X) * 2.0, rtol=0, atol=0)


def _compile_new_functions(count, errors, compiled):
    """Compiles ``count`` new functions, one at a time; ``compiled`` set at the end."""
    try:
        for scale in [float(k + 2) for k in range(count)]:
            torch.testing.assert_close(torch.compile(lambda t, scale=scale: t * scale)(X), X * scale, rtol=0,
                                       atol=0)
    except BaseException as error:  # reported by the caller
        errors.append(repr(error))
    finally:
        compiled.set()


def _beside_compilations(calls, threads=4):
    """``calls()`` in ``threads`` threads, again and again while another compiles three new functions (at most a
    minute): the errors raised, and how many times the calls ran."""
    budget = time.monotonic() + 60.0
    compiled = threading.Event()
    errors, counts = [], [0]

    def work():
        try:
            while not compiled.is_set() and time.monotonic() < budget:
                calls()
                counts[0] += 1
        except BaseException as error:  # reported by the caller
            errors.append(repr(error))

    running = [threading.Thread(target=work) for _ in range(threads)]
    running.append(threading.Thread(target=_compile_new_functions, args=(3, errors, compiled)))
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    assert compiled.is_set()
    return errors, counts[0]


def test_threads_of_eager_transformed_and_compiled_calls_beside_a_compiling_thread_raise_nothing():
    """Four threads, each calling the decorated function eagerly, under torch.func, under torch.compile, a
    compiled plain function, and a second derivative the guard refuses, while a fifth compiles: each call gives
    what it gives alone. (Before torch 2.13, the eager and torch.func calls alone: PyTorch's own limits above.)"""
    compiled_sine = torch.compile(lambda t: sine(t), fullgraph=True)
    doubled = torch.compile(lambda t: torch.sin(t) * 2.0, fullgraph=True)

    def calls(everything=True):
        torch.testing.assert_close(_gradient(sine, X), torch.cos(X), rtol=0, atol=0)
        torch.testing.assert_close(torch.func.grad(lambda t: sine(t).sum())(X), torch.cos(X), rtol=0, atol=0)
        if everything:
            x = X.clone().requires_grad_(True)
            compiled_sine(x).sum().backward()
            torch.testing.assert_close(x.grad, torch.cos(X), rtol=1e-12, atol=0)
            torch.testing.assert_close(doubled(X), torch.sin(X) * 2.0, rtol=0, atol=0)
            _second_derivative_raises_the_guards_error(X)

    calls()  # proofs and compilations made before the threads start
    errors, count = _beside_compilations(lambda: calls(DYNAMO_MARKS_ITS_COMPILATIONS))
    assert errors == [] and count > 4  # (the threads ran beside the compilations)


class _ExpSaved(sgm.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


def test_compiled_calls_in_one_thread_run_while_another_makes_new_proofs():
    """Issue 76: make_fx sets FX's flag of a running trace for the process before the function it traces runs (torch
    before 2.14), and a compiled call in another thread raised in that window: 48% of a plain compiled function's
    calls, and of a compiled class call's, while a thread made a new proof at every call. Dynamo's question is
    answered per thread (``aten_graphs._thread_aware``): every compiled call runs and is exact."""
    plain = torch.compile(lambda x: (torch.sin(x) * 2.0).sum(), fullgraph=True)
    class_call = torch.compile(lambda x: _ExpSaved.apply(x).sum(), fullgraph=True)
    leaf = X.clone().requires_grad_(True)
    plain(X)
    class_call(leaf).backward()
    proofs, errors, done = [0], [], threading.Event()

    def new_proofs():
        while not done.is_set() and proofs[0] < 400:
            scale = proofs[0] + 2  # (an int the VJP closes over is in its key by value: a new proof at each call)

            @sgm.custom_gradient
            def scaled(x, scale=scale):
                return x * scale, lambda ct: ct * scale

            _gradient(scaled, torch.ones(proofs[0] % 7 + 1, dtype=torch.float64))
            proofs[0] += 1

    prover = threading.Thread(target=new_proofs)
    prover.start()
    calls = 0
    while prover.is_alive() and calls < 20000:
        calls += 1
        try:
            assert plain(X) == (torch.sin(X) * 2.0).sum()
            leaf.grad = None
            class_call(leaf).backward()
            assert torch.equal(leaf.grad, X.exp())
        except RuntimeError as error:  # reported below
            errors.append(str(error).splitlines()[0])
    done.set()
    prover.join()
    assert proofs[0] >= 50 and calls >= 50
    assert errors == [], f"{len(errors)} of {calls} calls raised, first: {errors[0]}"
