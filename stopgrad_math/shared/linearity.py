"""The states of a VJP's values, as the proofs of linearity on JAX and PyTorch give them.

A decorator embeds a VJP only where its graph proves it linear in the
cotangent. Each namespace walks its own graph (a jaxpr's primitives, an FX
graph's ATen ops) and gives every value one of these states:

  CONST     does not depend on the cotangent
  ZERO      does not depend on it and is known to be zero (``zeros``)
  LINEAR    a linear function of it
  Finding   depends on it through an op that is not linear there (or that
            the namespace's table does not know: not proven)

The VJP is linear where every result is LINEAR or ZERO; ``kept`` says, for
each cotangent, whether it is embedded, or why the VJP is refused.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class State(enum.Enum):
    CONST = "does not depend on the cotangent"
    ZERO = "zero"
    LINEAR = "linear in the cotangent"


@dataclasses.dataclass(frozen=True)
class Finding:
    """An op on the cotangent's path that is not linear there, and why (``where``: the calls it is in)."""

    primitive: str
    why: str
    where: tuple[str, ...] = ()
    unknown: bool = False  # the table does not know the op: not proven, rather than shown non-linear

    @property
    def place(self) -> str:
        """The op and the calls it is in, innermost first."""
        return self.primitive + "".join(f" inside {call}" for call in reversed(self.where))

    def __str__(self) -> str:
        return f"{self.place} ({self.why})"


Judged = State | Finding


class NotEmbeddable(ValueError):
    """A VJP that cannot be embedded: not proven linear in its cotangent (an op that is not linear, or not known),
    affine, or not traceable into the graph a proof reads. ``stopgrad_math.torch.Function`` and
    ``stopgrad_math.jax.custom_vjp`` take the framework's own mechanism there; the decorators raise it."""


@dataclasses.dataclass(frozen=True)
class Route:
    """How a drop-in for a framework's mechanism (``Function``, ``custom_vjp``) runs a call: ``embedded``, its
    backward embedded by the decorator (every mode); else by the framework's own mechanism, for ``reason``
    (reverse mode alone)."""

    embedded: bool
    reason: str = ""

AFFINE = ("adds a term that does not depend on the cotangent and is not provably zero (0·x is not: it is NaN where "
          "x is infinite): an affine map, whose constant a transpose would drop")


def kept(state: Judged, name: str, label: str, value: Any, differentiable: bool, table: str) -> bool:
    """Whether a decorator embeds the cotangent the VJP of ``name`` returns for the argument leaf ``label``, whose
    state its proof gave: True where it is LINEAR, False where it is ZERO; a ValueError saying why otherwise
    (``table``: the module of the namespace's table, named where an op is not in it)."""
    if isinstance(state, Finding) and state.unknown:
        raise NotEmbeddable(f"The vjp of {name} uses {state.place} on the path to the cotangent for {label}, which "
                         f"{table} does not know: its linearity is not proven, so the vjp cannot be embedded (the "
                         "identity's backward pass is linear). If it is linear, its row belongs in that table.")
    if isinstance(state, Finding):
        raise NotEmbeddable(f"The vjp of {name} is not linear in its cotangent, so it cannot be embedded (the "
                         f"identity's backward pass is linear): {state}, on the path to the cotangent for {label}.")
    if state is State.CONST:
        raise NotEmbeddable(f"The vjp of {name} returns a cotangent for {label} that does not depend on the cotangent "
                         "of y and is not provably zero: an affine map, not a VJP.")
    if state is State.LINEAR and not differentiable:  # (a drop-in's mechanism raises its own error, where it does)
        raise NotEmbeddable(f"The vjp of {name} returns a cotangent for {label}, which is not differentiable "
                         f"({getattr(value, 'dtype', type(value).__name__)}): it would be lost. Return None for it.")
    return state is State.LINEAR
