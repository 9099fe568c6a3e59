"""MMLU's original files (Hendrycks et al., 2021) as the MMLU suites read them: ``<split>/<subject>_<split>.csv`` (no
header; ``question, A, B, C, D, answer``) and FlowerTune's category map ``flowertune_categories.json`` (the 44
subjects of STEM, social sciences and humanities), as ``shared/data/MMLU`` holds them.

A fixed stratified subset (``per_subject``) is a seeded draw of that many rows from every subject, the same for every
model, so that two models' scores on it are paired.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpeft.data.paths import DataNotFoundError, shared_data_dir

CATEGORIES = ("stem", "social_sciences", "humanities")  # FlowerTune's three general-NLP columns
LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Item:
    """One MMLU question: its subject, its row in the subject's CSV (0-based), the question, the options A-D and
    the gold letter."""

    subject: str
    row: int
    question: str
    options: tuple[str, str, str, str]
    gold: str


def folder_of(data_dir: str | None, suite: str) -> Path:
    """``data_dir``, or ``shared/data/MMLU`` (DataNotFoundError naming the suite where neither is there)."""
    if data_dir is not None:
        return Path(data_dir)
    root = shared_data_dir()
    if root is None:
        raise DataNotFoundError.for_task(suite, "MMLU", None)
    return root / "MMLU"


def read_subject(path: Path, subject: str) -> list[Item]:
    """The rows of one original MMLU CSV (no header; ``question, A, B, C, D, answer``); ValueError naming the file
    and line of a row that is not six fields with an answer A-D."""
    items = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        line = reader.line_num + 1
        for row in reader:
            if len(row) != 6:
                raise ValueError(f"{path}:{line}: an MMLU row has 6 fields (question, A, B, C, D, answer), this "
                                 f"one {len(row)}")
            if row[5].strip() not in LETTERS:
                raise ValueError(f"{path}:{line}: the answer is one of A, B, C, D, not {row[5]!r}")
            items.append(Item(subject, len(items), row[0], (row[1], row[2], row[3], row[4]), row[5].strip()))
            line = reader.line_num + 1
    return items


def read_categories(folder: Path) -> dict[str, list[str]]:
    """FlowerTune's category map: category -> its subjects."""
    path = folder / "flowertune_categories.json"
    try:
        cats = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataNotFoundError(f"{path}: FlowerTune's category map is missing (shared/data/MMLU holds it)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(cats, dict) or not all(isinstance(v, list) for v in cats.values()):
        raise ValueError(f"{path}: expected {{category: [subject, ...]}}")
    return cats


def subject_file(folder: Path, subject: str, split: str = "test") -> Path:
    path = folder / split / f"{subject}_{split}.csv"
    if not path.is_file():
        raise DataNotFoundError(f"{path}: the {split} file of MMLU subject '{subject}' is missing")
    return path


def load_items(folder: Path, categories: list[str], per_subject: int | None, seed: int) -> list[Item]:
    """The test items of ``categories`` in Flower's order (category, then subject as listed, then row), cut to the
    stratified subset where ``per_subject`` is set (the draw of a subject seeded by ``seed`` and its position)."""
    cats = read_categories(folder)
    unknown = [c for c in categories if c not in cats]
    if unknown:
        raise ValueError(f"categories: {unknown} not in {folder / 'flowertune_categories.json'} ({sorted(cats)})")
    items = []
    for cat in categories:
        for subject in cats[cat]:
            rows = read_subject(subject_file(folder, subject), subject)
            if per_subject is not None and per_subject < len(rows):
                rng = np.random.default_rng([seed, len(items)])
                keep = np.sort(rng.choice(len(rows), per_subject, replace=False))
                rows = [rows[i] for i in keep]
            items.extend(rows)
    return items


def category_of(folder: Path, categories: list[str]) -> dict[str, str]:
    """subject -> its category, for the scored categories."""
    cats = read_categories(folder)
    return {s: c for c in categories for s in cats[c]}
