"""Which ATen ops are linear in which arguments: the table that proves a VJP linear from its FX graph.

The decorator embeds a VJP as the linear map it is the transpose of, which
is exact only where the VJP is linear in the cotangent: an additive constant
(``2·ct + 1``) or a clip would be lost, or moved. So the VJP is traced into a
graph of ATen ops (``make_fx`` of the functionalized VJP, in which every
placeholder is a cotangent and every ``get_attr`` a constant it closes over),
and every node gets a state of ``shared.linearity`` in one pass:

  a node none of whose inputs carries the cotangent is CONST (ZERO where
  it creates zeros, or views or casts zeros); one that reads a Finding
  passes it on; any other is judged by its row of ``RULES``.

An op not in the table is never assumed linear. ``judge`` returns each
output's state: the VJP is linear where every output is LINEAR or ZERO.
A rule reads an op's arguments in its schema's order, each as the list of
the states of the values in it (one for a tensor or number, one per element
for a list of tensors, none for None); a Python number is ZERO where it is
0, else CONST.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar

from torch import fx

from stopgrad_math.shared.linearity import AFFINE, Finding, Judged, State

_P = ParamSpec("_P")
_R = TypeVar("_R")
Operands = list[list[Judged]]  # per schema argument, the states of the values in it
_Rule = Callable[[str, Operands, dict[str, Any]], Judged]


def _carries(states: Iterable[Judged]) -> bool:
    return any(s is State.LINEAR for s in states)


# ---------------------------------------------------------------- rules: (op, operands, literal arguments) → state
# A rule is asked only where some operand is LINEAR and none is a Finding.


def _sum_of_terms(op: str, states: Sequence[Judged]) -> Judged:
    """add, sub, cat, a scatter's operand and source...: linear where every term is linear or zero."""
    if any(s is State.CONST for s in states):
        return Finding(op, AFFINE)
    return State.LINEAR


def _linear_in(linear: Sequence[int], why: str = "the cotangent is used as an index, a condition or a shape",
               zero: Sequence[int] = ()) -> _Rule:
    """Linear in the arguments at ``linear`` jointly (each linear or zero); every other argument must not carry
    the cotangent, and those at ``zero`` (a fill value) must be zero."""

    def rule(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
        del literals
        if any(_carries(states) for k, states in enumerate(operands) if k not in linear):
            return Finding(op, why)
        if any(s is State.CONST for k in zero if k < len(operands) for s in operands[k]):
            return Finding(op, "fills with a value that is not zero: affine")
        return _sum_of_terms(op, [s for k in linear if k < len(operands) for s in operands[k]])

    return rule


def _one_side(sides: tuple[int, int] = (0, 1), added: Sequence[int] = ()) -> _Rule:
    """mul, mm, convolution...: linear where exactly one of the two ``sides`` carries the cotangent; the terms
    at ``added`` (addmm's input, a convolution's bias) are then summed with the product."""

    def rule(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
        del literals
        left, right = (operands[k] if k < len(operands) else [] for k in sides)
        if _carries(left) and _carries(right):
            return Finding(op, "multiplies the cotangent by itself: quadratic")
        if any(_carries(states) for k, states in enumerate(operands) if k not in (*sides, *added)):
            return Finding(op, "the cotangent is used as a scale factor or a shape")
        product = State.ZERO if State.ZERO in (*left, *right) else (
            State.LINEAR if _carries(left) or _carries(right) else State.CONST)
        terms = [s for k in added if k < len(operands) for s in operands[k]]
        if product is State.ZERO and not _carries(terms):
            return State.ZERO
        return _sum_of_terms(op, [product, *terms] if product is not State.ZERO else terms)

    return rule


def _solve_by(matrix: int) -> _Rule:
    """A solve with the matrix at argument ``matrix``: linear in the right-hand side where the matrix carries no
    cotangent."""
    def rule(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
        return Finding(op, "solves against the cotangent") if _carries(operands[matrix]) else State.LINEAR
    return rule


def _division(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
    if _carries(operands[1]):
        return Finding(op, "divides by the cotangent")
    if literals.get("rounding_mode") is not None:
        return Finding(op, f"rounds the quotient ({literals['rounding_mode']})")
    return State.LINEAR


def _cast(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
    dtype = literals.get("dtype")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        return Finding(op, f"rounds the cotangent to {dtype}")
    return _linear_in((0,))(op, operands, literals)


def _copy(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
    """copy(self, src): src's values in self's place (functionalization writes ``x[i] = u`` so)."""
    del literals
    return State.LINEAR if _carries(operands[1]) else Finding(op, "writes a constant over the cotangent")


def _fill(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
    """fill(self, value): value in self's shape, self's values unread (functionalization writes ``g[i] = v`` so)."""
    del op, literals
    if _carries(operands[1]):
        return State.LINEAR
    return State.ZERO if operands[1] == [State.ZERO] else State.CONST


def _einsum(op: str, operands: Operands, literals: dict[str, Any]) -> Judged:
    """einsum(equation, tensors): a product of its tensors, linear where one carries the cotangent."""
    del literals
    if sum(s is State.LINEAR for s in operands[1]) > 1:
        return Finding(op, "multiplies the cotangent by itself: quadratic")
    return State.ZERO if State.ZERO in operands[1] else State.LINEAR


def _refused(why: str) -> _Rule:
    return lambda op, operands, literals: Finding(op, why)


_CLIPS = "clips or rectifies the cotangent (clamp, relu, max, min)"
_POWERS = "a non-linear function of the cotangent (powers, roots, norms, exp, log, abs, sign)"
_COMPARES = "compares the cotangent: a branch chosen by its values"

_VIEWS = (  # linear in their first argument; ZERO stays ZERO through them
    "alias", "clone", "contiguous", "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
    "squeeze", "unsqueeze", "select", "slice", "narrow", "diagonal", "movedim", "unfold", "split",
    "split_with_sizes", "unbind", "chunk", "tensor_split", "flip", "roll", "repeat", "real", "imag",
    "view_as_real", "view_as_complex", "conj", "_conj", "conj_physical", "resolve_conj", "resolve_neg",
    "_neg_view", "alias_copy", "view_copy", "expand_copy", "permute_copy", "transpose_copy", "t_copy",
    "squeeze_copy", "unsqueeze_copy", "select_copy", "slice_copy", "diagonal_copy", "unbind_copy",
    "split_copy", "split_with_sizes_copy", "lift_fresh_copy",
    # detach (and .data): in a backward, which runs without grad mode, a no-op on the value; the map is the VJP's
    # values, so on the cotangent's path it is the identity (``Traced.linear``). detach_copy: a stop's marker
    # (``_StopsRecorded``), whose value is unused
    "detach", "detach_copy",
)
_CASTS = ("_to_copy", "to")

_PRODUCTS: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = {  # the two factors' arguments, and terms added
    **dict.fromkeys(("mul", "mm", "bmm", "mv", "dot", "vdot", "matmul", "outer", "kron"), ((0, 1), ())),
    **dict.fromkeys(("addmm", "addmv", "baddbmm", "addbmm", "addcmul"), ((1, 2), (0,))),
    "convolution": ((0, 1), (2,)),
}

# The backward ops of PyTorch's standard layers: each computes the chain rule's product of its first argument, the
# upstream gradient, by a Jacobian made of the other arguments (the saved input or output, indices, statistics,
# weights, a dropout mask), so each is linear in that first argument where no other carries the cotangent (a
# recomputed block's backward, as checkpointing writes it). None branches on, clips or scales by the upstream's
# own values: threshold_backward (ReLU) and hardtanh_backward select by the saved input, max pools route by saved
# indices, the norms' backward is linear in the upstream given the saved mean and inverse deviation.
LAYER_BACKWARDS = (
    "native_layer_norm_backward", "native_batch_norm_backward", "native_group_norm_backward",
    "_fused_rms_norm_backward", "convolution_backward", "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices_backward", "avg_pool2d_backward", "avg_pool3d_backward",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
    "adaptive_max_pool3d_backward", "threshold_backward", "gelu_backward", "silu_backward", "elu_backward",
    "leaky_relu_backward", "hardtanh_backward", "tanh_backward", "sigmoid_backward", "softplus_backward",
    "hardswish_backward", "hardsigmoid_backward", "mish_backward", "log_sigmoid_backward", "glu_backward",
    "softshrink_backward", "hardshrink_backward", "_prelu_kernel_backward", "_softmax_backward_data",
    "_log_softmax_backward_data", "embedding_dense_backward", "native_dropout_backward",
    "upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward",
    "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward", "_upsample_nearest_exact3d_backward",
    "upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
    "upsample_trilinear3d_backward", "reflection_pad1d_backward", "reflection_pad2d_backward",
    "reflection_pad3d_backward", "replication_pad1d_backward", "replication_pad2d_backward",
    "replication_pad3d_backward", "select_backward", "slice_backward", "diagonal_backward", "unfold_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "mse_loss_backward", "nll_loss_backward", "nll_loss2d_backward", "binary_cross_entropy_backward",
    "smooth_l1_loss_backward", "huber_loss_backward",
)

RULES: dict[str, _Rule] = {
    **{name: _linear_in((0,)) for name in (
        *_VIEWS, "neg", "sum", "mean", "cumsum", "index", "index_select", "gather", "take", "diag", "diag_embed",
        "tril", "triu", "_fft_r2c", "_fft_c2c", "_fft_c2r", "sum_to_size", "im2col", "col2im",
    )},
    **{name: _linear_in((0,), "the upstream gradient is used as a saved activation, an index or a statistic")
       for name in LAYER_BACKWARDS},
    **{name: _cast for name in _CASTS},
    "constant_pad_nd": _linear_in((0,), zero=(2,)),
    # (a scatter's output is self where the view is not, src where it is: chosen by position alone)
    **{name: _linear_in((0, 1)) for name in ("add", "sub", "rsub", "complex", "slice_scatter", "select_scatter",
                                            "diagonal_scatter", "as_strided_scatter")},
    **{name: _linear_in((0,)) for name in ("cat", "stack")},  # one argument: the list of tensors
    "where": _linear_in((1, 2), "chooses by the cotangent's values"),
    "masked_fill": _linear_in((0, 2), "chooses by the cotangent's values"),
    **{name: _linear_in((0, 3), "indexes by the cotangent's values") for name in ("scatter", "scatter_add",
                                                                                  "index_add")},
    "index_put": _linear_in((0, 2), "indexes by the cotangent's values"),
    "copy": _copy,
    "fill": _fill,
    **{name: _one_side(sides, added) for name, (sides, added) in _PRODUCTS.items()},
    "einsum": _einsum,
    "div": _division,
    "linalg_solve_triangular": _solve_by(0),
    "triangular_solve": _solve_by(1),  # (b, A): linear in b
    # (A, B): x = A⁻¹B, an implicit gradient's adjoint solve; its other results (LU, pivots, info) are the matrix's
    # alone (``_RESULT_OF_THE_RIGHT_HAND_SIDE``)
    "linalg_solve": _solve_by(0),
    "_linalg_solve_ex": _solve_by(0),
    **{name: _refused(_CLIPS) for name in (
        "clamp", "clamp_min", "clamp_max", "clip", "relu", "hardtanh", "leaky_relu", "maximum", "minimum", "max",
        "min", "amax", "amin", "fmax", "fmin", "nan_to_num")},
    **{name: _refused(_COMPARES) for name in (
        "gt", "ge", "lt", "le", "eq", "ne", "isfinite", "isnan", "isinf", "logical_not", "logical_and",
        "logical_or", "argmax", "argmin", "sort", "topk")},
    **{name: _refused(_POWERS) for name in (
        "abs", "sign", "sgn", "pow", "square", "sqrt", "rsqrt", "reciprocal", "exp", "log", "log1p", "expm1",
        "tanh", "sigmoid", "softplus", "norm", "linalg_vector_norm", "linalg_norm", "frobenius_norm", "prod",
        "cumprod", "logsumexp", "_softmax", "_log_softmax", "round", "floor", "ceil", "trunc", "frac")},
}

# Ops with several results of which one alone is linear in the cotangent, by index: the others are CONST.
_RESULT_OF_THE_RIGHT_HAND_SIDE = {"_linalg_solve_ex": 0}

# Ops that make zeros: ZERO where their fill is 0. Those that read a tensor's dtype, shape and device alone (``like``
# and ``new_``) do not depend on its values, the cotangent's included: they are constants, zeros where they fill 0.
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})
_FILLS = {"full": 1, "full_like": 1, "new_full": 2, "fill": 1, "scalar_tensor": 0}  # the fill's argument
_METADATA = frozenset({"zeros_like", "new_zeros", "ones_like", "new_ones", "full_like", "new_full", "empty_like",
                       "new_empty", "rand_like", "randn_like"})


# ---------------------------------------------------------------- the walk


def op_name(target: Any) -> str:
    packet = getattr(target, "_overloadpacket", None)
    return str(getattr(packet, "__name__", getattr(target, "__name__", target)))


def _literal_state(value: Any) -> Judged:
    if isinstance(value, (bool, int, float, complex)) and not isinstance(value, bool) and value == 0:
        return State.ZERO
    return State.CONST


@dataclasses.dataclass
class _Walk:
    """The states of one graph's nodes, every placeholder a cotangent."""

    states: dict[fx.Node, Judged] = dataclasses.field(default_factory=dict)

    def states_in(self, value: Any) -> list[Judged]:
        if isinstance(value, fx.Node):
            return [self.states.get(value, State.CONST)]
        if isinstance(value, (list, tuple)):
            return [s for v in value for s in self.states_in(v)]
        if value is None or not isinstance(value, (int, float, complex)):
            return []
        return [_literal_state(value)]

    def node(self, node: fx.Node) -> Judged:
        if node.op == "placeholder":
            return State.LINEAR
        if node.op != "call_function":  # get_attr: a tensor the VJP closes over
            return State.CONST
        if node.target is operator.getitem:
            state = self.states_in(node.args[0])[0]
            source = node.args[0]
            linear = _RESULT_OF_THE_RIGHT_HAND_SIDE.get(op_name(source.target)) if isinstance(source, fx.Node) else None
            if linear is not None and node.args[1] != linear and not isinstance(state, Finding):
                return State.CONST  # (a factor of the matrix alone, which no cotangent reaches)
            return state
        arguments, literals = _arguments(node)
        operands = [self.states_in(value) for value in arguments]
        flat = [s for states in operands for s in states]
        found = next((s for s in flat if isinstance(s, Finding)), None)
        name = op_name(node.target)
        if found is not None:
            return found
        if not _carries(flat) or name in _METADATA:
            return _constant(name, arguments, operands)
        rule = RULES.get(name)
        if rule is None:
            return Finding(str(node.target), "not in the table of linear ATen ops, so not proven linear",
                           unknown=True)
        return rule(name, operands, literals)


def _constant(name: str, arguments: list[Any], operands: Operands) -> Judged:
    """The state of an op that reads no cotangent: ZERO where it makes zeros, views or casts them, multiplies by
    them (as a product with the cotangent's side zero is zero) or adds them (``v = 0; v = ct + v @ a``)."""
    if name in _ZEROS:
        return State.ZERO
    if name in _PRODUCTS:
        sides, added = _PRODUCTS[name]
        if any(State.ZERO in operands[k] for k in sides if k < len(operands)) and all(
                s is State.ZERO for k in added if k < len(operands) for s in operands[k]):
            return State.ZERO
    if name == "einsum" and State.ZERO in operands[1]:
        return State.ZERO
    if name in ("add", "sub") and all(s is State.ZERO for s in (*operands[0], *operands[1])):
        return State.ZERO
    if name in _FILLS and len(arguments) > _FILLS[name] and _literal_state(arguments[_FILLS[name]]) is State.ZERO:
        return State.ZERO
    if name in (*_VIEWS, *_CASTS, *LAYER_BACKWARDS) and operands and operands[0] == [State.ZERO]:
        return State.ZERO  # (a layer's backward of a zero upstream: an LSTM cell's unused state)
    return State.CONST


def _arguments(node: fx.Node) -> tuple[list[Any], dict[str, Any]]:
    """The node's arguments in its op's schema order (defaults filled in), and those that are not nodes by
    name (dtype, rounding_mode)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [*node.args, *node.kwargs.values()], {}
    values = []
    for k, argument in enumerate(schema.arguments):
        if k < len(node.args):
            values.append(node.args[k])
        elif argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        else:
            values.append(argument.default_value if argument.has_default_value() else None)
    literals = {a.name: v for a, v in zip(schema.arguments, values, strict=True) if not isinstance(v, fx.Node)}
    return values, literals


def walked(graph: fx.Graph, cotangents: int, zeros: frozenset[int] = frozenset()) -> _Walk:
    """Every node's state in a graph whose first ``cotangents`` placeholders are the cotangent; the placeholders at
    ``zeros`` are constants known to be zero, the others (and ``get_attr`` constants) constants."""
    walk = _Walk()
    placeholders = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            walk.states[node] = (State.LINEAR if placeholders < cotangents else
                                 State.ZERO if placeholders in zeros else State.CONST)
            placeholders += 1
        elif node.op != "output":
            walk.states[node] = walk.node(node)
    return walk


def judge(graph: fx.Graph, cotangents: int, zeros: frozenset[int] = frozenset()) -> list[Judged]:
    """The state of each output of a graph whose first ``cotangents`` placeholders are the cotangent (the others,
    and its ``get_attr`` constants, are constants; those at ``zeros`` zero)."""
    walk = walked(graph, cotangents, zeros)
    return walk.states_in(graph.output_node().args[0])
