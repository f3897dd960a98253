"""Where a proof made for any size holds: the conditions on sizes its trace took.

Under ``torch.compile`` a decorated call is first proven for shapes of their
rank alone, so that one proof serves every size. The trace runs on fake
tensors whose unknown sizes are symbols of one ``ShapeEnv`` (``stand_ins``,
each size its own symbol, with ``_ANY_SIZE`` as the value a branch reads):
every branch on a size that f, its VJP or PyTorch's own shape rules take
there is a guard of that ShapeEnv, and a number computed from a size stays a
symbol in the graph, never a literal the judge could read as zero. The graph
judged is then the graph at every size where all the guards hold, and at no
other; ``condition`` gives them as one function of the call's tensors, which
the compiled call runs as Dynamo traces it, so that Dynamo guards its code on
that function's answer as it guards its own branches on sizes.

Eagerly, the floats a VJP closes over are symbols of such a ShapeEnv too
(``floats_as_symbols``), its tensors of static sizes: where the trace took no
branch on a float (``branched``), the proof holds for every float.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import types
from collections.abc import Sequence
from typing import Any

import torch

_ANY_SIZE = 5  # the value of an unknown size as a trace reads it (not 0 or 1, which PyTorch specializes)

HELD = types.ModuleType("stopgrad_math.torch.size_conditions.HELD")
"""The conditions made so far, as attributes ``holds<n>``: Dynamo inlines a function found there, guarding the
attribute as it guards any global it reads."""
# the conditions' code as a file of this package, so that an error raised in it is the library's, never taken for
# the user's VJP raising (``refusals.raised_by_the_vjp``)
_SOURCE_FILE = os.path.join(os.path.dirname(__file__), "<a size condition>")
_BY_SOURCE: dict[str, int] = {}  # one function per distinct condition
_NUMBERS = itertools.count(1)
_LOCK = threading.Lock()


def stand_ins(leaves: Sequence[tuple[tuple[int | None, ...], torch.dtype, torch.device]],
              floats: int = 0) -> list[Any]:
    """Fake tensors of the leaves' (shape, dtype, device), each size None a symbol of their own ShapeEnv (no two
    taken as one because they are equal here), each other size static; then ``floats`` float symbols of that
    ShapeEnv (Python floats whose value Dynamo keeps as a symbol)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    environment = ShapeEnv(duck_shape=False)
    # static_shapes: a real tensor the trace meets (a weight f closes over) is taken at its shape, no symbol made for
    # it, so that the guards are of these stand-ins alone
    mode = FakeTensorMode(shape_env=environment, allow_non_fake_inputs=True, static_shapes=True)
    made: list[Any] = [mode.from_tensor(
        torch.empty(tuple(_ANY_SIZE if n is None else n for n in shape), dtype=dtype, device=device),
        static_shapes=False, symbolic_context=StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC if n is None else DimDynamic.STATIC for n in shape]))
        for shape, dtype, device in leaves]
    return made + [_float_symbol(environment, len(made) + k) for k in range(floats)]


def _float_symbol(environment: Any, position: int) -> Any:
    """A float symbol of the ShapeEnv, a Python float whose value a trace keeps as a symbol (``_ANY_FLOAT`` where
    it must read one), named as the stand-in at ``position``."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = LocalSource(f"t{position}")
    symbol = environment.create_unspecified_symbol(_ANY_FLOAT, source, dynamic_dim=DimDynamic.DYNAMIC)
    return environment.create_symfloatnode(symbol, hint=_ANY_FLOAT, source=source)


_ANY_FLOAT = 0.5  # the value of a float symbol as a trace reads it


def floats_as_symbols(values: Sequence[Any]) -> list[Any]:
    """The values with each Python float a float symbol of one new ShapeEnv and each tensor a fake tensor of that
    ShapeEnv's fake mode, of its shape and strides (every size static): stand-ins on which a trace takes every
    float as any float, and ``branched`` says whether it read one."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    environment = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=environment, allow_non_fake_inputs=True, static_shapes=True)
    return [_float_symbol(environment, k) if type(v) is float else mode.from_tensor(v, static_shapes=True)
            for k, v in enumerate(values)]


def branched(traced_on: Sequence[Any]) -> bool:
    """Whether a trace on stand-ins of ``floats_as_symbols`` read a float's value: took a branch on one, made a
    number or a tensor of its value (``float()``, ``math.exp``, ``torch.tensor``), or asserted something of it.
    Where it did not, its graph holds at every float."""
    environment = next(v.node.shape_env for v in traced_on if isinstance(v, torch.SymFloat))
    return bool(environment.guards) or any(environment.deferred_runtime_asserts.values())


def condition(traced_on: Sequence[Any]) -> int:
    """The number of the condition (``holds``) under which a trace on the ``stand_ins`` ``traced_on`` takes the
    branches it took, 0 where it took none that depend on a size. It must hold at the stand-ins themselves:
    ValueError where PyTorch's guards cannot be read back (a condition that cannot be checked is no proof)."""
    from torch._dynamo.source import LocalSource

    environment = getattr(traced_on[0], "fake_mode", None) if traced_on else None
    environment = getattr(environment, "shape_env", None)  # (none where no stand-in is a tensor: no proof for any size)
    if environment is None:
        return 0
    guards = environment.produce_guards(list(traced_on), [LocalSource(f"t{k}") for k in range(len(traced_on))])
    if not guards:
        return 0
    named = ", ".join(f"'t{k}': tensors[{k}]" for k in range(len(traced_on)))
    # a branch, not bool(): Dynamo guards a jump on a symbol on every torch supported, bool() from 2.13 alone
    source = (f"def holds(*tensors):\n    L = {{{named}}}\n    if "
              + " and ".join(f"({guard})" for guard in guards) + ":\n        return True\n    return False\n")
    with _LOCK:
        number = _BY_SOURCE.get(source)
        if number is None:
            # the names PyTorch's guard code reads (torch 2.6 writes __math_isnan, later ones math.isnan)
            namespace: dict[str, Any] = {"math": _MATH, "__math_isnan": _is_nan, "inf": math.inf, "torch": torch}
            exec(compile(source, _SOURCE_FILE, "exec"), namespace)
            number = _BY_SOURCE[source] = next(_NUMBERS)
            setattr(HELD, f"holds{number}", namespace["holds"])
    try:
        held = holds(number, [_at_their_values(t) for t in traced_on])
    except Exception as error:  # a name of PyTorch's guard code not given here
        raise ValueError(f"the conditions on sizes a trace took cannot be checked ({error})") from error
    if not held:
        raise ValueError("the conditions on sizes a trace took do not hold where it took them")
    return number


def _is_nan(number: Any) -> bool:
    if number != number:  # noqa: SIM103 (a branch: Dynamo guards a jump on a symbol on torch 2.6, not bool())
        return True
    return False


# math as a guard reads it, but for isnan, which Dynamo does not trace on a symbol: a NaN is the one number unequal
# to itself
_MATH = types.SimpleNamespace(**{**vars(math), "isnan": _is_nan})


def _at_their_values(stand_in: Any) -> Any:
    """A stand-in at its values (``_ANY_SIZE``, the static sizes, ``_ANY_FLOAT``): a number, or a meta tensor of
    the stand-in's shape and strides."""
    def value(n: Any) -> Any:
        return n.node.hint if isinstance(n, (torch.SymInt, torch.SymFloat)) else n

    if not isinstance(stand_in, torch.Tensor):
        return value(stand_in)
    return torch.empty_strided([value(n) for n in stand_in.shape], [value(n) for n in stand_in.stride()],
                               dtype=stand_in.dtype, device="meta")


def holds(number: int, tensors: Sequence[Any]) -> bool:
    """Whether condition ``number`` holds for these tensors and numbers (the cotangents of y, then f's argument
    tensors, then its numbers, as the trace was given them); under Dynamo, whose sizes and numbers may be
    symbols, it guards the compiled code on the answer. 0 holds everywhere."""
    if not number:
        return True
    answer: bool = getattr(HELD, f"holds{number}")(*tensors)
    return answer


def forget() -> None:
    """Drops every condition (after ``torch._dynamo.reset()``, with the proofs that named them)."""
    with _LOCK:
        for number in _BY_SOURCE.values():
            delattr(HELD, f"holds{number}")
        _BY_SOURCE.clear()

