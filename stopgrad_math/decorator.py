"""The decorator form: a vector-Jacobian product embedded as a linear map.

``f(*args, **kwargs)`` returns ``(y, grad_fn)``, grad_fn mapping upstream
gradients to argument gradients (a VJP, as for ``tf.custom_gradient``). The
elementwise identity is exact only for diagonal Jacobians, so the decorator
embeds the linear map itself:

    h = y − (J·v − stop(J·v)),   v = stop(x) − x,   J·v = ∂/∂d ⟨grad_fn(d), v⟩ at d = 0

grad_fn is linear in d, so the inner derivative is exactly the Jacobian-vector
product; v is +0.0 in value, so the subtracted term is +0.0 and h is y bit for
bit; and the derivative of h w.r.t. x is J, whose reverse-mode product with an
upstream gradient is grad_fn(upstream) again. Both zeros are the identity
module's, so there is one code path for the identity.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.util import nest

from stopgrad_math import identity, linearity


def _is_float_tensor(value: Any) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) and identity.is_floating(value.dtype)


def _pack(structure: Any, leaves: list) -> Any:
    """tf.nest.pack_sequence_as, skipped for a single leaf (nest's packing is slow in eager)."""
    return tf.nest.pack_sequence_as(structure, leaves) if tf.nest.is_nested(structure) else leaves[0]


def _stop_tensors(kwargs: dict) -> dict:
    """The keyword arguments with every tensor in them stopped: they are constants."""
    if not kwargs:  # the common case, without nest's cost
        return kwargs
    return tf.nest.map_structure(lambda t: tf.stop_gradient(t) if isinstance(t, tf.Tensor) else t, kwargs)


@dataclasses.dataclass(frozen=True)
class _GradSignature:
    """How to call a grad_fn: which upstream convention, and whether it takes variables."""

    upstream_keyword: bool  # grad(*args, upstream=None): keras, torch style
    structured: bool  # grad(upstream) for a nested y: JAX style, one structured argument
    takes_variables: bool


def _signature_of_parameters(parameters: tuple) -> _GradSignature:
    kinds = dict(parameters)
    positional = [k for k in kinds.values() if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    return _GradSignature(
        upstream_keyword=kinds.get("upstream") == "KEYWORD_ONLY",
        structured=len(positional) - ("variables" in kinds and kinds["variables"] != "KEYWORD_ONLY") == 1
        and "VAR_POSITIONAL" not in kinds.values(),
        takes_variables="variables" in kinds or "VAR_KEYWORD" in kinds.values(),
    )


def _parameters(grad_fn: Callable) -> tuple:
    return tuple((p.name, p.kind.name) for p in inspect.signature(grad_fn).parameters.values())


_SIGNATURES: dict[Any, _GradSignature] = {}


def _signature(grad_fn: Callable) -> _GradSignature:
    """grad_fn's calling convention.

    A plain function's parameters are fixed by its code object, which the
    closures made afresh on every call share, so those are cached by code;
    methods, partials, callable objects and wrapped functions are read anew.
    """
    code = getattr(grad_fn, "__code__", None)
    if code is None or inspect.ismethod(grad_fn) or hasattr(grad_fn, "__wrapped__"):
        return _signature_of_parameters(_parameters(grad_fn))
    if code not in _SIGNATURES:
        _SIGNATURES[code] = _signature_of_parameters(_parameters(grad_fn))
    return _SIGNATURES[code]


@dataclasses.dataclass
class _Arguments:
    """The flattened positional arguments of f and which of them carry gradients."""

    structure: list | None  # None when every argument is a leaf
    leaves: list
    names: list[str]
    differentiable: list[int]

    @classmethod
    def of(cls, args: tuple) -> _Arguments:
        nested = any(tf.nest.is_nested(arg) for arg in args)
        paths = nest.flatten_with_joined_string_paths(list(args)) if nested else list(enumerate(args))
        names = [f"args[{path}]" for path, _ in paths]
        leaves = [leaf for _, leaf in paths]
        differentiable = [i for i, leaf in enumerate(leaves) if _is_float_tensor(leaf)]
        return cls(list(args) if nested else None, leaves, names, differentiable)

    def with_leaves(self, replacements: dict[int, Any]) -> tuple:
        leaves = [replacements.get(i, leaf) for i, leaf in enumerate(self.leaves)]
        return tuple(leaves if self.structure is None else tf.nest.pack_sequence_as(self.structure, leaves))


def _call_f(f: Callable, args: tuple, kwargs: dict) -> tuple[Any, Callable]:
    result = f(*args, **kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and callable(result[1])):
        raise TypeError(f"{getattr(f, '__name__', f)} must return a pair (y, grad_fn); got {type(result).__name__}.")
    return result[0], result[1]


def _as_outputs(y: Any) -> list:
    return [t if t is None or isinstance(t, tf.Tensor) else tf.convert_to_tensor(t) for t in tf.nest.flatten(y)]


def _upstream_zeros(y_leaves: list) -> list:
    return [tf.zeros_like(t) if _is_float_tensor(t) else None for t in y_leaves]


def _call_grad_fn(grad_fn: Callable, y: Any, upstreams: list, variables: list) -> tuple[Any, Any]:
    """Calls grad_fn in its own convention; returns (gradients of args, gradients of variables)."""
    signature = _signature(grad_fn)
    kwargs = {"variables": variables} if variables and signature.takes_variables else {}
    if signature.upstream_keyword:
        result = grad_fn(upstream=_pack(y, upstreams), **kwargs)
    elif signature.structured and len(upstreams) > 1:
        result = grad_fn(_pack(y, upstreams), **kwargs)
    else:
        result = grad_fn(*upstreams, **kwargs)
    if not kwargs:
        return result, None
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ValueError("grad_fn takes `variables`, so it must return (grads_of_args, grads_of_variables).")
    return result[0], result[1]


def _match(gradients: Any, arguments: _Arguments) -> dict[int, tf.Tensor]:
    """Pairs grad_fn's gradients with the differentiable leaves of the arguments."""
    if gradients is None:
        return {}
    flat = [gradients] if isinstance(gradients, (tf.Tensor, tf.Variable)) else tf.nest.flatten(gradients)
    if len(flat) == len(arguments.leaves):
        pairs = dict(enumerate(flat))
    elif len(flat) == len(arguments.differentiable):
        pairs = dict(zip(arguments.differentiable, flat, strict=True))
    else:
        raise ValueError(
            f"grad_fn returned {len(flat)} gradients; f has {len(arguments.leaves)} arguments "
            f"({len(arguments.differentiable)} of them floating tensors): {arguments.names}."
        )
    return {i: _checked_gradient(pairs[i], arguments, i) for i in arguments.differentiable if pairs.get(i) is not None}


def _checked_gradient(gradient: Any, arguments: _Arguments, index: int) -> tf.Tensor:
    name, leaf = arguments.names[index], arguments.leaves[index]
    gradient = tf.convert_to_tensor(gradient, dtype_hint=leaf.dtype)
    if not identity.is_floating(gradient.dtype):
        raise ValueError(f"grad_fn returned a {gradient.dtype.name} gradient for {name}, which is {leaf.dtype.name}.")
    if not gradient.shape.is_compatible_with(leaf.shape):
        raise ValueError(f"grad_fn returned a gradient of shape {gradient.shape} for {name} of shape {leaf.shape}.")
    return gradient


@dataclasses.dataclass
class _Plan:
    """What one call embeds: the value, the grad_fn, and the zeros of its inputs."""

    y: Any
    value_leaves: list
    grad_fn: Callable
    arguments: _Arguments
    zeros: dict[int, tf.Tensor]  # v = stop(x) − x for each differentiable argument
    variables: list
    variable_zeros: list


def _positional(f: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Keyword arguments are constants, unless every argument is a keyword: then
    those that name positional parameters are f's differentiable arguments."""
    if args or not kwargs:
        return args, kwargs
    bound = inspect.signature(f).bind(**kwargs)
    return bound.args, bound.kwargs


def _evaluate(f: Callable, args: tuple, kwargs: dict, order: int) -> _Plan:
    args, kwargs = _positional(f, args, kwargs)
    arguments = _Arguments.of(args)
    x = {i: tf.convert_to_tensor(arguments.leaves[i]) for i in arguments.differentiable}
    zeros = {i: identity.zero_with_slope(t, slope_is_negative=True) for i, t in x.items()}
    stopped = {i: tf.stop_gradient(t) for i, t in x.items()}
    kwargs = _stop_tensors(kwargs)
    with record.VariableWatcher() as watcher:
        y, grad_fn = _call_f(f, arguments.with_leaves(stopped), kwargs)
    if order == 2:
        # The midpoint stop(x) − v/2 equals x bit for bit (−0.0 too) and moves
        # at half speed, which makes J·v exact to second order.
        midpoint = {i: stopped[i] - zeros[i] / 2 for i in x}
        _, grad_fn = _call_f(f, arguments.with_leaves(midpoint), kwargs)
    variables = list(watcher.watched_variables()) if _signature(grad_fn).takes_variables else []
    value_leaves = _as_outputs(y)
    if variables:  # grad_fn gives the variables' gradients: cut autodiff's path to them
        value_leaves = [tf.stop_gradient(t) if _is_float_tensor(t) else t for t in value_leaves]
    variable_zeros = [identity.zero_with_slope(tf.convert_to_tensor(v), slope_is_negative=True) for v in variables]
    return _Plan(y, value_leaves, grad_fn, arguments, zeros, variables, variable_zeros)


def _gradients(plan: _Plan, upstreams: list) -> tuple[list, list, list]:
    """grad_fn(upstreams) as (gradients, the zeros they pair with, their names)."""
    grads, variable_grads = _call_grad_fn(plan.grad_fn, plan.y, upstreams, plan.variables)
    matched = _match(grads, plan.arguments)
    targets = [matched[i] for i in matched]
    zeros = [plan.zeros[i] for i in matched]
    names = [plan.arguments.names[i] for i in matched]
    variable_targets = _variable_targets(variable_grads, plan)
    for gradient, zero, variable in zip(variable_targets, plan.variable_zeros, plan.variables, strict=True):
        if gradient is not None:
            targets.append(gradient)
            zeros.append(zero)
            names.append(variable.name)
    return targets, zeros, names


def _jacobian_times_zeros(plan: _Plan, check_linearity: bool) -> list:
    """J·v for each output leaf: the derivative of ⟨grad_fn(d), v⟩ w.r.t. d at d = 0."""
    upstreams = _upstream_zeros(plan.value_leaves)
    watched = [d for d in upstreams if d is not None]
    with tf.GradientTape(watch_accessed_variables=False) as inner:
        inner.watch(watched)
        targets, zeros, names = _gradients(plan, upstreams)
    linearity.check_at_zero(targets, names)
    if check_linearity:
        linearity.check_superposition(lambda ups: _gradients(plan, ups)[0], upstreams)
    if not targets or not watched:
        return [None] * len(watched)
    zeros = [tf.cast(z, g.dtype) for z, g in zip(zeros, targets, strict=True)]
    products = inner.gradient(targets, watched, output_gradients=zeros)
    linearity.check_connected(products, targets)
    return products


def _variable_targets(variable_grads: Any, plan: _Plan) -> list:
    if not plan.variables:
        return []
    flat = list(variable_grads) if variable_grads is not None else []
    if len(flat) != len(plan.variables):
        raise ValueError(f"grad_fn returned {len(flat)} variable gradients for {len(plan.variables)} variables.")
    pairs = zip(flat, plan.variables, strict=True)
    return [None if g is None else tf.convert_to_tensor(g, dtype_hint=v.dtype) for g, v in pairs]


def _embed(f: Callable, args: tuple, kwargs: dict, order: int, check_linearity: bool) -> Any:
    plan = _evaluate(f, args, kwargs, order)
    products = iter(_jacobian_times_zeros(plan, check_linearity))
    outputs = []
    for leaf in plan.value_leaves:
        product = next(products) if _is_float_tensor(leaf) else None
        if product is not None:  # y − (J·v − stop(J·v)): the same exact zero as for x
            leaf = identity.attach(leaf, [identity.zero_with_slope(product, slope_is_negative=False)])
        outputs.append(leaf)
    return _pack(plan.y, outputs)


def decorate(f: Callable, order: int = 1, check_linearity: bool = False) -> Callable:
    """Returns f with its grad_fn embedded as a linear map.

    The contract, the conventions for grad_fn and the limits are documented
    on the public entry point, ``stopgrad_math.custom_gradient``. The result
    keeps f's name and docstring; f itself is its ``undecorated`` attribute.
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2; got {order}.")

    # A root name scope must start with a letter, digit or '.': '_f' and '<lambda>' would be refused.
    scope = re.sub(r"[^A-Za-z0-9_.]", "_", getattr(f, "__name__", "")).lstrip("_") or "custom_gradient"

    @functools.wraps(f)
    def embedded(*args, **kwargs):
        if identity.nothing_records():
            return _call_f(f, args, kwargs)[0]
        with tf.name_scope(scope):
            return _embed(f, args, kwargs, order, check_linearity)

    # autograph reads a function's source through __wrapped__ and would compile
    # f in place of this wrapper; the original stays reachable as `undecorated`.
    del embedded.__wrapped__
    embedded.undecorated = f
    return embedded
