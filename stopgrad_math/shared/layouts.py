"""What the shape of ``gx`` says it holds: shared by the TensorFlow and JAX substrates.

For an output ``fx`` and an argument ``x``, a ``gx`` is read by the first of
these layouts that its shape fits:

  JACOBIAN     gx.shape == fx.shape + x.shape: the full Jacobian,
               d fx[i] / d x[j] = gx[i, j].
  ELEMENTWISE  broadcast(gx.shape, x.shape) == fx.shape: a diagonal Jacobian
               with broadcasting, d fx[i] / d x[i] = gx[i], summed over the
               axes along which x is broadcast.
  SCALAR       fx has one element and gx broadcasts to x.shape:
               d fx / d x = gx, broadcast (a scalar gx: the same everywhere).
  SUM          gx broadcasts to x.shape: tfp's rule, the gradient of
               sum(fx) is gx (each element of fx gets gx / size(fx)).

A gx that fits none of them is an error. Shapes here are static shapes as
tuples, None for a dimension (or, for the whole shape, a rank) not known
while tracing; pure Python, so that neither framework is imported.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

Shape = tuple[int | None, ...] | None
"""A static shape: a tuple, None for an unknown dimension, or None for an unknown rank."""


class Layout(enum.Enum):
    JACOBIAN = "the full Jacobian: gx.shape == fx.shape + x.shape"
    ELEMENTWISE = "elementwise: broadcast(gx.shape, x.shape) == fx.shape"
    SCALAR = "the gradient of a one-element fx: gx broadcasts to x.shape"
    SUM = "tfp's rule, the gradient of sum(fx): gx broadcasts to x.shape"


_IN_ORDER = tuple(Layout)  # a tuple, which torch.compile's tracer iterates (an Enum class it does not, in torch 2.5)


class _Never:
    """No broadcast exists (a shape of its own, apart from None, the unknown rank)."""


NEVER = _Never()


def static_broadcast(a: Shape, b: Shape) -> Shape | _Never:
    """broadcast(a, b) from what is known: NEVER where it cannot exist, as TensorFlow's static rule says."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in (a, b)]
    result: list[int | None] = []
    for d, e in zip(*padded, strict=True):
        if d is None or e is None:  # the known one, where it is over 1, is what the other must broadcast to
            known = e if d is None else d
            result.append(known if known is not None and known > 1 else None)
        elif d == 1 or e == 1:
            result.append(e if d == 1 else d)
        elif d == e:
            result.append(d)
        else:
            return NEVER
    return tuple(result)


def compatible(a: Shape | _Never, b: Shape) -> bool:
    """Whether two shapes may be the same once every unknown is known."""
    if isinstance(a, _Never):
        return False
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(d is None or e is None or d == e for d, e in zip(a, b, strict=True))


def may_broadcast_to(shape: Shape, target: Shape) -> bool:
    """Whether a value of ``shape`` may broadcast to exactly ``target``."""
    return compatible(static_broadcast(shape, target), target)


def require_broadcast(what: str, shape: Shape, target_what: str, target: Shape) -> None:
    """ValueError, "<what> of shape (2,) does not broadcast to <target_what> (3,).", unless ``shape`` may broadcast
    to exactly ``target``."""
    if not may_broadcast_to(shape, target):
        raise ValueError(f"{what} of shape {_text(shape)} does not broadcast to {target_what} {_text(target)}.")


def may_have_one_element(shape: Shape) -> bool:
    return shape is None or all(d is None or d == 1 for d in shape)


def fully_known(shape: Shape) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _concatenated(a: Shape, b: Shape) -> Shape:
    return None if a is None or b is None else (*a, *b)


def _may_fit(layout: Layout, fx: Shape, x: Shape, gx: Shape) -> bool:
    if layout is Layout.JACOBIAN:
        return compatible(gx, _concatenated(fx, x))
    if layout is Layout.ELEMENTWISE:
        return compatible(static_broadcast(gx, x), fx)
    if layout is Layout.SCALAR and not may_have_one_element(fx):
        return False
    return may_broadcast_to(gx, x)


MUST_BE = (
    "A gradient must be the full Jacobian (shape fx.shape + {x}.shape{jacobian}), broadcast with {x} to fx's "
    "shape (elementwise), or broadcast to {x}'s shape (a one-element fx, or tfp's rule for the sum of fx)."
)


def _text(shape: Shape) -> str:
    """A shape as TensorFlow prints it: (2, 3), (None, 3), <unknown>."""
    if shape is None:
        return "<unknown>"
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def misfit(name: str, fx: Shape, x: Shape, gx: Shape) -> str:
    """The error for a gx that fits no layout, naming the argument and the three shapes."""
    both = _concatenated(fx, x)
    jacobian = f" = {_text(both)}" if both is not None else ""
    return (
        f"The gradient for {name} fits no layout: fx has shape {_text(fx)}, {name} has shape {_text(x)} and its "
        f"gradient has shape {_text(gx)}. {MUST_BE.format(x=name, jacobian=jacobian)}"
    )


@dataclasses.dataclass(frozen=True)
class Choice:
    """The layouts a gx may be read by, first fitting first; ``static``: fully known shapes decided, and
    ``layouts[0]`` is the layout."""

    layouts: tuple[Layout, ...]
    static: bool


def candidates(name: str, fx: Shape, x: Shape, gx: Shape, cached: bool = True) -> Choice:
    """The layouts to choose from: the one that fits where shapes are known, else all that may fit.

    Raises ValueError, naming the argument and the shapes, where none may fit. ``cached=False`` while a tracer
    that reads Python (torch.compile's) traces the call: it would trace past the cache anyway.
    """
    choice = _choice(fx, x, gx) if cached else _choice.__wrapped__(fx, x, gx)
    if not choice.layouts:
        raise ValueError(misfit(name, fx, x, gx))
    return choice


@functools.lru_cache(maxsize=1024)  # calls and traces see the same few shapes again and again
def _choice(fx: Shape, x: Shape, gx: Shape) -> Choice:
    fitting = tuple(layout for layout in _IN_ORDER if _may_fit(layout, fx, x, gx))
    static = all(fully_known(shape) for shape in (fx, x, gx))
    return Choice(fitting[:1] if static else fitting, static)
