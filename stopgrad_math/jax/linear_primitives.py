"""Which JAX primitives are linear in which operands: the table that proves a VJP linear from its jaxpr.

The decorator embeds a VJP through ``jax.linear_transpose``, which is exact
for a map built of linear primitives but silently drops what is not (an
additive constant: ``2·ct + 1`` is transposed as ``2·``). So the VJP's jaxpr
is read first. Every variable gets a state of ``shared.linearity`` (CONST,
ZERO, LINEAR or a Finding), in one pass over the equations.

An equation none of whose inputs depends on the cotangent is CONST; one
that reads a Finding passes it on; any other is judged by its row of the
table, following into the bodies of ``jit``, ``checkpoint``, ``cond``,
``scan`` and ``shard_map``. A primitive not in the table is never assumed
linear. ``judge`` returns each result's state: the VJP is linear where
every result is LINEAR or ZERO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend import core

from stopgrad_math.shared.linearity import AFFINE, Finding, Judged, State

_Rule = Callable[[Any, list[Judged]], list[Judged] | Finding]


def _carries(state: Judged) -> bool:
    return state is State.LINEAR


# ---------------------------------------------------------------- rules: (equation, input states) → output states
# A rule is asked only where some input is LINEAR and none is a Finding.


def _outputs(eqn: Any, state: Judged) -> list[Judged]:
    return [state] * len(eqn.outvars)


def _sum_of_terms(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
    """add, sub, concatenate, complex...: linear where every operand is linear or zero (else affine)."""
    if any(s is State.CONST for s in states):
        return Finding(eqn.primitive.name, AFFINE)
    return _outputs(eqn, State.LINEAR)


def _first_operand(zero_operands: Sequence[int] = ()) -> _Rule:
    """Linear in operand 0 (reshapes, slices, sums, FFTs...); every other operand must not depend on the
    cotangent (indices, shapes), and those in ``zero_operands`` must be zero (pad's padding value)."""

    def rule(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
        if any(_carries(s) for s in states[1:]):
            return Finding(eqn.primitive.name, "the cotangent is used as an index, a shape or a fill value")
        if any(states[k] is State.CONST for k in zero_operands):
            return Finding(eqn.primitive.name, "pads the cotangent with a value that is not zero: affine")
        return _outputs(eqn, State.LINEAR)

    return rule


def _linear_operands(linear: Sequence[int]) -> _Rule:
    """Linear in the operands at ``linear`` jointly (each linear or zero); the others must not carry the
    cotangent (select's predicate, a scatter's or dynamic slice's indices)."""

    def rule(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
        if any(_carries(s) for k, s in enumerate(states) if k not in linear):
            return Finding(eqn.primitive.name, "chooses or indexes by the cotangent's values")
        return _sum_of_terms(eqn, [states[k] for k in linear])

    return rule


def _one_side(numerator_only: bool = False) -> _Rule:
    """mul, dot_general, conv: linear where exactly one operand carries the cotangent (div: the numerator)."""

    def rule(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
        if numerator_only and _carries(states[1]):
            return Finding(eqn.primitive.name, "divides by the cotangent (normalizing)")
        if _carries(states[0]) and _carries(states[1]):
            return Finding(eqn.primitive.name, "multiplies the cotangent by itself: quadratic")
        if any(s is State.ZERO for s in states):
            return _outputs(eqn, State.ZERO)
        return _outputs(eqn, State.LINEAR)

    return rule


def _each_operand(eqn: Any, states: list[Judged]) -> list[Judged]:
    """device_put: each result is its operand, moved."""
    return list(states)


def _linear_solve(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
    """custom_linear_solve(matvec, b): linear in b, its operands after the constants of its four functions;
    JAX transposes it by its transpose_solve."""
    constants = sum(eqn.params["const_lengths"])
    if any(_carries(s) for s in states[:constants]):
        return Finding(eqn.primitive.name, "solves against a matrix built from the cotangent")
    return _sum_of_terms(eqn, states[constants:])


def _convert(eqn: Any, states: list[Judged]) -> list[Judged] | Finding:
    if not np.issubdtype(np.dtype(eqn.params["new_dtype"]), np.inexact):
        return Finding(eqn.primitive.name, f"rounds the cotangent to {eqn.params['new_dtype']}")
    return _outputs(eqn, State.LINEAR)


def _refused(why: str) -> _Rule:
    return lambda eqn, states: Finding(eqn.primitive.name, why)


def _custom_rule(eqn: Any, states: list[Judged]) -> Finding:
    name = _function_name(eqn)
    called = f" of {name}" if name else ""
    return Finding(f"{eqn.primitive.name}{called}", "a custom derivative rule (jax.nn.relu is one): its rule, not "
                                                    "its ops, is its derivative, and it has no transpose")


def _function_name(eqn: Any) -> str | None:
    """The name of the function a custom_jvp or custom_vjp call is of (older JAX keeps it one call down)."""
    if "name" in eqn.params:
        return str(eqn.params["name"])
    body = eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr"))
    inner = getattr(body, "jaxpr", body)
    return next((str(e.params["name"]) for e in getattr(inner, "eqns", ()) if "name" in e.params), None)


_ZERO_PRESERVING = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose",
                              "convert_element_type", "copy", "copy_p", "rev", "slice", "device_put"})

_CLIPS = "clips or rectifies the cotangent (relu, clip, max, min)"
_POWERS = "a non-linear function of the cotangent (powers, roots, norms, exp, log, abs, sign)"

RULES: dict[str, _Rule] = {
    **{name: _first_operand() for name in (
        "neg", "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "rev", "slice",
        "dynamic_slice", "gather", "reduce_sum", "cumsum", "reduce_window_sum", "copy", "copy_p", "real", "imag",
        "conj", "fft", "sharding_constraint", "reshard", "split",
    )},
    **{name: _refused("a collective, which couples the examples of a mapped axis: vjp(1) is then not a row of "
                      "the Jacobian, and the decorator's use of it is not proven")
       for name in ("psum", "psum_invariant", "all_gather", "all_gather_invariant", "all_to_all", "ppermute",
                    "reduce_scatter", "pbroadcast", "pvary", "pmax", "pmin")},
    "pad": _first_operand(zero_operands=(1,)),
    "convert_element_type": _convert,
    **{name: _sum_of_terms for name in ("add", "add_any", "sub", "concatenate", "complex")},
    "select_n": lambda eqn, states: _linear_operands(range(1, len(states)))(eqn, states),
    "dynamic_update_slice": _linear_operands((0, 1)),
    "scatter-add": _linear_operands((0, 2)),
    "scatter_add": _linear_operands((0, 2)),
    "scatter": _linear_operands((0, 2)),  # .at[i].set(u): the operand where not set, u where set
    # a max pool's VJP and JVP: the cotangent (or tangent) scattered to, or gathered from, the places the saved
    # operand's windows select; linear in it where the operand does not carry it (checkpointing, issue 57)
    "select_and_scatter_add": _linear_operands((0,)),
    "select_and_gather_add": _linear_operands((0,)),
    "device_put": _each_operand,
    "custom_linear_solve": _linear_solve,
    "mul": _one_side(),
    "dot_general": _one_side(),
    "conv_general_dilated": _one_side(),
    "div": _one_side(numerator_only=True),
    "triangular_solve": lambda eqn, states: (  # solve(a, b): linear in b
        Finding("triangular_solve", "solves against the cotangent") if _carries(states[0])
        else _outputs(eqn, State.LINEAR)),
    **{name: _refused(_CLIPS) for name in ("max", "min", "clamp", "reduce_max", "reduce_min")},
    **{name: _refused("compares the cotangent: a branch chosen by its values")
       for name in ("gt", "ge", "lt", "le", "eq", "ne", "is_finite", "argmax", "argmin", "sort")},
    **{name: _refused(_POWERS) for name in (
        "integer_pow", "square", "sqrt", "rsqrt", "cbrt", "pow", "abs", "sign", "exp", "exp2", "log", "log1p",
        "expm1", "tanh", "logistic", "reduce_prod", "cumprod", "cumlogsumexp", "cummax", "cummin")},
    "stop_gradient": _refused("stops the cotangent: its transpose is not the map's (a decorated function or "
                              "custom_gradient(fx, gx, x) called on the cotangent)"),
    "reduce_precision": _refused("rounds the cotangent"),
    "while": _refused("a while_loop, which JAX cannot transpose (a fori_loop or scan of fixed length can be)"),
    "custom_jvp_call": _custom_rule,
    "custom_vjp_call": _custom_rule,
    "custom_vjp_call_jaxpr": _custom_rule,
}

_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "shard_map"})


# ---------------------------------------------------------------- the walk


def _is_zero_literal(atom: Any) -> bool:
    value = getattr(atom, "val", None)
    try:
        return value is not None and bool(np.all(np.asarray(value) == 0))
    except (TypeError, ValueError):
        return False


class _Walk:
    """States of one jaxpr's variables, its inputs given."""

    def __init__(self, jaxpr: Any, inputs: Sequence[Judged], where: tuple[str, ...]):
        self.where = where
        self.states: dict[Any, Judged] = {v: State.CONST for v in jaxpr.constvars}
        self.states.update(zip(jaxpr.invars, inputs, strict=True))
        for eqn in jaxpr.eqns:
            self._equation(eqn)
        self.outputs = [self.state(v) for v in jaxpr.outvars]

    def state(self, atom: Any) -> Judged:
        if isinstance(atom, core.Literal):
            return State.ZERO if _is_zero_literal(atom) else State.CONST
        return self.states.get(atom, State.CONST)

    def _equation(self, eqn: Any) -> None:
        inputs = [self.state(v) for v in eqn.invars]
        found = next((s for s in inputs if isinstance(s, Finding)), None)
        if found is not None:
            outputs: list[Judged] = _outputs(eqn, found)
        elif not any(_carries(s) for s in inputs):
            zero = eqn.primitive.name in _ZERO_PRESERVING and inputs and all(s is State.ZERO for s in inputs)
            outputs = self._call(eqn, inputs) if eqn.primitive.name in _CALLS else (
                _outputs(eqn, State.ZERO if zero else State.CONST))
        else:
            outputs = self._judged(eqn, inputs)
        self.states.update(zip(eqn.outvars, outputs, strict=True))

    def _judged(self, eqn: Any, inputs: list[Judged]) -> list[Judged]:
        name = eqn.primitive.name
        if name in _CALLS:
            return self._call(eqn, inputs)
        if name == "cond":
            return self._cond(eqn, inputs)
        if name == "scan":
            return self._scan(eqn, inputs)
        rule = RULES.get(name)
        verdict = rule(eqn, inputs) if rule else Finding(name, "not in the table of linear primitives, so not "
                                                               "proven linear", unknown=True)
        if isinstance(verdict, Finding):
            return _outputs(eqn, dataclasses.replace(verdict, where=self.where))
        return verdict

    def _body(self, jaxpr: Any, inputs: Sequence[Judged], label: str) -> list[Judged]:
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's consts are CONST
        return _Walk(jaxpr, inputs, (*self.where, label)).outputs

    def _call(self, eqn: Any, inputs: list[Judged]) -> list[Judged]:
        body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        name = eqn.params.get("name")
        return self._body(body, inputs, f"{eqn.primitive.name}({name})" if name else eqn.primitive.name)

    def _cond(self, eqn: Any, inputs: list[Judged]) -> list[Judged]:
        if _carries(inputs[0]):
            return _outputs(eqn, dataclasses.replace(
                Finding("cond", "a branch chosen by the cotangent's values"), where=self.where))
        branches = [self._body(b, inputs[1:], "cond") for b in eqn.params["branches"]]
        return [_joined("cond", states, self.where) for states in zip(*branches, strict=True)]

    def _scan(self, eqn: Any, inputs: list[Judged]) -> list[Judged]:
        consts, carry_count = eqn.params["num_consts"], eqn.params["num_carry"]
        carry = list(inputs[consts:consts + carry_count])
        while True:  # the carry's state, to a fixed point: it can only rise from CONST/ZERO to LINEAR or Finding
            body = [*inputs[:consts], *carry, *inputs[consts + carry_count:]]
            outputs = self._body(eqn.params["jaxpr"], body, "scan")
            joined = [_joined("scan", (c, o), self.where) for c, o in zip(carry, outputs[:carry_count], strict=True)]
            if joined == carry:
                return outputs
            carry = joined


def _joined(primitive: str, states: Sequence[Judged], where: tuple[str, ...]) -> Judged:
    """The state of a value that is one of ``states`` (branches of a cond, a scan's carry over its steps)."""
    found = next((s for s in states if isinstance(s, Finding)), None)
    if found is not None:
        return found
    if any(_carries(s) for s in states):
        if any(s is State.CONST for s in states):
            return Finding(primitive, "one branch or step gives a constant where another carries the cotangent: "
                                      "affine", where)
        return State.LINEAR
    return State.ZERO if all(s is State.ZERO for s in states) else State.CONST


def judge(closed_jaxpr: Any) -> list[Judged]:
    """The state of each result of a jaxpr whose inputs are all the cotangent."""
    return _Walk(closed_jaxpr.jaxpr, [State.LINEAR] * len(closed_jaxpr.jaxpr.invars), ()).outputs
