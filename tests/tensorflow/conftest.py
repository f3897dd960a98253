"""The TensorFlow tests' fixture: each test that takes ``mode`` runs eagerly, under tf.function and under XLA."""

import pytest
from mode_names import MODES


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param
