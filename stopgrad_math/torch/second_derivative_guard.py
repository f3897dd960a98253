"""The decorator's guard: a derivative beyond its order raises instead of missing a term.

At ``order=1`` the decorator holds the VJP's Jacobian J constant, so a
second derivative would miss the term through J's own dependence on x.
PyTorch has no primitive whose derivative a library defines without
``autograd.Function``, so the guard reads what PyTorch shows of the
derivatives being taken, in three places:

- ``torch.func``: its transforms nest, and their stack is visible when f is
  called. Each ``grad`` or ``jvp`` level at which an argument or y is
  wrapped is one derivative (``hessian`` is two, ``vmap(grad)`` one).
- ``forward_ad``: a dual argument outside ``torch.func`` is one more.
- ``backward``: a hook on an alias of x sees the gradient that reaches
  it; where that gradient is a dual tensor, forward mode is differentiating
  it; where grad mode is on (``create_graph=True``) the first derivative is
  being recorded, and a zero term attached to it raises when a later
  derivative reaches x (or what the VJP closes over) through it.

``check`` raises where the count of derivatives of f's arguments and of
what the VJP closes over exceeds the order, when f is called; ``hooked``
raises in ``backward``, at order 1. A second derivative w.r.t. anything
else (a gradient penalty's weights) is exact and raises nothing. What none of them sees is
documented (docs/torch.md) and tested as a limit: a ``forward_ad`` level
around a ``torch.func`` one, and ``create_graph`` chains at order 2.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C._functorch import TransformType, get_unwrapped, is_functorch_wrapped_tensor, maybe_get_level
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from stopgrad_math.shared.arguments import BEYOND_ORDER
from stopgrad_math.torch.identity import compiling, zero_with_slope

_DIFFERENTIATING = (TransformType.Grad, TransformType.Jvp)


def _levels(tensor: torch.Tensor, grad_levels: set[int]) -> tuple[set[int], torch.Tensor]:
    """The torch.func levels the tensor is differentiated at, and the plain tensor inside: each level it is
    wrapped at, but a grad level only where it requires grad there (a stopped tensor is wrapped at the levels
    around it, and no derivative reaches it through them)."""
    levels = set()
    while is_functorch_wrapped_tensor(tensor):
        level = maybe_get_level(tensor)
        if level not in grad_levels or tensor.requires_grad:
            levels.add(level)
        tensor = get_unwrapped(tensor)
    return levels, tensor


def derivatives_taken(tensors: Iterable[torch.Tensor]) -> int:
    """How many derivatives are being taken of these tensors now: the torch.func grad and jvp levels they are
    differentiated at, and one for a forward_ad dual tensor among them (outside torch.func, whose jvp is dual
    inside)."""
    interpreters = retrieve_all_functorch_interpreters()
    differentiating = {i.level() for i in interpreters if i.key() in _DIFFERENTIATING}
    grad_levels = {i.level() for i in interpreters if i.key() == TransformType.Grad}
    levels: set[int] = set()
    dual = False
    for tensor in tensors:
        wrapped, plain = _levels(tensor, grad_levels)
        levels |= wrapped
        dual = dual or forward_ad.unpack_dual(plain).tangent is not None  # type: ignore[no-untyped-call]
    return len(levels & differentiating) + dual


def in_transform() -> bool:
    """Whether a torch.func transform is active (a question Dynamo traces, where it cannot read the interpreter
    stack itself)."""
    return bool(torch._C._are_functorch_transforms_active())


def forward_mode_possible() -> bool:
    """Whether forward mode may differentiate what is made now: a forward-mode level or a torch.func transform is
    active, as Dynamo too sees them while it traces. (A tensor made outside them never gets a tangent, and PyTorch
    carries no outer level's tangent through a compiled function.)"""
    return forward_ad._current_level >= 0 or in_transform()


def check(tensors: Iterable[torch.Tensor], order: int, name: str, why: str | None = None) -> None:
    """LookupError naming ``order=2`` (or saying that order 2 is exact to the second derivative; or ``why``, a
    message about ``{name}``) where more derivatives than ``order`` are being taken of ``tensors``."""
    if derivatives_taken(tensors) > order:
        raise LookupError((why or BEYOND_ORDER[order]).format(name=name))


FORWARD_OVER_FORWARD = (
    "A forward-mode derivative of a forward-mode derivative through {name} (torch.func.jacfwd of jacfwd, jvp of "
    "jvp) would miss the term through its vjp's own dependence on the arguments: at order=2 the declared "
    "derivative is an autograd.Function's jvp, whose result an outer torch.func jvp does not differentiate "
    "(PyTorch gives 0 there). Take the second derivative with reverse mode inside: torch.func.hessian "
    "(jacfwd of jacrev), jacrev of jacrev or of jacfwd, or autograd.grad with create_graph=True.")


def check_forward_over_forward(name: str) -> None:
    """LookupError naming the compositions that are exact, where a torch.func jvp level runs inside another (the
    decorator's order 2, whose forward-mode rule an outer jvp cannot differentiate)."""
    if sum(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters()) > 1:
        raise LookupError(FORWARD_OVER_FORWARD.format(name=name))


def hooked(x: torch.Tensor, stopped: list[torch.Tensor], name: str, why: str = BEYOND_ORDER[1]) -> torch.Tensor:
    """x, or where backward may reach it, an alias of it with a hook for a backward pass recording a second
    derivative (order 1). ``stopped``: what J depends on besides x, held constant (the tensors the VJP closes
    over).

    A gradient that is a dual tensor (forward mode over this backward) raises. One recorded with
    ``create_graph=True`` is returned with a zero term attached, +0.0 in value, through x and ``stopped``: only a
    derivative of it that reaches them, and so would miss J's own dependence on them, runs that term's hook,
    which raises. A derivative w.r.t. anything else (a gradient penalty's weights outside f) is exact, and runs
    nothing of it. ``why``: what it raises, about ``{name}``."""
    if not x.requires_grad or compiling() or in_transform():
        return x
    v = x.view_as(x)
    live = live_of(x, stopped)
    v.register_hook(lambda gradient: guarded(gradient, live, name, why))  # type: ignore[no-untyped-call]
    return v


def live_of(x: torch.Tensor, stopped: list[torch.Tensor]) -> list[torch.Tensor]:
    """What a derivative of x's gradient must not reach: x and the tensors J depends on, where they require grad."""
    return [t for t in (x, *stopped) if t.requires_grad]


def guarded(gradient: torch.Tensor, live: list[torch.Tensor], name: str, why: str = BEYOND_ORDER[1]) -> torch.Tensor:
    """A gradient reaching x at order 1, guarded (``hooked``'s hook; the decorator's reverse fast path, in its
    backward): LookupError where it is a dual tensor (forward mode over the backward pass); where grad mode records
    it (``create_graph=True``), the gradient bit for bit with a zero term attached through ``live``
    (``live_of``) whose own derivative raises, since a later derivative that reaches them through it would miss
    J's dependence on them; else the gradient as it is."""
    if forward_ad.unpack_dual(gradient).tangent is not None:  # type: ignore[no-untyped-call]
        raise LookupError(why.format(name=name))
    if not torch.is_grad_enabled():
        return gradient
    reached = sum((zero_with_slope(t, slope_is_negative=False).real.sum() for t in live),
                  torch.zeros((), dtype=gradient.real.dtype, device=gradient.device))

    def refuse(_: torch.Tensor) -> None:
        raise LookupError(why.format(name=name))

    reached.register_hook(refuse)  # type: ignore[no-untyped-call]
    return gradient - reached.to(gradient.dtype)  # −0.0 − (+0.0) is −0.0: the gradient bit for bit
