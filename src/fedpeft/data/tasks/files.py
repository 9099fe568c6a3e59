"""Your own data: ``task.name`` csv, tsv, jsonl or parquet reads local files named by ``task.path``.

``task.path`` is one file (split into train/test with a seeded stratified ``task.test_fraction`` split unless
``task.test_path`` is given) or a folder holding ``train.<ext>`` and optionally ``test.<ext>``. CSV is read with
standard quoting; TSV is one row per line, fields split at tabs, no quoting; JSONL holds one object per line;
Parquet is read with pyarrow. Every value is read as text: labels are strings or integers, and the classes are
``task.label_names`` or the distinct labels found (integers in numeric order, else strings sorted). Problems
raise ``ConfigError`` naming the field and the file, and the line (row for parquet) where one applies.

Generation (instruction-tuning) files: ``task.response_column`` set (or ``task.kind: generation``) reads
``task.instruction_column``, optionally ``task.input_column`` and ``task.references_column``, instead of text and
label columns; the test split is then a plain seeded one (there are no classes to stratify). Preference files:
``task.rejected_column`` set too (or ``task.kind: preference``): each row is a prompt (``task.instruction_column``),
its chosen response (``task.response_column``) and its rejected one; a file without the prompt column holds whole
dialogues as HH-RLHF writes them (``preference``: split at the last assistant turn).

Long because the four formats and the three task kinds share one validation path, whose errors name the field,
the file and the line.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.tasks.base import PAIR_TEMPLATE, TASKS, default_label_words, plain_split, stratified_split
from fedpeft.data.tasks.preference import SkippedPair, preference_pair, preference_task, prompt_pair
from fedpeft.data.types import Example, TaskData

FORMATS = ("csv", "tsv", "jsonl", "parquet")
Row = tuple[str, dict[str, object]]  # (where: "<file> line N", column -> value)
_INT = re.compile(r"[+-]?\d+")


@dataclass
class Table:
    """The rows of one file, each with its location, and the columns found."""

    path: Path
    columns: list[str]
    rows: list[Row]


# ---------------------------------------------------------------- readers (one per format)


def _decode_error(path: Path, encoding: str, err: UnicodeDecodeError, where: str = "") -> ConfigError:
    return ConfigError(f"task.encoding: {path}{where} is not valid {encoding} (byte 0x{err.object[err.start]:02x} "
                       f"at offset {err.start}); set task.encoding to the file's encoding, e.g. latin-1 or cp1252")


def _codec(encoding: str) -> str:
    """utf-8 also accepts a byte-order mark, which would otherwise stick to the first column name."""
    return "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding


def _read_delimited(path: Path, encoding: str, tsv: bool) -> Table:
    """CSV (quoted) or TSV (no quoting) via pandas, every cell a string; blank lines skipped."""
    import pandas as pd  # noqa: PLC0415 (heavy; only file tasks need it)

    try:
        df = pd.read_csv(path, sep="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
                         dtype=str, keep_default_na=False, na_filter=False, skip_blank_lines=False,
                         encoding=_codec(encoding))
    except UnicodeDecodeError as err:
        raise _decode_error(path, encoding, err) from None
    except pd.errors.EmptyDataError:
        raise ConfigError(f"task.path: {path} is empty") from None
    except (pd.errors.ParserError, ValueError) as err:
        raise ConfigError(f"task.path: {path} cannot be read as {'TSV' if tsv else 'CSV'}: {err}") from None
    columns = [str(c) for c in df.columns]
    line = 2 + sum(c.count("\n") for c in columns)  # data starts below the header
    rows: list[Row] = []
    for record in df.to_dict("records"):
        values = [str(v) for v in record.values()]
        if any(v.strip() for v in values):
            rows.append((f"{path} line {line}", {str(k): v for k, v in record.items()}))
        line += 1 + sum(v.count("\n") for v in values)  # quoted fields may span lines
    return Table(path, columns, rows)


def _read_jsonl(path: Path, encoding: str) -> Table:
    """One JSON object per line, decoded line by line so that errors name the line."""
    columns: dict[str, None] = {}
    rows: list[Row] = []
    codec = _codec(encoding)
    for i, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            text = raw.decode(codec if i == 1 else encoding)
        except UnicodeDecodeError as err:
            raise _decode_error(path, encoding, err, f" line {i}") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"task.path: {path} line {i} is not valid JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"task.path: {path} line {i} must be a JSON object, got {type(obj).__name__}")
        columns.update(dict.fromkeys(obj))
        rows.append((f"{path} line {i}", obj))
    return Table(path, list(columns), rows)


def _read_parquet(path: Path) -> Table:
    """A Parquet file via pandas and pyarrow; locations are 1-based row numbers."""
    import pandas as pd  # noqa: PLC0415

    try:
        df = pd.read_parquet(path, engine="pyarrow")
    except Exception as err:  # pyarrow raises its own error types for a damaged or foreign file
        raise ConfigError(f"task.path: {path} cannot be read as Parquet ({type(err).__name__}: {err})") from None
    rows = [(f"{path} row {i}", {str(k): v for k, v in r.items()}) for i, r in enumerate(df.to_dict("records"), 1)]
    return Table(path, [str(c) for c in df.columns], rows)


def not_found(key: str, path: Path) -> ConfigError:
    """The error for a data file that is not there, with the path it was looked for at (a relative path is read from
    the working directory, not from the config file's folder)."""
    where = "" if path.is_absolute() else f" (relative paths are read from the working directory: {path.absolute()})"
    return ConfigError(f"{key}: file not found: {path}{where}")


def read_table(path: Path, fmt: str, encoding: str = "utf-8") -> Table:
    """Read one data file of format ``fmt``; ConfigError if it is missing or holds no rows."""
    if not path.is_file():
        raise not_found("task.path", path)
    if fmt == "parquet":
        table = _read_parquet(path)
    elif fmt == "jsonl":
        table = _read_jsonl(path, encoding)
    else:
        table = _read_delimited(path, encoding, tsv=fmt == "tsv")
    if not table.rows:
        raise ConfigError(f"task.path: {path} has no data rows")
    return table


# ---------------------------------------------------------------- rows -> examples


def _cell(value: object) -> str | None:
    """A cell as stripped text; None for a missing value (None, NaN, pandas NA)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if np.ndim(value) == 0 and type(value).__name__ in ("NAType", "NaTType"):
        return None
    if isinstance(value, bool | np.bool_):
        return str(bool(value)).lower()
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))  # 1.0 from a numeric column with gaps is the label 1
    return str(value).strip()


def _need_columns(table: Table, wanted: dict[str, str | None]) -> None:
    """ConfigError naming the field whose column ``table`` lacks, listing the columns found."""
    for field, col in wanted.items():
        if col is not None and col not in table.columns:
            raise ConfigError(f"{field}: column '{col}' not found in {table.path}; columns found: "
                              f"{', '.join(table.columns)}")


def _raw_examples(table: Table, cfg: TaskConfig, group_column: str | None) -> Iterator[tuple[Example, str, str]]:
    """(example with label -1, raw label, where) per row; ConfigError for an unlabelled row or a missing value."""
    _need_columns(table, {"task.text_column": cfg.text_column, "task.text_pair_column": cfg.text_pair_column,
                          "task.label_column": cfg.label_column, "federation.partition.column": group_column})

    def value(row: dict[str, object], field: str, col: str, where: str, empty_ok: bool = False) -> str:
        v = _cell(row.get(col))
        if v is None or not (v or empty_ok):  # an empty text is kept; an empty label or group is missing
            what = "no label" if field == "task.label_column" else "no value"
            raise ConfigError(f"{field}: {where} has {what} in column '{col}'; fill it in or remove the row")
        if not empty_ok:
            check_not_missing(v, field, col, where)
        return v

    for where, row in table.rows:
        a = value(row, "task.text_column", cfg.text_column, where, empty_ok=True)
        b = (None if cfg.text_pair_column is None else
             value(row, "task.text_pair_column", cfg.text_pair_column, where, empty_ok=True))
        g = None if group_column is None else value(row, "federation.partition.column", group_column, where)
        yield Example(a, -1, b, g), value(row, "task.label_column", cfg.label_column, where), where


MISSING = ("nan", "none", "null", "na", "n/a", "<na>", "nat")  # spellings of "no value" that must not be classes


def check_not_missing(value: str, field: str, col: str, where: str) -> None:
    """ConfigError for a label or group that spells a missing value (``NaN``, ``None``, ``null``, ...): it would
    become a class (or a client) of its own."""
    if value.strip().lower() in MISSING:
        raise ConfigError(f"{field}: {where} has {value!r} in column '{col}', which reads as a missing value, not a "
                          "class; fill it in or remove the row")


RARE = 5  # a class with fewer rows than this is named in a warning (a stray value, or a typo of another class)


def warn_rare_classes(labelled: list[tuple[str, str]]) -> None:
    """Warn, naming them and where they occur, about labels with very few rows among ``(label, where)`` pairs: a
    stray ``2`` among names, or a typo, would otherwise silently become a class of its own."""
    where: dict[str, list[str]] = {}
    for label, loc in labelled:
        where.setdefault(label, []).append(loc)
    rare = {lab: locs for lab, locs in where.items() if len(locs) < RARE}
    if rare and len(rare) < len(where):
        listed = "; ".join(f"{lab!r}: {len(locs)} row{'s' * (len(locs) > 1)} ({', '.join(locs[:3])}"
                           f"{', ...' if len(locs) > 3 else ''})" for lab, locs in sorted(rare.items()))
        warnings.warn(f"task.label_column: classes with fewer than {RARE} rows (a stray value or a typo?): {listed}. "
                      "Every label found is a class: fix or remove such rows, or list the classes in "
                      "task.label_names", UserWarning, stacklevel=3)


def _class_names(labels: list[str], cfg: TaskConfig) -> tuple[list[str], dict[str, int]]:
    """Class names and raw label -> index: ``task.label_names`` (matched by name, else as 0-based integer indices),
    or the distinct labels, integers in numeric order, else sorted as strings."""
    found = sorted(set(labels))
    all_int = all(_INT.fullmatch(x) for x in found)
    if cfg.label_names is None:
        names = sorted({str(int(x)) for x in found}, key=int) if all_int else found
        return names, {x: names.index(str(int(x)) if all_int else x) for x in found}
    names = list(cfg.label_names)
    if len(set(names)) != len(names):
        raise ConfigError(f"task.label_names: duplicate names in {names}")
    if all(x in names for x in found):
        return names, {x: names.index(x) for x in found}
    if all_int and all(0 <= int(x) < len(names) for x in found):
        return names, {x: int(x) for x in found}
    unknown = [x for x in found if x not in names]
    raise ConfigError(f"task.label_names: labels {unknown[:10]} in column '{cfg.label_column}' are not among "
                      f"{names} (nor integer indices 0..{len(names) - 1} into it)")


def _split(examples: list[Example], cfg: TaskConfig, path: Path) -> tuple[list[Example], list[Example]]:
    """Seeded stratified ``task.test_fraction`` split; a plain seeded split, with a warning, if a class is too rare."""
    try:
        return stratified_split(examples, cfg.test_fraction)
    except ValueError as err:
        strat_err = err
    try:
        split = plain_split(examples, cfg.test_fraction)
    except ValueError as err:
        raise ConfigError(f"task.test_fraction: cannot split the {len(examples)} rows of {path} ({err}); add rows "
                          "or give task.test_path") from None
    warnings.warn(f"{path}: stratified train/test split impossible ({strat_err}); split without stratification",
                  stacklevel=2)
    return split


# ---------------------------------------------------------------- generation rows


def is_preference(cfg: TaskConfig) -> bool:
    """Whether a file task is a preference task: ``task.kind`` preference, or auto with a rejected column."""
    return cfg.kind == "preference" or (cfg.kind == "auto" and cfg.rejected_column is not None)


def is_generation(cfg: TaskConfig) -> bool:
    """Whether a file task is a text task of a causal LM (generation or preference): ``task.kind`` generation or
    preference, or auto with a response column."""
    return cfg.kind in ("generation", "preference") or (cfg.kind == "auto" and cfg.response_column is not None)


_CLASSIFICATION_KEYS = ("text_column", "text_pair_column", "label_column", "label_names")
_GENERATION_KEYS = ("instruction_column", "input_column", "references_column")


def check_file_kind(cfg: TaskConfig) -> None:
    """ConfigError for keys of the other kind: classification columns on a generation file task and vice versa."""
    defaults = TaskConfig.model_fields
    generation = is_generation(cfg)
    if cfg.kind == "generation" and cfg.response_column is None:
        raise ConfigError(f"task.response_column: task.kind is 'generation' but no response column is set; name the "
                          f"column of the responses in the {cfg.name} file(s)")
    if is_preference(cfg) and (cfg.response_column is None or cfg.rejected_column is None):
        raise ConfigError(f"task.{'response' if cfg.response_column is None else 'rejected'}_column: a preference "
                          f"file task names the column of the chosen responses (task.response_column) and of the "
                          f"rejected ones (task.rejected_column) in the {cfg.name} file(s)")
    for key in _CLASSIFICATION_KEYS if generation else _GENERATION_KEYS:
        if getattr(cfg, key) != defaults[key].default:
            what, hint = (("classification", "leave it unset (task.response_column makes this a generation task)")
                          if generation else ("generation", "set task.response_column to make this a generation "
                                              "task"))
            raise ConfigError(f"task.{key} applies to {what} file tasks; {hint}")


def _references(value: object, col: str, where: str) -> tuple[str, ...]:
    """Reference texts of one cell: a list of texts (jsonl, parquet), a JSON array string (csv, tsv) or one text;
    empty for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ()
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            return (text,) if text else ()
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"task.references_column: {where}: column '{col}' holds {text[:40]!r}, which looks "
                              f"like a JSON array but is not valid JSON ({err.msg})") from None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(r, str) for r in value):
        kind = type(value).__name__ if not isinstance(value, list | tuple) else "a list holding " + ", ".join(
            sorted({type(r).__name__ for r in value if not isinstance(r, str)}))
        raise ConfigError(f"task.references_column: {where}: column '{col}' must hold a text or a list of texts, "
                          f"got {kind}")
    refs = tuple(r.strip() for r in value)
    if any(not r for r in refs):
        raise ConfigError(f"task.references_column: {where}: empty reference in column '{col}'; remove it")
    return refs


def _generation_examples(table: Table, cfg: TaskConfig, group_column: str | None) -> list[Example]:
    """One example per row (instruction, input or None, response, references, group); ConfigError naming the key,
    the file and the line for a missing column, an empty instruction or response, or bad references."""
    assert cfg.response_column is not None
    _need_columns(table, {"task.instruction_column": cfg.instruction_column, "task.input_column": cfg.input_column,
                          "task.response_column": cfg.response_column,
                          "task.references_column": cfg.references_column,
                          "federation.partition.column": group_column})
    out = []
    for where, row in table.rows:
        texts = {}
        for key, col, what in (("instruction_column", cfg.instruction_column, "instruction"),
                               ("response_column", cfg.response_column, "response")):
            v = _cell(row.get(col))
            if v is None:
                raise ConfigError(f"task.{key}: {where} has no {what}: no value for '{col}' (a missing key or an "
                                  "empty cell); fill it in or remove the row")
            if not v:
                raise ConfigError(f"task.{key}: {where}: empty {what} in column '{col}'; fill it in or remove the row")
            texts[what] = v
        context = None if cfg.input_column is None else (_cell(row.get(cfg.input_column)) or None)
        refs = () if cfg.references_column is None else _references(row.get(cfg.references_column),
                                                                    cfg.references_column, where)
        group = None
        if group_column is not None:
            group = _cell(row.get(group_column))
            if not group:
                raise ConfigError(f"federation.partition.column: {where} has no value in column '{group_column}'; "
                                  "fill it in or remove the row")
            check_not_missing(group, "federation.partition.column", group_column, where)
        out.append(Example(texts["instruction"], 0, context, group, target=texts["response"], references=refs))
    return out


def _train_test(splits: list[list[Example]], cfg: TaskConfig, train_p: Path) -> tuple[list[Example], list[Example]]:
    """The train and test file's examples, or one file's split by a plain seeded ``task.test_fraction``."""
    if len(splits) == 2:
        return splits[0], splits[1]
    try:
        return plain_split(splits[0], cfg.test_fraction)
    except ValueError as err:
        raise ConfigError(f"task.test_fraction: cannot split the {len(splits[0])} rows of {train_p} ({err}); "
                          "add rows or give task.test_path") from None


def _load_generation(cfg: TaskConfig, tables: list[Table], test_p: Path | None,
                     group_column: str | None) -> TaskData:
    """The generation task of the files read: the test file's rows, else a plain seeded test_fraction split."""
    train, test = _train_test([_generation_examples(t, cfg, group_column) for t in tables], cfg, tables[0].path)
    train_p = tables[0].path
    columns = [cfg.instruction_column, cfg.input_column, cfg.response_column, cfg.references_column]
    return TaskData(name=cfg.name, class_names=[], train=train, test=test, label_words=[], label_descriptions=[],
                    kind="generation", prompt_template=cfg.prompt_template,
                    info={"source": str(train_p), "test": str(test_p) if test_p else f"split {cfg.test_fraction}",
                          "columns": json.dumps(columns), "kind": "generation"},
                    files=[str(t.path.absolute()) for t in tables])


def _preference_examples(table: Table, cfg: TaskConfig, group_column: str | None, skipped: Counter) -> list[Example]:
    """One pair per row: the prompt of ``task.instruction_column`` with the chosen (``task.response_column``) and
    rejected (``task.rejected_column``) responses; a file without the prompt column holds whole dialogues as
    HH-RLHF writes them (split at the last assistant turn). Pairs without a preference are skipped and counted."""
    assert cfg.response_column is not None and cfg.rejected_column is not None
    dialogues = cfg.instruction_column not in table.columns
    _need_columns(table, {"task.instruction_column": None if dialogues else cfg.instruction_column,
                          "task.response_column": cfg.response_column, "task.rejected_column": cfg.rejected_column,
                          "federation.partition.column": group_column})
    out = []
    for where, row in table.rows:
        texts = {}
        for key, col in (("response_column", cfg.response_column), ("rejected_column", cfg.rejected_column),
                         *(() if dialogues else (("instruction_column", cfg.instruction_column),))):
            value = row.get(col)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                raise ConfigError(f"task.{key}: {where} has no value for '{col}' (a missing key or an empty cell); "
                                  "fill it in or remove the row")
            texts[key] = str(value)
        group = None if group_column is None else _cell(row.get(group_column))
        if group_column is not None and not group:
            raise ConfigError(f"federation.partition.column: {where} has no value in column '{group_column}'; "
                              "fill it in or remove the row")
        try:
            if dialogues:
                out.append(preference_pair(texts["response_column"], texts["rejected_column"], group, where))
            else:
                out.append(prompt_pair(texts["instruction_column"].strip(), texts["response_column"].strip(),
                                       texts["rejected_column"].strip(), group, where))
        except SkippedPair as skip:
            skipped[skip.reason] += 1
        except ValueError as err:
            raise ConfigError(f"task.response_column: {err}") from None
    return out


def _load_preference(cfg: TaskConfig, tables: list[Table], test_p: Path | None,
                     group_column: str | None) -> TaskData:
    """The preference task of the files read: the test file's pairs, else a plain seeded test_fraction split."""
    skipped: Counter = Counter()
    train_p = tables[0].path
    train, test = _train_test([_preference_examples(t, cfg, group_column, skipped) for t in tables], cfg, train_p)
    data = preference_task(cfg.name, train, test, [t.path for t in tables], skipped,
                           {"source": str(train_p), "test": str(test_p) if test_p else f"split {cfg.test_fraction}",
                            "columns": json.dumps([cfg.instruction_column, cfg.response_column, cfg.rejected_column])})
    data.prompt_template = cfg.prompt_template
    return data


# ---------------------------------------------------------------- the task


def file_paths(cfg: TaskConfig) -> tuple[Path, Path | None]:
    """(train file, test file or None) from ``task.path`` (a file, or a folder with ``train.<ext>``/``test.<ext>``)
    and ``task.test_path``."""
    ext = cfg.name
    if cfg.path is None:
        raise ConfigError(f"task.path: task '{ext}' needs task.path, a .{ext} file or a folder holding train.{ext} "
                          f"(and optionally test.{ext})")
    path = Path(cfg.path).expanduser()
    test = None if cfg.test_path is None else Path(cfg.test_path).expanduser()
    if path.is_dir():
        train = path / f"train.{ext}"
        if not train.is_file():
            raise ConfigError(f"task.path: folder {path} has no train.{ext}; a data folder holds train.{ext} and "
                              f"optionally test.{ext} (or set task.path to the file itself)")
        if test is None and (path / f"test.{ext}").is_file():
            test = path / f"test.{ext}"
        return train, test
    if not path.exists():
        raise not_found("task.path", path)
    return path, test


def _defaults(names: list[str], words: list[str], pair: bool) -> tuple[list[str], str, str]:
    """Label descriptions, masked-LM and causal templates for a file task."""
    options = ", ".join(words[:-1]) + f" or {words[-1]}"
    causal = "Text 1: {text_a}\nText 2: {text_b}\n" if pair else "Text: {text_a}\n"
    return ([f"This text belongs to the class '{n}'." for n in names],
            PAIR_TEMPLATE if pair else "{text_a} It was {mask}.", causal + f"Answer ({options}):")


def load_file_task(cfg: TaskConfig, group_column: str | None = None) -> TaskData:
    """Load a csv/tsv/jsonl/parquet task (classification, or generation with ``task.response_column``);
    ``group_column`` (``federation.partition.column``) sets ``Example.group``."""
    fmt = cfg.name
    try:
        codecs.lookup(cfg.encoding)
    except LookupError:
        raise ConfigError(f"task.encoding: unknown encoding '{cfg.encoding}' (e.g. utf-8, latin-1, cp1252)") from None
    check_file_kind(cfg)
    train_p, test_p = file_paths(cfg)
    tables = [read_table(p, fmt, cfg.encoding) for p in (train_p, test_p) if p is not None]
    if is_preference(cfg):
        return _load_preference(cfg, tables, test_p, group_column)
    if is_generation(cfg):
        return _load_generation(cfg, tables, test_p, group_column)
    raw = [list(_raw_examples(t, cfg, group_column)) for t in tables]
    if cfg.label_names is None:
        warn_rare_classes([(lab, where) for rows in raw for _, lab, where in rows])
    names, index = _class_names([lab for rows in raw for _, lab, _ in rows], cfg)
    splits = [[Example(e.text_a, index[lab], e.text_b, e.group) for e, lab, _ in rows] for rows in raw]
    if len({e.label for e in splits[0]}) < 2:
        raise ConfigError(f"task.label_column: {train_p} has a single class ({names[splits[0][0].label]!r}) in "
                          f"column '{cfg.label_column}'; a classifier needs at least two")
    train, test = (splits[0], splits[1]) if len(splits) == 2 else _split(splits[0], cfg, train_p)
    words = cfg.label_words or default_label_words(names)
    descriptions, template, causal = _defaults(names, words, cfg.text_pair_column is not None)
    return TaskData(name=fmt, class_names=names, train=train, test=test, label_words=list(words),
                    label_descriptions=descriptions, template=template, causal_template=causal,
                    is_pair=cfg.text_pair_column is not None,
                    info={"source": str(train_p), "test": str(test_p) if test_p else f"split {cfg.test_fraction}",
                          "columns": json.dumps([cfg.text_column, cfg.text_pair_column, cfg.label_column])},
                    files=[str(p.absolute()) for p in (train_p, test_p) if p is not None])


for _fmt in FORMATS:
    TASKS.add(_fmt, lambda cfg, seed: load_file_task(cfg), f"your own {_fmt} file(s): task.path, task.text_column, "
              "task.label_column (docs: tutorials/own-csv.md), or for generation task.instruction_column, "
              "task.response_column; by_column partitions by any column")
