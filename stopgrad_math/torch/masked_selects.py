"""A select's discarded elements stay zero through the transpose: the guarded division's rule in every mode.

A VJP that guards a division selects after it, ``torch.where(r > 0, g / r, 0)``:
where ``r`` is 0 the quotient is ``0 / 0`` or ``g / 0`` and ``where`` throws it
away. Forward mode differentiates the VJP's map transposed (J·v, by
``torch.func.vjp`` of it), which runs its ops backwards: ``where``'s first,
which puts a zero where it discarded, then the division's, ``0 / 0``: NaN,
where the declared Jacobian's element is 0 (the "where NaN trap"; here the
user's code avoided it and the transpose made it).

``masked`` applies each ``where`` that carries the cotangent to the inputs
of the elementwise linear ops that make the case it keeps (``mul``, ``div``,
``neg``, a conversion, a sum, each read only there) as well: the same values,
bit for bit (where it keeps an element, it keeps it from the input; where it
discards it, it discards it again), and a transpose that selects after each
of those ops, so a discarded element is +0.0 in J·v whatever the op computes
there. A division's divisor, which the cotangent does not carry, is given 1
where the quotient is discarded (the "double where"): at order 2 a second
derivative differentiates the VJP through the divisor, ``−g / r²`` at
``r = 0``, and the discarded element's share of it is then 0, as the
mechanism's double backward gives it. The JAX namespace's ``masked_selects``
is the same rule on a jaxpr.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from stopgrad_math.torch.linear_ops import op_name

_WHERE = torch.ops.aten.where.self
_ELEMENTWISE = frozenset({"mul", "div", "neg", "_to_copy", "add", "sub"})
"""Elementwise ops linear in an operand that carries the cotangent: masking that operand where their result is
discarded changes no value the select keeps."""


@dataclasses.dataclass(frozen=True)
class _Mask:
    """Operand ``operand`` of ``node`` kept where ``condition`` is ``kept_where``, ``fill`` elsewhere (0 for what
    carries the cotangent, 1 for a divisor)."""

    node: fx.Node
    operand: int
    condition: fx.Node
    kept_where: bool
    fill: float = 0.0


def masked(graph: fx.Graph, cotangents: int) -> list[_Mask]:
    """The masks to apply (``apply``) to a VJP's graph whose first ``cotangents`` placeholders are the cotangent:
    none where no ``where`` discards what an elementwise op computed from it."""
    walk = _Walk(graph, cotangents)
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not _WHERE or node not in walk.carrying:
            continue
        condition, *cases = node.args
        shape = _shape(node)
        if not isinstance(condition, fx.Node) or shape is None:
            continue
        for kept_where, case in zip((True, False), cases, strict=True):
            if isinstance(case, fx.Node) and case in walk.carrying:
                walk.push(case, condition, kept_where, shape)
    return walk.masks


class _Walk:
    """A graph's nodes in order, those that carry the cotangent, and the masks found (``push``)."""

    def __init__(self, graph: fx.Graph, cotangents: int):
        self.order = {node: k for k, node in enumerate(graph.nodes)}
        self.carrying = set([node for node in graph.nodes if node.op == "placeholder"][:cotangents])
        for node in graph.nodes:
            if node.op == "call_function" and any(n in self.carrying for n in node.all_input_nodes):
                self.carrying.add(node)
        self.masks: list[_Mask] = []

    def push(self, node: fx.Node, condition: fx.Node, kept_where: bool, shape: torch.Size) -> None:
        """Masks the operands of ``node`` that carry the cotangent, and theirs in turn, where ``node`` is an
        elementwise op read once, after the condition is computed; and a division's divisor of the same shape."""
        name = op_name(node.target) if node.op == "call_function" else None
        if name not in _ELEMENTWISE or len(node.users) != 1 or self.order[condition] >= self.order[node]:
            return
        for operand, value in enumerate(node.args):
            if not isinstance(value, fx.Node) or _shape(value) != shape:
                continue
            if value in self.carrying:
                self.masks.append(_Mask(node, operand, condition, kept_where))
                self.push(value, condition, kept_where, shape)
            elif name == "div" and operand == 1:
                self.masks.append(_Mask(node, operand, condition, kept_where, fill=1.0))


def apply(graph: fx.Graph, masks: list[_Mask], by_name: dict[str, fx.Node]) -> None:
    """Each mask's operand replaced by ``where(condition, operand, fill)`` (or the other way round), in place, in a
    copy of the graph the masks were found in (``by_name``: its nodes by name)."""
    for mask in masks:
        node, condition = by_name[mask.node.name], by_name[mask.condition.name]
        value = node.args[mask.operand]
        with graph.inserting_before(node):
            filled = graph.call_function(torch.ops.aten.full_like.default, (value, mask.fill))
            cases = (value, filled) if mask.kept_where else (filled, value)
            node.update_arg(mask.operand, graph.call_function(_WHERE, (condition, *cases)))


def _shape(node: fx.Node) -> torch.Size | None:
    value = node.meta.get("val")
    return value.shape if isinstance(value, torch.Tensor) else None
