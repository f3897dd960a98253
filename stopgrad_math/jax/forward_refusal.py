"""A value whose forward-mode derivative raises an error naming why, and whose reverse mode is untouched.

``jax.custom_vjp`` raises its own ``TypeError`` where forward mode reaches it, from the op that carries its
tangent (``custom_lin``): eagerly, when a ``linearize``'s function is evaluated, and where ``jit`` compiles it. A
call that ``stopgrad_math.jax.custom_vjp`` hands back to that mechanism passes its arguments through
``refusing_forward`` first: their tangents go through an op that is linear, transposes to the identity (so reverse
mode is the mechanism's, bit for bit), and raises its own message wherever it is evaluated or compiled. As its
tangent is computed before the mechanism's, the user reads why the call has no forward mode, in every context
where JAX would raise (``jvp``, ``jit(jvp)``, ``linearize``, ``jacfwd``, a ``scan`` or ``checkpoint`` of them).
A symbolic zero tangent stays symbolic, so ``symbolic_zeros`` sees the mechanism's ``perturbed`` flags.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from stopgrad_math.jax import identity

_passed_p = core.Primitive("stopgrad_math_forward_refused")  # x, whose tangent goes through _tangent_p
_tangent_p = core.Primitive("stopgrad_math_refused_tangent")  # linear; raises where it is evaluated


def _same(x: Any, **params: Any) -> Any:
    del params
    return x


def _raised(*operands: Any, message: str, **params: Any) -> Any:
    del operands, params
    raise TypeError(message)


def _passed_jvp(primals: list[Any], tangents: list[Any], *, message: str) -> tuple[Any, Any]:
    x, dx = primals[0], tangents[0]
    value = _passed_p.bind(x, message=message)
    return value, dx if type(dx) is ad.Zero else _tangent_p.bind(dx, message=message)


def _tangent_jvp(primals: list[Any], tangents: list[Any], *, message: str) -> tuple[Any, Any]:
    dt = tangents[0]
    value = _tangent_p.bind(primals[0], message=message)
    return value, dt if type(dt) is ad.Zero else _tangent_p.bind(dt, message=message)


def _tangent_transpose(ct: Any, t: Any, *, message: str) -> list[Any]:
    del t, message
    return [ct]  # the identity: reverse mode never evaluates the op


def _batched(primitive: Any) -> Any:
    def batch(args: list[Any], dims: list[Any], **params: Any) -> tuple[Any, Any]:
        return primitive.bind(args[0], **params), dims[0]
    return batch


_passed_p.def_impl(_same)
_passed_p.def_abstract_eval(_same)
ad.primitive_jvps[_passed_p] = _passed_jvp
batching.primitive_batchers[_passed_p] = _batched(_passed_p)
mlir.register_lowering(_passed_p, mlir.lower_fun(_same, multiple_results=False))
identity.checked_by_shard_map(_passed_p, as_first=True)

_tangent_p.def_impl(_raised)
_tangent_p.def_abstract_eval(_same)
ad.primitive_jvps[_tangent_p] = _tangent_jvp
ad.primitive_transposes[_tangent_p] = _tangent_transpose
batching.primitive_batchers[_tangent_p] = _batched(_tangent_p)
mlir.register_lowering(_tangent_p, _raised)
identity.checked_by_shard_map(_tangent_p, as_first=True)


def refusing_forward(value: Any, message: str) -> Any:
    """``value``, each traced leaf through the op whose tangent raises ``TypeError(message)`` where forward mode
    evaluates it; a concrete leaf, which no derivative reaches, as it is.

    >>> import jax.numpy as jnp
    >>> float(jax.grad(lambda x: refusing_forward(x, "no forward mode") ** 2)(3.0))
    6.0
    """
    return jax.tree.map(lambda leaf: _passed_p.bind(leaf, message=message)
                        if isinstance(leaf, jax.core.Tracer) else leaf, value)
