"""``jax.custom_vjp``'s API on the decorator: an existing ``fwd`` and ``bwd``, every mode from the ``bwd``.

``custom_vjp(fun, nondiff_argnums=..., nondiff_argnames=...)`` and ``.defvjp(fwd, bwd)`` are read as JAX reads them:
keyword arguments resolved to positions, the non-differentiable arguments passed to ``bwd`` first, then the
residuals and the output's cotangent; ``bwd`` returns one cotangent (or None) per differentiable argument. Each call
is one decorated call (``custom_gradient``): ``fwd`` is f, and ``bwd`` with its residuals the VJP, so ``jvp``,
``jacfwd`` and ``linearize`` come from the ``bwd`` as ``grad`` does. Where the decorator cannot embed the ``bwd``
(not linear in its cotangent, as JAX's documented ``clip_gradient``, or it reads the cotangent's value), the call
is ``jax.custom_vjp`` of the same functions: reverse mode is JAX's own, and forward mode raises, naming the reason.
``route`` says which a call takes.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import custom_derivatives

from stopgrad_math.jax import decorator_form
from stopgrad_math.shared.linearity import Route

FORWARD_MODE = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"


class custom_vjp:
    """``jax.custom_vjp`` whose ``bwd`` also gives forward mode: ``jvp``, ``jacfwd``, ``linearize``, ``hessian``.

    ``order``: 2, the default (exact second derivatives, as ``jax.custom_vjp``'s grad of grad), or 1 (a second
    derivative raises, as ``custom_gradient``'s ``order``).
    The differences from ``jax.custom_vjp`` are listed in docs/existing_code.md.

    >>> @custom_vjp
    ... def log1pexp(x):
    ...     return jnp.log1p(jnp.exp(x))
    >>> log1pexp.defvjp(lambda x: (log1pexp(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))
    >>> round(float(jax.jvp(log1pexp, (10.0,), (1.0,))[1]), 5)  # forward mode, from the bwd
    0.99995
    """

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: Sequence[int] = (),
                 nondiff_argnames: Sequence[str] = (), order: int = 2) -> None:
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.name: str = getattr(fun, "__name__", repr(fun))
        try:
            self.signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):  # a callable Python cannot read: its arguments are taken as given
            self.signature = None
        parameters = [] if self.signature is None else list(self.signature.parameters)
        self.nondiff_argnums = tuple(sorted({*nondiff_argnums, *(parameters.index(n) for n in nondiff_argnames)}))
        self.order = order
        self.fwd: Callable[..., Any] | None = None
        self.bwd: Callable[..., Any] | None = None
        self.symbolic_zeros = False
        self.optimize_remat = False
        self.mechanism: Any = None
        self._in_fwd = _InFwd()

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any], symbolic_zeros: bool = False,
               optimize_remat: bool = False) -> None:
        """As ``jax.custom_vjp.defvjp``. With ``symbolic_zeros``, ``fwd`` is given each differentiable argument as
        a ``CustomVJPPrimal``, perturbed unless it can never be differentiated (``_perturbed``), and ``bwd`` a
        cotangent that is never a ``SymbolicZero``."""
        self.fwd, self.bwd = fwd, bwd
        self.symbolic_zeros, self.optimize_remat = symbolic_zeros, optimize_remat
        self.mechanism = jax.custom_vjp(self.fun, nondiff_argnums=self.nondiff_argnums)  # the fall-back
        options = {"optimize_remat": True} if optimize_remat else {}
        self.mechanism.defvjp(fwd, bwd, symbolic_zeros=symbolic_zeros, **options)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._resolved(args, kwargs)
        if self._in_fwd.depth:  # fwd computing the output by a call of the function itself, as JAX's docs write
            return self.fun(*args)
        if not decorator_form.differentiating(args, {}):  # eagerly on concrete values: fun alone, as JAX runs it
            return self.fun(*args)
        reasons: list[str] = []
        try:
            return self._decorated(args, reasons)
        except TypeError as error:
            if reasons and FORWARD_MODE in str(error):
                raise TypeError(f"{FORWARD_MODE}: the bwd of {self.name} could not be embedded ({reasons[0]}), so "
                                "this call is jax.custom_vjp, whose reverse mode is JAX's and which has no forward "
                                "mode.") from error
            raise

    def route(self, *args: Any, **kwargs: Any) -> Route:
        """Whether a call on these arguments embeds the ``bwd`` (``Route.embedded``), or is ``jax.custom_vjp``
        (its reason); found by tracing the call for shapes, without running it."""
        args = self._resolved(args, kwargs)
        reasons: list[str] = []
        # (traced by shapes: the arrays of the differentiable arguments; the others as given, as bwd gets them, be
        # they a dtype, a function, or an int read in Python)
        differentiable = [k for k in range(len(args)) if k not in self.nondiff_argnums]

        def called(*values: Any) -> Any:
            return self._decorated(tuple(decorator_form.replaced(list(args), differentiable, list(values))), reasons)

        jax.eval_shape(called, *(args[k] for k in differentiable))
        return Route(embedded=False, reason=reasons[0]) if reasons else Route(embedded=True)

    def _resolved(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if self.fwd is None or self.bwd is None:
            raise AttributeError(f"No VJP defined for custom_vjp function {self.name} using defvjp.")
        if self.signature is None:
            return args
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(f"keyword arguments of {self.name} could not be resolved to positions")
        return tuple(bound.args)

    def _decorated(self, args: tuple[Any, ...], reasons: list[str]) -> Any:
        """The decorated call: f runs fwd and closes bwd over its residuals; ``reasons`` gets the reason where the
        bwd cannot be embedded, and the call is then ``jax.custom_vjp``'s."""
        fwd, bwd = typing_cast(self.fwd), typing_cast(self.bwd)
        nondiff = self.nondiff_argnums
        positions = tuple(k for k in range(len(args)) if k not in nondiff)  # (a tuple: the VJP's closure is keyed)
        symbolic = self.symbolic_zeros

        def f(*differentiable: Any) -> Any:
            given = dict(zip(positions, differentiable, strict=True))
            inputs = [given[k] if k in given else args[k] for k in range(len(args))]
            if symbolic:
                inputs = [jax.tree.map(lambda v, a: custom_derivatives.CustomVJPPrimal(v, _perturbed(a)), inputs[k],
                                       args[k]) if k in given else inputs[k] for k in range(len(args))]
            self._in_fwd.depth += 1
            try:
                output, residuals = fwd(*inputs)
            finally:
                self._in_fwd.depth -= 1

            expected = _expected(differentiable)  # (strings and shapes alone: the VJP is keyed by its closure)

            def vjp(cotangent: Any) -> Any:
                cotangents = bwd(*(args[k] for k in nondiff), residuals, cotangent)
                _check_as_jax_checks(cotangents, *expected)
                return tuple(cotangents)

            return output, vjp

        f.__name__ = f.__qualname__ = self.name

        def fallback(reason: str) -> Any:
            reasons.append(reason)
            return self.mechanism(*args)

        result = decorator_form.call_or_fall_back(f, tuple(args[k] for k in positions), self.order, fallback)
        if reasons or any(_differentiated(leaf) for k in positions for leaf in jax.tree.leaves(args[k])):
            return result  # (differentiated: fwd's value, as JAX gives it, without the carrier's cost eagerly)
        return _valued_as_jax_values_it(self.fun, args, result)


def _valued_as_jax_values_it(fun: Callable[..., Any], args: tuple[Any, ...], embedded: Any) -> Any:
    """The embedded call's result with ``jax.custom_vjp``'s value: ``fun``'s where nothing differentiates the call
    (under ``jit`` or ``vmap`` alone, where the decorator cannot know that nothing will), and the embedding's where
    something does (``fwd``'s output, with the derivative the ``bwd`` gives), as JAX chooses between them: a
    ``jax.custom_jvp`` of the arrays among the arguments and the result, whose primal is ``fun`` and whose rule
    passes the result and its tangent through. Under ``jit`` the embedding a plain call does not read is dead code."""
    leaves, structure = jax.tree.flatten(args)
    arrays = [k for k, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

    @jax.custom_jvp
    def valued(given: list[Any], result: Any) -> Any:
        return fun(*jax.tree.unflatten(structure, decorator_form.replaced(leaves, arrays, given)))

    @valued.defjvp
    def passed_through(primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> tuple[Any, Any]:
        return primals[1], tangents[1]

    return valued([leaves[k] for k in arrays], embedded)


_Leaves = tuple[tuple[tuple[tuple[int, ...], str], ...], ...]


def _expected(arguments: tuple[Any, ...]) -> tuple[str, _Leaves]:
    """What ``jax.custom_vjp`` checks a bwd's output against: the structure of the differentiable arguments, and each
    leaf's shape and type (``float32[3]``), by argument."""
    return (str(jax.tree.structure(arguments)),
            tuple(tuple((jnp.shape(x), _dtype_name(x)) for x in jax.tree.leaves(a)) for a in arguments))


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)  # (a Python number's as JAX takes it)
    return str(dtype if dtype is not None else jnp.result_type(value))


def _check_as_jax_checks(cotangents: Any, structure: str, leaves: _Leaves) -> None:
    """The bwd's output checked as ``jax.custom_vjp`` checks it, in its words, so that a search for the error finds
    JAX's answer: one cotangent (or None) per differentiable argument (TypeError), each of its argument's shape
    (ValueError)."""
    if isinstance(cotangents, list) and len(cotangents) == len(leaves):  # (JAX takes a list of that length too)
        cotangents = tuple(cotangents)
    if not isinstance(cotangents, tuple) or len(cotangents) != len(leaves):
        raise TypeError("Custom VJP bwd rule must produce an output with the same container (pytree) structure as "
                        "the args tuple of the primal function, and in particular must produce a tuple of length "
                        "equal to the number of arguments to the primal function, but got bwd output structure "
                        f"{jax.tree.structure(cotangents)} for primal input structure {structure}.")
    for k, (cotangent, expected) in enumerate(zip(cotangents, leaves, strict=True)):
        found = [] if cotangent is None else jax.tree_util.tree_flatten_with_path(cotangent)[0]
        for (path, ct), (shape, dtype) in zip(found, expected, strict=False):
            if ct is not None and jnp.shape(ct) != shape:
                raise ValueError(
                    "Custom VJP bwd rule must produce an output with the same type as the args tuple of the primal "
                    f"function, but at output{jax.tree_util.keystr((jax.tree_util.SequenceKey(k), *path))} the bwd "
                    f"rule produced an output of type {_type_of(jnp.shape(ct), _dtype_name(ct))} corresponding to an "
                    f"input of type {_type_of(shape, dtype)}, so the shapes do not match")


def _type_of(shape: tuple[int, ...], dtype: str) -> str:
    """As JAX writes an abstract value: ``float32[3,4]``."""
    return f"{dtype}[{','.join(str(n) for n in shape)}]"


_DERIVATIVES = ("JVPTracer", "LinearizeTracer")  # the tracers of a derivative being taken, in every JAX


def _tracers(value: Any) -> list[str]:
    """The kinds of the tracers that hold the value, outermost first: a vmap's ``BatchTracer`` holds the next in
    ``val``; none where the value is concrete."""
    kinds = []
    while isinstance(value, jax.core.Tracer):
        kinds.append(type(value).__name__)
        value = getattr(value, "val", None)
    return kinds


def _differentiated(value: Any) -> bool:
    """Whether a derivative of the value is being taken: a tracer of a derivative holds it (under a vmap's, with
    grad outside). Under ``jit`` alone no one can tell yet."""
    return any(kind in _DERIVATIVES for kind in _tracers(value))


def _perturbed(value: Any) -> bool:
    """``CustomVJPPrimal.perturbed`` for an argument as the call got it: false where it can never be differentiated
    (a concrete value, or one vmap batches), as JAX says it; true for a tracer of a derivative and for any other
    (under ``jit`` the decorator cannot know whether a derivative will be taken, and a fwd told false may drop what
    the bwd needs: JAX, which decides when it differentiates, may say false there)."""
    return any(kind != "BatchTracer" for kind in _tracers(value))


class _InFwd(threading.local):
    depth = 0


def typing_cast(function: Callable[..., Any] | None) -> Callable[..., Any]:
    assert function is not None  # (``_resolved`` has checked)
    return function
