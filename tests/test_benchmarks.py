"""The speed suite: its implementations compute the same numbers, its target checks
read the rows right, and `python benchmarks/run.py` writes a whole report."""

import json
import pathlib
import subprocess
import sys

import cases
import numpy as np
import pytest
import report
import run
import tensorflow as tf

PLAIN = "plain autodiff (floor)"
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _setup(case, n):
    """A case's implementations and input; the embedding table at 1e4 rows, not the suite's 1e6."""
    return cases.embedding_setup(n, rows=10**4) if case is cases.EMBEDDING else case.setup(n)


def _parts(gradient):
    """A gradient as arrays to compare: an IndexedSlices as its values and indices, which must stay sparse."""
    if isinstance(gradient, tf.IndexedSlices):
        return [gradient.values, gradient.indices]
    return [gradient]


@pytest.mark.parametrize("mode", run.MODES)
@pytest.mark.parametrize("case", cases.CASES, ids=lambda case: case.name)
def test_every_implementation_matches_plain_autodiff(case, mode):
    """The timings compare mechanisms only if every implementation computes the same
    value and gradient; plain autodiff of the stable formula is the truth."""
    implementations, x = _setup(case, 1000)
    want_value, want_gradient = run.compiled(lambda x: run.value_and_grad(implementations[PLAIN], x), mode)(x)
    for name, fn in implementations.items():
        value, gradient = run.compiled(lambda x, fn=fn: run.value_and_grad(fn, x), mode)(x)
        np.testing.assert_allclose(value, want_value, rtol=1e-6, err_msg=name)
        assert type(gradient) is type(want_gradient), name
        for got, want in zip(_parts(gradient), _parts(want_gradient), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def _rows(times: dict) -> list[dict]:
    """Synthetic rows for every case, size and mode: 1 s each unless `times` says otherwise.

    times maps (implementation, phase) to seconds, phase being forward or value+grad.
    """
    rows = []
    for case in cases.CASES:
        implementations, _ = _setup(case, 1)
        for n in (1, 10**5):
            for mode in run.MODES:
                for name in implementations:
                    row = {"case": case.name, "n": n, "implementation": name, "mode": mode,
                           "peak_bytes": 2**20 if n == 10**5 else None}
                    row.update({phase: times.get((name, phase), 1.0) for phase in report.PHASES})
                    if name == report.DECORATOR and mode == "eager":
                        row["undecorated_forward"] = 1.0
                    rows.append(row)
    return rows


def _targets(rows: list[dict]) -> list[str]:
    text = report.markdown(rows, cases.CASES, "test device", bandwidth=1e10, tf_version="x")
    return [line for line in text.splitlines() if line.startswith("- **")]


def test_report_says_met_when_every_target_holds():
    fast = {(report.IDENTITY, phase): 0.5 for phase in report.PHASES}
    targets = _targets(_rows(fast))
    assert len(targets) == 5
    assert all(line.endswith(": met.") for line in targets), targets


def test_report_counts_each_missed_cell():
    slow = {(report.IDENTITY, "forward"): 0.5, (report.IDENTITY, "value+grad"): 1.2,
            (report.DECORATOR, "value+grad"): 1.2, (report.DECORATOR, "forward"): 1.1}
    targets = _targets(_rows(slow))
    # Identity vs tfp: value+grad is slower in 2 cases x 2 sizes x 3 modes of the 24 identity cells x 2 phases.
    assert "NOT met in 12 of 24 cells" in targets[0]
    # Within 1.05x at n >= 1e5, graph modes: identity (2 cases) and decorator (4 cases), 2 modes each, all 1.2x.
    assert "NOT met in 12 of 12 cells" in targets[1]
    assert "within 1.3×" in targets[2] and targets[2].endswith(": met.")
    # Nothing watching: the decorator's forward is 1.1x the undecorated f in every eager cell.
    assert "NOT met in 8 of 8 cells" in targets[3]
    # order=2 (1 s) against a 1.2 s order=1: within 1.05x everywhere.
    assert targets[4].endswith(": met.")


def test_report_counts_order_two_cells_slower_than_order_one():
    targets = _targets(_rows({(cases.ORDER_2, "value+grad"): 1.1}))
    assert "order=2" in targets[4] and "NOT met in 12 of 12 cells" in targets[4]  # 2 cases x 2 sizes x 3 modes


def test_run_writes_tables_plot_and_rows(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--sizes", "1", "--min-time", "0",
               "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    text = (tmp_path / "latest.md").read_text()
    for case in cases.CASES:
        assert f"## {case.name}" in text
    assert text.count("- **") == 5
    rows = json.loads((tmp_path / "latest.json").read_text())["rows"]
    expected = sum(len(case.setup(1)[0]) for case in cases.CASES) * len(run.MODES)
    assert len(rows) == expected
    assert all(row["forward"] > 0 and row["value+grad"] > 0 and row["peak_bytes"] >= 0 for row in rows)
    assert (tmp_path / "latest.png").stat().st_size > 10_000
