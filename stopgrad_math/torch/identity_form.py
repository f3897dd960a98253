"""custom_gradient(fx, gx, x) in PyTorch: the identity form, tfp's signature, every layout of gx."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from stopgrad_math.shared import arguments, layouts
from stopgrad_math.shared.layouts import Layout
from stopgrad_math.torch import compiled_fast_path, decorator_form, eager_fast_path, evaluation, identity


def _leaves(gx: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """(label, gx leaf, x leaf) for each leaf of x, gx having x's structure (a None leaf: no gradient)."""
    if isinstance(x, torch.Tensor) and (gx is None or isinstance(gx, torch.Tensor)):  # one leaf: no walk
        return [("x", gx, x)]  # (torch.compile's trace of a walk with paths costs about 25 ms a call)
    labelled, structure = pytree.tree_flatten_with_path(gx)  # None is a leaf to torch's pytrees
    x_leaves, x_structure = pytree.tree_flatten(x)
    if x_structure != structure:
        raise ValueError(f"gx must have the structure of x: gx is {structure}, x is {x_structure}.")
    return [(f"x{pytree.keystr(path)}", g, leaf) for (path, g), leaf in zip(labelled, x_leaves, strict=True)]


def _checked(fx: torch.Tensor, label: str, g: Any, x: Any) -> tuple[Layout, torch.Tensor, torch.Tensor]:
    """(layout, gx in fx's dtype, x) for one argument, or the error that names it."""
    x = identity.inexact_tensor(x, label)
    g = identity.inexact_tensor(g, f"the gradient for {label}", dtype_hint=fx.dtype)
    if not fx.is_complex() and (g.is_complex() or x.is_complex()):
        raise TypeError(f"The gradient for {label} or {label} is complex ({g.dtype}, {x.dtype}) for a real fx "
                        f"({fx.dtype}): a real function has no complex derivative.")
    if _one_static_shape(fx, x, g):
        layout = Layout.ELEMENTWISE
    else:
        layout = layouts.candidates(label, tuple(fx.shape), tuple(x.shape), tuple(g.shape),
                                    cached=not identity.compiling()).layouts[0]
    return layout, g if g.dtype == fx.dtype else g.to(fx.dtype), x


def _one_static_shape(fx: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether fx, x and gx have one known shape of rank 1 or more, where only the elementwise layout fits (the
    Jacobian's shape has twice the rank): chosen so without the layout table, whose Python torch.compile would
    trace at every call."""
    shape = fx.shape
    return len(shape) > 0 and x.shape == shape and g.shape == shape and all(type(n) is int for n in shape)


def custom_gradient(fx: Any = None, gx: Any = None, x: Any = None, fx_gx_manually_stopped: bool = False,
                    name: str | None = None, *, order: int = 1,
                    check_linearity: bool = False) -> torch.Tensor | Callable[..., Any]:
    """Embeds a known gradient: ``custom_gradient(fx, gx, x)`` or ``@custom_gradient``.

    **Identity form**, tfp's signature: a tensor with the value of ``fx``
    bit for bit (−0.0, inf and NaN included) and the derivative ``gx`` with
    respect to ``x`` (a tensor or a nest of tensors; ``gx`` has its
    structure, None: no gradient for that leaf), under ``backward``,
    ``torch.autograd.grad``, ``forward_ad``, every ``torch.func`` transform
    and ``torch.compile(fullgraph=True)``:

        h = stop(fx) − Σ (stop(gx)·(stop(x) − x) + N)

    made of ordinary ATen ops (N carries the derivative where gx is inf or
    NaN; see ``identity``); a plain eager call with finite x and gx, or one
    under a single ``torch.func`` derivative, takes a fast path with the
    same bits (``eager_fast_path``), and so does a plain
    call compiled for reverse mode (``compiled_fast_path``). gx is read from
    its shape as on TensorFlow and JAX: ``fx.shape + x.shape`` is the
    Jacobian; a gx that broadcasts with x to ``fx.shape`` is elementwise; for
    a one-element fx it is the gradient; otherwise, as in tfp, the gradient
    of ``sum(fx)``. Complex values follow PyTorch's convention (the JVP is
    gx·tangent, the VJP conj(gx)·cotangent). An infinite gx gives an infinite
    derivative of its sign; an inf or NaN element of x keeps the value and
    gets gx as any other does (through ``identity.carried_zero``).

    **Decorator form**: ``f(*args)`` returns ``(y, vjp)``; the decorated f
    has the value y bit for bit and the VJP's derivative under ``backward``,
    ``forward_ad``, every ``torch.func`` transform and
    ``torch.compile(fullgraph=True)`` (an ``autograd.Function`` with a
    ``backward`` alone has no forward mode). vjp must be linear in its
    cotangent, which is proven from its graph of ATen ops (a ValueError names
    any other op); ``order=2`` makes second derivatives exact.

    Every argument, error and limit: [custom_gradient in full](custom_gradient.md).

    Args:
      fx: the value f(x); or, alone, the function to decorate.
      gx: the derivative of f at x (None: no gradient for that leaf).
      x: what the derivative is with respect to.
      fx_gx_manually_stopped: fx and gx are used as given, unstopped (a ValueError where backward would reach x
        through them).
      name: accepted for tfp's signature (PyTorch keeps no op names).
      order: decorator form: 2 for exact second derivatives.
      check_linearity: decorator form: accepted; on PyTorch linearity is always proven.

    Returns:
      fx with derivative gx; or the decorated function.

    Examples:
        log(1 + exp(x)) with its exact derivative at x = 100, in forward mode.

        >>> f = lambda x: custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)
        >>> torch.func.jvp(f, (torch.tensor([0.0, 100.0]),), (torch.ones(2),))[1]
        tensor([0.5000, 1.0000])
        >>> @custom_gradient
        ... def log1pexp(x):
        ...     e = torch.exp(x)
        ...     return torch.log1p(e), lambda ct: ct * (1 - 1 / (1 + e))
        >>> torch.func.jvp(log1pexp, (torch.tensor(100.0),), (torch.tensor(1.0),))[1]
        tensor(1.)
    """
    del name  # PyTorch keeps no op names
    decorated = arguments.decorator_form(fx, gx, x, order, check_linearity, decorator_form.decorate)
    if decorated is not None:
        return decorated
    return with_gradient(fx, gx, x, fx_gx_manually_stopped)


def _reaches(tensor: torch.Tensor, xs: list[torch.Tensor]) -> bool:
    """Whether backward from ``tensor`` reaches any of ``xs``: a walk of the autograd graph (reverse mode's; what
    forward_ad, torch.func and torch.compile record is not walked)."""
    node = tensor.grad_fn
    if node is None:
        return False
    targets = {x.grad_fn for x in xs if x.grad_fn is not None}
    leaves = {id(x) for x in xs if x.grad_fn is None and x.requires_grad}
    seen, stack = set(), [node]
    while stack:
        node = stack.pop()
        if node in targets or id(getattr(node, "variable", None)) in leaves:
            return True
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    return False


_UNSTOPPED = ("{what} moves with x: fx_gx_manually_stopped=True promises that fx and gx are stopped w.r.t. x, "
              "but backward from {what} reaches {label}, so its own derivative would add to the embedded one. Stop "
              "x where fx and gx read it; partial_custom_gradient(f, g, x, *others) does, and keeps the "
              "derivatives w.r.t. the others.")


def _check_held_apart(fx: torch.Tensor, planned: list[tuple[str, Layout, torch.Tensor, torch.Tensor]]) -> None:
    xs = [leaf for *_, leaf in planned]
    for what, tensor in [("fx", fx), *((f"the gradient for {label}", g) for label, _, g, _ in planned)]:
        if _reaches(tensor, xs):
            raise ValueError(_UNSTOPPED.format(what=what, label=", ".join(label for label, *_ in planned)))


def with_gradient(fx: Any, gx: Any, x: Any, fx_gx_manually_stopped: bool = False, *,
                  stopped_by_caller: bool = False) -> torch.Tensor:
    """The identity form alone (the helpers' entry): fx with derivative gx w.r.t. x. ``stopped_by_caller``:
    fx and gx read x stopped by construction (partial_custom_gradient), and the promise is not checked."""
    fx = identity.inexact_tensor(fx, "fx")
    planned = [(label, *_checked(fx, label, g, leaf)) for label, g, leaf in _leaves(gx, x) if g is not None]
    if not evaluation.differentiating([fx, *(t for _, _, g, leaf in planned for t in (g, leaf))]):
        return torch.clone(fx)  # fx's value as a tensor of its own, as the identity's is; nothing can differentiate
    if not fx_gx_manually_stopped:
        fx = identity.stop(fx)
        planned = [(label, layout, identity.stop(g), leaf) for label, layout, g, leaf in planned]
        fast = (compiled_fast_path.identity if identity.compiling() else eager_fast_path.finite_identity)(
            fx, planned)
        if fast is not None:
            return fast
    elif not stopped_by_caller and not identity.compiling():
        _check_held_apart(fx, planned)
    return identity.attach(fx, [identity.zero_term(layout, fx, leaf, g) for _, layout, g, leaf in planned])
