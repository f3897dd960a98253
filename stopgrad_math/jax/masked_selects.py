"""A select's discarded elements stay zero through the transpose: the guarded division's rule in every mode.

A VJP that guards a division selects after it, ``where(r > 0, g / r, 0)``: where
``r`` is 0 the quotient is ``0 / 0`` or ``g / 0`` and the select throws it away.
``jax.linear_transpose`` of that map (J·v, forward mode's product) runs the
same ops backwards: the select's transpose first, which puts a zero where the
select discarded, then the division's, ``0 / 0``: NaN, where the declared
Jacobian's element is 0 (JAX's FAQ calls this the "where NaN trap"; here the
user's code avoided it and the transpose made it).

``masked`` finds each case of a ``select_n`` that carries the cotangent and
the elementwise linear ops that produce it alone (``mul``, ``div``, ``neg``, a
conversion, a sum), through ``jit`` calls, and ``Masked`` runs the map with
the same select applied to those ops' inputs too: the same values, bit for
bit (where the select keeps an element, it keeps it from the input; where it
discards it, it discards it again), and a transpose that selects after each
of those ops, so a discarded element is +0.0 in J·v whatever the op computes
there (inf, NaN, a division by zero). A division's divisor, which the
cotangent does not carry, is given 1 where the quotient is discarded (the
"double where"): at order 2 reverse over reverse differentiates the VJP
through the divisor, ``−g / r²`` at ``r = 0``, and the discarded element's
share of it is then 0, as forward over reverse gives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

from jax import lax
from jax.extend import core

_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})
"""Calls whose bodies are run inline, so that a select inside ``jnp.where`` (a jit call) is seen with what
produces its operands."""

_ELEMENTWISE = frozenset({"mul", "div", "neg", "convert_element_type", "add", "sub", "add_any"})
"""Elementwise ops linear in an operand that carries the cotangent: masking that operand where their result is
discarded changes no value the select keeps."""


@dataclasses.dataclass(frozen=True)
class _Mask:
    """Keep case ``case`` of a ``select_n`` of ``count`` cases by ``predicate`` (a node), ``fill`` elsewhere (0 for
    what carries the cotangent, 1 for a divisor)."""

    predicate: object
    case: int
    count: int
    fill: float = 0.0
    broadcast: Any = None  # the ``broadcast_in_dim`` that made the select's predicate from ``predicate``, or None


@dataclasses.dataclass
class _Step:
    """One op of the inlined map: its equation, and the nodes it reads (or literals) and writes."""

    eqn: Any
    reads: list[Any]
    writes: list[object]


class Masked:
    """The map of a jaxpr run op by op, jit calls inline, each masked operand selected as its select selects."""

    def __init__(self, steps: list[_Step], constants: list[object], inputs: list[object], outputs: list[Any],
                 masks: dict[int, dict[int, _Mask]]):
        self.steps, self.constants, self.inputs, self.outputs, self.masks = steps, constants, inputs, outputs, masks

    def __call__(self, consts: Sequence[Any], *args: Any) -> list[Any]:
        values: dict[object, Any] = dict(zip(self.constants, consts, strict=True))
        values.update(zip(self.inputs, args, strict=True))

        def read(atom: Any) -> Any:
            return atom.val if isinstance(atom, core.Literal) else values[atom]

        for k, step in enumerate(self.steps):
            operands = [read(atom) for atom in step.reads]
            for j, mask in self.masks.get(k, {}).items():
                predicate = values[mask.predicate]
                if mask.broadcast is not None:  # (the select's own predicate is made later: made again here)
                    predicate = _bound(mask.broadcast, [predicate])[0]
                operands[j] = _selected(predicate, mask, operands[j])
            results = _bound(step.eqn, operands)
            values.update(zip(step.writes, results, strict=True))
        return [read(atom) for atom in self.outputs]


def _selected(predicate: Any, mask: _Mask, value: Any) -> Any:
    filled = lax.full_like(value, mask.fill)
    return lax.select_n(predicate, *[value if j == mask.case else filled for j in range(mask.count)])


def _bound(eqn: Any, operands: list[Any]) -> list[Any]:
    """The equation's primitive bound to the operands, as ``eval_jaxpr`` binds it (JAX before 0.5 gives bind
    parameters with the sub-functions apart)."""
    given = eqn.primitive.get_bind_params(eqn.params)
    functions, params = given if isinstance(given, tuple) else ((), given)
    manager = getattr(getattr(eqn, "ctx", None), "manager", None) or contextlib.nullcontext()
    with manager:
        result = eqn.primitive.bind(*functions, *operands, **params)
    return list(result) if eqn.primitive.multiple_results else [result]


def masked(closed: Any) -> Masked | None:
    """The map of ``closed`` (a ClosedJaxpr whose inputs are the cotangents) with its selects' cases masked at
    their sources, or None where no select discards what an elementwise op computed from the cotangent."""
    jaxpr = closed.jaxpr
    steps: list[_Step] = []
    constants = [object() for _ in jaxpr.constvars]
    inputs = [object() for _ in jaxpr.invars]
    outputs = _inlined(jaxpr, dict(zip(jaxpr.constvars, constants, strict=True)) | dict(
        zip(jaxpr.invars, inputs, strict=True)), steps)
    given = dict(zip(constants, jaxpr.constvars, strict=True)) | dict(zip(inputs, jaxpr.invars, strict=True))
    masks = _masks(steps, set(inputs), outputs, {node: _shape(var.aval) for node, var in given.items()})
    return Masked(steps, constants, inputs, outputs, masks) if masks else None


def _shape(aval: Any) -> tuple[tuple[int, ...], bool]:
    """An aval's shape, and whether it varies over a manual axis of shard_map (where a select of new zeros would
    need them varied too: such a select is left as it is)."""
    return tuple(aval.shape), bool(getattr(aval, "vma", None))


def _inlined(jaxpr: Any, nodes: dict[Any, Any], steps: list[_Step]) -> list[Any]:
    """The jaxpr's steps appended to ``steps``, its variables as the nodes ``nodes`` gives (new ones made for what
    it computes), jit calls inline; returns the nodes (or literals) of its outputs."""
    def node(atom: Any) -> Any:
        return atom if isinstance(atom, core.Literal) else nodes[atom]

    for eqn in jaxpr.eqns:
        reads = [node(atom) for atom in eqn.invars]
        body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")) if eqn.primitive.name in _CALLS else None
        if body is not None and hasattr(body, "consts") and not body.consts:
            inner = body.jaxpr
            written = _inlined(inner, dict(zip(inner.invars, reads, strict=True)), steps)
        else:
            written = [object() for _ in eqn.outvars]
            steps.append(_Step(eqn, reads, written))
        nodes.update(zip(eqn.outvars, written, strict=True))
    return [node(atom) for atom in jaxpr.outvars]


def _masks(steps: list[_Step], inputs: set[object], outputs: list[Any],
           shapes: dict[object, tuple[tuple[int, ...], bool]]) -> dict[int, dict[int, _Mask]]:
    """For each step, the operands to mask (by position): those carrying the cotangent into an elementwise op
    whose one use is, directly or through more such ops, a case of a select that carries the cotangent, whose
    predicate is computed before that op. ``shapes``: the constants' and inputs' (``_shape``)."""
    graph = _Graph(steps, inputs, outputs, shapes)
    for step in steps:
        if step.eqn.primitive.name != "select_n" or step.writes[0] not in graph.carrying:
            continue
        predicate, *cases = step.reads
        shape, varying = graph.shapes[step.writes[0]]
        if isinstance(predicate, core.Literal) or varying or graph.shapes[predicate][0] not in (shape, ()):
            continue
        for case, atom in enumerate(cases):
            if graph.carries(atom):
                graph.push(atom, graph.mask(predicate, case, len(cases)), shape)
    return graph.masks


class _Graph:
    """The inlined map's nodes: which carry the cotangent, which step makes each, how often each is read, their
    shapes; and the masks found (``push``)."""

    def __init__(self, steps: list[_Step], inputs: set[object], outputs: list[Any],
                 shapes: dict[object, tuple[tuple[int, ...], bool]]):
        self.steps, self.carrying, self.shapes = steps, set(inputs), dict(shapes)
        self.made: dict[object, int] = {}
        self.uses: dict[object, int] = {}
        for k, step in enumerate(steps):
            read = [atom for atom in step.reads if not isinstance(atom, core.Literal)]
            for atom in read:
                self.uses[atom] = self.uses.get(atom, 0) + 1
            if any(atom in self.carrying for atom in read):
                self.carrying.update(step.writes)
            for node, var in zip(step.writes, step.eqn.outvars, strict=True):
                self.made[node] = k
                self.shapes[node] = _shape(var.aval)
        for atom in outputs:  # (a result is read besides: never masked)
            if not isinstance(atom, core.Literal):
                self.uses[atom] = self.uses.get(atom, 0) + 2
        self.masks: dict[int, dict[int, _Mask]] = {}

    def mask(self, predicate: object, case: int, count: int) -> _Mask:
        """The mask of a select's case; where its predicate is broadcast from a smaller one (``jnp.where`` broadcasts
        a condition of one element a row after the quotient it selects is made), from that one and the
        broadcast, which the masked ops can then read before the select."""
        k = self.made.get(predicate)
        if k is None:
            return _Mask(predicate, case, count)
        step = self.steps[k]
        if step.eqn.primitive.name != "broadcast_in_dim" or len(step.reads) != 1 \
                or isinstance(step.reads[0], core.Literal):
            return _Mask(predicate, case, count)
        return _Mask(step.reads[0], case, count, broadcast=step.eqn)

    def carries(self, atom: Any) -> bool:
        return not isinstance(atom, core.Literal) and atom in self.carrying

    def push(self, node: object, mask: _Mask, shape: tuple[int, ...]) -> None:
        """Masks the operands of the op that makes ``node`` that carry the cotangent, and theirs in turn, where
        that op is elementwise, ``node`` is read once, and the predicate is known before it; and a division's
        divisor of the same shape."""
        k = self.made.get(node)
        if k is None or self.uses.get(node) != 1 or self.steps[k].eqn.primitive.name not in _ELEMENTWISE or \
                self.made.get(mask.predicate, -1) >= k:
            return
        for j, atom in enumerate(self.steps[k].reads):
            if isinstance(atom, core.Literal) or self.shapes.get(atom) != (shape, False):
                continue
            if self.carries(atom):
                self.masks.setdefault(k, {})[j] = mask
                self.push(atom, mask, shape)
            elif self.steps[k].eqn.primitive.name == "div" and j == 1:
                self.masks.setdefault(k, {})[j] = dataclasses.replace(mask, fill=1.0)
