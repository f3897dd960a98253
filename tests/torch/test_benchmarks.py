"""The PyTorch rows of the speed suite (log1pexp, and real code's Functions): every implementation computes the same
numbers, in every phase."""

import pytest

torch = pytest.importorskip("torch")
import torch_implicit  # noqa: E402
import torch_real_code  # noqa: E402
import torch_run  # noqa: E402
from torch_modes import fresh_compilation  # noqa: E402


@pytest.mark.parametrize("phase", torch_run.PHASES)
def test_every_implementation_matches_plain_autodiff_of_softplus(phase, monkeypatch):
    """The ratios compare mechanisms only if every implementation computes the same value and derivative (compiled
    by Inductor, as the suite times them; compiled afresh: the report's run compiles the same code by aot_eager)."""
    fresh_compilation(monkeypatch)
    x = torch.linspace(-20.0, 100.0, torch_run.JACOBIAN_SIZE if phase == torch_run.JACFWD else 1000)
    want = torch_run.programs("plain autodiff (floor)", phase)(x)
    for name in torch_run.implementations(phase):
        for got, expected in zip(torch_run.programs(name, phase)(x), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6, msg=name)


def test_a_run_writes_its_report(tmp_path):
    assert torch_run.main(["--out", str(tmp_path), "--sizes", "100", "--blocks", "1", "--min-time", "0",
                           "--batch", "4", "--width", "8", "--compile-rounds", "1",
                           "--compile-backend", "aot_eager"]) == 0  # no kernels built: the report is under test
    text = (tmp_path / "latest-torch.md").read_text()
    assert "autograd.Function (anchor)" in text and "## compiled value+grad" in text
    assert "MLP step, first compiled call" in text and "f alone" in text
    assert "## vmap(grad), a batch of 64" in text and "## jacfwd, 16 elements" in text


@pytest.mark.parametrize("phase", torch_run.STEPS)
def test_every_implementation_takes_the_same_training_step(phase, monkeypatch):
    fresh_compilation(monkeypatch)
    x = torch.linspace(-3.0, 3.0, 32).reshape(4, 8)
    want = torch_run.step_programs("plain autodiff (floor)", phase, 8, "cpu")(x)
    for name in torch_run.IMPLEMENTATIONS:
        got = torch_run.step_programs(name, phase, 8, "cpu")(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------- real code's Functions (torch_real_code.py)


@pytest.mark.parametrize("case", list(torch_real_code._BODIES))
@pytest.mark.parametrize("phase", torch_real_code.PHASES)
def test_a_real_codes_port_computes_the_anchors_numbers(case, phase, monkeypatch):
    """The ratios compare mechanisms only if both classes compute the same value and gradients (compiled by
    aot_eager here: the numbers, not Inductor's kernels, are under test)."""
    fresh_compilation(monkeypatch)
    xs = torch_real_code.inputs(case, (4, 8), "cpu")
    results = [torch_real_code.program(function, phase, "aot_eager")(xs)
               for function in torch_real_code.classes(case).values()]
    for got, want in zip(*(r if isinstance(r, tuple) else (r,) for r in results), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_real_code_run_writes_its_report(tmp_path, monkeypatch):
    fresh_compilation(monkeypatch)
    assert torch_real_code.main(["--out", str(tmp_path), "--blocks", "1", "--min-time", "0", "--shapes", "small",
                                 "--compile-backend", "aot_eager"]) == 0
    text = (tmp_path / "latest-torch-real.md").read_text()
    assert "## compiled value+grad" in text and "| STE quantizer, learned scale |" in text


# ---------------------------------------------------------------- implicit functions (torch_implicit.py)


@pytest.mark.parametrize("phase", torch_implicit.PHASES)
def test_every_implicit_implementation_computes_the_unrolled_solvers_numbers(phase, monkeypatch):
    """The ratios compare implementations only if each computes the same value and derivative: the normal
    equations' autodiff (torchopt where installed: it is the bench extra's)."""
    fresh_compilation(monkeypatch)
    shape = (4, 8)
    lam = torch_implicit._problem(shape)[3]
    made = torch_implicit.implementations(shape)
    want = torch_implicit.program(made["autodiff, unrolled"], phase)(lam)
    for name, function in made.items():
        if name == "torchopt" and phase != "eager value+grad":
            continue
        got = torch_implicit.program(function, phase)(lam)
        for one, expected in zip(got if isinstance(got, tuple) else (got,),
                                 want if isinstance(want, tuple) else (want,), strict=True):
            torch.testing.assert_close(one, expected, rtol=1e-5, atol=1e-6, msg=name)


def test_an_implicit_run_writes_its_report(tmp_path, monkeypatch):
    fresh_compilation(monkeypatch)
    assert torch_implicit.main(["--out", str(tmp_path), "--blocks", "1", "--min-time", "0", "--shapes", "small",
                                "--phases", "eager value+grad", "eager jvp"]) == 0
    text = (tmp_path / "latest-torch-implicit.md").read_text()
    assert "## eager jvp" in text and "| ridge regression, dense | small |" in text and "÷ torchopt" in text
