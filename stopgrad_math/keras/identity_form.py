"""custom_gradient for Keras 3: both forms, run on the namespace of Keras's backend, grad_fn in Keras's conventions.

Keras's ``ops.custom_gradient`` calls ``grad(upstream)`` on TensorFlow and
JAX, and ``grad(*args, upstream=...)`` on torch (with the inputs as
``args``), so a backend-agnostic ``grad`` is written ``grad(*args,
upstream=None)``. Here a ``grad`` that takes ``upstream`` as a keyword-only
parameter is called ``grad(upstream=ct)`` (no ``args``: the inputs are what
``f`` closes over), and any other ``grad(ct)``, on every backend; the
TensorFlow namespace reads these conventions itself.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from stopgrad_math.keras.backends import backend, namespace, values
from stopgrad_math.shared import arguments
from stopgrad_math.shared.grad_fn_signature import upstream_by_keyword


def in_keras_conventions(f: Callable[..., Any]) -> Callable[..., Any]:
    """f, its ``grad`` called as the JAX and PyTorch namespaces call a VJP: with the cotangent alone."""

    @functools.wraps(f)
    def returning_a_vjp(*args: Any, **kwargs: Any) -> tuple[Any, Callable[[Any], Any]]:
        y, grad = arguments.call_f(f, args, kwargs)
        if upstream_by_keyword(grad):
            keyword_grad: Callable[..., Any] = grad
            return y, lambda ct: keyword_grad(upstream=ct)
        return y, grad

    return returning_a_vjp


def decorate(f: Callable[..., Any], order: int = 1, check_linearity: bool = False) -> Callable[..., Any]:
    """f decorated by the namespace of the backend each call runs on (made once per backend: at decoration where
    Keras is imported already, else at the first call); arguments that are keras.Variables are given as their
    values."""
    arguments.check_options(order, check_linearity)
    by_backend: dict[str, Callable[..., Any]] = {}

    def made() -> Callable[..., Any]:
        convention = f if backend() == "tensorflow" else in_keras_conventions(f)
        return namespace().custom_gradient(convention, order=order, check_linearity=check_linearity)  # type: ignore[no-any-return]

    if "keras" in sys.modules:  # made now where Keras is in use: torch 2.6's Dynamo cannot make a function it traces
        by_backend[backend()] = made()

    @functools.wraps(f)
    def call(*args: Any, **kwargs: Any) -> Any:
        name = backend()
        if name not in by_backend:
            by_backend[name] = made()
        return by_backend[name](*values(args), **values(kwargs))

    call.undecorated = f  # type: ignore[attr-defined]
    return call


def custom_gradient(fx: Any = None, gx: Any = None, x: Any = None, fx_gx_manually_stopped: bool = False,
                    name: str | None = None, *, order: int = 1, check_linearity: bool = False) -> Any:
    """Embeds a known gradient, on Keras's backend: ``custom_gradient(fx, gx, x)`` or ``@custom_gradient``.

    The ``custom_gradient`` of ``stopgrad_math``, ``stopgrad_math.jax`` or
    ``stopgrad_math.torch``, whichever is Keras's backend: the **identity
    form** ``h = stop(fx) + stop(gx)·(x − stop(x))``, with the value of ``fx``
    bit for bit and the derivative ``gx``, and the **decorator form**, a
    drop-in for ``keras.ops.custom_gradient``: ``f(*args)`` returns ``(y,
    grad)``, ``grad`` called as Keras calls it (``grad(upstream)``, or
    ``grad(*args, upstream)`` with the keyword), proven linear and exact in
    forward mode too, where Keras's own raises or gives NaN. A
    ``keras.Variable`` is taken for its value.

    Every argument, error and limit: [custom_gradient in full](custom_gradient.md).

    Args:
      fx: the value f(x); or, alone, the function to decorate.
      gx: the derivative of f at x (None: no gradient for that leaf).
      x: what the derivative is with respect to.
      fx_gx_manually_stopped: fx and gx are used as given, unstopped.
      name: tfp's op name, where the backend keeps one.
      order: decorator form: 2 for exact second derivatives.
      check_linearity: decorator form: as the backend's namespace takes it.

    Returns:
      fx with derivative gx; or the decorated function.

    Examples:
        Keras's own example, whose gradient at 100 is NaN without a custom one.

        >>> @custom_gradient
        ... def log1pexp(x):
        ...     e = keras.ops.exp(x)
        ...     def grad(*args, upstream=None):
        ...         if upstream is None:
        ...             (upstream,) = args
        ...         return keras.ops.multiply(upstream, 1.0 - 1.0 / keras.ops.add(1, e))
        ...     return keras.ops.log(1 + e), grad
        >>> float(log1pexp(keras.ops.convert_to_tensor(2.0)))
        2.1269280910491943
    """
    decorated = arguments.decorator_form(fx, gx, x, order, check_linearity, decorate)
    if decorated is not None:
        return decorated
    return namespace().custom_gradient(values(fx), values(gx), values(x), fx_gx_manually_stopped, name)
