"""The mixing matmul's cases for the non-finite tests of every namespace, in NumPy: X·Wᵀ with the VJP
(ct·W, ctᵀ·X), a NaN, an inf and a −inf in each argument, one element at a time, the cotangent and
tangents the tests apply, the forward-mode truth and the comparison."""

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


def tangent_as_written(x, w, tangents):
    """tX·Wᵀ + X·tWᵀ in NumPy, the term of each argument with a tangent alone (no 0·NaN from an absent one): the
    rule applied as written, where a framework's own forward rule for a matmul may multiply the NaN by the zero
    tangent of the other factor."""
    tx, tw = tangents
    with np.errstate(invalid="ignore"):
        terms = ([tx @ w.T] if tx is not None else []) + ([x @ tw.T] if tw is not None else [])
        return sum(terms[1:], terms[0])


def assert_same(got, want, what):
    """Each array of ``got`` is ``want``'s to 1e-12, with NaN where it has NaN and nowhere else."""
    for g, t in zip(got, want, strict=True):
        g, t = np.asarray(g), np.asarray(t)
        np.testing.assert_allclose(g, t, rtol=1e-12, atol=0, equal_nan=True, err_msg=what)
        assert np.array_equal(np.isnan(g), np.isnan(t)), what  # NaN where the rule puts it, and nowhere else
