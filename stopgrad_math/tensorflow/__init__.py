"""stopgrad_math for TensorFlow: the stop-gradient identity on ``tf.stop_gradient``, a drop-in for tfp's
``custom_gradient`` and for ``tf.custom_gradient``.

``import stopgrad_math`` exports these names (importing TensorFlow when one is first used). Install with
``pip install stopgrad_math[tf]``.
"""

from stopgrad_math.tensorflow.estimators import magic_box, reverse_gradient, scale_gradient, straight_through
from stopgrad_math.tensorflow.gradient_checker import GradientReport, assert_gradient, check_gradient
from stopgrad_math.tensorflow.identity import zero_with_gradient
from stopgrad_math.tensorflow.identity_form import custom_gradient
from stopgrad_math.tensorflow.implicit_functions import custom_fixed_point, custom_root, implicit_reparameterization
from stopgrad_math.tensorflow.partial import partial_custom_gradient
from stopgrad_math.tensorflow.stops import stop_gradient, stop_gradient_where
from stopgrad_math.tensorflow.value_only_mode import values_only

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
