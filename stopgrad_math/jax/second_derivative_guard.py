"""The decorator's guard: a derivative beyond its order raises instead of missing a term.

At ``order=1`` the decorator holds the VJP's Jacobian J constant, so a
second derivative would miss the term through J's own dependence on x (for
``exp(f(x))`` it gives exp(f)·f′² where the truth is exp(f)·(f′² + f″)).
JAX decides this exactly, from its nesting of traces: the zero ``v`` of every
term passes through ``guarded(v, watched)``, the identity in value whose
tangent is ``dv · fence(watched)``, where ``fence`` is 1 in value and
``watched`` are the arguments and what the VJP closes over. A first derivative
evaluates the fence on plain values; a second one, an outer ``jvp`` whose
tangent reaches an argument or a closed-over value, differentiates the
fence, whose tangent then raises a ``LookupError`` naming ``order=2`` where
it is used: forward mode evaluates it, reverse mode raises where a
cotangent reaches it, so a gradient taken inside and dropped (the value
alone of a ``value_and_grad``) raises nothing. At ``order=2`` the fence is
two deep: the third derivative raises.

The fence and the guard are primitives, not ``jax.custom_jvp``: JAX inlines a
``custom_jvp`` without its rule where it partially evaluates a function with
some inputs unknown (it assumes that only happens to linear functions), and
differentiating a ``scan`` or ``fori_loop`` does that to the loop's body to
hoist what is loop-invariant; the rule was lost there and the second
derivative silently 0. A primitive is kept by every transform, with rules for
each: the fence's derivative raises, a batch of it is one fence, and it lowers
to the constant 1, which XLA folds away; the guard keeps a symbolic zero
tangent symbolic, where a custom_jvp makes it a zero that meets a NaN in J.
``held_apart`` is the same fence for two groups, raising where a value moves
in the jvp that x moves in.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from stopgrad_math.jax import identity

_fence_p = core.Primitive("stopgrad_math_fence")


def _one(*operands: Any, **params: Any) -> jax.Array:
    """Both fences' value (and lowering): 1.0, whatever they watch."""
    del operands, params
    return jnp.ones((), jnp.float32)


def _fence_jvp(primals: list[Any], tangents: list[Any], *, depth: int, message: str,
               error: type[Exception]) -> tuple[Any, Any]:
    moving = [t for t in tangents if type(t) is not ad.Zero]
    if moving and depth <= 1:  # a derivative one level too deep: its tangent raises where it is used
        return (_fence_p.bind(*primals, depth=depth, message=message, error=error),
                _beyond_p.bind(*moving, message=message, error=error))
    depth -= 1 if moving else 0  # (something watched moves: a derivative one level deeper)
    return _fence_p.bind(*primals, depth=depth, message=message, error=error), jnp.zeros((), jnp.float32)


def _made(error: type[Exception], message: str) -> Exception:
    """error(message), for an error class whose constructor takes other arguments too (JAX's tracer errors, which
    a VJP judged where it is differentiated raises there as it would have at the call)."""
    made = error.__new__(error)
    Exception.__init__(made, message)
    return made


def _fence_batch(args: list[Any], dims: list[Any], *, depth: int, message: str,
                 error: type[Exception]) -> tuple[Any, Any]:
    del dims  # one fence for the whole batch: it is 1 for every example
    return _fence_p.bind(*args, depth=depth, message=message, error=error), None  # None: not mapped


# The fence's tangent one level beyond its depth: 0.0 in type, and the error wherever the derivative is used.
# Forward mode evaluates it (eagerly, or where jit compiles it): it raises there. Reverse mode transposes it: it
# raises where a cotangent reaches it, and a derivative nothing reads (the gradient a value_and_grad inside the
# function takes and drops, whose value alone is used) gets a symbolic zero there and raises nothing.
_beyond_p = core.Primitive("stopgrad_math_beyond_order")


def _beyond_raises(*operands: Any, message: str, error: type[Exception]) -> Any:
    raise _made(error, message)


def _beyond_jvp(primals: list[Any], tangents: list[Any], *, message: str, error: type[Exception]) -> tuple[Any, Any]:
    return _beyond_p.bind(*primals, message=message, error=error), jnp.zeros((), jnp.float32)


def _beyond_transpose(ct: Any, *operands: Any, message: str, error: type[Exception]) -> list[Any]:
    if type(ct) is not ad.Zero:
        raise _made(error, message)
    return [None] * len(operands)


def _beyond_batch(args: list[Any], dims: list[Any], *, message: str, error: type[Exception]) -> tuple[Any, Any]:
    del dims
    return _beyond_p.bind(*args, message=message, error=error), None


_beyond_p.def_impl(_beyond_raises)
_beyond_p.def_abstract_eval(lambda *operands, message, error: jax.core.ShapedArray((), jnp.float32))
ad.primitive_jvps[_beyond_p] = _beyond_jvp
ad.primitive_transposes[_beyond_p] = _beyond_transpose
batching.primitive_batchers[_beyond_p] = _beyond_batch
identity.checked_by_shard_map(_beyond_p, constant=True)
mlir.register_lowering(_beyond_p, _beyond_raises)

_fence_p.def_impl(_one)
_fence_p.def_abstract_eval(lambda *watched, depth, message, error: jax.core.ShapedArray((), jnp.float32))
ad.primitive_jvps[_fence_p] = _fence_jvp
batching.primitive_batchers[_fence_p] = _fence_batch
identity.checked_by_shard_map(_fence_p, constant=True)
mlir.register_lowering(_fence_p, mlir.lower_fun(_one, multiple_results=False))


def fence(depth: int, message: str, watched: list[jax.Array], error: type[Exception] = LookupError) -> jax.Array:
    """1.0, whose derivative ``depth`` deep w.r.t. ``watched`` raises ``error(message)``."""
    return _fence_p.bind(*watched, depth=depth, message=message, error=error)


# The guard: v, whose tangent is dv·fence(watched). A primitive as the fence is, and not a jax.custom_jvp: its rule
# keeps a symbolic zero tangent symbolic (a custom_jvp makes it a zero, which met a NaN in J as NaN·0 on a path the
# derivative does not take; custom_jvp's own symbolic zeros are refused by shard_map's check on JAX 0.4.35).
_guarded_p = core.Primitive("stopgrad_math_guarded")


def _first(v: Any, *watched: Any, **params: Any) -> Any:
    """The guard's value (and lowering): v, whatever it watches."""
    del watched, params
    return v


def _guarded_jvp(primals: list[Any], tangents: list[Any], *, depth: int, message: str) -> tuple[Any, Any]:
    v, watched = primals[0], primals[1:]
    dv = tangents[0]
    if type(dv) is ad.Zero:  # v does not move: nothing to guard, and nothing to make a zero of
        return v, dv
    return v, dv * fence(depth, message, list(watched)).astype(dv.dtype)


def _guarded_batch(args: list[Any], dims: list[Any], *, depth: int, message: str) -> tuple[Any, Any]:
    return _guarded_p.bind(*args, depth=depth, message=message), dims[0]


_guarded_p.def_impl(_first)
_guarded_p.def_abstract_eval(lambda v, *watched, depth, message: v)
ad.primitive_jvps[_guarded_p] = _guarded_jvp
batching.primitive_batchers[_guarded_p] = _guarded_batch
identity.checked_by_shard_map(_guarded_p, as_first=True)
mlir.register_lowering(_guarded_p, mlir.lower_fun(_first, multiple_results=False))


def guarded(v: jax.Array, watched: list[jax.Array], order: int, message: str) -> jax.Array:
    """v, whose tangent is dv·fence(watched): exact, and raising ``LookupError(message)`` at the derivative beyond
    ``order``."""
    return _guarded_p.bind(v, *watched, depth=order, message=message)


def _times(value: jax.Array, one: jax.Array) -> jax.Array:
    """value·one for the scalar one = 1.0: value bit for bit, with one's derivative rule."""
    if jnp.iscomplexobj(value):  # a complex product with 1 + 0j would make inf·0 = NaN of an infinite part
        real = one.astype(jnp.real(value).dtype)
        return jax.lax.complex(jnp.real(value) * real, jnp.imag(value) * real)
    return value * one.astype(value.dtype)


def held_constant(value: jax.Array, message: str) -> jax.Array:
    """value, bit for bit (a product with the fence's 1), whose derivative raises ``LookupError(message)``:
    a value the decorator cannot differentiate, refused where it is differentiated and nowhere else."""
    return _times(value, fence(1, message, [value]))


def refused(value: jax.Array, watched: list[jax.Array], error: type[Exception], message: str) -> jax.Array:
    """value, bit for bit, whose derivative w.r.t. ``watched`` raises ``error(message)``: a VJP that cannot be
    embedded is judged where a derivative is asked, and a call that none reaches (eagerly, under jit or vmap)
    gives f's value, as jax.custom_vjp does."""
    return _times(value, fence(1, message, watched, error))


# A fence of two groups: 1.0, whose derivative raises where the first operand and any other move in one jvp.
_apart_p = core.Primitive("stopgrad_math_apart")


def _apart_jvp(primals: list[Any], tangents: list[Any], *, message: str) -> tuple[Any, Any]:
    if type(tangents[0]) is not ad.Zero and any(type(t) is not ad.Zero for t in tangents[1:]):
        raise ValueError(message)
    return _apart_p.bind(*primals, message=message), jnp.zeros((), jnp.float32)


def _apart_batch(args: list[Any], dims: list[Any], *, message: str) -> tuple[Any, Any]:
    del dims  # 1 for every example, as the fence
    return _apart_p.bind(*args, message=message), None


_apart_p.def_impl(_one)
_apart_p.def_abstract_eval(lambda *operands, message: jax.core.ShapedArray((), jnp.float32))
ad.primitive_jvps[_apart_p] = _apart_jvp
batching.primitive_batchers[_apart_p] = _apart_batch
identity.checked_by_shard_map(_apart_p, constant=True)
mlir.register_lowering(_apart_p, mlir.lower_fun(_one, multiple_results=False))


def held_apart(value: jax.Array, others: list[jax.Array], message: str) -> jax.Array:
    """value, bit for bit, whose derivative raises ``ValueError(message)`` where value and any of ``others``
    are differentiated in one jvp (each moving at that level), and nowhere else. JAX decides it from its
    symbolic zero tangents, under jit, scan and every other transform, as for the fence."""
    return _times(value, _apart_p.bind(value, *others, message=message))
