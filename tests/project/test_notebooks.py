"""Every notebook runs top to bottom with a real Jupyter kernel; an error in any cell fails.

The notebooks check their own numbers with assertions in their cells, so
running them is a test of what they claim.
"""

import pathlib
import re
import time

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.version import Version

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} >= {"log1pexp.ipynb", "known_gradients_in_tfp.ipynb", "estimators.ipynb",
                                           "log1pexp_on_jax.ipynb", "log1pexp_on_torch.ipynb",
                                           "implicit_reparameterization.ipynb"}


PLOTS = re.compile(r"\b(plt|axes\[\d\]|ax)\.(plot|semilogx|semilogy|loglog|hist|errorbar|scatter|bar)\(")


def test_every_cell_that_plots_checks_what_it_plots():
    """The README's claim: a cell that draws numbers also asserts them, so a plot is never the only check."""
    unchecked = [f"{path.name} cell {i}" for path in NOTEBOOKS
                 for i, cell in enumerate(nbformat.read(path, as_version=4).cells)
                 if cell.cell_type == "code" and PLOTS.search(cell.source) and "assert" not in cell.source]
    assert unchecked == []


def _runnable(path):
    """The JAX notebook shows TFP's JAX substrate, which imports with JAX 0.4.35 to 0.6.2 only: it runs in
    make test-oldest, and is skipped, saying so, on a newer JAX."""
    if path.stem != "log1pexp_on_jax":
        return path
    jax = pytest.importorskip("jax")
    newer = Version(jax.__version__) >= Version("0.7")
    reason = f"TFP 0.25's JAX substrate does not import with JAX {jax.__version__}: run in make test-oldest"
    return pytest.param(path, marks=pytest.mark.skipif(newer, reason=reason))


@pytest.mark.parametrize("path", [_runnable(p) for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_runs(path):
    notebook = nbformat.read(path, as_version=4)
    saved = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in saved), "commit notebooks with their outputs and plots"
    start = time.monotonic()
    resources = {"metadata": {"path": str(path.parent)}}
    NotebookClient(notebook, timeout=60, kernel_name="python3", resources=resources).execute()
    print(f"{path.name}: {time.monotonic() - start:.1f} s")
