"""What every command shares: the console, the one-line error exit, logging, warnings, the run directory's
default name, the per-round summary table and the two-column listings."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 120)


def fail(msg: str) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(msg)}", soft_wrap=True)  # one line stays one line
    raise typer.Exit(2)


def setup_logging(verbose: bool) -> None:
    """Warnings and errors on the terminal; the run's INFO lines too only with progress shown (run.log always
    keeps them). Quiet also silences the libraries' own progress bars (transformers' weight loading)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        from fedpeft.backbones.loading import quiet_libraries

        quiet_libraries()


def warn(msg: str) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[bold yellow]warning:[/] {escape(msg)}", soft_wrap=True)


def run_dir(cfg, out: Optional[Path]) -> Path:
    """The run directory: ``--out``, else runs/<config name, or method-task-model-hash-seed>."""
    return out or Path("runs") / (cfg.name or cfg.default_name())


def print_summary(out_dir: Path, summary: dict) -> None:
    from fedpeft.tracking.rundir import RunDir

    table = Table(title=f"{summary['method']} on {summary['task']} with {summary['model']}")
    for col in ("round", "accuracy", "loss", "local acc (mean/min/max)", "bytes up", "bytes down", "seconds"):
        table.add_column(col, justify="right")
    for r in RunDir(out_dir).read_metrics():
        local = ("-" if r["local_accuracy_mean"] is None else
                 f"{r['local_accuracy_mean']:.3f}/{r['local_accuracy_min']:.3f}/{r['local_accuracy_max']:.3f}")
        table.add_row(str(r["round"]), f"{r['accuracy']:.4f}", f"{r['loss']:.4f}", local,
                      f"{r['bytes_up']:,}", f"{r['bytes_down']:,}", f"{r['wall_seconds']:.1f}")
    console.print(table)
    console.print(
        f"final accuracy {summary['final_accuracy']:.4f} (best {summary['best_accuracy']:.4f}); "
        f"upload per client-round {summary['bytes_up_per_client_round']:,.0f} B = "
        f"{summary['upload_ratio_vs_full']:.3e} x full fine-tuning ({summary['full_model_bytes_fp32']:,} B); "
        f"trainable params {summary['trainable_params']:,}; {summary['wall_seconds']:.0f} s")
    console.print(f"run directory: {out_dir}", highlight=False)
    if (out_dir / "report.html").exists():
        console.print(f"report: {out_dir / 'report.html'}", highlight=False)


def list_rows(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title)
    table.add_column("name")
    table.add_column("description")
    for n, d in rows:
        table.add_row(n, d)
    console.print(table)
