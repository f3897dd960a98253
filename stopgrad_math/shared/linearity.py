"""The states of a VJP's values, as the proofs of linearity on JAX and PyTorch give them.

A decorator embeds a VJP only where its graph proves it linear in the
cotangent. Each namespace walks its own graph (a jaxpr's primitives, an FX
graph's ATen ops) and gives every value one of these states:

  CONST     does not depend on the cotangent
  ZERO      does not depend on it and is known to be zero (``zeros``)
  LINEAR    a linear function of it
  Finding   depends on it through an op that is not linear there (or that
            the namespace's table does not know: not proven)

The VJP is linear where every result is LINEAR or ZERO.
"""

from __future__ import annotations

import dataclasses
import enum


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

AFFINE = ("adds a term that does not depend on the cotangent and is not provably zero (0·x is not: it is NaN where "
          "x is infinite): an affine map, whose constant a transpose would drop")
