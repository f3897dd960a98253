"""stopgrad_math: put a known gradient into a TensorFlow computation.

One idea, the stop-gradient identity ``h = stop(f) + stop(g)·(x − stop(x))``,
with value f and gradient g, built so that its value is exact and its
derivative right in every mode TensorFlow has.
"""

from stopgrad_math.embedding import custom_gradient
from stopgrad_math.identity import zero_with_gradient

__all__ = ["custom_gradient", "zero_with_gradient"]
__version__ = "0.1.0"
