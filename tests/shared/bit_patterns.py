"""Floats compared bit for bit, in every namespace's tests."""

import numpy as np


def bits(array) -> np.ndarray:
    """The raw bit patterns of a float array, so that -0.0 and NaN compare exactly."""
    array = np.asarray(array)
    return array.view(f"uint{8 * array.dtype.itemsize}")
