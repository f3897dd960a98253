"""stopgrad_math for JAX: the names and semantics of the TensorFlow namespace, on ``jax.lax.stop_gradient``.

``custom_vjp`` runs an existing ``jax.custom_vjp``'s fwd and bwd on the decorator. Imports JAX, never
TensorFlow. Install with ``pip install stopgrad_math[jax]``.
"""

from stopgrad_math.jax.custom_vjp_face import custom_vjp
from stopgrad_math.jax.estimators import magic_box, reverse_gradient, scale_gradient, straight_through
from stopgrad_math.jax.gradient_checker import GradientReport, assert_gradient, check_gradient
from stopgrad_math.jax.identity import zero_with_gradient
from stopgrad_math.jax.identity_form import custom_gradient
from stopgrad_math.jax.implicit_functions import custom_fixed_point, custom_root, implicit_reparameterization
from stopgrad_math.jax.partial import partial_custom_gradient
from stopgrad_math.jax.solves import linear_solve
from stopgrad_math.jax.stops import stop_gradient, stop_gradient_where

__all__ = [
    "GradientReport",
    "assert_gradient",
    "check_gradient",
    "custom_fixed_point",
    "custom_gradient",
    "custom_root",
    "custom_vjp",
    "implicit_reparameterization",
    "linear_solve",
    "magic_box",
    "partial_custom_gradient",
    "reverse_gradient",
    "scale_gradient",
    "stop_gradient",
    "stop_gradient_where",
    "straight_through",
    "zero_with_gradient",
]
