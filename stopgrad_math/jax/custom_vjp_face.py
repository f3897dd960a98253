"""``jax.custom_vjp``'s API on the decorator: an existing ``fwd`` and ``bwd``, every mode from the ``bwd``.

``custom_vjp(fun, nondiff_argnums=..., nondiff_argnames=...)`` and ``.defvjp(fwd, bwd)`` are read as JAX reads them:
keyword arguments resolved to positions, the non-differentiable arguments passed to ``bwd`` first, then the
residuals and the output's cotangent; ``bwd`` returns one cotangent (or None) per differentiable argument. Each call
is one decorated call (``custom_gradient``): ``fwd`` is f, and ``bwd`` with its residuals the VJP, so ``jvp``,
``jacfwd`` and ``linearize`` come from the ``bwd`` as ``grad`` does. Where the decorator cannot embed the ``bwd``
(not linear in its cotangent, as JAX's documented ``clip_gradient``, reading the cotangent's value, an output JAX
refuses) or is promised what only JAX's reverse mode knows (``symbolic_zeros``), the call is ``jax.custom_vjp`` of
the same functions: reverse mode is JAX's own, and forward mode raises, naming the reason (``forward_refusal``).
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

from stopgrad_math.jax import decorator_form, forward_refusal
from stopgrad_math.shared.linearity import NotEmbeddable, Route

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
        """As ``jax.custom_vjp.defvjp``. With ``symbolic_zeros``, every call is ``jax.custom_vjp``'s: its fwd and
        bwd are given JAX's ``CustomVJPPrimal`` and ``SymbolicZero``, which JAX's reverse mode alone knows, and
        forward mode raises, naming that. With ``optimize_remat``, the value is ``fun``'s."""
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
        return self._decorated(args, [])

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
        try:  # (JAX's words, so that a search for the error finds JAX's answer)
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if bound.kwargs:
                raise TypeError("The following keyword arguments could not be resolved to positions: "
                                f"{', '.join(k for k in bound.kwargs if k in kwargs)}")
        except TypeError as error:
            raise TypeError(f"The input arguments to the custom_vjp-decorated function {self.name} could not be "
                            f"resolved to positional-only arguments. Binding failed with the error:\n{error}") from None
        return tuple(bound.args)

    def _decorated(self, args: tuple[Any, ...], reasons: list[str]) -> Any:
        """The decorated call: f runs fwd and closes bwd over its residuals; ``reasons`` gets the reason where the
        bwd cannot be embedded, and the call is then ``jax.custom_vjp``'s."""
        fwd, bwd = typing_cast(self.fwd), typing_cast(self.bwd)
        nondiff = self.nondiff_argnums
        positions = tuple(k for k in range(len(args)) if k not in nondiff)  # (a tuple: the VJP's closure is keyed)
        fun = self.fun if self.optimize_remat else None

        def f(*differentiable: Any) -> Any:
            given = dict(zip(positions, differentiable, strict=True))
            inputs = [given[k] if k in given else args[k] for k in range(len(args))]
            self._in_fwd.depth += 1
            try:
                output, residuals = fwd(*inputs)
            finally:
                self._in_fwd.depth -= 1
            if fun is not None:  # fun's value, which JAX gives where it drops the residuals, and agrees with fwd's
                output = fun(*inputs)

            expected = _expected(differentiable)  # (strings and shapes alone: the VJP is keyed by its closure)

            def vjp(cotangent: Any) -> Any:
                cotangents = bwd(*(args[k] for k in nondiff), residuals, cotangent)
                return _read_as_jax_reads(cotangents, [args[k] for k in positions], *expected)

            return output, vjp

        f.__name__ = f.__qualname__ = self.name

        def fallback(reason: str) -> Any:
            reasons.append(reason)
            message = (f"{FORWARD_MODE}: the bwd of {self.name} could not be embedded ({reason}), so this call is "
                       "jax.custom_vjp, whose reverse mode is JAX's and which has no forward mode.")
            return self.mechanism(*(args[k] if k in nondiff else forward_refusal.refusing_forward(args[k], message)
                                    for k in range(len(args))))

        if self.symbolic_zeros:
            return fallback(SYMBOLIC_ZEROS)
        result = decorator_form.call_or_fall_back(f, tuple(args[k] for k in positions), self.order, fallback)
        if reasons or any(_differentiated(leaf) for k in positions for leaf in jax.tree.leaves(args[k])):
            return result  # (differentiated: fwd's value, as JAX gives it, without the carrier's cost eagerly)
        return _valued_as_jax_values_it(self, args, result)


SYMBOLIC_ZEROS = ("symbolic_zeros=True: its fwd and bwd are given what JAX knows of each derivative, which input "
                  "is perturbed and which cotangent is a symbolic zero, and only JAX's reverse mode knows it")


def _valued_as_jax_values_it(face: custom_vjp, args: tuple[Any, ...], embedded: Any) -> Any:
    """The embedded call's result with ``jax.custom_vjp``'s value: ``fun``'s where nothing differentiates the call
    (under ``jit`` or ``vmap`` alone, where the decorator cannot know that nothing will), and the embedding's where
    something does (``fwd``'s output, with the derivative the ``bwd`` gives), as JAX chooses between them: a
    ``jax.custom_jvp`` of the arrays among the arguments and the result, whose primal is ``fun`` and whose rule
    passes the result and its tangent through. Under ``jit`` the embedding a plain call does not read is dead code.
    There, where ``fun`` runs beside ``fwd``, their outputs are checked to agree in structure, shapes and dtypes,
    as JAX checks them where it has run ``fun``."""
    leaves, structure = jax.tree.flatten(args)
    arrays = [k for k, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

    @jax.custom_jvp
    def valued(given: list[Any], result: Any) -> Any:
        value = face.fun(*jax.tree.unflatten(structure, decorator_form.replaced(leaves, arrays, given)))
        _check_fwd_as_jax_checks(face, result, value)
        return value

    @valued.defjvp
    def passed_through(primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> tuple[Any, Any]:
        return primals[1], tangents[1]

    return valued([leaves[k] for k in arrays], embedded)


def _check_fwd_as_jax_checks(face: custom_vjp, fwd_value: Any, fun_value: Any) -> None:
    """TypeError, in JAX's words, where fwd's output is not of fun's structure, shapes and dtypes."""
    def typed(value: Any) -> tuple[Any, str]:
        leaves, structure = jax.tree.flatten(value)
        types = [_type_of(jnp.shape(v), _dtype_name(v)) for v in leaves]
        return structure, str(jax.tree.unflatten(structure, types)).replace("'", "")

    (fwd_structure, fwd_types), (fun_structure, fun_types) = typed(fwd_value), typed(fun_value)
    if fwd_structure != fun_structure:
        found, end = "container/pytree structure:", "."
    elif fwd_types != fun_types:
        found, end = "shapes/dtypes of:", ""
    else:
        return
    fwd_name = getattr(face.fwd, "__name__", repr(face.fwd))
    raise TypeError(
        f"Custom VJP fwd rule {fwd_name} for function {face.name} must produce a pair (list or tuple of length two) "
        "where the first element represents the primal output (equal to the output of the custom_vjp-decorated "
        f"function {face.name}) and the second element represents residuals (i.e. values stored from the forward "
        f"pass for use on the backward pass), but instead the fwd rule output's first element had {found}\n"
        f"    {fwd_types}\nwhile the custom_vjp-decorated function {face.name} had output {found}\n"
        f"    {fun_types}{end}")


_Leaves = tuple[tuple[tuple[tuple[int, ...], str], ...], ...]


def _expected(arguments: tuple[Any, ...]) -> tuple[str, _Leaves]:
    """What ``jax.custom_vjp`` checks a bwd's output against: the structure of the differentiable arguments, and each
    leaf's shape and type (``float32[3]``), by argument."""
    return (str(jax.tree.structure(arguments)),
            tuple(tuple((jnp.shape(x), _dtype_name(x)) for x in jax.tree.leaves(a)) for a in arguments))


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)  # (a Python number's as JAX takes it)
    return str(dtype if dtype is not None else jnp.result_type(value))


def _read_as_jax_reads(cotangents: Any, arguments: list[Any], structure: str, leaves: _Leaves) -> tuple[Any, ...]:
    """The bwd's output read as ``jax.custom_vjp`` reads it: a tuple (or list) of one cotangent per differentiable
    argument, each None or a tree of the argument's structure where a None stands for a subtree's zeros and a leaf
    for a subtree of one leaf, each leaf of its argument's shape; returned with each cotangent in its argument's
    structure. Where JAX would raise, ``NotEmbeddable``, in JAX's words: the call is then JAX's mechanism, which
    raises its own error where a derivative is taken, and runs where none is, as JAX's does."""
    if isinstance(cotangents, list) and len(cotangents) == len(leaves):
        cotangents = tuple(cotangents)
    if not isinstance(cotangents, tuple) or len(cotangents) != len(leaves):
        raise NotEmbeddable(
            "Custom VJP bwd rule must produce an output with the same container (pytree) structure as the args "
            "tuple of the primal function, and in particular must produce a tuple of length equal to the number of "
            f"arguments to the primal function, but got bwd output structure {jax.tree.structure(cotangents)} for "
            f"primal input structure {structure}.")
    return tuple(None if ct is None else _in_structure_of(k, ct, argument, expected)
                 for k, (ct, argument, expected) in enumerate(zip(cotangents, arguments, leaves, strict=True)))


def _in_structure_of(k: int, cotangent: Any, argument: Any, expected: tuple[tuple[tuple[int, ...], str], ...]) -> Any:
    """One argument's cotangent in its structure (``_read_as_jax_reads``)."""
    structure = jax.tree.structure(argument)
    dummy = jax.tree.unflatten(structure, [0] * len(jax.tree.leaves(argument)))
    given = jax.tree.flatten(cotangent, is_leaf=lambda ct: ct is None)  # (a None is a leaf here: a subtree's zeros)
    try:
        subtrees = given[1].flatten_up_to(dummy)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as error:
        raise NotEmbeddable(f"Custom VJP bwd rule produced an output at output[{k}] whose structure is not a prefix "
                            f"of its argument's: {error}") from None
    flat: list[Any] = []
    for ct, subtree in zip(given[0], subtrees, strict=True):
        flat.extend([None] * len(jax.tree.leaves(subtree)) if ct is None else [ct])
    if len(flat) != len(expected):
        raise NotEmbeddable(f"Custom VJP bwd rule produced {len(flat)} cotangents at output[{k}] for an argument "
                            f"of {len(expected)} leaves.")
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]
    for path, ct, (shape, dtype) in zip(paths, flat, expected, strict=True):
        if ct is not None and jnp.shape(ct) != shape:
            raise NotEmbeddable(
                "Custom VJP bwd rule must produce an output with the same type as the args tuple of the primal "
                f"function, but at output{jax.tree_util.keystr((jax.tree_util.SequenceKey(k), *path))} the bwd "
                f"rule produced an output of type {_type_of(jnp.shape(ct), _dtype_name(ct))} corresponding to an "
                f"input of type {_type_of(shape, dtype)}, so the shapes do not match")
    try:  # as given where it has the argument's structure (a custom node's unflatten may not take a None)
        structure.flatten_up_to(cotangent)  # type: ignore[attr-defined]
        return cotangent
    except (TypeError, ValueError):
        return jax.tree.unflatten(structure, flat)


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


class _InFwd(threading.local):
    depth = 0


def typing_cast(function: Callable[..., Any] | None) -> Callable[..., Any]:
    assert function is not None  # (``_resolved`` has checked)
    return function
