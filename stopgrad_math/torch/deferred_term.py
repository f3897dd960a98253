"""The Function face's eager reverse-mode call: its backward run as it is, its proof made where a derivative needs it.

Plainly eager with no forward-mode level (``recorded_term.reverse_alone``), reverse mode is the only derivative that
can be taken of a call, and its first derivative is the VJP's own map: the proven graph is the VJP's ops. A
``stopgrad_math.torch.Function``'s call whose signature (``signature``: the arguments' and y's structure, kinds,
shapes and dtypes) was proven before, with every leaf the VJP answers for kept (``Call.admits``), makes no proof and
no key: its one node (``Call.attached``) runs the VJP on the cotangents, as ``torch.autograd.Function`` runs the
backward, so its first derivatives are PyTorch's bit for bit (where the ordinary ops' −Jᵀ(−ȳ) may give another sign
of a zero or a NaN: ``recorded_term``). The proof, kept by the VJP's full key (``kept_proofs``), is made in the
backward where it decides the result:

- with ``create_graph=True``, whose derivative is the embedding's: the proven graph on what the VJP closes over,
  live at order 2, stopped and guarded at order 1 (``second_derivative_guard.guarded``), as the call would have
  embedded it;
- where the VJP answers for other leaves than the signature's proof kept (its code or what it closes over changed):
  the proven graph's result, or, where it can no longer be embedded, an error naming why.

A decorated function's calls are not deferred: the decorator refuses at the call what it cannot embed, where a
Function runs as ``torch.autograd.Function``, whose reverse mode is the backward's too.
What the forward saved is saved by the node as the mechanism saves it: a change in place before the backward raises.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from stopgrad_math.shared import bounded_cache
from stopgrad_math.shared.arguments import BEYOND_ORDER, name_of
from stopgrad_math.torch import identity, second_derivative_guard, tracing, unrecorded
from stopgrad_math.torch.tracing import Linear
from stopgrad_math.torch.vjp_conventions import Leaves

Proof = tuple[list[int], Linear, list[torch.Tensor], Any, bool, int]  # ``decorator_form._proven_call``'s

SIGNATURES_KEPT = 256
_ADMITTED: bounded_cache.BoundedCache[tuple[int, ...]] = bounded_cache.BoundedCache(SIGNATURES_KEPT)
"""The signatures proven with every answered leaf kept, with those leaves: a later call of one defers its proof."""


def _leaf_key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return type(value), value.shape, value.dtype, value.device, value.requires_grad
    if type(value) is float:  # (a learning rate changing at every call: the VJP runs as it is whatever its value)
        return float
    return type(value), value


def signature(f: Callable[..., Any], order: int, leaves: Leaves, outputs: Leaves) -> Hashable | None:
    """What a call's first derivative depends on besides the VJP's code and what it closes over, which run as they
    are: f, the order, the structure and leaves of the arguments and of y; None where a leaf cannot be a key."""
    try:
        key = (f, order, leaves.structure_key(), tuple(map(_leaf_key, leaves.values)), outputs.structure_key(),
               tuple(map(_leaf_key, outputs.values)))
        hash(key)
    except TypeError:
        return None
    return key


class Call:
    """A call of the Function face in reverse mode alone: what its node needs to run the VJP, and to prove it."""

    def __init__(self, cotangents: tracing.Cotangents, vjp: Callable[[Any], Any], saved: list[torch.Tensor],
                 undifferentiable: str | None, prove: Callable[[], Proof | str]):
        self.cotangents, self.vjp, self.saved, self.prove = cotangents, vjp, saved, prove
        self.undifferentiable = undifferentiable  # (why f could not run at x: ``evaluation.evaluated``)
        self.key = signature(cotangents.f, cotangents.order, cotangents.leaves, cotangents.outputs)
        self.kept: tuple[int, ...] | None = None if self.key is None else _ADMITTED.get(self.key)

    def admits(self, kept: list[int]) -> bool:
        """Whether the proof made at this call lets later calls of its signature defer theirs: it keeps a leaf, and
        every leaf the VJP answered for (none proven zero, which the embedding drops and the VJP would give)."""
        found = self.cotangents.found
        if self.key is None or not kept or sorted(kept) != sorted(found):
            return False
        self.kept = tuple(kept)
        _ADMITTED.put(self.key, self.kept)
        return True

    def attached(self) -> Any:
        """y with each differentiable output through the node."""
        outputs, leaves = self.cotangents.outputs, self.cotangents.leaves
        ys = [outputs.values[k] for k in outputs.differentiable]
        xs = [leaves.values[k] for k in leaves.differentiable]
        saved = identity.saveable([t.detach() for t in self.saved])  # (aliases, of the same versions: the node
        # needs no edge to what computed them, which the VJP's own ops reach where a derivative of it is recorded)
        through = [y for y in ys if y.requires_grad]  # (y at stop(x), with autodiff's path to a weight f read)
        arguments = _storages(leaves.tensors())
        given = [None if y.requires_grad else torch.sub(y, 0.0) if _storages([y]) & arguments else y.detach()
                 for y in ys]  # (a new alias each, which the node returns; a copy of one that aliases an argument,
        # which the mechanism would return as a view of it)
        results = _Deferred.apply(self, given, len(through), len(xs), *through, *xs, *saved)  # type: ignore[no-untyped-call]
        return outputs.with_values(dict(zip(outputs.differentiable, results, strict=True)))

    def gradients(self, cotangents: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The cotangent of each differentiable argument leaf (None: no gradient): the VJP's own, where grad mode is
        off and it answers for the leaves the signature's proof kept; else the proven embedding's."""
        leaves = self.cotangents.leaves
        contiguous = [ct if ct.is_contiguous() else ct.contiguous() for ct in cotangents]  # (as the proof traced
        # them: a backward may read their strides)
        if not torch.is_grad_enabled():
            by_leaf = self.cotangents.answered(self.vjp, contiguous)
            if sorted(by_leaf) == sorted(self.kept or ()):
                return [by_leaf.get(k) for k in leaves.differentiable]
        by_leaf = self._proven(contiguous)
        return [by_leaf.get(k) for k in leaves.differentiable]

    def _proven(self, cotangents: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """The embedding's gradients by leaf, proven now: the map on what the VJP closes over, recorded where grad
        mode is on; at order 1 (the class's order, or a VJP that reads what f computed with grad mode off), what
        the VJP closes over stopped and each gradient guarded, so that a derivative of it raises."""
        proof = self.prove()
        name = name_of(self.cotangents.f)
        if isinstance(proof, str):
            raise RuntimeError(f"{name}'s backward, proven at an earlier call of this signature, cannot be embedded at "
                               f"this one ({proof}): its derivative would not be the class's. Call "
                               f"{name}.route(...) on these arguments for the route it takes.")
        kept, linear, closed_over, _, _, embedded_at = proof
        values = linear(*cotangents)
        if embedded_at == 2:
            return dict(zip(kept, values, strict=True))
        why = unrecorded.beyond(self.undifferentiable, embedded_at, self.cotangents.order) or BEYOND_ORDER[1]
        leaves = self.cotangents.leaves.values
        return {k: second_derivative_guard.guarded(g, second_derivative_guard.live_of(leaves[k], closed_over), name,
                                                   why)
                for k, g in zip(kept, values, strict=True)}


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    """The addresses of the tensors' storages (0 for one that has none to read: taken as shared)."""
    addresses = set()
    for t in tensors:
        try:
            addresses.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            addresses.add(0)
    return addresses


class _Deferred(torch.autograd.Function):
    """Each differentiable output, whose backward gives each argument leaf ``Call.gradients``: one that carries no
    path of autodiff's is returned as the alias given (a new tensor object, whose history the node sets: no copy of
    y's elements), one that does (``through``) as y − 0.0, its cotangent passed on to that path. What the forward
    saved is among the inputs, saved and given no derivative."""

    @staticmethod
    def forward(ctx: Any, call: Call, given: list[torch.Tensor | None], through: int, xs: int,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors[through + xs:])  # (as the mechanism saves them: a change in place raises)
        ctx.call, ctx.saved = call, len(tensors) - through - xs
        passed = iter(tensors[:through])
        results = tuple(torch.sub(next(passed), 0.0) if y is None else y for y in given)
        ctx.outputs = [(y.shape, y.dtype, y.device) for y in results]
        ctx.passed = [y is None for y in given]
        return results

    @staticmethod
    def backward(ctx: Any, *cotangents: torch.Tensor | None) -> tuple[Any, ...]:
        ctx.saved_tensors  # noqa: B018 (read for PyTorch's check of a change in place; the VJP holds them)
        upstream = [torch.zeros(shape, dtype=dtype, device=device) if ct is None else ct
                    for ct, (shape, dtype, device) in zip(cotangents, ctx.outputs, strict=True)]
        gradients = ctx.call.gradients(upstream)
        passed = [ct for ct, through in zip(cotangents, ctx.passed, strict=True) if through]
        return (None, None, None, None, *passed, *gradients, *[None] * ctx.saved)
