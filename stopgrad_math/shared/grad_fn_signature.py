"""How a grad_fn (a VJP) takes its upstream: read from its signature, alike in every namespace.

Users write ``grad(upstream)`` or ``grad(*upstreams)`` (TF), ``grad(upstream)``
taking y's structure (JAX), ``grad(*args, upstream=None)`` or
``grad(*args, upstream)`` (Keras, torch), with ``variables`` when it also
gives the gradients of variables read inside f. Pure Python (``inspect``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from stopgrad_math.shared import bounded_cache


@dataclasses.dataclass(frozen=True)
class Signature:
    """How to call a grad_fn: which upstream convention, and whether it takes variables."""

    upstream_keyword: bool  # grad(*args, upstream=None): keras, torch style
    structured: bool  # grad(upstream) for a nested y: JAX style, one structured argument
    takes_variables: bool


def _signature_of_parameters(parameters: tuple[tuple[str, str], ...]) -> Signature:
    kinds = dict(parameters)
    positional = [k for k in kinds.values() if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    return Signature(
        upstream_keyword=kinds.get("upstream") == "KEYWORD_ONLY",
        structured=len(positional) - ("variables" in kinds and kinds["variables"] != "KEYWORD_ONLY") == 1
        and "VAR_POSITIONAL" not in kinds.values(),
        takes_variables="variables" in kinds or "VAR_KEYWORD" in kinds.values(),
    )


def _parameters(grad_fn: Callable[..., Any]) -> tuple[tuple[str, str], ...]:
    return tuple((p.name, p.kind.name) for p in inspect.signature(grad_fn).parameters.values())


SIGNATURES_KEPT = 1024  # code objects; the least recently used goes first
_SIGNATURES: bounded_cache.BoundedCache[Signature] = bounded_cache.BoundedCache(SIGNATURES_KEPT)


def signature(grad_fn: Callable[..., Any]) -> Signature:
    """grad_fn's calling convention.

    A plain function's parameters are fixed by its code object, which the
    closures made afresh on every call share, so those are cached by code,
    for the most recent SIGNATURES_KEPT codes (generated grad_fns must not
    grow it without bound); methods, partials, callable objects and wrapped
    functions are read anew.
    """
    code = _plain_code(grad_fn)
    if code is None:
        return _signature_of_parameters(_parameters(grad_fn))
    return _SIGNATURES.get(code) or _SIGNATURES.put(code, _signature_of_parameters(_parameters(grad_fn)))


def _plain_code(grad_fn: Callable[..., Any]) -> Any:
    """The code object that fixes a plain function's parameters; None for a method, a partial, a callable object
    or a wrapped function, whose parameters are read anew."""
    code = getattr(grad_fn, "__code__", None)
    return None if inspect.ismethod(grad_fn) or hasattr(grad_fn, "__wrapped__") else code


def upstream_by_keyword(grad_fn: Callable[..., Any]) -> bool:
    """Whether grad_fn takes ``upstream`` as a keyword-only parameter (Keras's torch convention). A plain function
    is read from its code object's own fields, which torch.compile's tracer reads too (it does not trace
    ``inspect``); anything else from ``signature``."""
    code = _plain_code(grad_fn)
    if code is None:
        return signature(grad_fn).upstream_keyword
    first = code.co_argcount
    return "upstream" in code.co_varnames[first:first + code.co_kwonlyargcount]
