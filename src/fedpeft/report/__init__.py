"""Self-contained HTML reports of one or several run directories (``fedpeft report`` / ``fedpeft compare``).

Plots are inline SVG written by :mod:`fedpeft.report.svg`; the page has no scripts and loads nothing, so it
works offline. Runs whose ``config.yaml`` agree except ``seed`` and ``name`` are aggregated (mean ± std).
"""

from __future__ import annotations

from pathlib import Path

from fedpeft.report.data import expand_run_dirs, final_accuracy, group_runs, load_run
from fedpeft.report.html import page
from fedpeft.report.plots import all_plots

__all__ = ["default_target", "report_path", "write_report"]


def default_target(runs) -> float:
    """95 % of the best final accuracy among the runs."""
    finals = [a for a in (final_accuracy(r) for r in runs) if a is not None]
    return 0.95 * max(finals) if finals else 0.0


def _run_paths(run_dirs) -> list[Path]:
    return expand_run_dirs([Path(p) for p in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs)])


def report_path(run_dirs, out: str | Path | None = None) -> Path:
    """Where the report goes: ``out``, else ``RUN_DIR/report.html`` for one run, ``report.html`` in the working
    directory for several."""
    if out is not None:
        return Path(out)
    paths = _run_paths(run_dirs)
    return paths[0] / "report.html" if len(paths) == 1 else Path("report.html")


def write_report(run_dirs, out: str | Path | None = None, target: float | None = None) -> Path:
    """Write the report of ``run_dirs`` (a folder holding run directories stands for them) to ``report_path``."""
    paths = _run_paths(run_dirs)
    runs = [load_run(p) for p in paths]
    groups = group_runs(runs)
    out = report_path(paths, out)
    html = page(groups, default_target(runs) if target is None else target, all_plots(groups))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
