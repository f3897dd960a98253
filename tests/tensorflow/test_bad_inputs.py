"""The bad-input sweep: every public function, called with the inputs users pass, is right or says why.

Hypothesis draws calls from a grammar of values: every dtype, Python numbers
and strings, lists, NumPy arrays and scalars, None, nested structures, ragged
and sparse tensors, scalars, empty and broadcasting shapes. Each call, in
eager and in tf.function (where tensor arguments arrive with unknown rank),
must do exactly one of two things:

* return what a NumPy reference written from the function's definition says:
  the value, and the gradient of every floating tensor argument; or
* raise TypeError, ValueError or (where a shape is only known at run time)
  InvalidArgumentError with a message that names an argument or the function.

A raw kernel error, any other exception, a wrong value or gradient, or a
result where the reference says the input is invalid fails the test.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import bits
from hypothesis import given, settings
from hypothesis import strategies as st

import stopgrad_math as sgm


class Invalid(Exception):
    """The reference says the call must raise; ``Invalid("shapes")`` where the shapes are what is wrong, and the
    error must then show them."""


# ---------------------------------------------------------------- the grammar of values

FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
SHAPES = ((), (0,), (3,), (2, 3), (1, 3), (2, 1, 3))


# Beside halves (exact in every float): −0.0, magnitudes near float16's largest, float16 subnormals, non-finite.
AWKWARD = np.array([-0.0, 6e4, -6e4, 3e-5, -3e-5, np.inf, -np.inf, np.nan])


def _numbers(shape, seed):
    rng = np.random.default_rng(seed)
    halves = rng.integers(-4, 5, size=shape) / 2
    awkward = rng.choice(AWKWARD, size=shape)
    return np.where(rng.random(size=shape) < 0.3, awkward, halves).astype(np.float64)


@st.composite
def tensors(draw, dtypes=(*FLOATS, tf.int32, tf.int64, tf.bool, tf.complex64, tf.complex128, tf.string)):
    dtype, shape, seed = draw(st.sampled_from(dtypes)), draw(st.sampled_from(SHAPES)), draw(st.integers(0, 99))
    values = _numbers(shape, seed)
    if dtype == tf.string:
        return tf.constant(values.astype(str))
    if dtype == tf.bool:
        return tf.constant(values > 0)
    return tf.cast(tf.constant(values), dtype)


python_values = st.sampled_from([1.5, -2.0, 3, True, 2 + 1j, "text", None])
lists = st.sampled_from([[1.0, -0.5, 2.0], [1, 2, 3], [], [[1.0], [1.0, 2.0]], [0.5]])
numpy_values = st.sampled_from(
    [np.array([1.0, 2.0, -1.0], np.float32), np.array([0.5, 1.0, 2.0]), np.array([1, 2, 3]), np.float32(1.5),
     np.float64(-0.5), np.int64(2)]
)  # fmt: skip
composites = st.sampled_from(
    [tf.ragged.constant([[1.0, 2.0], [3.0]]), tf.sparse.from_dense(tf.constant([[1.0, 0.0], [0.0, 2.0]]))]
)
leaves = st.one_of(tensors(), tensors(dtypes=FLOATS), python_values, lists, numpy_values, composites)
structures = st.one_of(leaves, st.dictionaries(st.sampled_from("ab"), leaves, min_size=1), st.tuples(leaves, leaves))


# ---------------------------------------------------------------- well-formed calls, in every kind of value


BROADCASTS = {(): [()], (0,): [(), (0,), (1,)], (3,): [(), (3,), (1,)], (2, 3): [(), (3,), (1, 3), (2, 3), (2, 1)],
              (1, 3): [(), (3,), (1, 3)], (2, 1, 3): [(), (3,), (1, 3), (2, 1, 1), (2, 1, 3)]}  # fmt: skip


@st.composite
def in_some_kind(draw, values: np.ndarray, floats=FLOATS):
    """The same numbers as a tensor of any float dtype, a NumPy array or scalar, a Python list or number."""
    kind = draw(st.sampled_from(["tensor", "variable", "numpy", "python"]))
    if kind in ("tensor", "variable"):
        tensor = tf.cast(tf.constant(values), draw(st.sampled_from(floats)))
        return tensor if kind == "tensor" else tf.Variable(tensor)
    if kind == "numpy":
        return values.astype(draw(st.sampled_from([np.float32, np.float64])))
    return values.tolist()


@st.composite
def floating_tensors(draw, shape=None):
    shape = draw(st.sampled_from(SHAPES)) if shape is None else shape
    return tf.cast(tf.constant(_numbers(shape, draw(st.integers(0, 99)))), draw(st.sampled_from(FLOATS)))


@st.composite
def tensor_and_broadcasting(draw, kinds=True):
    """A floating tensor and numbers of a shape that broadcasts to it, in some kind."""
    x = draw(floating_tensors())
    values = _numbers(draw(st.sampled_from(BROADCASTS[tuple(x.shape)])), draw(st.integers(0, 99)))
    return x, draw(in_some_kind(values)) if kinds else values


@st.composite
def layout_triples(draw):
    """fx, gx and x shaped for a layout of the identity form, each in some kind."""
    fx_shape, x_shape = draw(st.sampled_from(SHAPES)), draw(st.sampled_from(SHAPES))
    gx_shape = draw(st.sampled_from([fx_shape + x_shape, x_shape, ()] + BROADCASTS[x_shape]))
    fx = draw(floating_tensors(fx_shape))
    return fx, draw(in_some_kind(_numbers(gx_shape, 5))), draw(floating_tensors(x_shape))


def structure_of(leaf_strategy):
    return st.one_of(leaf_strategy, st.fixed_dictionaries({"a": leaf_strategy, "b": st.none()}),
                     st.tuples(leaf_strategy, leaf_strategy))  # fmt: skip


WELL_FORMED = {
    "zero_with_gradient": st.tuples(st.one_of(floating_tensors(), lists, numpy_values)),
    "magic_box": st.tuples(st.one_of(floating_tensors(), lists, numpy_values)),
    "straight_through": tensor_and_broadcasting().map(lambda pair: (pair[0], pair[1])),
    "scale_gradient": st.tuples(structure_of(floating_tensors(())), st.sampled_from([0.5, 2, -3, np.float32(0.25)])),
    "reverse_gradient": st.tuples(structure_of(floating_tensors(())), st.sampled_from([0.5, 2, -3, np.float32(0.25)])),
    "stop_gradient_where": tensor_and_broadcasting(kinds=False).map(lambda pair: (pair[0], (pair[1] > 0).tolist())),
    "custom_gradient": layout_triples(),
}


# ---------------------------------------------------------------- references, from the definitions


class _Skip(Exception):
    """The reference does not judge this input; its rule is tested elsewhere."""


def converted(value, hint=None):
    """value as the library converts it: the hint for Python values only; Invalid where it cannot."""
    if isinstance(value, tf.Tensor):
        return value
    try:
        return tf.convert_to_tensor(value, dtype_hint=None if isinstance(value, (np.ndarray, np.generic)) else hint)
    except (TypeError, ValueError):
        raise Invalid from None


def floating(value, hint=None, complex_too=False):
    tensor = converted(value, hint)
    if not (tensor.dtype in FLOATS or (complex_too and tensor.dtype.is_complex)):
        raise Invalid
    return tensor


def broadcasts_exactly(shape, target) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


def unbroadcast(a, shape):
    a = a.sum(axis=tuple(range(a.ndim - len(shape))))
    return a.sum(axis=tuple(i for i, d in enumerate(shape) if d == 1), keepdims=True).reshape(shape)


def upstream_for(shape) -> np.ndarray:
    """The upstream gradient the harness uses for an output of this shape."""
    return (np.arange(int(np.prod(shape))) % 3 + 1).reshape(shape).astype(np.float64)


def numbers(tensor) -> np.ndarray:
    return np.asarray(tf.cast(tensor, tf.complex128 if tensor.dtype.is_complex else tf.float64))


def ref_zero_with_gradient(x):
    t = floating(x, complex_too=True)
    return np.zeros(t.shape), {0: [upstream_for(t.shape)]}


def ref_magic_box(tau):
    t = floating(tau)
    return np.ones(t.shape), {0: [upstream_for(t.shape)]}


def ref_straight_through(forward, backward):
    if not _same_structure(forward, backward):
        raise Invalid
    values, grads = [], []
    for f_leaf, b_leaf in zip(tf.nest.flatten(forward), tf.nest.flatten(backward), strict=True):
        f = floating(f_leaf)
        b = floating(b_leaf, hint=f.dtype)
        if not broadcasts_exactly(b.shape, f.shape):
            raise Invalid("shapes")
        values.append(numbers(f))
        grads.append(unbroadcast(upstream_for(f.shape), tuple(b.shape)))
    return tf.nest.pack_sequence_as(forward, values), {1: grads}


def _negated(scale):
    """reverse_gradient's scale and sign as the library takes them: a tensor checked numeric first, whatever x holds
    (it is negated before x is read), a number negated."""
    if tf.is_tensor(scale):
        if not isinstance(scale, tf.Tensor) or scale.dtype == tf.bool or not (
                scale.dtype in FLOATS or scale.dtype.is_integer):
            raise Invalid
        return scale, -1.0
    try:
        return np.negative(scale), 1.0
    except (TypeError, ValueError):
        raise Invalid from None


def ref_scale_gradient(x, scale, sign=1.0):
    if sign < 0:
        scale, sign = _negated(scale)
    values, grads = [], []
    for leaf in tf.nest.flatten(x):
        if leaf is None:
            values.append(None)
            grads.append(None)
            continue
        t = floating(leaf)
        s = converted(scale, hint=t.dtype)
        numeric = s.dtype in FLOATS or (s.dtype.is_integer and s.dtype != tf.bool)
        if not numeric:
            raise Invalid
        if not broadcasts_exactly(s.shape, t.shape):
            raise Invalid("shapes")
        values.append(numbers(t))
        grads.append(sign * upstream_for(t.shape) * numbers(s))
    return tf.nest.pack_sequence_as(x, values) if tf.nest.is_nested(x) else values[0], {0: grads}


def ref_stop_gradient_where(x, mask):
    t = converted(x)
    m = converted(mask, hint=tf.bool)
    if m.dtype != tf.bool:
        raise Invalid
    if not broadcasts_exactly(m.shape, t.shape):
        raise Invalid("shapes")
    value = np.asarray(t) if t.dtype == tf.string else numbers(t)
    if t.dtype not in FLOATS:  # a select of anything else: the value alone
        return value, {}
    return value, {0: [upstream_for(t.shape) * ~np.broadcast_to(np.asarray(m), t.shape)]}  # a select: no x − stop(x)


def ref_custom_gradient(fx, gx, x):
    if x is None or gx is None:  # the misuse rule: neither form; but with fx None too, custom_gradient() is the
        # decorator with its options, which returns a decorator as tf.custom_gradient(f=None) does (test_decorator_form)
        raise _Skip if fx is None and gx is None and x is None else Invalid
    if tf.nest.is_nested(x):
        raise _Skip  # structures of x: tested in test_identity_form
    f = floating(fx, complex_too=True)
    t = floating(x, complex_too=True)
    g = floating(gx, hint=f.dtype, complex_too=True)
    if (t.dtype.is_complex or g.dtype.is_complex) and not f.dtype.is_complex:
        raise Invalid
    if f.dtype.is_complex or t.dtype.is_complex:
        raise _Skip  # complex: tested against TF's autodiff in test_identity_form
    fs, xs, gs = tuple(f.shape), tuple(t.shape), tuple(g.shape)
    g = tf.cast(g, f.dtype) if f.dtype.size < g.dtype.size else g  # the zero term is built in fx's dtype
    gn, w, size = numbers(g), upstream_for(fs), int(np.prod(fs))
    if gs == fs + xs:
        grad = (w.reshape(-1) @ gn.reshape(size, int(np.prod(xs)))).reshape(xs)
    elif broadcast(gs, xs) == fs:
        grad = unbroadcast(w * np.broadcast_to(gn, fs), xs)
    elif broadcasts_exactly(gs, xs):  # one element: the gradient; else tfp's rule, the gradient of the sum
        grad = w.sum() / (1 if size == 1 else max(size, 1)) * np.broadcast_to(gn, xs) if size else np.zeros(xs)
    else:
        raise Invalid("shapes")
    largest = min(float(f.dtype.max), float(t.dtype.max))  # built in fx's dtype, given in x's: beyond, ±inf
    grad = np.where(np.abs(grad) > largest, np.sign(grad) * np.inf, grad)
    return numbers(f), {2: [grad]}  # at every element of x, inf and NaN too


def _same_structure(a, b) -> bool:
    try:
        tf.nest.assert_same_structure(a, b)
        return True
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------- the calls


CALLS = {  # name: (the function, the arguments' strategies, the reference)
    "zero_with_gradient": (sgm.zero_with_gradient, [leaves], ref_zero_with_gradient),
    "magic_box": (sgm.magic_box, [leaves], ref_magic_box),
    "straight_through": (sgm.straight_through, [structures, leaves], ref_straight_through),
    "scale_gradient": (sgm.scale_gradient, [structures, leaves], ref_scale_gradient),
    "reverse_gradient": (sgm.reverse_gradient, [structures, leaves], lambda x, s: ref_scale_gradient(x, s, -1.0)),
    "stop_gradient_where": (sgm.stop_gradient_where, [leaves, leaves], ref_stop_gradient_where),
    "custom_gradient": (sgm.custom_gradient, [leaves, leaves, leaves], ref_custom_gradient),
}
STRUCTURED = {("straight_through", 0), ("straight_through", 1), ("scale_gradient", 0), ("reverse_gradient", 0)}
# `name` is no argument's word: every eager kernel error ends in "name: ".
WORDS = {name: set(inspect.signature(fn).parameters) - {"name"} | {name} for name, (fn, _, _) in CALLS.items()}
WORDS["reverse_gradient"] |= {"scale_gradient"}  # it is scale_gradient with the scale negated
WORDS["custom_gradient"] |= {"gradient for x"}


def _top_level_tensors(args):
    return [i for i, a in enumerate(args) if isinstance(a, tf.Tensor)]


def _run(fn, args, differentiate, mode):
    """fn(*args), and the gradients of ⟨upstream, output⟩ w.r.t. the tensor leaves of the arguments asked for."""

    def value_and_grads(*tensors):
        call_args = list(args)
        for i, t in zip(_top_level_tensors(args), tensors, strict=True):
            call_args[i] = t
        sources = {i: [leaf for leaf in tf.nest.flatten(call_args[i]) if isinstance(leaf, (tf.Tensor, tf.Variable))]
                   for i in differentiate}  # fmt: skip
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([t for ts in sources.values() for t in ts])
            out = fn(*call_args)
        leaves = [leaf for leaf in tf.nest.flatten(out) if leaf is not None]
        upstreams = [tf.reshape(tf.cast(tf.range(tf.size(o)) % 3 + 1, o.dtype), tf.shape(o)) for o in leaves]
        return out, {i: tape.gradient(leaves, ts, output_gradients=upstreams) for i, ts in sources.items()}

    tensors = [args[i] for i in _top_level_tensors(args)]
    if mode == "eager":
        return value_and_grads(*tensors)
    # Unknown rank (checks move to run time), or known rank with unknown dimensions; XLA compiles each shape.
    shape = (lambda t: [None] * t.shape.rank) if mode == "function, known rank" else (lambda t: None)
    signature = [tf.TensorSpec(shape(t), t.dtype) for t in tensors]
    return tf.function(value_and_grads, input_signature=signature, jit_compile=(mode == "xla"))(*tensors)


def _names_an_argument(name: str, error: Exception) -> bool:
    text = str(error)
    return any(re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text) for word in WORDS[name])


def _from_a_kernel(error: Exception) -> bool:
    """A kernel's own error (Incompatible shapes at an Add), not one the library raised or asserted."""
    text = str(error)
    if "assertion failed" in text or "shape_check_failed" in text:  # the library's run-time checks
        return False
    return "{{node" in text or re.search(r"\[Op:\w+\]", text) is not None


SHAPE = re.compile(r"[(\[][\d, ]*[)\]]")  # (), (3,), [2, 3]


def assert_clear(name: str, args, mode: str, error: Exception, invalid: Invalid) -> None:
    """The library's own error, naming an argument, and showing the shapes where they are what is wrong."""
    where = f"{name}{args!r:.200} in {mode}"
    assert not _from_a_kernel(error), f"{where}: a kernel's error, not the library's: {error}"
    assert _names_an_argument(name, error), f"{where}: the error names nothing: {error}"
    if invalid.args == ("shapes",) and not isinstance(error, TypeError) and not (
            mode == "xla" and "shape_check_failed_" in str(error)):  # a TypeError: another real problem, first
        # XLA shows no message, only the failing op's name, which names the arguments (the documented limit).
        assert SHAPE.search(str(error)), f"{where}: the error does not show the shapes: {error}"


def _float_dtypes(args):
    """The float dtypes of the arguments: the computation may run in any of them."""
    return [tf.as_dtype(leaf.dtype) for leaf in tf.nest.flatten(args)
            if isinstance(leaf, (tf.Tensor, tf.Variable)) and leaf.dtype in FLOATS]


def _assert_close(got, want, what, exact=False, dtypes=()):
    """A gradient within its dtype's rounding of the float64 reference; with ``exact`` (a value), the same bits
    as the reference rounded to the dtype, −0.0 and NaN included."""
    if want is None:
        assert got is None, what
        return
    if got.dtype == tf.string:
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=what)
        return
    if exact and got.dtype in FLOATS:
        rounded = tf.cast(tf.constant(np.asarray(want, np.float64)), got.dtype)
        np.testing.assert_array_equal(bits(got.numpy()), bits(rounded.numpy()), err_msg=what)
        return
    # A sum of rounded terms is within ulps of its largest term, not of itself: the atol scales with the result.
    rtol = max(_rtol(d) for d in [got.dtype, *dtypes])
    scale = float(np.max(np.abs(want), initial=0.0, where=np.isfinite(want))) if np.size(want) else 0.0
    atol = max(_atol(got.dtype), rtol * scale)
    np.testing.assert_allclose(numbers(got), want, rtol=rtol, atol=atol, err_msg=what)


def _rtol(dtype) -> float:
    """Four units in the last place of the dtype (the products here are of two or three rounded factors)."""
    return 4 * {tf.bfloat16: 2**-8, tf.float16: 2**-11, tf.float32: 2**-24, tf.float64: 2**-53,
                tf.complex64: 2**-24, tf.complex128: 2**-53}.get(dtype, 2**-53)  # fmt: skip


def _atol(dtype) -> float:
    """The spacing of the dtype's subnormals, where a product underflows."""
    return {tf.bfloat16: 1e-40, tf.float16: 6e-8, tf.float32: 1.5e-45, tf.complex64: 1.5e-45}.get(dtype, 5e-324)


def check_call(name, args, mode):
    fn, _, reference = CALLS[name]
    invalid = None
    try:
        want_value, want_grads = reference(*args)
    except _Skip:
        return
    except Invalid as refused:
        want_value, want_grads, invalid = None, {}, refused
    try:
        value, grads = _run(fn, args, list(want_grads), mode)
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
        assert invalid is not None, f"{name}{args!r:.300} in {mode} refused; the reference computes it: {error}"
        assert_clear(name, args, mode, error, invalid)
        return
    assert invalid is None, f"{name}{args!r:.300} in {mode} returned; the reference refuses it"
    what = f"{name}{args!r:.200} in {mode}"
    for got, want in zip(tf.nest.flatten(value), tf.nest.flatten(want_value), strict=True):
        _assert_close(got, want, what, exact=True)
    for i, want in want_grads.items():  # the reference gives one per leaf; only tensor leaves have a gradient
        leaves = tf.nest.flatten(args[i]) if (name, i) in STRUCTURED else [args[i]]
        expected = [w for leaf, w in zip(leaves, want, strict=True) if isinstance(leaf, (tf.Tensor, tf.Variable))]
        for got, w in zip(grads[i], expected, strict=True):
            _assert_close(got, w, what, dtypes=_float_dtypes(args))


@pytest.mark.parametrize("mode", ["eager", "function", "function, known rank", "xla"])
@pytest.mark.parametrize("name", sorted(CALLS))
@settings(max_examples=30, derandomize=True)
@given(data=st.data())
def test_every_call_is_right_or_names_the_problem(name, mode, data):
    _, strategies, _ = CALLS[name]
    args = data.draw(st.one_of(st.tuples(*strategies), WELL_FORMED[name]))
    check_call(name, args, mode)


# ---------------------------------------------------------------- stop_gradient, the decorator, the checker


class Opaque:
    """A type the library cannot know."""


anything = st.one_of(leaves, st.just(Opaque()))


def _raises_naming(error_words, call):
    try:
        return call(), None
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
        assert any(word in str(error) for word in error_words), f"the error names nothing: {error}"
        return None, error


@pytest.mark.parametrize("mode", ["eager", "function"])
@settings(max_examples=40, derandomize=True)
@given(structure=st.one_of(anything, st.dictionaries(st.sampled_from("ab"), anything, min_size=1)))
def test_stop_gradient_keeps_every_value_and_stops_every_gradient(structure, mode):
    call = sgm.stop_gradient if mode == "eager" else lambda s: tf.function(lambda: sgm.stop_gradient(s))()
    stopped, error = _raises_naming(["stop_gradient"], lambda: call(structure))
    leaves_in = tf.nest.flatten(structure)
    if error is not None:
        assert any(isinstance(leaf, Opaque) for leaf in leaves_in), f"refused a convertible structure: {error}"
        return
    for original, out in zip(leaves_in, tf.nest.flatten(stopped), strict=True):
        if original is None:
            assert out is None
        elif isinstance(original, (tf.RaggedTensor, tf.SparseTensor)):
            assert type(out) is type(original)
        else:
            want = tf.convert_to_tensor(original)
            same = (lambda t: np.asarray(t)) if want.dtype == tf.string else numbers
            np.testing.assert_array_equal(same(out), same(want))
    with tf.GradientTape() as tape:
        x = tf.constant([1.0, 2.0])
        tape.watch(x)
        through = sgm.stop_gradient({"x": x, "other": structure})["x"]
    assert tape.gradient(through, x) is None


@sgm.custom_gradient
def doubled_with_grad_three(x, other):
    """Autodiff would give 2; the custom gradient is 3; `other` is carried and gets none."""
    return x * 2, lambda dy: (3 * dy, None)


numeric_tensors = tensors(dtypes=(*FLOATS, tf.int32, tf.complex64))


@pytest.mark.parametrize("mode", ["eager", "function"])
@settings(max_examples=40, derandomize=True)
@given(x=numeric_tensors, other=anything)
def test_the_decorator_carries_every_argument_or_names_it(x, other, mode):
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = doubled_with_grad_three(x, other)
        return y, tape.gradient(y, x, output_gradients=tf.ones_like(y) * 2) if x.dtype != tf.int32 else None

    traced = run if mode == "eager" else tf.function(run, input_signature=[tf.TensorSpec(None, x.dtype)])
    result, error = _raises_naming(["args[1]"], lambda: traced(x))
    assert error is None, f"refused an argument that tf.custom_gradient passes to f: {error}"
    y, grad = result
    np.testing.assert_array_equal(numbers(y), numbers(x * 2))
    if x.dtype != tf.int32:  # 3 times the upstream 2, at every element, inf and NaN too
        np.testing.assert_array_equal(numbers(grad), np.full(x.shape, 6.0))


points = st.one_of(tensors(dtypes=(*FLOATS[2:], tf.int32, tf.complex64)), python_values, lists, numpy_values)


@settings(max_examples=40, derandomize=True)
@given(point=points, right=st.booleans())
def test_check_gradient_never_passes_a_wrong_gradient_or_nothing(point, right):
    slope = 2.0 if right else 3.0  # the true derivative of a·a is 2a

    def fn(a):  # any argument: errors inside a user's fn are the user's, not the checker's
        if not isinstance(a, tf.Tensor) or not a.dtype.is_floating:
            return tf.constant(0.0)
        return sgm.custom_gradient(a * a, slope * a, a)

    try:
        as_tensor = tf.convert_to_tensor(point)
    except (TypeError, ValueError):
        as_tensor = None  # passed through to fn as it is: nothing to check
    complex_point = as_tensor is not None and as_tensor.dtype.is_complex
    report, error = _raises_naming(["check_gradient"], lambda: sgm.check_gradient(fn, point))
    if error is not None:  # only a complex point is refused (documented); any other is checked or reported empty
        assert complex_point and isinstance(error, TypeError), (point, error)
        return
    assert not complex_point, f"{point!r}: a complex point was not refused"
    judged = as_tensor is not None and as_tensor.dtype.is_floating and bool(np.isfinite(numbers(as_tensor)).any())
    assert report.passed == bool(right and judged), (point, right, str(report))
    if not report.passed:
        with pytest.raises(AssertionError, match=r"gradient check failed|nothing was checked"):
            sgm.assert_gradient(fn, point)
