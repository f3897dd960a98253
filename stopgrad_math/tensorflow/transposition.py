"""How a grad_fn is embedded: the route, decided from the ops grad_fn applies to its upstream.

For a y of more than one element the decorator reads J·v off grad_fn by
differentiating grad_fn(d) with respect to the upstream d (the transpose
trick), which is exact only where every op between d and grad_fn's results
is linear in d and has its exact transpose for a gradient. ``findings``
reads those ops, following into every function body they call (``tf.cond``,
``tf.while_loop``, ``tf.switch_case``, nested ``tf.function``s), and
classifies each with ``linear_ops``' table; ``choose_route`` turns the
findings into a ``Route`` or a ValueError naming the ops:

  one element y       ONE_ELEMENT: J = grad_fn(1), no transpose (grad_fn's
                      ops must still be linear)
  all ops LINEAR      TRANSPOSE
  some OPAQUE         UNIT_UPSTREAMS where y has at most SMALL_Y elements known
                      while tracing (J row by row from grad_fn(e_k)), else
                      ValueError
  NONLINEAR or        ValueError, whatever the size of y
    UNTRUSTED

In graphs the ops are those grad_fn made while tracing; in eager mode grad_fn
is traced once per input signature to read them (``trace``). Where it cannot
be traced, ``dot_product_mismatch`` is the numerical fallback.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from stopgrad_math.shared import tolerances
from stopgrad_math.tensorflow import _tf_internal, linear_ops
from stopgrad_math.tensorflow.linear_ops import Kind, Verdict

SMALL_Y = 16  # elements of y up to which J is built from grad_fn on unit upstreams where the transpose fails


class Route(enum.Enum):
    """How the decorator embeds grad_fn for one call."""

    ONE_ELEMENT = "J = grad_fn(1), embedded by the identity form"
    TRANSPOSE = "J·v read off the tape's transpose of grad_fn"
    UNIT_UPSTREAMS = "J built row by row from grad_fn on unit upstreams"
    REVERSE_ONLY = "grad_fn applied to the upstream, as tf.custom_gradient applies it; forward mode refused"


@dataclasses.dataclass(frozen=True)
class Finding:
    """An op on the upstream's path to grad_fn's results that is not plainly LINEAR."""

    op: str  # its type, as TensorFlow names it
    verdict: Verdict

    def __str__(self) -> str:
        return f"{self.op} ({self.verdict.why})"


@dataclasses.dataclass(frozen=True)
class Box:
    """Ops made by a decorated function called on the upstream inside grad_fn: one call. An embedded call is
    judged as a whole (its own grad_fn, not its ops, is its gradient); a ``deferred`` one is the custom gradient
    op alone (``deferred_calls``), through which the upstream passes where it reaches it: f's ops before it are
    read as any others. A declared-linear solve's box is linear in its right-hand side (``linear_in``) alone."""

    ops: frozenset[tf.Operation]
    deferred: bool = False
    linear_in: object = None  # a declared-linear solve's (``solves.linear_solve``): the ref of its right-hand side
    result: tf.Operation | None = None  # and the op of its result, which a refusal names


_BOX = Verdict(Kind.OPAQUE, "a decorated function called on the upstream with a variable, ragged or sparse "
                            "argument: its own grad_fn, not its ops, is its gradient")
_OPERATOR_CARRIES = Verdict(Kind.NONLINEAR, "a linear_solve whose matvec reads the upstream: linear in b alone")
_READING_OPS: contextvars.ContextVar[bool] = contextvars.ContextVar("stopgrad_math_reading_ops", default=False)
_CALLS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase", "PartitionedCall",
                    "StatefulPartitionedCall"})


def findings(ops: Sequence[tf.Operation], upstreams: Sequence[tf.Tensor], results: Sequence[tf.Tensor],
             boxes: Sequence[Box] = ()) -> list[Finding]:
    """The ops among ``ops`` (a graph's, in creation order) on the path from ``upstreams`` to ``results`` that
    are not LINEAR, with their verdicts; results that do not depend on the upstream must be zero."""
    walk = _Walk(boxes)
    walk.run(ops, upstreams)
    needed = _ancestors(results, within=set(ops))
    verdicts = _all_reduces_transposed(walk.verdicts, set(ops))
    found = [finding for op, finding in verdicts if op in needed]
    found += [Finding(f"a result made by {r.op.type}", _CONSTANT) for r in results
              if r.ref() not in walk.carrying and not linear_ops.is_zero(r)]
    return _unique(found)


_CONSTANT = Verdict(Kind.NONLINEAR, "it does not depend on the upstream, and is not known to be zero while "
                                    "tracing: an affine map")


def replicated() -> bool:
    """In a replica context (``tf.distribute``), grad_fn(1) and grad_fn on unit upstreams are not rows of J:
    a collective in grad_fn maps every replica's upstream, not this replica's alone. J·v is the transpose then,
    through the collective's own gradient (an all-reduce's is an all-reduce)."""
    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


def _all_reduces_transposed(verdicts: list[tuple[tf.Operation, Finding]],
                            ops: set[tf.Operation]) -> list[tuple[tf.Operation, Finding]]:
    """The verdicts, less each collective wrapped in a custom gradient and that custom gradient: TensorFlow's
    all-reduce in a replica context (``tf.distribute``), whose gradient, an all-reduce of every replica's
    upstream, is its exact transpose. Unit upstreams cannot stand in for it (each replica would see only its
    own), so it must take the transpose route."""
    in_replica = replicated()
    covered: set[tf.Operation] = set()
    for op, finding in verdicts:
        if finding.verdict is linear_ops.CUSTOM_GRADIENT:
            collectives = {a for a in _ancestors(list(op.inputs), ops) if _is_collective(a, in_replica)}
            if collectives:
                covered |= {op, *collectives}
    return [(op, finding) for op, finding in verdicts if op not in covered]


def _is_collective(op: tf.Operation, replicated: bool) -> bool:
    """A collective op, or, in a replica context, an op whose inputs come from several devices: how a TF1
    graph builds an all-reduce (``MirroredStrategy`` reduces to one device, then copies back). An input with no
    device set says nothing of where it is, and is not counted."""
    if op.type in linear_ops.COLLECTIVES:
        return True
    return replicated and len({t.op.device for t in op.inputs} - {""}) > 1


def _unique(found: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(found))


class _Walk:
    """Follows the upstream forward through ops and the function bodies they call."""

    def __init__(self, boxes: Sequence[Box] = (), zeros: Sequence[tf.Tensor] = ()):
        self.carrying: set[object] = set()
        self._zeros = {t.ref() for t in zeros}  # a body's arguments that are zero where it is called
        self.verdicts: list[tuple[tf.Operation, Finding]] = []  # the op of this graph it comes from
        self._box_of = {op: box for box in boxes for op in box.ops}
        self._boxes_seen: set[Box] = set()

    def run(self, ops: Sequence[tf.Operation], upstreams: Sequence[tf.Tensor]) -> None:
        self.carrying.update(t.ref() for t in upstreams)
        for op in ops:
            box = self._box_of.get(op)
            if box is not None:
                self._box(box)
                continue
            flags = [t.ref() in self.carrying for t in op.inputs]
            if any(flags):
                self._op(op, flags)

    def _op(self, op: tf.Operation, flags: list[bool]) -> None:
        if op.type in _CALLS:
            carried_out = self._call(op, flags)
        else:
            verdict = linear_ops.classify(op, flags, self.is_zero)
            if verdict.kind is Kind.VALUE_FREE:
                return
            if verdict.kind is not Kind.LINEAR:
                self._found(op, verdict)
            carried_out = list(op.outputs)
        self.carrying.update(t.ref() for t in carried_out)

    def _box(self, box: Box) -> None:
        """A nested decorated call: its outputs carry the upstream where any input from outside does."""
        if box in self._boxes_seen:
            return
        self._boxes_seen.add(box)
        if box.deferred:  # IdentityN: each output is its input
            (op,) = box.ops
            self.carrying.update(out.ref() for t, out in zip(op.inputs, op.outputs, strict=True)
                                 if t.ref() in self.carrying)
            return
        inputs = [t for op in box.ops for t in op.inputs if t.op not in box.ops]
        if box.linear_in is not None:
            if box.result is not None and any(t.ref() in self.carrying and t.ref() != box.linear_in for t in inputs):
                self._found(box.result, _OPERATOR_CARRIES)
            if any(t.ref() in self.carrying for t in inputs):
                self.carrying.update(t.ref() for op in box.ops for t in op.outputs)
            return
        if any(t.ref() in self.carrying for t in inputs):
            self._found(next(iter(box.ops)), _BOX)
            self.carrying.update(t.ref() for op in box.ops for t in op.outputs)

    def _call(self, op: tf.Operation, flags: list[bool]) -> list[tf.Tensor]:
        """A call of function bodies: each body walked with its arguments carrying where the op's inputs do."""
        bodies, offset = _bodies(op)
        if bodies is None:
            self._found(op, Verdict(Kind.UNTRUSTED, "a function call whose body cannot be read"))
            return list(op.outputs)
        if offset and flags[0]:  # the branch index or condition depends on the upstream
            self._found(op, Verdict(Kind.NONLINEAR, "it chooses a branch by the upstream's own values"))
        arguments = flags[offset:]
        if op.type in ("While", "StatelessWhile"):
            return self._loop(op, bodies, arguments)
        carried = [False] * len(op.outputs)
        for body in bodies:
            # (CI once met a body with more outputs than its call, under forward over reverse in a tf.function: a
            # forward function TensorFlow makes for a tape returns the call's outputs, then the intermediates it
            # saves; the call's are the first)
            for k, out in enumerate(self._body(op, body, arguments)[:len(op.outputs)]):
                carried[k] = carried[k] or out
        return [t for t, c in zip(op.outputs, carried, strict=True) if c]

    def _loop(self, op: tf.Operation, bodies: list[tf.Graph], flags: list[bool]) -> list[tf.Tensor]:
        """A while loop: the carried loop variables grow until the body adds none (at most one per pass)."""
        condition, body = bodies
        carried = list(flags)
        for _ in range(len(carried) + 1):
            after = [a or b for a, b in zip(carried, self._body(op, body, carried, record=False), strict=True)]
            if after == carried:
                break
            carried = after
        self._body(op, body, carried)
        starts = [t for t, was, now in zip(op.inputs, flags, carried, strict=True) if now and not was]
        if any(not self.is_zero(t) for t in starts):
            self._found(op, Verdict(Kind.NONLINEAR, "its loop adds the upstream to a value that does not depend on "
                                                    "it and is not zero: an affine map"))
        if any(self._body(op, condition, carried)):
            self._found(op, Verdict(Kind.NONLINEAR, "its loop stops by the upstream's own values"))
        return [t for t, c in zip(op.outputs, carried, strict=True) if c]

    def is_zero(self, tensor: tf.Tensor) -> bool:
        return tensor.ref() in self._zeros or linear_ops.is_zero(tensor)

    def _found(self, op: tf.Operation, verdict: Verdict) -> None:
        self.verdicts.append((op, Finding(op.type, verdict)))

    def _body(self, call: tf.Operation, body: tf.Graph, flags: Sequence[bool], record: bool = True) -> list[bool]:
        """Walks a function body; what it finds there is kept under the op that calls it."""
        arguments = list(call.inputs)[len(call.inputs) - len(flags):]
        inner = _Walk(zeros=[t for t, a in zip(body.inputs, arguments, strict=False) if self.is_zero(a)])
        inner.run(body.get_operations(), [t for t, f in zip(body.inputs, flags, strict=False) if f])
        if record:
            needed = _ancestors(body.outputs, within=set(body.get_operations()))
            self.verdicts += [(call, finding) for op, finding in inner.verdicts if op in needed]
        return [t.ref() in inner.carrying for t in body.outputs]


def _bodies(op: tf.Operation) -> tuple[list[tf.Graph] | None, int]:
    """The graphs of the functions an op calls, and how many of its first inputs are not their arguments."""
    attrs = {"If": (["then_branch", "else_branch"], 1), "Case": (["branches"], 1),
             "While": (["cond", "body"], 0), "PartitionedCall": (["f"], 0)}
    kind = op.type.removeprefix("Stateless").removeprefix("Stateful")
    names, offset = attrs[kind]
    functions = []
    for name in names:
        value = op.node_def.attr[name]
        functions += [f.name for f in value.list.func] if value.list.func else [value.func.name]
    graphs = [_tf_internal.function_graph(op.graph, name) for name in functions]
    return (None if any(g is None for g in graphs) else graphs), offset


def _ancestors(results: Sequence[tf.Tensor], within: set[tf.Operation]) -> set[tf.Operation]:
    """The ops among ``within`` that ``results`` depend on (the walk stays inside, not in the whole graph)."""
    seen: set[tf.Operation] = set()
    stack = [t.op for t in results if t.op in within]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs if t.op in within)
    return seen


def choose_route(found: Sequence[Finding], one_element: bool, small: bool) -> Route:
    """The route for grad_fn with these findings, or ValueError naming the ops that forbid every route."""
    refused = [f for f in found if f.verdict.kind in (Kind.NONLINEAR, Kind.UNTRUSTED)]
    if refused:
        raise ValueError(_NOT_LINEAR.format(ops="; ".join(map(str, refused))))
    if one_element:
        return Route.ONE_ELEMENT
    if not found:
        return Route.TRANSPOSE
    return Route.UNIT_UPSTREAMS if small else Route.REVERSE_ONLY


def opaque_reason(found: Sequence[Finding]) -> str:
    """Why J·v cannot be read off grad_fn's ops: those its upstream passes where no tape follows."""
    return f"its ops {'; '.join(map(str, found))} take the upstream where no tape follows"


_NOT_LINEAR = (
    "grad_fn cannot be embedded: the decorator needs it to be linear in the upstream gradient (any stop-gradient "
    "identity's backward pass is linear), and its ops on the upstream's path are not known to be: {ops}. "
    "Gradient clipping or normalization belongs outside the custom gradient (on the gradients a tape returns); "
    "for a Jacobian you know, use the identity form, custom_gradient(fx, jacobian, x)."
)

FORWARD_MODE_MESSAGE = (
    "Forward mode of this decorated call needs J·v, the derivative of grad_fn in its upstream gradient, and "
    "{reason}; reverse mode gives grad_fn(upstream), as tf.custom_gradient does. Forward mode works where y has at "
    f"most {SMALL_Y} elements known while tracing (J is then built from grad_fn on unit upstreams), or with the "
    "Jacobian passed to the identity form, custom_gradient(fx, jacobian, x)."
)

OPAQUE_MESSAGE = (
    "grad_fn cannot be transposed, which the decorator needs to embed it for a y of more than one element: "
    "{reason}. A grad_fn that calls external code (tf.numpy_function), ops whose gradient is disabled "
    "(PreventGradient) or stop_gradient on its upstream (tf.while_loop(back_prop=False)) can be embedded where y "
    f"has at most {SMALL_Y} elements known while tracing (J is then built from grad_fn on unit upstreams); "
    "otherwise compute the Jacobian and pass it to the identity form, custom_gradient(fx, jacobian, x)."
)


def trace(call: Callable[[list[tf.Tensor]], tuple[list[tf.Tensor], Sequence[Box]]],
          specs: Sequence[tf.TensorSpec]) -> list[Finding] | None:
    """Eager mode: the findings of grad_fn, traced once into a graph on upstreams of ``specs``.

    ``call`` maps the upstreams to grad_fn's results (and the boxes of nested
    decorated calls). Eager values grad_fn closes over become the graph's
    captures. None where grad_fn cannot be traced (it reads values in Python).
    """
    found: list[list[Finding]] = []

    def traced(*upstreams: tf.Tensor) -> list[tf.Tensor]:
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        token = _READING_OPS.set(True)
        try:
            results, boxes = call(list(upstreams))
        finally:
            _READING_OPS.reset(token)
        found.append(findings(graph.get_operations()[first:], upstreams, results, boxes))
        return results

    try:
        tf.function(traced, autograph=False).get_concrete_function(*specs)
    except Exception as error:  # any: grad_fn is then run eagerly, where its own errors are raised as they are
        if _is_library_error(error):
            raise
        return None
    return found[0]


def reading_ops() -> bool:
    """Whether an eager grad_fn is being traced only to read its ops (``trace``): a declared-linear solve is not
    run there (a solver that stops in Python cannot be traced); its box stands for it."""
    return _READING_OPS.get()


def _is_library_error(error: Exception) -> bool:
    """A refusal of the library's own (a shape, a dtype, recursion), to be raised as it is."""
    return isinstance(error, ValueError) and "grad_fn" in str(error)


def _real_inner_product(a: tf.Tensor, b: tf.Tensor) -> tuple[float, float]:
    """Re Σ conj(a)·b in float64, and Σ |a|·|b| (the scale its rounding is judged against)."""
    a, b = np.asarray(a).astype(np.complex128), np.asarray(b).astype(np.complex128)
    with np.errstate(invalid="ignore", over="ignore"):  # an infinite derivative: the caller skips the test
        return float(np.real(np.sum(np.conj(a) * b))), float(np.sum(np.abs(a) * np.abs(b)))


def dot_product_mismatch(transposed: Sequence[tuple[tf.Tensor, tf.Tensor]],
                         direct: Sequence[tuple[tf.Tensor, tf.Tensor]], dtype: tf.DType) -> str | None:
    """Why Σ⟨T(a), b⟩ (``transposed``: pairs (T(a), b)) and Σ⟨a, grad_fn(b)⟩ (``direct``: pairs
    (a, grad_fn(b))) cannot be taken for equal, or None where they agree to rounding.

    The numerical fallback where grad_fn cannot be traced: a sample, not a proof. A sum that is not finite (an
    infinite derivative in grad_fn) compares nothing, so it is a reason too: the transpose is never trusted
    unchecked.
    """
    sums = [np.sum([_real_inner_product(p, q) for p, q in pairs], axis=0) if pairs else np.zeros(2)
            for pairs in (transposed, direct)]
    (left, left_scale), (right, right_scale) = sums
    if not np.all(np.isfinite([left, right, left_scale, right_scale])):
        return "its values are not finite at the sample, so a dot-product test of the transpose compares nothing"
    tolerance = tolerances.rtol(dtype, "transpose")
    if abs(left - right) > tolerance * max(left_scale, right_scale, np.finfo(np.float64).tiny):
        return "the tape sees only part of it (a dot-product test of the transpose fails)"
    return None
