"""The stop-gradient identity in PyTorch: stop, the exact zero with slope one, and attaching terms to a value.

    h = stop(f) − T,   T = g·c(stop(x) − x) + N   (+0.0 in value, dT = −g·dx)

``stop`` is ``detach()``. ``stop(x) − x`` is +0.0 for every finite x, and
NaN where x is inf or NaN: the carrier c (``carried_zero``) keeps +0.0
there and passes the derivative at every element. Adding ``N`` (+0.0) makes
a product of sign −0.0 +0.0, so ``f − T`` is f bit for bit. Every other op is
an ordinary ATen op, which ``backward``, ``forward_ad``, ``torch.func`` and
``torch.compile`` all see as it is; a plain eager call of finite x leaves the
carrier out, since it would change no bit (``eager_fast_path`` reproduces
the identity's derivative bit for bit in plain eager calls).

PyTorch has no multiply-no-NaN: ``g·0`` is NaN where g is inf. So the product
takes g with its non-finite elements set to 0, and ``N`` carries their
derivative: a square root at +0.0, whose slope is infinite, so that an inf g
gives an inf derivative of its sign and a NaN g a NaN one, in both modes;
where g is finite, N is sqrt(1) − 1, with slope 0 (``_slope_carrier``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._C._functorch import get_unwrapped, is_functorch_wrapped_tensor

from stopgrad_math.shared.layouts import Layout


def stop(x: torch.Tensor) -> torch.Tensor:
    """x with no derivative: ``detach()``, which backward, forward_ad, torch.func and torch.compile all honour."""
    return x.detach()


def is_inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def inexact_tensor(value: Any, what: str, dtype_hint: torch.dtype | None = None) -> torch.Tensor:
    """value as a floating or complex tensor; a Python number or NumPy value takes ``dtype_hint`` (else torch's
    default dtype). TypeError naming ``what``."""
    if value is None or isinstance(value, (str, bytes, bool)):
        raise TypeError(f"{what} must be a floating or complex tensor; got {value!r:.60}.")
    if isinstance(value, torch.Tensor):
        tensor = value  # as it is: a conversion would be one more op for every mode to trace
    else:
        number = isinstance(value, (int, float, complex))
        try:
            tensor = torch.as_tensor(value, dtype=dtype_hint if number else None)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{what} must be a floating or complex tensor; got {value!r:.60}.") from error
    if not is_inexact(tensor.dtype):
        raise TypeError(f"{what} must be floating or complex, to have a derivative; got {tensor.dtype}.")
    return tensor


def finite(t: torch.Tensor) -> torch.Tensor:
    """isfinite(t) as one comparison, |t| < inf, for a real t (NaN compares false), which Inductor's CPU code
    recomputes where it needs it rather than keeping a boolean mask; isfinite for a complex t."""
    return torch.isfinite(t) if t.is_complex() else t.abs() < math.inf


_COMPILE_LOCK = torch._dynamo.convert_frame.compile_lock  # Dynamo compiles under it, one thread at a time


@torch._dynamo.assume_constant_result  # type: ignore[untyped-decorator]
def _this_thread_compiles() -> bool:
    """Whether this thread holds Dynamo's compile lock: asked at trace time, a constant of the graph."""
    return bool(_COMPILE_LOCK._is_owned())  # type: ignore[attr-defined]


def compiling() -> bool:
    """Whether Dynamo traces this call, on this thread. ``torch.compiler.is_compiling()`` alone is a flag of the
    process, true in every thread while any one compiles: an eager call in another thread then took the
    compiled path (a second derivative raised PyTorch's error rather than the guard's, a proof was not kept).
    Dynamo compiles holding its compile lock, so this asks that too; in code Dynamo traces both are constants."""
    return torch.compiler.is_compiling() and _this_thread_compiles()


def _recorded() -> bool:
    """Whether something records the ops run now, which would bake in a branch on a value: a compilation (first:
    Dynamo folds it, and traces none of the others), a ``torch.jit`` trace, a dispatch mode (``make_fx``, fake
    tensors) or a torch function mode."""
    return bool(compiling() or torch._C._get_tracing_state() or torch._C._len_torch_dispatch_stack()
                or torch._C._len_torch_function_stack())


def plainly_eager() -> bool:
    """Whether ops run now on plain tensors, eagerly, and nothing records what a value decides (``_recorded``)
    and no torch.func transform wraps them. Only there may a branch on a tensor's elements choose the ops."""
    return not (_recorded() or torch._C._are_functorch_transforms_active())


def all_finite(*tensors: torch.Tensor) -> bool:
    """Whether every element of each real tensor is finite, asked eagerly of plain tensors: a sum is finite only
    if every element is (one read); where it is not, which may be an overflow of finite elements, each element
    is asked."""
    return all(math.isfinite(t.detach().sum().item()) or bool(torch.isfinite(t.detach()).all()) for t in tensors)


def eagerly_finite(t: torch.Tensor) -> bool:
    """Whether t is a plain real tensor of finite elements in a call that runs eagerly, under torch.func
    transforms or none (``plainly_eager`` but for the transforms, which run each op as it comes and record no
    branch): there a select that keeps +0.0 for non-finite elements is the identity on values and derivatives,
    and can be left out. Under a transform the elements asked are those of the tensor the wrappers hold (under
    vmap, every sample's)."""
    if not (type(t) is torch.Tensor and t.dtype.is_floating_point and t.layout == torch.strided) or _recorded():
        return False
    t = unwrapped(t)
    return t.layout == torch.strided and all_finite(t)


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The tensor torch.func's wrappers of t hold (under vmap, every sample's), or t."""
    while is_functorch_wrapped_tensor(t):
        t = get_unwrapped(t)
    return t


def zero_with_slope(x: torch.Tensor, slope_is_negative: bool) -> torch.Tensor:
    """c(x − stop(x)) (or c(stop(x) − x)): exactly +0.0, slope ±1 at every element, where x is inf or NaN too
    (x − stop(x) alone is NaN there). c is ``carried_zero``, left out where x is plainly eagerly finite."""
    still = stop(x)
    zero = still - x if slope_is_negative else x - still
    if eagerly_finite(still):  # +0.0 everywhere already: the carrier would change no bit of it or its derivatives
        return zero
    return carried_zero(zero)


class _CarriedZero(torch.autograd.Function):
    """a where it is finite, +0.0 where it is not; backward passes the cotangent unchanged, jvp the tangent."""

    generate_vmap_rule = True  # its forward is ordinary ops of its input: torch.func's vmap batches them

    @staticmethod
    def forward(a: torch.Tensor) -> torch.Tensor:
        return torch.where(finite(a), a, 0.0)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass  # nothing to save: the derivative is the identity

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> torch.Tensor:
        return upstream

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> torch.Tensor:
        return tangent


# Dynamo traces no Function that defines a jvp, nor the template it makes of one under vmap: allowed in the
# graph, the call is kept as it is, and AOTAutograd traces the Function's forward and its derivative in every
# mode and transform, as eager autograd runs them.
@torch._dynamo.allow_in_graph  # type: ignore[untyped-decorator]
def _carrier_applied(a: torch.Tensor) -> torch.Tensor:
    return _CarriedZero.apply(a)  # type: ignore[no-untyped-call,no-any-return]


def carried_zero(a: torch.Tensor) -> torch.Tensor:
    """``a`` where it is finite, +0.0 where it is inf or NaN; its derivative is a's at every element, in every mode.

    For a zero such as x − stop(x) (NaN where x is not finite) it is +0.0
    everywhere with x's derivative everywhere. Ordinary ops cannot give this:
    every op that maps a NaN value to 0 (a select, ``nan_to_num``) masks the
    derivative there too. So one ``autograd.Function`` computes the select
    and passes the cotangent, and the tangent, unchanged; where a is finite
    that is the select's own derivative bit for bit.
    """
    carried: torch.Tensor = _carrier_applied(a)
    return carried


def zero_with_gradient(x: Any) -> torch.Tensor:
    """Returns u = x − stop(x): exactly +0.0 in value, derivative 1 w.r.t. x.

    The ``u`` of the identity ``stop(f) + stop(g)·u``, for identities of your
    own. At an element of x that is inf or NaN the value is still +0.0 and
    the derivative there is 1 all the same.

    Examples:
        >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> u = zero_with_gradient(x)
        >>> u.sum().backward()
        >>> u.detach(), x.grad
        (tensor([0., 0.]), tensor([1., 1.]))
    """
    return zero_with_slope(inexact_tensor(x, "zero_with_gradient's x"), slope_is_negative=False)


def zero_with_derivative_of(p: torch.Tensor, zeros: list[torch.Tensor], linked: bool = True) -> torch.Tensor:
    """c(p − stop(p)): +0.0 in p's shape with p's derivative at every element, p being linear in ``zeros`` (the
    decorator's J·v, with the zeros c(stop(x) − x)).

    p − stop(p) is +0.0 where p is finite (a −0.0 product included), and NaN
    where J holds an inf or NaN (NaN·0): the carrier keeps +0.0 there and
    passes p's derivative, J's product with the zeros', which a NaN in J cuts
    only on the paths through it, as in plain autodiff. ``linked`` adds a
    select that never takes its live branch, Σ zeros, +0.0 with a zero
    tangent: reverse mode passes its unchosen branch an exact zero, which
    links each output to every zero as a Function's node does, and
    ``eager_fast_path.dual_of_map`` reproduces its +0.0 tangent.
    """
    still = stop(p)
    zero = p - still if eagerly_finite(still) else carried_zero(p - still)
    if not linked:
        return zero
    total = sum((z.real.sum() for z in zeros), torch.zeros((), dtype=zero.real.dtype, device=zero.device))
    never = torch.zeros((), dtype=torch.bool, device=zero.device)
    return zero + torch.where(never, total, 0.0).to(zero.dtype)


def _keep_maps(ctx: Any, maps: Any, count: int, constants: tuple[torch.Tensor, ...]) -> None:
    ctx.maps, ctx.count = maps, count
    ctx.save_for_backward(*constants)
    ctx.save_for_forward(*constants)


class _MappedZero(torch.autograd.Function):
    """+0.0 for each output of J(c)·v; backward gives Jᵀ·ct, jvp J·dv, each at c as it is, and nothing to c.
    Plainly eager (its forward takes ``ctx``: PyTorch binds a ``setup_context`` Function's arguments by signature at
    every call, some 10–15 µs); ``_MappedZeroInTransforms`` under torch.func and compiled."""

    @staticmethod
    def forward(ctx: Any, maps: Any, count: int, *operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _keep_maps(ctx, maps, count, operands[count:])
        return tuple(maps.zeros(operands[:count], list(operands[count:])))

    @staticmethod
    def backward(ctx: Any, *cts: torch.Tensor) -> tuple[Any, ...]:
        constants = list(ctx.saved_tensors)
        return (None, None, *ctx.maps.linear(cts, constants), *[None] * len(constants))

    @staticmethod
    def jvp(ctx: Any, _maps: Any, _count: Any, *tangents: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(ctx.maps.transposed(tangents[:ctx.count], list(ctx.saved_tensors)))


class _MappedZeroInTransforms(_MappedZero):
    """``_MappedZero`` with the rules torch.func asks of a Function (``setup_context``, a generated vmap rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(maps: Any, count: int, *operands: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return tuple(maps.zeros(operands[:count], list(operands[count:])))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _keep_maps(ctx, inputs[0], inputs[1], inputs[2 + inputs[1]:])


def saveable(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors, each made under inference_mode copied: such a tensor cannot be saved for a derivative, and its
    copy, of the same values and as free of history, can."""
    return [t.clone() if t.is_inference() else t for t in tensors]


def mapped_zero(maps: Any, vs: list[torch.Tensor], constants: list[torch.Tensor]) -> list[torch.Tensor]:
    """+0.0 for each output of the linear map J(c)·v, whose derivative is J(c) with c's own derivative left to the
    next one: ``backward`` gives Jᵀ·ct and ``jvp`` J·dv, by ``maps.linear(ct, c)`` (the VJP) and
    ``maps.transposed(v, c)``, with c (``constants``, what the VJP closes over) as inputs that get no derivative
    here, so that a double backward or a nested ``torch.func`` transform differentiates the maps through c (the
    Jacobian of the declared gradient), while the first derivative is J whatever J's own derivative holds.
    ``maps.zeros(v, c)``: the +0.0 outputs. Where J is constant the carrier over ordinary ops gives the
    same (``zero_with_derivative_of``); this is the decorator's ``order=2``.
    """
    constants = saveable(constants)
    function = _MappedZero if plainly_eager() else _MappedZeroInTransforms
    zeros: tuple[torch.Tensor, ...] = function.apply(maps, len(vs), *vs, *constants)  # type: ignore[no-untyped-call]
    return list(zeros)


def attach(value: torch.Tensor, terms: list[torch.Tensor]) -> torch.Tensor:
    """value − Σ terms, each exactly +0.0 and broadcasting to value's shape: the value, bit for bit."""
    for term in terms:
        value = value - term.to(value.dtype)
    return value


def _slope_carrier(g: torch.Tensor, finite_g: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """N: +0.0 in g·zero's shape whose derivative is g·d(zero) where g is not finite (inf of g's sign, NaN for a
    NaN or complex g), and exactly 0 where it is. ``zero`` is c(stop(x) − x).

    N = sqrt(k + s·zero) − k, with k = 1 where g is finite (N = 1 − 1, selected: slope exactly 0) and s = ±1
    for ±inf (0 for NaN): there the square root is at +0.0 (addcmul adds k's +0.0 to −zero's −0.0), whose slope
    is infinite, of the sign s gives; a NaN g's slope is inf·0 = NaN. k and s are stopped."""
    k = finite_g.to(zero.real.dtype)
    # sign(g) with 0 for NaN, of comparisons (which Inductor's CPU code vectorizes); complex: NaN
    s = torch.zeros_like(k) if g.is_complex() else (g > 0).to(k.dtype) - (g < 0).to(k.dtype)
    # where g is finite a select of k (a constant), so that an inf or NaN cotangent or tangent there passes
    # nothing through the carrier (s·zero's cotangent would be inf·0 = NaN, where JAX and TensorFlow give inf)
    return torch.sqrt(torch.where(finite_g, k, torch.addcmul(k, s, zero.real))) - k


def zero_term(layout: Layout, fx: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """T: +0.0 broadcasting to fx's shape, derivative −g·dx in its layout (``attach`` subtracts it)."""
    zero = zero_with_slope(x, slope_is_negative=True)
    finite_g = finite(g)
    # carrier + g·zero in one op: its +0.0 makes the product's −0.0 (a negative g) +0.0, as f − T needs
    product = torch.addcmul(_slope_carrier(g, finite_g, zero).to(fx.dtype), torch.where(finite_g, g, 0.0),
                            zero.to(fx.dtype))
    if layout is Layout.ELEMENTWISE:
        return product
    if layout is Layout.JACOBIAN:  # a 0-d x has no axes to sum (and sum(dim=()) would sum them all)
        return product.sum(dim=tuple(range(fx.dim(), product.dim()))) if product.dim() > fx.dim() else product
    total = product.sum()
    if layout is Layout.SCALAR:
        return total
    return total / max(size(fx.shape), 1)  # tfp's rule spreads the sum over fx (an empty fx: no division)


def size(shape: torch.Size | tuple[int, ...]) -> int:
    return math.prod(shape)
