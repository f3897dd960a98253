"""Shared by the PyTorch tests: each of PyTorch's ways to differentiate, as a way to get the derivative of an
elementwise function (the Jacobian's diagonal); awkward elementwise cases for hypothesis."""

import numpy as np
import torch
import torch.autograd.forward_ad as forward_ad
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def _backward(fn, x):
    x = x.detach().requires_grad_(True)
    fn(x).sum().backward()
    return x.grad


def _autograd_grad(fn, x, create_graph=False):
    x = x.detach().requires_grad_(True)
    return torch.autograd.grad(fn(x).sum(), x, create_graph=create_graph)[0]


def _forward_ad(fn, x):
    with forward_ad.dual_level():
        return forward_ad.unpack_dual(fn(forward_ad.make_dual(x, torch.ones_like(x)))).tangent


def _sum_of(fn):
    return lambda x: fn(x).sum()


MODES = {
    "backward": _backward,
    "autograd.grad": _autograd_grad,
    "autograd.grad(create_graph)": lambda fn, x: _autograd_grad(fn, x, create_graph=True),
    "forward_ad": _forward_ad,
    "func.grad": lambda fn, x: torch.func.grad(_sum_of(fn))(x),
    "func.vjp": lambda fn, x: torch.func.vjp(fn, x)[1](torch.ones_like(x))[0],
    "func.jvp": lambda fn, x: torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1],
    "func.jacfwd": lambda fn, x: torch.func.jacfwd(fn)(x).diagonal(),
    "func.jacrev": lambda fn, x: torch.func.jacrev(fn)(x).diagonal(),
    "func.vmap(func.grad)": lambda fn, x: torch.func.vmap(torch.func.grad(fn))(x),
    "func.vmap(func.jvp)": lambda fn, x: torch.func.vmap(
        lambda x: torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1])(x),
}
"""Each maps (fn, x) to the derivative of an elementwise fn at x along ones; vmap's variants call fn on scalars."""

COMPILED_MODES = {
    "compile(fullgraph) backward": lambda fn, x: _backward(torch.compile(fn, fullgraph=True), x),
    "compile(fullgraph) func.grad": lambda fn, x: torch.compile(torch.func.grad(_sum_of(fn)), fullgraph=True)(x),
}
"""torch.compile with fullgraph=True: a graph break raises."""


def ours(error: BaseException, kind: type[BaseException]) -> BaseException:
    """The error of ``kind`` a refusal raised: the error itself eagerly; compiled, Dynamo raises its own
    InternalTorchDynamoError (a RuntimeError) with ours as its context, found there."""
    while not isinstance(error, kind) and error.__context__ is not None:
        error = error.__context__
    return error


def counted_traces(monkeypatch):
    """A one-item list counting the VJP traces the decorator makes from now on (each proof, or each call traced
    anew)."""
    from stopgrad_math.torch import aten_graphs

    count = [0]
    original = aten_graphs.trace

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(aten_graphs, "trace", counted)
    return count


def fresh_compilation(monkeypatch):
    """Dynamo reset, and the decorator's proofs made while compiling forgotten: a test compiles and proves anew,
    with whatever it patches in place."""
    from stopgrad_math.shared import bounded_cache
    from stopgrad_math.torch import compiled_proof

    torch._dynamo.reset()
    monkeypatch.setattr(compiled_proof, "_PROVEN_WHILE_COMPILING", bounded_cache.BoundedCache(4))


AWKWARD = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, 3e4, 1e-30]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}


@st.composite
def elementwise_cases(draw):
    """(value, derivative, x) as float64 NumPy arrays of one shape, and a torch dtype: the first two from AWKWARD,
    x finite or inf."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    values = st.sampled_from(AWKWARD)
    value, derivative = (draw(hnp.arrays(np.float64, shape, elements=values)) for _ in range(2))
    x = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([0.5, -1.0, 2.0, np.inf])))
    return value, derivative, x, DTYPES[dtype]


def bits(t: torch.Tensor) -> np.ndarray:
    """The bit patterns of a tensor's elements (NaN payloads and zero signs included)."""
    t = t.detach().contiguous()
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width).numpy()
