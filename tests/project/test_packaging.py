"""The package as users get it: a wheel that builds without warnings and works installed, and `make test-oldest`
pinning exactly the oldest versions setup.cfg allows."""

import configparser
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lower_bounds() -> dict[str, str]:
    """The lower bound of each requirement, the frameworks' extras included."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    lines = "\n".join([config["options"]["install_requires"], extras["tf"], extras["jax"], extras["torch"],
                       extras["keras"], extras["pyro"]]).split("\n")
    requirements = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: s.version for r in requirements for s in r.specifier if s.operator == ">="}


def _oldest_pins() -> dict[str, str]:
    lines = (ROOT / ".ci" / "oldest.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: next(iter(r.specifier)).version for r in pins}


def test_the_oldest_environment_pins_every_lower_bound():
    lower = _lower_bounds()
    assert set(lower) == {"tensorflow", "tensorflow-probability", "tf-keras", "numpy", "jax", "torch", "keras",
                          "pyro-ppl"}
    pins = _oldest_pins()
    for name, version in lower.items():
        assert pins[name].startswith(version), (name, pins[name], version)


# The build backend's warnings (setuptools, distutils); pip's own "WARNING: Location ..." lines are about this
# machine's pip configuration, not the package.
BACKEND_WARNING = re.compile(r"warning:|[A-Za-z]Warning\b|[Dd]eprecat")


def test_the_wheel_builds_without_warnings_and_works_installed(tmp_path):
    # PYTHONDONTWRITEBYTECODE makes distutils warn that it skips byte-compiling: a warning about the shell.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    build = [sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(ROOT)]
    built = subprocess.run(build, capture_output=True, text=True, env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    warnings = [line for line in (built.stdout + built.stderr).splitlines() if BACKEND_WARNING.search(line)]
    assert warnings == []
    wheel = next((tmp_path / "dist").glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "stopgrad_math/py.typed" in names and not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    # Installed as a wheel (not editable) into a fresh virtual environment and run from elsewhere, so the
    # checkout's package cannot stand in for it. Its dependencies are this environment's (a .pth file names its
    # site-packages), rather than TensorFlow downloaded again; that folder's own .pth files, among them the
    # editable install's hook, are not read from there.
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    where = [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    site = pathlib.Path(subprocess.check_output(where, text=True).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, env=env, timeout=300)
    env = dict(env, TF_CPP_MIN_LOG_LEVEL="3")
    demo = subprocess.run([python, "-m", "stopgrad_math"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert demo.returncode == 0 and "OK:" in demo.stdout, demo.stderr[-2000:]
    check = ("import stopgrad_math, pathlib; assert pathlib.Path(stopgrad_math.__file__).is_relative_to(r'{site}'); "
             "[getattr(stopgrad_math, n) for n in stopgrad_math.__all__]; print(len(stopgrad_math.__all__))")
    imported = subprocess.run([python, "-c", check.format(site=site)], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert int(imported.stdout) == len(__import__("stopgrad_math").__all__)


def test_the_jax_torch_and_keras_namespaces_have_the_tensorflow_namespaces_names():
    """The __all__ lists are written out (the API reference reads them statically): this keeps them in step.
    values_only() is TensorFlow's alone (JAX has no tape to switch off: docs/jax.md); each framework's drop-in for
    its own mechanism is its own (stopgrad_math.jax.custom_vjp, stopgrad_math.torch.Function); linear_solve is
    JAX's alone (jax.lax.custom_linear_solve) until TensorFlow and PyTorch have a solve declared linear (issue
    78)."""
    import stopgrad_math
    import stopgrad_math.jax
    import stopgrad_math.keras
    import stopgrad_math.tensorflow
    import stopgrad_math.torch

    shared = set(stopgrad_math.__all__) - {"values_only"}
    assert set(stopgrad_math.jax.__all__) == shared | {"custom_vjp", "linear_solve"}
    assert set(stopgrad_math.torch.__all__) == shared | {"Function"}
    assert set(stopgrad_math.keras.__all__) == shared
    assert stopgrad_math.__all__ == stopgrad_math.tensorflow.__all__  # the lazy namespace is the TensorFlow one
