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

import contextlib
import contextvars
import copy
import dataclasses
import functools
import itertools
import linecache
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, ParamSpec, TypeVar

import torch
from torch import fx
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

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
    "linalg_solve_triangular": lambda op, operands, literals: (
        Finding(op, "solves against the cotangent") if _carries(operands[0]) else State.LINEAR),
    "triangular_solve": lambda op, operands, literals: (  # (b, A): linear in b
        Finding(op, "solves against the cotangent") if _carries(operands[1]) else State.LINEAR),
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

# Ops that make zeros: ZERO where their fill is 0. Those that read a tensor's dtype, shape and device alone (``like``
# and ``new_``) do not depend on its values, the cotangent's included: they are constants, zeros where they fill 0.
_ZEROS = frozenset({"zeros", "zeros_like", "new_zeros"})
_FILLS = {"full": 1, "full_like": 1, "new_full": 2, "fill": 1, "scalar_tensor": 0}  # the fill's argument
_METADATA = frozenset({"zeros_like", "new_zeros", "ones_like", "new_ones", "full_like", "new_full", "empty_like",
                       "new_empty", "rand_like", "randn_like"})


# ---------------------------------------------------------------- the walk


def _name(target: Any) -> str:
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
            return self.states_in(node.args[0])[0]
        arguments, literals = _arguments(node)
        operands = [self.states_in(value) for value in arguments]
        flat = [s for states in operands for s in states]
        found = next((s for s in flat if isinstance(s, Finding)), None)
        name = _name(node.target)
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


def _walked(graph: fx.Graph, cotangents: int, zeros: frozenset[int] = frozenset()) -> _Walk:
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
    walk = _walked(graph, cotangents, zeros)
    return walk.states_in(graph.output_node().args[0])


class _TracingOnThisThread:
    """FX's flag "a symbolic trace is running" (``torch.fx._symbolic_trace._is_fx_tracing_flag``), a global of
    the process before torch 2.14, as true on the thread that traces alone. While the flag is set, PyTorch
    refuses every call of a compiled function ("using FX to symbolically trace a dynamo-optimized function"):
    with it true everywhere, another thread's compiled calls raised while a VJP was traced here."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def __bool__(self) -> bool:
        return threading.get_ident() == self.thread


def make_fx(function: Callable[..., Any], **options: Any) -> Callable[..., fx.GraphModule]:
    """PyTorch's ``make_fx``, its trace run in a copy of the thread's context: each trace enters config patches
    that leave a context variable set in the thread's context for good (``ConfigModule.patch`` makes a new one
    each time, torch 2.13), so a trace at every call, or a proof per new signature, would grow it forever. FX's
    flag of a running trace, which the trace sets and then restores, is true on this thread alone while it runs
    (``_TracingOnThisThread``)."""
    from torch.fx import _symbolic_trace
    from torch.fx.experimental.proxy_tensor import make_fx as make_fx_of_torch

    def on_this_thread(*args: Any) -> Any:
        # (set by this trace, restored by it when it ends; from torch 2.14 a thread's own, and named otherwise)
        if getattr(_symbolic_trace, "_is_fx_tracing_flag", None) is True:
            _symbolic_trace._is_fx_tracing_flag = _TracingOnThisThread()  # type: ignore[assignment]
        return function(*args)

    options.setdefault("decomposition_table", _decompositions())
    trace = make_fx_of_torch(on_this_thread, **options)
    return lambda *args: contextvars.copy_context().run(trace, *args)


@functools.cache
def _decompositions() -> dict[Any, Callable[..., Any]]:
    """PyTorch's own decompositions of the layers' backward ops whose derivative in the upstream it does not
    implement (``derivative for aten::silu_backward is not implemented``), though autograd's formula for their
    forward op reaches none of them: traced as their ATen ops, which have derivatives, a recomputed block's
    backward has its transpose. Every other op is traced as itself."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    # (not hardsigmoid_backward: PyTorch's kernel scales by 1/6 in float32 whatever the dtype, its decomposition
    # in the dtype, so the decomposed backward would not be the VJP the user wrote; it stays refused)
    return get_decompositions([aten.silu_backward, aten.mish_backward, aten.native_group_norm_backward])


@functools.cache
def compiled_decompositions() -> dict[Any, Callable[..., Any]]:
    """``_decompositions``, and elu_backward's, for the graphs a compiled call runs. Compiled, the forward mode of
    elu_backward at a constant input (the stopped x a VJP's graph reads) gives that input's tangent as an
    efficient zero tensor, which has no storage, and AOTAutograd's runtime and Inductor's CPU kernels write into
    it: the process crashes (torch 2.13; pytorch#197086, #197067). Traced as its ATen ops, it makes none that
    reaches a kernel. (Eagerly elu_backward stays itself: its kernel's rounding is the VJP the user wrote.)"""
    from torch._decomp import get_decompositions

    return {**_decompositions(), **get_decompositions([torch.ops.aten.elu_backward])}


_TRACING = threading.RLock()  # make_fx keeps global state (its CURRENT_PATCHER): one trace at a time


@contextlib.contextmanager
def exclusive() -> Any:
    """One thread at a time traces or compiles graphs (nested traces of a decorated call in a VJP are one thread's),
    and what PyTorch keeps of each, never freed, is dropped when the outermost trace ends, so that tracing at
    every call, or a new proof per signature, does not grow memory: the source FX keeps of each module it makes
    (for tracebacks, in ``linecache``), and the entries fake tensors' dispatch cache adds (one per op and
    operands, a Python number among them by value)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.graph_module import _loader

    with _TRACING, _anomaly_mode_off():
        outermost = _depth.value == 0
        before = set(_loader.eval_cache) if outermost else set()
        dispatched = len(FakeTensorMode.cache) if outermost else 0
        _depth.value += 1
        try:
            yield
        finally:
            _depth.value -= 1
            if outermost:
                for key in set(_loader.eval_cache) - before:
                    _loader.eval_cache.pop(key, None)
                    linecache.cache.pop(key, None)
                # (a dict keeps its order: the entries added since, some perhaps a compiling thread's, a cache's)
                for key in list(itertools.islice(FakeTensorMode.cache, dispatched, None)):
                    FakeTensorMode.cache.pop(key, None)


@contextlib.contextmanager
def _anomaly_mode_off() -> Any:
    """Anomaly mode off while a trace runs, where it is on (``torch.autograd.set_detect_anomaly``, a setting of the
    process): its check for NaN in each gradient the autograd engine computes (a pullback traced by make_fx)
    asks a fake tensor's value, which fails the trace, so in anomaly mode no new VJP could be proven."""
    if not torch.is_anomaly_enabled():
        yield
        return
    checks_nan = torch.is_anomaly_check_nan_enabled()
    torch.autograd.set_detect_anomaly(False)
    try:
        yield
    finally:
        torch.autograd.set_detect_anomaly(True, check_nan=checks_nan)


class _Depth(threading.local):
    value = 0


_depth = _Depth()


def _exclusively(function: Callable[_P, _R]) -> Callable[_P, _R]:
    @functools.wraps(function)
    def called(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with exclusive():
            return function(*args, **kwargs)
    return called


@dataclasses.dataclass(frozen=True)
class Traced:
    """A function as a functional graph of ATen ops of its arguments and then of ``constants``, the tensors it
    closes over (in the order of the graph's placeholders after the arguments); the first ``arguments``
    placeholders are the cotangent, and the placeholders at ``zeros`` are literal zeros made inside it."""

    graph: fx.GraphModule
    constants: list[torch.Tensor]
    arguments: int
    zeros: frozenset[int] = frozenset()
    recorded: tuple[str, ...] = ()  # the ops as the function ran them, before functionalization, detach aside
    literals: frozenset[int] = frozenset()  # the constants (by index) made inside from numbers, not closed over

    def states(self) -> list[Judged]:
        """The state of each output (``judge``)."""
        return judge(self.graph.graph, self.arguments, self.zeros)

    def __call__(self, *arguments: torch.Tensor) -> Any:
        return self.graph(*arguments, *self.constants)

    def linear(self, constants: list[torch.Tensor], outputs: list[int]) -> Callable[..., list[torch.Tensor]]:
        """The map the graph computes, as ordinary differentiable ops of its cotangents: the outputs at ``outputs``,
        with ``constants`` in place of the traced ones (stopped, or live for a second derivative).

        The graph was traced as a backward runs, so what stops a derivative there (``detach``, ``.data``) is a
        no-op on the cotangent's values, and so it is here: on the cotangent's path it is an alias. Elsewhere (a
        constant the VJP detaches) it stays a stop."""
        return LinearMap(_differentiable(self), constants, outputs)


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """A VJP's map as a graph run on the cotangents and then ``constants`` (the tensors it closes over): the
    results at ``outputs`` (all of them where None)."""

    run: Callable[..., Sequence[torch.Tensor]]
    constants: list[torch.Tensor]
    outputs: list[int] | None = None

    def __call__(self, *cotangents: torch.Tensor) -> list[torch.Tensor]:
        values = self.run(*cotangents, *self.constants)
        return list(values) if self.outputs is None else [values[k] for k in self.outputs]

    def on(self, constants: list[torch.Tensor]) -> LinearMap:
        """The same map with other tensors for the constants (the same tensors as inputs of a Function)."""
        return dataclasses.replace(self, constants=constants)


_STOPS = ("detach", "detach_copy")


def _stopped(tensor: torch.Tensor) -> torch.Tensor:
    """A stop, as a graph that is run (and differentiated) calls it: ``detach`` in Python, which autograd and
    torch.func take for a stop whatever a later trace records it as."""
    return tensor.detach()


class _StopsRecorded(TorchFunctionMode):
    """While a function is traced: each ``detach()`` and ``.data`` runs as it is (a view, which a write through
    it reaches), followed by a ``detach_copy`` of its result whose value is unused: a marker that every version
    of make_fx records as itself. From torch 2.14 make_fx records ``detach`` as ``alias``, which a graph run later
    takes for the identity, so a stop written in a VJP would pass a second derivative; the marker names it."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.detach or getattr(func, "__self__", None) is _DATA:  # (.data's getter is made
            torch.ops.aten.detach_copy.default(result)                             # anew at each read)
        return result


_DATA = torch._C.TensorBase.__dict__["data"]


def stops_recorded(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with ``_StopsRecorded`` on while it runs (not while make_fx does its own work around it)."""

    @functools.wraps(function)
    def recording(*args: Any) -> Any:
        with _StopsRecorded():
            return function(*args)

    return recording


def _markers(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and _name(n.target) == "detach_copy" and not n.users
            and isinstance(n.args[0], fx.Node)]


def _stops(graph: fx.Graph) -> list[fx.Node]:
    """The nodes that stop a derivative where the function was written: each ``detach`` node, and each node a
    ``_StopsRecorded`` marker names (on torch 2.14, an ``alias``)."""
    marked = [n.args[0] for n in _markers(graph)]
    return list(dict.fromkeys([*(n for n in graph.nodes if _name(n.target) == "detach"), *marked]))


def runnable(module: fx.GraphModule, aliases: Iterable[str] = ()) -> fx.GraphModule:
    """A graph traced with ``stops_recorded``, to run, in place: each marked stop a ``_stopped`` (but those named
    in ``aliases``, the identity), its markers dropped."""
    markers = _markers(module.graph)
    keep = set(aliases)
    for node in dict.fromkeys(n.args[0] for n in markers):
        if isinstance(node, fx.Node) and node.name not in keep and _name(node.target) != "detach":
            node.target, node.args, node.kwargs = _stopped, (node.args[0],), {}
    for marker in markers:
        module.graph.erase_node(marker)
    module.recompile()
    return module


def _cotangent_stops(traced: Traced) -> list[fx.Node]:
    """The stops (``detach``, ``.data``) on the cotangent's path (of a cotangent or of what is computed from it)."""
    nodes = _stops(traced.graph.graph)
    if not nodes:
        return []
    walk = _walked(traced.graph.graph, traced.arguments, traced.zeros)
    return [n for n in nodes if walk.states_in(n.args[0]) != [State.CONST]]


def _copied(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Functional ``copy(self, src)`` (src's values in self's shape, dtype and device) in ops autograd can
    differentiate, which it cannot ``copy``."""
    return src.to(dtype=self.dtype, device=self.device).expand(self.shape).clone()


@_exclusively
def _differentiable(traced: Traced) -> fx.GraphModule:
    """The traced graph as ops autograd and torch.func differentiate as the map: a stop on the cotangent's path an
    alias (a no-op in the backward it was traced as), any other a ``_stopped``; ``copy`` written as ``_copied``."""
    stops = _cotangent_stops(traced)
    copies = [n for n in traced.graph.graph.nodes if _name(n.target) == "copy"]
    if not stops and not copies and not _markers(traced.graph.graph):
        return traced.graph
    module = copy.deepcopy(traced.graph)
    by_name = {n.name: n for n in module.graph.nodes}
    for node in stops:
        by_name[node.name].target = torch.ops.aten.alias.default
    for node in copies:
        by_name[node.name].target = _copied
    return runnable(module, aliases=[n.name for n in stops])


def unreadable(cotangents: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Fake tensors of the cotangents' shapes, with no fake mode active: an op on them is fake, and a read of
    their values raises; an op on the real tensors a function closes over runs as it is, and they may be read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    stand_in = FakeTensorMode(allow_non_fake_inputs=True).from_tensor
    return [stand_in(ct) for ct in cotangents]


@_exclusively
def trace(function: Callable[..., Any], *examples: torch.Tensor, cotangents: int | None = None,
          fake: bool = False) -> Traced:
    """function traced on ``examples`` into a functional graph of ATen ops (no in-place op: ``g[i] = u`` is a
    scatter), the tensors it closes over lifted to inputs. ``cotangents``: how many of the examples, first, are
    the cotangent (by default all; the others are constants).

    It runs as PyTorch runs a ``backward``: without grad mode (and forward mode), on cotangents that do not
    require grad, so a VJP under ``no_grad`` or ``@once_differentiable``, or one that branches on grad mode,
    is traced as the map a Function's backward would apply. The cotangents are fake tensors of their shapes, so
    reading their values in Python (``item``, ``float``, ``bool``, ``tolist``, ``numpy``, a branch) raises rather
    than choosing a branch for zeros. ``fake``: every example and every tensor the function computes is fake, so
    a read of any value raises; otherwise the tensors the function closes over are real, and it may read those.

    Two traces: the first records the ops as they run, with the closed-over tensors as constants; those become
    placeholders, and the second trace functionalizes that graph, which PyTorch can do only where every tensor
    is an input (writing into a copy of a closed-over tensor is then a scatter too)."""
    count = len(examples) if cotangents is None else cotangents
    mode: Literal["real", "fake"] = "fake" if fake else "real"
    with torch.no_grad(), torch.autograd.forward_ad._set_fwd_grad_enabled(False):
        if fake:
            recorded = make_fx(stops_recorded(function), tracing_mode="fake", _allow_non_fake_inputs=True,
                               _error_on_data_dependent_ops=True)(*examples)
        else:
            recorded = make_fx(stops_recorded(function), _error_on_data_dependent_ops=False)(
                *unreadable(examples[:count]), *examples[count:])
        constants, zeros, literals = _lifted(recorded)
        functional = make_fx(torch.func.functionalize(recorded), tracing_mode=mode, _allow_non_fake_inputs=fake,
                             _error_on_data_dependent_ops=False)(*examples, *constants)
    _drop_writes_into_inputs(functional)
    return Traced(functional, constants, count, frozenset(len(examples) + k for k in zeros), _ops(recorded),
                  frozenset(literals))


_MASKED_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put",
                               "_unsafe_index", "masked_select", "nonzero", "masked_scatter"})


def boolean_mask_op(module: fx.GraphModule, batched: set[int]) -> str | None:
    """The first op of the graph that indexes with a boolean mask computed from a batched input (the placeholders
    at ``batched``, by position): ``g[mask] = 0``, ``g[mask]``, ``nonzero``, ``masked_select``, whose batched form
    has a shape that depends on values, which vmap cannot batch (a mask of an unbatched input it can)."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    sources = {placeholders[k] for k in batched if k < len(placeholders)}
    for node in module.graph.nodes:
        name = _name(node.target).split(".")[0] if node.op == "call_function" else ""
        if name not in _MASKED_INDEXING:
            continue
        masks = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)
                 and (name in ("nonzero", "masked_select", "masked_scatter") or _is_bool(a))]
        if any(reaches_any(mask, sources) for mask in masks):
            return name
    return None


def _is_bool(node: fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def reaches_any(node: fx.Node, sources: set[fx.Node]) -> bool:
    """Whether the node is one of ``sources`` or is computed from one."""
    seen, pending = set(), [node]
    while pending:
        current = pending.pop()
        if current in sources:
            return True
        if current not in seen:
            seen.add(current)
            pending += [a for a in pytree.tree_leaves((current.args, current.kwargs)) if isinstance(a, fx.Node)]
    return False


def _ops(module: fx.GraphModule) -> tuple[str, ...]:
    """The ops a graph calls, in order, stops and aliases aside (autograd detaches what it saves for backward,
    which torch 2.14 records as alias)."""
    return tuple(name for n in module.graph.nodes
                 if n.op == "call_function" and (name := _name(n.target)) not in (*_STOPS, "alias"))


@_exclusively
def differentiated_as_traced(function: Callable[..., Any], *examples: torch.Tensor, traced: Traced) -> bool:
    """Whether autodiff of ``function`` w.r.t. its cotangents (the first ``traced.arguments`` examples, all fake)
    is the map ``traced`` holds, which was traced as a backward runs: traced again with grad mode on and the
    cotangents requiring grad, it must record the same graph (no branch on grad mode), every output the map
    makes linear must require grad (nothing computed under ``no_grad``, ``set_grad_enabled(False)``,
    ``inference_mode`` or ``@once_differentiable``), and nothing on the cotangent's path may be detached
    (``detach``, ``.data``). Where this fails, differentiating the function as written would not give the map."""
    if _cotangent_stops(traced):
        return False
    count = traced.arguments
    requiring: list[bool] = []

    def recorded(*values: torch.Tensor) -> Any:
        outputs = function(*values)
        requiring[:] = [isinstance(t, torch.Tensor) and t.requires_grad for t in outputs]
        return outputs

    try:
        with torch.enable_grad():
            given = [e.detach().requires_grad_(True) for e in examples[:count]]
            again = make_fx(stops_recorded(recorded), tracing_mode="fake", _allow_non_fake_inputs=True)(
                *given, *examples[count:])
    except Exception:  # an in-place op on a cotangent that requires grad, a Function that cannot be traced
        return False
    linear = [state is State.LINEAR for state in traced.states()]
    return _ops(again) == traced.recorded and all(r for r, live in zip(requiring, linear, strict=False) if live)


def _drop_writes_into_inputs(module: fx.GraphModule) -> None:
    """Functionalization writes an input changed in place back into it (``ct.mul_(2)``: ``copy_(ct, ...)``): the
    map is what the graph returns, and a backward's cotangent is its own, so the write-back is dropped."""
    for node in list(module.graph.nodes):
        if (_name(node.target) == "copy_" and not node.users and isinstance(node.args[0], fx.Node)
                and node.args[0].op == "placeholder"):
            module.graph.erase_node(node)
    module.recompile()


def _lifted(module: fx.GraphModule) -> tuple[list[torch.Tensor], list[int], list[int]]:
    """Turns the module's tensor constants into placeholders after its own, in place; returns the constants, which
    of them are literals (a tensor the function made from a number, read only by ``lift_fresh_copy``:
    ``torch.tensor(2.0)``, ``g[i] = 0``), and which of those are zeros."""
    graph = module.graph
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    by_target: dict[str, fx.Node] = {}
    constants: list[torch.Tensor] = []
    literals: list[int] = []
    for node in [n for n in graph.nodes if n.op == "get_attr"]:
        if node.target not in by_target:
            with graph.inserting_after(last):
                last = by_target[node.target] = graph.placeholder(f"constant{len(constants)}")
            if _is_literal(node):
                literals.append(len(constants))
            constants.append(getattr(module, node.target))
        node.replace_all_uses_with(by_target[node.target])
        graph.erase_node(node)
    module.recompile()
    zeros = [k for k in literals if _is_zero(constants[k])]
    return constants, zeros, literals


def _is_literal(node: fx.Node) -> bool:
    return bool(node.users) and all(_name(user.target) == "lift_fresh_copy" for user in node.users)


def _is_zero(constant: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return (not is_fake(constant) and not constant.requires_grad and constant.numel() <= 1
            and bool((constant == 0).all()))
