"""Fast paths for eager calls, each giving the ordinary ops' results bit for bit where it is taken: the identity
form's, one ``autograd.Function`` whose backward and jvp are the ordinary-op identity's derivative, op for op, where
every element of x and gx is finite, plainly eager or under one torch.func derivative; and the decorator's in
forward mode alone (``dual_of_map``, below), eagerly and under torch.func's jvp.

Eagerly each of the identity's ops is a pass over memory and a node of the tape, about fifteen of them. Where x
and g are finite, the identity's derivative (``identity.zero_term``, differentiated by PyTorch) comes to

    reverse:  x̄ = −((−c)·g + 0·sign(g))      forward:  ḣ = −(−(ẋ·g) + 0)

for a cotangent c or a tangent ẋ, where the zero terms are what the identity's unchosen branches and its slope
carrier add: they set the sign of a zero result, and they are kept so that every bit (signs of zero, NaN
payloads, rounding) is the identity's. These are four or five passes. The value is ``fx − 0.0``, the identity's
last op.

The fast path is taken only where the two are known to agree (``tests/torch/test_eager_fast_path.py`` compares them
bit for bit over a grid of ±0, subnormal, huge, ±inf and NaN cotangents and tangents, and in every mode): one
leaf of x, elementwise, with fx, gx and x of one shape and one dtype (float16, 32 or 64), plain tensors, in reverse
mode or in forward mode but not both, and plainly eager (``identity.plainly_eager``: no torch.func transform,
compilation, trace, dispatch or torch function mode), or under torch.func transforms that take one derivative of
the call and nothing can differentiate further (``_alone``), where its backward never records a graph.
Everything else is the ordinary ops: a non-finite element of x or gx, broadcasting, several leaves, complex
values, ``fx_gx_manually_stopped``. A backward with ``create_graph=True`` differentiates its own result, so it
recomputes the identity's ops from the saved x and differentiates those.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
from torch.utils import _pytree as pytree

from stopgrad_math.shared.layouts import Layout
from stopgrad_math.torch import aten_graphs, identity, second_derivative_guard


def _ordinary(fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The identity of ordinary ops (fx and g stopped): the definition the fast path reproduces."""
    return identity.attach(fx, [identity.zero_term(Layout.ELEMENTWISE, fx, x, g)])


def _derivative(t: torch.Tensor, g: torch.Tensor, reverse: bool) -> torch.Tensor:
    """The ordinary-op identity's derivative for finite x and g, op for op: x̄ = −((−c)·g + 0·sign(g)) for a
    cotangent c (``reverse``), ḣ = −(−(ẋ·g) + 0) for a tangent ẋ."""
    if reverse:
        return torch.mul(t.neg(), g).add_(torch.sign(g).mul_(0.0)).neg_()
    return torch.mul(t, g).neg_().add_(0.0).neg_()


class _FiniteIdentity(torch.autograd.Function):
    """fx with derivative g w.r.t. x, for finite x and g (fx and g stopped), in plain eager calls; see the module
    docstring. (Its forward takes ``ctx``: torch.func's form, a forward without it and ``setup_context``, which
    ``_InTransforms`` takes, costs a plain eager call about 50 µs more.)"""

    @staticmethod
    def forward(ctx: Any, fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(g)
        ctx.save_for_forward(g)
        ctx.fx, ctx.x = fx, x  # for create_graph alone, unpacked without save_for_backward's version check,
        # as the ordinary ops keep no reference to x that a later in-place change of x would invalidate
        return torch.sub(fx, 0.0)

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor | None) -> tuple[None, None, torch.Tensor | None]:
        (g,) = ctx.saved_tensors
        if cotangent is None:
            return None, None, None
        if torch.is_grad_enabled():  # create_graph: the ordinary ops, differentiable as the identity's are
            x = ctx.x
            (grad,) = torch.autograd.grad(_ordinary(ctx.fx, g, x), x, cotangent, create_graph=True)
            return None, None, grad
        return None, None, _derivative(cotangent, g, reverse=True)

    @staticmethod
    def jvp(ctx: Any, fx_tangent: Any, g_tangent: Any, x_tangent: torch.Tensor | None) -> torch.Tensor:
        del fx_tangent, g_tangent  # fx and g are stopped: they carry none
        (g,) = ctx.saved_tensors
        if x_tangent is None:
            return torch.zeros_like(g)
        return _derivative(x_tangent, g, reverse=False)


class _InTransforms(_FiniteIdentity):
    """``_FiniteIdentity`` under torch.func transforms that take one derivative of the call, which nothing
    differentiates further (``_alone``): with the rules torch.func asks of a Function, and no create_graph to
    serve (a torch.func grad asks it, but nothing differentiates its result), but for a cotangent given to
    func.vjp's pullback that requires grad."""

    generate_vmap_rule = True  # its forward is one op of fx: vmap batches it, and its backward's and jvp's ops

    @staticmethod
    def forward(fx: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.sub(fx, 0.0)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        fx, g, x = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(g)
        ctx.save_for_forward(g)
        ctx.fx, ctx.x = fx, x

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor | None) -> tuple[None, None, torch.Tensor | None]:
        (g,) = ctx.saved_tensors
        if cotangent is None:
            return None, None, None
        if _moves(cotangent):  # the result is differentiated w.r.t. it: the ordinary ops' pullback of it
            (grad,) = torch.func.vjp(lambda x: _ordinary(ctx.fx, g, x), ctx.x)[1](cotangent)
            return None, None, grad
        return None, None, _derivative(cotangent, g, reverse=True)


_DTYPES = (torch.float16, torch.float32, torch.float64)
"""Where the grid holds every bit; on bfloat16 the forward formula differs from the identity in a NaN's sign."""


def _plain(tensor: torch.Tensor, like: torch.Tensor) -> bool:
    """Whether ``tensor`` is a plain strided tensor of ``like``'s shape, dtype and device (no subclass)."""
    return (type(tensor) is torch.Tensor and tensor.layout == torch.strided and tensor.shape == like.shape
            and tensor.dtype == like.dtype and tensor.device == like.device)


def _one_mode(x: torch.Tensor) -> bool:
    """Reverse mode alone (x requires grad, no forward-mode level) or forward mode alone (x has a tangent at the
    current level, and nothing requires grad): a Function's backward and jvp are each ours there."""
    reverse = torch.is_grad_enabled() and x.requires_grad
    if forward_ad._current_level < 0:
        return reverse
    tangent = forward_ad.unpack_dual(x).tangent  # type: ignore[no-untyped-call]
    return not reverse and tangent is not None and not (torch.is_grad_enabled() and tangent.requires_grad)


def one_plain_elementwise(fx: torch.Tensor, planned: list[tuple[str, Layout, torch.Tensor, torch.Tensor]]
                          ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(g, x) where the identity has one leaf of x, elementwise, and fx, g and x are plain tensors of one shape and
    one of ``_DTYPES`` (where both fast paths may stand in); None otherwise."""
    if len(planned) != 1 or fx.dtype not in _DTYPES:
        return None
    (_, layout, g, x) = planned[0]
    if layout is not Layout.ELEMENTWISE or not (_plain(fx, fx) and _plain(g, fx) and _plain(x, fx)):
        return None
    return g, x


def finite_identity(fx: torch.Tensor, planned: list[tuple[str, Layout, torch.Tensor, torch.Tensor]]
                    ) -> torch.Tensor | None:
    """The identity's result through the fast path, fx and g stopped; None where the ordinary ops must run."""
    plain = one_plain_elementwise(fx, planned)
    if plain is None:
        return None
    g, x = plain
    result: torch.Tensor
    if retrieve_all_functorch_interpreters():
        if not (_alone(x, (fx, g)) and identity.eagerly_finite(x) and identity.eagerly_finite(g)):
            return None
        if torch.is_grad_enabled() and x.requires_grad and identity.unwrapped(x).numel() < _REVERSE_TRANSFORM_SIZE:
            return None  # the ordinary ops: the cheaper in reverse mode for small x
        result = _InTransforms.apply(fx, g, x)  # type: ignore[no-untyped-call]
        return result
    if not (identity.plainly_eager() and _one_mode(x) and identity.all_finite(x, g)):
        return None
    result = _FiniteIdentity.apply(fx, g, x)  # type: ignore[no-untyped-call]
    return result


_REVERSE_TRANSFORM_SIZE = 1 << 16
"""The size of x (under vmap, every sample's) from which a torch.func grad or vjp transform takes the Function: it
costs a fixed 0.3–0.7 ms a call there (torch.func makes a Function of each level per call; the more under vmap),
what the ordinary ops' ten or so extra passes over x cost at 3e4 elements under grad and 1e5 under vmap(grad), on a
2-core CPU. Under a jvp transform it is the cheaper at every size measured (1e3 to 1e6), having six fewer ops each
of which costs PyTorch a Python shape computation for an efficient zero tensor."""


def _alone(x: torch.Tensor, others: Sequence[torch.Tensor]) -> bool:
    """Under torch.func transforms: one derivative of this call is taken, by one grad or vjp transform or one jvp
    transform (vmaps around or inside it), w.r.t. x, and nothing else can differentiate it (nothing under the
    wrappers requires grad, no forward-mode level of forward_ad's own): the Function's backward or jvp then
    gives the whole derivative, and its result is never differentiated itself."""
    if forward_transforms_alone((x, *others)):
        return _fixed_tangents([x])
    return torch.is_grad_enabled() and x.requires_grad and reverse_transforms_alone((x, *others))


# ---------------------------------------------------------------- the decorator's J·v, in forward mode alone
#
# In forward mode the decorator's ordinary ops are h = y − (zero(p) + L), p = J·v the proven transpose graph run on
# v = stop(x) − x, and L the link of ``identity.zero_with_derivative_of``. Where x and p are finite, PyTorch
# differentiates them to
#
#     ḣ = −1·((J·(−1·ẋ)) + 0)
#
# (a sub or add whose other operand has no tangent passes the tangent on as it is, multiplied by −1 for the
# subtrahend, which keeps a NaN's sign; the link's tangent is +0.0; J·ż is J's graph applied to the
# tangents where each of its ops is one whose forward-mode derivative is the op itself on the tangents of its live
# operands: ``_OPS_OF_TANGENTS``). Each such op with a tangent-less operand costs PyTorch a Python shape computation
# for an efficient zero tensor (150–600 µs at n = 1e3), about seven per call; here the graph is run on the tangents
# directly and the result made dual.

_aten = torch.ops.aten
_OPS_OF_TANGENTS: dict[Any, str] = {
    **dict.fromkeys([_aten.neg.default, _aten.clone.default, _aten.alias.default, _aten.view.default,
                     _aten._unsafe_view.default, _aten.expand.default, _aten.permute.default, _aten.t.default,
                     _aten.transpose.int, _aten.squeeze.dim, _aten.squeeze.dims, _aten.unsqueeze.default,
                     _aten.sum.dim_IntList, _aten.sum.default], "first"),
    **dict.fromkeys([_aten.add.Tensor, _aten.sub.Tensor], "both"),
    **dict.fromkeys([_aten.mul.Tensor, _aten.mm.default], "either"),
    _aten.div.Tensor: "first",
}
"""The ops whose forward-mode derivative is the op itself on the tangents, bit for bit, and where they must be
live: ``first`` (the first operand; any other tensor operand constant), ``both`` (the first two: an add with a
constant passes the tangent as it is, where the op would add the constant's +0.0 to a −0.0), ``either`` (exactly
one of the first two, the other a constant or a number). Each row is checked over a grid of ±0, subnormal, huge,
±inf and NaN values in ``tests/torch/test_eager_fast_path.py``, a product's constant finite: where a NaN tangent meets a
NaN constant, forward mode may keep the other NaN's sign. The path never meets one: it is taken where J·v at
v = +0.0 is finite, and each op here carries every element of a constant it multiplies or divides by into J·v
(inf·0 and 0/0 are NaN)."""


def maps_tangents(graph: torch.fx.GraphModule, live: int) -> bool:
    """Whether forward mode differentiates ``graph`` (its first ``live`` inputs v, the others constants) by applying
    it to the tangents of v, bit for bit: every op that reads v is in ``_OPS_OF_TANGENTS``, reading v where its row
    says, with no keyword argument (an ``alpha``, a rounding mode); every output reads v."""
    moving: set[torch.fx.Node] = set()
    placeholders = 0
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            if placeholders < live:
                moving.add(node)
            placeholders += 1
            continue
        if node.op == "output":
            return all(isinstance(n, torch.fx.Node) and n in moving for n in pytree.tree_leaves(node.args[0]))
        operands = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
        if not any(a in moving for a in operands):
            continue
        row = _OPS_OF_TANGENTS.get(node.target, "") if node.op == "call_function" and not node.kwargs else ""
        live_at = [isinstance(a, torch.fx.Node) and a in moving for a in node.args[:2]]
        live_as_its_row_says = {"first": live_at[0] and sum(a in moving for a in operands) == 1,
                                "both": live_at == [True, True] and len(operands) == 2,
                                "either": sum(live_at) == 1 and len(operands) <= 2}
        if not live_as_its_row_says.get(row, False):
            return False
        moving.add(node)
    return False


def _forward_mode_alone(x: torch.Tensor) -> bool:
    """x has a tangent at the forward-mode level, and nothing may differentiate this call in reverse mode."""
    if torch.is_grad_enabled() and x.requires_grad:
        return False
    tangent = forward_ad.unpack_dual(x).tangent  # type: ignore[no-untyped-call]
    return tangent is not None and not (torch.is_grad_enabled() and tangent.requires_grad)


def _stands_alone(y: torch.Tensor) -> bool:
    """y is a plain tensor that no derivative reaches other than through the embedded map."""
    return (_plain(y, y) and y.dtype in _DTYPES and not y.requires_grad
            and forward_ad.unpack_dual(y).tangent is None)  # type: ignore[no-untyped-call]


def dual_of_map(ys: Sequence[torch.Tensor], xs: Sequence[torch.Tensor],
                transposed: Callable[..., list[torch.Tensor]],
                factor: Callable[[torch.Tensor], torch.Tensor | float] | None = None,
                linked: bool = True) -> list[torch.Tensor] | None:
    """The decorator's outputs ``ys`` with the derivative J w.r.t. ``xs`` in forward mode alone (``transposed``:
    J·v, a graph for which ``maps_tangents`` holds), as its ordinary ops give them; None where they must run.
    Eagerly y is made dual here; under ``torch.func.jvp`` (``jacfwd``, ``vmap`` of it) a Function gives the same
    tangent (``_in_forward_transforms``; ``factor``: where J·v is v times one tensor or number of x's, it of x,
    ``product_factor``). ``linked``: order 1's zero term (its +0.0 link); else order 2's, ``identity.mapped_zero``,
    whose jvp applies ``transposed`` itself to the tangents, any graph, under a transform alone."""
    if retrieve_all_functorch_interpreters():
        return _in_forward_transforms(ys, xs, transposed, factor if linked else None, linked)
    if not linked:
        return None
    if forward_ad._current_level != 0 or not identity.plainly_eager():  # first: a reverse-mode call pays one read
        return None
    if not (all(_plain(x, x) and x.dtype in _DTYPES and _forward_mode_alone(x) for x in xs)
            and all(_stands_alone(y) for y in ys)):
        return None
    if not identity.all_finite(*xs):
        return None
    products = transposed(*[torch.zeros_like(x) for x in xs])  # J·v at v = +0.0, the ordinary ops' value
    if len(products) != len(ys) or not all(_plain(p, y) for p, y in zip(products, ys, strict=True)):
        return None
    if not identity.all_finite(*products):
        return None
    tangents = [forward_ad.unpack_dual(x).tangent.mul(-1.0) for x in xs]  # type: ignore[no-untyped-call]
    return [forward_ad.make_dual(torch.sub(y, 0.0), t.add(0.0).mul_(-1.0))  # type: ignore[no-untyped-call]
            for y, t in zip(ys, transposed(*tangents), strict=True)]


class _DualOfMap(torch.autograd.Function):
    """The decorator's outputs under torch.func's forward-mode transforms: each y − 0.0, with the tangent its
    ordinary ops give (``dual_of_map``): −1·((J·(−1·ẋ)) + 0) at order 1 (``linked``: its zero term's +0.0 link), and
    −1·(J·(−1·ẋ)) at order 2, or ẏ minus that sum or product where y carries a tangent of its own (f read another
    input of the transform). It serves forward mode alone: it is taken where no reverse-mode transform or tensor
    requiring grad can differentiate it."""

    generate_vmap_rule = True  # its forward is one op of its inputs; jacfwd and vmap batch it and its jvp

    @staticmethod
    def forward(transposed: Any, count: int, linked: bool, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.sub(y, 0.0) for y in tensors[:count])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.set_materialize_grads(False)  # (a y without a tangent gets None, not zeros: its own sign of zero)
        ctx.transposed, ctx.count, ctx.linked = inputs[0], inputs[1], inputs[2]

    @staticmethod
    def backward(ctx: Any, *cotangents: Any) -> Any:
        raise RuntimeError("stopgrad_math: the forward-mode fast path was differentiated in reverse mode")

    @staticmethod
    def jvp(ctx: Any, _transposed: Any, _count: Any, _linked: Any,
            *tangents: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        y_tangents, x_tangents = tangents[:ctx.count], tangents[ctx.count:]
        moved = [t.mul(-1.0) for t in x_tangents if t is not None]
        if len(moved) != len(x_tangents):  # (never: ``_in_forward_transforms`` asks that each x has one)
            raise RuntimeError("stopgrad_math: an x of the forward-mode fast path has no tangent")
        terms = [p.add(0.0) if ctx.linked else p for p in ctx.transposed(*moved)]
        return tuple(term.mul(-1.0) if t is None else torch.sub(t, term)
                     for t, term in zip(y_tangents, terms, strict=True))


@dataclasses.dataclass(frozen=True)
class _Times:
    """J·v = v·c for one v (the one ``mul`` of a ``product_factor`` graph; with c finite, in either order)."""

    c: torch.Tensor | float

    def __call__(self, v: torch.Tensor) -> list[torch.Tensor]:
        return [torch.mul(v, self.c)]


def _moves(t: torch.Tensor) -> bool:
    """Whether the tensor torch.func's wrappers of t hold requires grad: a derivative w.r.t. it may be taken."""
    return identity.unwrapped(t).requires_grad


def _fixed_tangents(xs: Sequence[torch.Tensor]) -> bool:
    """Whether each x has a tangent at the forward-mode level, none of which a derivative may be taken w.r.t. (a
    tangent requiring grad given to func.jvp): the ordinary ops' tangent is then the whole derivative."""
    tangents = [forward_ad.unpack_dual(x).tangent for x in xs]  # type: ignore[no-untyped-call]
    return all(t is not None and not _moves(t) for t in tangents)


def forward_transforms_alone(xs: Sequence[torch.Tensor] = ()) -> bool:
    """One torch.func jvp transform, with vmaps around or inside it, no grad or vjp transform, and none of ``xs``
    requiring grad (under the wrappers): what is computed now gets one derivative, in forward mode."""
    if forward_ad._current_level != 0:  # (a jvp transform's own forward-mode level is 0; none: -1)
        return False
    kinds = [interpreter.key() for interpreter in retrieve_all_functorch_interpreters()]
    return (kinds.count(TransformType.Jvp) == 1 and all(k in (TransformType.Jvp, TransformType.Vmap) for k in kinds)
            and not any(_moves(x) for x in xs))


def reverse_transforms_alone(xs: Sequence[torch.Tensor] = ()) -> bool:
    """One torch.func grad or vjp transform, with vmaps around or inside it, no jvp transform or forward-mode level,
    and none of ``xs`` requiring grad under the wrappers: what is computed now gets one derivative, in reverse
    mode, which nothing differentiates again."""
    if forward_ad._current_level >= 0 or not torch._C._are_functorch_transforms_active():  # (the common eager call:
        return False  # no interpreter stack to read)
    kinds = [interpreter.key() for interpreter in retrieve_all_functorch_interpreters()]
    return (kinds.count(TransformType.Grad) == 1 and all(k in (TransformType.Grad, TransformType.Vmap) for k in kinds)
            and not any(_moves(x) for x in xs))


def _in_forward_transforms(ys: Sequence[torch.Tensor], xs: Sequence[torch.Tensor],
                           transposed: Callable[..., list[torch.Tensor]],
                           factor: Callable[[torch.Tensor], torch.Tensor | float] | None,
                           linked: bool) -> list[torch.Tensor] | None:
    """``dual_of_map`` under torch.func's forward-mode transforms alone: where J·v at v = +0.0 is finite (asked of
    the values the transforms' wrappers hold), the ``_DualOfMap`` of ys; None where the ordinary ops must run.
    Where J·v is v·c, c a finite number or a tensor of x's shape and dtype, c is computed once, and J·v at +0.0 is
    finite exactly where c is (0·inf and 0·NaN are NaN)."""
    if not (forward_transforms_alone((*xs, *ys)) and all(type(t) is torch.Tensor and t.dtype in _DTYPES
                                                         for t in (*xs, *ys))):
        return None
    # (an x with no tangent, an argument jacfwd does not differentiate: the ordinary ops. x need not be finite:
    # where it is not, their carrier passes its tangent as the plain ops do, and v is +0.0 either way)
    if not _fixed_tangents(xs):
        return None
    if not linked:  # (order 2: the ordinary ops' jvp applies the same graph to the same tangents, at any values)
        return list(_DualOfMap.apply(transposed, len(ys), False, *ys, *xs))  # type: ignore[no-untyped-call]
    if factor is not None and len(xs) == len(ys) == 1 and _plain(ys[0], xs[0]):
        c = factor(xs[0])
        if (isinstance(c, float) and math.isfinite(c)) or (
                isinstance(c, torch.Tensor) and _plain(c, xs[0]) and identity.eagerly_finite(c)):
            return list(_DualOfMap.apply(_Times(c), 1, True, *ys, *xs))  # type: ignore[no-untyped-call]
    products = transposed(*[torch.zeros_like(x) for x in xs])  # J·v at v = +0.0
    if len(products) != len(ys) or not all(identity.eagerly_finite(p) and p.shape == y.shape and p.dtype == y.dtype
                                           for p, y in zip(products, ys, strict=True)):
        return None
    return list(_DualOfMap.apply(transposed, len(ys), True, *ys, *xs))  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------- the decorator's J·v, in reverse mode alone
#
# Where the proven transpose is one product p = v·c, c made of the constants alone (the VJP ct ↦ ct·c of an
# elementwise derivative, the commonest one), the ordinary ops h = y − (p − stop(p)), v = stop(x) − x, with an
# alias of x whose hook guards second derivatives (``second_derivative_guard.hooked``), are differentiated by
# PyTorch, where x and c are finite, to
#
#     x̄ = −((−h̄)·c)
#
# for a cotangent h̄ of h (a sub passes its subtrahend −h̄, a product multiplies the cotangent by the other operand,
# cotangent first); y's cotangent is h̄ itself. The value is y − 0.0. One Function node runs those two passes, and
# the guard's check in its backward, where the ordinary ops made five nodes and a Python hook. The two negations
# stay: h̄·c alone differs where c is ±0 and h̄ ±inf, in the sign of the NaN that 0·inf makes.


def product_factor(graph: torch.fx.GraphModule, live: int) -> torch.fx.GraphModule | None:
    """Where ``graph`` (one input v, then constants) returns one ``mul`` of v by a tensor made of the constants
    alone or by a number, the graph of that factor (taking the same inputs); None otherwise."""
    if live != 1:
        return None
    nodes = list(graph.graph.nodes)
    v = next((n for n in nodes if n.op == "placeholder"), None)
    output = nodes[-1] if nodes else None
    if v is None or output is None or output.op != "output":
        return None
    results = pytree.tree_leaves(output.args[0])
    if len(results) != 1 or not isinstance(results[0], torch.fx.Node):
        return None
    product = results[0]
    if product.op != "call_function" or product.target is not _aten.mul.Tensor or product.kwargs \
            or len(product.args) != 2 or sum(a is v for a in product.args) != 1:
        return None
    factor = product.args[1] if product.args[0] is v else product.args[0]
    constant_node = isinstance(factor, torch.fx.Node) and not aten_graphs.reaches_any(factor, {v})
    if not (constant_node or type(factor) in (int, float)):
        return None
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    made = torch.fx.Graph()
    made.graph_copy(graph.graph, copied)
    made.output(copied[factor] if isinstance(factor, torch.fx.Node) else factor)
    made.eliminate_dead_code()
    return torch.fx.GraphModule(graph, made)


class _ProductOfMap(torch.autograd.Function):
    """y with derivative c·(−1)·(−1) w.r.t. x, as the decorator's ordinary ops differentiate it for finite x and c;
    see the comment above."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, x: torch.Tensor, c: torch.Tensor | float, live: list[torch.Tensor],
                name: str) -> torch.Tensor:
        del x  # an input for its gradient alone
        ctx.set_materialize_grads(False)
        if isinstance(c, torch.Tensor):  # as the ordinary ops' product saves it: an in-place change of it raises
            ctx.save_for_backward(c)
        # (not ctx.name: that is the node's own method, which anomaly mode calls when a backward raises)
        ctx.number, ctx.live, ctx.decorated = None if isinstance(c, torch.Tensor) else c, live, name
        return torch.sub(y, 0.0)

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if cotangent is None:
            return None, None, None, None, None
        c = ctx.saved_tensors[0] if ctx.number is None else ctx.number  # a number as the product has it
        gradient = second_derivative_guard.guarded(torch.mul(cotangent.neg(), c).neg(), ctx.live, ctx.decorated)
        return cotangent, gradient, None, None, None


def product_of_map(y: torch.Tensor, x: torch.Tensor, factor: Callable[..., Any], constants: list[torch.Tensor],
                   stopped: list[torch.Tensor], name: str) -> torch.Tensor | None:
    """The decorator's output y with derivative J w.r.t. x in reverse mode alone at order 1, J·v being v times
    ``factor``'s tensor (``product_factor``) of the ``constants``, as its ordinary ops with the guard on x give it
    (``stopped``: the tensors the VJP closes over, which the guard watches too); None where those must run."""
    if forward_ad._current_level >= 0 or not (torch.is_grad_enabled() and x.requires_grad):
        return None
    if not (_plain(x, x) and x.dtype in _DTYPES and x.is_contiguous() and _plain(y, x)
            and identity.plainly_eager() and not torch.is_autocast_enabled(x.device.type)):
        return None
    c = factor(x, *constants)  # (its first input, v, unread)
    finite = (_plain(c, x) and identity.all_finite(x, c)) if isinstance(c, torch.Tensor) \
        else (math.isfinite(c) and identity.all_finite(x))
    if not finite:
        return None
    live = second_derivative_guard.live_of(x, stopped)
    result: torch.Tensor = _ProductOfMap.apply(y, x, c, live, name)  # type: ignore[no-untyped-call]
    return result
