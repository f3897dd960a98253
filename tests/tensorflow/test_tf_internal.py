"""The private TensorFlow APIs the library uses: all in one module, and each doing what the library relies on,
on the TensorFlow version this suite runs with."""

import pathlib
import re

import keras
import pytest
import tensorflow as tf

import stopgrad_math
from stopgrad_math.tensorflow import _tf_internal

PACKAGE = pathlib.Path(stopgrad_math.__file__).parent


def test_no_other_module_reaches_past_the_public_api():
    private = re.compile(r"tensorflow\.python|__internal__|\bfrom tensorflow\.[a-z_]+ import")
    offenders = [p.name for p in PACKAGE.glob("*.py") if p.name != "_tf_internal.py" and private.search(p.read_text())]
    assert offenders == []


def test_recording_is_seen_and_can_be_paused():
    x = tf.constant(2.0)
    assert not _tf_internal.could_possibly_record()
    with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
        assert _tf_internal.could_possibly_record()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        assert _tf_internal.could_possibly_record()
        recorded = x * 3.0
        with _tf_internal.stop_recording():
            unrecorded = x * 3.0
        assert _tf_internal.should_record_backprop([recorded])
        assert not _tf_internal.should_record_backprop([unrecorded])
    assert float(tape.gradient(recorded, x)) == 3.0 and tape.gradient(unrecorded, x) is None


def test_a_recorded_op_takes_its_backward_and_its_forward_function_and_the_caller_is_paused_inside():
    """What ``recorded_term`` relies on: a tape takes the backward, an accumulator the forward function (given
    the input tangents), an outer tape records what the forward function computes, and a tape made inside it
    records nothing (which is why the order-2 probe is made before)."""
    x = tf.constant([1.0, 2.0])
    made_inside = []

    def forward(tangent):
        with tf.GradientTape() as inner:
            inner.watch(x)
            made_inside.append(inner.gradient(x * 2.0, x))
        with _tf_internal.recording_inside_forward_function(), tf.GradientTape() as restored:
            restored.watch(x)
            made_inside.append(restored.gradient(x * 2.0, x).numpy().tolist())
        return [tangent * x]

    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, 1.0])) as accumulator:
            with tf.GradientTape() as tape:
                tape.watch(x)
                z = tf.zeros([2])
                _tf_internal.record_operation("test", [z], [x], lambda upstream: [upstream * 3.0], forward)
            assert tape.gradient(z, x).numpy().tolist() == [3.0, 3.0]
        tangent = accumulator.jvp(z)
    assert tangent.numpy().tolist() == [1.0, 2.0] and made_inside == [None, [2.0, 2.0]]
    assert outer.gradient(tangent, x).numpy().tolist() == [1.0, 1.0]


def test_shape_tuple_is_the_static_shape():
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec(None)])
    def traced(partly_known, unknown):
        seen.update(partly=_tf_internal.shape_tuple(partly_known), unknown=_tf_internal.shape_tuple(unknown))
        return partly_known

    traced.get_concrete_function()
    assert seen == {"partly": (None, 3), "unknown": None}
    assert _tf_internal.shape_tuple(tf.zeros([2, 0, 4])) == (2, 0, 4) and _tf_internal.shape_tuple(tf.zeros([])) == ()
    assert _tf_internal.shape_tuple(tf.Variable(tf.zeros([5, 1]))) == (5, 1)
    unknown_shape = tf.Variable(tf.zeros([2]), shape=tf.TensorShape(None))
    assert _tf_internal.shape_tuple(unknown_shape) is None


def test_variable_watcher_sees_the_variables_read():
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    with _tf_internal.VariableWatcher() as watcher:
        a * 2.0
    assert [v.ref() for v in watcher.watched_variables()] == [a.ref()]
    assert b.ref() not in {v.ref() for v in watcher.watched_variables()}


def test_paths_name_the_leaves():
    paths = _tf_internal.flatten_with_joined_string_paths({"b": [1, 2], "a": 3})
    assert paths == [("a", 3), ("b/0", 1), ("b/1", 2)]


def test_variable_types():
    variable = keras.Variable(1.0)
    assert isinstance(variable, _tf_internal.TensorProtocol) and not isinstance(variable, (tf.Tensor, tf.Variable))
    assert isinstance(_tf_internal.ShardedVariable, type) and not issubclass(_tf_internal.ShardedVariable, tf.Variable)


def test_gradient_function_tells_an_op_with_a_gradient_from_one_declared_without_and_one_with_none():
    graph = tf.function(lambda x: (x * 2.0, tf.raw_ops.RandomGammaGrad(alpha=x, sample=x), tf.raw_ops.ZerosLike(x=x)))
    ops = {op.type: op for op in graph.get_concrete_function(tf.TensorSpec([2])).graph.get_operations()}
    assert callable(_tf_internal.gradient_function(ops["Mul"]))
    assert _tf_internal.gradient_function(ops["ZerosLike"]) is None  # declared not differentiable
    with pytest.raises(LookupError):
        _tf_internal.gradient_function(ops["RandomGammaGrad"])


def test_a_higher_order_gradient_is_possible_under_two_watchers_or_a_persistent_tape():
    x, other = tf.constant(2.0), tf.constant(3.0)
    assert not _tf_internal.higher_order_gradient_possible([x])
    with tf.GradientTape() as tape:
        tape.watch(x)
        assert not _tf_internal.higher_order_gradient_possible([x])
        with tf.GradientTape() as inner:
            inner.watch(x)
            assert _tf_internal.higher_order_gradient_possible([x])
            assert not _tf_internal.higher_order_gradient_possible([other])
        with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
            assert _tf_internal.higher_order_gradient_possible([x])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        assert _tf_internal.higher_order_gradient_possible([x])
    with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
        assert not _tf_internal.higher_order_gradient_possible([x])


def test_one_tape_alone_is_one_non_persistent_tape_and_no_accumulator_on_the_tensors():
    """The decorator's eager reverse path rests on it: only that tape can ask, once, and only reverse mode."""
    x, other = tf.constant(2.0), tf.constant(3.0)
    assert not _tf_internal.one_tape_alone([x])
    with tf.GradientTape() as tape:
        tape.watch(x)
        assert _tf_internal.one_tape_alone([x]) and _tf_internal.one_tape_alone([other, x])
        assert not _tf_internal.one_tape_alone([other])
        with tf.autodiff.ForwardAccumulator(other, tf.constant(1.0)):
            assert not _tf_internal.one_tape_alone([x, other])  # an accumulator on one of them
        with tf.GradientTape() as inner:
            inner.watch(x)
            assert not _tf_internal.one_tape_alone([x])
    with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
        assert not _tf_internal.one_tape_alone([x])  # one watcher, but an accumulator
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        assert not _tf_internal.one_tape_alone([x])


def test_a_gradient_is_possible_where_a_tape_or_an_accumulator_watches_a_tensor():
    x, other = tf.constant(2.0), tf.constant(3.0)
    assert not _tf_internal.gradient_possible([x])
    with tf.GradientTape() as tape:
        tape.watch(x)
        assert _tf_internal.gradient_possible([x])
        assert _tf_internal.gradient_possible([other, x])
        assert not _tf_internal.gradient_possible([other])  # a tape, but not on it: nothing can ask
    with tf.autodiff.ForwardAccumulator(x, tf.constant(1.0)):
        assert _tf_internal.gradient_possible([x])
        assert not _tf_internal.should_record_backprop([x])  # why the tapes alone do not answer it
        assert not _tf_internal.gradient_possible([other])


def test_saving_is_true_while_a_saved_model_traces_its_registered_gradients(tmp_path):
    """What ``_refused`` reads: tf.saved_model.save traces each registered gradient function with the export under
    way, and no other code sees it so."""
    seen = []

    @tf.custom_gradient
    def doubled(x):
        def gradient(dy):
            seen.append(_tf_internal.saving())
            return 2 * dy
        return tf.identity(x), gradient

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2], tf.float32)])
        def __call__(self, x):
            return doubled(x)

    assert not _tf_internal.saving()
    tf.saved_model.save(Module(), str(tmp_path))
    assert seen == [True]
    with tf.GradientTape() as tape:
        x = tf.constant([1.0, 2.0])
        tape.watch(x)
        y = doubled(x)
    tape.gradient(y, x)
    assert seen == [True, False]


def test_an_op_callback_sees_each_op_eagerly_and_in_a_graph_and_is_removed_after():
    seen = []

    def record(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        seen.append(op_type.decode() if isinstance(op_type, bytes) else op_type)

    with _tf_internal.op_callback(record):
        tf.constant([1.0]) / tf.constant([2.0])
        tf.function(lambda x: x * 3.0)(tf.constant([1.0]))
    assert "RealDiv" in seen and "Mul" in seen  # (the Mul while tracing the function)
    count = len(seen)
    tf.constant([1.0]) / tf.constant([2.0])
    assert len(seen) == count


def test_a_forward_accumulators_jvp_is_a_call_of_its_own_functions():
    """TensorFlow names each op's JVP function _jvp_exact_shapes or _jvp_relaxed_shapes: eagerly the op's type."""
    seen = []

    def record(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        seen.append(op_type.decode() if isinstance(op_type, bytes) else op_type)

    x = tf.constant([1.0, 2.0])
    with _tf_internal.op_callback(record), tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)):
        tf.sin(x)
    assert any(_tf_internal.runs_a_forward_accumulators_jvp(t) for t in seen)
    assert not _tf_internal.runs_a_forward_accumulators_jvp("Sin")


def test_a_call_op_names_its_function_and_a_wrapped_gradient_delegates():
    @tf.function
    def inner(x):
        return x * 2.0

    with tf.Graph().as_default() as graph:
        inner(tf.constant(1.0))
        calls = [op for op in graph.get_operations() if _tf_internal.called_function_name(op)]
    assert calls and "inner" in _tf_internal.called_function_name(calls[0])
    taken, saved = [], {}

    def wrap(registered):
        saved["gradient"] = registered
        return lambda op, grad: taken.append(op.type) or registered(op, grad)

    _tf_internal.wrap_registered_gradient("Atan2", wrap)
    try:
        x = tf.constant(1.0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.atan2(x, 2.0)
        assert abs(float(tape.gradient(y, x)) - 2.0 / 5.0) < 1e-6
    finally:
        _tf_internal.wrap_registered_gradient("Atan2", lambda _: saved["gradient"])
    assert taken == ["Atan2"]
