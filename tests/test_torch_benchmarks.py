"""The PyTorch rows of the speed suite: every implementation computes the same numbers, in every phase."""

import pytest

torch = pytest.importorskip("torch")
import torch_run  # noqa: E402


@pytest.mark.parametrize("phase", torch_run.PHASES)
def test_every_implementation_matches_plain_autodiff_of_softplus(phase):
    """The ratios compare mechanisms only if every implementation computes the same value and derivative."""
    x = torch.linspace(-20.0, 100.0, 1000)
    want = torch_run.programs("plain autodiff (floor)", phase)(x)
    for name in torch_run.IMPLEMENTATIONS:
        for got, expected in zip(torch_run.programs(name, phase)(x), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6, msg=name)


def test_a_run_writes_its_report(tmp_path):
    assert torch_run.main(["--out", str(tmp_path), "--sizes", "100", "--blocks", "1", "--min-time", "0"]) == 0
    text = (tmp_path / "latest-torch.md").read_text()
    assert "autograd.Function (anchor)" in text and "## compiled value+grad" in text
