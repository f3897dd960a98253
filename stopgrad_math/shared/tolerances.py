"""The one table of relative tolerances for the library's numerical checks, per dtype.

Every value is a multiple of the dtype's machine epsilon ε (2⁻¹⁰ float16,
2⁻⁷ bfloat16, 2⁻²³ float32, 2⁻⁵² float64), chosen for what the check compares:

  transpose            two inner products of the same numbers summed in
                       another order: √ε of their scale, far above rounding
                       and far below a dropped part of J
  superposition        grad_fn(a·d1 + d2) against a·grad_fn(d1) + grad_fn(d2),
                       each rounded in the dtype: about 10³ ε (float16, bfloat16:
                       5% since ε itself is 0.1–0.8%)
  finite_differences   a derivative against central float64 differences of a
                       function computed in the dtype: its rounding divided by
                       the step, about √ε for float32 and 10⁻⁶ for float64
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

_TABLE: dict[str, dict[str, float]] = {
    "float16": {"transpose": 2.0**-5, "superposition": 5e-2, "finite_differences": 3e-2},
    "bfloat16": {"transpose": 2.0**-3.5, "superposition": 5e-2, "finite_differences": 3e-2},
    "float32": {"transpose": 2.0**-11.5, "superposition": 1e-3, "finite_differences": 1e-3},
    "float64": {"transpose": 2.0**-26, "superposition": 1e-9, "finite_differences": 1e-6},
}
_REAL_PART = {"complex64": "float32", "complex128": "float64"}
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def rtol(dtype: Any, check: str) -> float:
    """The relative tolerance of ``check`` ("transpose", "superposition", "finite_differences") for a
    TensorFlow, NumPy or JAX dtype, or a dtype's name ("bfloat16", as PyTorch's are passed: NumPy knows no
    bfloat16); a complex dtype takes its real part's. Pure Python: every substrate reads it.
    """
    # a NumPy scalar type has no name of its own
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or np.dtype(dtype).name
    name = name.removesuffix("_ref")  # a TF1 reference dtype reads as its value's
    return _TABLE[_REAL_PART.get(name, name)][check]


def narrowest(names: Iterable[str]) -> str:
    """Of floating dtypes' names, the one with the largest machine epsilon: the precision a computation that
    runs in all of them is good to (a checker's differences and tolerances are taken at it). Names of other
    dtypes are passed over; none known gives "float64"."""
    known = [_REAL_PART.get(name, name) for name in names if _REAL_PART.get(name, name) in _EPS]
    return max(known, key=_EPS.__getitem__, default="float64")


def difference_step(name: str) -> float:
    """eps^(1/3) of a floating dtype, by name: the relative step of central differences that balances truncation
    and rounding in it."""
    return float(_EPS[_REAL_PART.get(name, name)] ** (1 / 3))
