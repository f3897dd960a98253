"""Tables, target checks and the plot for the benchmark results."""

from __future__ import annotations

import datetime
import pathlib

from cases import ANCHOR, ORDER_2

IDENTITY, DECORATOR, TFP, PLAIN = (
    "stopgrad_math identity", "stopgrad_math decorator", "tfp.math.custom_gradient", "plain autodiff (floor)")
PHASES = ("forward", "value+grad")


def _index(rows):
    return {(r["case"], r["n"], r["implementation"], r["mode"]): r for r in rows}


def _ratio(index, row, phase):
    anchor = index.get((row["case"], row["n"], ANCHOR, row["mode"]))
    return row[phase] / anchor[phase] if anchor else None


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


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
    n = max(r["n"] for r in rows if r["case"] == case.name)
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


def _targets(rows, index, cases, bandwidth) -> list[str]:
    lines = ["## Targets", ""]
    cells = [r for r in rows if r["implementation"] == IDENTITY]
    tfp_rows = [(r, index.get((r["case"], r["n"], TFP, r["mode"]))) for r in cells]
    slower = [f"{r['case']} n={r['n']:g} {r['mode']} {p}: {r[p] / t[p]:.2f}× tfp"
              for r, t in tfp_rows if t for p in PHASES if r[p] >= t[p]]
    lines += _check("Identity form faster than tfp.math.custom_gradient in every cell", slower, 2 * len(cells))
    large = [r for r in rows if r["implementation"] in (IDENTITY, DECORATOR) and r["mode"] != "eager" and r["n"] >= 1e5]
    over = [f"{r['case']} n={r['n']:g} {r['mode']} {r['implementation']}: {_ratio(index, r, 'value+grad'):.3f}×"
            for r in large if _ratio(index, r, "value+grad") > 1.05]
    label = "Value + gradient within 1.05× of tf.custom_gradient, tf.function and XLA, n ≥ 1e5"
    lines += _check(label, over, len(large))
    eager = [r for r in rows if r["implementation"] == DECORATOR and r["mode"] == "eager"]
    taped = [f"{r['case']} n={r['n']:g}: {_ratio(index, r, 'value+grad'):.2f}×" for r in eager
             if _ratio(index, r, "value+grad") > 1.3]
    lines += _check("Decorator in eager within 1.3× of tf.custom_gradient with a tape", taped, len(eager))
    idle = [f"{r['case']} n={r['n']:g}: {r['forward'] / r['undecorated_forward']:.3f}×" for r in eager
            if r["forward"] > 1.05 * r["undecorated_forward"]]
    lines += _check("Decorator in eager within 1.05× of the undecorated f with nothing watching", idle, len(eager))
    second = [(r, index[(r["case"], r["n"], DECORATOR, r["mode"])]) for r in rows if r["implementation"] == ORDER_2]
    costly = [f"{r['case']} n={r['n']:g} {r['mode']}: {r['value+grad'] / first['value+grad']:.2f}×"
              for r, first in second if r["value+grad"] > 1.05 * first["value+grad"]]
    lines += _check("order=2 within 1.05× of order=1 (value + gradient), the bar for making it the default",
                    costly, len(second))
    lines += ["", "Forward-only cost that the identity form adds in graph mode (forward time / plain softplus):", ""]
    lines += ["| n | function | xla |", "|---|---|---|"]
    for n in sorted({r["n"] for r in rows if r["case"] == "log1pexp"}):
        ratios = [index[("log1pexp", n, IDENTITY, m)]["forward"] / index[("log1pexp", n, PLAIN, m)]["forward"]
                  for m in ("function", "xla")]
        lines.append(f"| {n:g} | {ratios[0]:.2f}× | {ratios[1]:.2f}× |")
    lines += ["", f"Memory-copy bandwidth of this machine (NumPy copy, read + write): {bandwidth / 1e9:.1f} GB/s.", ""]
    for case in cases:
        n = max(r["n"] for r in rows if r["case"] == case.name)
        for name in (IDENTITY, DECORATOR):
            row = index.get((case.name, n, name, "xla"))
            if row:
                achieved = case.bytes_moved(n) / row["value+grad"]
                lines.append(f"- {case.name}, {name}, XLA, n = {n:g}: {achieved / 1e9:.2f} GB/s of minimal traffic, "
                             f"{achieved / bandwidth:.0%} of the copy bandwidth.")
    return lines


def markdown(rows, cases, device, bandwidth, tf_version) -> str:
    index = _index(rows)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Benchmark results ({device})", "",
             f"TensorFlow {tf_version}, {stamp}. Median of repeated calls after warm-up, float32. In brackets: the "
             f"ratio to {ANCHOR} in the same run, timed round-robin with it (lower is faster). "
             "`forward` computes the value only; "
             "`value+grad` the value and the gradient with a GradientTape.", ""]
    lines += _targets(rows, index, cases, bandwidth)
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
