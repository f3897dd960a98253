"""The stop-gradient identity in JAX: stop, the exact zero with slope one, and attaching terms to a value.

    h = stop(f) − zero_product(stop(g), stop(x) − x)

``stop(x) − x`` is +0.0 for every finite x (the carrier stands in where x is
inf or NaN, +0.0 with the same slope), and ``zero_product`` is the constant
+0.0 in value whatever g is (inf, NaN), so ``f − (+0.0)`` is f bit for bit;
the derivative of h is g at every element. Made of ``jax.lax.stop_gradient``,
arithmetic and two small primitives, one whose tangent is the product rule and
the carrier, whose tangent is its operand's, so that ``grad``, ``jvp``,
``vmap``, ``jit`` and their compositions all see an ordinary function.
"""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from stopgrad_math.shared.layouts import Layout

stop = jax.lax.stop_gradient


_zero_product_p = core.Primitive("stopgrad_math_zero_product")


def _constant_zero(g: jax.Array, zero: jax.Array, *, mixed: bool = True) -> jax.Array:
    # The value reads neither factor: under jit, g then has one consumer (the derivative), and XLA fuses it there
    # rather than materializing it for a value that is +0.0 anyway.
    return jnp.zeros(zero.shape, zero.dtype)


def _zero_product_jvp(primals: list[jax.Array], tangents: list[Any], *, mixed: bool) -> tuple[jax.Array, Any]:
    g, zero = primals
    product = _zero_product_p.bind(g, zero, mixed=mixed)
    if not mixed:  # g·dzero alone: g's own tangent reaches the next derivative, through g in this one
        dzero = tangents[1]
        return product, dzero if type(dzero) is ad.Zero else g * dzero  # (zero has the product's type)
    dg, dzero = (ad.instantiate_zeros(t) for t in tangents)  # a NaN g's NaN·0 is kept: a lost derivative shows
    return product, g * dzero + dg * zero


def _zero_product_transpose(ct: Any, g: Any, zero: Any, *, mixed: bool) -> list[Any]:
    if type(ct) is ad.Zero:
        return [None, None]
    if ad.is_undefined_primal(zero) and not ad.is_undefined_primal(g):
        return [None, g * ct]
    if ad.is_undefined_primal(g) and not ad.is_undefined_primal(zero):
        return [zero * ct, None]
    raise NotImplementedError("the product of two linear values is not linear")


def _zero_product_batch(args: list[jax.Array], dims: list[Any], *, mixed: bool) -> tuple[jax.Array, int]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    g, zero = (batching.bdim_at_front(a, d, size) for a, d in zip(args, dims, strict=True))
    return _zero_product_p.bind(g, zero, mixed=mixed), 0


def checked_by_shard_map(primitive: Any, constant: bool = False, as_first: bool = False) -> None:
    """Registers a primitive with the replication check of shard_map before ``jax.shard_map`` (``check_rep``,
    JAX 0.4.35 to 0.5), which wants a rule for each primitive; later JAX reads the manual axes from the types
    the abstract evaluation gives. ``constant``: the value is the same on every device (a fence's 1.0);
    ``as_first``: it is the first operand's (the guard's v); else it is replicated where every operand is (the
    rewrite broadcasts them to that, as for JAX's own binary ops)."""
    if hasattr(jax, "shard_map"):
        return
    shard_map: Any = importlib.import_module("jax.experimental.shard_map")  # (typed by the newest JAX, without it)

    def replication(mesh: Any, *replicated: Any, **params: Any) -> Any:
        known = [r for r in (replicated[:1] if as_first else replicated) if r is not None]
        return set(mesh.axis_names) if constant or not known else set.intersection(*known)

    shard_map.register_check(primitive)(replication)
    if constant or as_first:
        shard_map.register_norewrite(primitive)
    else:
        shard_map.register_standard_rewrite(primitive)


_zero_product_p.def_impl(_constant_zero)
def _zero_product_type(g: Any, zero: Any, *, mixed: bool) -> Any:
    """The product's type: zero's shape and dtype, and, inside shard_map, varying over the manual axes either
    factor varies over (JAX 0.6 to 0.9 call them ``vma``, 0.10 ``mat.varying``), as a product's type is: an
    invariant type there would make JAX mark the result varying again (pvary) where it already is."""
    shaped = jax.core.ShapedArray(zero.shape, zero.dtype)
    if varying(g) <= varying(zero):
        return zero.update(weak_type=False) if varying(zero) else shaped
    return g.update(weak_type=False) if varying(zero) <= varying(g) else shaped


def varying(aval: Any) -> frozenset[Any]:
    """The manual axes of shard_map a type varies over (empty outside it, and before JAX 0.6)."""
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "mat", None), "varying", None)
    return frozenset(vma or ())


_zero_product_p.def_abstract_eval(_zero_product_type)
mlir.register_lowering(_zero_product_p, mlir.lower_fun(_constant_zero, multiple_results=False))
ad.primitive_jvps[_zero_product_p] = _zero_product_jvp
ad.primitive_transposes[_zero_product_p] = _zero_product_transpose
batching.primitive_batchers[_zero_product_p] = _zero_product_batch
checked_by_shard_map(_zero_product_p)


def zero_product(g: jax.Array, zero: jax.Array, mixed: bool = True) -> jax.Array:
    """g·zero where one factor is an exact zero in value: +0.0 whatever the other is (inf, NaN); broadcasting.

    Every use in the library multiplies by ``stop(x) − x`` (+0.0, and the
    carrier's +0.0 where x is not finite), so the product is +0.0 in value,
    and its value is the constant +0.0: it does not read g, so XLA computes
    g once, for the derivative alone, as ``jax.custom_jvp`` does. Its tangent is
    ``g·dzero + dg·zero``, the product rule written with plain products:
    linear in the tangents, so forward and reverse mode agree and every
    transform composes; an infinite g gives an infinite derivative (JAX has
    no multiply_no_nan, and a select that masked the value would mask the
    derivative too). ``dg·zero`` is zero in value but keeps its slope in
    zero, which second derivatives mixing g's arguments with x need
    (``partial_custom_gradient``). ``mixed=False`` drops it: the tangent is
    ``g·dzero`` alone, so the first derivative is g whatever g's own
    derivative holds, and g's tangent reaches only the next derivative, the
    Jacobian of g (the decorator at ``order=2``, where g is the declared
    gradient). A primitive, not a ``jax.custom_jvp``:
    differentiating a scan or fori_loop partially evaluates its body, where
    JAX inlines a custom_jvp without its rule, and second derivatives through
    a loop were silently wrong.
    """
    dtype = jnp.result_type(g, zero)
    shape = jnp.broadcast_shapes(jnp.shape(g), jnp.shape(zero))
    return _zero_product_p.bind(jnp.broadcast_to(jnp.asarray(g, dtype), shape),
                                jnp.broadcast_to(jnp.asarray(zero, dtype), shape), mixed=mixed)


# The carrier: +0.0 in value whatever a is, with a's derivative. Ordinary ops give a zero with a's derivative only
# where a is finite (a − stop(a) is inf − inf = NaN at an inf); at a NaN or inf element a select keeps +0.0 in
# value and, whichever branch it takes there, masks the derivative with it.
_carried_zero_p = core.Primitive("stopgrad_math_carried_zero")


def _carried_zero_jvp(primals: list[jax.Array], tangents: list[Any]) -> tuple[jax.Array, Any]:
    (a,), (da,) = primals, tangents
    return _carried_zero_p.bind(a), da  # the tangent passes as it is: linear, and a symbolic zero stays one


def _carried_zero_batch(args: list[jax.Array], dims: list[Any]) -> tuple[jax.Array, Any]:
    return _carried_zero_p.bind(args[0]), dims[0]


def _zeros_like(a: jax.Array) -> jax.Array:
    return jnp.zeros(np.shape(a), jnp.result_type(a))  # a may be a Python number a transform made a tracer of


_carried_zero_p.def_impl(_zeros_like)
_carried_zero_p.def_abstract_eval(lambda a: a.update(weak_type=False))
mlir.register_lowering(_carried_zero_p, mlir.lower_fun(_zeros_like, multiple_results=False))
ad.primitive_jvps[_carried_zero_p] = _carried_zero_jvp
batching.primitive_batchers[_carried_zero_p] = _carried_zero_batch
checked_by_shard_map(_carried_zero_p)


def carried_zero(a: jax.Array) -> jax.Array:
    """+0.0 in a's shape and dtype, with a's derivative at every element, inf and NaN included.

    The one piece of the identity that ordinary ops cannot express: its
    value is the constant +0.0 (it reads nothing of a, so XLA computes
    nothing for it), and its tangent is a's tangent as it is, so an inf or
    NaN value of a cuts no derivative, and a symbolic zero tangent stays
    symbolic (a NaN elsewhere in a product never multiplies a zero that is
    not there). Where a is finite, ``a − stop(a)`` gives the same value and
    tangent bit for bit.
    """
    return _carried_zero_p.bind(a)


# The linear map's zero: J(c)·v for the zero v, whose value is the constant +0.0 and whose tangent is J(c)·dv with
# c as it is. Ordinary ops would give (∂J·dc)·v + J·dv: the first term is +0.0 in value but NaN where J's own
# derivative is not finite, and at the next derivative it adds the transpose of J's Jacobian (a Hessian made
# symmetric). Here c's tangent reaches no first derivative; c itself, a value of the next derivative, carries it
# there, so the second derivative is the Jacobian of the declared gradient, as grad-of-grad of jax.custom_vjp.
_mapped_zero_p = core.Primitive("stopgrad_math_mapped_zero")
_mapped_zero_p.multiple_results = True


def _mapped_zeros(*operands: Any, linear: Any, split: int) -> list[jax.Array]:
    del operands, split
    return [jnp.zeros(a.shape, a.dtype) for a in linear.out_avals]


def _mapped_zero_jvp(primals: list[Any], tangents: list[Any], *, linear: Any,
                     split: int) -> tuple[list[Any], list[Any]]:
    zeros = _mapped_zero_p.bind(*primals, linear=linear, split=split)
    consts, vs = primals[:split], primals[split:]
    moving = [k for k, t in enumerate(tangents[split:]) if type(t) is not ad.Zero]
    if not moving:  # only c moves: no first derivative here, and none made of J times a zero that is not there
        return zeros, [ad.Zero(a.update(weak_type=False).to_tangent_aval()) for a in linear.out_avals]

    def applied(*moved: jax.Array) -> list[jax.Array]:
        at = list(vs)
        for k, v in zip(moving, moved, strict=True):
            at[k] = v
        return core.jaxpr_as_fun(linear)(*consts, *at)

    # J·dv as the derivative of the linear map in the moving v alone: a v that does not move stays a symbolic
    # zero, which a NaN in its part of J does not meet
    products = jax.jvp(applied, [vs[k] for k in moving], [tangents[split + k] for k in moving])[1]
    return zeros, list(products)


def _mapped_zero_batch(args: list[Any], dims: list[Any], *, linear: Any, split: int) -> tuple[list[Any], list[int]]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else batching.bdim_at_front(a, d, size) for a, d in zip(args, dims, strict=True)]
    axes = [None if d is None else 0 for d in dims]
    batched = jax.make_jaxpr(jax.vmap(core.jaxpr_as_fun(linear), in_axes=axes))(*moved)
    return _mapped_zero_p.bind(*moved, linear=batched, split=split), [0] * len(batched.out_avals)


_mapped_zero_p.def_impl(_mapped_zeros)
_mapped_zero_p.def_abstract_eval(lambda *operands, linear, split: [a.update(weak_type=False)
                                                                   for a in linear.out_avals])
mlir.register_lowering(_mapped_zero_p, mlir.lower_fun(_mapped_zeros, multiple_results=True))
ad.primitive_jvps[_mapped_zero_p] = _mapped_zero_jvp
batching.primitive_batchers[_mapped_zero_p] = _mapped_zero_batch
checked_by_shard_map(_mapped_zero_p)


def mapped_zero(linear_map: Any, consts: list[Any], vs: list[jax.Array]) -> list[jax.Array]:
    """+0.0 for each result of ``linear_map(consts, vs)``, linear in ``vs``, with derivative J(c)·dv, where c
    moves only at the next derivative: the first derivative is J whatever J's own derivative holds, and the
    second is J's Jacobian, unsymmetrized.

    Where J is constant (c stopped) the carrier over the ordinary ops gives the same; this one is for a J that
    moves with x (the decorator at ``order=2``). The map is staged into a jaxpr on c's and v's types, and its
    value is never computed.
    """
    def staged(*operands: Any) -> list[jax.Array]:
        return list(linear_map(list(operands[:len(consts)]), list(operands[len(consts):])))

    linear = jax.make_jaxpr(staged)(*consts, *vs)
    return list(_mapped_zero_p.bind(*consts, *vs, linear=linear, split=len(consts)))


def is_inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def is_complex(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.complexfloating))


def inexact_array(value: Any, what: str, dtype_hint: Any = None) -> jax.Array:
    """value as a floating or complex array; a Python number takes ``dtype_hint``. TypeError naming ``what``."""
    if value is None or isinstance(value, (str, bytes, bool)):
        raise TypeError(f"{what} must be a floating or complex array; got {value!r:.60}.")
    number = isinstance(value, (int, float, complex))
    if isinstance(value, jax.Array):
        array = value  # as it is: jnp.asarray would bind a conversion, which a transform would trace
    else:
        try:
            array = jnp.asarray(value, dtype=dtype_hint if number and dtype_hint is not None else None)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{what} must be a floating or complex array; got {value!r:.60}.") from error
    if not is_inexact(array.dtype):
        raise TypeError(f"{what} must be floating or complex, to have a derivative; got {array.dtype}.")
    return array


def zero_with_slope(x: jax.Array, slope_is_negative: bool) -> jax.Array:
    """x − stop(x) (or stop(x) − x): exactly +0.0, slope ±1 at every element of x.

    inf − inf is NaN: where x is inf or NaN the carrier stands in, +0.0 in
    value with the same slope, so a declared derivative reaches a
    non-finite x as it reaches any other.
    """
    still = stop(x)
    zero = still - x if slope_is_negative else x - still
    return jnp.where(jnp.isfinite(still), zero, carried_zero(-x if slope_is_negative else x))


def zero_with_derivative_of(a: jax.Array) -> jax.Array:
    """+0.0 with a's derivative at every element: the carrier.

    The decorator's J·v is NaN in value where J holds a NaN or inf (times
    the zero v); its derivative J·dv is what the rule declares there, and
    passes whole: a non-finite element cuts no path that does not go
    through it. Where a is finite the carrier is ``a − stop(a)`` in value
    and tangent bit for bit; it is used there too, since its value is the
    constant +0.0 and a select on a's finiteness would read a's value, and
    so make XLA compute J·v for the value as well as for the derivative.
    """
    return carried_zero(a)


def zero_with_gradient(x: Any) -> jax.Array:
    """Returns u = x − stop(x): exactly +0.0 in value, derivative 1 w.r.t. x.

    The ``u`` of the identity ``stop(f) + stop(g)·u``, for identities of your
    own. At an element of x that is inf or NaN the value is still +0.0 and
    the derivative there is 1 all the same.

    Examples:
        >>> x = jnp.array([1.0, 2.0])
        >>> u, vjp = jax.vjp(zero_with_gradient, x)
        >>> u, vjp(jnp.ones(2))[0]
        (Array([0., 0.], dtype=float32), Array([1., 1.], dtype=float32))
    """
    return zero_with_slope(inexact_array(x, "zero_with_gradient's x"), slope_is_negative=False)


def attach(value: jax.Array, terms: list[jax.Array]) -> jax.Array:
    """value − Σ terms, each exactly +0.0 and broadcasting to value's shape: the value, bit for bit."""
    for term in terms:
        value = value - term.astype(value.dtype)
    return value



def zero_term(layout: Layout, fx: jax.Array, x: jax.Array, g: jax.Array, zero: jax.Array | None = None,
              mixed: bool = True) -> jax.Array:
    """+0.0 broadcasting to fx's shape, with derivative g in its layout; ``zero`` is stop(x) − x where the
    caller has made it (the decorator's carries its guard); ``mixed`` as in ``zero_product``."""
    zero = zero_with_slope(x, slope_is_negative=True) if zero is None else zero
    product = zero_product(g, zero.astype(fx.dtype), mixed)
    if layout is Layout.ELEMENTWISE:
        return product
    if layout is Layout.JACOBIAN:
        return jnp.sum(product, axis=tuple(range(fx.ndim, product.ndim)))
    total = jnp.sum(product)
    if layout is Layout.SCALAR:
        return total
    return total / max(size(fx.shape), 1)  # tfp's rule spreads the sum over fx (an empty fx: no division)


def size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))
