"""Tables, target checks and the plot for the benchmark results."""

from __future__ import annotations

import datetime
import pathlib

from cases import ANCHOR, ORDER_2

IDENTITY, DECORATOR, TFP, PLAIN = (
    "stopgrad_math identity", "stopgrad_math decorator", "tfp.math.custom_gradient", "plain autodiff (floor)")
PHASES = ("forward", "value+grad")
VALUES_ONLY = "forward, values_only"  # forward only, traced inside values_only()
SERVED = (IDENTITY, DECORATOR)  # timed under values_only() too
WORST_CASE = "log1pexp_exp"  # the cheapest gradient: the mechanism's own cost shows most
EAGER_BARS = {IDENTITY: 1.15, DECORATOR: 1.75}
NOISE = 1.10  # run-to-run spread of a ratio to the anchor on a shared machine


def _index(rows):
    return {(r["case"], r["n"], r["implementation"], r["mode"]): r for r in rows}


def _ratio(index, row, phase):
    anchor = index.get((row["case"], row["n"], ANCHOR, row["mode"]))
    return row[phase] / anchor[phase] if anchor else None


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def _largest_n(rows, case: str) -> int:
    return max(r["n"] for r in rows if r["case"] == case)


def _table(rows, index, case, phase) -> list[str]:
    sizes = sorted({r["n"] for r in rows if r["case"] == case.name})
    lines = ["| implementation | mode | " + " | ".join(f"n = {n:g}" for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    names = list(dict.fromkeys(r["implementation"] for r in rows if r["case"] == case.name))
    for name in names:
        for mode in ("eager", "function", "xla"):
            cells = []
            for n in sizes:
                row = index[(case.name, n, name, mode)]
                cells.append(f"{_time(row[phase])} ({_ratio(index, row, phase):.2f}×)")
            lines.append(f"| {name} | {mode} | " + " | ".join(cells) + " |")
    return lines


def _memory_table(rows, index, case) -> list[str]:
    n = _largest_n(rows, case.name)
    lines = [f"Peak rise of TF's allocations during value + gradient at n = {n:g} (XLA's own CPU buffers not counted):",
             "",
             "| implementation | eager | function | xla |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["implementation"] for r in rows if r["case"] == case.name):
        cells = [index[(case.name, n, name, mode)]["peak_bytes"] for mode in ("eager", "function", "xla")]
        lines.append(f"| {name} | " + " | ".join(f"{b / 2**10:,.0f} KiB" for b in cells) + " |")
    return lines


def _check(label: str, failures: list[str], total: int) -> list[str]:
    verdict = "met" if not failures else f"NOT met in {len(failures)} of {total} cells"
    lines = [f"- **{label}**: {verdict}."]
    lines += [f"  - {f}" for f in failures[:12]]
    if len(failures) > 12:
        lines.append(f"  - … and {len(failures) - 12} more")
    return lines


def _cell(row, phase="value+grad") -> str:
    return f"{row['case']} n={row['n']:g} {row['mode']} {row['implementation']} {phase}"


def _eager_overhead(rows, index) -> list[str]:
    """The eager targets on the worst case at n = 1, where the Python around the ops is the cost."""
    lines = []
    for name, bar in EAGER_BARS.items():
        cells = [r for r in rows if r["case"] == WORST_CASE and r["n"] == 1 and r["mode"] == "eager"
                 and r["implementation"] == name]
        over = [f"{_cell(r)}: {_ratio(index, r, 'value+grad'):.3f}×" for r in cells
                if _ratio(index, r, "value+grad") > bar]
        lines += _check(f"{name}, {WORST_CASE}, eager, n = 1: value + gradient ≤ {bar}× of {ANCHOR}", over, len(cells))
    return lines


def _faster_than_tfp(rows, index) -> list[str]:
    cells = [(r, index.get((r["case"], r["n"], TFP, r["mode"]))) for r in rows
             if r["implementation"] == IDENTITY and r["mode"] == "eager"]
    slower = [f"{_cell(r, p)}: {r[p] / t[p]:.2f}× tfp" for r, t in cells if t for p in PHASES if r[p] >= t[p]]
    return _check("Identity form faster than tfp.math.custom_gradient in every eager cell", slower, 2 * len(cells))


def _no_slower_than_baseline(rows, index, baseline) -> list[str]:
    """Graph-mode cells of ours against the same cells of the baseline run, each as a ratio to its anchor."""
    label = f"No tf.function or XLA cell slower than the baseline (before issue 13) by more than noise ({NOISE}×)"
    if not baseline:
        return [f"- **{label}**: no baseline rows to compare with."]
    before = _index(baseline)
    over, total = [], 0
    for r in rows:
        old = before.get((r["case"], r["n"], r["implementation"], r["mode"]))
        if r["mode"] == "eager" or not r["implementation"].startswith("stopgrad_math") or old is None:
            continue
        for phase in PHASES:
            total += 1
            now, then = _ratio(index, r, phase), _ratio(before, old, phase)
            if now > NOISE * then:
                over.append(f"{_cell(r, phase)}: {now:.2f}× now, {then:.2f}× before")
    return _check(label, over, total)


def _idle_decorator(rows) -> list[str]:
    eager = [r for r in rows if r["implementation"] == DECORATOR and r["mode"] == "eager"]
    idle = [f"{r['case']} n={r['n']:g}: {r['forward'] / r['undecorated_forward']:.3f}×" for r in eager
            if r["forward"] > 1.05 * r["undecorated_forward"]]
    return _check("Decorator in eager within 1.05× of the undecorated f with nothing watching", idle, len(eager))


def _order_two(rows, index) -> list[str]:
    second = [(r, index[(r["case"], r["n"], DECORATOR, r["mode"])]) for r in rows if r["implementation"] == ORDER_2]
    costly = [f"{r['case']} n={r['n']:g} {r['mode']}: {r['value+grad'] / first['value+grad']:.2f}×"
              for r, first in second if r["value+grad"] > 1.05 * first["value+grad"]]
    return _check("order=2 within 1.05× of order=1 (value + gradient), the bar for making it the default",
                  costly, len(second))


def _served(rows, index) -> list[str]:
    """values_only(): forward-only at the largest size within 1.05× of plain f, tf.function and XLA."""
    largest = {case: _largest_n(rows, case) for case in {r["case"] for r in rows}}
    cells = [r for r in rows if VALUES_ONLY in r and r["implementation"] != PLAIN and r["n"] == largest[r["case"]]]
    cells = [(r, index.get((r["case"], r["n"], PLAIN, r["mode"]))) for r in cells]
    over = [f"{_cell(r, 'forward')}: {r[VALUES_ONLY] / plain[VALUES_ONLY]:.3f}× plain f" for r, plain in cells
            if plain and r[VALUES_ONLY] > 1.05 * plain[VALUES_ONLY]]
    return _check("Forward only under values_only() within 1.05× of plain f (tf.function, XLA, largest n)",
                  over, len(cells))


def _served_table(rows, index) -> list[str]:
    lines = ["", "Forward only (serving): time / plain f's, without and with values_only() (each timed round-robin "
             "with plain f: the first with every implementation, the second with the served ones alone):", "",
             "| case | implementation | n | function | function, values_only | xla | xla, values_only |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mode"] != "function" or VALUES_ONLY not in r or r["implementation"] == PLAIN:
            continue
        cells = []
        for mode in ("function", "xla"):
            row, plain = index[(r["case"], r["n"], r["implementation"], mode)], index[(r["case"], r["n"], PLAIN, mode)]
            cells += [f"{row['forward'] / plain['forward']:.2f}×", f"{row[VALUES_ONLY] / plain[VALUES_ONLY]:.2f}×"]
        lines.append(f"| {r['case']} | {r['implementation']} | {r['n']:g} | " + " | ".join(cells) + " |")
    return lines


def _bandwidth(rows, index, cases, bandwidth) -> list[str]:
    lines = ["", f"Memory-copy bandwidth of this machine (NumPy copy, read + write): {bandwidth / 1e9:.1f} GB/s.", ""]
    for case in cases:
        n = _largest_n(rows, case.name)
        for name in (IDENTITY, DECORATOR):
            row = index.get((case.name, n, name, "xla"))
            if row:
                achieved = case.bytes_moved(n) / row["value+grad"]
                lines.append(f"- {case.name}, {name}, XLA, n = {n:g}: {achieved / 1e9:.2f} GB/s of minimal traffic, "
                             f"{achieved / bandwidth:.0%} of the copy bandwidth.")
    return lines


def _targets(rows, index, cases, bandwidth, baseline) -> list[str]:
    lines = ["## Targets", "", *_eager_overhead(rows, index), *_faster_than_tfp(rows, index),
             *_no_slower_than_baseline(rows, index, baseline), *_served(rows, index), *_idle_decorator(rows),
             *_order_two(rows, index)]
    return lines + _served_table(rows, index) + _bandwidth(rows, index, cases, bandwidth)


def markdown(rows, cases, device, bandwidth, tf_version, baseline=None, gpu=False) -> str:
    index = _index(rows)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Benchmark results ({device})", "",
             f"TensorFlow {tf_version}, {stamp}. Median of repeated calls after warm-up, float32. In brackets: the "
             f"ratio to {ANCHOR} in the same run, timed round-robin with it (lower is faster). "
             "`forward` computes the value only; "
             "`value+grad` the value and the gradient with a GradientTape.", ""]
    if not gpu:
        lines += ["No GPU was available to this run, so there is no GPU table; `make bench` on a machine with one "
                  "writes results/latest-gpu.md beside this file.", ""]
    lines += _targets(rows, index, cases, bandwidth, baseline)
    for case in cases:
        lines += ["", f"## {case.name}", "", case.description]
        for phase in PHASES:
            lines += ["", f"### {phase}", "", *_table(rows, index, case, phase)]
        lines += ["", *_memory_table(rows, index, case)]
    return "\n".join(lines) + "\n"


def plot(rows, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = _index(rows)
    case_names = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(len(case_names), 3, figsize=(14, 3.4 * len(case_names)), squeeze=False)
    for i, case in enumerate(case_names):
        for j, mode in enumerate(("eager", "function", "xla")):
            ax = axes[i, j]
            for name in dict.fromkeys(r["implementation"] for r in rows if r["case"] == case):
                points = sorted((r["n"], _ratio(index, r, "value+grad")) for r in rows
                                if r["case"] == case and r["implementation"] == name and r["mode"] == mode)
                ax.plot(*zip(*points, strict=True), "o-", label=name, lw=2.5 if "stopgrad" in name else 1.2)
            ax.set_xscale("log")
            ax.axhline(1.0, color="gray", lw=0.6)
            ax.set_title(f"{case}, {mode}: value + gradient", fontsize=10)
            ax.set_xlabel("n")
            ax.set_ylabel(f"time / {ANCHOR}")
        axes[i, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
