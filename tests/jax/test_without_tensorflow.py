"""stopgrad_math.jax works where TensorFlow is not installed, and never imports it where it is."""

import subprocess
import sys

import pytest

pytest.importorskip("jax")

# TensorFlow made uninstallable for the child process: an import of it raises ModuleNotFoundError, as where it
# was never installed.
NO_TENSORFLOW = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_probability", "tf_keras", "keras"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TENSORFLOW + code], capture_output=True, text=True, timeout=300)


def test_the_jax_namespace_works_without_tensorflow():
    result = _run("""
import jax, jax.numpy as jnp
import stopgrad_math.jax as sgm
f = lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x)
print(float(jax.jvp(f, (jnp.array(100.0),), (jnp.array(1.0),))[1]))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tf_keras", "keras")))
""")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1.0", "[]"]


def test_the_tensorflow_namespace_without_tensorflow_says_what_to_install():
    result = _run("import stopgrad_math\nstopgrad_math.custom_gradient")
    assert result.returncode != 0
    assert "pip install 'stopgrad_math[tf]'" in result.stderr and "stopgrad_math.jax" in result.stderr


def test_importing_the_jax_namespace_leaves_tensorflow_unimported_where_it_is_installed():
    code = "import sys, stopgrad_math.jax; print([m for m in sys.modules if m.startswith('tensorflow')])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert result.stdout.strip() == "[]"
