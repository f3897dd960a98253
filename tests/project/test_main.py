"""python -m stopgrad_math: one demonstration table per installed framework, and its exit status."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from stopgrad_math import __main__ as demo

AT_100 = demo.POINTS.index(100.0)


@pytest.mark.parametrize("framework", list(demo.FRAMEWORKS))
def test_each_framework_naive_is_nan_at_100_and_stopgrad_math_is_exact(framework):
    columns = demo.FRAMEWORKS[framework][2](demo.POINTS)
    naive_value, naive_grad = columns["naive"]
    ours_value, ours_grad = columns["stopgrad_math"]
    assert np.isinf(naive_value[AT_100]) and np.isnan(naive_grad[AT_100])
    assert ours_grad[AT_100] == 1.0 and ours_value[AT_100] == 100.0
    x = np.array(demo.POINTS, np.float64)  # the truth, written here: softplus and sigmoid in float64
    np.testing.assert_array_equal(ours_grad, (1 / (1 + np.exp(-x))).astype(np.float32))
    np.testing.assert_array_equal(ours_value, np.logaddexp(0, x).astype(np.float32))


def test_main_fails_when_one_framework_has_a_wrong_gradient(monkeypatch, capsys):
    assert demo.main() == 0
    module, namespace, columns_of = demo.FRAMEWORKS["JAX"]

    def doubled(points):
        columns = columns_of(points)
        value, gradient = columns["stopgrad_math"]
        return {**columns, "stopgrad_math": (value, 2 * gradient)}

    monkeypatch.setitem(demo.FRAMEWORKS, "JAX", (module, namespace, doubled))
    assert demo.main() == 1
    out = capsys.readouterr().out
    assert "FAIL: stopgrad_math.jax differs" in out and "OK: stopgrad_math matches" in out


def test_main_shows_only_what_is_installed(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    hidden = ("jax", "torch")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else find_spec(name, *a))
    assert demo.installed() == ["TensorFlow"]
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "JAX (" not in out and "PyTorch (" not in out and "Not installed, so not shown: JAX, PyTorch." in out
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert demo.main() == 2
    assert "No framework is installed" in capsys.readouterr().out


def test_module_runs_as_a_program_and_shows_every_installed_framework():
    result = subprocess.run([sys.executable, "-m", "stopgrad_math"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "OK: stopgrad_math matches" in result.stdout and "OK: stopgrad_math.jax matches" in result.stdout
    assert "OK: stopgrad_math.torch matches" in result.stdout
