"""The examples in the package's docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import stopgrad_math

MODULES = [
    info.name for info in pkgutil.iter_modules(stopgrad_math.__path__, "stopgrad_math.")
    if "__main__" not in info.name and not info.ispkg  # the JAX subpackage: JAX_MODULES
]


JAX_MODULES = [f"stopgrad_math.jax.{name}" for name in ("identity", "identity_form", "stops", "estimators", "partial",
                                                                "gradient_checker")]


def _run_examples(name, globs):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    with open(module.__file__) as source:
        assert result.attempted >= source.read().count(">>> ")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    _run_examples(name, {"tf": tf, "np": np, **{n: getattr(stopgrad_math, n) for n in stopgrad_math.__all__}})


@pytest.mark.parametrize("name", JAX_MODULES)
def test_jax_docstring_examples(name):
    jax = pytest.importorskip("jax")
    import stopgrad_math.jax as sgm_jax

    _run_examples(name, {"jax": jax, "jnp": jax.numpy, "np": np, **{n: getattr(sgm_jax, n) for n in sgm_jax.__all__}})


def test_every_jax_module_with_examples_is_run():
    import pathlib

    folder = pathlib.Path(stopgrad_math.__file__).parent / "jax"
    with_examples = {f"stopgrad_math.jax.{p.stem}" for p in folder.glob("*.py") if ">>> " in p.read_text()}
    assert with_examples <= set(JAX_MODULES)


def test_custom_gradients_docstring_is_what_a_call_needs_and_links_to_the_rest():
    """Both forms and one example each, at most about 40 lines; the contract in full is a docs page."""
    doc = stopgrad_math.custom_gradient.__doc__
    assert len(doc.strip().splitlines()) <= 45
    assert "(custom_gradient.md)" in doc
