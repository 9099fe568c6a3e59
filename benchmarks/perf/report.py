"""The table of ``benchmarks/results/perf.md``: the rows measured now, the rows of figures not run kept as
the last run wrote them, and the figures not measured yet."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from benchmarks.perf.common import NOT_YET, Figure


def figure_order(key: str) -> tuple[int, str]:
    """Figures by number, then letter: 2, 2a, ..., 9, 10a (not 10a before 2)."""
    digits = key[:len(key) - len(key.lstrip("0123456789"))]
    return int(digits or 0), key


def table(figures: list[Figure], kept: list[str]) -> list[str]:
    """The rows measured now, the rows of figures not run this time as the last run wrote them (``kept``), and
    the figures not measured yet."""
    rows = {}
    for f in figures:
        status = f.status
        note = f" ({f.note})" if f.note else ""
        rows[f.key] = (f"| {f.key} | {f.what}{note} | **{f.ratio:.2f}×** ({min(f.ratios):.2f}–{max(f.ratios):.2f}) | "
                       f"{f.arms[0]} {f.seconds[0]:.2f} / {f.arms[1]} {f.seconds[1]:.2f} | {f.goal} | {status} |")
    for line in kept:
        key = line.split("|")[1].strip()
        if key not in rows:
            rows[key] = line
    for key, what, goal in NOT_YET:
        rows.setdefault(key, f"| {key} | {what} | not measured yet | – | {goal} | – |")
    return ["| # | figure | ratio (median, range) | arms, median s | goal | status |", "|---|---|---|---|---|---|",
            *(rows[k] for k in sorted(rows, key=figure_order))]


def write(figures: list[Figure], args, seconds: float) -> None:
    kept = [line for line in args.out.read_text().splitlines() if line.startswith("| ") and "measured yet" not in
            line and not line.startswith("| #")] if args.out.exists() else []
    cmd = "nice .venv/bin/python -m benchmarks.perf " + " ".join(sys.argv[1:])
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else \
        platform.machine()
    text = ["# Performance near the hardware limit (issue 16)", "",
            f"Command: `{cmd.strip()}` ({seconds / 60:.1f} min). Each ratio is A/B of the two arms named, measured "
            f"in this one run on {cpu} ({os.cpu_count()} cores), torch {torch.__version__}, {torch.get_num_threads()} "
            "thread, "
            f"{args.reps} alternating repetitions (A B, B A, ...; three arms rotate: A B C, B C A, ...); the table "
            "gives the median of the per-repetition "
            "ratios and their range. Absolute seconds move with the shared machine's other load; the ratios are "
            "what to compare; rows of figures not run by this command are those of their last run. A speed-up goal "
            "(> 1×) is \"met\" only when every repetition's ratio is above 1; a median above 1 whose range still "
            "holds 1 is \"level\".", "",
            *table(figures, kept), "",
            "What each figure runs: see the docstring of `benchmarks/perf/__init__.py`.", ""]
    args.out.write_text("\n".join(text))
    print(f"wrote {args.out}")
