"""The implicit functions' linear solves in TensorFlow, and ``linear_solve``, a solve the decorator can embed.

A grad_fn is embedded where it is proven linear in its upstream, op by op.
A solve by an iterative method whose stopping test reads the right-hand side
(CG with a tolerance, a ``tf.while_loop``, a Python loop eagerly) is not;
``linear_solve`` (not public: see its docstring) declares it linear: it is recorded as one op whose backward
is the transposed solve and whose forward function the solve again (as
``jax.lax.custom_linear_solve``), and the route reads its ops as one linear
box. The implicit functions solve with the residual's Jacobian in z: dense
(formed by a tape), elementwise (an elementwise residual's diagonal, read in
one gradient) or the caller's ``solve(matvec, b)``, handed the operator it
solves with and declared linear.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from stopgrad_math.tensorflow import (
    _tf_internal,
    identity,
    nested_calls,
    recorded_term,
    second_derivative_guard,
    transposition,
)

_SECOND_IN_THE_OPERATOR = (
    "linear_solve gives the first derivative in the tensors its matvec reads, not the second (x is held in dA·x); "
    "every derivative in b is exact. Solve with tf.linalg.solve where a second derivative in the matrix is needed.")
_OF_A_TANGENT = (
    "a derivative of an implicit function's forward-mode derivative (forward over forward, reverse over forward) "
    "where its solve is the caller's solve(matvec, b) is not supported (forward over forward through the declared "
    "solve gave 0). Take second derivatives with a tape innermost (forward over reverse, reverse over reverse).")
_IN_PFOR = (
    "An implicit function whose solve is the caller's solve(matvec, b) is traced as pfor's loop body "
    "(tf.vectorized_map, a jacobian by pfor), whose conversion drops the declared solve's registered gradient, so "
    "a derivative through the map would be wrong: map with tf.map_fn, take the jacobian with "
    "experimental_use_pfor=False, or use solve=None.")
Solve = Callable[[Callable[[tf.Tensor], tf.Tensor], tf.Tensor], tf.Tensor]
ELEMENTWISE = "elementwise"  # the solve of an elementwise residual


def linear_solve(matvec: Callable[[tf.Tensor], tf.Tensor], b: tf.Tensor, solve: Solve,
                 transpose_solve: Solve | None = None, symmetric: bool = False, zero: bool = False) -> tf.Tensor:
    """``solve(matvec, b)``, declared linear in ``b``, as ``jax.lax.custom_linear_solve``: the implicit functions'
    solve with the caller's solver.

    x solves ``matvec(x) = b``. ``solve`` runs on stopped values and is never
    differentiated, so it may stop on a tolerance or loop in a
    ``tf.while_loop`` (eagerly, in Python), and a grad_fn that calls it is
    still proven linear. Its derivative in ``b`` is a solve again, at every
    order and in every mode: ``solve`` with ``matvec`` forward,
    ``transpose_solve`` with the transposed operator in reverse
    (``symmetric=True``: ``solve``). In the tensors ``matvec`` reads it gives
    the first derivative, ``dx = −A⁻¹dA·x`` with x held; a second derivative
    in them raises, and a derivative in ``b`` of that first derivative misses
    x's motion, which is why this is not public: the implicit functions take
    only the first derivative of their solve (their order-2 guard refuses
    the third derivative that would take more). ``zero``: b is zero in value
    (a tangent carried by a zero), so x is 0 without running ``solve``, which
    a fixed number of CG steps would turn into 0/0.
    """
    if symmetric:
        transpose_solve = solve
    evaluating = nested_calls.current()
    if evaluating is None or tf.executing_eagerly():
        return _declared(matvec, None, b, solve, transpose_solve, zero)
    b = tf.identity(b)  # outside the box: an operator that reads the upstream itself is then told from b
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    if transposition.reading_ops():
        matvec(b)  # (its ops alone: the box's inputs must show what the operator reads)
        x = tf.identity(b)
    else:
        x = _declared(matvec, None, b, solve, transpose_solve, zero)
    box = transposition.Box(frozenset(graph.get_operations()[first:]), linear_in=b.ref(), result=x.op)
    evaluating.boxes.append(box)
    return x


def _declared(matvec: Callable[[tf.Tensor], tf.Tensor], vecmat: Callable[[tf.Tensor], tf.Tensor] | None,
              b: tf.Tensor, solve: Solve, transpose_solve: Solve | None, zero: bool = False) -> tf.Tensor:
    """The solve recorded as one op of ``b`` (moved by ``−dA·x`` where matvec's tensors are watched); ``vecmat``
    is matvec's transpose where it is known (a transposed solve's own transpose is the operator it came from)."""
    if _tf_internal.in_pfor_loop_body():
        raise ValueError(_IN_PFOR)
    b = tf.convert_to_tensor(b)
    matvec = _recording(matvec)
    x = tf.zeros_like(b) if zero else tf.stop_gradient(_solved_unless_zero(solve, matvec, tf.stop_gradient(b)))
    if identity.nothing_records():
        return x
    r = _moved_by_the_operator(matvec, x, b)

    def backward(upstream: tf.Tensor | None) -> list[tf.Tensor | None]:
        if upstream is None:
            return [None]
        if transpose_solve is None:
            raise ValueError("linear_solve was given no transpose_solve and symmetric=False, which reverse mode "
                             "needs: pass transpose_solve(vecmat, b), or symmetric=True where matvec is symmetric.")
        transposed = _transposed(matvec, x) if vecmat is None else vecmat  # (_declared records its calls)
        return [_declared(transposed, matvec, upstream, transpose_solve, solve)]

    def forward(tangent: tf.Tensor | None) -> list[tf.Tensor]:
        if tangent is None:
            return [tf.zeros_like(x)]
        tangent_of_x = _declared(matvec, vecmat, tangent, solve, transpose_solve)
        return [tf.raw_ops.PreventGradient(input=tangent_of_x, message=_OF_A_TANGENT)]

    return recorded_term.recorded("stopgrad_math_linear_solve", [tf.identity(x)], [r], backward, forward)[0]


def _solved_unless_zero(solve: Solve, matvec: Callable[[tf.Tensor], tf.Tensor], b: tf.Tensor) -> tf.Tensor:
    """``solve(matvec, b)``, or 0 where b is zero in every element (a zero upstream or tangent): x = 0 solves
    ``matvec(x) = 0``, where a solver that divides by ``|b|`` (CG's fixed steps) gives 0/0. Eagerly the solver is
    not run there; in a graph it solves for ones instead, and its answer is not selected (a ``tf.cond`` holding the
    solver is refused by XLA and under a tape and an accumulator, and the solve is never differentiated)."""
    zero = tf.reduce_all(tf.equal(b, 0))
    if tf.executing_eagerly():
        return tf.zeros_like(b) if bool(zero) else solve(matvec, b)
    return tf.where(zero, tf.zeros_like(b), solve(matvec, tf.where(zero, tf.ones_like(b), b)))


def _moved_by_the_operator(matvec: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """b in value; its derivative ``db − dA·x`` with x held, where matvec reads watched tensors (A)."""
    moved = matvec(x)
    r = b - (moved - tf.stop_gradient(moved))
    if second_derivative_guard.needed([moved]):  # held, x's own motion is missing from a second derivative in A
        r -= tf.cast(second_derivative_guard.zero_term([moved], _SECOND_IN_THE_OPERATOR), r.dtype)
    return r


def _recording(matvec: Callable[[tf.Tensor], tf.Tensor]) -> Callable[[tf.Tensor], tf.Tensor]:
    """``matvec`` where a tape or accumulator it makes (a pullback, a JVP) records, inside a forward function too
    (the backward of another op called there included); the op a forward function records is left to
    TensorFlow's rule, so that it does not recur."""
    def recording(v: tf.Tensor) -> tf.Tensor:
        with _tf_internal.recording_inside_forward_function():
            return matvec(v)
    return recording


def _transposed(matvec: Callable[[tf.Tensor], tf.Tensor], like: tf.Tensor) -> Callable[[tf.Tensor], tf.Tensor]:
    """The transpose of the linear ``matvec``: its pullback at zero (where any point would do)."""
    def vecmat(u: tf.Tensor) -> tf.Tensor:
        v = tf.zeros_like(like)
        with tf.GradientTape() as tape:
            tape.watch(v)
            image = matvec(v)
        return tape.gradient(image, v, output_gradients=u, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return vecmat


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
            adjoint: bool, zero: bool = False) -> tf.Tensor:
    if solve is None:
        column = tf.linalg.solve(_jacobian(residual, z), tf.reshape(b, [-1, 1]), adjoint=adjoint)
        return tf.reshape(column, tf.shape(z))
    if solve == ELEMENTWISE:
        return b / _pullback(residual, z, tf.ones_like(z))
    if isinstance(solve, str):
        raise ValueError(f"Unknown solve {solve!r}: None, {ELEMENTWISE!r} or a function solve(matvec, b).")
    if adjoint:
        return linear_solve(lambda u: _pullback(residual, z, u), b, solve, transpose_solve=solve)
    return linear_solve(lambda p: forward_product(residual, [z], [p]), b, solve, transpose_solve=solve, zero=zero)


def transposed(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, b: tf.Tensor,
               solve: Solve | str | None) -> tf.Tensor:
    """u with ``(∂_z residual)ᵀ u = b`` at ``z``."""
    return _solved(residual, z, b, solve, adjoint=True)


def forward(residual: Callable[[tf.Tensor], tf.Tensor], z: tf.Tensor, b: tf.Tensor,
            solve: Solve | str | None) -> tf.Tensor:
    """p with ``(∂_z residual) p = b`` at ``z``, for a b that is zero in value (order 2's motion of z)."""
    return _solved(residual, z, b, solve, adjoint=False, zero=True)

