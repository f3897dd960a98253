"""The graphs a compiled call runs: a proof's map and transpose registered under a key, called from compiled code.

A compiled call cannot hold a graph module as a constant, so each proof made
while Dynamo traces (``compiled_proof``) registers its two graphs in
``COMPILED`` under a key, and the compiled code calls ``run_compiled`` or,
at order 2, ``run_mapped_zero``, which Dynamo keeps as calls and AOTAutograd
traces and differentiates.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from stopgrad_math.torch import (
    aten_graphs,
    identity,
    proof_graphs,
    second_derivative_guard,
)

COMPILED: dict[int, torch.fx.GraphModule] = {}
"""The maps compiled calls run (``run_compiled``), by key: two for each compilation of a decorated call, kept as
long as the compiled code that calls them (which Dynamo keeps, bounded by its recompile limit, until
``torch._dynamo.reset()``: ``compiled_proof._forget_what_dynamo_forgot``)."""
_KEYS = itertools.count(0, 2)  # (next() of a count is atomic: two threads compiling at once get two keys)
NAMES: dict[int, str] = {}  # the decorated function's name at each key of ``COMPILED``, for its messages
WITHOUT_TRANSPOSE: dict[int, str] = {}  # why J·v cannot be formed (``refusals.without_derivative``), at such a key


def registered(traced: aten_graphs.Traced, positions: list[int], kept_examples: list[torch.Tensor],
               examples: list[torch.Tensor], count: int, outside: list[int], name: str) -> int:
    """Keys of the two graphs ``proof_graphs.maps`` makes for a compiled call, from f and its VJP traced as a backward
    runs, with the tensors of f's arguments and then those it reads from outside as their last inputs: at ``key`` the
    VJP's map, at ``key + 1`` its transpose. Inside the compiled graph AOTAutograd differentiates their ops, so a VJP
    under no_grad or with a branch on grad mode is embedded as the map a backward applies, as it is eagerly. Where the
    transpose cannot be formed (``refusals.without_derivative``), ``key + 1`` gives zeros in its shapes and
    ``WITHOUT_TRANSPOSE`` says why: the call embeds the map alone (``compiled_proof._REVERSE_ONLY``)."""
    key = next(_KEYS)
    (COMPILED[key], COMPILED[key + 1]), reason = proof_graphs.maps_or_reason(traced, positions, kept_examples, examples,
                                                                             count, outside, name)
    if reason is not None:
        WITHOUT_TRANSPOSE[key] = reason
    SHAPES[key] = _unchecked(COMPILED[key + 1])
    return key


SHAPES: dict[int, torch.fx.GraphModule] = {}
"""At each key of ``COMPILED``, J·v's graph without its checks of errors (``_unchecked``): what the zero terms'
shapes are read from."""

_CHECKS = frozenset({torch.ops.aten._linalg_check_errors.default})


def _unchecked(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph without its checks of errors (a solve's, which raises on a singular matrix): ops with
    side effects, which keep the op they check alive where its result is read for its shape alone. The J·v that
    zero terms are made from is dead (``_KeyedMaps.zeros``), and the compiler drops it only where nothing in it
    has an effect: a custom root's J·v was two more solves at every compiled step. The checks stay where J·v is
    used (``_KeyedMaps.transposed``) and in f's own ops."""
    if not any(node.target in _CHECKS for node in graph.graph.nodes):
        return graph
    unchecked = copy.deepcopy(graph)
    for node in [node for node in unchecked.graph.nodes if node.target in _CHECKS]:
        unchecked.graph.erase_node(node)
    unchecked.recompile()
    return unchecked


@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def run_compiled(key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A map ``registered`` made, in a compiled graph: Dynamo keeps the call, and AOTAutograd traces its ATen ops
    and differentiates them."""
    return tuple(COMPILED[key](*tensors))


@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def guarded_at_order_1(refusal: str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The arguments of a compiled call embedded at order 1, which holds J constant in them, as they are: a
    LookupError saying ``refusal`` where more than one derivative is taken of them. Dynamo shows no torch.func
    transform to the code it traces, so the guard of an eager call cannot run there; AOTAutograd runs this call
    as it traces, inside the transforms (a compiled ``torch.func.hessian`` gave 0 silently before)."""
    if second_derivative_guard.derivatives_taken(tensors) > 1:
        raise LookupError(refusal)
    return tuple(t.view_as(t) for t in tensors)


@dataclasses.dataclass(frozen=True)
class Registered:
    """The graphs registered at ``key`` for a compiled call at order 2 (or one whose J·v cannot be formed, at order
    1: ``compiled_proof._REVERSE_ONLY``), and the tensors they read after their first
    inputs (f's arguments as they are, then those read from outside)."""

    key: int
    given: list[torch.Tensor]

    def __call__(self, *cts: torch.Tensor) -> list[torch.Tensor]:
        return list(run_compiled(self.key, *cts, *self.given))


@dataclasses.dataclass(frozen=True)
class _KeyedMaps:
    """``identity.mapped_zero``'s maps from the graphs at ``key``, inside a compiled graph (``run_mapped_zero``);
    ``numbers``: the Python numbers among the graphs' inputs, by position, which a Function carries beside its
    tensor inputs."""

    key: int
    numbers: tuple[tuple[int, Any], ...] = ()

    def zeros(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros_like(p) for p in SHAPES[self.key](*vs, *self._with_numbers(constants))]  # (dead J·v:
        # DCE'd)

    def linear(self, cts: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(COMPILED[self.key](*cts, *self._with_numbers(constants)))

    def transposed(self, vs: Sequence[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
        second_derivative_guard.check_forward_over_forward(NAMES.get(self.key, "f"))
        if self.key in WITHOUT_TRANSPOSE:
            raise RuntimeError(WITHOUT_TRANSPOSE[self.key])
        return list(COMPILED[self.key + 1](*vs, *self._with_numbers(constants)))

    def _with_numbers(self, tensors: list[torch.Tensor]) -> list[Any]:
        return proof_graphs.with_numbers(tensors, self.numbers)


@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def run_mapped_zero(key: int, count: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``identity.mapped_zero`` of the graphs at ``key`` on the ``count`` zeros v and then the tensors they read,
    in a compiled graph: Dynamo keeps the call (it traces no Function with a jvp), and AOTAutograd traces the
    Function and its derivatives in every mode."""
    constants = tensors[count:]
    numbers = tuple((k, c) for k, c in enumerate(constants) if not isinstance(c, torch.Tensor))
    return tuple(identity.mapped_zero(_KeyedMaps(key, numbers), list(tensors[:count]),
                                      [c for c in constants if isinstance(c, torch.Tensor)]))
