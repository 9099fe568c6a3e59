"""``report`` and ``compare``: self-contained HTML reports of one or several runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fedpeft.cli.console import console, fail


def _report(run_dirs: list[Path], out: Optional[Path], target: Optional[float]) -> None:
    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.report import report_path, write_report

    try:
        path = check_output_file(report_path(run_dirs, out), "--out")
        write_report(run_dirs, path, target)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    console.print(f"wrote {path}", highlight=False)


_RUN_DIRS = typer.Argument(help="run directories (a folder holding run directories stands for all of them)")
_REPORT_OUT = typer.Option(help="output HTML (default: RUN_DIR/report.html for one run, ./report.html for several)")
_TARGET = typer.Option(help="accuracy for 'bytes up to reach' (default: 95 % of the best final accuracy)")


def report(
    run_dirs: Annotated[list[Path], _RUN_DIRS],
    out: Annotated[Optional[Path], _REPORT_OUT] = None,
    target: Annotated[Optional[float], _TARGET] = None,
) -> None:
    """Write a self-contained report.html (SVG plots, config and summary tables) of one or several runs."""
    _report(run_dirs, out, target)


def compare(
    run_dirs: Annotated[list[Path], _RUN_DIRS],
    out: Annotated[Optional[Path], _REPORT_OUT] = None,
    target: Annotated[Optional[float], _TARGET] = None,
) -> None:
    """Overlay several runs in one report.html; runs differing only in seed/name are shown as mean ± std."""
    _report(run_dirs, out, target)
