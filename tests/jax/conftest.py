"""The JAX tests' fixture: float64 for one test."""

import pytest


@pytest.fixture
def float64():
    """JAX with float64 (off by default), for this test only."""
    import jax

    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)
