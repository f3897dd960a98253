"""stopgrad_math: put a known gradient into a TensorFlow, JAX, PyTorch or Keras 3 computation.

One idea, the stop-gradient identity ``h = stop(f) + stop(g)·(x − stop(x))``,
with value f and gradient g, built so that its value is exact and its
derivative right in every mode the framework has. This namespace is
TensorFlow's (a drop-in for TFP's ``tfp.math.custom_gradient``);
``stopgrad_math.jax``, ``stopgrad_math.torch`` and ``stopgrad_math.keras``
(on each of Keras 3's backends) have the same names and semantics.

TensorFlow is imported when a name is first used, not with the package, so
that the other namespaces work where TensorFlow is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as type checkers and the API reference see them
    from stopgrad_math.tensorflow import (
        GradientReport,
        assert_gradient,
        check_gradient,
        custom_fixed_point,
        custom_gradient,
        custom_root,
        implicit_reparameterization,
        magic_box,
        partial_custom_gradient,
        reverse_gradient,
        scale_gradient,
        stop_gradient,
        stop_gradient_where,
        straight_through,
        values_only,
        zero_with_gradient,
    )

# Written out: the API reference reads the names statically. They are stopgrad_math.tensorflow's.
__all__ = [
    "GradientReport",
    "assert_gradient",
    "check_gradient",
    "custom_fixed_point",
    "custom_gradient",
    "custom_root",
    "implicit_reparameterization",
    "magic_box",
    "partial_custom_gradient",
    "reverse_gradient",
    "scale_gradient",
    "stop_gradient",
    "stop_gradient_where",
    "straight_through",
    "values_only",
    "zero_with_gradient",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported (with TensorFlow) the first time it is asked for."""
    if name not in __all__:
        raise AttributeError(f"module 'stopgrad_math' has no attribute {name!r}")
    try:
        namespace = importlib.import_module("stopgrad_math.tensorflow")
    except ModuleNotFoundError as error:
        if error.name not in ("tensorflow", "tensorflow_probability", "tf_keras"):
            raise
        raise ImportError(f"stopgrad_math.{name} is TensorFlow's and needs it: pip install 'stopgrad_math[tf]' "
                          f"({error.name} is not installed). For JAX: import stopgrad_math.jax.") from error
    value = getattr(namespace, name)
    globals()[name] = value  # later lookups find it without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
