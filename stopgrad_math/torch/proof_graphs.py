"""A proven VJP's map and its transpose as two graphs of ATen ops, made once and run at each call.

``maps`` makes them from a VJP traced as a backward runs: the map from y's
cotangents to the arguments', and its transpose J·v, the pullback of
torch.func.vjp of that map, traced once more so that a call runs its ops
alone. Kept proofs (``kept_proofs``) and compiled calls (``compiled_graphs``)
run the same graphs. Where PyTorch cannot differentiate an op of the VJP,
the transpose cannot be formed and ``maps_or_reason`` says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from stopgrad_math.torch import (
    aten_graphs,
    linear_ops,
    refusals,
)


def with_numbers(tensors: list[torch.Tensor], numbers: tuple[tuple[int, Any], ...]) -> list[Any]:
    """The tensors with each number put back at its position among the values a graph takes."""
    given: list[Any] = list(tensors)
    for k, number in numbers:
        given.insert(k, number)
    return given


def maps_or_reason(traced: aten_graphs.Traced, positions: list[int], kept_examples: list[torch.Tensor],
                   examples: list[torch.Tensor], count: int, outside: list[int],
                   name: str) -> tuple[tuple[torch.fx.GraphModule, ...], str | None]:
    """``maps``, and None; or, where the transpose cannot be formed (``refusals.without_derivative``), the map with
    zeros in the transpose's shapes, and why."""
    try:
        return maps(traced, positions, kept_examples, examples, count, outside), None
    except RuntimeError as error:
        reason = refusals.without_derivative(error, name)
        if reason is None:
            raise
        return maps(traced, positions, kept_examples, examples, count, outside, transposable=False), reason


def transposable(traced: aten_graphs.Traced, positions: list[int], kept_examples: list[torch.Tensor],
                 examples: list[torch.Tensor], count: int, name: str) -> bool:
    """False where the VJP runs a layer's backward op (``linear_ops``' table) whose derivative PyTorch does not
    implement, so that J·v cannot be formed (``refusals.without_derivative``); a VJP of no such op is not traced
    again."""
    if not any(op in linear_ops.LAYER_BACKWARDS for op in traced.recorded):
        return True
    outside = [k for k in range(len(traced.constants)) if k not in traced.literals]
    return maps_or_reason(traced, positions, kept_examples, examples, count, outside, name)[1] is None


def maps(traced: aten_graphs.Traced, positions: list[int], kept_examples: list[torch.Tensor],
         examples: list[torch.Tensor], count: int, outside: list[int],
         transposable: bool = True) -> tuple[torch.fx.GraphModule, ...]:
    """Two graphs of ATen ops from a VJP traced as a backward runs on ``examples`` (the ``count`` cotangents of y,
    then the tensors of f's arguments), whose own constants are one-element literals but for those at
    ``outside`` (tensors read from outside, which become their last inputs): the VJP's map from y's cotangents to
    those of the argument leaves at ``positions`` among the traced outputs, and its transpose, J·v, from v in
    those leaves' shapes (``kept_examples``); each takes the tensors after its first inputs."""
    numbers = {k: (c.item(), c.shape, c.dtype, c.device) for k, c in enumerate(traced.constants) if k not in outside}
    arguments = len(examples) - count

    def constants(given: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """f's argument tensors, then the graph's constants: an outside tensor as given, a literal made by ops (a
        tensor constant would be real under Dynamo)"""
        read = iter(given[arguments:])
        return [*given[:arguments], *(next(read) if k in outside else torch.full(
            numbers[k][1], numbers[k][0], dtype=numbers[k][2], device=numbers[k][3])
            for k in range(len(traced.constants)))]

    def vjp_map(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:  # (its stops recorded as stops)
        return tuple(aten_graphs.stops_recorded(traced.linear(constants(values[count:]), positions))(
            *values[:count]))

    def transposed(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        linear = aten_graphs.stops_recorded(traced.linear(constants(values[len(positions):]), positions))
        cotangents = [torch.zeros(e.shape, dtype=e.dtype, device=e.device) for e in examples[:count]]
        if not transposable:  # (its shapes alone: ``compiled_graphs._KeyedMaps.zeros``)
            return tuple(cotangents)
        return tuple(torch.func.vjp(linear, *cotangents)[1](list(values[:len(positions)])))

    read = [traced.constants[k].detach() for k in outside]
    with aten_graphs.exclusive():
        vjp_module = aten_graphs.make_fx(vjp_map, tracing_mode="fake", _allow_non_fake_inputs=True,
                                         decomposition_table=aten_graphs.compiled_decompositions())(*examples, *read)
        # v's stand-ins made anew: make_fx binds its inputs by identity, and a kept leaf's example may be among
        # the examples
        transpose_module = aten_graphs.make_fx(transposed, tracing_mode="fake", _allow_non_fake_inputs=True,
                                               decomposition_table=aten_graphs.compiled_decompositions())(
            *[torch.empty_like(e) for e in kept_examples], *examples[count:], *read)
        for module in (vjp_module, transpose_module):  # the pullback's primal computation is dead
            aten_graphs.runnable(module)  # (first: its stops' markers are dead too)
            module.graph.eliminate_dead_code()
            module.recompile()
    return vjp_module, transpose_module
