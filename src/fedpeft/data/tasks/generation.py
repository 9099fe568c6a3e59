"""Built-in generation (instruction-tuning) tasks read from ``shared/data`` (see its README): WebNLG and Dolly.

Each example is (instruction ``text_a``, input ``text_b`` or None, response ``target``, ``references``), its
``group`` the natural client (the category); ``label`` is 0 and the task has no classes (``kind`` generation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedpeft.config import TaskConfig
from fedpeft.data.tasks.base import TASKS, data_folder, need_files
from fedpeft.data.types import Example, TaskData


GENERATION_TASKS = ("webnlg", "dolly")  # the built-in generation tasks (their kind is known before loading)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line; ValueError naming the file and line if one is bad."""
    records = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {i} is not valid JSON ({err.msg})") from None
    return records


def generation_example(row: dict[str, Any], references: tuple[str, ...] = ()) -> Example:
    """An example of a converted record: instruction, input (None when blank), output as target, category as group."""
    context = row.get("input") or ""
    return Example(row["instruction"], 0, context if context.strip() else None, row["category"],
                   target=row["output"], references=references)


def generation_task(name: str, train: list[Example], test: list[Example], files: list[Path],
                    **info: str) -> TaskData:
    """A generation ``TaskData``: no classes, label words or descriptions; ``load_task`` sets the prompt template."""
    return TaskData(name=name, class_names=[], train=train, test=test, label_words=[], label_descriptions=[],
                    kind="generation", info={"kind": "generation"} | info,
                    files=[str(p.absolute()) for p in files])


@TASKS.register("webnlg", "WebNLG 2017 data-to-text generation (triples -> text), one client per DBpedia category; "
                          "test adds 5 categories unseen in training; multi-reference")
def load_webnlg(cfg: TaskConfig, seed: int) -> TaskData:
    """WebNLG 2017 (enriched v1.6, English): train.jsonl (10 categories) and test.jsonl (15; all kept)."""
    train_p, test_p = need_files(data_folder(cfg, "WebNLG"), "train.jsonl", "test.jsonl", task=cfg.name)
    read = lambda p: [generation_example(r, tuple(r["references"])) for r in read_records(p)]  # noqa: E731
    train, test = read(train_p), read(test_p)
    unseen = sorted({e.group for e in test if e.group is not None} - {e.group for e in train})
    return generation_task("webnlg", train, test, [train_p, test_p], source=str(train_p.parent),
                           origin="ThiagoCF05/webnlg v1.6 en, converted from XML (see WebNLG/PROVENANCE.md)",
                           unseen_categories=",".join(unseen),
                           unseen="test categories absent from train; by_column gives them to no client")


@TASKS.register("dolly", "databricks-dolly-15k instruction tuning, one client per category (8); train/test by the "
                         "file's split column")
def load_dolly(cfg: TaskConfig, seed: int) -> TaskData:
    """databricks-dolly-15k (reassembled, see Dolly/PROVENANCE.md): its ``split`` column gives train and test."""
    (path,) = need_files(data_folder(cfg, "Dolly"), "dolly15k.jsonl", task=cfg.name)
    splits: dict[str, list[Example]] = {"train": [], "test": []}
    for i, row in enumerate(read_records(path), start=1):
        if row.get("split") not in splits:
            raise ValueError(f"{path} record {i}: split {row.get('split')!r} is neither 'train' nor 'test'")
        splits[row["split"]].append(generation_example(row))
    return generation_task("dolly", splits["train"], splits["test"], [path], source=str(path.parent),
                           origin="databricks-dolly-15k reassembled from the FedIT 10-client split "
                                  "(see Dolly/PROVENANCE.md)")
