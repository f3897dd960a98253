"""The JAX namespace under JAX's distributed engines (jit with NamedSharding, shard_map, pmap, and Keras's
DataParallel on JAX), on 8 simulated CPU devices: jax_distributed_cases.py in a process of its own, since JAX
reads XLA_FLAGS once (and Keras KERAS_BACKEND)."""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("jax")

CASES = pathlib.Path(__file__).with_name("jax_distributed_cases.py")


def test_the_jax_namespace_on_8_simulated_devices():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    environment = {**os.environ, "XLA_FLAGS": flags, "KERAS_BACKEND": "jax"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(CASES)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-6000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout and " failed" not in result.stdout
