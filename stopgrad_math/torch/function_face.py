"""``torch.autograd.Function``'s API on the decorator: an existing Function, its ``backward`` as it is.

A subclass of ``Function`` is written as a subclass of ``torch.autograd.Function`` is (``forward`` with a ``ctx``
or with ``setup_context``, ``backward(ctx, *grads)``, ``apply``). Each ``apply`` is one decorated call
(``custom_gradient``): the forward is f, the backward with the forward's ``ctx`` is its VJP, so the backward alone
gives reverse and forward mode, ``torch.func`` and ``torch.compile``. Where the decorator cannot embed the backward
(not linear in its cotangents, not traceable, a sparse tensor: ``shared.linearity.NotEmbeddable``), or the forward
marks an argument dirty, the call is run by a ``torch.autograd.Function`` made of the same methods: reverse mode is
PyTorch's own, and forward mode raises, naming the reason. ``route`` says which a call takes.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

import torch
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
from torch.autograd import forward_ad
from torch.utils import _pytree as pytree

from stopgrad_math.shared import bounded_cache
from stopgrad_math.shared.linearity import Route
from stopgrad_math.torch import decorator_form, evaluation, identity, refusals, second_derivative_guard

DIRTY = ("{name}.forward marks an argument dirty (ctx.mark_dirty): it changes its argument in place, which the "
         "decorator's f, a function of its arguments, may not")
OWN_RULE = ("{name} defines its own {methods}: its author's rules, which torch.autograd.Function runs, so the class "
            "runs as one (reverse mode from its backward, forward mode and vmap from its own rules, as PyTorch runs "
            "them). Delete {methods} to have every mode derived from the backward, and compiled forward mode too.")


_Mechanism = type[torch.autograd.Function]


_OWN = ("needs_input_grad", "saved_tensors", "non_differentiable")


class FunctionContext:
    """The ``ctx`` a Function's forward and backward share on the decorator: what ``torch.autograd.Function``'s
    context holds, for one call."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self.saved_tensors: tuple[Any, ...] = ()
        self.non_differentiable: list[torch.Tensor] = []

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    @property
    def saved_variables(self) -> tuple[Any, ...]:
        """``saved_tensors``, by the name PyTorch still accepts, with its warning."""
        warnings.warn("'saved_variables' is deprecated; use 'saved_tensors'", DeprecationWarning, stacklevel=2)
        return self.saved_tensors

    def save_for_forward(self, *tensors: Any) -> None:  # read by a jvp alone, which a Function here has not
        del tensors

    def mark_non_differentiable(self, *outputs: torch.Tensor) -> None:
        self.non_differentiable.extend(outputs)

    def set_materialize_grads(self, value: bool) -> None:
        """Kept, with no effect: the backward is given a zero cotangent for every output, where PyTorch may give
        None; a linear backward gives the same gradient for both."""
        self.materialize_grads = value

    def attributes(self) -> tuple[tuple[str, Any], ...]:
        """What the backward may read besides the saved tensors: the attributes set on it, as pairs."""
        return tuple((k, v) for k, v in vars(self).items() if k not in _OWN)

    def mark_dirty(self, *tensors: torch.Tensor) -> None:
        raise NotImplementedError("ctx.mark_dirty: " + DIRTY.format(name="a Function") +
                                  "; call it in forward itself, where the class is run by torch.autograd.Function.")


def _context_of(needs_input_grad: tuple[bool, ...], saved: tuple[Any, ...],
                attributes: tuple[tuple[str, Any], ...]) -> FunctionContext:
    """A context of these parts: a backward's, made anew at each call of the VJP, which closes over the parts alone
    (tuples of tensors and values, for which the decorator keeps a proof, where it cannot for an object)."""
    ctx = FunctionContext(needs_input_grad)
    ctx.saved_tensors = saved
    for name, value in attributes:
        setattr(ctx, name, value)
    return ctx


class Function:
    """A base class with ``torch.autograd.Function``'s API, whose ``backward`` gives every mode.

    Class attributes: ``order`` (2, the default: exact second derivatives, as a double backward takes them; 1: a
    second derivative raises, as ``custom_gradient``'s ``order``). ``route(*args)`` says whether a call embeds the
    backward or falls back to PyTorch's mechanism. The differences from ``torch.autograd.Function`` are listed in
    docs/existing_code.md.

    >>> class Exp(Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         y = x.exp()
    ...         ctx.save_for_backward(y)
    ...         return y
    ...
    ...     @staticmethod
    ...     def backward(ctx, dy):
    ...         (y,) = ctx.saved_tensors
    ...         return dy * y
    >>> torch.func.jvp(Exp.apply, (torch.zeros(2),), (torch.ones(2),))[1]  # forward mode, from the backward
    tensor([1., 1.])
    """

    order: ClassVar[int] = 2
    _stopgrad_math_fallbacks: ClassVar[tuple[_Mechanism, _Mechanism]]  # (compiled, eager): ``_fallbacks``
    _stopgrad_math_own_rules: ClassVar[tuple[str, ...]]  # its own jvp and vmap: it runs as a torch.autograd.Function
    _stopgrad_math_forward: ClassVar[_Forward]
    _stopgrad_math_f: ClassVar[Callable[..., Any]]
    generate_vmap_rule: ClassVar[bool] = False  # accepted: vmap is derived from the backward whatever its value
    # (a class with its own jvp or vmap runs as a torch.autograd.Function, which reads it as PyTorch does)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._stopgrad_math_own_rules = tuple(method for method in ("jvp", "vmap") if hasattr(cls, method))
        cls._stopgrad_math_fallbacks = _fallbacks(cls)
        cls._stopgrad_math_forward = _Forward.of(cls)
        cls._stopgrad_math_f = _forward_and_backward(cls)

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("A Function defines forward.")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        raise NotImplementedError("setup_context is defined by a Function whose forward takes no ctx.")

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError("A Function defines backward.")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """The forward's output, differentiable through the backward in every mode."""
        args, keywords = cls._stopgrad_math_forward.bound(cls.__name__, args, kwargs)
        if keywords:  # (given to keyword-only parameters, which PyTorch passes on and gives no gradient)
            return _fallen_back(cls, args, _keyword_only(cls, keywords), keywords)
        if not evaluation.differentiating(args) and not cls._stopgrad_math_forward.marks_dirty:
            return _forward_alone(cls, args)  # nothing can differentiate it: no route, no proof, no VJP
        return _applied(cls, args, _route(cls, args))

    @classmethod
    def route(cls, *args: Any, **kwargs: Any) -> Route:
        """Whether a call on these arguments embeds the backward (``Route.embedded``), or runs as a
        ``torch.autograd.Function`` (its reason): the arguments are taken as if each floating tensor required grad."""
        args, keywords = cls._stopgrad_math_forward.bound(cls.__name__, args, kwargs)
        if keywords:
            return _keyword_only(cls, keywords)
        asked = tuple(a.detach().requires_grad_() if _differentiable(a) else a for a in args)
        found: list[str] = []
        _ROUTING.value = True  # (a route is proven: its call defers no proof, ``_backward``)
        try:
            with torch.enable_grad():
                route = _route(cls, asked)
                if route.embedded:
                    _embedded(cls, asked, found.append)
        finally:
            _ROUTING.value = False
        return _remembered(cls, asked, found[0]) if found else route


def _has_setup_context(cls: type[Function]) -> bool:
    return cls.setup_context is not Function.setup_context


@dataclasses.dataclass(frozen=True)
class _Forward:
    """What a class's forward is, read once when the class is made (Dynamo traces no ``inspect``): the names and
    defaults of its parameters past ctx (None where one is variadic or keyword-only: then its signature binds a
    call), whether it or ``setup_context`` names ``mark_dirty``, and the sparse tensors' API its methods name."""

    signature: inspect.Signature | None
    names: tuple[str, ...] | None
    defaults: dict[str, Any]
    marks_dirty: bool
    sparse: tuple[str, ...] = ()  # the names of sparse tensors' API its methods' code reads (``_SPARSE_API``)

    @classmethod
    def of(cls, function: type[Function]) -> _Forward:
        forward = function.forward
        setup = function.setup_context if _has_setup_context(function) else None
        marks_dirty = any("mark_dirty" in _names_read(method) for method in (forward, setup))
        sparse = tuple(sorted({name for method in (forward, setup, function.backward) for name in _names_read(method)
                               if name in _SPARSE_API}))
        try:
            signature = inspect.signature(forward)
        except (TypeError, ValueError):
            return cls(None, None, {}, marks_dirty, sparse)
        parameters = list(signature.parameters.values())
        if not _has_setup_context(function):  # forward(ctx, *args): bind past ctx
            parameters = parameters[1:]
        plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)
        return cls(signature.replace(parameters=parameters), tuple(p.name for p in parameters) if plain else None,
                   {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}, marks_dirty,
                   sparse)

    def bound(self, name: str, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments by position, with the forward's defaults, and those given to keyword-only parameters, as
        ``torch.autograd.Function.apply`` binds them."""
        if self.signature is None or (len(kwargs) == 0 and len(self.defaults) == 0):
            return args, {}
        if self.names is None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return tuple(bound.args), dict(bound.kwargs)
        for keyword in kwargs:
            if keyword not in self.names[len(args):]:
                raise TypeError(f"{name}.forward got an unexpected or repeated argument {keyword!r}")
        values = list(args)
        for parameter in self.names[len(args):]:
            if parameter not in kwargs and parameter not in self.defaults:
                raise TypeError(f"{name}.forward is missing a required argument: {parameter!r}")
            values.append(kwargs[parameter] if parameter in kwargs else self.defaults[parameter])
        return tuple(values), {}


_SPARSE_API = frozenset({  # (exact names: a helper called _sparsemax_value names no sparse tensor)
    "sparse", "is_sparse", "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor",
    "sparse_bsc_tensor", "sparse_compressed_tensor", "to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc",
    "to_sparse_bsr", "to_sparse_bsc", "_indices", "_values", "coalesce", "crow_indices", "col_indices",
    "ccol_indices", "row_indices"})
SPARSE = ("{name}'s methods use sparse tensors ({names}), whose ops Inductor cannot compile in the graphs the "
          "decorator's proof traces from them: under torch.compile the class runs as torch.autograd.Function, "
          "which Dynamo runs apart from the graph there")


def _names_read(method: Any) -> tuple[str, ...]:
    """The global and attribute names a method's code reads (none where it has no Python code)."""
    code = getattr(inspect.unwrap(getattr(method, "__func__", method)), "__code__", None)
    return () if code is None else code.co_names


KEYWORD_ONLY = ("{name}.forward is given keyword-only arguments ({names}), which torch.autograd.Function passes on "
                "and gives no gradient, and the decorator's f, whose cotangents are by position, cannot take")


def _keyword_only(cls: type[Function], keywords: dict[str, Any]) -> Route:
    return Route(embedded=False, reason=KEYWORD_ONLY.format(name=cls.__name__, names=", ".join(keywords)))


def _differentiable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _needs_input_grad(args: tuple[Any, ...]) -> tuple[bool, ...]:
    """As PyTorch sets it: true for a differentiable tensor that requires grad in grad mode; besides, for one with a
    forward-mode tangent, and for every differentiable tensor under a torch.func transform (where a wrapper's need
    cannot be read), since forward mode here is the backward's transpose."""
    transform = second_derivative_guard.in_transform()
    grad_mode = torch.is_grad_enabled()
    dual = forward_ad._current_level >= 0

    def needs(value: Any) -> bool:
        if not _differentiable(value):
            return False
        if transform or (grad_mode and value.requires_grad):
            return True
        return dual and forward_ad.unpack_dual(value).tangent is not None  # type: ignore[no-untyped-call]

    return tuple(needs(a) for a in args)


# ---------------------------------------------------------------- the route of a call


_EMBEDDED = Route(embedded=True)
FALLBACKS_KEPT = 256
_FALLBACKS: bounded_cache.BoundedCache[Route] = bounded_cache.BoundedCache(FALLBACKS_KEPT)
"""Calls whose backward could not be embedded, by class and arguments (``_signature``): they fall back at once
after. Only a fall-back is kept, never an embedding, so a key that says too little can only make a call fall back
(PyTorch's own reverse mode), never embed a backward that is not proven."""


def _signature(cls: type[Function], args: tuple[Any, ...]) -> Hashable | None:
    try:
        leaves = tuple((type(v), tuple(v.shape), v.dtype, v.requires_grad) if isinstance(v, torch.Tensor) else
                       (type(v), v) for v in pytree.tree_leaves(list(args)))
        key = (cls, leaves, _needs_input_grad(args))
        hash(key)
    except TypeError:
        return None
    return key


def _route(cls: type[Function], args: tuple[Any, ...]) -> Route:
    """The route known before the call: a forward that names ``mark_dirty`` falls back, as does a call whose
    signature fell back before; else embedded, which the call itself may still find it cannot be."""
    if cls._stopgrad_math_forward.marks_dirty:
        return Route(embedded=False, reason=DIRTY.format(name=cls.__name__))
    if cls._stopgrad_math_own_rules:
        return Route(embedded=False, reason=OWN_RULE.format(name=cls.__name__,
                                                            methods=" and ".join(cls._stopgrad_math_own_rules)))
    if cls._stopgrad_math_forward.sparse and identity.compiling():
        return Route(embedded=False, reason=SPARSE.format(name=cls.__name__,
                                                          names=", ".join(cls._stopgrad_math_forward.sparse)))
    if identity.compiling() or cls not in _FELL_BACK:  # (a class that never fell back: no key to make)
        return _EMBEDDED
    key = _signature(cls, args)
    known = None if key is None else _FALLBACKS.get(key)
    return _EMBEDDED if known is None else known


_FELL_BACK: weakref.WeakSet[type[Function]] = weakref.WeakSet()
"""The classes with a call that fell back: only theirs make a key to look up in ``_FALLBACKS``."""


def _remembered(cls: type[Function], args: tuple[Any, ...], reason: str) -> Route:
    route = Route(embedded=False, reason=reason)
    _FELL_BACK.add(cls)
    key = _signature(cls, args)
    return route if key is None else _FALLBACKS.put(key, route)


def _applied(cls: type[Function], args: tuple[Any, ...], route: Route) -> Any:
    if not route.embedded:
        return _fallen_back(cls, args, route)

    def fallback(reason: str) -> Any:
        if identity.compiling():  # (the cache is Python state, which Dynamo would trace)
            return _fallen_back(cls, args, Route(embedded=False, reason=reason))
        return _fallen_back(cls, args, _remembered(cls, args, reason))

    return _embedded(cls, args, fallback)


def _fallen_back(cls: type[Function], args: tuple[Any, ...], route: Route,
                 keywords: dict[str, Any] | None = None) -> Any:
    """The call run by a ``torch.autograd.Function`` of the class's methods: PyTorch's reverse mode; forward mode
    raises, naming ``route.reason``."""
    compiled, eager = cls._stopgrad_math_fallbacks
    if identity.compiling():
        if second_derivative_guard.in_transform():
            refusals.refuse(f"{cls.__name__} would run as a torch.autograd.Function here, since stopgrad_math "
                            f"cannot embed its backward ({route.reason}), and under torch.compile PyTorch "
                            "differentiates a Function's forward inside a torch.func transform, dropping its "
                            "backward without a word (pytorch#193279, on torch 2.6 to 2.14): call the "
                            "transform outside the compiled function, or make the backward embeddable.")
        if forward_ad._current_level >= 0 and any(
                _differentiable(a) and forward_ad.unpack_dual(a).tangent is not None for a in args):  # type: ignore[no-untyped-call]
            refusals.refuse(f"{cls.__name__} would run as a torch.autograd.Function here, since stopgrad_math "
                            f"cannot embed its backward ({route.reason}), and under torch.compile PyTorch gives "
                            "forward mode of a Function without a jvp as its forward's own derivative, dropping "
                            "its backward without a word, where eagerly it raises: take forward mode outside the "
                            "compiled function, or make the backward embeddable.")
        return compiled.apply(*args, **(keywords or {}))  # type: ignore[no-untyped-call]
    # (a class with rules of its own runs as PyTorch runs it, and meets PyTorch's own error there)
    if second_derivative_guard.in_transform() and not _has_setup_context(cls) and not cls._stopgrad_math_own_rules:
        raise RuntimeError(f"{cls.__name__} runs as a torch.autograd.Function here, since stopgrad_math cannot embed "
                           f"its backward ({route.reason}), and under torch.func transforms PyTorch takes a Function "
                           "whose forward has no ctx and which defines setup_context.")
    _REASONS.value = route.reason
    return eager.apply(*args, **(keywords or {}))  # type: ignore[no-untyped-call]


class _Reasons(threading.local):
    value = ""


_REASONS = _Reasons()


def _fallbacks(cls: type[Function]) -> tuple[_Mechanism, _Mechanism]:
    """Two ``torch.autograd.Function`` classes of cls's methods: one for torch.compile, as cls would be, without a
    jvp or vmap rule (Dynamo refuses a Function with a jvp; compiled forward mode and transforms are refused
    before it runs: ``_fallen_back``); one for eager calls, with the class's own jvp and vmap where it has them,
    else a ``jvp`` that raises, naming why the backward was not embedded."""
    methods: dict[str, Any] = {"forward": staticmethod(cls.forward), "backward": staticmethod(cls.backward)}
    if _has_setup_context(cls):
        methods["setup_context"] = staticmethod(cls.setup_context)
        methods["generate_vmap_rule"] = True  # vmap of forward and backward, as PyTorch derives it

    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise RuntimeError(f"{cls.__name__}: forward mode is derived from the backward where stopgrad_math can "
                           f"embed it, and here it cannot ({_REASONS.value}). This call runs as a "
                           "torch.autograd.Function: reverse mode is PyTorch's, and forward mode would need a jvp.")

    own: dict[str, Any] = {"jvp": staticmethod(jvp)}
    if cls._stopgrad_math_own_rules:  # the author's rules, as PyTorch reads them
        own = {method: staticmethod(getattr(cls, method)) for method in cls._stopgrad_math_own_rules}
        own["generate_vmap_rule"] = cls.generate_vmap_rule
    compiled = type(cls.__name__, (torch.autograd.Function,), {**methods, "__module__": cls.__module__})
    eager = type(cls.__name__, (torch.autograd.Function,), {**methods, **own, "__module__": cls.__module__})
    return compiled, eager


# ---------------------------------------------------------------- the embedded call


def _embedded(cls: type[Function], args: tuple[Any, ...], fallback: Callable[[str], Any]) -> Any:
    """One decorated call of the class's ``_forward_and_backward``, its last argument ``needs_input_grad``;
    ``fallback(reason)`` where the backward cannot be embedded. The outputs the forward marked non-differentiable
    come back detached."""
    marked: list[int] = []  # this call's, filled by its forward (a call in its backward has its own)
    _MARKED.frames.append(marked)
    try:
        result = decorator_form.call_or_fall_back(cls._stopgrad_math_f, (*args, _needs_input_grad(args)), cls.order,
                                                  fallback)
    except _ForwardOnWrappers as error:
        return _on_wrappers(cls, args, error)
    finally:  # left empty between calls: compiled code that reads it is guarded on it as it was when compiled
        _MARKED.frames.pop()
    if len(marked) == 0:
        return result
    if not isinstance(result, tuple):
        return result.detach()
    return tuple(r.detach() if k in marked else r for k, r in enumerate(result))


class _Marked(threading.local):
    """For each call running in this thread, innermost last, the outputs (by index) its forward marked
    non-differentiable: a stack on a threading.local, which Dynamo traces changing (as ``shared.nesting``'s), and
    empty between calls, so that compiled code, which Dynamo guards on what it read there, meets it as it was
    compiled (a list left filled by a call recompiled every compiled function that reads it, alternately)."""

    def __init__(self) -> None:
        self.frames: list[list[int]] = []


_MARKED = _Marked()


def _forward(cls: type[Function], inputs: tuple[Any, ...], needs: tuple[bool, ...]) -> tuple[FunctionContext, Any]:
    """The forward run with a new ctx (and ``setup_context`` where the class defines it), as PyTorch runs it; under
    a torch.func transform, its error as ``_ForwardOnWrappers``."""
    ctx = FunctionContext(needs)
    try:
        if _has_setup_context(cls):
            output = cls.forward(*inputs)
            cls.setup_context(ctx, inputs, output)
        else:
            output = cls.forward(ctx, *inputs)
    except Exception as error:
        if second_derivative_guard.in_transform() and not identity.compiling():
            raise _ForwardOnWrappers(error) from error
        raise
    return ctx, output


class _ForwardOnWrappers(Exception):
    """A forward that fails on the tensors of a torch.func transform (``.numpy()`` of its input, as PyTorch's own
    NumpySort does), which the decorator hands it and ``torch.autograd.Function`` never does: it unwraps them."""


FORWARD_ON_WRAPPERS = ("{name}.forward could not run on the tensors of a torch.func transform ({error}), which the "
                       "decorator differentiates and torch.autograd.Function unwraps")


def _on_wrappers(cls: type[Function], args: tuple[Any, ...], error: _ForwardOnWrappers) -> Any:
    """The call whose forward failed under a torch.func transform: as ``torch.autograd.Function`` runs it (not kept as
    a fall-back: outside transforms the forward runs); under vmap, which would batch that forward, PyTorch's error
    for a Function without vmap support, with the reason."""
    cause = error.__cause__ or error
    reason = FORWARD_ON_WRAPPERS.format(name=cls.__name__, error=f"{type(cause).__name__}: {cause}")
    if any(level.key() == TransformType.Vmap for level in retrieve_all_functorch_interpreters()):
        raise RuntimeError(f"You tried to vmap over {cls.__name__}, but it does not have vmap support. Please override "
                           "and implement the vmap staticmethod or set generate_vmap_rule=True. For more details, "
                           f"please see https://pytorch.org/docs/main/notes/extending.func.html ({reason}.)") from cause
    return _fallen_back(cls, args, Route(embedded=False, reason=reason))


def _forward_alone(cls: type[Function], args: tuple[Any, ...]) -> Any:
    """A call no derivative can be taken of (``evaluation.differentiating``): the forward's output, as the
    decorator gives f's value alone there, for what ``torch.autograd.Function.apply`` costs."""
    return _forward(cls, args, _needs_input_grad(args))[1]


def _forward_and_backward(cls: type[Function]) -> Callable[..., Any]:
    """The decorator's f for the class, made once with it (a function Dynamo finds made, and can hand to the proof
    it makes while compiling): ``f(*inputs, needs_input_grad)`` runs the forward with a new ctx, and its VJP the
    backward with that ctx."""

    def forward_and_backward(*given: Any) -> Any:
        *inputs, needs = given
        ctx, output = _forward(cls, tuple(inputs), needs)
        several = isinstance(output, tuple)
        outputs = output if several else (output,)
        if _MARKED.frames:  # (f runs inside a call's frame; again where order 2 runs it twice)
            _MARKED.frames[-1][:] = [k for k, o in enumerate(outputs) if any(o is m for m in ctx.non_differentiable)] \
                if ctx.non_differentiable else []
        return output, _backward(cls, ctx, several, _shapes(inputs))

    forward_and_backward.__name__ = forward_and_backward.__qualname__ = cls.__name__
    return forward_and_backward


def _shapes(inputs: list[Any]) -> tuple[tuple[int, ...] | None, ...]:
    """Each input's shape (None for what is not a tensor), read eagerly with torch function modes off: an order-2
    watch (``unrecorded.Watch``) would follow each read as an op."""
    def read() -> tuple[tuple[int, ...] | None, ...]:
        return tuple(tuple(i.shape) if isinstance(i, torch.Tensor) else None for i in inputs)

    if identity.compiling():
        return read()
    with torch._C.DisableTorchFunction():
        return read()


def _backward(cls: type[Function], ctx: FunctionContext, several: bool,
              shapes: tuple[tuple[int, ...] | None, ...]) -> Callable[[Any], Any]:
    """The VJP: the backward with the forward's ctx, its gradients taken as PyTorch takes them for inputs of
    ``shapes`` (``_input_grads``). Eagerly it closes over the backward itself, the class's name
    and the ctx's parts, rebuilt at each call (``_context_of``), so that the decorator keeps its proof by signature
    and opens the backward for its key, with the globals it reads (a class's attributes are keyed by identity
    alone); under torch.compile, which proves f anew as it traces, over the ctx itself (Dynamo before torch 2.8
    cannot read an object's ``vars``)."""
    backward, name = cls.backward, cls.__name__
    if identity.compiling():
        def vjp_of_ctx(cotangents: Any) -> tuple[Any, ...]:
            grads = backward(ctx, *(cotangents if several else (cotangents,)))
            return (*_input_grads(name, grads, shapes), None)

        return vjp_of_ctx
    needs, saved, attributes = ctx.needs_input_grad, ctx.saved_tensors, ctx.attributes()

    def vjp(cotangents: Any) -> tuple[Any, ...]:
        grads = backward(_context_of(needs, saved, attributes), *(cotangents if several else (cotangents,)))
        return (*_input_grads(name, grads, shapes), None)

    if not _ROUTING.value:  # what a node that runs it saves, as PyTorch saves them: ``deferred_term`` defers the
        vjp.saved_tensors = [t for t in saved if isinstance(t, torch.Tensor)]  # type: ignore[attr-defined] # proof
    return vjp


class _Routing(threading.local):
    value = False


_ROUTING = _Routing()


def _input_grads(name: str, grads: Any, shapes: tuple[tuple[int, ...] | None, ...]) -> tuple[Any, ...]:
    """The backward's answer, one gradient per input (past those, only None), each in its input's shape, as PyTorch
    takes it: one of the shape the input broadcasts to summed to the input's (``sum_to_size``, linear), any other
    refused in PyTorch's words."""
    count = len(shapes)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) < count or any(g is not None for g in grads[count:]):
        raise RuntimeError(f"{name}.backward returned an incorrect number of gradients (expected {count}, "
                           f"got {len(grads)})")
    return tuple(_in_shape(name, k, g, shape) for k, (g, shape) in enumerate(zip(grads, shapes, strict=False)))


def _in_shape(name: str, index: int, grad: Any, shape: tuple[int, ...] | None) -> Any:
    if not isinstance(grad, torch.Tensor) or shape is None or tuple(grad.shape) == shape:
        return grad
    given = tuple(grad.shape)
    if len(shape) <= len(given) and all(n in (1, m) for n, m in zip(reversed(shape), reversed(given), strict=False)):
        return grad.sum_to_size(shape)  # (the input expands to the gradient's shape: PyTorch's is_expandable_to)
    raise RuntimeError(f"Function {name}Backward returned an invalid gradient at index {index} - got "
                       f"{list(grad.shape)} but expected shape compatible with {list(shape)}")

