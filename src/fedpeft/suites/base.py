"""The suite contract: a registered class built from its settings that scores an objective's tensors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fedpeft.registry import Registry


@dataclass
class SuiteResult:
    """A suite's scores (``scores``: name -> number, the suite's headline first), each item's record (``items``:
    its id, gold answer, what the model wrote and what was read from it) and how it was run (``protocol``)."""

    suite: str
    scores: dict[str, float]
    items: list[dict[str, Any]] = field(default_factory=list)
    protocol: dict[str, Any] = field(default_factory=dict)

    def write(self, out: Path) -> tuple[Path, Path]:
        """``out`` (the scores and protocol, JSON) and ``<out stem>.items.jsonl`` beside it (one item a line)."""
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        items = out.with_name(out.stem + ".items.jsonl")
        out.write_text(json.dumps({"suite": self.suite, "scores": self.scores, "protocol": self.protocol,
                                   "items_file": items.name}, indent=2) + "\n", encoding="utf-8")
        with items.open("w", encoding="utf-8") as f:
            for item in self.items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
        return out, items


def kept_result(run_dir: Path | str, name: str) -> Path:
    """Where a run directory keeps its global adapter's result of suite ``name`` (``suites/<name>.json``, with
    ``lmeval:TASK`` written ``lmeval-TASK``)."""
    return Path(run_dir) / "suites" / f"{name.replace(':', '-')}.json"


def json_lines(path: Path | str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSON-lines file (gzip where it ends .gz); ValueError
    naming the file and line of one that is not a JSON object."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            rows.append((n, row))
    return rows


def standard_error(p: float, n: int) -> float:
    """The binomial standard error of a proportion ``p`` over ``n`` items."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


class Suite(Protocol):
    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        """Score ``params`` through ``objective`` (a ``LanguageModel``) by the suite's protocol."""
        ...


SUITES: Registry[type] = Registry("evaluation suite")


def build_suite(name: str, limit: int | None = None, **fields: Any) -> Suite:
    """A suite by its name with its settings: ``fields``, and ``limit`` set on the field the suite's settings name
    (``limit_field``: items per subject for the MMLU suites, the first items elsewhere). ``lmeval:TASK`` is the
    ``lmeval`` suite on TASK."""
    base, _, task = name.partition(":")
    if task:
        if base != "lmeval":
            raise ValueError(f"suite '{name}': only lmeval takes a task after ':' (lmeval:boolq)")
        fields = fields | {"task": task}
    entry = SUITES.entry(base)
    if limit is not None:
        fields = fields | {entry.settings.limit_field: limit}
    return entry.obj(entry.settings(**fields))
