"""Shared test set-up: two logical CPUs, the hypothesis profile, the mode fixture."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Inductor compiles in the process that asks, not in a pool of compile workers (set before PyTorch is imported; the
# tests' own subprocesses inherit it). On a machine with more cores than this one the pool is started, and its
# shutdown at a process's exit is known to wait or hang (pytorch/pytorch#162199, fixed after torch 2.6): stop
# 67's CI ran past its 90 minutes at the end of make test-oldest, every test passed and the run not ended.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import importlib.abc
import importlib.util
import sys

import case_sample
import pytest
from hypothesis import HealthCheck, settings
from mode_names import MODES


def _two_logical_cpus(tf) -> None:
    """MirroredStrategy tests need two devices; logical devices can only be set up before TensorFlow initialises
    its runtime, so this happens as TensorFlow is imported."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


class _OnTensorFlowImport(importlib.abc.MetaPathFinder):
    """Sets up the logical CPUs when a test first imports TensorFlow, rather than here: a process that runs only
    PyTorch or JAX tests (a mutant's run, most of which is imports) does not pay TensorFlow's import."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_package = spec.loader.exec_module

        def run_and_set_up(module) -> None:
            run_package(module)
            _two_logical_cpus(module)

        spec.loader.exec_module = run_and_set_up
        return spec


if "tensorflow" in sys.modules:
    _two_logical_cpus(sys.modules["tensorflow"])
else:
    sys.meta_path.insert(0, _OnTensorFlowImport())


settings.register_profile(
    "project",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# make test runs every case; the runs on other framework versions a sample of each file's test functions and of
# their cases (case_sample.py), and a k-th of hypothesis's examples (at least 10).
_EVERY, _OFFSET, _EVERY_FUNCTION = case_sample.parsed(os.environ.get(case_sample.ENVIRONMENT))
settings.register_profile("sampled", parent=settings.get_profile("project"), max_examples=max(40 // _EVERY, 10))
settings.load_profile("project" if _EVERY == 1 else "sampled")


def pytest_collection_modifyitems(config, items) -> None:
    if _EVERY == _EVERY_FUNCTION == 1:
        return
    keep = case_sample.kept([item.nodeid for item in items], _EVERY, _OFFSET, _EVERY_FUNCTION)
    config.hook.pytest_deselected(items=[item for item, k in zip(items, keep, strict=True) if not k])
    items[:] = [item for item, k in zip(items, keep, strict=True) if k]


if os.environ.get("STOPGRAD_MUTANT"):  # make test-mutants: one deliberately broken variant (tests/mutants.py)
    import mutants

    mutants.apply(os.environ["STOPGRAD_MUTANT"])


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def float64():
    """JAX with float64 (off by default), for this test only."""
    import jax

    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)
