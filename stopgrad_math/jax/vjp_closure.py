"""A JAX VJP's closure opened (``shared.closure_key``): its arrays as arguments of a compiled embedding.

The arrays passed in are JAX and NumPy arrays and NumPy scalars, each keyed by
its shape, dtype and weak type, and the Python floats and complex numbers the
closure holds, keyed by their type: a learning rate, a temperature or an
annealed scale that changes at every call is an operand of one compiled
embedding (weakly typed, as jit takes a Python number), not a new compilation
each time. (An int or a bool stays in the key by value: it may be a shape or an
axis. A VJP that branches on a number it closes over is traced at every call.)
A JAX array read from a global is taken by identity (it cannot change in
place), as is a NumPy scalar; a NumPy array there is refused, and the VJP is
traced anew at every call; a number read from a global is keyed by value.
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
    return "array", tuple(np.shape(array)), array.dtype, bool(getattr(array, "weak_type", False))  # (a typed PRNG
    # key's dtype is no NumPy dtype)


_NUMBERS = (float, complex)  # passed in as operands (bool and int are not: a shape, an axis, a count)


def _is_number(value: Any) -> bool:
    """A Python float or complex, or JAX's typed literal of one (what ``stop_gradient`` of a Python float that an
    eager ``grad`` traces gives since JAX 0.9: a float subclass with a dtype); not a NumPy scalar, keyed as an
    array."""
    return type(value) in _NUMBERS or (isinstance(value, _NUMBERS) and not isinstance(value, np.generic))


def _key(value: Any) -> Hashable:
    if _is_number(value):
        return "number", type(value)
    return aval_key(value)


def _is_array(value: Any) -> bool:
    return _is_number(value) or isinstance(value, (jax.Array, np.ndarray, np.generic))


def _is_immutable(value: Any) -> bool:
    return isinstance(value, np.generic) or (isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer))


_ARRAYS = closure_key.Arrays(_is_array, _key, _is_immutable)


def opened(vjp: Callable[..., Any]) -> Opened | None:
    """The VJP opened, or None where it holds something a key cannot capture."""
    return closure_key.opened(vjp, _ARRAYS)
