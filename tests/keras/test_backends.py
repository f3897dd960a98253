"""stopgrad_math.keras on Keras 3's three backends: keras_cases.py and keras_checkpointing_cases.py in one process
per backend (Keras reads KERAS_BACKEND once, when it is imported), each skipped, with its reason, where its
framework is not installed; and what the namespace imports."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("keras")

CASES = ["keras_cases.py", "keras_checkpointing_cases.py"]
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


@pytest.mark.parametrize("cases", CASES)
@pytest.mark.parametrize("backend", FRAMEWORK)
def test_the_keras_namespace_on_each_backend(backend, cases):
    if importlib.util.find_spec(FRAMEWORK[backend]) is None:
        pytest.skip(f"{FRAMEWORK[backend]} is not installed, so Keras has no {backend} backend here")
    environment = {**os.environ, "KERAS_BACKEND": backend}
    stop_at_the_first = ["-x"] if os.environ.get("STOPGRAD_MUTANT") else []  # a mutant's run, as mutants.py's own
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *stop_at_the_first,
               str(pathlib.Path(__file__).with_name(cases))]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout


def test_importing_the_keras_namespace_imports_no_framework_until_a_call():
    """Keras and the backend's namespace are imported when a name is first called, so importing
    stopgrad_math.keras imports no framework."""
    code = ("import sys, stopgrad_math.keras; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'keras', 'jax', 'tensorflow', 'torch', 'stopgrad_math'}))")
    environment = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['stopgrad_math']"
