"""TFP's custom-gradient factory on the library's decorator, as a new user would patch it.

TFP builds its TensorFlow gradients with ``tf.custom_gradient``, called from one factory
(``tensorflow_probability.python.internal.custom_gradient``) each time a decorated function runs. Replacing
that module's ``tf`` runs TFP's real code on the library, side by side with TFP as it is.
"""

import contextlib
import types

import tensorflow as tf
from tensorflow_probability.python.internal import custom_gradient as tfp_factory

import stopgrad_math

# tf's public names, read once: the benchmark enters the patch at every timed call.
_TF_NAMES = {name: getattr(tf, name) for name in dir(tf) if not name.startswith("__") and name != "custom_gradient"}


class Calls:
    """How many times TFP's factory called the decorator while patched."""

    count = 0


@contextlib.contextmanager
def on_the_library(order: int = 1):
    """TFP's factory on ``stopgrad_math.custom_gradient(order=order)`` inside the block; yields a ``Calls``."""
    calls = Calls()

    def decorator(f):
        calls.count += 1
        return stopgrad_math.custom_gradient(f, order=order)

    namespace = types.SimpleNamespace(**_TF_NAMES, custom_gradient=decorator)
    tfp_factory.tf = namespace
    try:
        yield calls
    finally:
        tfp_factory.tf = tf
