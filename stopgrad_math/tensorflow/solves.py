"""The implicit functions' linear solves with the residual's Jacobian in z, in TensorFlow.

``(∂_z F)ᵀ u = b`` gives the VJP, ``(∂_z F) p = b`` the first-order motion
of z that ``order=2`` reads. Each is dense (the Jacobian formed by a tape),
elementwise (an elementwise residual's diagonal, read in one gradient) or
the caller's ``solve(matvec, b)``, handed the operator it solves with; the
decorator then proves grad_fn linear op by op, as it proves any grad_fn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

Solve = Callable[[Callable[[tf.Tensor], tf.Tensor], tf.Tensor], tf.Tensor]
ELEMENTWISE = "elementwise"  # the solve of an elementwise residual


def forward_product(function: Callable[..., tf.Tensor], primals: Sequence[tf.Tensor],
                    tangents: Sequence[tf.Tensor]) -> tf.Tensor:
    """``J·tangents`` of ``function`` at ``primals`` (a forward accumulator)."""
    with tf.autodiff.ForwardAccumulator(list(primals), list(tangents)) as accumulator:
        output = function(*primals)
    return accumulator.jvp(output, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _pullback(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, u: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        tape.watch(z)
        output = residual(z)
    return tape.gradient(output, z, output_gradients=u, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _jacobian(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor) -> tf.Tensor:
    """The Jacobian, its rows by pfor in a graph; eagerly by a loop of gradients, since pfor traces a graph at
    every eager call (about 120 ms for five rows)."""
    eagerly = tf.executing_eagerly()
    with tf.GradientTape(persistent=eagerly) as tape:  # (the loop of gradients needs a persistent tape)
        tape.watch(z)
        output = tf.reshape(residual(z), [-1])
    rows = tape.jacobian(output, z, experimental_use_pfor=not eagerly)
    return tf.reshape(rows, [tf.size(output), tf.size(z)])


def _solved(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, b: tf.Tensor, solve: Solve | str | None,
            adjoint: bool) -> tf.Tensor:
    if solve is None:
        column = tf.linalg.solve(_jacobian(residual, z), tf.reshape(b, [-1, 1]), adjoint=adjoint)
        return tf.reshape(column, tf.shape(z))
    if solve == ELEMENTWISE:
        return b / _pullback(residual, z, tf.ones_like(z))
    if isinstance(solve, str):
        raise ValueError(f"Unknown solve {solve!r}: None, {ELEMENTWISE!r} or a function solve(matvec, b).")
    if adjoint:
        return solve(lambda u: _pullback(residual, z, u), b)
    return solve(lambda p: forward_product(residual, [z], [p]), b)


def transposed(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, b: tf.Tensor,
               solve: Solve | str | None) -> tf.Tensor:
    """u with ``(∂_z residual)ᵀ u = b`` at ``z``."""
    return _solved(residual, z, b, solve, adjoint=True)


def forward(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, b: tf.Tensor,
            solve: Solve | str | None) -> tf.Tensor:
    """p with ``(∂_z residual) p = b`` at ``z``."""
    return _solved(residual, z, b, solve, adjoint=False)

