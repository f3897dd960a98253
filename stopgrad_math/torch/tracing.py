"""The PyTorch decorator's second stage: the VJP traced into a graph of ATen ops and proven linear.

``Cotangents`` reads the VJP leaf by leaf, as a function of y's cotangents.
``traced_vjp`` traces it as PyTorch runs a backward (``aten_graphs.trace``):
eagerly on fake cotangents and the real tensors it closes over, and under a
torch.func transform outside the transform, on stand-ins of the tensors it
closes over (lifted out by ``vjp_closure``). ``proven_states`` reads the
graph's states (``linear_ops``) into the argument leaves whose cotangent is
linear, or raises naming the op. A trace while Dynamo compiles is
``compiled_proof``'s.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

from stopgrad_math.shared import linearity, nesting
from stopgrad_math.shared.arguments import name_of
from stopgrad_math.shared.linearity import Judged
from stopgrad_math.torch import (
    aten_graphs,
    refusals,
    second_derivative_guard,
    vjp_closure,
)
from stopgrad_math.torch.vjp_conventions import Leaves, answer_of, argument_cotangents, stand_in

Linear = Callable[..., list[torch.Tensor]]


def zeros_like(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in tensors]


class Cotangents:
    """The VJP as a function of the cotangents of y's differentiable leaves, giving the cotangents of the
    argument leaves it answers for (``found``, by leaf index), in that order."""

    def __init__(self, f: Callable[..., Any], names: list[str], leaves: Leaves, outputs: Leaves, order: int):
        self.f, self.names, self.leaves, self.outputs, self.order = f, names, leaves, outputs, order
        self.found: list[int] = []

    def examples(self) -> list[torch.Tensor]:
        """Zeros of the cotangents of y's differentiable leaves: what a trace of the VJP or a pullback is given."""
        return zeros_like(self.outputs.tensors())

    def described(self) -> Callable[[], Cotangents]:
        """A maker of the same reading with each tensor leaf a plain stand-in of its shape and dtype: what a
        trace outside a torch.func transform may touch (a wrapper of the transform, there, may not be)."""
        leaves, outputs = self.leaves.described(), self.outputs.described()
        return lambda: Cotangents(self.f, self.names, leaves(), outputs(), self.order)

    def warn_if_none_found(self) -> None:
        """After a trace of the VJP: a warning (once per f and message, Python's default filter) where it returned
        None for every argument of a call whose arguments require grad."""
        if not self.found and any(getattr(self.leaves.values[k], "requires_grad", False)
                                  for k in self.leaves.differentiable):
            warnings.warn(refusals.EVERY_COTANGENT_NONE.format(name=name_of(self.f)), stacklevel=5)

    def of(self, vjp: Callable[[Any], Any], kept: list[int] | None = None) -> Callable[..., list[torch.Tensor]]:
        """``vjp`` read leaf by leaf; ``kept``: the argument leaves (by index) to return, by default all found."""
        args = tuple(self.leaves.with_values({}))

        def cotangents(*cts: torch.Tensor) -> list[torch.Tensor]:
            by_leaf = self.answered(vjp, cts, args)
            return list(by_leaf.values()) if kept is None else [by_leaf[k] for k in kept]

        return cotangents

    def answered(self, vjp: Callable[[Any], Any], cts: Sequence[torch.Tensor],
                 args: tuple[Any, ...] | None = None) -> dict[int, torch.Tensor]:
        """vjp's cotangent of each argument leaf it answers for (by leaf index; ``found`` is set), given those of
        y's differentiable leaves; ``args``: the arguments, where they are at hand."""
        outputs = self.outputs
        given = outputs.with_values({**dict.fromkeys(range(len(outputs.values))),  # (None where not differentiable)
                                     **dict(zip(outputs.differentiable, cts, strict=True))})
        with nesting.evaluating(self.order):
            answer = answer_of(vjp, given, self.f)
        by_leaf = argument_cotangents(answer, tuple(self.leaves.with_values({})) if args is None else args,
                                      self.leaves, self.names, self.f)
        self.found = list(by_leaf)
        return by_leaf


def traced_vjp(cotangents: Cotangents, vjp: Callable[[Any], Any]) -> aten_graphs.Traced:
    """The VJP as an ATen graph, traced as PyTorch runs a backward (``aten_graphs.trace``). Outside torch.func it
    is traced as it is, on fake cotangents and the real tensors it closes over, which it may read; under a
    transform those are the transform's wrappers, so they are lifted out (the graph's first constants) and it
    is traced outside the transform on fake stand-ins of their shapes (a VJP that reads a tensor's value in
    Python then raises)."""
    sparse = vjp_closure.sparse_read(vjp)
    if sparse is not None:
        raise refusals.sparse_refusal(cotangents.f, sparse)
    if second_derivative_guard.in_transform():
        return _traced_under_transform(cotangents, vjp)
    try:
        traced = aten_graphs.trace(cotangents.of(vjp), *cotangents.examples())
    except (ValueError, TypeError, LookupError):
        raise
    except Exception as error:  # what make_fx raises on a read of the cotangent, or on what it cannot trace
        if refusals.raised_by_the_vjp(error):
            raise
        raise refusals.untraceable(cotangents.f, error, "eagerly") from error
    cotangents.warn_if_none_found()
    return traced


def _traced_under_transform(cotangents: Cotangents, vjp: Callable[[Any], Any]) -> aten_graphs.Traced:
    """``traced_vjp`` under a torch.func transform: by shapes alone, outside it, its closed-over tensors lifted out."""
    name = name_of(cotangents.f)
    examples = cotangents.examples()
    lifted = vjp_closure.lifted(vjp)
    if lifted is None:
        raise ValueError(f"The vjp of {name} is a {type(vjp).__name__}, not a function: under torch.func the "
                         "decorator traces a vjp with the tensors it closes over lifted out, which only a plain "
                         "function (a def or a lambda) allows.")
    if lifted.pytorchs:
        raise ValueError(
            f"The vjp of {name} closes over a function of PyTorch's that holds tensors ({lifted.pytorchs[0]}: "
            "torch.func.vjp's pullback, which runs the graph recorded when f ran). Under torch.func the decorator "
            "traces the vjp outside the transform, on stand-ins of the tensors it closes over, and a stand-in "
            "carries no recorded graph. Recompute inside the vjp, as checkpointing does: lambda ct: "
            "torch.func.vjp(block, x)[1](ct)[0].")
    makers = [stand_in(t) for t in [*examples, *lifted.tensors]]  # shapes read inside the transform
    describe = cotangents.described()
    with temporarily_clear_interpreter_stack():
        try:
            traced = traced_by_shapes(cotangents, describe, lifted.rebuild, [make() for make in makers],
                                      len(examples))
        except (ValueError, TypeError, LookupError):
            raise
        except Exception as error:  # what make_fx raises on a value read or a wrapped tensor
            if refusals.raised_by_the_vjp(error):
                raise
            raise refusals.untraceable(cotangents.f, error, "under torch.func") from error
    cotangents.warn_if_none_found()
    count = len(examples)  # the cotangents' placeholders, then the lifted tensors'
    batched = {count + k for k, t in enumerate(lifted.tensors) if batched_by_vmap(t)}
    masked = aten_graphs.boolean_mask_op(traced.graph, batched) if batched else None
    if masked is not None:
        raise ValueError(f"The vjp of {name} indexes with a boolean mask ({masked}: g[mask] = 0, g[mask], nonzero) "
                         "computed from a tensor vmap batches, whose shape then depends on the mask's values, so "
                         "vmap cannot batch it. Write the choice with torch.where (g = torch.where(mask, 0, g)), "
                         "which every transform batches.")
    return dataclasses.replace(traced, constants=[*lifted.tensors, *traced.constants])


def batched_by_vmap(tensor: torch.Tensor) -> bool:
    """Whether the tensor is batched by a torch.func vmap, at any level of its wrappers (a float is not)."""
    if not isinstance(tensor, torch.Tensor):
        return False
    while is_functorch_wrapped_tensor(tensor):
        if is_batchedtensor(tensor):
            return True
        tensor = get_unwrapped(tensor)
    return False


def traced_by_shapes(cotangents: Cotangents, describe: Callable[[], Cotangents],
                     rebuild: Callable[[list[torch.Tensor]], Any], stand_ins: list[torch.Tensor],
                     count: int) -> aten_graphs.Traced:
    """The VJP traced on fake tensors: ``stand_ins`` of the ``count`` cotangents of y, then of the tensors it
    closes over (``rebuild``: the VJP closing over others in place of its own), with y and the arguments as
    ``describe`` makes them: a graph of shapes alone, in which a read of any value raises. Its constants are its
    own (the literals it makes); ``cotangents.found`` is set."""
    described = describe()

    def rebuilt(*values: torch.Tensor) -> list[torch.Tensor]:
        return described.of(rebuild(list(values[count:])))(*values[:count])

    traced = aten_graphs.trace(rebuilt, *stand_ins, cotangents=count, fake=True)
    cotangents.found = described.found
    return traced


def proven_states(cotangents: Cotangents, states: list[Judged]) -> list[int]:
    """The argument leaves (by index) whose cotangent is linear in the cotangent of y, from the states of the
    traced VJP's outputs; ValueError naming the op or the leaf where it is not linear."""
    f, leaves = cotangents.f, cotangents.leaves
    return [k for k, state in zip(cotangents.found, states, strict=True)
            if linearity.kept(state, name_of(f), leaves.labels[k], leaves.values[k], k in leaves.differentiable,
                              "stopgrad_math.torch.linear_ops")]
