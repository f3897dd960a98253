"""stopgrad_math for PyTorch: the names and semantics of the TensorFlow namespace, on ``Tensor.detach``.

Ordinary ATen ops and one small carrier: exact under ``backward``, ``forward_ad``, ``torch.func`` and
``torch.compile``; ``Function`` runs an existing ``torch.autograd.Function``'s methods on the decorator. Imports
PyTorch, never TensorFlow or JAX. Install with ``pip install stopgrad_math[torch]``.
"""

from stopgrad_math.torch.estimators import magic_box, reverse_gradient, scale_gradient, straight_through
from stopgrad_math.torch.function_face import Function
from stopgrad_math.torch.gradient_checker import GradientReport, assert_gradient, check_gradient
from stopgrad_math.torch.identity import zero_with_gradient
from stopgrad_math.torch.identity_form import custom_gradient
from stopgrad_math.torch.implicit_functions import custom_fixed_point, custom_root, implicit_reparameterization
from stopgrad_math.torch.partial import partial_custom_gradient
from stopgrad_math.torch.stops import stop_gradient, stop_gradient_where

__all__ = [
    "Function",
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
