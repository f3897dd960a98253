"""The table of linear ATen ops (stopgrad_math.torch.linear_ops): each row on a VJP that uses its op.

Each case is a VJP of a cotangent of shape (4,), closing over constants. The
independent truth for a row is the traced graph itself, evaluated: a map the
table calls linear must satisfy f(a·u + b·w) = a·f(u) + b·f(w) on random
cotangents, and each refused one must fail it (or, for a constant term, give
the same nonzero value for every cotangent). Each case also asserts that its
op is in the graph, so that the row it is named for is the one judged.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from stopgrad_math.shared.linearity import AFFINE, Finding, State  # noqa: E402
from stopgrad_math.torch import aten_graphs, linear_ops  # noqa: E402

S = torch.tensor([0.3, 0.7, 0.2, 0.9])
M = torch.tensor([[2.0, 0.5, 0.0, 1.0], [0.0, 1.0, 3.0, 0.5], [1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 2.0]])
L = torch.tril(M) + torch.eye(4)
IDX = torch.tensor([0, 2, 2, 1])


def _scatter_into_zeros(ct):
    g = torch.zeros(4)
    g[1:3] = ct[1:3] * S[1:3]
    return g.scatter_add(0, IDX, ct)


LINEAR = {  # case: (vjp, an ATen op its graph must hold)
    "mul by a constant": (lambda ct: ct * S, "mul"),
    "add and sub of cotangent terms": (lambda ct: ct * 2 - ct.flip(0), "sub"),
    "sum": (lambda ct: ct.sum() * S, "sum"),
    "views": (lambda ct: ct.view(2, 2).t().reshape(4).unsqueeze(0).expand(3, 4).permute(1, 0)[:, 1], "permute"),
    "matmul": (lambda ct: M @ ct + (ct[None, :] @ M)[0], "mm"),
    "einsum": (lambda ct: torch.einsum("ij,jk->ik", M, ct[:, None] * S)[:, 0], "bmm"),
    "index": (lambda ct: ct[IDX], "index"),
    "gather": (lambda ct: torch.gather(ct, 0, IDX), "gather"),
    "scatter into zeros": (_scatter_into_zeros, "scatter_add"),
    "a slice written into zeros": (_scatter_into_zeros, "slice_scatter"),
    "cat": (lambda ct: torch.cat([ct[:2], ct[2:] * S[2:]]), "cat"),
    "pad": (lambda ct: F.pad(ct, (1, 1))[1:-1], "constant_pad_nd"),
    "where on a cotangent-free condition": (lambda ct: torch.where(S > 0.5, ct, 0.0), "where"),
    "casts between floats": (lambda ct: ct.double().mul(2).float(), "_to_copy"),
    "fft": (lambda ct: torch.fft.ifft(torch.fft.fft(ct) * S).real, "_fft_c2c"),
    "rfft": (lambda ct: torch.fft.irfft(torch.fft.rfft(ct), n=4), "_fft_c2r"),
    "division by a constant": (lambda ct: ct / S, "div"),
    "triangular solve": (lambda ct: torch.linalg.solve_triangular(L, ct[:, None], upper=False)[:, 0],
                         "linalg_solve_triangular"),
    "dense solve": (lambda ct: torch.linalg.solve(M + 4 * torch.eye(4), ct[:, None])[:, 0], "_linalg_solve_ex"),
    "zeros added": (lambda ct: ct + torch.zeros(4), "add"),
    # traced as a backward runs, where detach and .data are no-ops on the cotangent's values (each recorded as
    # detach_copy, which make_fx records as itself on every version: from 2.14 it records detach as alias)
    "detach and .data": (lambda ct: ct.detach() * 2 + ct.data * S, "detach_copy"),
    "a literal zero written in (g[i] = 0)": (lambda ct: _zeroed(ct * S), "fill"),
    "a cotangent written into zeros": (lambda ct: _written_into(torch.zeros(4), ct[:2] * 2), "slice_scatter"),
    "a strided view written into zeros": (lambda ct: _strided_into(torch.zeros(4), ct), "as_strided_scatter"),
}

REFUSED = {  # case: (vjp, the op the finding names, what its reason says)
    "clamp": (lambda ct: ct.clamp(-0.5, 0.5), "clamp", "clips"),
    "relu": (lambda ct: torch.relu(ct), "relu", "rectifies"),
    "norm": (lambda ct: torch.linalg.vector_norm(ct) * S, "linalg_vector_norm", "norms"),
    "abs": (lambda ct: ct.abs(), "abs", "abs"),
    "sign": (lambda ct: ct.sign() * S, "sign", "sign"),
    "division by the cotangent": (lambda ct: S / ct, "div", "divides by the cotangent"),
    "power": (lambda ct: ct**2, "pow", "powers"),
    "comparison": (lambda ct: (ct > 0) * S, "gt", "compares"),
    "where on the cotangent": (lambda ct: torch.where(ct > 0, ct, 0.0), "gt", "compares"),
    "product of cotangents": (lambda ct: ct * ct.flip(0), "mul", "quadratic"),
    "affine": (lambda ct: ct + 1, "add", "affine"),
    "scatter into a constant": (lambda ct: S.scatter_add(0, IDX, ct), "scatter_add", "affine"),
    "a slice written into a constant": (lambda ct: _written_into(S, ct), "slice_scatter", "affine"),
    "a strided view written into a constant": (lambda ct: _strided_into(S, ct), "as_strided_scatter", "affine"),
    "pad with a value that is not zero": (lambda ct: F.pad(ct, (1, 1), value=1.0), "constant_pad_nd",
                                          "not zero"),
    "cast to an integer": (lambda ct: (ct * 10).to(torch.int32).float(), "_to_copy", "torch.int32"),
    "an op the table lacks": (lambda ct: torch.erf(ct), "erf", "not in the table"),
    "a solve with the cotangent in the matrix": (lambda ct: torch.linalg.solve_ex(torch.diag(ct), S)[0],
                                                 "_linalg_solve_ex", "solves against the cotangent"),
}


def _zeroed(g):
    g[1:3] = 0
    return g


def _written_into(base, ct):
    g = base.clone()
    g[1:3] = ct[1:3]
    return g


def _strided_into(base, ct):
    """ct's first two elements written into every other element of a copy of base, by strides (as Keras 3.5's
    torch convolutions write): functionalized, an as_strided_scatter."""
    g = base.clone()
    g.as_strided((2,), (2,)).copy_(ct[:2])
    return g


def _graph(vjp):
    return aten_graphs.trace(lambda ct: [vjp(ct)], torch.zeros(4))


def _is_linear(graph):
    generator = torch.Generator().manual_seed(0)
    u, w = torch.randn(4, generator=generator), torch.randn(4, generator=generator)
    combined = graph(2.0 * u - 3.0 * w)[0]
    return torch.allclose(combined, 2.0 * graph(u)[0] - 3.0 * graph(w)[0], atol=1e-5)


def _ops(graph):
    return {linear_ops.op_name(n.target) for n in graph.graph.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("case", LINEAR)
def test_a_linear_vjp_is_proven_linear(case):
    vjp, op = LINEAR[case]
    graph = _graph(vjp)
    assert op in _ops(graph)
    assert _is_linear(graph)
    assert graph.states() == [State.LINEAR]


@pytest.mark.parametrize("case", LINEAR)
def test_the_map_the_decorator_differentiates_is_the_traced_values_transpose(case):
    """The dot-product test on Traced.linear, the graph the decorator differentiates: <map(u), w> = <u, Jᵀw>, the
    map by the traced graph's values and Jᵀ by autodiff of the differentiable graph (where a detach left as a stop
    would give 0, and copy, which autograd cannot differentiate, would raise)."""
    graph = _graph(LINEAR[case][0])
    generator = torch.Generator().manual_seed(1)
    u, w = torch.randn(4, generator=generator), torch.randn(4, generator=generator)
    linear = graph.linear(graph.constants, [0])
    [transposed] = torch.func.vjp(linear, torch.zeros(4))[1]([w])
    torch.testing.assert_close(torch.dot(u, transposed), torch.dot(graph(u)[0], w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", REFUSED)
def test_a_vjp_that_is_not_linear_is_refused_naming_the_op(case):
    vjp, op, why = REFUSED[case]
    graph = _graph(vjp)
    assert op in _ops(graph)
    assert not _is_linear(graph)
    [finding] = graph.states()
    assert isinstance(finding, Finding)
    assert op in finding.primitive and why in str(finding)
    assert finding.unknown == (case == "an op the table lacks")


def test_the_affine_finding_is_the_one_reason_shared_with_jax():
    [finding] = _graph(lambda ct: ct + 1).states()
    assert finding.why == AFFINE


def test_a_term_that_does_not_depend_on_the_cotangent_is_const_and_zeros_are_zero():
    graph = aten_graphs.trace(lambda ct: [S * 2, torch.zeros(4), torch.zeros(2, 2).reshape(4).double(), ct * 0],
                             torch.zeros(4))
    assert graph(torch.ones(4))[0].abs().sum() > 0  # the truth: a nonzero constant, not a map of ct
    assert graph.states() == [State.CONST, State.ZERO, State.ZERO, State.ZERO]  # ct·0: the zero map


def test_zeros_multiplied_or_added_stay_zero_so_an_iteration_from_zeros_is_linear():
    """0·S, 0 @ M, M @ 0, 0 + 0 and einsum with a zero, the zeros made inside, are zero (a product with a zero
    factor, as a product whose cotangent side is zero already is); S + 0 is not. So ``v = 0; v = ct + v @ M`` is
    linear, where it was refused as affine."""
    graph = aten_graphs.trace(lambda ct: [torch.zeros(4) * S, torch.zeros(4) @ M, M @ torch.zeros(4),
                                         torch.zeros(4) + torch.zeros(4), torch.einsum("i,ij->j", torch.zeros(4), M),
                                         S + torch.zeros(4), ct + torch.zeros(4) @ M], torch.zeros(4))
    assert graph.states() == [State.ZERO] * 5 + [State.CONST, State.LINEAR]


def test_an_op_that_reads_only_the_cotangents_shape_does_not_depend_on_it():
    graph = aten_graphs.trace(lambda ct: [ct.new_zeros(4), torch.zeros_like(ct), torch.ones_like(ct),
                                         ct.new_full((4,), 2.0)], torch.zeros(4))
    assert graph(torch.ones(4))[2].sum() == 4  # the truth: the ones are a constant, not a map of ct
    assert graph.states() == [State.ZERO, State.ZERO, State.CONST, State.CONST]


def test_a_finding_reaches_every_output_it_feeds_and_only_those():
    graph = aten_graphs.trace(lambda ct: [ct.abs() * S, ct * S, ct.abs().sum() + ct], torch.zeros(4))
    first, second, third = graph.states()
    assert isinstance(first, Finding) and first.primitive == "abs"
    assert second is State.LINEAR
    assert isinstance(third, Finding) and third.primitive == "abs"


def test_several_cotangents_each_a_placeholder():
    graph = aten_graphs.trace(lambda a, b: [a * S + b[:4], M @ a - b[4:]], torch.zeros(4), torch.zeros(8))
    assert graph.states() == [State.LINEAR, State.LINEAR]


def test_a_split_reaches_each_piece_through_getitem():
    graph = aten_graphs.trace(lambda ct: list(torch.split(ct, 2)), torch.zeros(4))
    assert "split" in _ops(graph)
    assert graph.states() == [State.LINEAR, State.LINEAR]


def test_in_place_updates_are_judged_after_functionalization():
    def vjp(ct):
        g = torch.zeros(4)
        g += ct * S
        g.mul_(2)
        return [g]

    graph = aten_graphs.trace(vjp, torch.zeros(4))
    assert not any(linear_ops.op_name(n.target).endswith("_") for n in graph.graph.graph.nodes
                   if n.op == "call_function")
    assert graph.states() == [State.LINEAR]

    def clipped_in_place(ct):
        g = ct.clone()
        g.clamp_(-1, 1)
        return [g]

    [finding] = aten_graphs.trace(clipped_in_place, torch.zeros(4)).states()
    assert isinstance(finding, Finding) and finding.primitive == "clamp"


def test_a_solves_other_results_are_the_matrixs_alone():
    """``_linalg_solve_ex`` returns x = A⁻¹B and A's LU factors, pivots and info: only x is linear in a cotangent
    B; the info a VJP reads (linalg.solve_ex's second result) is a constant of A, never taken for linear."""
    graph = _graph(lambda ct: torch.linalg.solve_ex(M + 4 * torch.eye(4), ct[:, None])[1].to(ct.dtype) * S)
    assert "_linalg_solve_ex" in _ops(graph)
    assert graph.states() == [State.CONST]
