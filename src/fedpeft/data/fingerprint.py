"""Fingerprints of a task's data: each file read (absolute path, size, SHA-256) and the loaded examples.

A run directory keeps them (``task.json``) so that ``--resume`` can refuse to continue on data that changed
since the run started, naming the file, instead of silently training the rest of the run on something else.
The examples' hash covers every task kind (benchmark files, BBC, Hugging Face datasets, synthetic tasks, generation
tasks): the splits after sampling, in order, with their labels, groups, responses and references and the class names.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedpeft.data.types import Example, TaskData

_CHUNK = 1 << 20


def file_fingerprint(path: str | Path) -> dict[str, Any]:
    """``{"path": absolute path, "size": bytes, "sha256": hex}`` of one data file."""
    path = Path(path).expanduser().absolute()
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return {"path": str(path), "size": path.stat().st_size, "sha256": h.hexdigest()}


def _example_fields(e: Example) -> list[Any]:
    """What the hash covers of one example; response and references only where set, so that the hash of a
    classification example (no target, no references) stays what it was before generation tasks existed."""
    fields: list[Any] = [e.text_a, e.text_b, e.label, e.group]
    if e.target is not None or e.references:
        fields += [e.target, list(e.references)]
    return fields


def examples_sha256(task: TaskData) -> str:
    """SHA-256 over the class names and every example of both splits (text, pair text, label, group, and for
    generation the response and references)."""
    h = hashlib.sha256(json.dumps(task.class_names).encode())
    for split in (task.train, task.test):
        h.update(b"\x1e")
        for e in split:
            h.update(json.dumps(_example_fields(e), ensure_ascii=False).encode())
    return h.hexdigest()


def data_fingerprint(task: TaskData) -> dict[str, Any]:
    """What ``task.json`` records of the data: the files read, the examples' hash and the split sizes."""
    return {"task": task.name, "source": task.info.get("source"),
            "files": [file_fingerprint(p) for p in task.files],
            "examples_sha256": examples_sha256(task), "train_examples": len(task.train),
            "test_examples": len(task.test)}


def data_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between a recorded fingerprint and the data loaded now, one line each (empty: the same).

    Files are compared first, so the message names the file that changed; data without files (or with the same
    files but other sampling) is compared by the examples' hash."""
    changes = []
    now_files = {f["path"]: f for f in now.get("files", [])}
    for old in saved.get("files", []):
        new = now_files.get(old["path"])
        if new is None:
            changes.append(f"{old['path']}: the run read this file; the config reads it no more")
        elif (new["size"], new["sha256"]) != (old["size"], old["sha256"]):
            changes.append(f"{old['path']}: changed since the run started (size {old['size']:,} -> {new['size']:,} "
                           f"bytes, sha256 {old['sha256'][:12]}… -> {new['sha256'][:12]}…)")
    if not changes and saved.get("examples_sha256") != now.get("examples_sha256"):
        where = now.get("source") or now.get("task")
        changes.append(f"the examples of task '{now.get('task')}' ({where}) differ from those the run trained on "
                       f"(train {saved.get('train_examples')} -> {now.get('train_examples')}, test "
                       f"{saved.get('test_examples')} -> {now.get('test_examples')} examples, or their contents)")
    return changes
