"""Two logical CPUs for the MirroredStrategy tests, set up as TensorFlow is imported: logical devices can only be
set up before TensorFlow initialises its runtime. Importing this module sets them up: every test process imports
it (conftest.py), and so does a TensorFlow case run in a process of its own (tfp_distributed_cases.py)."""

import importlib.abc
import importlib.util
import sys


def _two_logical_cpus(tf) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


class _OnTensorFlowImport(importlib.abc.MetaPathFinder):
    """Sets up the logical CPUs when a test first imports TensorFlow, rather than at once: a process that runs only
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
