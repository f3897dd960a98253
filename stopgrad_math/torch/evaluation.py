"""The PyTorch decorator's first stage: whether a call differentiates at all, and f evaluated for it.

``differentiating`` says whether any derivative of the call can be taken
(where none can, the call is f's value alone). ``evaluated`` runs f: y at
stop(x), and the VJP at stop(x) (order 1) or at x (order 2), watched by
``unrecorded`` where reverse mode may differentiate what it closes over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from stopgrad_math.shared.arguments import call_f, name_of, undifferentiable
from stopgrad_math.torch import (
    eager_fast_path,
    identity,
    recorded_term,
    refusals,
    second_derivative_guard,
    unrecorded,
)
from stopgrad_math.torch.vjp_conventions import Leaves


def differentiating(args: Sequence[Any]) -> bool:
    """Whether a derivative of a call on ``args`` (a nest) may be taken: an argument that requires grad in grad
    mode, a forward-mode level, a torch.func transform, a trace (make_fx's, an outer VJP's) or a compilation.
    Where none is, a decorated call is f's value alone, as a Function's forward without grad, and the VJP is not
    called; the identity form is fx."""
    if identity.compiling() or second_derivative_guard.forward_mode_possible() \
            or torch._C._len_torch_dispatch_stack():
        return True
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in unrecorded.tensors(args))


def evaluated(f: Callable[..., Any], leaves: Leaves, kwargs: dict[str, Any],
              order: int) -> tuple[Any, Any, unrecorded.Followed | None, str | None]:
    """f's ``(y, vjp)``: y at stop(x); the VJP at stop(x) (order 1: what it closes over is stopped when it is
    embedded), or at x (order 2, eagerly and under torch.func), watched where reverse mode may differentiate it
    (``unrecorded``: a watch of what f computed without grad mode; else None). At order 2 f runs once where the
    watch saw it read nothing else that requires grad (y detached is then y at stop(x)), else again at stop(x),
    replaying the first call's draws. Compiled, and at order 2 under one torch.func derivative alone, the VJP at
    stop(x) as at order 1. The last element: None, or, where f cannot run at x (a forward that calls ``.numpy()``
    on its input, as a Function's forward may, whose input never requires grad there), what a second derivative
    raises (``undifferentiable``): f is then run at stop(x), as at order 1."""
    # Compiled, the proof's graphs compute J from the arguments (``compiled_graphs.Registered``). Under a jvp, or a grad
    # or vjp, transform alone (``eager_fast_path.forward_transforms_alone``, ``reverse_transforms_alone``: nothing under
    # the wrappers requiring grad) no second derivative can be taken, and the VJP at stop(x) closes over what it closes
    # over at x, in value (``mapped_zero`` gives that no derivative itself).
    tensors = leaves.tensors()
    if order == 1 or identity.compiling() or eager_fast_path.forward_transforms_alone(tensors) \
            or eager_fast_path.reverse_transforms_alone(tensors):
        return (*call_f(f, leaves.with_values(_stopped(leaves)), kwargs), None, None)
    moving = [leaves.values[k] for k in leaves.differentiable]
    reverse = any(x.requires_grad for x in moving)  # (the watch's lost tensors matter to reverse mode alone)
    drawn = _random_states()
    if reverse or any(unrecorded.moves(x) for x in moving):
        versions = _versions(leaves)
        followed = (unrecorded.EagerWatch if recorded_term.reverse_alone() else unrecorded.Watch)(moving)
        try:
            with followed:
                y, vjp = call_f(f, leaves.with_values({}), kwargs)
        except Exception as error:  # (f's own errors are raised again by its call at stop(x))
            return _at_order_1(f, leaves, kwargs, drawn, error)
        _refuse_a_change_in_place(f, leaves, versions)
        watch = followed if reverse else None
        if not followed.reaches_outside(y):  # y depends on the arguments alone: its value at stop(x), no second call
            return _detached(y), vjp, watch, None
    else:
        watch, vjp = None, call_f(f, leaves.with_values({}), kwargs)[1]  # (nothing moves: no change to refuse)
    _random_states(drawn)  # the second call draws what the first drew: y and the VJP's residuals agree
    return call_f(f, leaves.with_values(_stopped(leaves)), kwargs)[0], vjp, watch, None


def _stopped(leaves: Leaves) -> dict[int, Any]:
    """stop(x) for each differentiable leaf, by index (made where f runs at stop(x), not at each call)."""
    return {k: identity.stop(leaves.values[k]) for k in leaves.differentiable}


def _at_order_1(f: Callable[..., Any], leaves: Leaves, kwargs: dict[str, Any], drawn: Any,
                error: Exception) -> tuple[Any, Any, None, str]:
    """``evaluated`` where f could not run at x: f at stop(x), as at order 1, and what a second derivative raises."""
    _random_states(drawn)
    return (*call_f(f, leaves.with_values(_stopped(leaves)), kwargs), None, undifferentiable("PyTorch", error))


def _versions(leaves: Leaves) -> dict[int, int]:
    """The version counters of the differentiable arguments a derivative is taken through (``unrecorded.moves``), by
    leaf (an inference tensor has none, and no derivative is taken through one)."""
    return {k: x._version for k in leaves.differentiable
            if unrecorded.moves(x := leaves.values[k]) and not x.is_inference()}


def _refuse_a_change_in_place(f: Callable[..., Any], leaves: Leaves, versions: dict[int, int]) -> None:
    """RuntimeError (``refusals.CHANGED_IN_PLACE``) where f, run at x, changed in place an argument a derivative is
    taken through: its version counter moved from ``versions`` (``_versions``). Another argument changed in place (a
    running statistic) is f's business."""
    for k, before in versions.items():
        if leaves.values[k]._version != before:
            raise RuntimeError(refusals.CHANGED_IN_PLACE.format(name=name_of(f), argument=leaves.labels[k]))


def _detached(y: Any) -> Any:
    """y with each tensor detached (one tensor, the common output, without pytree's walk)."""
    if type(y) is torch.Tensor:
        return y.detach()
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, y)


def _random_states(restored: Any = None) -> Any:
    """The states of PyTorch's default generators (the CPU's, and each CUDA device's once CUDA is started), or,
    given states, those set back. f runs twice at order 2: a sampler's value and the residuals its VJP reads
    must be one draw, as where f runs once."""
    if restored is not None:
        cpu, cuda = restored
        torch.default_generator.set_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return None
    # (the generator's own state, as torch.get_rng_state reads it, without its Python wrapper's cost at every call)
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]
    return torch.default_generator.get_state(), cuda
