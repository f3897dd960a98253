"""The speed suite: its implementations compute the same numbers (the cases of `run.py`, and real code's custom
gradients in `tf_real_code.py`), its target checks read the rows right, and each script writes its report."""

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
import tf_real_code

PLAIN = "plain autodiff (floor)"
ROOT = pathlib.Path(__file__).resolve().parents[2]


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

    times maps (implementation, phase) to seconds, phase being forward, value+grad or report.VALUES_ONLY.
    """
    rows = []
    for case in cases.CASES:
        implementations, _ = _setup(case, 1)
        for n in (1, 10**5):
            for mode in run.MODES:
                for name in implementations:
                    row = {"case": case.name, "n": n, "implementation": name, "mode": mode,
                           "peak_bytes": 2**20 if n == 10**5 else None}
                    served = name in (*report.SERVED, report.PLAIN) and mode != "eager"
                    phases = report.PHASES + ((report.VALUES_ONLY,) if served else ())
                    row.update({phase: times.get((name, phase), 1.0) for phase in phases})
                    if name == report.DECORATOR and mode == "eager":
                        row["undecorated_forward"] = 1.0
                    rows.append(row)
    return rows


def _targets(rows: list[dict], baseline: list[dict] | None = None) -> list[str]:
    text = report.markdown(rows, cases.CASES, "test device", bandwidth=1e10, tf_version="x", baseline=baseline)
    return [line for line in text.splitlines() if line.startswith("- **")]


LABELS = ("identity, log1pexp_exp, eager", "decorator, log1pexp_exp, eager", "faster than tfp", "baseline",
          "values_only", "undecorated f", "order=2")


def test_report_says_met_when_every_target_holds():
    fast = {(report.IDENTITY, phase): 0.5 for phase in report.PHASES}
    rows = _rows(fast)
    targets = _targets(rows, baseline=rows)
    assert len(targets) == len(LABELS)
    for line, label in zip(targets, LABELS, strict=True):
        assert label in line and line.endswith(": met."), line


def test_report_counts_each_missed_cell():
    slow = {(report.IDENTITY, "forward"): 0.5, (report.IDENTITY, "value+grad"): 1.2,
            (report.DECORATOR, "value+grad"): 1.8, (report.DECORATOR, "forward"): 1.1,
            (report.DECORATOR, report.VALUES_ONLY): 1.06}
    targets = _targets(_rows(slow), baseline=_rows({}))
    assert "NOT met in 1 of 1 cells" in targets[0]  # identity 1.2x > 1.15x at n = 1, eager, worst case
    assert "NOT met in 1 of 1 cells" in targets[1]  # decorator 1.8x > 1.75x
    # Identity vs tfp in eager: value+grad slower in 3 cases with both (2 sizes each) of 6 cells x 2 phases.
    assert "NOT met in 6 of 12 cells" in targets[2]
    # Against a baseline of 1 s everywhere, graph modes: value+grad 1.2x (identity, 3 cases) and 1.8x (decorator,
    # 6 cases), 2 sizes and 2 modes each, of 14 implementations of ours x 2 sizes x 2 modes x 2 phases.
    assert "NOT met in 36 of 112 cells" in targets[3] and "1.80× now, 1.00× before" in "\n".join(_report_lines(slow))
    # values_only at the largest n, function and XLA: the decorator (6 cases) at 1.06x of plain f; identity (3) not.
    assert "NOT met in 12 of 18 cells" in targets[4]
    assert "NOT met in 12 of 12 cells" in targets[5]  # forward 1.1x the undecorated f, every eager cell
    assert targets[6].endswith(": met.")  # order=2 (1 s) against a 1.8 s order=1


def _report_lines(times: dict) -> list[str]:
    return report.markdown(_rows(times), cases.CASES, "d", 1e10, "x", baseline=_rows({})).splitlines()


def test_report_counts_order_two_cells_slower_than_order_one():
    targets = _targets(_rows({(cases.ORDER_2, "value+grad"): 1.1}))
    assert "order=2" in targets[6] and "NOT met in 24 of 24 cells" in targets[6]  # 4 cases x 2 sizes x 3 modes


def test_report_says_when_there_is_no_baseline_and_no_gpu():
    text = report.markdown(_rows({}), cases.CASES, "d", 1e10, "x")
    assert "no baseline rows to compare with" in text and "No GPU was available" in text


def test_run_writes_tables_plot_and_rows(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--sizes", "1", "--min-time", "0",
               "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    text = (tmp_path / "latest.md").read_text()
    for case in cases.CASES:
        assert f"## {case.name}" in text
    assert text.count("- **") == len(LABELS)
    rows = json.loads((tmp_path / "latest.json").read_text())["rows"]
    expected = sum(len(case.setup(1)[0]) for case in cases.CASES) * len(run.MODES)
    assert len(rows) == expected
    assert all(row["forward"] > 0 and row["value+grad"] > 0 and row["peak_bytes"] >= 0 for row in rows)
    served = [row for row in rows if row["implementation"] in (*report.SERVED, report.PLAIN) and row["mode"] != "eager"]
    assert served and all(row[report.VALUES_ONLY] > 0 for row in served)
    assert (tmp_path / "latest.png").stat().st_size > 10_000


# ---------------------------------------------------------------- real code's custom gradients (tf_real_code.py)


@pytest.mark.parametrize("case", list(tf_real_code.RULES))
@pytest.mark.parametrize("phase", tf_real_code.PHASES)
def test_a_real_codes_port_computes_the_anchors_numbers(case, phase):
    """The ratios compare mechanisms only if both compute the same value and gradients."""
    xs = tf_real_code.inputs(case, (4, 8))
    results = [tf_real_code.program(function, phase)(*xs) for function in tf_real_code.functions(case).values()]
    for got, want in zip(*(tf.nest.flatten(r) for r in results), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_real_code_run_writes_its_report(tmp_path):
    assert tf_real_code.main(["--out", str(tmp_path), "--blocks", "1", "--min-time", "0", "--shapes", "small",
                              "--cases", "safe norm", "sparsemax"]) == 0
    text = (tmp_path / "latest-tf-real.md").read_text()
    assert "## tf.function value+grad" in text and "| sparsemax |" in text and "## eager, no tape" in text
