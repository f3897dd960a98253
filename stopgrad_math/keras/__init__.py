"""stopgrad_math for Keras 3: the names and semantics of the other namespaces, on whichever backend Keras runs.

Each name runs the namespace of ``keras.backend.backend()`` when called: ``stopgrad_math.tensorflow``,
``stopgrad_math.jax`` or ``stopgrad_math.torch`` (imported then), so it works with ``keras.ops`` inside, with
``keras.Variable`` arguments, and in a ``Layer``'s ``call``, in forward mode too. Importing it imports no framework,
Keras included. Install with ``pip install stopgrad_math[keras]`` and the extra of your backend.
"""

from stopgrad_math.keras.helpers import (
    assert_gradient,
    check_gradient,
    magic_box,
    partial_custom_gradient,
    reverse_gradient,
    scale_gradient,
    stop_gradient,
    stop_gradient_where,
    straight_through,
    zero_with_gradient,
)
from stopgrad_math.keras.identity_form import custom_gradient
from stopgrad_math.keras.implicit_functions import custom_fixed_point, custom_root, implicit_reparameterization
from stopgrad_math.shared.gradient_report import GradientReport

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
    "zero_with_gradient",
]
