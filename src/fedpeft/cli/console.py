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
    """The per-round table and the final line of a run: a classification run's accuracy; a generation run's own
    metrics (BLEU, chrF, ROUGE-L of what it wrote, loss and perplexity per response token)."""
    from fedpeft.tracking.rundir import RunDir

    records = RunDir(out_dir).read_metrics()
    generation = "final_perplexity" in summary
    table = Table(title=f"{summary['method']} on {summary['task']} with {summary['model']}")
    glob = "untrained global " if untrained_global(summary) else ""  # local-only: the global columns are round 0's
    cols = (("round", f"{glob}loss", f"{glob}perplexity", f"{glob}BLEU", f"{glob}chrF", f"{glob}ROUGE-L", "bytes up",
             "bytes down", "seconds")
            if generation else
            ("round", f"{glob}accuracy", f"{glob}loss", "local acc (mean/min/max)", "bytes up", "bytes down",
             "seconds"))
    for col in cols:
        table.add_column(col, justify="right")
    for r in records:
        traffic = (f"{r['bytes_up']:,}", f"{r['bytes_down']:,}", f"{r['wall_seconds']:.1f}")
        if generation:
            g = r.get("generation") or {}
            table.add_row(str(r["round"]), _num(r.get("loss"), 4), _num(r.get("perplexity"), 3),
                          *(_num(g.get(k), 1) for k in ("bleu", "chrf", "rouge_l")), *traffic)
            continue
        local = ("-" if r["local_accuracy_mean"] is None else
                 f"{r['local_accuracy_mean']:.3f}/{r['local_accuracy_min']:.3f}/{r['local_accuracy_max']:.3f}")
        table.add_row(str(r["round"]), _num(r.get("accuracy"), 4), _num(r.get("loss"), 4), local, *traffic)
    console.print(table)
    traffic = (f"upload per client-round {summary['bytes_up_per_client_round']:,.0f} B = "
               f"{summary['upload_ratio_vs_full']:.3e} x full fine-tuning ({summary['full_model_bytes_fp32']:,} B); "
               f"trainable params {summary['trainable_params']:,}; {summary['wall_seconds']:.0f} s")
    console.print(f"{headline(summary)}; {traffic}", highlight=False)
    console.print(f"run directory: {out_dir}", highlight=False)
    if (out_dir / "report.html").exists():
        console.print(f"report: {out_dir / 'report.html'}", highlight=False)


def headline(summary: dict) -> str:
    """What a run is scored by, as its final line leads with it: final accuracy (best); a generation run's BLEU,
    chrF, ROUGE-L and exact match of its final round's generations, then its loss and perplexity; a run whose
    global adapter was never trained (local-only), the clients' own adapters' accuracy, saying why."""
    if untrained_global(summary):
        return (f"the global adapter was never trained (method.sharing keeps every trained tensor on the clients): "
                f"its scores are the initial model's; the clients' own adapters: local accuracy mean "
                f"{_num(summary.get('final_local_accuracy_mean'), 4)}")
    if "final_perplexity" not in summary:
        return (f"final accuracy {_num(summary.get('final_accuracy'), 4)} "
                f"(best {_num(summary.get('best_accuracy'), 4)})")
    g = summary.get("final_generation")
    loss = (f"test loss {_num(summary.get('final_loss'), 4)}, perplexity {_num(summary.get('final_perplexity'), 3)} "
            "per response token")
    if not g:
        return f"no generations decoded in the final round (evaluation.generate_every: 0); {loss}"
    scores = ", ".join(f"{name} {_num(g.get(k), 1)}" + (f" ± {g[k + '_se']:.1f}" if k + "_se" in g else "")
                       for k, name in (("bleu", "BLEU"), ("chrf", "chrF"), ("rouge_l", "ROUGE-L"),
                                       ("exact_match", "exact match")))
    return f"final {scores} (round {g['round']}, {g.get('num_generated')} test prompts decoded greedily); {loss}"


def untrained_global(summary: dict) -> bool:
    """Whether no tensor of the run's global adapter was ever trained (``summary.json``'s ``global_adapter``: the
    sharing keeps every trained tensor on the clients)."""
    return summary.get("global_adapter") == "untrained"


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def list_rows(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title)
    table.add_column("name")
    table.add_column("description")
    for n, d in rows:
        table.add_row(n, d)
    console.print(table)
