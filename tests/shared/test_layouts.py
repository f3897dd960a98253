"""The shared shape rules (stopgrad_math.shared.layouts) against TensorFlow's own static shape rules."""

import subprocess
import sys

import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from stopgrad_math.shared import layouts

dims = st.one_of(st.none(), st.integers(0, 3))
shapes = st.one_of(st.none(), st.lists(dims, max_size=3).map(tuple))


def _tf(shape):
    return tf.TensorShape(None if shape is None else list(shape))


@given(shapes, shapes)
def test_static_broadcast_is_tensorflows(a, b):
    try:
        want = tf.broadcast_static_shape(_tf(a), _tf(b))
    except ValueError:
        assert layouts.static_broadcast(a, b) is layouts.NEVER
        return
    got = layouts.static_broadcast(a, b)
    assert _tf(got).as_list() == want.as_list() if want.rank is not None else got is None


@given(shapes, shapes)
def test_compatible_is_tensorflows(a, b):
    assert layouts.compatible(a, b) == _tf(a).is_compatible_with(_tf(b))


@pytest.mark.parametrize("shape, text", [((2, 3), "(2, 3)"), ((None, 3), "(None, 3)"), ((3,), "(3,)"), ((), "()"),
                                         (None, "<unknown>")])
def test_shapes_are_named_as_tensorflow_prints_them(shape, text):
    assert str(_tf(shape)) == text
    assert f"has shape {text}" in layouts.misfit("x", shape, (7, 7), (5,))


def test_the_shared_rules_import_no_framework():
    code = "import sys; import stopgrad_math.shared.layouts; print(sorted({'tensorflow', 'jax'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
