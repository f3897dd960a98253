"""The examples in the package's docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import stopgrad_math

MODULES = [
    info.name for info in pkgutil.iter_modules(stopgrad_math.__path__, "stopgrad_math.") if "__main__" not in info.name
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    globs = {"tf": tf, "np": np, **{n: getattr(stopgrad_math, n) for n in stopgrad_math.__all__}}
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    with open(module.__file__) as source:
        assert result.attempted >= source.read().count(">>> ")


def test_custom_gradients_docstring_is_what_a_call_needs_and_links_to_the_rest():
    """Both forms and one example each, at most about 40 lines; the contract in full is a docs page."""
    doc = stopgrad_math.custom_gradient.__doc__
    assert len(doc.strip().splitlines()) <= 45
    assert "(custom_gradient.md)" in doc
