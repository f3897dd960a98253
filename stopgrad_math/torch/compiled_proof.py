"""The PyTorch decorator's proof made while Dynamo traces the call (``torch.compile``).

Under Dynamo the VJP f returns is Dynamo's variable, which make_fx cannot
trace again: so ``_stopgrad_math_proof``, a constant of the graph to Dynamo,
traces f and its VJP anew on fake tensors of the arguments' shapes, first for
their ranks alone (sizes and floats as symbols, ``size_conditions``), then,
where that proof does not serve, for this call's sizes. Where the proof's
graphs serve (``_routed``), they are registered (``compiled_graphs``) and
the tensors f and its VJP read from outside are their inputs, read at each
call by a reader over f's own cells and globals (``shared.outside_reads``);
else the VJP is differentiated as Dynamo traces it. The proofs are kept until
``torch._dynamo.reset()``.
"""

from __future__ import annotations

import itertools
import logging
import sys
import types
import typing
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
from torch.utils import _pytree as pytree

from stopgrad_math.shared import bounded_cache, function_identity, nesting, outside_reads
from stopgrad_math.shared.arguments import call_f, name_of
from stopgrad_math.shared.linearity import NotEmbeddable
from stopgrad_math.torch import (
    aten_graphs,
    compiled_graphs,
    identity,
    kept_proofs,
    proof_graphs,
    refusals,
    size_conditions,
    tracing,
    unrecorded,
    vjp_closure,
)
from stopgrad_math.torch.tracing import Linear
from stopgrad_math.torch.vjp_conventions import Leaves, structure_key


def _shape_of(tensor: torch.Tensor, specialized: bool) -> tuple[tuple[int | None, ...], torch.dtype, torch.device]:
    """What a stand-in is made of, under Dynamo: each a constant of the graph. First the rank alone (each size
    None), so that one proof serves every size and Dynamo guards none; ``specialized``: the sizes (a range's
    length is one Dynamo must know, and a dynamic size is specialized by it), so the proof is for this shape, and
    another recompiles and proves. (Dynamo shows a dynamic size as an int: none can be told apart.)"""
    if specialized:
        return tuple(len(range(n)) for n in tensor.shape), tensor.dtype, tensor.device
    return tuple(None for _ in tensor.shape), tensor.dtype, tensor.device


def proven_while_compiling(f: Callable[..., Any], leaves: Leaves, kwargs: dict[str, Any], outputs: Leaves,
                           names: list[str], order: int, falls_back: bool = False,
                           ) -> tuple[list[int], Linear | None, Linear | None, bool, int] | str:
    """``decorator_form._proven`` where Dynamo traces the call. The VJP there is Dynamo's variable, not a function
    make_fx can trace again, so ``_stopgrad_math_proof`` traces f and its VJP anew, on fake tensors of the arguments'
    shapes: a constant of the graph to Dynamo, made as it traces, and again when it recompiles for another f, rank or
    dtype; first for the ranks alone (``_shape_of``), then, where that proof does not serve, for the sizes. What it is
    given must be constants to Dynamo: the nest ``(args, kwargs)`` with every leaf None, then each tensor leaf as
    (shape, dtype, device) and each other leaf as itself, one argument apiece (an object or a module is taken as it is
    there, guarded by its identity, and not inside a tuple). Where the proof registered the map and its transpose
    (``compiled_graphs.registered``), they come back as functions of y's cotangents and of v, run on f's arguments
    stopped; else None, and the VJP is differentiated as Dynamo traces it; last, the order the call is embedded at (1 at
    order 2 where the VJP reads a tensor f computed with grad mode off, ``unrecorded``). ``falls_back``: a VJP that
    cannot be embedded gives the reason (a ``NotEmbeddable``'s message, a constant) rather than raising."""
    nest = (leaves.with_values({}), kwargs)
    flat = pytree.tree_leaves(nest)
    skeleton = pytree.tree_map(lambda v: 0, nest)  # (0, not None: a torch.Size argument is rebuilt from ints)
    tensors = tuple(k for k, v in enumerate(flat) if isinstance(v, torch.Tensor))
    # f's Python floats, symbols in the proof for any size: Dynamo keeps one that changed between calls as a
    # symbol, no constant to give a proof, and shows it as a float like any other. (An int is given as it is: one
    # is a dim or a count as often as a number, which a symbol would make a proof per size.)
    numbers = tuple(k for k, v in enumerate(flat) if type(v) is float)
    order = 1 if order == 1 else 2  # a constant: with dynamic=True Dynamo takes a closed-over int for an input
    key, condition, *kept = _stopgrad_math_proof(
        f, tuple(names), order, falls_back, skeleton, tensors, numbers,
        tuple(_shape_of(t, False) for t in outputs.tensors()),
        *[_shape_of(v, False) if isinstance(v, torch.Tensor) else _A_FLOAT if k in numbers else v
          for k, v in enumerate(flat)])
    # the sizes and numbers where the proof for any size holds, given as it was traced on them: cotangents as the
    # compiled call makes them (contiguous zeros), then f's argument tensors and numbers. Elsewhere the proof is
    # for this call's sizes alone (the numbers still symbols: Dynamo cannot make one a constant again)
    traced_on = [*tracing.zeros_like(outputs.tensors()), *(flat[k] for k in tensors), *(flat[k] for k in numbers)]
    if key == _PER_SIZE or not size_conditions.holds(condition, traced_on):
        key, condition, *kept = _stopgrad_math_proof(
            f, tuple(names), order, falls_back, skeleton, tensors, numbers,
            tuple(_shape_of(t, True) for t in outputs.tensors()),
            *[_shape_of(v, True) if isinstance(v, torch.Tensor) else _A_FLOAT if k in numbers else v
              for k, v in enumerate(flat)])
        if key != _REFUSED and not size_conditions.holds(condition, traced_on):
            if falls_back:
                return refusals.BRANCH_ON_A_FLOAT.format(name=name_of(f))
            refusals.refuse(refusals.BRANCH_ON_A_FLOAT.format(name=name_of(f)))
    if key == _UNRECORDED:  # first derivatives as order 1 gives them; a second raises (``guarded_at_order_1``)
        return proven_while_compiling(f, leaves, kwargs, outputs, names, 1, falls_back)
    if key == _REFUSED:
        return _REFUSALS[int(kept[0])]
    if key == _REVERSE_ONLY:
        return (*_graphs_at(f, kept[0], list(kept[1:]), flat, tensors, numbers, order, reverse_only=True), order)
    if key < 0:
        return kept, None, None, False, order
    return (*_graphs_at(f, key, kept, flat, tensors, numbers, order, reverse_only=False), order)


def _graphs_at(f: Callable[..., Any], key: int, kept: list[int], flat: list[Any], tensors: tuple[int, ...],
               numbers: tuple[int, ...], order: int,
               reverse_only: bool) -> tuple[list[int], Linear, Linear | None, bool]:
    """``proven_while_compiling``'s answer from the graphs registered at ``key``, run on f's arguments (stopped at
    order 1) and the tensors it reads from outside; last, whether the map is embedded alone (``_REVERSE_ONLY``),
    said as a flag: Dynamo before torch 2.8 cannot ask isinstance of a function, which the map is at order 1."""
    given = [*(identity.stop(flat[k]) if order == 1 else flat[k] for k in tensors), *(flat[k] for k in numbers)]
    reader = _stopgrad_math_reader(f, key)
    if reader:  # the tensors from outside, read as f reads them
        given += [identity.stop(t) if order == 1 else t for t in getattr(_READERS, reader)(*flat)]
    if order == 2 or reverse_only:  # mapped_zero's derivatives: J from the arguments as given; jvp J·v, where
        return kept, compiled_graphs.Registered(key, given), None, reverse_only  # it can be formed
    return (kept, lambda *cts: list(compiled_graphs.run_compiled(key, *cts, *given)),
            lambda *vs: list(compiled_graphs.run_compiled(key + 1, *vs, *given)), False)


_A_FLOAT = "float"  # a float argument as the proof is given it: a symbol, whatever its value


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def _stopgrad_math_proof(f: Callable[..., Any], names: tuple[str, ...], order: int, falls_back: bool, skeleton: Any,
                         tensors: tuple[int, ...], numbers: tuple[int, ...], cotangents: tuple[Any, ...],
                         *flat: Any) -> tuple[int, ...]:
    """``_proof_for_any_size`` (shapes of their rank alone) or ``_proof_of_f``, made once for f's key
    (``vjp_closure.keyed``: its code, closure and globals) and what it is given: a decorated function called at
    several places of one compiled program is proven once. Its name is Dynamo's for the constant it keeps in the
    globals of the compiled function (torch 2.6 to 2.13), where it should meet nothing of the user's.
    ``falls_back``: a ``NotEmbeddable`` comes back as ``(_REFUSED, 0, k)``, its message ``_REFUSALS[k]``."""
    _forget_what_dynamo_forgot()
    opened = vjp_closure.keyed(f)
    key: Hashable = None
    if opened is not None:
        # which closed-over tensors are one: a proof's graphs read each tensor it traced once
        aliases = tuple(next(i for i, b in enumerate(opened.arrays) if b is a) for a in opened.arrays)
        key = (opened.key, aliases, names, order, falls_back, structure_key(pytree.tree_structure(skeleton)), tensors,
               numbers, cotangents, tuple(_held_weakly(v) for v in flat))
        try:
            hash(key)
        except TypeError:  # a leaf that is not hashable: proven at each compilation
            key = None
    known = None if key is None else _PROVEN_WHILE_COMPILING.get(key)
    if known is not None:
        return known
    any_size = any(n is None for shape, _, _ in [*cotangents, *(flat[k] for k in tensors)] for n in shape)
    try:
        proof = (_proof_for_any_size(f, names, order, skeleton, tensors, numbers, cotangents, *flat) if any_size
                 else _proof_of_f(f, names, order, skeleton, tensors, numbers, cotangents, *flat,
                                  symbolic=bool(numbers)))
    except _Unrecorded:
        proof = (_UNRECORDED, 0)
    except Exception as error:
        if not (falls_back and refusals.falls_back_on(error)):
            raise
        _REFUSALS.append(refusals.fall_back_reason(f, error))
        proof = (_REFUSED, 0, len(_REFUSALS) - 1)
    return proof if key is None else _PROVEN_WHILE_COMPILING.put(key, proof)


_PROVEN_WHILE_COMPILING: bounded_cache.BoundedCache[tuple[int, ...]] = bounded_cache.BoundedCache(
    kept_proofs.PROOFS_KEPT)
_REFUSED = -3  # a proof's first number where the VJP cannot be embedded and the call falls back
_UNRECORDED = -5  # one at order 2 whose VJP reads a tensor f computed with grad mode off: proven at order 1 instead
_REVERSE_ONLY = -4  # one whose transpose cannot be formed (``compiled_graphs.registered``): then the key, and the
# leaves kept
_REFUSALS: list[str] = []  # their reasons, one per compilation that fell back


class _Unrecorded(ValueError):
    """Raised in a proof's trace where the VJP reads a tensor f computed with grad mode off (``unrecorded``)."""


def _check_recorded(watch: unrecorded.Watch | None, vjp: Any) -> None:
    lifted = vjp_closure.lifted(vjp)
    if unrecorded.lost_read(watch, [] if lifted is None else lifted.tensors):
        raise _Unrecorded


def _held_weakly(value: Any) -> Any:
    """A leaf of f's arguments in a compiled proof's key: one compared by identity (a module, an object of the
    caller's) by a weak reference (``function_identity.same``, equal to nothing once the object is gone), so
    that the key keeps it alive no longer than its caller; any other as it is."""
    kind: Any = type(value)  # (a class's slots, compared with object's)
    if kind.__hash__ is object.__hash__ and kind.__eq__ is object.__eq__:
        return function_identity.same(value)
    return value


def _dynamo_has_not_reset(*args: Any) -> None:
    """A compilation callback, registered so that its absence tells of a ``torch._dynamo.reset()``, which clears
    them."""


def _forget_what_dynamo_forgot() -> None:
    """After ``torch._dynamo.reset()``, which forgets every compiled function (as a new process would start), the
    proofs and graphs made for them are dropped too, as Dynamo drops its own side tables; a compiled function
    made since compiles and proves anew."""
    handler = torch._dynamo.callback.callback_handler
    if _dynamo_has_not_reset in handler.start_callbacks:
        return
    tables = (_PROVEN_WHILE_COMPILING, compiled_graphs.COMPILED, compiled_graphs.SHAPES, compiled_graphs.NAMES, _READS,
              _REFUSALS, compiled_graphs.WITHOUT_TRANSPOSE)
    for table in tables:  # (a reader goes with its f)
        table.clear()
    size_conditions.forget()
    handler.register_start_callback(_dynamo_has_not_reset)


def _proof_of_f(f: Callable[..., Any], names: tuple[str, ...], order: int, skeleton: Any, tensors: tuple[int, ...],
                numbers: tuple[int, ...], cotangents: tuple[Any, ...], *flat: Any,
                symbolic: bool = False) -> tuple[int, ...]:
    """``(key, condition, *kept)``: the argument leaves whose cotangent is linear (``tracing.proven_states``), from f
    and its VJP traced together on fake tensors (f's own ops read no cotangent, so only the VJP's are judged), and the
    key of the graphs registered for them (``compiled_graphs.registered``; negative: none). ``skeleton``: the nest
    ``(args, kwargs)``, ``flat`` its leaves, those at ``tensors`` as (shape, dtype, device); ``cotangents``: (shape,
    dtype, device) of y's differentiable leaves. ``symbolic``: each size None is a symbol (``size_conditions``), as is
    each leaf at ``numbers`` (a float, given as ``_A_FLOAT``), and ``condition`` says at which sizes and numbers the
    proof holds; else 0, every size and number is given and the proof is for those."""
    structure = pytree.tree_structure(skeleton)
    count = len(cotangents)
    read: list[tracing.Cotangents] = []
    vjps: list[Any] = []  # the last one f returned, for an error to read

    def vjp_of_f(*values: torch.Tensor) -> list[torch.Tensor]:
        given = dict(zip((*tensors, *numbers), values[count:], strict=True))
        args, kwargs = pytree.tree_unflatten([given.get(k, v) for k, v in enumerate(flat)], structure)
        roots = list(values[count:count + len(tensors)]) if order == 2 else None  # (its argument tensors)
        # f in grad mode, as a call runs it (the trace runs as a backward does, without): at order 2 the watch
        # then finds only what f itself computes with grad mode off. A decorated call in f gives its value alone:
        # only the VJP's ops are judged.
        with nesting.evaluating(1), unrecorded.watching(roots) as watch, torch.set_grad_enabled(order == 2):
            y, vjp = call_f(f, args, kwargs)
        vjps.append(vjp)
        _check_recorded(watch, vjp)
        read.append(tracing.Cotangents(f, list(names), Leaves.of_arguments(args, list(names)), Leaves.of(y, "y"),
                                       order))
        return read[-1].of(vjp)(*values[:count])

    try:
        # Traced apart from Dynamo's own trace: outside the torch.func transforms it may be tracing, and with no
        # tracing context, whose fake mode (dynamic shapes, no real tensor allowed) make_fx would take up.
        with temporarily_clear_interpreter_stack(), torch._guards.tracing(None):
            shapes = [*cotangents, *(flat[k] for k in tensors)]
            examples = size_conditions.stand_ins(shapes, len(numbers)) if symbolic else [
                torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in shapes]
            traced = aten_graphs.trace(vjp_of_f, *examples, cotangents=count, fake=True)
            kept = tracing.proven_states(read[-1], traced.states())
            positions = [read[-1].found.index(k) for k in kept]
            kept_examples = [examples[count + tensors.index(k)] for k in kept]
            if kept:  # (as written where its autodiff is the map and J·v can be formed)
                reads = _routed(f, traced, flat, order, lambda: aten_graphs.differentiated_as_traced(
                    vjp_of_f, *examples, traced=traced) and proof_graphs.transposable(
                    traced, positions, kept_examples, examples, count, name_of(f)))
            if not kept or reads is None:  # nothing to embed (y keeps a zero derivative, whatever the VJP's
                # autodiff), or differentiated as Dynamo traces it
                return (-1, size_conditions.condition(examples) if symbolic else 0, *kept)
            outside = [k for k in range(len(traced.constants)) if k not in traced.literals]
            key = compiled_graphs.registered(traced, positions, kept_examples, examples, count, outside, name_of(f))
            _READS[key], compiled_graphs.NAMES[key] = reads, name_of(f)
            # (after the graphs, made on the same stand-ins: any size they assumed is in the condition too)
            condition = size_conditions.condition(examples) if symbolic else 0
            if key in compiled_graphs.WITHOUT_TRANSPOSE:
                return (_REVERSE_ONLY, condition, key, *kept)
            return (key, condition, *kept)
    except (ValueError, TypeError, LookupError):
        raise
    except Exception as error:
        if refusals.raised_by_the_vjp(error):
            raise
        raise refusals.untraceable(f, error, "under torch.compile", vjps[-1] if vjps else None) from error


def _routed(f: Callable[..., Any], traced: aten_graphs.Traced, flat: Sequence[Any], order: int,
            as_written: Callable[[], bool]) -> list[outside_reads.Path] | None:
    """How a compiled call embeds the VJP ``traced`` (with f, as a backward runs): through registered graphs of its map
    and transpose (``compiled_graphs.registered``), which read the tensors from outside at the paths returned (``[]``:
    none); or None, differentiated as Dynamo traces it. Graphs serve where the VJP's literals are numbers: at order 1
    with no tensor from outside, and wherever its autodiff as written is not the map (``as_written``), if f's code
    reaches every tensor from outside by a name (``outside_reads``). Else the autodiff as written serves where it is the
    map, and anything else is refused: a ValueError naming why."""
    drawn = aten_graphs.drawn_op(traced.graph)
    if drawn is not None:  # graphs run again would draw again: the VJP as Dynamo traces it reads the value's draw
        if order == 1 and as_written():
            return None
        raise NotEmbeddable(refusals.DRAWN_AGAIN.format(name=name_of(f), op=drawn))
    outside = [traced.constants[k] for k in range(len(traced.constants)) if k not in traced.literals]
    numbers = all(traced.constants[k].numel() == 1 for k in traced.literals)
    if numbers and not outside:
        return []
    if order == 1 and as_written():  # (order 2 embeds the graphs alone: their derivatives are mapped_zero's)
        return None
    reads = outside_reads.paths(f, flat, outside, _is_shape, _module_members) if numbers else None
    if reads is None:
        raise NotEmbeddable(
            f"The vjp of {name_of(f)} computes without grad mode (no_grad, set_grad_enabled(False), inference_mode, "
            "@once_differentiable), branches on it, changes its cotangent in place or detaches it (detach, .data), as"
            " a Function's backward may. Eagerly and under torch.func the decorator embeds the map such a backward "
            "applies; under torch.compile it does so where it reaches each tensor f and its vjp read from outside (a "
            "weight) by a name their code reads: a cell of f's closure or of a function held there, a global of f's "
            "module, an argument, or an attribute of one of those. Here it did not (a tensor read as an item of a "
            "list or a dict, a global of another module, a tensor made from a literal of several elements), and "
            "differentiating the vjp as written would not give that map. Pass that tensor to f as an argument or read"
            " it by such a name, or write the vjp in grad mode with no stop on the cotangent's path.")
    return reads


_PER_SIZE = -2  # a proof for any size failed: prove for this size, which Dynamo then guards


def _proof_for_any_size(f: Callable[..., Any], names: tuple[str, ...], order: int, skeleton: Any,
                        tensors: tuple[int, ...], numbers: tuple[int, ...], cotangents: tuple[Any, ...],
                        *flat: Any) -> tuple[int, ...]:
    """``_proof_of_f`` for shapes of their rank alone (sizes None, each a symbol): it serves every size where its
    condition holds (``size_conditions``) and the VJP is differentiated as Dynamo traces it anyway (it closes over
    an outside tensor, or ``order=2``; ``differentiated_as_traced``; its ops are judged linear whatever the
    sizes). Anything else is ``_PER_SIZE``, proven again at this call's sizes: a VJP whose map and transpose are
    registered as graphs (they are made for one size), a VJP written as a backward, a trace that fails with sizes
    as symbols (a size read as a number), a refusal."""
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs an op that fails at the stand-in sizes
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return _proof_of_f(f, names, order, skeleton, tensors, numbers, cotangents, *flat, symbolic=True)
    except Exception:  # said again, at this call's sizes, by the proof that follows
        return (_PER_SIZE, 0)
    finally:
        quiet.setLevel(level)


_READS: dict[int, list[outside_reads.Path]] = {}
"""Where the compiled call at each key of ``compiled_graphs.COMPILED`` reads the tensors from outside that its graphs
take last (``outside_reads.paths``): none for most."""
_READERS = types.ModuleType("stopgrad_math.torch.decorator_form._READERS")
"""The readers of those tensors, one per f and key, as attributes: Dynamo inlines one found there as it inlines
f, reading f's cells and globals at each call and guarding them as it guards f's reads."""
_READER_NAMES: weakref.WeakKeyDictionary[Callable[..., Any], dict[int, str]] = weakref.WeakKeyDictionary()
_READER_NUMBERS = itertools.count()


def _module_members(value: Any) -> list[str]:
    """What a layer's own code reads, not f's: a module's parameters, buffers and submodules; a Keras layer's
    variables and layers (its attributes), and a Keras variable's tensor, its ``value``."""
    members = [*value._parameters, *value._buffers, *value._modules] if isinstance(value, torch.nn.Module) else []
    keras = sys.modules.get("keras")  # (a Keras layer is of Keras's, imported by whoever made one)
    if keras is None:
        return members
    if isinstance(value, keras.Variable):
        return ["value"]
    if isinstance(value, keras.layers.Layer):
        members += [name for name, held in vars(value).items() if isinstance(held, keras.Variable | keras.layers.Layer)]
    return members


def _is_shape(value: Any) -> bool:
    """An argument leaf as the proof is given it: a tensor's (shape, dtype, device), not an object to follow."""
    return type(value) is tuple


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def _stopgrad_math_reader(f: Callable[..., Any], key: int) -> str:
    """The name in ``_READERS`` of f's reader of the outside tensors the graphs at ``key`` take, made once per f
    and key and dropped with f; "" where they take none."""
    reads = _READS.get(key)
    if not reads:
        return ""
    names = _READER_NAMES.setdefault(f, {})
    if key not in names:
        names[key] = name = f"read{next(_READER_NUMBERS)}"
        function = typing.cast(types.FunctionType, f)  # paths are found for a plain function alone
        setattr(_READERS, name, outside_reads.reader(function, reads))
        weakref.finalize(f, delattr, _READERS, name)
    return names[key]
