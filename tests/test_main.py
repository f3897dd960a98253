"""python -m stopgrad_math: the demonstration table and its exit status."""

import subprocess
import sys

import numpy as np

from stopgrad_math import __main__ as demo


def test_table_naive_is_nan_at_100_and_stopgrad_math_is_exact():
    columns = demo.table()
    at_100 = demo.POINTS.index(100.0)
    naive_value, naive_grad = columns["naive"]
    ours_value, ours_grad = columns["stopgrad_math"]
    assert np.isinf(naive_value[at_100]) and np.isnan(naive_grad[at_100])
    assert ours_grad[at_100] == 1.0 and ours_value[at_100] == 100.0
    x = np.array(demo.POINTS, np.float64)
    np.testing.assert_array_equal(ours_grad, (1 / (1 + np.exp(-x))).astype(np.float32))
    np.testing.assert_array_equal(ours_value, np.logaddexp(0, x).astype(np.float32))


def test_main_fails_when_a_gradient_is_wrong(monkeypatch, capsys):
    assert demo.main() == 0
    right = demo.stable_log1pexp
    monkeypatch.setattr(demo, "stable_log1pexp", lambda x: 2 * right(x) - demo.tf.stop_gradient(right(x)))
    assert demo.main() == 1
    assert "FAIL" in capsys.readouterr().out


def test_module_runs_as_a_program():
    result = subprocess.run([sys.executable, "-m", "stopgrad_math"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "OK: stopgrad_math matches" in result.stdout
