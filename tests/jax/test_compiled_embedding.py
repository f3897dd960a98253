"""The JAX decorator's compiled embeddings: one per signature (``vjp_closure``'s key, the shapes), the VJP's arrays
passed in. A known signature traces nothing; whatever changes the VJP's jaxpr makes a new one; what a key cannot
capture is traced at every call, as before."""

import gc
import math
import sys
import types
import weakref
from typing import ClassVar

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import rebound_helpers  # noqa: E402

import stopgrad_math.jax as sgm  # noqa: E402
from stopgrad_math.jax import decorator_form, vjp_closure  # noqa: E402
from stopgrad_math.shared import bounded_cache  # noqa: E402

X1, X2 = jnp.array([0.5, 1.0, 2.0]), jnp.array([-1.0, 0.25, 3.0])
SCALE = 2.0
CONSTANTS = types.ModuleType("constants")
CONSTANTS.scale = 2.0
WEIGHTS = jnp.array([1.0, 2.0, 3.0])


@pytest.fixture
def traces(monkeypatch):
    """A fresh cache, and the count of VJP traces (each a trace, proof and transpose)."""
    monkeypatch.setattr(decorator_form, "_EMBEDDINGS", bounded_cache.BoundedCache(decorator_form.EMBEDDINGS_KEPT))
    count = []
    original = decorator_form._traced
    monkeypatch.setattr(decorator_form, "_traced", lambda *a: count.append(1) or original(*a))
    return count


def _gradient(f, *args):
    return jax.grad(lambda *a: jnp.sum(f(*a)), argnums=tuple(range(len(args))))(*args)


@sgm.custom_gradient
def _scaled_sin(x, a):
    return a * jnp.sin(x), lambda ct: (ct * a * jnp.cos(x), jnp.sum(ct * jnp.sin(x)))


def test_a_global_of_a_helper_read_through_its_module_is_read_as_it_is_at_each_call(monkeypatch):
    """A VJP calling ``rebound_helpers.scale``, whose global is rebound between calls: each gradient is the one
    the rule gives with the global's value at that call (a compiled embedding keyed by the helper's identity
    alone kept the first)."""
    decorated = sgm.custom_gradient(lambda x: (x * 1.0, lambda ct: (rebound_helpers.scale(ct),)))
    x = jnp.array([1.0, -2.0])
    for factor in (2.0, 5.0, 2.0):
        monkeypatch.setattr(rebound_helpers, "FACTOR", factor)
        np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(decorated(x)))(x), [factor, factor])
        np.testing.assert_array_equal(jax.jvp(decorated, (x,), (jnp.ones(2),))[1], [factor, factor])


def test_a_known_signature_traces_nothing_and_reads_this_calls_arrays(traces):
    for x, a in [(X1, jnp.array(2.0)), (X2, jnp.array(-3.0)), (X1, jnp.array(0.5))]:
        dx, da = _gradient(_scaled_sin, x, a)
        np.testing.assert_allclose(dx, a * np.cos(x), rtol=1e-6)
        np.testing.assert_allclose(da, np.sum(np.sin(x)), rtol=1e-6)
        tangent = jax.jvp(_scaled_sin, (x, a), (jnp.ones(3), jnp.zeros(())))[1]
        np.testing.assert_allclose(tangent, a * np.cos(x), rtol=1e-6)
    assert len(traces) == 1  # the jvp's signature is the same call's: no trace of its own


@pytest.mark.parametrize("order", [1, 2])
def test_a_plain_eager_call_runs_f_once_and_traces_no_vjp(traces, order):
    """Issue 75: eagerly, on concrete arrays, no derivative of the call can be asked (a JAX transform makes what it
    differentiates a tracer): at both orders f runs once and its VJP is never traced or called, and the value is
    f's own, bit for bit."""
    calls = []

    def f(x, a):
        calls.append(1)

        def vjp(ct):
            raise AssertionError("a plain call traced the vjp")
        return a * jnp.sin(x), vjp

    y = sgm.custom_gradient(f, order=order)(X1, jnp.array(2.0))
    np.testing.assert_array_equal(y, jnp.array(2.0) * jnp.sin(X1))
    assert len(calls) == 1 and traces == []


def _closing_over(scale):
    @sgm.custom_gradient
    def f(x):
        return scale * jnp.sin(x), lambda ct: scale * ct * jnp.cos(x)
    return f


@sgm.custom_gradient
def _reads_globals(x):
    return jnp.sin(x), lambda ct: SCALE * CONSTANTS.scale * ct * jnp.cos(x) * WEIGHTS


def test_a_new_closed_over_int_a_new_shape_and_a_changed_global_each_make_a_new_compilation(traces, monkeypatch):
    for scale in (2, 3, 2):
        np.testing.assert_allclose(_gradient(_closing_over(scale), X1)[0], scale * np.cos(X1), rtol=1e-6)
    assert len(traces) == 2  # 2 again is the first one's
    f = _closing_over(2)
    np.testing.assert_allclose(_gradient(f, jnp.ones(4))[0], 2 * np.cos(np.ones(4)), rtol=1e-6)
    assert len(traces) == 3
    product = SCALE * CONSTANTS.scale * np.asarray(WEIGHTS)
    np.testing.assert_allclose(_gradient(_reads_globals, X1)[0], product * np.cos(X1), rtol=1e-6)
    for name, owner, value in [("SCALE", None, 5.0), ("scale", CONSTANTS, -1.0), ("WEIGHTS", None, jnp.ones(3))]:
        monkeypatch.setattr(owner or sys.modules[__name__], name, value)
        product = SCALE * CONSTANTS.scale * np.asarray(WEIGHTS)
        np.testing.assert_allclose(_gradient(_reads_globals, X1)[0], product * np.cos(X1), rtol=1e-6, err_msg=name)
    assert len(traces) == 3 + 4


def test_what_a_key_cannot_capture_is_traced_at_every_call(traces):
    seen = []

    @sgm.custom_gradient
    def appends(x):  # its closure holds a list the vjp changes: a key cannot capture it
        def vjp(ct):
            seen.append(ct.shape)
            return 2 * ct
        return 2 * x, vjp

    @sgm.custom_gradient
    def assigns(x):  # its vjp assigns to its closure
        count = 0

        def vjp(ct):
            nonlocal count
            count += 1
            return 3 * ct
        return 3 * x, vjp

    for _ in range(2):
        np.testing.assert_array_equal(_gradient(appends, X1)[0], np.full(3, 2.0))
        np.testing.assert_array_equal(_gradient(assigns, X1)[0], np.full(3, 3.0))
    assert len(seen) == 2 and len(traces) == 4


@sgm.custom_gradient
def _branches(x):  # reads its residual's value in Python, as jax.custom_vjp's bwd may outside jit
    return 2 * x, lambda ct: (2 * ct) if float(x) > 0 else (3 * ct)


def test_a_vjp_that_branches_on_a_concrete_residual_is_traced_at_every_call_and_right_each_time(traces):
    for x, slope in [(1.0, 2.0), (-1.0, 3.0), (2.0, 2.0), (-2.0, 3.0)]:
        assert float(jax.grad(_branches)(jnp.float32(x))) == slope


def test_the_key_holds_shapes_and_ints_and_the_arrays_and_floats_go_in_as_arguments():
    def make(a, scale):
        return lambda ct: scale * a * ct

    first, second = vjp_closure.opened(make(X1, 2)), vjp_closure.opened(make(X2, 2))
    assert first.key == second.key and first.arrays[0] is X1 and second.arrays[0] is X2
    assert vjp_closure.opened(make(X1, 3)).key != first.key
    assert vjp_closure.opened(make(jnp.ones(4), 2)).key != first.key
    assert vjp_closure.opened(make(np.float64(1.0), 2)).key != vjp_closure.opened(make(np.float32(1.0), 2)).key
    np.testing.assert_array_equal(first.rebuild([X2])(1.0), 2.0 * X2)
    by_float = vjp_closure.opened(make(X1, 2.0))
    assert by_float.key == vjp_closure.opened(make(X1, 3.5)).key != vjp_closure.opened(make(X1, 2.0j)).key
    number = next(k for k, v in enumerate(by_float.arrays) if type(v) is float)
    assert by_float.arrays[number] == 2.0 and by_float.arrays[1 - number] is X1
    replaced = [5.0, X2] if number == 0 else [X2, 5.0]
    np.testing.assert_array_equal(by_float.rebuild(replaced)(1.0), 5.0 * X2)
    for refused in ([1.0], {"a": 1.0}, object()):
        assert vjp_closure.opened(make(refused, 2.0)) is None, refused
    assert vjp_closure.opened(lambda ct: ct * np.ones(3)) is not None  # a module attribute, by identity


class _Settings:
    scale = 2.0
    table: ClassVar[dict[str, float]] = {"scale": 2.0}


def test_a_class_attribute_is_in_the_key_and_a_mutable_one_is_refused():
    """A class attribute the VJP reads can be reassigned as a module's can: by identity alone, the kept embedding
    would keep the old value."""
    vjp = lambda ct: ct * _Settings.scale  # noqa: E731
    before = vjp_closure.opened(vjp).key
    try:
        _Settings.scale = 3.0
        assert vjp_closure.opened(vjp).key != before
    finally:
        _Settings.scale = 2.0
    assert vjp_closure.opened(lambda ct: ct * _Settings.table["scale"]) is None


def test_twenty_closed_over_floats_compile_once_and_each_gradient_is_its_own(traces):
    """A learning rate, a temperature or an annealed scale closed over by the VJP is an operand of one compiled
    embedding: 20 calls with 20 values trace the VJP once, as 20 calls with one value do."""
    for k in range(20):
        scale = 0.5 + k
        np.testing.assert_allclose(_gradient(_closing_over(scale), X1)[0], scale * np.cos(X1), rtol=1e-6)
    assert len(traces) == 1


def test_a_python_float_argument_differentiated_eagerly_and_closed_over_compiles_once(traces):
    """A Python float given to an eager grad is stopped into JAX's typed literal (a float subclass with a dtype,
    JAX 0.9 on), which the VJP closes over as it closes over its arguments: an operand, as a float is (it was
    refused, and the VJP traced at every call); each call's gradient is its own."""
    for k in range(5):
        scale = 1.0 + k
        np.testing.assert_allclose(jax.grad(lambda a: jnp.sum(_scaled_sin(X1, a)))(scale), np.sum(np.sin(X1)),
                                   rtol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x, a=scale: jnp.sum(_scaled_sin(x, a)))(X1),
                                   scale * np.cos(X1), rtol=1e-6)
    assert len(traces) == 2  # one signature per argument differentiated


def test_a_vjp_that_needs_a_closed_over_float_as_a_python_number_is_traced_at_every_call(traces):
    """A branch on the number, float() or a NumPy scalar of it cannot take an operand: that signature is traced
    at every call, and each call is right."""
    def make(scale):
        @sgm.custom_gradient
        def f(x):
            def vjp(ct):
                if scale > 1.0:  # a branch on the number
                    return ct * np.float32(scale) * jnp.cos(x)
                return ct * math.sqrt(scale) * jnp.cos(x)
            return scale * jnp.sin(x), vjp
        return f

    for scale in (0.25, 2.0, 0.25, 4.0):
        slope = scale if scale > 1.0 else math.sqrt(scale)
        np.testing.assert_allclose(_gradient(make(scale), X1)[0], slope * np.cos(X1), rtol=1e-6)
    assert len(traces) == 1 + 4  # the first, found to need a number, then each call traced


def test_a_compiled_embedding_keeps_no_array_f_or_its_vjp_closes_over(traces):
    """Weak references to 20 closed-over arrays, each of its own shape (its own embedding), die with their calls:
    the cache keeps shapes, and f's name alone."""
    alive = []
    for n in range(1, 21):
        weight = jnp.full((n,), float(n))

        @sgm.custom_gradient
        def f(x, weight=weight):
            return x * weight, lambda ct: ct * weight

        np.testing.assert_array_equal(_gradient(f, jnp.ones(n))[0], np.full(n, float(n)))
        alive.append(weakref.ref(weight))
        del weight, f
    gc.collect()
    assert len(traces) == 20 and sum(r() is not None for r in alive) == 0


@sgm.custom_gradient
def _squared_rule(x):  # a VJP that is not linear: refused, naming f, from inside the compiled embedding
    return x * 1.0, lambda ct: ct * ct


def test_a_refusal_raised_inside_a_compiled_embedding_names_f(traces):
    """The compiled embedding is built from a template that keeps f's name alone (issue 59: named "function", its
    messages would name no function of the user's); eagerly, twice."""
    for _ in range(2):
        with pytest.raises(ValueError, match="_squared_rule"):
            jax.grad(lambda x: jnp.sum(_squared_rule(x)))(X1)


@sgm.custom_gradient
def _reads_residuals_as_numpy(x, n):
    scale = jnp.cos(x)
    return jnp.sin(x) * n, lambda ct: (ct * np.asarray(scale) * int(n), None)  # as a custom_vjp bwd may, eagerly


def test_a_vjp_calling_np_asarray_and_int_on_its_residuals_is_traced_at_every_call_and_right_each_time(traces):
    """np.asarray of a tracer (TracerArrayConversionError) and int() of one (TracerIntegerConversionError) are
    JAXTypeErrors other than a ConcretizationTypeError: the compiled embedding falls back to a trace at every call
    for each (issue 59: catching the one class alone, they escaped), and the gradient is autodiff's, twice."""
    n = jnp.asarray(3)
    for x in (X1, X2):
        for _ in range(2):
            got = jax.grad(lambda x: jnp.sum(_reads_residuals_as_numpy(x, n)))(x)
            np.testing.assert_allclose(got, jax.grad(lambda x: jnp.sum(jnp.sin(x) * 3))(x), rtol=1e-6)
    assert len(traces) >= 4  # traced at every call, never kept compiled


def _norm(x):
    return jnp.sqrt(jnp.sum(x * x))


def _norm_fwd(x):
    n = _norm(x)
    return n, (x, n)


def _norm_bwd(residuals, g):
    x, n = residuals
    return (g * x / n,)


def test_a_custom_vjp_is_proven_once_per_signature_eagerly(traces):
    """Issue 75: ``stopgrad_math.jax.custom_vjp``'s VJP (bwd over the residuals) is keyed as the decorator's is, so
    eager value and gradient of a known signature traces nothing (it was traced, proven and transposed at every
    call, 10 times jax.custom_vjp's cost here), each call's gradient its own (x / |x|)."""
    norm = sgm.custom_vjp(_norm)
    norm.defvjp(_norm_fwd, _norm_bwd)
    for x in (X1, X2, 3 * X1):
        value, gradient = jax.value_and_grad(norm)(x)
        np.testing.assert_allclose(gradient, x / np.linalg.norm(x), rtol=1e-6)
        np.testing.assert_allclose(value, np.linalg.norm(x), rtol=1e-6)
    assert len(traces) == 1
