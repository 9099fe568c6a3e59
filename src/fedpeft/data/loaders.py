"""Readers for the benchmark file formats described in ``shared/data/README.md``, each returning ``Example`` lists.

Columns are named by header (files with a header) or by 0-based index (files without one). Labels
are converted with ``label_map`` when given (string labels such as ``entailment``), else parsed as
integers. A malformed row raises ``ValueError`` naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedpeft.data.types import Example

Column = str | int
LabelMap = Mapping[str, int]


def _label(value: object, label_map: LabelMap | None, where: str) -> int:
    """Convert one raw label (string, int or bool) to a class index."""
    key = str(value).lower() if isinstance(value, bool) else str(value).strip()
    if label_map is not None:
        try:
            return label_map[key]
        except KeyError:
            raise ValueError(f"{where}: unknown label {key!r}; expected one of {sorted(label_map)}") from None
    try:
        return int(key)
    except ValueError:
        raise ValueError(f"{where}: label {key!r} is not an integer and no label_map was given") from None


def _pick(row: Mapping[Column, str] | Sequence[str], col: Column, where: str) -> str:
    """One field of a row, by header name or by index."""
    try:
        return row[col]  # type: ignore[index]
    except (KeyError, IndexError):
        raise ValueError(f"{where}: missing column {col!r}") from None


def _examples(
    rows: Iterable[tuple[str, Mapping[Column, object] | Sequence[object]]],
    text_a: Column | Sequence[Column],
    label: Column,
    text_b: Column | None,
    label_map: LabelMap | None,
) -> list[Example]:
    """Turn (location, row) pairs into Examples; several ``text_a`` columns are joined with a space."""
    cols_a = [text_a] if isinstance(text_a, str | int) else list(text_a)
    out = []
    for where, row in rows:
        a = " ".join(str(_pick(row, c, where)).strip() for c in cols_a)  # type: ignore[arg-type]
        b = None if text_b is None else str(_pick(row, text_b, where)).strip()  # type: ignore[arg-type]
        out.append(Example(a, _label(_pick(row, label, where), label_map, where), b))  # type: ignore[arg-type]
    return out


def read_tsv(
    path: str | Path,
    text_a: Column | Sequence[Column],
    label: Column,
    text_b: Column | None = None,
    *,
    header: bool = True,
    label_map: LabelMap | None = None,
    encoding: str = "utf-8",
) -> list[Example]:
    """Read a GLUE-style TSV (no quoting; CoLA has no header, MRPC needs ``encoding="utf-8-sig"``)."""
    path = Path(path)
    with path.open(encoding=encoding, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if header:
            names = next(reader)
            rows = ((f"{path}:{i}", dict(zip(names, r, strict=False))) for i, r in enumerate(reader, start=2) if r)
        else:
            rows = ((f"{path}:{i}", r) for i, r in enumerate(reader, start=1) if r)
        return _examples(rows, text_a, label, text_b, label_map)  # type: ignore[arg-type]


def read_csv(
    path: str | Path,
    text_a: Column | Sequence[Column],
    label: Column,
    text_b: Column | None = None,
    *,
    label_map: LabelMap | None = None,
    encoding: str = "utf-8",
) -> list[Example]:
    """Read a quoted CSV with a header row (AG News ``test.csv``: ``Class Index,Title,Description``)."""
    path = Path(path)
    with path.open(encoding=encoding, newline="") as f:
        rows = ((f"{path}:{i}", r) for i, r in enumerate(csv.DictReader(f), start=2))
        return _examples(rows, text_a, label, text_b, label_map)  # type: ignore[arg-type]


def read_jsonl(
    path: str | Path,
    text_a: str | Sequence[str],
    label: str,
    text_b: str | None = None,
    *,
    label_map: LabelMap | None = None,
) -> list[Example]:
    """Read one JSON object per line (MNLI/SNLI dev, BoolQ, IMDB, 20 Newsgroups)."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        rows = ((f"{path}:{i}", json.loads(line)) for i, line in enumerate(f, start=1) if line.strip())
        return _examples(rows, text_a, label, text_b, label_map)


def read_pretrain_json(path: str | Path, label_map: LabelMap) -> list[Example]:
    """Read a PowerfulPromptFT ``glue_pretrain_*.json``: one object keyed "0", "1", ... with text_a/text_b/label."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    keys = sorted(data, key=int)
    rows = ((f"{path}[{k}]", data[k]) for k in keys)
    return _examples(rows, "text_a", "label", "text_b", label_map)


def read_lines(path: str | Path, label: int, encoding: str = "latin-1") -> list[Example]:
    """Read one sentence per line (MR ``rt-polarity.*``, MPQA): split on ``\\n`` bytes only, as byte 0x85 occurs."""
    raw = Path(path).read_bytes()
    lines = (line.rstrip(b"\r").decode(encoding).strip() for line in raw.split(b"\n"))
    return [Example(text, label) for text in lines if text]


def read_label_prefixed(path: str | Path, encoding: str = "utf-8") -> list[Example]:
    """Read ``<label> <text>`` lines split at the first space (TextFooler's Yelp sample)."""
    path = Path(path)
    out = []
    for i, line in enumerate(path.read_text(encoding=encoding).split("\n"), start=1):
        if not line.strip():
            continue
        label, _, text = line.partition(" ")
        out.append(Example(text.strip(), _label(label, None, f"{path}:{i}")))
    return out
