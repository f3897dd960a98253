"""TensorFlow's execution modes the tests run in: eager, tf.function, and tf.function with XLA. Apart from
helpers.py, which imports TensorFlow, so that conftest.py can name them without importing it."""

MODES = ("eager", "function", "xla")
