"""Shared test set-up: two logical CPUs, the hypothesis profile, the mode fixture."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf
from helpers import MODES
from hypothesis import HealthCheck, settings

# MirroredStrategy tests need two devices; logical devices can only be set up
# before TensorFlow initialises its runtime, so this happens at import.
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

settings.register_profile(
    "project",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("project")

if os.environ.get("STOPGRAD_MUTANT"):  # make test-mutants: one deliberately broken variant (tests/mutants.py)
    import mutants

    mutants.apply(os.environ["STOPGRAD_MUTANT"])


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def float64():
    """JAX with float64 (off by default), for this test only."""
    import jax

    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)
