"""stopgrad_math: put a known gradient into a TensorFlow computation.

One idea, the stop-gradient identity ``h = stop(f) + stop(g)·(x − stop(x))``,
with value f and gradient g, built so that its value is exact and its
derivative right in every mode TensorFlow has.
"""

from stopgrad_math.estimators import magic_box, reverse_gradient, scale_gradient, straight_through
from stopgrad_math.gradient_checker import GradientReport, assert_gradient, check_gradient
from stopgrad_math.identity import zero_with_gradient
from stopgrad_math.identity_form import custom_gradient
from stopgrad_math.partial import partial_custom_gradient
from stopgrad_math.stops import stop_gradient, stop_gradient_where
from stopgrad_math.value_only_mode import values_only

__all__ = [
    "GradientReport",
    "assert_gradient",
    "check_gradient",
    "custom_gradient",
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
