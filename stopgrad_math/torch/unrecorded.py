"""Tensors f computes from its arguments with grad mode off: what ``order=2`` cannot differentiate through.

At ``order=2`` the decorator runs f at x and differentiates the VJP through
what it closes over. A tensor f computed from a moving argument
under ``no_grad`` (``set_grad_enabled(False)``, ``inference_mode``), as a
Function's forward runs, keeps no record of that dependence for reverse mode,
while forward mode records it all the same: ``torch.func.hessian`` took half
of the Hessian's term through it and ``create_graph`` none. ``watching``
follows what f computes from its arguments while it runs (a torch function
mode), marking what is computed with grad mode off and what follows from
that, and ``lost_read`` says whether the VJP reads a marked tensor: the
call's first derivatives are then order 1's, and a second derivative raises
``UNRECORDED``. A tensor read from elsewhere (a weight) is not followed, and
a ``detach()`` written in f is a stop its author chose, taken as one.

Plainly eager, where reverse mode alone can differentiate (``EagerWatch``), a
tensor computed in grad mode from an argument that requires grad requires grad
itself, so only the ops run with grad mode off, or on a lost tensor, need
following: an op in grad mode on anything else costs the mode's call alone
(order 2's cost, close to order 1's, for a forward of many small ops), and
whether y reads a tensor that requires grad from elsewhere is read off y's
own graph afterwards.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

UNRECORDED = (
    "A second derivative through {name} would miss a term: its vjp reads a tensor that {name} computed from its "
    "arguments with grad mode off (no_grad, set_grad_enabled(False), inference_mode), as a Function's forward "
    "runs, and reverse mode has no record of that tensor's dependence on the arguments (torch.func.hessian would "
    "take half of the term). First derivatives are exact: they need none of it. For second derivatives too, compute "
    "that tensor in grad mode (the decorator stops the value, so grad mode adds no derivative to it).")


class Watch(TorchFunctionMode):
    """Follows the ops run on tensors computed from ``roots`` (the moving arguments): an inexact result is
    ``derived``, and ``lost`` where grad mode is off or an operand is lost already; ``reads_outside`` says whether
    an op read a tensor a derivative can be taken through (``moves``) from elsewhere (a weight), whose autodiff
    f's value must keep."""

    def __init__(self, roots: Iterable[torch.Tensor]) -> None:
        super().__init__()
        # by id, each with a weak reference that says whether the id is still that tensor's (a plain dict: a
        # WeakValueDictionary's Python methods cost a small op's eager call more than the op)
        self.derived: dict[int, weakref.ref[torch.Tensor]] = {id(t): weakref.ref(t) for t in roots}
        self.lost: dict[int, weakref.ref[torch.Tensor]] = {}
        self.reads_outside = False  # whether an op read a tensor that requires grad and is not computed from roots

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # (each op of f comes here: written out, where helpers' calls cost about as much as a small op)
        result = func(*args, **kwargs) if kwargs else func(*args)
        from_lost = from_derived = False
        lost, derived = self.lost, self.derived
        for t in tensors(args) + tensors(tuple(kwargs.values())) if kwargs else tensors(args):
            held = lost.get(id(t))
            if held is not None and held() is t:
                from_lost = True
                continue
            held = derived.get(id(t))
            if held is not None and held() is t:
                from_derived = True
            elif not self.reads_outside and moves(t):
                self.reads_outside = True
        if (from_lost or from_derived) and type(result) not in _METADATA:  # (a shape, a dtype: nothing to mark)
            marked = lost if from_lost or not torch.is_grad_enabled() else derived
            for out in (result,) if isinstance(result, torch.Tensor) else tensors((result,)):
                if out.is_floating_point() or out.is_complex():
                    marked[id(out)] = weakref.ref(out)
        return result

    def reaches_outside(self, y: Any) -> bool:
        """Whether an op read a tensor a derivative can be taken through from elsewhere (y aside)."""
        return self.reads_outside


class EagerWatch(TorchFunctionMode):
    """``Watch``'s reading where reverse mode alone can differentiate (plainly eager, no forward-mode level): a
    tensor computed from the moving arguments (``roots``) in grad mode requires grad, and its graph reaches them
    (``derived``, asked only of what an op with grad mode off reads); a result of an op run with grad mode off on a
    derived tensor, or of any op on a lost one, is ``lost``. Whether y reads a weight is ``reaches_outside``."""

    def __init__(self, roots: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self.roots = list(roots)
        self.lost: dict[int, weakref.ref[torch.Tensor]] = {}
        self.since = torch._C._autograd._get_sequence_nr()  # (of the first autograd node made after: made just
        # before f runs inside it)
        self.edges = {(r.grad_fn, r.output_nr) for r in self.roots if r.grad_fn is not None}  # the roots' own
        self.leaves = {id(r) for r in self.roots if r.grad_fn is None}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **kwargs) if kwargs else func(*args)
        grad_mode = torch.is_grad_enabled()
        if (grad_mode and not self.lost) or type(result) in _METADATA:  # (the common op: nothing to follow)
            return result
        lost = self.lost
        read = tensors(args) + tensors(tuple(kwargs.values())) if kwargs else tensors(args)
        if any(_holds(lost, t) for t in read) or (not grad_mode and any(self.derived(t) for t in read)):
            for out in (result,) if isinstance(result, torch.Tensor) else tensors((result,)):
                if out.is_floating_point() or out.is_complex():
                    lost[id(out)] = weakref.ref(out)
        return result

    def derived(self, t: torch.Tensor) -> bool:
        """Whether t is a root or computed from one in grad mode: its graph, walked through the nodes made inside,
        reaches a root (a weight's history, made before, is not walked)."""
        if any(t is r for r in self.roots):
            return True
        return t.grad_fn is not None and any(self._ends([(t.grad_fn, t.output_nr)]))

    def reaches_outside(self, y: Any) -> bool:
        """Whether y's graph reaches a tensor that requires grad other than the roots: a leaf that is not a root, or
        a node made before the watch began (another tensor's history) at an edge that is not a root's own. (Taking
        a node made inside for one made before only runs f again, as ``Watch`` does where it read a weight.)"""
        edges = []
        for t in (y,) if type(y) is torch.Tensor else tensors((y,)):
            if not t.requires_grad:
                continue
            if t.grad_fn is None:
                if id(t) not in self.leaves:
                    return True
            else:
                edges.append((t.grad_fn, t.output_nr))
        return not all(self._ends(edges))

    def _ends(self, pending: list[tuple[Any, int]]) -> Iterator[bool]:
        """Where the graph from these edges ends, walked through the nodes made inside, one by one: True at a
        root (its own edge, or its accumulator), False at another leaf's accumulator or a node made before."""
        seen: set[Any] = set()
        while pending:  # (written out: a small forward's walk is a few nodes, each a few attribute reads)
            edge = pending.pop()
            node: Any = edge[0]
            if edge in self.edges:
                yield True
            elif type(node) is _ACCUMULATE_GRAD:
                yield id(node.variable) in self.leaves
            elif node._sequence_nr() < self.since:
                yield False
            elif node not in seen:
                seen.add(node)
                pending.extend(e for e in node.next_functions if e[0] is not None)


_ACCUMULATE_GRAD: Any = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]
"""The type of a leaf's accumulator node: it holds the leaf as ``variable``."""


Followed = Watch | EagerWatch  # what ``lost_read`` reads: a watch's lost tensors


_ATOMS = frozenset({bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format})
_METADATA = _ATOMS | {torch.Size}  # what a read of a tensor's metadata gives: no tensor among it


def tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors among ``values``' pytree leaves, in order: read off directly where each value is a tensor, an
    atom or a tuple of atoms (an op's usual operands, a Function's ``needs_input_grad``; pytree's walk costs a small
    op's eager call some 10 µs), else by the walk."""
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif type(v) not in _ATOMS and not (type(v) is tuple and all(type(u) in _ATOMS for u in v)):
            return [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
    return found


def moves(tensor: torch.Tensor) -> bool:
    """Whether a derivative can be taken through the tensor: it requires grad, carries a forward-mode tangent, or
    is wrapped by a torch.func transform (which may carry one)."""
    if tensor.requires_grad or is_functorch_wrapped_tensor(tensor):
        return True
    return forward_ad._current_level >= 0 and forward_ad.unpack_dual(tensor).tangent is not None  # type: ignore[no-untyped-call]


def _holds(marked: dict[int, weakref.ref[torch.Tensor]], tensor: torch.Tensor) -> bool:
    held = marked.get(id(tensor))
    return held is not None and held() is tensor


@contextlib.contextmanager
def watching(roots: list[torch.Tensor] | None) -> Iterator[Watch | None]:
    """A watch of the ops run inside on what is computed from ``roots``; None where roots is None."""
    if roots is None:
        yield None
        return
    watch = Watch(roots)
    with watch:
        yield watch


def beyond(undifferentiable: str | None, embedded_at: int, order: int) -> str | None:
    """What a derivative beyond the order a call is embedded at says (about ``{name}``), where it is not the
    decorator's ``BEYOND_ORDER``: why f could not run at x, or ``UNRECORDED`` where the call asked order 2 and its
    VJP was embedded at order 1."""
    return undifferentiable or (UNRECORDED if embedded_at < order else None)


def lost_read(watch: Followed | None, read: Iterable[Any]) -> bool:
    """Whether the VJP reads (``read``) a tensor the watch found lost: a second derivative then raises
    ``UNRECORDED``, and first derivatives are order 1's."""
    return watch is not None and any(isinstance(t, torch.Tensor) and _holds(watch.lost, t) for t in read)
