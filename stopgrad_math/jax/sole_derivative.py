"""Where the one derivative a call can be asked is taken eagerly at the top, f runs where ``jax.custom_vjp`` runs fwd.

An eager ``grad``, ``value_and_grad``, ``vjp``, ``jacrev``, ``jvp`` or
``linearize`` runs the call under one JVP or linearize trace whose parent is
JAX's eval trace. No other derivative can reach the call: one taken outside
would be that trace's parent, and a ``jit``, ``scan`` or ``checkpoint``
above would stage it (its trace the parent, or the call traced apart and
differentiated after). So J's own derivative is never asked, and f's value
and the VJP's residuals at ``stop(x)`` give every derivative there is, at
either order: f runs once, on the primal values under the parent trace, as
``jax.custom_vjp`` runs its fwd there, rather than once at x for the
residuals and again at ``stop(x)`` for y, every op through the
differentiation trace.

A value differentiated besides the arguments (a tracer f closes over or
reads from a global) cannot be used under the parent trace: JAX's
escaped-tracer check raises there (``UnexpectedTracerError``), and the call
is made the general way, f running again. JAX before 0.4.36, which keeps
its traces on a stack of levels, has no parent trace to run under: there
every call is made the general way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from jax._src import core
from jax._src.interpreters import ad

_DIFFERENTIATING = tuple(t for t in (getattr(ad, "JVPTrace", None), getattr(ad, "LinearizeTrace", None)) if t)


def trace_below() -> Any | None:
    """The eval trace under the one differentiation trace the call runs in, where that is all it runs in; None
    anywhere else (no derivative, two, a ``vmap``, a staging trace, or JAX before 0.4.36)."""
    context = getattr(core, "trace_ctx", None)
    if context is None:
        return None
    trace = context.trace
    if type(trace) not in _DIFFERENTIATING:  # (exactly these: a subclass may differentiate otherwise)
        return None
    parent = getattr(trace, "parent_trace", None)
    return parent if type(parent) is core.EvalTrace else None


@contextlib.contextmanager
def running_below(trace: Any) -> Iterator[None]:
    """Ops run under ``trace`` (``trace_below``'s) while the block runs."""
    with core.set_current_trace(trace):  # type: ignore[no-untyped-call]
        yield
