"""What the three real-code harnesses (``tf_real_code.py``, ``jax_real_code.py``, ``torch_real_code.py``) share, with no
framework imported: their options, a row of one timed cell, and the report's tables (a phase each, a case per row, a
size per column)."""

from __future__ import annotations

import argparse
import pathlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

SHAPES = {"small": (8, 16), "256×512": (256, 512)}


def options(description: str | None, cases: Sequence[str], phases: Sequence[str]) -> argparse.ArgumentParser:
    """The harnesses' common options: where the report goes, the blocks and their time, and which cases, phases
    and shapes run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per block")
    parser.add_argument("--cases", nargs="*", default=list(cases), choices=list(cases))
    parser.add_argument("--phases", nargs="*", default=list(phases), choices=list(phases))
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    return parser


def measured(cases: Sequence[str], shapes: dict[str, tuple[int, int]], phases: Sequence[str], blocks: int,
             calls_of: Callable[[str, tuple[int, int], str], dict[str, Callable[[], object]]],
             medians: Callable[[dict[str, Callable[[], object]]], dict[str, float]], ours: str,
             anchor: str) -> list[dict[str, Any]]:
    """A row per case, size and phase: ``calls_of(case, shape, phase)`` gives the anchor's and the port's calls,
    warmed up, and ``medians(calls)`` one block's median seconds of each."""
    rows = []
    for case in cases:
        for size, shape in shapes.items():
            for phase in phases:
                calls = calls_of(case, shape, phase)
                rows.append(row(case, size, phase, [medians(calls) for _ in range(blocks)], ours, anchor))
    return rows


def row(case: str, size: str, phase: str, per_block: list[dict[str, float]], ours: str,
        anchor: str) -> dict[str, Any]:
    """One cell: the port's median time per call, and its ratio to the anchor's as the median over blocks with
    the range over them (printed as it is made)."""
    ratios = [block[ours] / block[anchor] for block in per_block]
    made = {"case": case, "size": size, "phase": phase, "seconds": statistics.median(b[ours] for b in per_block),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    print(f"{case:>30} {size:>8} {phase:>30}: {made['ratio']:.2f}x", flush=True)
    return made


def markdown(title: str, versions: str, rows: list[dict[str, Any]]) -> str:
    """The report: ``title``, the device and versions, and a table per phase."""
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    lines = [f"# {title}", "", f"{versions}. Each cell: the port's median time per call, its ratio to the anchor's "
             "(the median over interleaved blocks) and the range over blocks.", ""]
    for phase in dict.fromkeys(r["phase"] for r in rows):
        lines += [f"## {phase}", "", "| case | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for case in dict.fromkeys(r["case"] for r in rows):
            cells = {r["size"]: _cell(r) for r in rows if r["case"] == case and r["phase"] == phase}
            lines.append(f"| {case} | " + " | ".join(cells.get(size, "") for size in sizes) + " |")
        lines.append("")
    return "\n".join(lines)


def ratio_tables(title: str, versions: str, cells: list[dict[str, Any]], others: Sequence[str]) -> str:
    """A report of cells that each time one implementation against several (``jax_implicit.py``,
    ``torch_implicit.py``): a table per phase, a case and size per row, our time and its ratio to each of
    ``others`` (n/a where a cell has none)."""
    lines = [f"# {title}", "", f"{versions}. Each cell: our median time per call, and its ratio to each other "
             "implementation's (the median over interleaved blocks; below 1 is faster). n/a: the implementation has "
             "no such mode, or is not installed.", ""]
    for phase in dict.fromkeys(c["phase"] for c in cells):
        lines += [f"## {phase}", "", "| case | size | ours | " + " | ".join(f"÷ {o}" for o in others) + " |",
                  "|---|---|---|" + "---|" * len(others)]
        for made in (c for c in cells if c["phase"] == phase):
            seconds = made["seconds"]
            time = f"{seconds * 1e6:.0f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"
            ratios = [f"{made['ratios'][o]:.2f}×" if o in made["ratios"] else "n/a" for o in others]
            lines.append(f"| {made['case']} | {made['size']} | {time} | " + " | ".join(ratios) + " |")
        lines.append("")
    return "\n".join(lines)


def _cell(made: dict[str, Any]) -> str:
    seconds = made["seconds"]
    time = f"{seconds * 1e6:.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"
    return f"{time}, {made['ratio']:.2f}× [{made['ratio_min']:.2f}–{made['ratio_max']:.2f}]"


def written(out: str, name: str, text: str) -> int:
    """The report written as ``out/name`` and printed; 0, a harness's exit status."""
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    print(text)
    return 0
