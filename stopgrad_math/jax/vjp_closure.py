"""A JAX VJP's closure opened (``shared.closure_key``): its arrays as arguments of a compiled embedding.

The arrays passed in are JAX and NumPy arrays and NumPy scalars, each keyed by
its shape, dtype and weak type. A JAX array read from a global is taken by
identity (it cannot change in place), as is a NumPy scalar; a NumPy array there
is refused, and the VJP is traced anew at every call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

from stopgrad_math.shared import closure_key
from stopgrad_math.shared.closure_key import Opened

__all__ = ["Opened", "aval_key", "opened"]


def aval_key(array: Any) -> Hashable:
    """An array by what a compilation depends on: its shape, dtype and weak type."""
    return "array", tuple(np.shape(array)), np.dtype(array.dtype), bool(getattr(array, "weak_type", False))


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def _is_immutable(value: Any) -> bool:
    return isinstance(value, np.generic) or (isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer))


_ARRAYS = closure_key.Arrays(_is_array, aval_key, _is_immutable)


def opened(vjp: Callable[..., Any]) -> Opened | None:
    """The VJP opened, or None where it holds something a key cannot capture."""
    return closure_key.opened(vjp, _ARRAYS)
