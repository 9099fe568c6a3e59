"""Using a trained run: ``export`` (PEFT), ``predict``, ``generate`` and ``evaluate`` (a labelled file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from fedpeft.cli.console import console, fail, setup_logging


_CLIENT = typer.Option(help="client K's personalised adapter (methods with private tensors, e.g. FedPepTAO, "
                            "FedSA-LoRA): its id, or its name with natural clients (partition by_column)")
_BEST = typer.Option("--best", help="the checkpoint of the best round on the validation split "
                                    "(evaluation.keep_best) instead of the last")


def export(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    out: Annotated[Path, typer.Argument(help="output folder")],
    format: Annotated[str, typer.Option(help="peft: a Hugging Face PEFT adapter directory")] = "peft",
    best: Annotated[bool, _BEST] = False,
    client: Annotated[Optional[str], _CLIENT] = None,
) -> None:
    """Export a run's global adapter (or client K's personalised one) as a PEFT adapter directory
    (PeftModel.from_pretrained(base, OUT) loads it), with the task's classes, readout and templates beside it
    (fedpeft_task.json)."""
    from fedpeft.config import ConfigError
    from fedpeft.export import export_peft
    from fedpeft.outputs import check_output_dir, os_error_line

    if format != "peft":
        fail(f"--format: unknown '{format}'; allowed: peft")
    try:
        check_output_dir(out, "OUT")
        path, note = export_peft(run_dir, out, best=best, client=client)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    Console(stderr=True).print(note, highlight=False, markup=False)
    console.print(f"wrote {path}", highlight=False)


def _open_model(run_dir: Path, client: Optional[str], best: bool):
    from fedpeft.predict import open_model

    setup_logging(False)
    model = open_model(run_dir, client, best)
    Console(stderr=True).print(f"predicting with {model.describe()}", highlight=False, markup=False)
    return model


def predict(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    text: Annotated[list[str], typer.Option("--text", help="a text to classify (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="texts: a .csv/.tsv/.jsonl/.parquet file with the "
                                                 "run's text column (or 'text'), or one text per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="write OUT.csv or OUT.jsonl (the input's columns, then "
                                                     "'prediction' and one 'p(<class>)' per class) instead of a "
                                                     "table")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Labels and class probabilities from a run's global adapter (or client K's personalised one); says which
    round's adapter it is."""
    from rich.markup import escape

    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import (OUTPUT_SUFFIXES, prediction_rows, read_inputs, texts_only, write_rows)

    if out is not None and out.suffix.lower() not in OUTPUT_SUFFIXES:
        fail(f"--out: '{out.name}' must end in .csv or .jsonl")
    if not text and file is None:
        fail("no texts to classify: give --text or --file")
    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best)
        inputs = [texts_only(text)] if text else []
        if file is not None:
            inputs.append(read_inputs(file, model.cfg.task))
        rows = []
        for part in inputs:
            probs = model.probabilities(part.examples(model.classifier.task.is_pair))
            rows += prediction_rows(part, model.class_names, probs.argmax(-1).tolist(), probs.tolist())
        if out is not None:
            write_rows(rows, out)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    if out is not None:
        console.print(f"wrote {out} ({len(rows)} texts)", highlight=False)
        return
    table = Table(title=f"{run_dir}" + (f", client {client}" if client is not None else ""))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for col in columns:
        table.add_column(col, justify="right" if isinstance(rows[0].get(col), float) else "left")
    for r in rows:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r.get(c), float) else escape(str(r.get(c, ""))) for c in columns))
    console.print(table)


def generate(
    run_dir: Annotated[Path, typer.Argument(help="a generation run's directory (finished or checkpointed)")],
    prompt: Annotated[list[str], typer.Option("--prompt", help="an instruction to complete (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="instructions, one per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(min=1, help="most tokens per completion (default: the "
                                                                      "run's evaluation.max_new_tokens)")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Greedy completions from a generation run's global adapter (or client K's personalised one), with the
    prompt format the run trained with (the model's chat template, or task.prompt_template)."""
    from rich.markup import escape

    from fedpeft.outputs import os_error_line

    prompts = list(prompt)
    try:
        if file is not None:
            prompts += [line.rstrip("\n") for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            fail("no prompts: give --prompt or --file")
        model = _open_model(run_dir, client, best)
        for text, completion in zip(prompts, model.generate(prompts, max_new_tokens)):
            console.print(f"[bold]> {escape(text)}[/bold]")
            console.print(completion, highlight=False, markup=False)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))


def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    file: Annotated[Path, typer.Option("--file", help="a labelled .csv/.tsv/.jsonl/.parquet file with the run's "
                                       "text and label columns; labels are class names or class indices")],
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="also write the metrics as JSON")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Score a labelled file: accuracy, macro-F1, per-class precision/recall/F1 and the confusion matrix."""
    from fedpeft.metrics import confusion, table as metrics_table
    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import label_indices, read_inputs

    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best)
        inputs = read_inputs(file, model.cfg.task, labelled=True)
        labels = label_indices(inputs, model.class_names)
        preds = model.probabilities(inputs.examples(model.classifier.task.is_pair)).argmax(-1).tolist()
        result = metrics_table(confusion(labels, preds, len(model.class_names)), model.class_names)
        result |= {"file": str(file), "adapter": model.describe()}
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    print_class_table(result, model.class_names, f"{file}: {result['num_examples']:,} examples")
    if out is not None:
        console.print(f"wrote {out}", highlight=False)


def print_class_table(result: dict, class_names: list[str], title: str) -> None:
    """Accuracy and macro-F1, the per-class table and the confusion matrix (rows true, columns predicted)."""
    table = Table(title=title)
    for col in ("class", "precision", "recall", "F1", "support"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for name, m in result["per_class"].items():
        table.add_row(name, f"{m['precision']:.3f}", f"{m['recall']:.3f}", f"{m['f1']:.3f}", f"{m['support']:,}")
    console.print(table)
    cm = Table(title="confusion matrix (rows: true class, columns: predicted)")
    cm.add_column("")
    for name in class_names:
        cm.add_column(name, justify="right")
    for name, row in zip(class_names, result["confusion"]):
        cm.add_row(name, *(f"{v:,}" for v in row))
    console.print(cm)
    f1 = result["macro_f1"]
    console.print(f"accuracy {result['accuracy']:.4f}, macro-F1 " + ("–" if f1 is None else f"{f1:.4f}"),
                  highlight=False)
