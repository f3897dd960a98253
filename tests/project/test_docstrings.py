"""The examples in the package's docstrings run and print what they say."""

import doctest
import importlib
import pathlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import stopgrad_math


def _modules(namespace):
    """Every module of stopgrad_math.<namespace>, so that a module added there has its examples run."""
    folder = pathlib.Path(stopgrad_math.__file__).parent / namespace
    return [f"stopgrad_math.{namespace}.{info.name}" for info in pkgutil.iter_modules([str(folder)])]


TF_MODULES = _modules("tensorflow") + _modules("shared")  # shared: pure Python, run with TensorFlow's names
JAX_MODULES = _modules("jax")
TORCH_MODULES = _modules("torch")
KERAS_MODULES = _modules("keras")


def _run_examples(name, globs):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    with open(module.__file__) as source:
        assert result.attempted >= source.read().count(">>> ")


@pytest.mark.parametrize("name", TF_MODULES)
def test_docstring_examples(name):
    _run_examples(name, {"tf": tf, "np": np, **{n: getattr(stopgrad_math, n) for n in stopgrad_math.__all__}})


@pytest.mark.parametrize("name", JAX_MODULES)
def test_jax_docstring_examples(name):
    jax = pytest.importorskip("jax")
    import stopgrad_math.jax as sgm_jax

    _run_examples(name, {"jax": jax, "jnp": jax.numpy, "np": np, **{n: getattr(sgm_jax, n) for n in sgm_jax.__all__}})


@pytest.mark.parametrize("name", TORCH_MODULES)
def test_torch_docstring_examples(name):
    torch = pytest.importorskip("torch")
    import stopgrad_math.torch as sgm_torch

    _run_examples(name, {"torch": torch, "np": np, **{n: getattr(sgm_torch, n) for n in sgm_torch.__all__}})


@pytest.mark.parametrize("name", KERAS_MODULES)
def test_keras_docstring_examples(name):  # on the backend of this process, TensorFlow unless KERAS_BACKEND says
    keras = pytest.importorskip("keras")
    import stopgrad_math.keras as sgm_keras

    _run_examples(name, {"keras": keras, "np": np, **{n: getattr(sgm_keras, n) for n in sgm_keras.__all__}})


def test_every_namespace_has_modules_with_examples():
    assert len(TF_MODULES) > 20 and len(JAX_MODULES) > 8 and len(TORCH_MODULES) >= 6 and len(KERAS_MODULES) >= 3


def test_custom_gradients_docstring_is_what_a_call_needs_and_links_to_the_rest():
    """Both forms and one example each, at most about 40 lines; the contract in full is a docs page."""
    doc = stopgrad_math.custom_gradient.__doc__
    assert len(doc.strip().splitlines()) <= 45
    assert "(custom_gradient.md)" in doc
