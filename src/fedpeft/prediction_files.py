"""The files ``fedpeft predict``, ``fedpeft generate`` and ``fedpeft evaluate`` read and write.

Inputs: ``.csv``, ``.tsv``, ``.jsonl`` and ``.parquet`` are read as a run reads its own data
(``data.tasks.files.read_table``: every column kept) in the run's ``task.encoding``; any other file holds one text
per line. Every error names ``--file``, the file and, where one applies, the line: a line that is not valid JSON, an
undecodable byte, a missing column or value (never a config key, an errno or a codec's own words).

- Classification runs (``read_inputs``): the run's ``task.text_column`` (and ``task.text_pair_column``; ``text``
  when the run's column is not in the file). A pair task without a pair column takes the second text after a
  tab. ``fedpeft evaluate`` also reads the run's ``task.label_column``: each label is a class name of the run, or
  an integer index into its classes; a label that reads as a missing value or names no class is an error at its
  line.
- Generation runs (``read_prompts``): the run's ``task.instruction_column`` and ``task.input_column``; labelled
  (``fedpeft evaluate``) also ``task.response_column`` and ``task.references_column`` (a list of texts, or a JSON
  array in csv/tsv: several references). Runs of a built-in task (WebNLG, Dolly) read the columns of its files:
  ``instruction``, ``input``, ``output``, ``references`` (input and references where the file has them). A plain
  text file holds one instruction per line.

Outputs (``write_rows``): ``.csv`` or ``.jsonl``. A predictions file keeps every input column and adds the
predicted class name and one probability per class; a generations file adds the prompt as the model saw it
(``prompt``: the run's chat template or ``task.prompt_template`` filled in) and the completion (``generation``).
Added columns never collide with an input column (``free_names``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.tasks.files import FORMATS, Table, _cell, _references, check_not_missing, read_table
from fedpeft.data.types import Example

OUTPUT_SUFFIXES = (".csv", ".jsonl")
PREDICTION, PROMPT, GENERATION, INSTRUCTION = "prediction", "prompt", "generation", "instruction"
BUILTIN_COLUMNS = {"instruction": "instruction", "input": "input", "response": "output", "references": "references"}


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
    path, fmt = input_file(path)
    if fmt not in FORMATS:
        if labelled:
            raise ValueError(f"--file: {path}: a labelled file is .csv, .tsv, .jsonl or .parquet (with the run's "
                             f"'{task.text_column}' and '{task.label_column}' columns)")
        lines, where = read_lines(path, task.encoding)
        return Inputs(["text"], [{"text": t} for t in lines], lines, [None] * len(lines), [], where)
    table = read_file_table(path, fmt, task.encoding)
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


# ---------------------------------------------------------------- reading --file


def input_file(path: str | Path) -> tuple[Path, str]:
    """``--file`` as a path and its format (``csv``, ``tsv``, ``jsonl``, ``parquet``, or any other: lines of text);
    FileNotFoundError if it is missing or a folder."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--file: {path} does not exist" if not path.exists() else f"--file: {path} is a "
                                "folder, not a file")
    return path, path.suffix.lower().lstrip(".")


def read_text(path: Path, encoding: str) -> str:
    """The whole of ``path`` as text in the run's ``task.encoding`` (a UTF-8 byte-order mark dropped); ValueError
    naming ``--file``, the file and the line of the first byte that does not decode, or why it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"--file: cannot read {path} ({e.strerror or type(e).__name__})") from None
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    try:
        return raw.decode(codec)
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"--file: {path} line {line} is not valid {encoding} (byte 0x{raw[err.start]:02x} at column "
                         f"{column}); the run reads text as {encoding} (its task.encoding): save the file in that "
                         "encoding") from None


def read_lines(path: Path, encoding: str) -> tuple[list[str], list[str]]:
    """The non-blank lines of a plain text file and where each is (``<file> line N``, blank lines counted)."""
    lines, where = [], []
    for i, line in enumerate(read_text(path, encoding).splitlines(), start=1):
        if line.strip():
            lines.append(line)
            where.append(f"{path} line {i}")
    return lines, where


def read_file_table(path: Path, fmt: str, encoding: str) -> Table:
    """A csv/tsv/jsonl/parquet ``--file`` read as the run reads its data; errors name ``--file``, not the config
    key that names a run's own data files (``task.path``)."""
    if fmt != "parquet":
        read_text(path, encoding)  # an undecodable byte: its line, which pandas does not say
    try:
        return read_table(path, fmt, encoding)
    except ConfigError as e:
        raise _file_error(e) from None
    except OSError as e:
        raise ValueError(f"--file: cannot read {path} ({e.strerror or type(e).__name__})") from None


def _file_error(err: ConfigError) -> ValueError:
    """A reader's ConfigError (``task.path: <file> line N ...``) as ``--file``'s."""
    field, sep, rest = str(err).partition(": ")
    return ValueError(f"--file: {rest}" if sep and field.startswith("task.") else f"--file: {err}")


# ---------------------------------------------------------------- generation runs


@dataclass
class Prompts:
    """The rows of a generation run's input: their columns and values (kept in the output), one example per row
    (instruction, input or None; read ``labelled``, the response and references too) and where each row is."""

    columns: list[str]
    rows: list[dict[str, Any]]
    examples: list[Example]
    where: list[str]


def instructions_only(texts: Sequence[str]) -> Prompts:
    """``--prompt`` arguments as inputs (one column, ``instruction``)."""
    return Prompts([INSTRUCTION], [{INSTRUCTION: t} for t in texts], [Example(t, 0) for t in texts],
                   [f"--prompt {i + 1}" for i in range(len(texts))])


def generation_columns(task: TaskConfig, labelled: bool = False) -> dict[str, str | None]:
    """The columns a generation run reads, by role (instruction, input, response, references; None: not read):
    a file task's ``task.<role>_column``, a built-in task's record names (``BUILTIN_COLUMNS``)."""
    if task.name in FORMATS:
        cols = {"instruction": task.instruction_column, "input": task.input_column,
                "response": task.response_column, "references": task.references_column}
    else:
        cols = dict(BUILTIN_COLUMNS)
    return cols if labelled else cols | {"response": None, "references": None}


def _need_generation_columns(table: Table, task: TaskConfig, labelled: bool) -> dict[str, str | None]:
    """The columns of ``table`` to read by role; ValueError naming the role and column the file lacks. A built-in
    task's input and references are read where the file has them."""
    cols = generation_columns(task, labelled)
    file_task = task.name in FORMATS
    for role, col in cols.items():
        if col is None or col in table.columns:
            continue
        if not file_task and role in ("input", "references"):
            cols[role] = None
            continue
        source = f"the run's task.{role}_column" if file_task else f"the column task '{task.name}' reads"
        raise ValueError(f"--file: {table.path} has no {role} column '{col}' ({source}); columns found: "
                         f"{', '.join(table.columns)}")
    return cols


def _prompt_example(row: dict[str, Any], cols: dict[str, str | None], where: str) -> Example:
    """One row as an example: instruction, input (None when blank) and, where read, response and references."""
    def required(role: str) -> str:
        value = _cell(row.get(cols[role]))
        if not value:
            raise ValueError(f"--file: {where}: empty {role} in column '{cols[role]}'; fill it in or remove the row")
        return value

    instruction = required("instruction")
    context = None if cols["input"] is None else (_cell(row.get(cols["input"])) or None)
    if cols["response"] is None:
        return Example(instruction, 0, context)
    refs = ()
    if cols["references"] is not None:
        try:
            refs = _references(row.get(cols["references"]), cols["references"], where)
        except ConfigError as e:
            raise _file_error(e) from None
    return Example(instruction, 0, context, target=required("response"), references=refs)


def read_prompts(path: str | Path, task: TaskConfig, labelled: bool = False) -> Prompts:
    """The instructions (and inputs; with ``labelled`` the responses and references) of ``path`` for a generation
    run; errors name ``--file``, the file, and the line where one applies."""
    path, fmt = input_file(path)
    if fmt not in FORMATS:
        if labelled:
            cols = generation_columns(task, labelled=True)
            raise ValueError(f"--file: {path}: a labelled file is .csv, .tsv, .jsonl or .parquet (with the run's "
                             f"'{cols['instruction']}' and '{cols['response']}' columns)")
        lines, where = read_lines(path, task.encoding)
        return Prompts([INSTRUCTION], [{INSTRUCTION: t} for t in lines], [Example(t, 0) for t in lines], where)
    table = read_file_table(path, fmt, task.encoding)
    cols = _need_generation_columns(table, task, labelled)
    examples = [_prompt_example(row, cols, where) for where, row in table.rows]
    return Prompts(list(table.columns), [row for _, row in table.rows], examples, [where for where, _ in table.rows])


def generation_rows(prompts: Prompts, prompt_texts: Sequence[str], cuts: Sequence[bool],
                    generations: Sequence[str]) -> list[dict[str, Any]]:
    """The input rows, each with the prompt the model saw, whether ``task.max_length`` cut it, and its completion
    added (``prompt``, ``prompt_cut``, ``generation``)."""
    prompt_col, cut_col, gen_col = free_names(prompts.columns, [PROMPT, "prompt_cut", GENERATION])
    return [_plain(row) | {prompt_col: p, cut_col: c, gen_col: g}
            for row, p, c, g in zip(prompts.rows, prompt_texts, cuts, generations)]


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row's values as JSON can write them (parquet lists arrive as numpy arrays)."""
    return {k: v.tolist() if hasattr(v, "tolist") and not isinstance(v, str) else v for k, v in row.items()}


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


def free_names(input_columns: Sequence[str], names: Sequence[str]) -> list[str]:
    """``names``, each prefixed with ``fedpeft_`` as often as needed to differ from every input column (and from
    each other)."""
    taken = set(input_columns)
    out = []
    for name in names:
        while name in taken:
            name = "fedpeft_" + name
        taken.add(name)
        out.append(name)
    return out


def output_columns(input_columns: Sequence[str], class_names: Sequence[str]) -> tuple[str, list[str]]:
    """(predicted-class column, one probability column per class): ``prediction`` and ``p(<class>)``, renamed
    where they would collide with an input column (``free_names``)."""
    out = free_names(input_columns, [PREDICTION, *(f"p({c})" for c in class_names)])
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
