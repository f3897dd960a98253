"""The decorator form in JAX: a VJP embedded as the linear map it is the transpose of.

``f(*args)`` returns ``(y, vjp)``, ``vjp(ct)`` the cotangents of the
positional arguments (as for ``jax.custom_gradient``). The VJP is traced
once, on cotangents of y's shapes, into a jaxpr; ``linear_primitives``
proves it linear from its primitives (or names the one that is not); and
``jax.linear_transpose`` of that jaxpr is J, applied to the zero v:

    h = y − zero_with_derivative_of(J·v),   v = stop(x) − x

v is +0.0 in value, so h is y bit for bit; the derivative of h w.r.t. x is
J, and J's transpose, the reverse-mode product, is the VJP again. Where y has
one element, J is vjp(1) and the identity form embeds it, ``h = y −
Σ zero_product(vjp(1), v)``, which keeps an infinite derivative.

At ``order=1`` everything the VJP closes over is stopped, so J is constant;
``second_derivative_guard`` makes a second derivative raise. At ``order=2``
f runs at x, so J moves with x, and J·v is ``identity.mapped_zero``: its
tangent is J·dv with J's own tangent left out, so the first derivative is
J, bit for bit as at ``order=1``, whatever J's derivative holds, and J moves
in the next derivative alone, which is J's Jacobian (reverse over reverse of
``jax.custom_vjp``, unsymmetrized). y is computed at ``stop(x)`` by a second
call, so that what f closes over keeps its autodiff (with x held). Under one
eager derivative alone (``sole_derivative``: an eager ``grad``, ``jvp``,
``vjp``), where J's own derivative cannot be asked, f runs once, on the
primal values, as ``jax.custom_vjp`` runs its fwd.

A VJP that cannot be embedded (not proven linear, or reading its cotangent's
value) is judged where a derivative is asked: the call gives y with a fence
(``second_derivative_guard.refused``) whose derivative w.r.t. the arguments
raises the error, so a plain call, ``jit`` or ``vmap`` runs as
``jax.custom_vjp`` does.

``vjp_conventions`` reads the arguments' leaves and the VJP's answer; all
the work after f (``_attached``) is compiled once per signature
(``_compiled``), with the key and the closed-over arrays from
``vjp_closure``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.extend import linear_util as lu
from jax.interpreters import partial_eval as pe

from stopgrad_math.jax import (
    identity,
    linear_primitives,
    masked_selects,
    second_derivative_guard,
    sole_derivative,
    vjp_closure,
)
from stopgrad_math.jax.vjp_conventions import Leaves, argument_cotangents, call_f, is_differentiable, name_of
from stopgrad_math.shared import arguments as arguments_of
from stopgrad_math.shared import bounded_cache, linearity, nesting
from stopgrad_math.shared.arguments import BEYOND_ORDER, undifferentiable
from stopgrad_math.shared.layouts import Layout
from stopgrad_math.shared.linearity import NotEmbeddable, State

_KEYWORD = ("{label} is a keyword argument of {name}, which the decorator holds constant: its vjp returns "
            "cotangents of the positional arguments alone, so a derivative w.r.t. {label} would be a silent 0. "
            "Pass it positionally and return its cotangent from the vjp, or stop it (jax.lax.stop_gradient).")


def _held_constant(f: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments are constants: the vjp gives cotangents of the positional arguments alone. Each
    floating leaf is held by the guard's fence, so that differentiating it raises, naming it, rather than giving
    a silent zero."""
    held = {}
    for keyword, value in kwargs.items():
        leaves = Leaves.of(value, keyword)
        held[keyword] = leaves.with_values({k: second_derivative_guard.held_constant(
            leaves.values[k], _KEYWORD.format(label=leaves.labels[k], name=name_of(f))) for k in leaves.differentiable})
    return held


# ---------------------------------------------------------------- the VJP, traced and proven linear


@dataclasses.dataclass
class _LinearMap:
    """The VJP as a jaxpr from the cotangents of y's differentiable leaves to those of the arguments'; a call
    gives the LINEAR results (the others are proven zero), each the cotangent of one argument leaf."""

    jaxpr: Any  # ClosedJaxpr
    cotangents: list[jax.ShapeDtypeStruct]  # one per differentiable output
    arguments: list[int]  # per kept result: the argument leaf it is the cotangent of
    kept: list[int]  # the positions of the kept results among the jaxpr's
    masked: masked_selects.Masked | None = None  # the map with its selects masked at their sources, where it has any

    def __call__(self, *cts: jax.Array, consts: list[Any]) -> list[jax.Array]:
        results = core.jaxpr_as_fun(core.ClosedJaxpr(self.jaxpr.jaxpr, consts))(*cts) if self.masked is None else (
            self.masked(consts, *cts))
        return [results[j] for j in self.kept]


def _staged(function: Callable[..., list[jax.Array]], avals: list[jax.ShapeDtypeStruct]) -> tuple[Any, set[int]]:
    """function's jaxpr as a ClosedJaxpr, and the results known to be zero where that is not in the jaxpr.

    ``jax.make_jaxpr`` stages every op, those on the residuals too; where the vjp reads a residual's value in
    Python (``2*g if x > 0 else 3*g``), and the residual is concrete (a call outside jit), the vjp is traced
    again in the cotangents alone: what does not depend on them is computed now, on the trace the call is in,
    and enters as a constant, so the vjp sees concrete residuals, as jax.custom_vjp's bwd does outside jit.
    A result computed that way is a constant: zero where its value is."""
    try:
        return jax.make_jaxpr(function)(*avals), set()
    except jax.errors.ConcretizationTypeError:
        pass
    if hasattr(core, "DebugInfo"):  # JAX from 0.5 names what it traces; 0.4.35 takes no name
        names = tuple(f"cotangent{k}" for k in range(len(avals)))
        wrapped = lu.wrap_init(function, debug_info=core.DebugInfo("custom_gradient", name_of(function), names, None))
    else:
        wrapped = lu.wrap_init(function)
    unknown = [pe.PartialVal.unknown(a if isinstance(a, jax.core.ShapedArray) else
                                     jax.core.ShapedArray(a.shape, a.dtype)) for a in avals]
    jaxpr, _, consts = pe.trace_to_jaxpr_nounits(wrapped, unknown, instantiate=True)
    constants = dict(zip(jaxpr.constvars, consts, strict=True))
    # a Literal (unhashable) is judged by the walk: a zero one is ZERO there
    zeros = {j for j, v in enumerate(jaxpr.outvars) if not isinstance(v, core.Literal)
             and _concrete_zero(constants.get(v))}
    return core.ClosedJaxpr(jaxpr, consts), zeros


def _cotangent_type(y: Any) -> Any:
    """The type a cotangent of y has: y's shape and dtype, and inside shard_map the manual axes y varies over
    (a cotangent of an invariant type there would make JAX mark it varying inside the VJP, a pvary, whose
    transpose is a psum)."""
    typeof = getattr(jax, "typeof", None) or getattr(jax.core, "get_aval")  # noqa: B009 (typeof from JAX 0.6)
    aval = typeof(y)
    if identity.varying(aval):
        return aval.update(weak_type=False)
    return jax.ShapeDtypeStruct(y.shape, y.dtype)  # type: ignore[no-untyped-call]


def _concrete_zero(value: Any) -> bool:
    if value is None or isinstance(value, jax.core.Tracer):
        return False
    return not np.any(np.asarray(value))


def _traced(f: Callable[..., Any], vjp: Callable[[Any], Any], args: tuple[Any, ...], names: list[str],
            leaves: Leaves, outputs: Leaves, order: int) -> _LinearMap:
    """vjp traced on cotangents of y's differentiable leaves, proven linear; ValueError naming what is not."""
    avals = [_cotangent_type(outputs.values[k]) for k in outputs.differentiable]
    fixed = {k: (np.zeros(np.shape(v), jax.dtypes.float0) if hasattr(v, "dtype") else None)
             for k, v in enumerate(outputs.values) if k not in outputs.differentiable}
    found: list[int] = []

    def cotangents(*cts: jax.Array) -> list[jax.Array]:
        with nesting.evaluating(order):
            result = vjp(outputs.with_values({**fixed, **dict(zip(outputs.differentiable, cts, strict=True))}))
        by_leaf = argument_cotangents(result, args, leaves, names, f)
        found[:] = list(by_leaf)
        return list(by_leaf.values())

    closed, zeros = _staged(cotangents, avals)
    states = [State.ZERO if j in zeros else state for j, state in enumerate(linear_primitives.judge(closed))]
    kept = [linearity.kept(state, name_of(f), leaves.labels[k], leaves.values[k], k in leaves.differentiable,
                           "stopgrad_math.jax.linear_primitives") for k, state in zip(found, states, strict=True)]
    return _LinearMap(closed, avals, [k for k, keep in zip(found, kept, strict=True) if keep],
                      [j for j, keep in enumerate(kept) if keep], masked_selects.masked(closed))


# ---------------------------------------------------------------- the embedding


def _one_element(outputs: Leaves, leaves: Leaves, linear: _LinearMap) -> bool:
    """Whether J is vjp(1): one differentiable output of one element, complex exactly where the arguments are
    (a real output of a complex argument, or the reverse, has a J that vjp(1) does not hold whole)."""
    if len(outputs.differentiable) != 1:
        return False
    y = outputs.values[outputs.differentiable[0]]
    complex_y = identity.is_complex(y.dtype)
    return y.size == 1 and all(identity.is_complex(leaves.values[k].dtype) == complex_y for k in linear.arguments)


def _ones_of_type(cotangent_type: Any) -> jax.Array:
    """Ones of a cotangent's type, varying over the manual axes of shard_map it varies over (``jnp.ones`` is
    invariant there, and the VJP's product of it with a varying value is refused by shard_map's check)."""
    ones = jnp.ones(cotangent_type.shape, cotangent_type.dtype)
    axes = tuple(identity.varying(cotangent_type))
    if not axes:
        return ones
    pcast = getattr(jax.lax, "pcast", None)  # JAX 0.10; pvary before
    varied: jax.Array = pcast(ones, axes, to="varying") if pcast is not None else jax.lax.pvary(  # type: ignore[attr-defined]
        ones, axes)
    return varied


def _terms(f: Callable[..., Any], outputs: Leaves, leaves: Leaves, linear: _LinearMap, consts: list[Any],
           vs: list[jax.Array], order: int) -> dict[int, jax.Array]:
    """The zero term of each differentiable output: +0.0 with derivative J; ``vs``: stop(x) − x for each argument
    leaf of ``linear.arguments``. At ``order=2`` J moves with ``consts``, and its own derivative reaches the second
    derivative alone (``mixed=False``, ``mapped_zero``)."""
    if _one_element(outputs, leaves, linear):  # the identity form, with the Jacobian's one row vjp(1)
        index = outputs.differentiable[0]
        y = outputs.values[index]
        gradients = linear(_ones_of_type(linear.cotangents[0]), consts=consts)
        terms = [identity.zero_term(Layout.SCALAR, y, leaves.values[k], g, zero, mixed=False)
                 for k, g, zero in zip(linear.arguments, gradients, vs, strict=True)]
        return {index: jnp.reshape(sum(terms, jnp.zeros((), y.dtype)), y.shape)}
    if not vs:
        return {}

    def products(consts: list[Any], vs: list[jax.Array]) -> list[jax.Array]:
        """J·v, J the transpose of the VJP at ``consts``."""
        transpose = jax.linear_transpose(lambda *cts: linear(*cts, consts=consts), *linear.cotangents)
        try:
            return list(transpose(vs))
        except (AssertionError, NotImplementedError, TypeError) as error:  # proven linear; JAX cannot transpose it
            # (0.4.35 raises a TypeError on an undefined primal where 0.10 raises NotImplementedError, for cg)
            return _products_by_columns(f, linear, consts, vs, error)

    if order == 2:
        zeros = identity.mapped_zero(products, consts, vs)
    else:
        zeros = [identity.zero_with_derivative_of(p) for p in products(consts, vs)]
    return dict(zip(outputs.differentiable, zeros, strict=True))


# J·v by columns holds vjp's Jacobian whole: up to this many elements (64 MiB of float32).
COLUMNS_KEPT = 2**24


def _products_by_columns(f: Callable[..., Any], linear: _LinearMap, consts: list[Any], vs: list[jax.Array],
                         error: Exception) -> list[jax.Array]:
    """J·v without jax.linear_transpose, for a linear map JAX cannot transpose (custom_linear_solve with
    constants it builds from the cotangent, as jax.scipy.sparse.linalg.cg; a scatter whose indices are not known
    to be unique; a scan on JAX 0.4.35): element a of output j's product is Σ_i ⟨vjp(e_a)_i, v_i⟩, the map
    applied to every basis cotangent e_a at once under vmap."""
    sizes = [identity.size(c.shape) for c in linear.cotangents]
    rows, columns = sum(sizes), sum(identity.size(v.shape) for v in vs)
    if rows * columns > COLUMNS_KEPT:
        raise ValueError(
            f"The vjp of {name_of(f)} is linear, but this version of JAX ({jax.__version__}) cannot transpose it "
            f"({type(error).__name__} in jax.linear_transpose: {str(error).splitlines()[0] if str(error) else ''}), "
            f"and its Jacobian, of {rows} by {columns} elements, is too large to build by columns (over "
            f"{COLUMNS_KEPT}).") from error
    products = []
    for j, (cotangent, size) in enumerate(zip(linear.cotangents, sizes, strict=True)):

        def column(basis: jax.Array, j: int = j, dtype: Any = cotangent.dtype) -> jax.Array:
            cts = [jnp.reshape(basis, c.shape) if i == j else jnp.zeros(c.shape, c.dtype)
                   for i, c in enumerate(linear.cotangents)]
            return sum((jnp.sum(r * v) for r, v in zip(linear(*cts, consts=consts), vs, strict=True)),
                       jnp.zeros((), dtype))

        products.append(jnp.reshape(jax.vmap(column)(jnp.eye(size, dtype=cotangent.dtype)), cotangent.shape))
    return products


def _embed(f: Callable[..., Any], args: tuple[Any, ...], names: list[str], kwargs: dict[str, Any], order: int,
           guard: bool, fallback: Callable[[str], Any] | None = None) -> Any:
    leaves = Leaves.of_arguments(args, names)
    if not leaves.differentiable:
        return call_f(f, args, kwargs)[0]
    stopped = {k: identity.stop(leaves.values[k]) for k in leaves.differentiable}
    if not differentiating(args, kwargs):  # y as every order computes it, at stop(x); the VJP is never traced
        return call_f(f, leaves.with_values(stopped), kwargs)[0]
    y, vjp, beyond = _evaluated(f, leaves, stopped, kwargs, order)
    outputs = Leaves.of(y, "y")
    if not outputs.differentiable:
        return y
    order = 1 if beyond is not None else order
    call = _Call(f, names, leaves, outputs, order, guard, beyond or BEYOND_ORDER[order].format(name=name_of(f)))
    try:
        attached = _compiled(call, vjp)
        if attached is None:
            attached = _attached(call, vjp, [leaves.values[k] for k in leaves.differentiable],
                                 [outputs.values[k] for k in outputs.differentiable])
    except (NotEmbeddable, jax.errors.ConcretizationTypeError) as error:  # (the latter: a read of the cotangent)
        if fallback is not None:
            return fallback(str(error))
        watched = [leaves.values[k] for k in leaves.differentiable]
        attached = [second_derivative_guard.refused(outputs.values[k], watched, type(error), str(error))
                    for k in outputs.differentiable]
    return outputs.with_values(dict(zip(outputs.differentiable, attached, strict=True)))


def _evaluated(f: Callable[..., Any], leaves: Leaves, stopped: dict[int, jax.Array], kwargs: dict[str, Any],
               order: int) -> tuple[Any, Callable[[Any], Any], str | None]:
    """y, the VJP, and None, or the reason a second derivative cannot be given. Under one eager derivative alone
    (``sole_derivative``), f runs once on the primal values; else at ``stop(x)`` (order 1), or at x for the VJP's
    residuals, which move with x, and again at ``stop(x)`` for y, with what f closes over live (order 2). Where JAX
    cannot differentiate f at x (a ``custom_vmap`` in it, a ``jax.custom_vjp`` under forward mode), a first
    derivative needs none of that: the call is order 1's, and its second derivative raises, naming the error."""
    below = sole_derivative.trace_below()
    if below is not None and not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(kwargs)):
        try:
            with sole_derivative.running_below(below):
                return (*call_f(f, leaves.with_values(stopped), kwargs), None)
        except jax.errors.UnexpectedTracerError:  # f reads a value differentiated besides its arguments
            pass
    if order == 1:
        return (*call_f(f, leaves.with_values(stopped), kwargs), None)
    try:
        vjp = call_f(f, leaves.with_values({}), kwargs)[1]
    except Exception as error:
        y, vjp = call_f(f, leaves.with_values(stopped), kwargs)
        return y, vjp, undifferentiable("JAX", error).format(name=name_of(f))
    return call_f(f, leaves.with_values(stopped), kwargs)[0], vjp, None


def differentiating(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a derivative of a call on these arguments can be taken. A JAX transform makes each argument it
    differentiates a tracer (and ``jit`` every argument), so a call on concrete values alone, eagerly, is never
    differentiated: it gives f's value without tracing its VJP, as ``jax.custom_vjp`` runs ``fun`` alone. (What
    f closes over keeps its own autodiff, as y at stop(x) keeps it in every call.)"""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves((args, kwargs)))


@dataclasses.dataclass(frozen=True)
class _Call:
    """One decorated call, after f: what the embedding of its VJP is built from."""

    f: Callable[..., Any]
    names: list[str]
    leaves: Leaves  # the arguments
    outputs: Leaves  # y
    order: int
    guard: bool
    beyond: str  # what a derivative beyond ``order`` raises

    def over(self, arguments: list[jax.Array], ys: list[jax.Array]) -> _Call:
        """The same call with other values of the differentiable leaves (tracers of its compiled embedding)."""
        leaves, outputs = self.leaves, self.outputs
        return dataclasses.replace(
            self, leaves=dataclasses.replace(leaves, values=replaced(leaves.values, leaves.differentiable, arguments)),
            outputs=dataclasses.replace(outputs, values=replaced(outputs.values, outputs.differentiable, ys)))


    def shapes(self) -> _Call:
        """The call with each array leaf, differentiable or not, a ShapeDtypeStruct, and f its name alone: what a
        compiled embedding is built from, which keeps none of this call's arrays alive in the cache (f would keep
        what it closes over)."""
        named = typing.cast(Callable[..., Any], _Named(name_of(self.f)))  # f is only named there, never called
        return dataclasses.replace(self, f=named, leaves=_shapes(self.leaves), outputs=_shapes(self.outputs))


class _Named:
    """A function's name alone, which is all a compiled embedding reads of f (for its messages)."""

    def __init__(self, name: str):
        self.__name__ = name


def _shapes(leaves: Leaves) -> Leaves:
    return dataclasses.replace(leaves, values=[_shape_of(v) if _is_array_like(v) else v for v in leaves.values])


def _is_array_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def replaced(values: list[Any], indices: list[int], new: list[Any]) -> list[Any]:
    """``values`` with those at ``indices`` replaced by ``new``, in order (a copy)."""
    copy = list(values)
    for k, value in zip(indices, new, strict=True):
        copy[k] = value
    return copy


def _attached(call: _Call, vjp: Callable[[Any], Any], arguments: list[jax.Array],
              ys: list[jax.Array]) -> list[jax.Array]:
    """Each differentiable output with its zero term attached: the VJP traced, proven linear and transposed."""
    call = call.over(arguments, ys)
    leaves, outputs, order = call.leaves, call.outputs, call.order
    linear = _traced(call.f, vjp, tuple(leaves.with_values({})), call.names, leaves, outputs, order)
    consts = list(linear.jaxpr.consts)
    watched = [leaves.values[k] for k in leaves.differentiable] + [c for c in consts if is_differentiable(c)]
    if order == 1:
        consts = [identity.stop(c) if is_differentiable(c) else c for c in consts]
    zeros = [identity.zero_with_slope(leaves.values[k], slope_is_negative=True) for k in linear.arguments]
    if call.guard:
        zeros = [second_derivative_guard.guarded(zero, watched, order, call.beyond) for zero in zeros]
    terms = _terms(call.f, outputs, leaves, linear, consts, zeros, order)
    return [identity.attach(outputs.values[k], [terms[k]]) if k in terms else outputs.values[k]
            for k in outputs.differentiable]


# The compiled embeddings, by what determines them (``_signature``); an eager call with a known signature runs
# one compiled computation, rather than tracing, proving and transposing its VJP again.
EMBEDDINGS_KEPT = 256
_EMBEDDINGS: bounded_cache.BoundedCache[Any] = bounded_cache.BoundedCache(EMBEDDINGS_KEPT)
_TRACED_AT_EVERY_CALL = object()  # a signature whose VJP reads a residual's value in Python


def _compiled(call: _Call, vjp: Callable[[Any], Any]) -> list[jax.Array] | None:
    """``_attached``, compiled once per signature with the VJP's closed-over arrays as arguments; None where the
    VJP cannot be keyed (``vjp_closure``) or reads a residual's value in Python, and is traced at every call."""
    opened = vjp_closure.opened(vjp)
    signature = None if opened is None else _signature(call, opened)
    if opened is None or signature is None:
        return None
    compiled = _EMBEDDINGS.get(signature)
    if compiled is _TRACED_AT_EVERY_CALL:
        return None
    if compiled is None:
        template = call.shapes()
        rebuild = opened.rebuild
        compiled = jax.jit(lambda arguments, ys, arrays: _attached(template, rebuild(arrays), arguments, ys))
    try:
        attached: list[jax.Array] = compiled(_values(call.leaves), _values(call.outputs), opened.arrays)
    except jax.errors.JAXTypeError:  # as jax.custom_vjp's bwd, the VJP branches on a concrete residual or number
        _EMBEDDINGS.put(signature, _TRACED_AT_EVERY_CALL)  # (float(), bool(), np.asarray() of a tracer)
        return None
    _EMBEDDINGS.put(signature, compiled)
    return attached


def _shape_of(array: jax.Array) -> Any:
    return jax.ShapeDtypeStruct(array.shape, array.dtype)  # type: ignore[no-untyped-call]


def _values(leaves: Leaves) -> list[jax.Array]:
    return [leaves.values[k] for k in leaves.differentiable]


def _signature(call: _Call, opened: vjp_closure.Opened) -> Hashable | None:
    """What the compiled embedding depends on: the VJP's key, the call's options and names, and each leaf of the
    arguments and of y (a differentiable or array leaf by shape and dtype, another by value); None where a leaf
    is of another kind."""
    try:
        leaves = tuple(_leaf_key(v) for v in call.leaves.values)
        outputs = tuple(_leaf_key(v) for v in call.outputs.values)
    except TypeError:
        return None
    return (opened.key, name_of(call.f), tuple(call.names), call.order, call.guard, call.beyond,
            jax.dtypes.canonicalize_dtype(np.float64),  # whether float64 is enabled
            call.leaves.structure, leaves, tuple(call.leaves.differentiable), call.outputs.structure, outputs,
            tuple(call.outputs.differentiable))


def _leaf_key(value: Any) -> Hashable:
    if _is_array_like(value):
        return vjp_closure.aval_key(value)
    if type(value) in (type(None), bool, int, float, complex, str, bytes):
        return type(value), value
    raise TypeError(type(value).__name__)


def decorate(f: Callable[..., Any], order: int = 1, check_linearity: bool = False) -> Callable[..., Any]:
    """Returns f with its VJP embedded as a linear map; the contract is on ``custom_gradient``.

    ``check_linearity`` is accepted for the TensorFlow namespace's signature:
    on JAX every VJP is traced, so its linearity is always proven.
    """
    arguments_of.check_options(order, check_linearity)
    return nesting.decorated(f, order, _embed, keywords=_held_constant)


def call_or_fall_back(f: Callable[..., Any], args: tuple[Any, ...], order: int,
                      fallback: Callable[[str], Any]) -> Any:
    """``decorate(f, order)(*args)``, but where the VJP cannot be embedded (``NotEmbeddable``, or a read of its
    cotangent's value), the value ``fallback(reason)`` rather than the error (``stopgrad_math.jax.custom_vjp``'s
    hand-back to jax.custom_vjp)."""
    return nesting.call(f, args, {}, order, _embed, keywords=_held_constant, fallback=fallback)
