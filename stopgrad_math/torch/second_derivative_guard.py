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
- ``backward``: a hook on each zero ``v`` sees the gradient that reaches
  it; where grad mode is on (``create_graph=True``) the first derivative is
  being recorded to be differentiated again, and where that gradient is a
  dual tensor, forward mode is differentiating it.

``check`` raises where the count exceeds the order, when f is called;
``hooked`` raises in ``backward``, at order 1 (on an alias of x, through
which the decorator's term reaches it). What none of them sees is
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

_DIFFERENTIATING = (TransformType.Grad, TransformType.Jvp)


def _levels(tensor: torch.Tensor) -> tuple[set[int], torch.Tensor]:
    """The torch.func levels the tensor is wrapped at, and the plain tensor inside."""
    levels = set()
    while is_functorch_wrapped_tensor(tensor):
        levels.add(maybe_get_level(tensor))
        tensor = get_unwrapped(tensor)
    return levels, tensor


def derivatives_taken(tensors: Iterable[torch.Tensor]) -> int:
    """How many derivatives are being taken of these tensors now: the torch.func grad and jvp levels they are
    wrapped at, and one for a forward_ad dual tensor among them (outside torch.func, whose jvp is dual inside)."""
    differentiating = {i.level() for i in retrieve_all_functorch_interpreters() if i.key() in _DIFFERENTIATING}
    levels: set[int] = set()
    dual = False
    for tensor in tensors:
        wrapped, plain = _levels(tensor)
        levels |= wrapped
        dual = dual or forward_ad.unpack_dual(plain).tangent is not None  # type: ignore[no-untyped-call]
    return len(levels & differentiating) + dual


def in_transform() -> bool:
    """Whether a torch.func transform is active."""
    return bool(retrieve_all_functorch_interpreters())


def check(tensors: Iterable[torch.Tensor], order: int, name: str) -> None:
    """LookupError naming ``order=2`` (or saying that order 2 is exact to the second derivative) where more
    derivatives than ``order`` are being taken of ``tensors``."""
    if derivatives_taken(tensors) > order:
        raise LookupError(BEYOND_ORDER[order].format(name=name))


def hooked(x: torch.Tensor, name: str) -> torch.Tensor:
    """x, or where backward may reach it, an alias of it with a hook that raises in a backward pass recording a
    second derivative (order 1): one with ``create_graph=True``, or one whose gradient is a dual tensor."""
    if not x.requires_grad or torch.compiler.is_compiling() or in_transform():
        return x
    v = x.view_as(x)

    def refuse_a_second_derivative(gradient: torch.Tensor) -> None:
        if torch.is_grad_enabled() or forward_ad.unpack_dual(gradient).tangent is not None:  # type: ignore[no-untyped-call]
            raise LookupError(BEYOND_ORDER[1].format(name=name))

    v.register_hook(refuse_a_second_derivative)  # type: ignore[no-untyped-call]
    return v
