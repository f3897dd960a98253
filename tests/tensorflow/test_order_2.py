"""Issue 58 on TensorFlow: ``order=2`` keeps ``order=1``'s first derivatives, and its second derivative is the
Jacobian of the declared gradient, as nested tapes over ``tf.custom_gradient`` give it (unsymmetrized), eagerly,
in ``tf.function``, under XLA, in TF1 graphs, and in every composition of tapes and accumulators.

The rules, restated: a norm guarded at the zero vector, a softplus whose rule selects between two branches (one
overflowing where it is not taken: TFP's stable softplus), a logsumexp with an infinite operand, and a
cross-entropy whose declared gradient w.r.t. the targets assumes they sum to one (no gradient of a function: its
Jacobian is not symmetric).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import stopgrad_math as sgm


def guarded_norm(x):
    norm = tf.sqrt(tf.reduce_sum(x * x))
    positive = norm > 0
    return norm, lambda ct: ct * tf.where(positive, x / tf.where(positive, norm, tf.ones_like(norm)), 0.0)


def selected_softplus(x):  # the rule's untaken branch, exp(x), overflows at x = 100 in float32
    return tf.reduce_sum(tf.math.softplus(x)), lambda ct: ct * tf.where(x < -9.0, tf.exp(x), tf.sigmoid(x))


def logsumexp(x):
    y = tf.math.log(tf.reduce_sum(tf.exp(x)))
    return y, lambda ct: ct * tf.exp(x - y)


def cross_entropy(z):  # logits z[:3], targets z[3:]; d/dtargets = −log_softmax, whatever the targets sum to
    log_p = tf.nn.log_softmax(z[:3])
    return -tf.reduce_sum(z[3:] * log_p), lambda ct: tf.concat([ct * (tf.exp(log_p) - z[3:]), -ct * log_p], 0)


def elementwise_softplus(x):  # a vector output: the term is the route's J·v, not grad_fn(1)
    return tf.math.softplus(x), lambda ct: ct * tf.where(x < -9.0, tf.exp(x), tf.sigmoid(x))


def _tape(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


def _persistent_tape(fn, x):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


def _under_an_outer_tape(fn, x):
    with tf.GradientTape() as outer:
        outer.watch(x)
        gradient = _tape(fn, x)
    return gradient


def _under_an_outer_accumulator(fn, x):
    with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)):
        return _tape(fn, x)


def _forward_mode(fn, x):
    """The gradient of a scalar fn from one JVP per basis tangent."""
    columns = []
    for k in range(x.shape[0]):
        with tf.autodiff.ForwardAccumulator(x, tf.one_hot(k, x.shape[0], dtype=x.dtype)) as accumulator:
            y = fn(x)
        columns.append(accumulator.jvp(y))
    return tf.stack(columns)


def _tf1_gradients(fn, x):
    with tf.Graph().as_default():
        placeholder = tf.compat.v1.placeholder(x.dtype, x.shape)
        gradient = tf.gradients(fn(placeholder), placeholder)[0]
        with tf.compat.v1.Session() as session:
            value = session.run(gradient, {placeholder: x.numpy()})
    return tf.constant(value)


FIRST_DERIVATIVES = {
    "tape": _tape,
    "tape in tf.function": lambda fn, x: tf.function(_tape)(fn, x),
    "tape under XLA": lambda fn, x: tf.function(_tape, jit_compile=True)(fn, x),
    "persistent tape": _persistent_tape,
    "tape under an outer tape": _under_an_outer_tape,
    "tape under an outer tape in tf.function": lambda fn, x: tf.function(_under_an_outer_tape)(fn, x),
    "tape under an outer accumulator": _under_an_outer_accumulator,
    "forward mode": _forward_mode,
    "forward mode in tf.function": lambda fn, x: tf.function(_forward_mode)(fn, x),
    "TF1 tf.gradients": _tf1_gradients,
    "a traced function under a tape": lambda fn, x: _tape(tf.function(fn), x),
}
POINTS = {
    "guarded norm at zero": (guarded_norm, [0.0, 0.0, 0.0]),
    "guarded norm": (guarded_norm, [3.0, 4.0, 0.0]),
    "selected softplus at 100": (selected_softplus, [100.0]),
    "selected softplus at -20": (selected_softplus, [-20.0]),
    "logsumexp with +inf": (logsumexp, [0.0, np.inf, 1.0]),
}


def _declared(rule, x):
    return rule(x)[1](tf.ones((), x.dtype)).numpy()


@pytest.mark.parametrize("mode", FIRST_DERIVATIVES)
@pytest.mark.parametrize("point", POINTS)
def test_order_2_gives_order_1s_first_derivative(point, mode):
    """The rule by hand is the truth, sign of zero included where order=1's is the rule's; order=2 gave NaN at the
    guarded norm's zero vector, at softplus(100) and beside the infinite operand. Forward mode's J·e_k meets a NaN
    of J (the infinite operand's element) at every element, at both orders."""
    rule, x = POINTS[point]
    x = tf.constant(x, tf.float32)
    first = FIRST_DERIVATIVES[mode](sgm.custom_gradient(rule), x).numpy()
    second = FIRST_DERIVATIVES[mode](sgm.custom_gradient(rule, order=2), x).numpy()
    np.testing.assert_array_equal(second, first)  # (−0.0 == +0.0, NaN == NaN)
    if "forward mode" not in mode:
        declared = _declared(rule, x)
        np.testing.assert_array_equal(second, declared)
        nan = np.isnan(declared)
        np.testing.assert_array_equal(np.signbit(second) | nan, np.signbit(declared) | nan)


@pytest.mark.parametrize("point", POINTS)
def test_the_first_derivative_is_tf_custom_gradients_bit_for_bit(point):
    rule, x = POINTS[point]
    x = tf.constant(x, tf.float32)
    ours, theirs = (_tape(fn, x).numpy() for fn in (sgm.custom_gradient(rule, order=2), tf.custom_gradient(rule)))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(ours.view(np.uint32)[~np.isnan(ours)], theirs.view(np.uint32)[~np.isnan(theirs)])


def test_a_vector_output_keeps_its_first_derivative_where_the_rules_own_derivative_overflows():
    x = tf.constant([100.0, -20.0, 0.0, 88.0])
    want = tf.where(x < -9.0, tf.exp(x), tf.sigmoid(x)).numpy()

    def jvp(fn, x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            y = fn(x)
        return accumulator.jvp(y)

    for way in (_tape, tf.function(_tape), jvp, tf.function(jvp), _tf1_gradients):
        first, second = (way(sgm.custom_gradient(elementwise_softplus, order=order), x).numpy() for order in (1, 2))
        np.testing.assert_array_equal(second, first)
        np.testing.assert_array_equal(second.view(np.uint32), want.view(np.uint32))


def _nested_tapes(fn, x):
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(x)
        gradient = _tape(fn, x)
    return outer.jacobian(gradient, x, experimental_use_pfor=False)


def _one_persistent_tape(fn, x):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = fn(x)
        gradient = tape.gradient(y, x)
    return tape.jacobian(gradient, x, experimental_use_pfor=False)


def _forward_over_reverse(fn, x):
    columns = []
    for k in range(x.shape[0]):
        with tf.autodiff.ForwardAccumulator(x, tf.one_hot(k, x.shape[0], dtype=x.dtype)) as accumulator:
            gradient = _tape(fn, x)
        columns.append(accumulator.jvp(gradient))
    return tf.stack(columns, axis=1)  # column k: ∂gradient/∂x_k


def _reverse_over_forward(fn, x):
    rows = []
    for k in range(x.shape[0]):
        with tf.GradientTape() as tape:
            tape.watch(x)
            with tf.autodiff.ForwardAccumulator(x, tf.one_hot(k, x.shape[0], dtype=x.dtype)) as accumulator:
                y = fn(x)
            derivative = accumulator.jvp(y)
        rows.append(tape.gradient(derivative, x))
    return tf.stack(rows)  # row k: ∂(∂y/∂x_k)/∂x


def _forward_over_forward(fn, x):
    n = x.shape[0]
    rows = []
    for k in range(n):
        row = []
        for m in range(n):
            with tf.autodiff.ForwardAccumulator(x, tf.one_hot(m, n, dtype=x.dtype)) as outer:
                with tf.autodiff.ForwardAccumulator(x, tf.one_hot(k, n, dtype=x.dtype)) as inner:
                    y = fn(x)
                derivative = inner.jvp(y)
            row.append(outer.jvp(derivative))
        rows.append(tf.stack(row))
    return tf.stack(rows)


def _tf1_gradients_of_gradients(fn, x):
    with tf.Graph().as_default():
        placeholder = tf.compat.v1.placeholder(x.dtype, x.shape)
        gradient = tf.gradients(fn(placeholder), placeholder)[0]
        rows = [tf.gradients(gradient[i], placeholder)[0] for i in range(x.shape[0])]
        with tf.compat.v1.Session() as session:
            value = session.run(tf.stack(rows), {placeholder: x.numpy()})
    return tf.constant(value)


SECOND_DERIVATIVES = {  # each the Jacobian of the gradient, row i the derivative of gradient i
    "nested tapes": _nested_tapes,
    "nested tapes in tf.function": lambda fn, x: tf.function(_nested_tapes)(fn, x),
    "nested tapes under XLA": lambda fn, x: tf.function(_nested_tapes, jit_compile=True)(fn, x),
    "one persistent tape": _one_persistent_tape,
    "forward over reverse": _forward_over_reverse,
    "forward over reverse in tf.function": lambda fn, x: tf.function(_forward_over_reverse)(fn, x),
    "reverse over forward": _reverse_over_forward,
    "reverse over forward in tf.function": lambda fn, x: tf.function(_reverse_over_forward)(fn, x),
    "forward over forward": _forward_over_forward,
    "TF1 tf.gradients of tf.gradients": _tf1_gradients_of_gradients,
    "nested tapes over a traced function": lambda fn, x: _nested_tapes(tf.function(fn), x),
}


def finite_differences_of(gradient, x, step=1e-6):
    """The Jacobian of a declared gradient by central differences in float64, row i the derivative of entry i."""
    columns = [(gradient(x + step * e) - gradient(x - step * e)) / (2 * step)
               for e in tf.eye(x.shape[0], dtype=x.dtype)]
    return tf.stack(columns, axis=-1)


@pytest.mark.parametrize("way", SECOND_DERIVATIVES)
def test_the_second_derivative_is_the_jacobian_of_the_declared_gradient_unsymmetrized(way):
    """Nested tapes over tf.custom_gradient and finite differences of the rule give the non-symmetric Jacobian;
    order=2 gives it in every way (it gave the average of it and its transpose)."""
    z = tf.constant([1.0, 2.0, 0.5, 0.2, 0.5, 0.3], tf.float64)
    truth = finite_differences_of(lambda z: cross_entropy(z)[1](tf.ones((), z.dtype)), z)
    anchor = _nested_tapes(tf.custom_gradient(cross_entropy), z)
    np.testing.assert_allclose(anchor, truth, rtol=0, atol=1e-8)
    ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(cross_entropy, order=2), z)
    np.testing.assert_allclose(ours, anchor, rtol=1e-12, atol=1e-14)
    assert not np.allclose(ours, tf.transpose(ours), atol=0.1)


@pytest.mark.parametrize("way", ["nested tapes", "nested tapes in tf.function", "forward over reverse",
                                 "reverse over forward", "TF1 tf.gradients of tf.gradients"])
def test_second_derivatives_of_the_guarded_rules_against_tf_custom_gradient(way):
    """Reverse over reverse differentiates the rule as nested tapes over tf.custom_gradient do (at the zero vector
    the guarded norm's rule has no derivative: NaN, from 0·∞ through the norm's sqrt); a forward-mode outer
    derivative differentiates it as an accumulator over the rule does (0 there: forward mode masks the branch not
    taken)."""
    for rule, x in [(guarded_norm, [3.0, 4.0, 1.0]), (guarded_norm, [0.0, 0.0, 0.0]),
                    (selected_softplus, [0.7]), (selected_softplus, [-30.0])]:
        x = tf.constant(x, tf.float64)
        ours = SECOND_DERIVATIVES[way](sgm.custom_gradient(rule, order=2), x)
        if way.startswith("forward") or way.startswith("reverse over forward"):
            truth = _forward_mode(lambda x, rule=rule: rule(x)[1](tf.ones((), x.dtype)), x)
            truth = tf.reshape(truth, [x.shape[0], x.shape[0]])
            truth = truth if way.startswith("forward") else tf.transpose(truth)
        else:
            truth = _nested_tapes(tf.custom_gradient(rule), x)
        np.testing.assert_allclose(ours, truth, rtol=1e-12, atol=1e-15, equal_nan=True)


def test_the_second_derivative_of_a_vector_output_is_the_jacobian_of_its_declared_jacobian():
    """y = x·reverse(x) with the declared J = diag(reverse(x)) (half of the product rule): the Hessian of w·y is
    ∂(w ⊙ reverse(x))/∂x, which is not symmetric for unequal weights; tf.custom_gradient's nested tapes give it."""
    def half_product(x):
        return x * tf.reverse(x, [0]), lambda ct: ct * tf.reverse(x, [0])

    x = tf.constant([1.0, 2.0, 3.0], tf.float64)
    weights = [1.0, 10.0, 100.0]  # made where the weighted sum is (a TF1 graph cannot capture an eager tensor)
    truth = np.array([[0.0, 0.0, 1.0], [0.0, 10.0, 0.0], [100.0, 0.0, 0.0]])
    weighted = tf.custom_gradient(half_product)
    np.testing.assert_allclose(_nested_tapes(lambda x: tf.reduce_sum(tf.constant(weights, x.dtype) * weighted(x)), x),
                               truth)
    ours = sgm.custom_gradient(half_product, order=2)
    for way in SECOND_DERIVATIVES:
        got = SECOND_DERIVATIVES[way](lambda x: tf.reduce_sum(tf.constant(weights, x.dtype) * ours(x)), x)
        np.testing.assert_allclose(got, truth, err_msg=way)


def guarded_reciprocal_rule(x):  # value 2x, declared gradient 1/x where x > 0 and 0 elsewhere
    reciprocal = tf.where(x > 0, 1.0 / x, tf.zeros_like(x))
    return 2.0 * x, lambda ct: ct * reciprocal


def test_a_traced_function_under_a_persistent_tape_meets_tensorflows_function_gradient():
    """The documented limit, as that limit: a traced function differentiated from outside under a persistent tape
    gets TensorFlow's gradient of a function that may be differentiated again, which also sends zero upstreams
    through the intermediates grad_fn reads; f's own ops turn them into NaN where their derivative is infinite
    (1/x's at 0). tf.custom_gradient gives the same NaN there; order=1, whose f never sees x, gives the rule's 0;
    so does a tape inside the function (a Keras train step) at order=2."""
    x = tf.constant([0.0, 2.0])
    ours = _persistent_tape(tf.function(sgm.custom_gradient(guarded_reciprocal_rule, order=2)), x).numpy()
    theirs = _persistent_tape(tf.function(tf.custom_gradient(guarded_reciprocal_rule)), x).numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, [np.nan, 0.5])
    for right in (_persistent_tape(tf.function(sgm.custom_gradient(guarded_reciprocal_rule)), x),
                  tf.function(_persistent_tape)(sgm.custom_gradient(guarded_reciprocal_rule, order=2), x),
                  _persistent_tape(sgm.custom_gradient(guarded_reciprocal_rule, order=2), x)):
        np.testing.assert_array_equal(right, [0.0, 0.5])


def test_variables_f_reads_get_grad_fns_gradients_and_their_second_derivatives():
    scale = tf.Variable(1.5, dtype=tf.float64)

    def scaled_sine(x):
        y = scale * tf.sin(x)
        return y, lambda ct, variables=None: (ct * scale * tf.cos(x), [tf.reduce_sum(ct * tf.sin(x))])

    x = tf.constant([0.3, 1.1], tf.float64)
    for decorated in (sgm.custom_gradient(scaled_sine, order=2), tf.custom_gradient(scaled_sine)):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(decorated(x))
            d_x, d_scale = inner.gradient(y, [x, scale])
        np.testing.assert_allclose(d_x, 1.5 * np.cos([0.3, 1.1]))
        np.testing.assert_allclose(d_scale, np.sin(0.3) + np.sin(1.1))
        np.testing.assert_allclose(outer.jacobian(d_x, x), np.diag(-1.5 * np.sin([0.3, 1.1])))
        np.testing.assert_allclose(outer.gradient(d_x, scale), np.sum(np.cos([0.3, 1.1])))


def test_a_sampler_draws_once_the_value_and_the_gradient_see_one_noise():
    """order=2 calls f once (it called f at the midpoint only, but a second time where f read variables)."""
    def noisy(x):
        noise = tf.random.normal(tf.shape(x))
        return x + noise, lambda ct: ct * noise

    x = tf.zeros([5])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = sgm.custom_gradient(noisy, order=2)(x)
    np.testing.assert_array_equal(tape.gradient(y, x), y)


def test_a_grad_fn_that_is_not_linear_is_judged_where_a_derivative_is_asked():
    """As order=1 (issue 58): eagerly with no tape the value, under a tape or traced a ValueError naming the op."""
    clipped = sgm.custom_gradient(lambda x: (x * 2.0, lambda ct: tf.clip_by_value(ct, -1.0, 1.0)), order=2)
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(clipped(x), [2.0, 4.0])
    with pytest.raises(ValueError, match=r"Minimum|Maximum|ClipByValue"):
        _tape(clipped, x)
    with pytest.raises(ValueError, match=r"Minimum|Maximum|ClipByValue"):
        tf.function(clipped)(x)


def test_unknown_shapes_and_a_mirrored_strategy_give_the_unsymmetrized_jacobian():
    """A trace with an unknown length (the transpose route on a vector y) and a replica context: each replica's
    Hessian of w·y for y = x·reverse(x) with the declared J = diag(reverse(x)) is ∂(w ⊙ reverse(x))/∂x."""
    def half_product(x):
        return x * tf.reverse(x, [0]), lambda ct: ct * tf.reverse(x, [0])

    ours = sgm.custom_gradient(half_product, order=2)
    weights = tf.constant([1.0, 10.0, 100.0], tf.float64)
    truth = np.array([[0.0, 0.0, 1.0], [0.0, 10.0, 0.0], [100.0, 0.0, 0.0]])

    def hessian(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            gradient = _tape(lambda x: tf.reduce_sum(weights * ours(x)), x)
        return outer.jacobian(gradient, x)

    x = tf.constant([1.0, 2.0, 3.0], tf.float64)
    unknown = tf.function(hessian, input_signature=[tf.TensorSpec([None], tf.float64)])
    np.testing.assert_allclose(unknown(x), truth)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    per_replica = strategy.run(tf.function(hessian), args=(x,))
    for replica in strategy.experimental_local_results(per_replica):
        np.testing.assert_allclose(replica, truth)


def test_a_holomorphic_function_keeps_tensorflows_complex_convention_at_both_orders():
    """f(z) = z³ with the declared derivative 3z² (grad_fn conjugates, TensorFlow's convention): the gradient of
    |f|²/2 is conj(3z²)·f, and its second derivatives as nested tapes over tf.custom_gradient give them."""
    def cube(z):
        return z ** 3, lambda ct: ct * tf.math.conj(3 * z ** 2)

    z = tf.constant([0.5 + 1.0j, -1.0 + 0.25j], tf.complex128)

    def energy(fn):
        return lambda z: tf.reduce_sum(tf.math.real(fn(z) * tf.math.conj(fn(z)))) / 2

    def gradient_and_hessian(fn, z):
        """The gradient w.r.t. z, and the Hessian of the energy w.r.t. z's real and imaginary parts."""
        parts = [tf.math.real(z), tf.math.imag(z)]
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(parts)
            with tf.GradientTape(persistent=True) as inner:
                inner.watch(parts)
                joined = tf.complex(*parts)
                y = energy(fn)(joined)
            gradient = inner.gradient(y, joined)
            first = tf.concat(inner.gradient(y, parts), 0)
        return gradient, outer.jacobian(first, parts, experimental_use_pfor=False)

    ours = gradient_and_hessian(sgm.custom_gradient(cube, order=2), z)
    theirs = gradient_and_hessian(tf.custom_gradient(cube), z)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-14)
    np.testing.assert_allclose(ours[0], np.conj(3 * z.numpy() ** 2) * z.numpy() ** 3, rtol=1e-14)
    for a, b in zip(ours[1], theirs[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_sparse_gradients_of_a_table_stay_sparse_and_match_order_1():
    """grad_fn returns tf.IndexedSlices for the gathered rows of a variable table: the backward returns them as
    they are (reverse mode keeps them sparse), and forward mode builds order=1's term on the rows."""
    table = tf.Variable(tf.reshape(tf.range(12.0), [4, 3]))
    ids = tf.constant([1, 3, 1])
    weights = tf.constant([[1.0, 2.0, 3.0]])

    def lookup(t):
        return tf.gather(t, ids) * 2.0, lambda ct: tf.IndexedSlices(ct * 2.0, ids, tf.shape(t, out_type=ids.dtype))

    def gradient(fn, t):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(fn(t) * weights)
        return tape.gradient(y, t)

    want = [[0.0, 0.0, 0.0], [4.0, 8.0, 12.0], [0.0, 0.0, 0.0], [2.0, 4.0, 6.0]]
    for way in (gradient, tf.function(gradient)):
        got = way(sgm.custom_gradient(lookup, order=2), table)
        assert isinstance(got, tf.IndexedSlices)
        np.testing.assert_array_equal(tf.convert_to_tensor(got), want)
    x = tf.convert_to_tensor(table)
    tangents = []
    for order in (1, 2):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as accumulator:
            y = sgm.custom_gradient(lookup, order=order)(x)
        tangents.append(accumulator.jvp(y).numpy())
    np.testing.assert_array_equal(tangents[1], tangents[0])
    np.testing.assert_array_equal(tangents[1], np.full([3, 3], 2.0))


_CACHED_ZEROS = """
import numpy as np, tensorflow as tf, stopgrad_math as sgm
@sgm.custom_gradient(order=2)
def negate(x):
    return -x, lambda ct: -ct
x = tf.zeros([2], tf.float32)
USER_FIRST
with tf.GradientTape() as tape:
    tape.watch(x)
    y = negate(x)
user = tf.constant(0.0, tf.float32)
print(np.signbit(y.numpy()).all(), np.signbit(user.numpy()), (1.0 / tf.constant(0.0)).numpy())
"""


@pytest.mark.parametrize("user_first", [False, True], ids=["library first", "user first"])
def test_order_2_neither_takes_nor_leaves_a_cached_zero_of_the_wrong_sign(user_first):
    """TensorFlow's eager cache of converted Python scalars keys -0.0 and 0.0 alike. An order=2 call adds -0.0
    to y (y = -0.0 stays -0.0); the user's tf.constant(0.0) made before it must not turn that into +0.0, and
    the call must not turn the user's later tf.constant(0.0) into -0.0 (1 / it -inf). In a fresh process each,
    as the cache lives as long as the process."""
    code = _CACHED_ZEROS.replace("USER_FIRST", "tf.constant(0.0, tf.float32); tf.constant(0.0)" if user_first else "")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "False", "inf"]
