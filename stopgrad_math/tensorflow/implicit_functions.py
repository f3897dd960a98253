"""Implicit functions in TensorFlow: a solver's result with the implicit function theorem's derivative, in every mode.

A root z of ``F(z, θ) = 0`` moves as ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ``. Its VJP,

    θ̄ = −(∂_θ F)ᵀ u,   (∂_z F)ᵀ u = z̄,

is linear in z̄, so the decorator embeds it as grad_fn, and forward mode
(``ForwardAccumulator``), ``tf.function`` and XLA come with it; the solver
runs on stopped values and is never differentiated. At ``order=2`` grad_fn
reads z moved with θ at first order, ``z − (p − stop(p))`` with
``p = (∂_z F)⁻¹ ∂_θ F · (θ − stop(θ))`` (exactly z in value), so a second
derivative through the root (a Hessian of an outer loss) is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stopgrad_math.shared.arguments import BEYOND_ORDER, name_of, with_values_at
from stopgrad_math.tensorflow import decorator_form, second_derivative_guard, solves
from stopgrad_math.tensorflow.solves import Solve


def _is_differentiable(value: Any) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) and (value.dtype.is_floating or value.dtype.is_complex)


def _stopped(value: Any) -> Any:
    return tf.stop_gradient(value) if isinstance(value, (tf.Tensor, tf.Variable)) else value


def _negated(gradient: tf.Tensor) -> tf.Tensor:
    return -gradient


def _residual(fun: Callable[..., Any], fixed_point: bool, params: tuple[Any, ...]) -> Callable[[Any], Any]:
    """z ↦ F(z, *params): ``fun`` itself, or ``fun(z, *params) − z`` for a fixed point."""
    if fixed_point:
        return lambda z: fun(z, *params) - z
    return lambda z: fun(z, *params)


def _moving(fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None, z: tf.Tensor,
            params: tuple[Any, ...], name: str) -> tf.Tensor:
    """z with its first-order derivative in the params: ``z − (p − stop(p))``, p = (∂_z F)⁻¹ ∂_θ F·(θ − stop(θ)),
    its parts at stopped values, so that its own derivative is not F's second. TensorFlow's order 2 records
    grad_fn, which tapes differentiate to any order: where a tape could take z's second derivative (a third
    derivative overall), the guard's term makes it raise, naming ``name``."""
    tensors = tuple(k for k, p in enumerate(params) if _is_differentiable(p))
    stopped = tuple(_stopped(p) for p in params)
    zeros = [params[k] - stopped[k] for k in tensors]
    moved = solves.forward_product(with_values_at(lambda *ps: _residual(fun, fixed_point, ps)(z), stopped, tensors),
                                   [stopped[k] for k in tensors], zeros)
    p = solves.forward(_residual(fun, fixed_point, stopped), z, moved, solve)
    return _guarded(z - (p - tf.stop_gradient(p)), [params[k] for k in tensors], name)


def _guarded(moving: tf.Tensor, watched: list[tf.Tensor], name: str) -> tf.Tensor:
    """``moving`` with the guard's zero term where a tape could take its second derivative in ``watched``."""
    if not second_derivative_guard.needed(watched):
        return moving
    guard = second_derivative_guard.zero_term(watched, BEYOND_ORDER[2].format(name=name))
    return moving - tf.cast(guard, moving.dtype)


def _root(solution: tf.Tensor, *params: Any, fun: Callable[..., Any], fixed_point: bool,
          solve: Solve | str | None, order: int, name: str) -> tuple[tf.Tensor, Callable[[tf.Tensor], Any]]:
    """``(solution, grad_fn)``: the implicit derivative of ``F(solution, *params) = 0``; None for the solution
    (stopped) and for a param that is not a floating tensor or variable."""
    tensors = tuple(k for k, p in enumerate(params) if _is_differentiable(p))

    def grad_fn(upstream: tf.Tensor) -> tuple[Any, ...]:
        z = _moving(fun, fixed_point, solve, solution, params, name) if order == 2 else solution
        u = solves.transposed(_residual(fun, fixed_point, params), z, upstream, solve)
        watched = [params[k] for k in tensors]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            residual = _residual(fun, fixed_point, params)(z)
        gradients = tape.gradient(residual, watched, output_gradients=u,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        cotangents: list[Any] = [None] * len(params)
        for k, gradient in zip(tensors, gradients, strict=True):
            cotangents[k] = _negated(gradient)
        return (None, *cotangents)

    return solution, grad_fn


def _implicit(name: str, fun: Callable[..., Any], fixed_point: bool, solve: Solve | str | None,
              order: int) -> Callable[..., Any]:
    """``(solution, *params) ↦ solution``, decorated at ``order`` with the implicit derivative, named for messages
    and name scopes."""

    def implicit(solution: tf.Tensor, *params: Any) -> tuple[tf.Tensor, Callable[[tf.Tensor], Any]]:
        return _root(solution, *params, fun=fun, fixed_point=fixed_point, solve=solve, order=order, name=name)

    implicit.__name__ = implicit.__qualname__ = name
    return decorator_form.decorate(implicit, order)


def _solved(solver: Callable[..., Any], fun: Callable[..., Any], fixed_point: bool, solve: Solve | None,
            order: int, kind: str) -> Callable[..., Any]:
    implicit = _implicit(f"{kind}({name_of(solver)})", fun, fixed_point, solve, order)

    @functools.wraps(solver)
    def solved(init: Any, *params: Any) -> Any:
        solution = solver(_stopped(init), *(_stopped(p) for p in params))
        return implicit(tf.stop_gradient(tf.convert_to_tensor(solution)), *params)

    return solved


def custom_root(optimality_fun: Callable[..., Any], solve: Solve | None = None, *,
                order: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a solver: its root z of ``optimality_fun(z, *params) = 0``, with the implicit derivative.

    ``custom_root(optimality_fun, solve)(solver)`` is ``(init, *params) ↦ z``:
    the value is ``solver(init, *params)`` run on stopped inputs (NumPy or a
    loop eagerly; in a graph, TensorFlow ops), never differentiated; the
    derivative in ``params`` (tensors or variables; z a tensor) is
    ``dz = −(∂_z F)⁻¹ ∂_θ F · dθ`` under tapes, ``ForwardAccumulator``,
    ``tf.function`` and XLA. ``init`` gets none. ``solve=None`` forms
    ``∂_z F`` densely; a ``solve(matvec, b)`` is handed whichever operator
    (reverse mode the transpose). ``order=2``: second derivatives exact;
    ``order=1``: a second raises.

    Examples:
        Ridge regression's solution, differentiated twice in its regularization.

        >>> X = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
        >>> y = tf.constant([1.0, 0.0, 2.0])
        >>> optimality = lambda w, lam: tf.linalg.matvec(X, tf.linalg.matvec(X, w) - y, transpose_a=True) + lam * w
        >>> @custom_root(optimality)
        ... def ridge(init, lam):
        ...   return tf.linalg.solve(tf.matmul(X, X, transpose_a=True) + lam * tf.eye(2),
        ...                          tf.linalg.matvec(X, y, transpose_a=True)[:, None])[:, 0]
        >>> lam = tf.constant(1.0)
        >>> with tf.GradientTape() as outer:
        ...   outer.watch(lam)
        ...   with tf.GradientTape() as inner:
        ...     inner.watch(lam)
        ...     loss = tf.reduce_sum(ridge(tf.zeros(2), lam) ** 2)
        ...   first = inner.gradient(loss, lam)
        >>> round(float(outer.gradient(first, lam)), 4)   # the closed form's, differentiated twice
        0.3552
    """
    return lambda solver: _solved(solver, optimality_fun, False, solve, order, "custom_root")


def custom_fixed_point(fixed_point_fun: Callable[..., Any], solve: Solve | None = None, *,
                       order: int = 2) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a solver: its fixed point ``z = fixed_point_fun(z, *params)``, with the implicit derivative.

    ``custom_root`` of ``T(z, θ) − z``: ``dz = (I − ∂_z T)⁻¹ ∂_θ T · dθ``;
    ``solve`` and ``order`` as there.

    Examples:
        A deep-equilibrium layer, z = tanh(W z + x), found by iteration; its derivative in forward mode.

        >>> W = tf.constant([[0.3, -0.2], [0.1, 0.4]])
        >>> layer = lambda z, x: tf.tanh(tf.linalg.matvec(W, z) + x)
        >>> @custom_fixed_point(layer)
        ... def equilibrium(init, x):
        ...   z = init
        ...   for _ in range(100):
        ...     z = layer(z, x)
        ...   return z
        >>> x = tf.constant([0.5, -1.0])
        >>> with tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, 0.0])) as accumulator:
        ...   z = equilibrium(tf.zeros(2), x)
        >>> D = tf.linalg.diag(1 - z ** 2)
        >>> exact = tf.linalg.solve(tf.eye(2) - D @ W, D)[:, 0]
        >>> bool(tf.reduce_all(tf.abs(accumulator.jvp(z) - exact) < 1e-6))
        True
    """
    return lambda solver: _solved(solver, fixed_point_fun, True, solve, order, "custom_fixed_point")


def implicit_reparameterization(sample: Any, cdf: Callable[..., Any], *params: Any, order: int = 1) -> tf.Tensor:
    """Returns draws ``sample`` with their implicit reparameterization gradient in ``params``.

    For draws ``z = F⁻¹(u; θ)`` of a distribution whose CDF is ``cdf(z, *params)``
    (elementwise; ``params`` broadcast to the draws' shape), the derivative is
    ``dz/dθ = −(∂F/∂θ) / (∂F/∂z)`` (Figurnov et al., 2018), as TFP writes it
    for Gamma, Beta and von Mises, summed back to each parameter's shape.
    ``sample`` is stopped. ``order=1`` (the default) gives first derivatives and refuses a second;
    ``order=2`` makes second derivatives exact where ``cdf`` has them (Gamma's CDF has none in its concentration
    in TensorFlow and PyTorch).

    Examples:
        Exponential draws, z = −log(1 − u) / rate, whose derivative is −z / rate.

        >>> z, rate = tf.constant([0.5, 2.0]), tf.constant(2.0)
        >>> cdf = lambda z, rate: 1 - tf.exp(-rate * z)
        >>> with tf.GradientTape() as tape:
        ...   tape.watch(rate)
        ...   draws = implicit_reparameterization(z, cdf, rate)
        >>> float(tape.gradient(draws, rate))   # −(0.5 + 2) / 2
        -1.25
    """
    implicit = _implicit(f"implicit_reparameterization({name_of(cdf)})", cdf, False, solves.ELEMENTWISE, order)
    draws: tf.Tensor = implicit(tf.stop_gradient(tf.convert_to_tensor(sample)), *params)
    return draws
