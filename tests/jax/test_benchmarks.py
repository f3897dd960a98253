"""The JAX rows of the speed suite (log1pexp, and real code's custom VJPs): every implementation computes the same
numbers, and a run writes its report."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import jax_implicit  # noqa: E402
import jax_real_code  # noqa: E402
import jax_run  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("phase", jax_run.PHASES)
def test_every_implementation_matches_plain_autodiff_of_softplus(phase):
    """The ratios compare mechanisms only if every implementation computes the same value and derivative."""
    x = jnp.linspace(-20.0, 100.0, 1000)
    want = jax_run.programs(jax_run.IMPLEMENTATIONS["plain autodiff (floor)"], phase)(x)
    for name, fn in jax_run.IMPLEMENTATIONS.items():
        if phase == "jvp" and name in jax_run.NO_JVP:
            with pytest.raises(TypeError, match="forward-mode"):
                jax_run.programs(fn, phase)(x)
            continue
        for got, expected in zip(jax_run.programs(fn, phase)(x), want, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_kernels_counts_the_kernels_of_the_entry_computation():
    x = jnp.ones(1000)
    assert jax_run.kernels(jax.jit(lambda x: x * 2.0), x) == 1
    assert jax_run.kernels(jax.jit(lambda x: (jnp.sum(x), jnp.sort(x))), x) >= 2


@pytest.mark.parametrize("phase", jax_run.JITTED)
@pytest.mark.parametrize("n", [1_000, 1_000_000])
def test_both_forms_compile_to_no_more_kernels_than_custom_jvp(phase, n):
    """The identity's value never reads gx, so XLA computes gx once, for the derivative alone: as many kernels in
    the optimized HLO as jax.custom_jvp (a value that read gx made it 5 against 3 for value + gradient)."""
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    anchor = jax_run.kernels(jax_run.programs(jax_run.IMPLEMENTATIONS[jax_run.ANCHOR], phase), x)
    for name in ("identity form", "decorator"):
        assert jax_run.kernels(jax_run.programs(jax_run.IMPLEMENTATIONS[name], phase), x) <= anchor, name


def test_run_writes_the_table(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "jax_run.py"), "--out", str(tmp_path), "--sizes", "100",
               "--blocks", "2", "--min-time", "0.01"]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    text = (tmp_path / "latest-jax.md").read_text()
    assert "## value+grad" in text and "## jvp" in text and "## eager value+grad" in text
    assert "| jax.custom_vjp | n/a (no forward mode) |" in text
    assert "| jax.custom_jvp (anchor) | " in text and "1.00×" in text


# ---------------------------------------------------------------- real code's custom VJPs (jax_real_code.py)


@pytest.mark.parametrize("case", list(jax_real_code.RULES))
@pytest.mark.parametrize("phase", jax_real_code.PHASES)
def test_a_real_codes_port_computes_the_anchors_numbers(case, phase):
    """The ratios compare mechanisms only if both compute the same value and gradients."""
    xs = jax_real_code.inputs(case, (4, 8))
    results = [jax_real_code.program(function, phase, len(xs))(*xs)
               for function in jax_real_code.functions(case).values()]
    for got, want in zip(*(jax.tree_util.tree_leaves(r) for r in results), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_real_code_run_writes_its_report(tmp_path):
    assert jax_real_code.main(["--out", str(tmp_path), "--blocks", "1", "--min-time", "0", "--shapes", "small",
                               "--cases", "safe norm", "sparsemax"]) == 0
    text = (tmp_path / "latest-jax-real.md").read_text()
    assert "## jit value+grad" in text and "| sparsemax |" in text and "## eager, no derivative" in text


# ---------------------------------------------------------------- implicit functions (jax_implicit.py)


@pytest.mark.parametrize("case", jax_implicit.CASES)
@pytest.mark.parametrize("phase", jax_implicit.PHASES)
def test_every_implicit_implementation_computes_the_unrolled_solvers_numbers(case, phase):
    """The ratios compare implementations only if each computes the same value and derivative: the unrolled
    solver's, converged (jaxopt and optimistix where installed: they are the bench extra's)."""
    shape = (4, 8)
    theta = jax_implicit._problem(case, shape)[3]
    made = jax_implicit.implementations(case, shape)
    want = jax_implicit.program(made["autodiff, unrolled"], phase)(theta)
    for name, function in made.items():
        if name == "jaxopt" and "jvp" in phase:
            continue
        for got, expected in zip(jax.tree_util.tree_leaves(jax_implicit.program(function, phase)(theta)),
                                 jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-4, err_msg=name)


def test_an_implicit_run_writes_its_report(tmp_path):
    assert jax_implicit.main(["--out", str(tmp_path), "--blocks", "1", "--min-time", "0", "--shapes", "small",
                              "--phases", "jit value+grad", "jit jvp"]) == 0
    text = (tmp_path / "latest-jax-implicit.md").read_text()
    assert "## jit jvp" in text and "| fixed point, GMRES | small |" in text and "÷ jaxopt" in text
