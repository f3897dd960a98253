"""The mixing matmul's cases for the non-finite tests of every namespace, in NumPy: X·Wᵀ with the VJP
(ct·W, ctᵀ·X), a NaN, an inf and a −inf in each argument, one element at a time, and the cotangent and
tangents the tests apply."""

import numpy as np

W = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 4.0]])
X = np.array([[1.0, 2.0], [2.0, 3.0]])


def _with(array, index, value):
    array = array.copy()
    array[index] = value
    return array


CASES = {f"{value} in {name}": (_with(X, (0, 1), value), W) if name == "X" else (X, _with(W, (1, 0), value))
         for name in ("X", "W") for value in (np.nan, np.inf, -np.inf)}

CT = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, 3.0]])
TANGENT_X, TANGENT_W = np.array([[0.5, -1.0], [2.0, 1.0]]), np.array([[1.0, 0.0], [-0.5, 2.0], [1.5, 1.0]])
