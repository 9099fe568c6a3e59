"""The files ``fedpeft predict`` and ``fedpeft evaluate`` read and write.

Inputs: ``.csv``, ``.tsv``, ``.jsonl`` and ``.parquet`` are read as a run reads its own data
(``data.tasks.files.read_table``: every column kept, errors naming the file and line) with the run's
``task.text_column`` (and ``task.text_pair_column``; ``text`` when the run's column is not in the file); any other
file holds one text per line. A pair task without a pair column takes the second text after a tab.
``fedpeft evaluate`` also reads the run's ``task.label_column``: each label is a class name of the run, or an
integer index into its classes; a label that reads as a missing value or names no class is an error at its line.

Outputs (``write_rows``): ``.csv`` or ``.jsonl``. A predictions file keeps every input column and adds the
predicted class name and one probability per class, under names that never collide with an input column
(``output_columns``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.tasks.files import FORMATS, check_not_missing, read_table
from fedpeft.data.types import Example

OUTPUT_SUFFIXES = (".csv", ".jsonl")
PREDICTION = "prediction"


@dataclass
class Inputs:
    """The rows of an input file: their columns and values (kept in the output), texts and, if read, labels."""

    columns: list[str]
    rows: list[dict[str, Any]]
    texts: list[str]
    pairs: list[str | None]
    labels: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)

    def examples(self, is_pair: bool) -> list[Example]:
        """Unlabelled examples; for a pair task without a pair column the second text follows a tab."""
        out = []
        for text, pair, loc in zip(self.texts, self.pairs, self.where):
            if is_pair and pair is None:
                text, sep, pair = text.partition("\t")
                if not sep:
                    raise ValueError(f"{loc}: the task classifies text pairs: give the second text in the run's "
                                     "task.text_pair_column or after a tab")
            out.append(Example(text, 0, pair if is_pair else None))
        return out


def texts_only(texts: Sequence[str]) -> Inputs:
    """``--text`` arguments as inputs (one column, ``text``)."""
    return Inputs(["text"], [{"text": t} for t in texts], list(texts), [None] * len(texts), [],
                  [f"--text {i + 1}" for i in range(len(texts))])


def read_inputs(path: str | Path, task: TaskConfig, labelled: bool = False) -> Inputs:
    """The texts (and with ``labelled`` the raw labels) of ``path``; errors name the file, and the line where one
    applies."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--file: {path} does not exist" if not path.exists() else f"--file: {path} is a "
                                "folder, not a file")
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        if labelled:
            raise ValueError(f"--file: {path}: a labelled file is .csv, .tsv, .jsonl or .parquet (with the run's "
                             f"'{task.text_column}' and '{task.label_column}' columns)")
        lines = [line for line in path.read_text(encoding=task.encoding).splitlines() if line.strip()]
        return Inputs(["text"], [{"text": t} for t in lines], lines, [None] * len(lines), [],
                      [f"{path} line {i}" for i in range(1, len(lines) + 1)])
    try:
        table = read_table(path, fmt, task.encoding)
    except ConfigError as e:
        raise ValueError(str(e).replace("task.path: ", "--file: ", 1)) from None
    text_col = task.text_column if task.text_column in table.columns else "text"
    wanted = {"text column": text_col, "pair column": task.text_pair_column,
              "label column": task.label_column if labelled else None}
    for what, col in wanted.items():
        if col is not None and col not in table.columns:
            raise ValueError(f"--file: {path} has no {what} '{col}' (the run's task settings); columns found: "
                             f"{', '.join(table.columns)}")
    rows, texts, pairs, labels, where = [], [], [], [], []
    for loc, row in table.rows:
        rows.append(row)
        texts.append(_text(row.get(text_col)))
        pairs.append(_text(row.get(task.text_pair_column)) if task.text_pair_column else None)
        where.append(loc)
        if labelled:
            label = _text(row.get(task.label_column)).strip()
            if not label:
                raise ValueError(f"--file: {loc} has no label in column '{task.label_column}'")
            check_not_missing(label, "--file", task.label_column, loc)
            labels.append(label)
    return Inputs(list(table.columns), rows, texts, pairs, labels, where)


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def label_indices(inputs: Inputs, class_names: Sequence[str]) -> list[int]:
    """Each raw label as a class index: a class name of the run, or an integer index into its classes."""
    index = {n: i for i, n in enumerate(class_names)}
    out = []
    for label, loc in zip(inputs.labels, inputs.where):
        if label in index:
            out.append(index[label])
        elif label.lstrip("+-").isdigit() and 0 <= int(label) < len(class_names):
            out.append(int(label))
        else:
            raise ValueError(f"--file: {loc} has the label {label!r}, which is not a class of the run "
                             f"({', '.join(class_names)}) nor an index 0..{len(class_names) - 1} into them")
    return out


def output_columns(input_columns: Sequence[str], class_names: Sequence[str]) -> tuple[str, list[str]]:
    """(predicted-class column, one probability column per class): ``prediction`` and ``p(<class>)``, each
    prefixed with ``fedpeft_`` as often as needed to differ from every input column (and from each other)."""
    taken = set(input_columns)
    out = []
    for name in [PREDICTION, *(f"p({c})" for c in class_names)]:
        while name in taken:
            name = "fedpeft_" + name
        taken.add(name)
        out.append(name)
    return out[0], out[1:]


def prediction_rows(inputs: Inputs, class_names: Sequence[str], preds: Sequence[int],
                    probs: Sequence[Sequence[float]]) -> list[dict[str, Any]]:
    """The input rows, each with its predicted class name and class probabilities added."""
    pred_col, prob_cols = output_columns(inputs.columns, class_names)
    return [dict(row) | {pred_col: class_names[k]} | dict(zip(prob_cols, map(float, p)))
            for row, k, p in zip(inputs.rows, preds, probs)]


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """``rows`` as ``.csv`` (a header of every column) or ``.jsonl`` (one object per row)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out: '{path.name}' must end in .csv or .jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        columns = list(dict.fromkeys(k for r in rows for k in r)) or ["text", PREDICTION]
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows),
                        encoding="utf-8")
    return path
