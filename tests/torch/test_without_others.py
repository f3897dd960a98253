"""stopgrad_math.torch works where neither TensorFlow nor JAX is installed, and imports neither where they are."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")

# TensorFlow, Keras and JAX hidden from the child process's path finder, as where they were never installed: an
# import raises ModuleNotFoundError and importlib.util.find_spec answers None (torch.compile asks it).
NOT_INSTALLED = """
import importlib.abc, importlib.machinery, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_probability", "tf_keras", "keras", "jax", "jaxlib"):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path = [NotInstalled() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""
OTHERS = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib")


def test_the_torch_namespace_works_without_tensorflow_and_jax():
    code = NOT_INSTALLED + f"""
import torch
import stopgrad_math.torch as sgm
f = lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)
print(float(torch.func.jvp(f, (torch.tensor(100.0),), (torch.tensor(1.0),))[1]))
print(float(torch.compile(torch.func.grad(f), fullgraph=True)(torch.tensor(100.0))))
try:
    import tensorflow
except ModuleNotFoundError:
    print("hidden")
print(sorted(m for m in sys.modules if m.split(".")[0] in {OTHERS}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1.0", "1.0", "hidden", "[]"]


def test_importing_the_torch_namespace_leaves_tensorflow_and_jax_unimported_where_they_are_installed():
    code = f"import sys, stopgrad_math.torch; print(sorted(m for m in sys.modules if m.split('.')[0] in {OTHERS}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
