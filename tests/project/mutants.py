"""Deliberately broken variants of the library, each of which the suite must catch.

A test suite is only as good as the broken code it fails on. Each mutant
below replaces one function with a broken variant (in the test process
only: ``conftest.py`` applies the one named by ``STOPGRAD_MUTANT``), and
names the tests that must fail on it. ``make test-mutants`` (run by CI)
runs those tests once per mutant, one run per core at a time (each in a
child forked from one process that has imported PyTorch and JAX once), and
fails if any mutant survives or a run breaks:

    python tests/project/mutants.py            every mutant
    python tests/project/mutants.py NAME ...   those named
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Mutant:
    module: str  # where the function lives, as the tests reach it
    name: str
    broken: Callable[[Callable[..., Any]], Callable[..., Any]]  # the original → its broken variant
    caught_by: tuple[str, ...]  # pytest node ids or files that must fail


def _refuses(original):
    def refuses(*args, **kwargs):
        raise ValueError(f"{original.__name__} refuses x.")
    return refuses


def _raw_kernel_error(original):
    def raw(*args, **kwargs):
        if len(args) != 3:  # the decorator form stays as it is
            return original(*args, **kwargs)
        import tensorflow as tf

        return tf.zeros([2]) + tf.zeros([3])  # TensorFlow's own Incompatible shapes, not the library's error
    return raw


def _gradient_times_1_005(original):
    def scaled(x, scale, *args, **kwargs):
        return original(original(x, scale, *args, **kwargs), 1.005)  # right value, and every refusal kept
    return scaled


def _drops_the_sign_of_negative_zero(original):
    def plus_zero(*args, **kwargs):
        import tensorflow as tf

        result = original(*args, **kwargs)
        return result + tf.zeros([], result.dtype) if len(args) == 3 else result  # −0.0 + 0.0 is +0.0
    return plus_zero


def _plain_autodiff(original):
    def autodiff(*args, **kwargs):
        if len(args) == 3:
            import tensorflow as tf

            return tf.convert_to_tensor(args[0])  # fx itself: its own autodiff gradient, gx dropped
        if len(args) == 1 and callable(args[0]) and not kwargs:
            f = args[0]
            return lambda *a, **k: f(*a, **k)[0]  # y itself: grad_fn dropped
        return original(*args, **kwargs)
    return autodiff


def _always_passes(original):
    def passes(*args, **kwargs):
        report = original(*args, **kwargs)
        rows = tuple(dataclasses.replace(row, passed=True) for row in report.rows)
        return dataclasses.replace(report, rows=rows)
    return passes


def _never_guards(original):
    return lambda arguments: False


def _everything_linear(original):
    def linear(*graph):
        from stopgrad_math.shared.linearity import State
        return [State.LINEAR for _ in original(*graph)]
    return linear


def _every_argument_needs_its_gradient(original):
    """ctx.needs_input_grad true for every floating tensor argument, whatever the caller's require."""
    import torch
    return lambda args: tuple(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)


def _findings_taken_for_linear(original):
    """A VJP shown not linear (an op that clips its cotangent) embedded as if it were, so the faces never fall
    back: the identity's derivative of the clipped cotangent, not the rule."""
    def kept(state, *rest):
        from stopgrad_math.shared.linearity import Finding, State
        return original(State.LINEAR if isinstance(state, Finding) and not state.unknown else state, *rest)
    return kept


def _never_checks(original):
    return lambda tensors, order, name, why=None: None


def _proves_nothing_while_compiling(original):
    """Every differentiable argument leaf taken for linear under torch.compile, unproven."""
    return lambda f, leaves, kwargs, outputs, names, order, **options: (list(leaves.differentiable), None, None,
                                                                        False, order)


def _relu_backward_linear_in_its_input(original):
    """threshold_backward (ReLU's backward) taken for linear in its saved input, not in the upstream: a
    checkpointed ReLU block refused, or, were the cotangent read there, passed."""
    from stopgrad_math.torch import linear_ops

    return {**original, "threshold_backward": linear_ops._linear_in((1,))}


def _signature_lost(original):
    """The TensorFlow decorator's result with the wrapper's (*args, **kwargs) signature, not f's."""
    def decorate(f, *args, **kwargs):
        decorated = original(f, *args, **kwargs)
        vars(decorated).pop("__signature__", None)
        return decorated

    return decorate


def _never_a_method(original):
    """A decorated method's instance taken for an argument like any other."""
    return lambda owner, args: False


def _holds_everywhere(original):
    """The compiled proof for any size taken at every size, whatever branches its trace took on sizes."""
    return lambda number, tensors: True


def _never_branched(original):
    """The eager PyTorch proof with a closed-over float as a symbol kept where the trace read the float's value: a
    branch on it, or math.exp of it, taken at the symbol's stand-in value for every value."""
    return lambda traced_on: False


def _compiled_as_written(original):
    """Under torch.compile the VJP differentiated as Dynamo traces it, its proven map and transpose dropped: a VJP
    under no_grad is embedded without its derivative (a silent 0)."""
    def proven(*args, **options):
        proof = original(*args, **options)
        if isinstance(proof, str):  # (a reason to fall back)
            return proof
        kept, _, _, _, order = proof
        return kept, None, None, False, order
    return proven


def _upstream_never_by_keyword(original):
    """Keras's grad(*args, upstream) called grad(ct), as if every grad took its upstream positionally."""
    return lambda f: f


def _no_fence(original):
    return lambda v, watched, order, name: v


def _zero_product_as_a_custom_jvp(original):
    """The custom_jvp the product was: JAX inlines it without its rule where it hoists a loop's invariants."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def zero_product(g, zero):
        return jnp.where(zero == 0, jnp.zeros((), jnp.result_type(g, zero)), g * zero)

    zero_product.defjvp(lambda p, t: (zero_product(*p), p[0] * t[1] + t[0] * p[1]))
    return zero_product


def _keywords_stopped(original):
    return lambda f, kwargs: kwargs  # the keyword arguments as they are: constants to the vjp, a silent 0


def _manual_stop_unchecked(original):
    return lambda fx, planned: (fx, planned)  # fx and gx as given: a live gx doubles the second derivative


def _by_id(original):
    from stopgrad_math.shared.function_identity import same
    return lambda f, depth=2: same(f)  # each of TFP's fresh wrappers another function


def _arrays_baked_in(original):
    import dataclasses

    def opened(vjp):
        found = original(vjp)  # the key as it is, the rebuild the first call's VJP, its arrays baked in
        return None if found is None else dataclasses.replace(found, rebuild=lambda arrays: vjp)
    return opened


def _never_replicated(original):
    return lambda: False


def _passes_everything(original):
    return lambda plan, probe: None


def _differentiated_by_its_own_ops(original):
    from stopgrad_math.tensorflow import evaluation

    return lambda f, args, kwargs, evaluating: evaluation.call_f(f, args, kwargs)[0]  # the declared gradient lost


def _no_slope_carrier(original):
    import torch
    return lambda g, finite_g, zero: torch.zeros((), dtype=zero.dtype)  # an inf gx's derivative: a silent 0


def _adds_plus_zero(original):
    return lambda value, terms: original(value, terms) + 0.0  # −0.0 + 0.0 is +0.0


def _torch_manual_stop_unchecked(original):
    return lambda fx, planned: None


_JAX = "tests/jax/test_decorator_form.py"
_TORCH = "tests/torch/test_identity_form.py"
_AS_BACKWARD = "tests/torch/test_vjp_as_backward.py"


def _differentiates_the_vjp_as_written(original):
    """The decorator's J·v from autodiff of the Python VJP, not from the map traced as a backward runs: a VJP
    under no_grad is embedded without its derivative (a silent 0)."""
    def proven(cotangents, vjp, order):
        kept, _, closed_over, _ = original(cotangents, vjp, order)
        return kept, cotangents.of(vjp, kept), closed_over, None
    return proven


def _readable_cotangents(original):
    """The VJP traced on real zero cotangents: a read of the cotangent's value takes the branch for zero, which is
    embedded as if it were the map."""
    return lambda cotangents: list(cotangents)
def _stale_proof(original):
    """The PyTorch decorator's proof kept without the VJP's own key: a new closure value or global reuses the
    graph of the first call's VJP."""
    def signature(cotangents, opened, order):
        return original(cotangents, dataclasses.replace(opened, key=None), order)
    return signature


def _outside_tensors_read_once(original):
    """The compiled PyTorch decorator's tensors from outside f read once, as its proof is made: a weight changed
    in place or rebound after that is not seen by the graphs."""
    def reader(f, found):
        read = tuple(t.clone() for t in original(f, found)())
        return lambda *arguments: read
    return reader


def _always_differentiating(original):
    """The JAX decorator taking every call for one a derivative may be taken of (issue 75): an eager call on
    concrete values runs fwd, and traces and proves its VJP, where jax.custom_vjp runs fun alone."""
    return lambda args, kwargs: True


def _embedding_keeps_f(original):
    """The JAX decorator's compiled embedding built from the call with f itself in it: the cache keeps f, and so
    the arrays it closes over, alive."""
    class KeepsF(original):
        def shapes(self):
            return dataclasses.replace(original.shapes(self), f=self.f)
    return KeepsF


def _fast_path_simplified(original):
    """The PyTorch identity's fast path with its derivative simplified to c·g and ẋ·g: right up to the sign of a
    zero."""
    return lambda t, g, reverse: t * g


def _fast_path_differentiates_its_formula(original):
    """The fast path's backward under create_graph differentiates its own reduced formula, not the identity's
    ops."""
    import torch

    class Reduced(original):
        @staticmethod
        def backward(ctx, cotangent):
            (g,) = ctx.saved_tensors
            return None, None, torch.mul(cotangent.neg(), g).add(torch.sign(g).mul(0.0)).neg()
    return Reduced


def _dual_of_the_map_alone(original):
    """The PyTorch decorator's forward fast path with J·ẋ for its tangent, without the ordinary ops' −1·(· + 0):
    right up to the sign of a zero."""
    import torch
    import torch.autograd.forward_ad as forward_ad

    def dual_of_map(ys, xs, transposed, factor=None, linked=True):
        if original(ys, xs, transposed, factor, linked) is None:
            return None
        tangents = transposed(*[forward_ad.unpack_dual(x).tangent for x in xs])
        return [forward_ad.make_dual(torch.sub(y, 0.0), t) for y, t in zip(ys, tangents, strict=True)]
    return dual_of_map


def _transform_dual_of_the_map_alone(original):
    """The PyTorch decorator's forward fast path under torch.func.jvp with J·ẋ for its tangent, without the
    ordinary ops' −1·(· + 0): right up to the sign of a zero."""
    class DualOfMap(original):
        @staticmethod
        def jvp(ctx, _transposed, _count, *tangents):
            return tuple(ctx.transposed(*tangents[ctx.count:]))
    return DualOfMap


def _alone_under_any_transforms(original):
    """The PyTorch identity's Function taken under any torch.func transforms, nested derivatives included, where
    its backward's formula would be differentiated in place of the identity's ops."""
    return lambda x, others: True


def _every_graph_maps_tangents(original):
    """The PyTorch decorator's forward fast path taken for any proven J·v, whatever its ops."""
    return lambda graph, live: True


def _last_product_for_the_map(original):
    """The PyTorch decorator's reverse fast path taken where J·v is not one product: its last product by a number
    taken for the whole map."""
    import torch

    def product_factor(graph, live):
        found = original(graph, live)
        products = [n for n in graph.graph.nodes if n.target is torch.ops.aten.mul.Tensor and type(n.args[1]) is float]
        if found is not None or live != 1 or not products:
            return found
        made = torch.fx.Graph()
        made.graph_copy(graph.graph, {})
        made.output(products[-1].args[1])
        return torch.fx.GraphModule(graph, made)
    return product_factor


def _unguarded_products(original):
    """The PyTorch decorator's reverse fast path without the guard: a second derivative through x under
    create_graph, or forward mode over its backward, silently misses J's own derivative."""
    import torch

    class Unguarded(original):
        @staticmethod
        def backward(ctx, cotangent):
            c = ctx.saved_tensors[0] if ctx.number is None else ctx.number
            return cotangent, torch.mul(cotangent.neg(), c).neg(), None, None, None
    return Unguarded


def _product_simplified(original):
    """The PyTorch decorator's reverse fast path with ȳ·c for its backward, in place of the ordinary ops' −((−ȳ)·c):
    the same but for the sign of the NaN that 0·inf makes."""
    import torch

    class Simplified(original):
        @staticmethod
        def backward(ctx, cotangent):
            c = ctx.saved_tensors[0] if ctx.number is None else ctx.number
            return cotangent, torch.mul(cotangent, c), None, None, None
    return Simplified


def _compiled_path_without_carrier(original):
    """The PyTorch identity's compiled fast path with the slope carrier's term left out of its backward: right
    where g is finite, a zero derivative where it is inf or NaN."""
    import math

    import torch

    class WithoutCarrier(original):
        @staticmethod
        def backward(ctx, cotangent):
            g, x = ctx.saved_tensors
            finite_x = x.abs() < math.inf
            g = torch.where(finite_x, g, 0.0)
            product = cotangent.neg() * torch.where(g.abs() < math.inf, g, 0.0)
            return None, None, torch.where(finite_x, product, 0.0).neg()
    return WithoutCarrier


def _compiled_path_in_every_mode(original):
    """The PyTorch identity's compiled fast path taken whatever traces it, torch.func transforms included."""
    from stopgrad_math.torch import compiled_fast_path

    def everywhere(fx, planned):
        (_, _, g, x) = planned[0]
        if len(planned) == 1 and g.shape == x.shape == fx.shape and x.dtype == fx.dtype:
            return compiled_fast_path._CompiledIdentity.apply(fx, g, x)
        return original(fx, planned)
    return everywhere


def _carried_wherever_compiled(original):
    """Forward mode taken for possible wherever torch.compile traces, as the PyTorch decorator took it: its slope
    carrier's zero cotangent added to reverse mode's, where the eager ops leave it out (and the identity's compiled
    fast path never taken)."""
    import torch

    return lambda: torch.compiler.is_compiling() or original()


def _never_carried(original):
    """Forward mode taken for impossible: under a forward-mode level or a torch.func transform, where nothing
    requires grad, the PyTorch decorator returns f's value alone, and it never links J·v for forward mode."""
    return lambda: False


def _always_finite(original):
    """The PyTorch identity's eager shortcut taken for every tensor: its carrier left out where x or J·v is inf
    or NaN, so that the zero there is NaN."""
    return lambda t: True


def _jax_selects_on_j_v(original):
    """J·v kept at +0.0 by a select where it is not finite, as before issue 54: the select passes no derivative
    there, which cuts every path through that output element, not only those through the NaN."""
    import jax
    import jax.numpy as jnp

    def selected(a):
        still = jax.lax.stop_gradient(a)
        return jnp.where(jnp.isfinite(still), a - still, jnp.zeros((), a.dtype))
    return selected


def _jax_no_slope_at_a_non_finite_x(original):
    """stop(x) − x kept at +0.0 by a select where x is inf or NaN, as before issue 54: no derivative there."""
    import jax
    import jax.numpy as jnp

    def selected(x, slope_is_negative):
        still = jax.lax.stop_gradient(x)
        zero = still - x if slope_is_negative else x - still
        return jnp.where(jnp.isfinite(still), zero, jnp.zeros((), x.dtype))
    return selected


def _tf_selects_on_j_v(original):
    """J·v kept at +0.0 by a multiply_no_nan with the finite mask, as before issue 54: no derivative passes where
    it is not finite, which cuts every path through that output element, not only those through the NaN."""
    import tensorflow as tf

    def masked(a):
        zero = a - tf.stop_gradient(a)
        return tf.math.multiply_no_nan(zero, tf.cast(tf.math.is_finite(tf.stop_gradient(a)), a.dtype))
    return masked


def _tf_no_slope_at_a_non_finite_x(original):
    """stop(x) − x kept at +0.0 by a multiply_no_nan with the finite mask where x is inf or NaN, as before issue
    54: no derivative there."""
    import tensorflow as tf

    def masked(x, slope_is_negative, stopped=None):
        still = tf.stop_gradient(x)
        zero = still - x if slope_is_negative else x - still
        return tf.math.multiply_no_nan(zero, tf.cast(tf.math.is_finite(still), x.dtype))
    return masked


def _torch_selects_on_j_v(original):
    """J·v kept at +0.0 by a select where it is not finite, as before issue 54: the select passes no derivative
    there, which cuts every path through that output element, not only those through the NaN."""
    import torch

    def selected(p, zeros, linked=True):
        still = p.detach()
        return torch.where(torch.isfinite(still), p - still, 0.0)
    return selected


def _torch_no_slope_at_a_non_finite_x(original):
    """stop(x) − x kept at +0.0 by a select where x is inf or NaN, as before issue 54: no derivative there."""
    import torch

    def selected(x, slope_is_negative):
        still = x.detach()
        zero = still - x if slope_is_negative else x - still
        return torch.where(torch.isfinite(still), zero, 0.0)
    return selected


def _no_members(original):
    """No layer's own parameters followed: a weight only the module's forward reads is reached by no path."""
    def no_members(value):
        return []
    return no_members


def _forward_mode_zeros(original):
    """The reverse-only terms' forward function gives zero tangents, as tf.custom_gradient's may, not a refusal."""
    import tensorflow as tf

    def zeros_instead(message):
        return lambda zeros: lambda *tangents: [tf.zeros_like(z) for z in zeros]
    return zeros_instead


def _variables_transposed_at_order_1(original):
    """TensorFlow's order 1 embedding a grad_fn that gives variables' gradients by the transpose again (issue 77):
    an inf upstream gives NaN at the variable's element, where tf.custom_gradient gives inf."""
    from stopgrad_math.tensorflow import decorator_form, transposition

    def recorded_terms(plan, forward):
        if "_transposed_forward_mode" in forward.__qualname__:
            return decorator_form._TERMS[transposition.Route.TRANSPOSE](plan, None)
        return original(plan, forward)
    return recorded_terms


def _variables_forward_mode_zeros(original):
    """TensorFlow's order-1 recorded backward for variables giving forward mode zeros, not J·ẋ."""
    import tensorflow as tf

    def transposed(plan):
        return lambda zeros: lambda *tangents: [tf.zeros_like(z) for z in zeros]
    return transposed


def _reverse_only_forward_zeros(original):
    """The PyTorch decorator's carrier for a VJP whose transpose PyTorch cannot form gives forward mode zeros, not
    a refusal naming the op."""
    import dataclasses

    import torch

    @dataclasses.dataclass(frozen=True)
    class ZerosInstead(original):
        def transposed(self, vs, constants):
            if self.without_transpose:
                return [torch.zeros(shape, dtype=dtype) for shape, dtype in self.outputs]
            return super().transposed(vs, constants)

    return ZerosInstead


def _nothing_unrecorded(original):
    """No check of what f computed without grad mode: order=2 with a Function's no_grad forward differentiates the
    VJP through it, and gives a fraction of the Hessian, as before issue 54."""
    return lambda watch, read: False


def _key_without_strides(original):
    """The PyTorch proof key without a closed-over tensor's strides (issue 59): a VJP closing over w and then w.t()
    reuses the graph traced for w's layout."""
    import dataclasses

    return dataclasses.replace(original, key=lambda t: ("tensor", tuple(t.shape), t.dtype, t.device, t.layout))


def _most_recent_use_forgotten(original):
    """BoundedCache.get without move_to_end (issue 59): first in, first out, so a hot entry is dropped after every
    ``size`` new ones and proven or compiled again."""
    def get(self, key):
        return self._entries.get(key)

    original.get = get
    return original


def _globals_of_any_module(original):
    """outside_reads following the globals a function of another module reads as if they were f's (issue 59): the
    reader, which has f's globals alone, then reads f's module's value of that name."""
    import types

    from stopgrad_math.shared import outside_reads

    def roots(f):
        found, names = [], set()
        functions = [((), f)]
        for _ in range(outside_reads.DEPTH + 1):
            following = []
            for route, fn in functions:
                read = outside_reads.names_read(fn.__code__)
                names |= read
                found += [(("global", name), fn.__globals__[name]) for name in sorted(read)
                          if name not in fn.__code__.co_freevars and name in fn.__globals__]
                for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
                    try:
                        value = cell.cell_contents
                    except ValueError:
                        continue
                    found.append((("cell", (*route, name)), value))
                    if isinstance(value, types.FunctionType):
                        following.append(((*route, name), value))
            functions = following
        return found, names
    return roots


def _ones_for_a_missing_upstream(original):
    """deferred_calls reading a None upstream (an output that reaches nothing) as ones, not zeros (issue 59)."""
    import tensorflow as tf

    def ones(outputs, upstreams):
        return {i: tf.ones_like(outputs.components[i].tensor) if u is None else u
                for i, u in zip(outputs.differentiable, upstreams, strict=True)}
    return ones


def _template_named_function(original):
    """The JAX compiled embedding's template named "function" rather than f (issue 59): its messages name no
    function of the user's."""
    return lambda name: original("function")


def _concretization_alone(original):
    """The JAX embedding's fall-back catching ConcretizationTypeError alone, not every JAXTypeError (issue 59): a
    VJP that calls np.asarray or int() on a residual escapes it. The module's jax, with that one name changed."""
    class Errors:
        JAXTypeError = original.errors.ConcretizationTypeError

        def __getattr__(self, name):
            return getattr(original.errors, name)

    class Jax:
        errors = Errors()

        def __getattr__(self, name):
            return getattr(original, name)
    return Jax()


def _nothing_varies(original):
    """The JAX namespace reading no manual axis of shard_map from a type: its products, the decorator's cotangents
    and their ones typed invariant where the values vary."""
    return lambda aval: frozenset()


def _jax_below_any_derivative(original):
    """JAX runs f on the primal values under the parent of any differentiation trace (issue 75's fast path taken
    under a second derivative, a vmap or a jit): at order 2 the next derivative differentiates f's forward by
    autodiff, where it should be the Jacobian of the declared gradient."""
    def below():
        from jax._src import core
        trace = core.trace_ctx.trace
        return getattr(trace, "parent_trace", None) if type(trace).__name__ in ("JVPTrace", "LinearizeTrace") \
            else None
    return below


def _every_function_a_librarys(original):
    """A key takes every function read through a module's or class's attribute by identity, the user's too: a
    global that helper reads, rebound between calls, keeps the first call's proof (the PyTorch and JAX
    decorators' gradients stale, silently)."""
    return lambda code: True


def _remembered_whatever_changed(original):
    """A key reuses a nested function's remembered part without making its reads again: a global that a
    Function's backward reads, rebound between calls, keeps the first call's proof (the gradient stale,
    silently)."""
    return lambda reads: True


def _change_in_place_let_through(original):
    """PyTorch's order=2 lets f change a moving argument in place (issue 76): the change enters the argument's own
    derivative, and the gradient counts it twice, silently."""
    return lambda f, leaves, versions: None


def _second_order_part_in_jax_first_derivatives(original):
    """JAX's order=2 J·v with the residuals' own tangent left in (issue 58): the term (∂J·dc)·v that ordinary ops
    of J·v add, +0.0 in value and NaN where J's derivative is not finite, in every first derivative."""
    def leaking(linear_map, consts, vs):
        from stopgrad_math.jax import identity
        leaked = linear_map(consts, [identity.stop(v) for v in vs])
        zeros = original(linear_map, consts, vs)
        return [z + identity.zero_with_derivative_of(p) for z, p in zip(zeros, leaked, strict=True)]
    return leaking


def _symmetrized_jax_hessian(original):
    """JAX's order=2 term for a y of one element made symmetric (issue 58): half of g's tangent through dzero
    and half through zero, so the Hessian is (∂g + ∂gᵀ)/2, the average the midpoint gave; first derivatives
    unchanged where g's derivative is finite."""
    def symmetrized(layout, fx, x, g, zero=None, mixed=True):
        if mixed:
            return original(layout, fx, x, g, zero, mixed)
        from stopgrad_math.jax import identity
        still = identity.stop(g)
        return (original(layout, fx, x, (g + still) / 2, zero, mixed=False)
                + original(layout, fx, x, (g - still) / 2, zero, mixed=True))
    return symmetrized


def _second_order_part_in_torch_first_derivatives(original):
    """PyTorch's order=2 zero term with the dependence of J·v on what the VJP closes over left in (issue 58):
    (∂J·dc)·v, +0.0 in value and NaN where J's derivative is not finite, in every first derivative."""
    def leaking(maps, vs, constants):
        from stopgrad_math.torch import identity
        leaked = maps.transposed([v.detach() for v in vs], constants)
        return [z + identity.zero_with_derivative_of(p, [], linked=False)
                for z, p in zip(original(maps, vs, constants), leaked, strict=True)]
    return leaking


def _second_order_part_in_tensorflow_first_derivatives(original):
    """TensorFlow's order=2 term built as order 1 builds it, on what f computed from x (issue 58): J·v with J's
    own dependence on x left in, +0.0 in value and NaN where J's derivative is not finite, in every first
    derivative."""
    return lambda plan, order_1_terms: plan.with_terms(order_1_terms(None))


def _symmetrized_tensorflow_hessian(original):
    """TensorFlow's order=2 as it was (issue 58): grad_fn evaluated at the midpoint stop(x) + (x − stop(x))/2,
    moving at half speed, and its J·v attached, whose second derivative is (∂g + ∂gᵀ)/2."""
    def midpoint(plan, order_1_terms):
        from stopgrad_math.tensorflow import evaluation, identity
        components = plan.arguments.components
        at = {i: components[i].stopped + identity.zero_with_slope(components[i].tensor, False) / 2
              for i in plan.arguments.differentiable}
        plan.grad_fn = evaluation.call_f(plan.f, tuple(plan.arguments.with_tensors(at)), {})[1]
        return plan.with_terms(order_1_terms(None))
    return midpoint


def _watch_answering(reads_outside):
    """A PyTorch order=2 watch (``Watch`` under torch.func and forward mode, ``EagerWatch`` plainly eager) that says
    ``reads_outside`` of whether y reads a weight, whatever f read."""
    def broken(original):
        class Answering(original):
            def reaches_outside(self, y):
                return reads_outside
        return Answering
    return broken


# PyTorch's order=2 takes f's value from its call at x even where f read a weight (issue 55): the weight's autodiff
# through y is lost without a word; or runs f twice as it did, applying a running-statistic update twice.
_weights_taken_for_arguments = _watch_answering(False)
_f_always_run_twice = _watch_answering(True)


def _every_exception_wrapped(original):
    """PyTorch's decorator wraps every exception raised while it traces a VJP in its own ValueError (issue 56): the
    user's ``except Boom:`` misses the VJP's own exception."""
    return lambda error: False


def _no_proof_kept_under_transforms(original):
    """PyTorch's decorator proves its VJP anew at every call under a torch.func transform, as before issue 56: the
    right values at 10–40 times the cost."""
    def known(*args):
        from stopgrad_math.torch import second_derivative_guard
        return None if second_derivative_guard.in_transform() else original(*args)
    return known


def _grad_fn_recorded_as_written(original):
    """TensorFlow's eager reverse path records grad_fn(ȳ) as tf.custom_gradient does, not the order-1 terms' own
    −grad_fn(−ȳ) (issue 75): the same numbers, another NaN's sign and a complex zero's sign than every other
    path of the definition gives."""
    def recorded(plan):
        import tensorflow as tf

        from stopgrad_math.tensorflow import _tf_internal, recorded_term
        outputs = plan.outputs.differentiable
        arguments = [plan.arguments.components[i] for i in plan.arguments.differentiable]
        passed = [tf.identity(plan.outputs.components[i].tensor) for i in outputs]

        def backward(*upstreams):
            dense = {i: tf.zeros_like(p) if u is None else u for i, p, u in zip(outputs, passed, upstreams,
                                                                               strict=True)}
            return recorded_term.by_input(plan.gradients_at(dense), arguments)

        _tf_internal.record_operation("mutant", passed, [c.tensor for c in arguments], backward)
        return plan.outputs.with_tensors(dict(zip(outputs, passed, strict=True)))
    return recorded


def _route_proven_at_every_call(original):
    """TensorFlow's decorator keeps no route eagerly (issue 75): grad_fn traced into a graph at every call, the
    right numbers at many times the cost."""
    return lambda *args: None


def _closure_ignored(original):
    """A kept proof is keyed by a function's code alone (issue 75's second mutant): a closed-over value that
    changes grad_fn's ops reuses the proof of another."""
    def key(f, depth=2):
        code = getattr(f, "__code__", None)
        return original(f, depth) if code is None else (code,)
    return key


def _order_2_probe_always(original):
    """TensorFlow's order=2 runs grad_fn on watched zeros at every eager call, for a forward function no
    accumulator can ask (issue 75): the right numbers at 1.4 times the cost."""
    def recorded(plan, probe, route):
        from stopgrad_math.tensorflow import evaluation, transposition
        if probe is None and route is transposition.Route.TRANSPOSE:
            probe = evaluation.probe(plan, persistent=True)
        return original(plan, probe, route)
    return recorded


def _nothing_opened(original):
    """A JAX VJP's closure is never opened (issue 75): every eager derivative traces, proves and transposes the VJP
    again, the right numbers at 3–10 times jax.custom_vjp's cost."""
    return lambda vjp: None


def _plain_call_routed(original):
    """The Function face routes and embeds a call nothing can differentiate (issue 75): the forward's value, at
    twice the mechanism's cost at small sizes."""
    def routed(cls, args):
        from stopgrad_math.torch import function_face
        return function_face._applied(cls, args, function_face._route(cls, args))
    return routed



def _torch_recorded_as_written(original):
    """PyTorch's order-2 node runs the VJP on ȳ as autograd.Function runs a backward, not the carrier's own
    −Jᵀ(−ȳ) (issue 75): the same numbers, another sign of zero and of NaN than the ordinary ops give."""
    def recorded(linear, outputs, xs):
        import torch

        from stopgrad_math.torch import recorded_term

        class AsWritten(recorded_term._RecordedMap):
            @staticmethod
            def backward(ctx, *cotangents):
                constants = list(ctx.saved_tensors)
                upstream = [torch.zeros(shape, dtype=dtype, device=device) if ct is None else ct
                            for ct, (shape, dtype, device) in zip(cotangents, ctx.outputs, strict=True)]
                return (None, None, None, *cotangents, *ctx.linear.on(constants)(*upstream),
                        *[None] * len(constants))

        ys = [outputs.values[k] for k in outputs.differentiable]
        results = AsWritten.apply(linear, len(ys), len(xs), *ys, *xs, *linear.constants)
        return outputs.with_values(dict(zip(outputs.differentiable, results, strict=True)))
    return recorded

_INSIDE_TFP = "tests/tensorflow/test_inside_tfp.py"
_FAST = "tests/torch/test_eager_fast_path.py"
_SWEEP = "tests/tensorflow/test_bad_inputs.py::test_every_call_is_right_or_names_the_problem"
_EXISTING_TORCH = "tests/torch/test_function_face.py"
_EXISTING_JAX_CASES = "tests/jax/test_custom_vjp_cases.py"

_ORDER_2_JAX = "tests/jax/test_order_2.py::"
_ORDER_2_TORCH = "tests/torch/test_order_2.py::"
_ORDER_2_TF = "tests/tensorflow/test_order_2.py::"

_REVERSE_PATH_TF = "tests/tensorflow/test_eager_reverse_path.py::"

_DEFERRED = "tests/torch/test_deferred_term.py::"


def _deferred_never_proven(original):
    """PyTorch's deferred node (issue 75) runs the backward as it is whatever grad mode records: a double backward is
    PyTorch's own, which a backward that detaches its cotangent cuts, and a term that order 2 cannot take is missed
    without a word."""
    class NeverProven(original):
        def gradients(self, cotangents):
            import torch

            with torch.no_grad():
                return original.gradients(self, cotangents)

    return NeverProven


def _deferred_unproven(original):
    """A Function's call defers its proof where its signature was never proven (issue 75): a class whose backward
    cannot be embedded never falls back to PyTorch's mechanism, and its double backward raises."""
    class Unproven(original):
        def __init__(self, cotangents, *args):
            super().__init__(cotangents, *args)
            if self.kept is None:
                self.kept = tuple(cotangents.leaves.differentiable)

    return Unproven


def _aliases_of_arguments_returned(original):
    """The deferred node returning every output as the forward's own tensor (issue 75), one that is an argument's
    elements too: a change in place of the output changes the argument without a word."""
    return lambda tensors: set()


def _checked_shapes(original):
    """The compiled zero terms' shapes read from J·v's graph with its error checks (issue 75): a compiled custom root
    runs two more solves at every step."""
    return lambda graph: graph


def _never_saving(original):
    """TensorFlow's refusal of a wrong gradient raised while tf.saved_model.save traces it (issue 77): the save
    fails, where tf.custom_gradient's saves."""
    return lambda: False


def _implicit_sign_dropped(original):
    """An implicit function's derivative without the theorem's minus sign: dz = (∂_z F)⁻¹ ∂_θ F · dθ (issue 78)."""
    return lambda tree: tree


def _solver_differentiated(original):
    """An implicit function that differentiates its solver rather than embedding the implicit derivative (issue
    78): a solver in NumPy or with a while_loop cannot be differentiated, and an unrolled one gives its own."""
    return lambda solver, *options: solver


def _selects_unmasked(original):
    """JAX's J·v transposing a guarded division as written (issue 77): the select's transpose runs before the
    division's, and ``where(r > 0, g / r, 0)`` gives NaN in forward mode at r = 0, where the declared element is 0."""
    return lambda closed: None


def _wheres_unmasked(original):
    """PyTorch's J·v transposing a guarded division as written (issue 77): ``torch.where(r > 0, g / r, 0)`` gives
    NaN in forward mode at r = 0, where the declared element is 0."""
    return lambda graph, cotangents: []


def _tf_selects_unmasked(original):
    """TensorFlow's J·v transposing a guarded division as written (issue 77): the select's gradient runs before the
    division's, and ``tf.where(x > 0, dy / x, 0)`` gives NaN in forward mode at x = 0, where the declared element
    is 0."""
    return lambda state, tensor, mask, out: None


def _tf_readers_uncounted(original):
    """TensorFlow's masking of a quotient that grad_fn reads besides the select (issue 77): its other reader's share
    is dropped where the select discards, silently."""
    @contextlib.contextmanager
    def recording():
        with original() as ops:
            yield ops
        ops.consumers = dict.fromkeys(ops.consumers, 1)
    return recording


def _tf_readers_intersected(original):
    """TensorFlow's mask of a quotient that two selects read taken where both keep it, not either (issue 77): the
    one that keeps it loses its share, silently."""
    import functools

    import tensorflow as tf

    return type("Functools", (), {"reduce": staticmethod(lambda _, items: functools.reduce(tf.logical_and, items))})


def _tf_broadcast_selects_unmasked(original):
    """TensorFlow masking a select's operands only where they have its condition's static shape (issue 77): a row
    normalization's ``tf.where(r > 0, (dy − …) / r, 0)``, its condition one element a row, gives NaN in forward mode
    at a zero row, and so does every select under an input signature of unknown shapes."""
    def select_operands(state, op_type, inputs, out, kept=None):
        condition, operand = inputs[0].shape, inputs[1].shape
        if condition.is_fully_defined() and condition == operand:
            original(state, op_type, inputs, out, kept)
    return select_operands


def _tf_order_2_backward_unmasked(original):
    """TensorFlow's order-2 backward in a graph as grad_fn's ops as written (issue 77): forward mode through a call
    of a tf.function transposes it twice, and a guarded select's discarded 0 / 0 comes back NaN."""
    class Probe(original):
        def masks_a_select(self):
            return False
    return Probe


def _jax_broadcast_predicates_unmasked(original):
    """JAX masking a select only where its own predicate is made before the quotient (issue 77): ``jnp.where``
    broadcasts a condition of one element a row after the quotient it selects, and a row normalization's VJP gives
    NaN in forward mode at a zero row."""
    import stopgrad_math.jax.masked_selects as masked_selects_jax

    class Graph(original):
        def mask(self, predicate, case, count):
            return masked_selects_jax._Mask(predicate, case, count)
    return Graph


def _jax_divisors_unmasked(original):
    """JAX's guarded division without its double where (issue 77): at order 2 reverse over reverse differentiates
    the VJP through the divisor, −g/x² at x = 0 times the select's zero, NaN where the declared element is 0."""
    def masked(closed):
        found = original(closed)
        if found is not None:
            found.masks = {k: {j: m for j, m in by_operand.items() if m.fill == 0.0}
                           for k, by_operand in found.masks.items()}
        return found
    return masked


def _torch_divisors_unmasked(original):
    """PyTorch's guarded division without its double where (issue 77): ``create_graph`` at order 2 gives NaN at a
    zero row, where the Function's double backward gives 0."""
    return lambda graph, cotangents: [m for m in original(graph, cotangents) if m.fill == 0.0]


def _every_op_followed(original):
    """PyTorch's order 2 following each op of f eagerly, as under torch.func (issue 75's cost: sparsemax's forward
    cost more than twice its ops' time), where only ops with grad mode off need following."""
    from stopgrad_math.torch import unrecorded
    return unrecorded.Watch


def _walk_by_node(original):
    """PyTorch's eager watch ending its walk of y's graph at an argument's node rather than its edge: a weight that is
    another output of that node (an unbind's) loses its autodiff, silently."""
    class ByNode(original):
        def __init__(self, roots):
            super().__init__(roots)
            self.edges = {(node, k) for node, _ in self.edges for k in range(8)}  # (every output of the node)
    return ByNode


def _derived_by_requires_grad(original):
    """PyTorch's eager watch taking every tensor that requires grad for one computed from the arguments: a weight's
    term computed under no_grad is taken as lost, and a second derivative w.r.t. the arguments raises falsely."""
    class ByRequiresGrad(original):
        def derived(self, t):
            return t.requires_grad
    return ByRequiresGrad


def _lost_in_grad_mode_dropped(original):
    """PyTorch's eager watch marking only what an op with grad mode off computes: z = m·x in grad mode, m computed
    without it, is taken as recorded, and a second derivative misses m's term silently."""
    import weakref

    import torch

    from stopgrad_math.torch import unrecorded

    class NoGradOnly(original):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if not torch.is_grad_enabled() and any(t.requires_grad for t in unrecorded.tensors(args)):
                for out in unrecorded.tensors((result,)):
                    if out.is_floating_point():
                        self.lost[id(out)] = weakref.ref(out)
            return result
    return NoGradOnly


def _compiled_order_1_unguarded(original):
    """PyTorch's compiled order 1 without its guard: a compiled torch.func.hessian gives 0 without a word."""
    return lambda refusal, *tensors: tuple(t.view_as(t) for t in tensors)


def _fwds_value_everywhere(original):
    """JAX's custom_vjp face giving fwd's output for a call nothing differentiates, under jit or vmap, where
    jax.custom_vjp gives fun's (t5x's cross-entropy at a +inf logit: NaN for inf)."""
    return lambda fun, args, embedded: embedded


def _forward_let_through(original):
    """JAX's custom_vjp handing a call back to jax.custom_vjp without refusing forward mode first: under jit(jvp),
    linearize or a scan, the user reads JAX's bare TypeError, naming neither the bwd nor why (issue 76)."""
    return lambda value, message: value


def _no_draw_seen(original):
    """PyTorch's compiled proof blind to a draw in f (issue 76): its registered graphs hold f's ops and draw again
    when the derivative runs, so the gradient is another draw's than the value's."""
    return lambda module: None


MUTANTS = {
    "TensorFlow's eager reverse path gives grad_fn's bits, not the definition's": Mutant(
        "stopgrad_math.tensorflow.recorded_term", "grad_fn_recorded", _grad_fn_recorded_as_written,
        (_REVERSE_PATH_TF + "test_the_eager_reverse_path_is_the_transpose_routes_bits[elementwise]",)),
    "TensorFlow's decorator proves grad_fn again at every eager call": Mutant(
        "stopgrad_math.tensorflow.routes", "_eager_signature", _route_proven_at_every_call,
        (_REVERSE_PATH_TF + "test_grad_fn_is_traced_once_per_signature_and_closure",
         "tests/tensorflow/test_decorator_form.py::test_grad_fns_side_effects_happen_where_its_derivative_is_formed")),
    "TensorFlow's order=2 probes grad_fn where no accumulator can ask": Mutant(
        "stopgrad_math.tensorflow.decorator_form", "_recorded_order_2", _order_2_probe_always,
        (_REVERSE_PATH_TF + "test_at_order_2_one_tape_alone_makes_no_probe",)),
    "JAX proves a VJP again at every eager call": Mutant(
        "stopgrad_math.jax.vjp_closure", "opened", _nothing_opened,
        ("tests/jax/test_compiled_embedding.py::test_a_custom_vjp_is_proven_once_per_signature_eagerly",
         "tests/jax/test_compiled_embedding.py::test_a_known_signature_traces_nothing_and_reads_this_calls_arrays")),
    "PyTorch's order-2 node gives the VJP's bits, not the definition's": Mutant(
        "stopgrad_math.torch.recorded_term", "recorded", _torch_recorded_as_written,
        ("tests/torch/test_recorded_term.py::test_a_decorated_function_gives_the_ordinary_ops_derivatives_bit_for_"
         "bit[log1pexp at awkward inputs]",)),
    "PyTorch's deferred node runs the backward as it is where create_graph records its derivative": Mutant(
        "stopgrad_math.torch.deferred_term", "Call", _deferred_never_proven,
        (f"{_DEFERRED}test_a_second_derivative_is_the_embeddings_where_the_backward_detaches_its_cotangent",
         f"{_DEFERRED}test_a_second_derivative_beyond_what_is_embedded_raises_at_every_call")),
    "a Function's call defers its proof at a signature never proven": Mutant(
        "stopgrad_math.torch.deferred_term", "Call", _deferred_unproven,
        (f"{_DEFERRED}test_a_class_whose_backward_falls_back_gives_pytorchs_double_backward_at_every_call",)),
    "PyTorch's deferred node returns an argument's own elements": Mutant(
        "stopgrad_math.torch.deferred_term", "_storages", _aliases_of_arguments_returned,
        (f"{_DEFERRED}test_an_output_that_is_the_input_is_a_copy_and_a_change_in_place_of_it_leaves_the_input_as_it_"
         "was",)),
    "PyTorch's compiled zero terms keep J·v's checked ops alive": Mutant(
        "stopgrad_math.torch.compiled_graphs", "_unchecked", _checked_shapes,
        ("tests/torch/test_decorator_compiled.py::test_a_compiled_custom_root_solves_as_often_as_torch_autograd_"
         "function",)),
    "TensorFlow's refusal of a wrong gradient raises while a SavedModel is saved": Mutant(
        "stopgrad_math.tensorflow._tf_internal", "saving", _never_saving,
        ("tests/tensorflow/test_decorator_form.py::test_a_grad_fn_giving_a_scalar_argument_an_unsummed_gradient_saves_"
         "and_refuses_it_where_it_is_asked",)),
    "JAX's implicit derivative loses its minus sign": Mutant(
        "stopgrad_math.jax.implicit_functions", "_negated", _implicit_sign_dropped,
        ("tests/jax/test_implicit_functions.py::test_ridge_derivatives_in_every_mode_are_the_closed_forms[dense]",)),
    "JAX's implicit functions differentiate the solver": Mutant(
        "stopgrad_math.jax.implicit_functions", "_solved", _solver_differentiated,
        ("tests/jax/test_implicit_functions.py::test_a_numpy_solver_runs_eagerly_on_concrete_values_and_is_never_"
         "differentiated",)),
    "TensorFlow's order 2 records its registered gradient inside pfor's loop body": Mutant(
        "stopgrad_math.tensorflow._tf_internal", "in_pfor_loop_body", lambda original: lambda: False,
        ("tests/tensorflow/test_decorator_form.py::test_order_2_under_a_vectorized_map_of_unknown_batch_gives_the_"
         "declared_gradient",)),
    "TensorFlow's implicit derivative loses its minus sign": Mutant(
        "stopgrad_math.tensorflow.implicit_functions", "_negated", _implicit_sign_dropped,
        ("tests/tensorflow/test_implicit_functions.py::test_ridge_derivatives_in_every_mode_are_the_closed_forms[eager]",)),
    "TensorFlow's implicit functions differentiate the solver": Mutant(
        "stopgrad_math.tensorflow.implicit_functions", "_solved", _solver_differentiated,
        ("tests/tensorflow/test_implicit_functions.py::test_a_scipy_solver_runs_eagerly_on_stopped_values_and_is_never_"
         "differentiated",)),
    "TensorFlow's implicit functions give a third derivative without the guard": Mutant(
        "stopgrad_math.tensorflow.implicit_functions", "_guarded", lambda original: lambda moving, *rest: moving,
        ("tests/tensorflow/test_implicit_functions.py::test_order_1_refuses_a_second_derivative_and_order_2_a_third",)),
    "TensorFlow's declared solve applies its operator where no tape it makes records": Mutant(
        "stopgrad_math.tensorflow.solves", "_recording", lambda original: lambda matvec: matvec,
        ("tests/tensorflow/test_implicit_functions.py::test_a_root_whose_solve_stops_on_a_tolerance_is_exact_in_every_"
         "mode[eager-to a tolerance]",)),
    "TensorFlow's declared solve takes its operator for its own transpose": Mutant(
        "stopgrad_math.tensorflow.solves", "_transposed", lambda original: lambda matvec, like: matvec,
        ("tests/tensorflow/test_implicit_functions.py::test_a_python_loop_solve_inside_a_grad_fn_is_embedded_through_"
         "linear_solve",)),
    "TensorFlow's declared solve runs the solver on a zero right-hand side": Mutant(
        "stopgrad_math.tensorflow.solves", "_solved_unless_zero", lambda original: lambda solve, matvec, b: solve(
            matvec, b),
        ("tests/tensorflow/test_implicit_functions.py::test_a_zero_upstream_or_tangent_gives_zero_where_the_solver_"
         "gives_nan_at_zero[eager]",)),
    "JAX's declared solve runs the solver on a zero right-hand side": Mutant(
        "stopgrad_math.jax.solves", "_zero_at_zero", lambda original: lambda solve: solve,
        ("tests/jax/test_implicit_functions.py::test_a_zero_cotangent_or_tangent_gives_zero_where_the_solver_gives_"
         "nan_at_zero",)),
    "PyTorch's implicit derivative loses its minus sign": Mutant(
        "stopgrad_math.torch.implicit_functions", "_negated", _implicit_sign_dropped,
        ("tests/torch/test_implicit_functions.py::test_ridge_derivatives_in_every_mode_are_the_closed_forms[dense]",)),
    "PyTorch's implicit functions differentiate the solver": Mutant(
        "stopgrad_math.torch.implicit_functions", "_solved", _solver_differentiated,
        ("tests/torch/test_implicit_functions.py::test_a_scipy_solver_runs_eagerly_on_detached_values_and_is_never_"
         "differentiated",)),
    "JAX's transpose divides after the select that discarded the quotient": Mutant(
        "stopgrad_math.jax.masked_selects", "masked", _selects_unmasked,
        ("tests/jax/test_masked_selects.py::test_jacfwd_equals_jacrev_and_the_declared_jacobian_at_a_zero_row",)),
    "PyTorch's transpose divides after the where that discarded the quotient": Mutant(
        "stopgrad_math.torch.masked_selects", "masked", _wheres_unmasked,
        ("tests/torch/test_masked_selects.py::test_jacfwd_equals_jacrev_and_the_declared_jacobian_at_a_zero_row",)),
    "TensorFlow's transpose divides after the select that discarded the quotient": Mutant(
        "stopgrad_math.tensorflow.masked_selects", "_mask", _tf_selects_unmasked,
        ("tests/tensorflow/test_masked_selects.py::test_forward_mode_at_the_guarded_point_is_the_mechanisms",)),
    "TensorFlow masks a quotient that grad_fn reads besides the select": Mutant(
        "stopgrad_math.tensorflow.masked_selects", "recording_ops", _tf_readers_uncounted,
        ("tests/tensorflow/test_masked_selects.py::test_a_quotient_read_besides_the_select_keeps_its_whole_"
         "derivative",)),
    "TensorFlow keeps a quotient two selects read only where both keep it": Mutant(
        "stopgrad_math.tensorflow.masked_selects", "functools", _tf_readers_intersected,
        ("tests/tensorflow/test_masked_selects.py::test_a_quotient_read_by_two_selects_is_kept_where_either_keeps_"
         "it",)),
    "TensorFlow masks a select's operands only where they have its condition's static shape": Mutant(
        "stopgrad_math.tensorflow.masked_selects", "_select_operands", _tf_broadcast_selects_unmasked,
        ("tests/tensorflow/test_masked_selects.py::test_a_condition_that_broadcasts_and_shapes_unknown_while_"
         "tracing_keep_the_declared_zero",)),
    "TensorFlow's order-2 backward in a graph is grad_fn's ops as written where its transpose masks a select": Mutant(
        "stopgrad_math.tensorflow.evaluation", "Probe", _tf_order_2_backward_unmasked,
        ("tests/tensorflow/test_masked_selects.py::test_forward_mode_through_a_traced_call_keeps_the_declared_zero",)),
    "JAX masks a select only where its own predicate is made before the quotient": Mutant(
        "stopgrad_math.jax.masked_selects", "_Graph", _jax_broadcast_predicates_unmasked,
        ("tests/jax/test_masked_selects.py::test_a_condition_broadcast_after_the_quotient_keeps_the_declared_zero",)),
    "JAX's reverse over reverse differentiates a discarded quotient through its divisor": Mutant(
        "stopgrad_math.jax.masked_selects", "masked", _jax_divisors_unmasked,
        ("tests/jax/test_masked_selects.py::test_second_derivatives_at_order_2_give_the_guarded_point_zero",)),
    "PyTorch's double backward differentiates a discarded quotient through its divisor": Mutant(
        "stopgrad_math.torch.masked_selects", "masked", _torch_divisors_unmasked,
        ("tests/torch/test_masked_selects.py::test_a_functions_double_backward_at_a_zero_row_is_the_mechanisms",)),
    "PyTorch's eager order 2 follows every op of f": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _every_op_followed,
        ("tests/torch/test_order_2.py::test_the_eager_watch_follows_no_op_run_in_grad_mode",)),
    "PyTorch's eager watch ends its walk at an argument's node, not its edge": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _walk_by_node,
        ("tests/torch/test_order_2.py::test_a_weight_that_shares_an_arguments_autograd_node_keeps_its_path_at_order_2",)),
    "PyTorch's eager watch takes a weight that requires grad for an argument": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _derived_by_requires_grad,
        ("tests/torch/test_decorator_form.py::test_order_2_reads_a_weight_under_no_grad_as_a_constant_of_the_arguments",)),
    "PyTorch's eager watch loses only what grad mode off computes": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _lost_in_grad_mode_dropped,
        ("tests/torch/test_order_2.py::test_a_tensor_computed_in_grad_mode_from_one_computed_without_it_is_lost_too",)),
    "the Function face routes a call nothing can differentiate": Mutant(
        "stopgrad_math.torch.function_face", "_forward_alone", _plain_call_routed,
        (f"{_EXISTING_TORCH}::test_a_call_nothing_differentiates_costs_the_forward_alone",)),
    "a kept proof ignores what the function closes over": Mutant(
        "stopgrad_math.shared.function_identity", "key", _closure_ignored,
        (_REVERSE_PATH_TF + "test_a_closed_over_value_that_changes_grad_fns_ops_makes_a_new_proof",)),
    "JAX runs f below any derivative, not one eager derivative alone": Mutant(
        "stopgrad_math.jax.sole_derivative", "trace_below", _jax_below_any_derivative,
        (_ORDER_2_JAX + "test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized",
         "tests/jax/test_sole_derivative.py::test_not_taken_where_anything_but_one_eager_derivative_reaches_the_call")),
    "a key takes a user's helper read through its module by identity": Mutant(
        "stopgrad_math.shared.closure_key", "_library_code", _every_function_a_librarys,
        ("tests/shared/test_closure_key.py::test_a_global_that_a_users_function_read_through_a_module_attribute_"
         "reads_is_in_the_key",
         "tests/torch/test_kept_proofs.py::test_a_global_of_a_helper_read_through_its_module_is_read_as_it_is_at_"
         "each_call",
         "tests/jax/test_compiled_embedding.py::test_a_global_of_a_helper_read_through_its_module_is_read_as_it_is_"
         "at_each_call")),
    "a key reuses a helper's part though what it read changed": Mutant(
        "stopgrad_math.shared.closure_key", "_unchanged", _remembered_whatever_changed,
        ("tests/shared/test_closure_key.py::test_a_remembered_part_is_made_again_when_anything_it_read_changed",
         f"{_EXISTING_TORCH}::test_a_global_the_backward_reads_is_read_as_it_is_at_each_call")),
    "PyTorch's order=2 lets f change its argument in place": Mutant(
        "stopgrad_math.torch.evaluation", "_refuse_a_change_in_place", _change_in_place_let_through,
        (f"{_EXISTING_TORCH}::test_a_forward_changing_its_input_in_place_is_refused_at_order_2_and_the_mechanisms_at_"
         "order_1",)),
    "PyTorch's compiled order=1 lets a second derivative through": Mutant(
        "stopgrad_math.torch.compiled_graphs", "guarded_at_order_1", _compiled_order_1_unguarded,
        ("tests/torch/test_decorator_form.py::test_order_1_under_torch_compile_raises_at_a_second_derivative_never_"
         "zero",)),
    "JAX's custom_vjp gives fwd's value where nothing differentiates the call": Mutant(
        "stopgrad_math.jax.custom_vjp_face", "_valued_as_jax_values_it", _fwds_value_everywhere,
        ("tests/jax/test_custom_vjp_face.py::test_the_value_is_funs_where_nothing_differentiates_and_fwds_where_"
         "something_does",)),
    "JAX's custom_vjp hands a call back with forward mode unnamed": Mutant(
        "stopgrad_math.jax.forward_refusal", "refusing_forward", _forward_let_through,
        ("tests/jax/test_custom_vjp_cases.py::test_a_bwd_jax_would_refuse_makes_forward_mode_name_it",
         "tests/jax/test_custom_vjp_face.py::test_symbolic_zeros_forward_mode_raises_naming_it[jit(jvp)]")),
    "PyTorch's compiled proof draws f's noise again": Mutant(
        "stopgrad_math.torch.aten_graphs", "drawn_op", _no_draw_seen,
        ("tests/torch/test_random_draws.py::test_compiled_reverse_mode_is_the_values_draws",
         "tests/torch/test_random_draws.py::test_compiled_a_function_at_order_2_falls_back_with_the_values_draw")),
    "JAX's order=2 lets the second-order part reach first derivatives": Mutant(
        "stopgrad_math.jax.identity", "mapped_zero", _second_order_part_in_jax_first_derivatives,
        (_ORDER_2_JAX + "test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows",)),
    "JAX's order=2 symmetrizes the Hessian": Mutant(
        "stopgrad_math.jax.identity", "zero_term", _symmetrized_jax_hessian,
        (_ORDER_2_JAX + "test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized",)),
    "PyTorch's order=2 lets the second-order part reach first derivatives": Mutant(
        "stopgrad_math.torch.identity", "mapped_zero", _second_order_part_in_torch_first_derivatives,
        (_ORDER_2_TORCH + "test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows",)),
    "TensorFlow's order=2 lets the second-order part reach first derivatives": Mutant(
        "stopgrad_math.tensorflow.recorded_term", "attached", _second_order_part_in_tensorflow_first_derivatives,
        (_ORDER_2_TF + "test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows",)),
    "TensorFlow's order=2 symmetrizes the Hessian": Mutant(
        "stopgrad_math.tensorflow.recorded_term", "attached", _symmetrized_tensorflow_hessian,
        (_ORDER_2_TF + "test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized",)),
    "PyTorch's order=2 takes y from the call at x where f read a weight": Mutant(
        "stopgrad_math.torch.unrecorded", "Watch", _weights_taken_for_arguments,
        (_ORDER_2_TORCH + "test_a_closed_over_tensor_with_a_tangent_keeps_it_at_order_2",)),
    "PyTorch's order=2 runs f twice": Mutant(
        "stopgrad_math.torch.unrecorded", "Watch", _f_always_run_twice,
        (_ORDER_2_TORCH + "test_f_runs_once_at_order_2_unless_it_reads_a_tensor_that_requires_grad_from_elsewhere",)),
    "PyTorch's eager order=2 takes y from the call at x where f read a weight": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _weights_taken_for_arguments,
        (_ORDER_2_TORCH + "test_f_runs_once_at_order_2_unless_it_reads_a_tensor_that_requires_grad_from_elsewhere",
         _ORDER_2_TORCH + "test_a_weight_that_shares_an_arguments_autograd_node_keeps_its_path_at_order_2")),
    "PyTorch's eager order=2 runs f twice": Mutant(
        "stopgrad_math.torch.unrecorded", "EagerWatch", _f_always_run_twice,
        (_ORDER_2_TORCH + "test_a_forward_that_updates_a_running_statistic_updates_it_once_at_order_2",)),
    "PyTorch's decorator wraps the VJP's own exception": Mutant(
        "stopgrad_math.torch.refusals", "raised_by_the_vjp", _every_exception_wrapped,
        ("tests/torch/test_decorator_form.py::test_an_exception_the_vjp_raises_passes_through_unchanged",)),
    "PyTorch's decorator keeps no proof under torch.func": Mutant(
        "stopgrad_math.torch.kept_proofs", "known", _no_proof_kept_under_transforms,
        ("tests/torch/test_kept_proofs.py::test_under_a_transform_a_known_signature_traces_nothing_and_reads_this_"
         "calls_tensors[func.jvp]",)),
    "the Function face says every argument needs its gradient": Mutant(
        "stopgrad_math.torch.function_face", "_needs_input_grad", _every_argument_needs_its_gradient,
        (f"{_EXISTING_TORCH}::test_needs_input_grad_is_true_exactly_where_the_callers_argument_requires_grad",)),
    "a backward that is not linear is embedded instead of falling back": Mutant(
        "stopgrad_math.shared.linearity", "kept", _findings_taken_for_linear,
        (f"{_EXISTING_TORCH}::test_a_backward_that_cannot_be_embedded_is_the_functions_to_the_bit_and_forward_mode_"
         "names_why[clip]",
         f"{_EXISTING_JAX_CASES}::test_a_bwd_not_linear_in_its_cotangent_is_custom_vjps_in_reverse_mode_and_forward_"
         "mode_names_it")),
    "scale_gradient refuses every call": Mutant(
        "stopgrad_math", "scale_gradient", _refuses, (f"{_SWEEP}[scale_gradient-eager]",)),
    "custom_gradient raises a raw kernel error": Mutant(
        "stopgrad_math", "custom_gradient", _raw_kernel_error, (f"{_SWEEP}[custom_gradient-eager]",)),
    "scale_gradient's gradient 1.005 times too large": Mutant(
        "stopgrad_math", "scale_gradient", _gradient_times_1_005, (f"{_SWEEP}[scale_gradient-eager]",)),
    "custom_gradient drops the sign of −0.0": Mutant(
        "stopgrad_math", "custom_gradient", _drops_the_sign_of_negative_zero,
        ("tests/tensorflow/test_identity_form.py::test_value_is_fx_bit_for_bit_whatever_gx_and_x_hold",)),
    "custom_gradient is plain autodiff": Mutant(
        "stopgrad_math", "custom_gradient", _plain_autodiff,
        ("tests/tensorflow/test_identity_form.py", "tests/tensorflow/test_decorator_form.py")),
    "check_gradient passes everything": Mutant(
        "stopgrad_math", "check_gradient", _always_passes,
        ("tests/tensorflow/test_bad_inputs.py::test_check_gradient_never_passes_a_wrong_gradient_or_nothing",
         "tests/tensorflow/test_check_suite.py")),
    "the order-1 decorator never guards second derivatives": Mutant(
        "stopgrad_math.tensorflow.second_derivative_guard", "needed", _never_guards,
        ("tests/tensorflow/test_second_derivative_guard.py",)),
    "the JAX decorator takes every vjp for linear": Mutant(
        "stopgrad_math.jax.linear_primitives", "judge", _everything_linear,
        (f"{_JAX}::test_a_vjp_that_is_not_linear_is_refused_naming_the_primitive_where_a_derivative_is_asked",)),
    "the JAX decorator never guards second derivatives": Mutant(
        "stopgrad_math.jax.second_derivative_guard", "guarded", _no_fence,
        (f"{_JAX}::test_order_1_second_derivatives_raise_naming_order_2",)),
    "the JAX identity's zero product is a custom_jvp": Mutant(
        "stopgrad_math.jax.identity", "zero_product", _zero_product_as_a_custom_jvp,
        ("tests/jax/test_second_derivative_guard.py::test_order_1_raises_and_order_2_is_exact_in_every_nesting",)),
    "the JAX decorator lets keyword arguments through unheld": Mutant(
        "stopgrad_math.jax.decorator_form", "_held_constant", _keywords_stopped,
        (f"{_JAX}::test_keyword_arguments_are_constants_whose_derivative_raises_naming_them",)),
    "the JAX identity takes fx_gx_manually_stopped on trust": Mutant(
        "stopgrad_math.jax.identity_form", "_held_apart_from_x", _manual_stop_unchecked,
        ("tests/jax/test_identity_form.py::test_a_manually_stopped_gx_or_fx_that_moves_with_x_is_a_value_error_"
         "naming_it",)),
    "a decorated function is known by its id": Mutant(
        "stopgrad_math.shared.function_identity", "key", _by_id,
        (f"{_INSIDE_TFP}::test_a_recursive_bessel_gradient_under_tf_function_ends_its_recursion",
         f"{_INSIDE_TFP}::test_eager_calls_after_the_first_trace_nothing")),
    "the JAX decorator's compiled embedding bakes in the first call's arrays": Mutant(
        "stopgrad_math.jax.vjp_closure", "opened", _arrays_baked_in,
        ("tests/jax/test_compiled_embedding.py::test_a_known_signature_traces_nothing_and_reads_this_calls_arrays",)),
    "the PyTorch identity drops an infinite gx's derivative": Mutant(
        "stopgrad_math.torch.identity", "_slope_carrier", _no_slope_carrier,
        (f"{_TORCH}::test_an_infinite_gx_gives_an_infinite_derivative_of_its_sign",)),
    "the PyTorch identity loses the sign of −0.0": Mutant(
        "stopgrad_math.torch.identity", "attach", _adds_plus_zero,
        (f"{_TORCH}::test_the_value_is_fx_bit_for_bit",)),
    "the PyTorch identity takes fx_gx_manually_stopped on trust": Mutant(
        "stopgrad_math.torch.identity_form", "_check_held_apart", _torch_manual_stop_unchecked,
        (f"{_TORCH}::test_a_manually_stopped_fx_or_gx_that_backward_reaches_x_through_is_a_value_error_naming_it",)),
    "the PyTorch identity's fast path simplifies its derivative to c·g": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_derivative", _fast_path_simplified,
        (f"{_FAST}::test_reverse_mode_is_the_identitys_bit_for_bit_over_the_grid[torch.float32]",
         f"{_FAST}::test_forward_mode_is_the_identitys_bit_for_bit_over_the_grid[torch.float32]",
         f"{_FAST}::test_under_transforms_alone_the_identitys_function_is_its_ordinary_ops_bit_for_bit")),
    "the PyTorch identity's fast path differentiates its own formula under create_graph": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_FiniteIdentity", _fast_path_differentiates_its_formula,
        (f"{_FAST}::test_create_graph_differentiates_the_identitys_ops",)),
    "the PyTorch decorator's forward fast path gives J·ẋ alone": Mutant(
        "stopgrad_math.torch.eager_fast_path", "dual_of_map", _dual_of_the_map_alone,
        (f"{_FAST}::test_the_decorators_forward_mode_is_its_ordinary_ops_bit_for_bit_over_the_grid",)),
    "the PyTorch decorator's forward fast path under torch.func.jvp gives J·ẋ alone": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_DualOfMap", _transform_dual_of_the_map_alone,
        (f"{_FAST}::test_under_forward_transforms_the_decorators_fast_path_is_its_ordinary_ops_bit_for_bit",)),
    "the PyTorch identity's Function is taken under nested torch.func transforms": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_alone", _alone_under_any_transforms,
        (f"{_FAST}::test_under_transforms_the_identitys_function_is_taken_only_where_one_derivative_is_taken_alone",)),
    "the PyTorch decorator's forward fast path takes any graph for one applied to tangents": Mutant(
        "stopgrad_math.torch.eager_fast_path", "maps_tangents", _every_graph_maps_tangents,
        (f"{_FAST}::test_maps_tangents_reads_each_ops_row_and_where_it_is_live",)),
    "the PyTorch decorator's reverse fast path takes a sum of products for one": Mutant(
        "stopgrad_math.torch.eager_fast_path", "product_factor", _last_product_for_the_map,
        (f"{_FAST}::test_the_decorators_reverse_mode_is_its_ordinary_ops_bit_for_bit_over_the_grid",)),
    "the PyTorch decorator's reverse fast path drops the guard": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_ProductOfMap", _unguarded_products,
        (f"{_FAST}::test_the_decorators_reverse_fast_path_guards_second_derivatives_as_the_ordinary_ops",)),
    "the PyTorch decorator's reverse fast path simplifies its backward to ȳ·c": Mutant(
        "stopgrad_math.torch.eager_fast_path", "_ProductOfMap", _product_simplified,
        (f"{_FAST}::test_the_decorators_reverse_mode_is_its_ordinary_ops_bit_for_bit_over_the_grid",)),
    "the PyTorch identity's compiled fast path leaves out its slope carrier": Mutant(
        "stopgrad_math.torch.compiled_fast_path", "_CompiledIdentity", _compiled_path_without_carrier,
        (f"{_FAST}::test_compiled_the_function_gives_the_compiled_ordinary_ops_bits_over_the_grid[torch.float32]",)),
    "the PyTorch identity's compiled fast path is taken inside torch.func transforms": Mutant(
        "stopgrad_math.torch.compiled_fast_path", "identity", _compiled_path_in_every_mode,
        (f"{_FAST}::test_compiled_the_function_serves_reverse_mode_alone_and_each_transform_gets_the_ordinary_ops",)),
    "the PyTorch decorator carries its slope wherever compiled": Mutant(
        "stopgrad_math.torch.second_derivative_guard", "forward_mode_possible", _carried_wherever_compiled,
        ("tests/torch/test_decorator_compiled.py::"
         "test_compiled_the_value_and_gradient_are_the_eager_decorators_over_the_grid",)),
    "the PyTorch decorator takes forward mode for impossible": Mutant(
        "stopgrad_math.torch.second_derivative_guard", "forward_mode_possible", _never_carried,
        ("tests/torch/test_non_finite_values.py::test_an_elementwise_rule_reaches_a_non_finite_x",)),
    "the PyTorch identity leaves out its carrier for a non-finite x": Mutant(
        "stopgrad_math.torch.identity", "eagerly_finite", _always_finite,
        (f"{_TORCH}::test_an_infinite_or_nan_element_of_x_keeps_the_value_and_gets_gx",
         f"{_AS_BACKWARD}::test_a_non_finite_value_reaches_the_elements_plain_autodiff_reaches")),
    "the JAX decorator selects on J·v where it is not finite": Mutant(
        "stopgrad_math.jax.identity", "zero_with_derivative_of", _jax_selects_on_j_v,
        ("tests/jax/test_non_finite_values.py::test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_"
         "in_every_mode",)),
    "the JAX identity drops the derivative at a non-finite x": Mutant(
        "stopgrad_math.jax.identity", "zero_with_slope", _jax_no_slope_at_a_non_finite_x,
        ("tests/jax/test_non_finite_values.py::test_an_elementwise_rule_reaches_a_non_finite_x",
         "tests/jax/test_non_finite_values.py::test_the_identity_form_passes_gx_at_a_non_finite_x")),
    "the TensorFlow decorator selects on J·v where it is not finite": Mutant(
        "stopgrad_math.tensorflow.identity", "zero_with_derivative_of", _tf_selects_on_j_v,
        ("tests/tensorflow/test_non_finite_values.py::test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_in_"
         "reverse_mode",)),
    "the TensorFlow identity drops the derivative at a non-finite x": Mutant(
        "stopgrad_math.tensorflow.identity", "zero_with_slope", _tf_no_slope_at_a_non_finite_x,
        ("tests/tensorflow/test_non_finite_values.py::test_an_elementwise_rule_reaches_a_non_finite_x",
         "tests/tensorflow/test_non_finite_values.py::test_the_identity_form_passes_gx_at_a_non_finite_x")),
    "the PyTorch decorator selects on J·v where it is not finite": Mutant(
        "stopgrad_math.torch.identity", "zero_with_derivative_of", _torch_selects_on_j_v,
        ("tests/torch/test_non_finite_values.py::test_the_mixing_matmul_with_a_nan_or_inf_is_autodiff_of_its_formula_"
         "in_reverse_mode",)),
    "the PyTorch identity drops the derivative at a non-finite x": Mutant(
        "stopgrad_math.torch.identity", "zero_with_slope", _torch_no_slope_at_a_non_finite_x,
        ("tests/torch/test_non_finite_values.py::test_an_elementwise_rule_reaches_a_non_finite_x",
         "tests/torch/test_non_finite_values.py::test_the_identity_form_passes_gx_at_a_non_finite_x")),
    "the PyTorch decorator lets order=2 read what f computed without grad mode": Mutant(
        "stopgrad_math.torch.unrecorded", "lost_read", _nothing_unrecorded,
        ("tests/torch/test_decorator_form.py::test_order_2_with_a_forward_without_grad_mode_raises_at_a_second_"
         "derivative_never_a_fraction_of_it",)),
    "the PyTorch proof key leaves out a closed-over tensor's strides": Mutant(
        "stopgrad_math.torch.vjp_closure", "_TENSORS", _key_without_strides,
        ("tests/torch/test_kept_proofs.py::test_a_closed_over_tensor_of_other_strides_makes_a_new_proof",)),
    "the bounded cache forgets which entry was used last": Mutant(
        "stopgrad_math.shared.bounded_cache", "BoundedCache", _most_recent_use_forgotten,
        ("tests/shared/test_bounded_cache.py",)),
    "outside_reads reads another module's globals through f's": Mutant(
        "stopgrad_math.shared.outside_reads", "_roots", _globals_of_any_module,
        ("tests/shared/test_outside_reads.py::test_a_function_of_another_module_is_not_read_through_f_s_globals",
         "tests/torch/test_vjp_as_backward.py::test_under_torch_compile_a_helper_of_another_module_reads_its_own_"
         "global_never_fs")),
    "a deferred call reads a missing upstream as ones": Mutant(
        "stopgrad_math.tensorflow.deferred_calls", "dense_upstreams", _ones_for_a_missing_upstream,
        ("tests/tensorflow/test_tfp_style_grad_fns.py::test_a_none_upstream_of_a_deferred_call_is_zero",)),
    "the JAX compiled embedding names its template function": Mutant(
        "stopgrad_math.jax.decorator_form", "_Named", _template_named_function,
        ("tests/jax/test_compiled_embedding.py::test_a_refusal_raised_inside_a_compiled_embedding_names_f",)),
    "the JAX compiled embedding falls back on a ConcretizationTypeError alone": Mutant(
        "stopgrad_math.jax.decorator_form", "jax", _concretization_alone,
        ("tests/jax/test_compiled_embedding.py::test_a_vjp_calling_np_asarray_and_int_on_its_residuals_is_traced_"
         "at_every_call_and_right_each_time",)),
    "the JAX namespace types every value as invariant inside shard_map": Mutant(
        "stopgrad_math.jax.identity", "varying", _nothing_varies, ("tests/jax/test_distributed.py",)),
    "the PyTorch table takes every vjp for linear": Mutant(
        "stopgrad_math.torch.linear_ops", "judge", _everything_linear,
        ("tests/torch/test_linear_ops.py::test_a_vjp_that_is_not_linear_is_refused_naming_the_op",)),
    "the PyTorch decorator differentiates the VJP as written, no_grad and all": Mutant(
        "stopgrad_math.torch.decorator_form", "_proven", _differentiates_the_vjp_as_written,
        (f"{_AS_BACKWARD}::test_a_vjp_written_as_a_backward_gets_the_derivative_of_the_map_a_backward_applies",)),
    "the PyTorch decorator differentiates the VJP as written under torch.compile": Mutant(
        "stopgrad_math.torch.compiled_proof", "proven_while_compiling", _compiled_as_written,
        (f"{_AS_BACKWARD}::test_under_torch_compile_a_vjp_written_as_a_backward_gets_the_derivative_of_its_map",)),
    "the PyTorch decorator takes a read of the cotangent for the map": Mutant(
        "stopgrad_math.torch.aten_graphs", "unreadable", _readable_cotangents,
        (f"{_AS_BACKWARD}::test_a_read_of_the_cotangents_value_is_refused_eagerly_naming_the_vjp",)),
    "the PyTorch decorator reuses a stale proof": Mutant(
        "stopgrad_math.torch.kept_proofs", "_signature", _stale_proof,
        ("tests/torch/test_kept_proofs.py::test_a_new_closure_value_shape_dtype_or_global_makes_a_new_proof",)),
    "the PyTorch decorator never guards second derivatives under torch.func": Mutant(
        "stopgrad_math.torch.second_derivative_guard", "check", _never_checks,
        ("tests/torch/test_decorator_form.py::test_order_1_second_derivatives_raise_naming_order_2",)),
    "the PyTorch decorator proves nothing under torch.compile": Mutant(
        "stopgrad_math.torch.compiled_proof", "proven_while_compiling", _proves_nothing_while_compiling,
        ("tests/torch/test_decorator_compiled.py::test_a_vjp_that_is_not_linear_is_refused_naming_the_op",)),
    "a PyTorch layer's backward op is linear in the wrong argument": Mutant(
        "stopgrad_math.torch.linear_ops", "RULES", _relu_backward_linear_in_its_input,
        ("tests/torch/test_checkpointing.py::"
         "test_a_recomputed_block_has_the_blocks_gradient_in_reverse_mode[relu-torch.func.vjp-backward]",)),
    "a decorated method's signature lost": Mutant(
        "stopgrad_math.tensorflow.decorator_form", "decorate", _signature_lost,
        ("tests/tensorflow/test_decorator_form.py::"
         "test_a_decorated_keras_layer_call_keeps_its_signature_as_tf_custom_gradient_does",)),
    "a decorated method's instance taken for an argument": Mutant(
        "stopgrad_math.shared.arguments", "called_as_a_method", _never_a_method,
        ("tests/jax/test_decorator_form.py::test_a_decorated_method_binds_its_instance_and_keeps_its_signature",)),
    "the eager PyTorch proof over a float ignores what its trace read of it": Mutant(
        "stopgrad_math.torch.size_conditions", "branched", _never_branched,
        ("tests/torch/test_kept_proofs.py::test_a_vjp_that_reads_its_float_is_proven_per_value_and_refused_where_"
         "that_value_is_not_linear",)),
    "the compiled PyTorch proof for any size holds at every size": Mutant(
        "stopgrad_math.torch.size_conditions", "holds", _holds_everywhere,
        ("tests/torch/test_decorator_compiled.py::"
         "test_a_vjp_that_is_linear_at_some_sizes_alone_is_refused_at_the_others_when_compiled",)),
    "the compiled PyTorch decorator reads a weight from outside f once": Mutant(
        "stopgrad_math.shared.outside_reads", "reader", _outside_tensors_read_once,
        ("tests/torch/test_vjp_as_backward.py::test_under_torch_compile_a_vjp_written_as_a_backward_reading_an_"
         "outside_tensor_is_exact[with torch.no_grad()-compile(fullgraph) backward]",)),
    "the TensorFlow decorator's reverse-only route gives forward mode zeros": Mutant(
        "stopgrad_math.tensorflow.decorator_form", "_refusing_forward_mode", _forward_mode_zeros,
        ("tests/tensorflow/test_checkpointing.py::test_a_gradient_op_tensorflow_cannot_differentiate_gives_tf_custom_gradients_"
         "reverse_mode[softsign-eager]",)),
    "TensorFlow's order 1 transposes a grad_fn that gives variables' gradients eagerly": Mutant(
        "stopgrad_math.tensorflow.decorator_form", "_recorded_terms", _variables_transposed_at_order_1,
        ("tests/tensorflow/test_decorator_form.py::"
         "test_an_inf_upstream_reaches_a_variables_gradient_as_tf_custom_gradients_does",)),
    "TensorFlow's order-1 recorded backward for variables gives forward mode zeros": Mutant(
        "stopgrad_math.tensorflow.decorator_form", "_transposed_forward_mode", _variables_forward_mode_zeros,
        ("tests/tensorflow/test_decorator_form.py::"
         "test_a_variables_gradient_at_order_1_keeps_forward_mode_and_refuses_a_second_derivative",)),
    "the PyTorch decorator's reverse-only carrier gives forward mode zeros": Mutant(
        "stopgrad_math.torch.zero_terms", "_Maps", _reverse_only_forward_zeros,
        ("tests/torch/test_checkpointing.py::test_a_backward_op_pytorch_cannot_differentiate_gives_reverse_mode_and_"
         "refuses_forward_mode_naming_it[hardsigmoid-torch.autograd.grad]",)),
    "the compiled PyTorch decorator follows no module's own parameters": Mutant(
        "stopgrad_math.torch.compiled_proof", "_module_members", _no_members,
        ("tests/torch/test_checkpointing.py::test_a_recomputed_block_is_exact_compiled_in_both_modes["
         "linear-torch.autograd.grad]",)),
    "the JAX decorator embeds a call that nothing can differentiate": Mutant(
        "stopgrad_math.jax.decorator_form", "differentiating", _always_differentiating,
        ("tests/jax/test_compiled_embedding.py::test_a_plain_eager_call_runs_f_once_and_traces_no_vjp",
         "tests/jax/test_custom_vjp_face.py::test_a_plain_eager_call_runs_fun_alone_as_jax_custom_vjp_does")),
    "the JAX compiled embedding keeps what f closes over alive": Mutant(
        "stopgrad_math.jax.decorator_form", "_Call", _embedding_keeps_f,
        ("tests/jax/test_compiled_embedding.py::test_a_compiled_embedding_keeps_no_array_f_or_its_vjp_closes_over",)),
    "the Keras namespace calls every grad with its upstream positionally": Mutant(
        "stopgrad_math.keras.identity_form", "in_keras_conventions", _upstream_never_by_keyword,
        ("tests/keras/test_backends.py::test_the_keras_namespace_on_each_backend[jax-keras_cases.py]",)),
    "a replica context takes grad_fn(1) for J": Mutant(
        "stopgrad_math.tensorflow.transposition", "replicated", _never_replicated,
        (f"{_INSIDE_TFP}::test_tfps_collective_cases_on_two_replicas_are_exact_as_tfps[eager]",)),
    "an eager replica context trusts an untraceable grad_fn's transpose": Mutant(
        "stopgrad_math.tensorflow.numerical_linearity", "_transpose_of_transpose_test", _passes_everything,
        ("tests/tensorflow/test_proven_transpose.py::"
         "test_a_collective_in_grad_fn_with_a_stop_on_its_upstream_is_refused_in_an_eager_replica_context",)),
    "a deferred call inside a grad_fn is differentiated by f's own ops": Mutant(
        "stopgrad_math.tensorflow.deferred_calls", "deferred", _differentiated_by_its_own_ops,
        (f"{_INSIDE_TFP}::test_tfps_collective_cases_on_two_replicas_are_exact_as_tfps[function]",)),
}

ENVIRONMENT = "STOPGRAD_MUTANT"


def apply(name: str) -> None:
    """Replaces the function with the named mutant (conftest.py calls this before any test module imports)."""
    mutant = MUTANTS[name]
    module = importlib.import_module(mutant.module)
    setattr(module, mutant.name, mutant.broken(getattr(module, mutant.name)))


def apply_the_one_named() -> None:
    """The mutant ``STOPGRAD_MUTANT`` names, where it names one: conftest.py applies it in each test process, and a
    script a test runs in a process of its own applies it there too (tfp_distributed_cases.py)."""
    if os.environ.get(ENVIRONMENT):
        apply(os.environ[ENVIRONMENT])


# What every mutant's run imports, imported once in the runner before it forks a child per mutant: most of a
# run's time was these imports. Not TensorFlow, whose runtime starts threads that a fork does not copy; nothing
# here starts a thread or a framework's runtime (JAX's backend starts at its first array). Inductor compiles in
# the child that asks, as conftest.py sets before PyTorch is imported.
_IMPORTED_BEFORE_FORKING = ("pytest", "hypothesis", "numpy", "torch", "jax", "stopgrad_math.torch",
                            "stopgrad_math.jax")
TIMEOUT_SECONDS = 900  # a child past this is killed, with its own subprocesses, and the run fails


def _run_in_child(name: str, log_path: str) -> None:
    """The forked child: the mutant's tests, as ``pytest -q -x`` would run them, its output to ``log_path``."""
    os.setpgid(0, 0)  # a process group of its own, so that a timeout kills its subprocesses too
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ[ENVIRONMENT] = name
    code = 3
    try:
        import pytest

        # hypothesis was imported before pytest could rewrite its asserts (it has none that matter here)
        code = int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                *MUTANTS[name].caught_by]))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no atexit handlers: the parent's, copied by the fork, are not the child's to run


def _start(name: str, log_path: str) -> int:
    """Forks the child that runs the mutant's tests; its pid."""
    pid = os.fork()
    if pid == 0:
        _run_in_child(name, log_path)
    with contextlib.suppress(OSError):  # the child may have set its own group first, or run and ended
        os.setpgid(pid, pid)
    return pid


def _kill_overdue(running: dict[int, tuple[str, str, float]]) -> None:
    """Kills each child (its process group: the subprocesses its tests started too) past TIMEOUT_SECONDS."""
    for pid, (_, _, start) in running.items():
        if time.perf_counter() - start > TIMEOUT_SECONDS:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile; waitpid collects it next
                os.killpg(pid, signal.SIGKILL)


def _outcome(name: str, exit_code: int, seconds: float, log_path: str) -> str:
    """Prints how the mutant's run ended: caught (its tests failed), SURVIVED (they passed), or BROKEN (neither:
    an error, no tests found, killed), with the run's log."""
    outcome = {0: "SURVIVED", 1: "caught"}.get(exit_code, f"BROKEN ({exit_code})")
    print(f"{outcome:>8}  {seconds:5.0f} s  {name}  ({', '.join(MUTANTS[name].caught_by)})", flush=True)
    if outcome.startswith("BROKEN"):
        with open(log_path) as log:
            print(log.read()[-3000:], flush=True)
    return outcome


def main(names: list[str]) -> int:
    """Runs the mutants one per core at a time, each in a child forked from this process once it has imported
    what the runs share; fails unless every run is caught."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    for module in _IMPORTED_BEFORE_FORKING:
        importlib.import_module(module)
    pending, running, outcomes = list(names or MUTANTS), {}, []
    with tempfile.TemporaryDirectory() as logs:
        while pending or running:
            while pending and len(running) < (os.cpu_count() or 1):
                name, log_path = pending.pop(0), os.path.join(logs, f"{len(pending)}.log")
                running[_start(name, log_path)] = (name, log_path, time.perf_counter())
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                _kill_overdue(running)
                time.sleep(0.2)
                continue
            name, log_path, start = running.pop(pid)
            outcomes.append(_outcome(name, os.waitstatus_to_exitcode(status), time.perf_counter() - start, log_path))
    return 0 if all(outcome == "caught" for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
