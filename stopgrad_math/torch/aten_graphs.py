"""A function traced into a functional graph of ATen ops, as PyTorch runs a backward, and run as the map it computes.

``trace`` is ``make_fx`` of the function and then of its functionalized
graph, the tensors it closes over lifted to inputs, one trace at a time
(``exclusive``); ``Traced.states`` judges the graph by ``linear_ops``' table,
and ``Traced.linear`` makes it a map autograd and torch.func differentiate,
with the stops written in it (``detach``, ``.data``) kept where they are off
the cotangent's path (``stops_recorded``).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import itertools
import linecache
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, ParamSpec, TypeVar

import torch
from torch import fx
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from stopgrad_math.shared.linearity import Judged, State
from stopgrad_math.torch import linear_ops, masked_selects

_P = ParamSpec("_P")
_R = TypeVar("_R")


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

    def traced_here(*args: Any) -> fx.GraphModule:
        before, _TRACE.thread = _TRACE.thread, threading.get_ident()
        try:
            return contextvars.copy_context().run(trace, *args)
        finally:
            _TRACE.thread = before

    return traced_here


class _Trace:
    thread: int | None = None  # the thread running the library's make_fx now (one at a time: ``exclusive``)


_TRACE = _Trace()


def _thread_aware(reads_the_flag: Callable[[], bool]) -> Callable[[], bool]:
    """One of FX's questions "is a symbolic trace running" (``is_fx_tracing``, ``is_fx_symbolic_tracing``), which
    Dynamo asks at each compiled call, answered for this thread: no, where the flag is the library's trace's, on
    another thread. Before torch 2.14 make_fx sets the flag for the process before the function it traces runs
    (``_TracingOnThisThread`` then takes over), and a compiled call in another thread raised in that window (48% of
    a compiled function's calls beside a thread making new proofs). (An FX trace of the user's on another thread,
    at the same moment as the library's, is not seen either.)"""
    def answered_here() -> bool:
        thread = _TRACE.thread
        return bool(reads_the_flag()) and (thread is None or thread == threading.get_ident())

    answered_here.__wrapped__ = reads_the_flag  # type: ignore[attr-defined]
    return answered_here


def _answer_fx_questions_per_thread() -> None:
    """Dynamo reads ``is_fx_symbolic_tracing`` (or ``is_fx_tracing``) when ``torch.compile`` wraps a function (torch
    2.13), or at each call, from FX's module or as its own name: a function compiled once the library is imported is
    answered per thread. From torch 2.14 the flag is per thread, and nothing is changed."""
    from torch._dynamo import eval_frame
    from torch.fx import _symbolic_trace

    if not hasattr(_symbolic_trace, "_is_fx_tracing_flag"):
        return
    for module in (_symbolic_trace, eval_frame):
        for question in ("is_fx_tracing", "is_fx_symbolic_tracing"):
            asked = getattr(module, question, None)
            if callable(asked) and not hasattr(asked, "__wrapped__"):
                setattr(module, question, _thread_aware(asked))


_answer_fx_questions_per_thread()


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
        return linear_ops.judge(self.graph.graph, self.arguments, self.zeros)

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
        return self.applied(cotangents, self.constants)

    def applied(self, cotangents: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        """``self.on(constants)(*cotangents)``, without making the map (a backward's call)."""
        values = self.run(*cotangents, *constants)
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
    return [n for n in graph.nodes if n.op == "call_function" and linear_ops.op_name(n.target) == "detach_copy"
            and not n.users and isinstance(n.args[0], fx.Node)]


def _stops(graph: fx.Graph) -> list[fx.Node]:
    """The nodes that stop a derivative where the function was written: each ``detach`` node, and each node a
    ``_StopsRecorded`` marker names (on torch 2.14, an ``alias``)."""
    marked = [n.args[0] for n in _markers(graph)]
    return list(dict.fromkeys([*(n for n in graph.nodes if linear_ops.op_name(n.target) == "detach"), *marked]))


def runnable(module: fx.GraphModule, aliases: Iterable[str] = ()) -> fx.GraphModule:
    """A graph traced with ``stops_recorded``, to run, in place: each marked stop a ``_stopped`` (but those named
    in ``aliases``, the identity), its markers dropped."""
    markers = _markers(module.graph)
    keep = set(aliases)
    for node in dict.fromkeys(n.args[0] for n in markers):
        if isinstance(node, fx.Node) and node.name not in keep and linear_ops.op_name(node.target) != "detach":
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
    walk = linear_ops.walked(traced.graph.graph, traced.arguments, traced.zeros)
    return [n for n in nodes if walk.states_in(n.args[0]) != [State.CONST]]


def _copied(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Functional ``copy(self, src)`` (src's values in self's shape, dtype and device) in ops autograd can
    differentiate, which it cannot ``copy``."""
    return src.to(dtype=self.dtype, device=self.device).expand(self.shape).clone()


@_exclusively
def _differentiable(traced: Traced) -> fx.GraphModule:
    """The traced graph as ops autograd and torch.func differentiate as the map: a stop on the cotangent's path an
    alias (a no-op in the backward it was traced as), any other a ``_stopped``; ``copy`` written as ``_copied``; a
    ``where`` applied at the sources of the case it keeps too (``masked_selects``: its transpose keeps what it
    discards zero)."""
    stops = _cotangent_stops(traced)
    copies = [n for n in traced.graph.graph.nodes if linear_ops.op_name(n.target) == "copy"]
    masks = masked_selects.masked(traced.graph.graph, traced.arguments)
    if not stops and not copies and not masks and not _markers(traced.graph.graph):
        return traced.graph
    module = copy.deepcopy(traced.graph)
    by_name = {n.name: n for n in module.graph.nodes}
    masked_selects.apply(module.graph, masks, by_name)
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
        name = linear_ops.op_name(node.target).split(".")[0] if node.op == "call_function" else ""
        if name not in _MASKED_INDEXING:
            continue
        masks = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)
                 and (name in ("nonzero", "masked_select", "masked_scatter") or _is_bool(a))]
        if any(reaches_any(mask, sources) for mask in masks):
            return name
    return None


def drawn_op(module: fx.GraphModule) -> str | None:
    """The first random op (a draw from PyTorch's generators: ``randn``, ``bernoulli``, ``native_dropout``) whose
    result the graph's outputs are computed from, else None. A graph run again draws again: where it holds f's ops
    (a compiled proof's, traced with f), its outputs would be computed from another draw than the value's."""
    draws = [n for n in module.graph.nodes if _draws(n)]
    output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    reached = next((n for n in draws if reaches_any(output, {n})), None) if draws else None
    return None if reached is None else linear_ops.op_name(reached.target)


def _draws(node: fx.Node) -> bool:
    """Whether the node draws from PyTorch's generators: an op PyTorch tags as seeded, but a dropout or an attention
    with its dropout off (a probability of 0, or ``train=False``), which draws nothing."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or torch.Tag.nondeterministic_seeded not in node.target.tags:
        return False
    if not any(word in linear_ops.op_name(node.target) for word in ("dropout", "attention")):
        return True
    given = {a.name: node.args[k] if k < len(node.args) else node.kwargs.get(a.name, a.default_value)
             for k, a in enumerate(node.target._schema.arguments)}
    return given.get("train") is not False and bool(given.get("dropout_p", given.get("p")) != 0)


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
                 if n.op == "call_function" and (name := linear_ops.op_name(n.target)) not in (*_STOPS, "alias"))


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
        if (linear_ops.op_name(node.target) == "copy_" and not node.users and isinstance(node.args[0], fx.Node)
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
    return bool(node.users) and all(linear_ops.op_name(user.target) == "lift_fresh_copy" for user in node.users)


def _is_zero(constant: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return (not is_fake(constant) and not constant.requires_grad and constant.numel() <= 1
            and bool((constant == 0).all()))
