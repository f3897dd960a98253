"""What the PyTorch decorator says where it cannot embed a VJP, and which errors hand a call back to PyTorch.

Every stage raises from here: a VJP that cannot be traced (``untraceable``,
``sparse_refusal``), a transpose PyTorch cannot differentiate
(``without_derivative``), a branch on a float that a compiled proof cannot
follow. ``raised_by_the_vjp`` tells the user's own exception, which passes
through unchanged, from the trace's; ``falls_back_on`` is the rule by which
``stopgrad_math.torch.Function`` hands a class to ``torch.autograd.Function``
instead of raising.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable
from typing import Any

import torch

from stopgrad_math.shared.arguments import name_of
from stopgrad_math.shared.linearity import NotEmbeddable
from stopgrad_math.torch import (
    linear_ops,
    vjp_closure,
)

EVERY_COTANGENT_NONE = (
    "The vjp of {name} returned None for every argument of a call whose arguments require grad: every gradient "
    "through {name} is zero. Inside f the arguments are stopped, as a Function's forward sees them, so a guard "
    "such as `if x.requires_grad` (a port of ctx.needs_input_grad) is always false there: drop it and return every "
    "cotangent; autograd takes only those it needs.")


CHANGED_IN_PLACE = (
    "{name} changed its argument {argument} in place (its version counter moved while {name} ran), as a Function's "
    "forward may only with ctx.mark_dirty. At order=2 f runs on the argument itself, so the change enters the "
    "argument's own derivative and the gradient through {name} would count it twice, where torch.autograd.Function "
    "counts it once. Change a copy (x = x.clone()), mark the argument dirty in a Function's forward (the class then "
    "runs as a torch.autograd.Function), or decorate with order=1.")


DRAWN_AGAIN = (
    "The vjp of {name} is computed from a random draw (aten::{op}) of f's. Under torch.compile the decorator embeds "
    "the vjp as graphs of f and the vjp together, which would draw again: the gradient would be another draw's than "
    "the value's. It embeds the vjp as Dynamo traces it, which reads the value's draw, at order=1 where the vjp's "
    "autodiff is its map (written in grad mode, no stop on the cotangent's path); eagerly and under torch.func the "
    "draw is replayed at either order. Decorate with order=1, draw the noise outside f and pass it as an argument, "
    "or call f uncompiled.")


def sparse_refusal(f: Callable[..., Any], sparse: str) -> NotEmbeddable:
    return NotEmbeddable(f"The vjp of {name_of(f)} reads the sparse tensor {sparse}, which the decorator cannot trace "
                         "into ATen ops to prove the vjp linear: PyTorch's fake tensors have no sparse layout. Close "
                         "over it dense (to_dense()), or keep this rule an autograd.Function.")


# Where an exception raised inside is PyTorch's (the trace's) or the library's own (a refusal), not the VJP's.
_NOT_THE_VJPS = (str(pathlib.Path(torch.__file__).parent), str(pathlib.Path(__file__).parent.parent))


def raised_by_the_vjp(error: Exception) -> bool:
    """Whether the VJP's own code raised ``error`` (a ``Boom`` of the user's, a ZeroDivisionError), which passes
    through unchanged, as it would from the backward of an autograd.Function, rather than the trace (a read of a
    fake value, an op it cannot trace): an exception of a type PyTorch defines, a bare RuntimeError or
    NotImplementedError (what PyTorch's C++ raises), or one raised inside PyTorch's own Python is the trace's, and
    one raised in the library's is its refusal."""
    kind = type(error)
    if kind in (RuntimeError, NotImplementedError) or kind.__module__.split(".")[0] == "torch":
        return False
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is None or not frame.tb_frame.f_code.co_filename.startswith(_NOT_THE_VJPS)


def falls_back_on(error: Exception) -> bool:
    """Whether a call that can fall back (``stopgrad_math.torch.Function``) hands ``error`` to PyTorch's mechanism:
    a VJP the decorator cannot embed, or one that raised an exception of its own, which the Function's backward
    then raises where PyTorch calls it (in the backward pass, if one runs)."""
    return isinstance(error, NotEmbeddable) or raised_by_the_vjp(error)


def fall_back_reason(f: Callable[..., Any], error: Exception) -> str:
    if isinstance(error, NotEmbeddable):
        return str(error)
    return (f"The vjp of {name_of(f)} raised {type(error).__name__} ({error}) when the decorator ran it to prove it "
            "linear: PyTorch's mechanism runs it in the backward pass instead.")


def untraceable(f: Callable[..., Any], error: Exception, where: str, vjp: Any = None) -> NotEmbeddable:
    """What make_fx raised on a VJP it traced (a value read, a wrapped tensor, a compiled function, a sparse tensor),
    said as what to change: ``where`` is "eagerly", where only the cotangent is fake, "under torch.func", where the
    tensors the VJP closes over are lifted out, or "under torch.compile", where ``vjp`` is the one the proof's trace
    of f made (elsewhere ``tracing.traced_vjp`` has refused a sparse tensor before tracing)."""
    sparse = vjp_closure.sparse_read(vjp)
    if sparse is not None:
        return sparse_refusal(f, sparse)
    if "dynamo-optimized" in str(error):
        return NotEmbeddable(f"The vjp of {name_of(f)} calls a function compiled with torch.compile, which the "
                             "decorator cannot trace into ATen ops to prove it linear: call the function uncompiled "
                             "inside the vjp, and compile the caller of the decorated function instead.")
    advice = ("it may not read a tensor's value in Python, nor index with a boolean mask (write the choice with "
              "torch.where)")
    if where == "eagerly":
        advice = ("it may not read its cotangent's value in Python (item, float, int, bool, tolist, numpy, or a "
                  "branch on a tensor computed from it): a VJP is linear in the cotangent, so no value of it "
                  "can choose the map (write a choice with torch.where on what it closes over). Eagerly it may "
                  "read the values of the tensors it closes over")
    if where == "under torch.func":
        advice += (", nor a tensor held by an object or a global (close over the tensor itself), since the tensors "
                   "it closes over are lifted out")
    first_line = str(error).splitlines()[0] if str(error) else ""
    return NotEmbeddable(f"The vjp of {name_of(f)} cannot be traced {where} ({type(error).__name__}: {first_line}). "
                         f"There the decorator traces it by shapes alone: {advice}.")


_NO_DERIVATIVE = re.compile(r"derivative for (?:aten::)?(\w+) is not implemented")


def without_derivative(error: RuntimeError, name: str) -> str | None:
    """Why J·v cannot be formed, where forming it (autodiff of the VJP in its cotangent) met a backward op of
    ``linear_ops``' table (linear in its upstream, so the VJP is proven) whose own derivative PyTorch does not
    implement (hardsigmoid_backward, the CPU flash attention's backward): reverse mode needs the VJP alone, and
    gets it; forward mode raises this. None for any other error."""
    found = _NO_DERIVATIVE.search(str(error))
    if found is None or found.group(1) not in linear_ops.RULES:
        return None
    return (f"The vjp of {name} runs aten::{found.group(1)}, which is linear in its upstream gradient but has no "
            "derivative in PyTorch: reverse mode runs the vjp itself, as a torch.autograd.Function would, and "
            "forward mode (J·v, the vjp's transpose, its derivative in the cotangent) cannot be formed. "
            f"PyTorch's error: {error}")


BRANCH_ON_A_FLOAT = (
    "{name} or its vjp branches on the value of a Python float argument that torch.compile keeps as a symbol (it "
    "changed between calls), and took another branch at the value the decorator proves for any float than it "
    "takes at this call's. Pass the float as a tensor, or have Dynamo specialize floats "
    "(torch._dynamo.config.specialize_float = True), as it did before the value changed.")


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def refuse(message: str) -> None:
    """Raises NotEmbeddable while Dynamo compiles, as a proof does: Dynamo runs this as it traces, so that the error
    leaves the compilation as it is (raised in the code Dynamo traces, it would be a graph break, and the call run
    again in pieces)."""
    raise NotEmbeddable(message)
