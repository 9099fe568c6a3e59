"""A run is a directory: ``config.yaml``, ``model.json``, ``metrics.jsonl``, ``checkpoint/``, ``summary.json``,
``run.log``.

Checkpoints hold the server state, every client's persistent state and the last finished round,
as safetensors (tensors) + JSON (scalars); they are written to a temporary folder and renamed, so
a crash never leaves a half-written checkpoint. ``meta.json`` records the SHA-256 of every file of its checkpoint,
checked when the checkpoint is read, and the previous checkpoint is kept (``checkpoint-prev/``): a checkpoint that
is damaged (a flipped byte, a truncated or missing file) is reported by file, and a resume falls back to the
previous one, saying so. Resuming truncates ``metrics.jsonl`` to the
checkpointed round (a line cut short by a crash included), so the finished file equals that of an uninterrupted
run. ``summary.json`` is written whole or not at all. While a run writes its directory it holds an exclusive lock
on ``.lock`` (``fcntl.flock``, released by the OS when the process dies), so a second process cannot write it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any

from fedpeft.comm.codec import Message, decode, encode, own_dtypes

log = logging.getLogger(__name__)
RECORD = "model.json"


class RunDirLocked(RuntimeError):
    """Another process is writing this run directory."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, and why (the file named)."""


Checkpoint = tuple[int, Message, dict[int, Message], dict[str, Any]]


def _save_message(path: Path, msg: Message) -> str:
    """Write the message; its file's SHA-256."""
    data = encode(msg, own_dtypes(msg))
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _read_checkpoint(folder: Path) -> Checkpoint:
    """(round, server, clients, meta) of one checkpoint folder, every file checked against the SHA-256 its
    ``meta.json`` records (a checkpoint written before checksums: read as it is); ``CheckpointError`` naming the
    file that is missing, damaged or unreadable."""
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        int(meta["round"])
    except FileNotFoundError:
        raise CheckpointError(f"{meta_path} is missing") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path} is damaged ({type(e).__name__}: {e})") from None
    sums = meta.pop("files", None)
    paths = [folder / "server.safetensors", *sorted((folder / "clients").glob("*.safetensors"))]
    if sums is not None:
        listed = {folder / name for name in sums}
        extra = sorted(str(p) for p in set(paths) - listed)
        if extra:
            raise CheckpointError(f"{extra[0]} is not one of the checkpoint's files (meta.json lists {len(sums)})")
        paths = sorted(listed)
    msgs = {}
    for path in paths:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing") from None
        if sums is not None and hashlib.sha256(data).hexdigest() != sums[str(path.relative_to(folder))]:
            raise CheckpointError(f"{path} does not match the SHA-256 that meta.json records: the file changed "
                                  f"after it was written ({len(data)} bytes)")
        try:
            msgs[path] = decode(data)
        except Exception as e:  # noqa: BLE001 - a file the codec cannot read, named
            raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    server = msgs[folder / "server.safetensors"]
    clients = {int(p.stem): m for p, m in msgs.items() if p.parent.name == "clients"}
    return int(meta.pop("round")), server, clients, meta


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.metrics_path = self.root / "metrics.jsonl"
        self.ckpt = self.root / "checkpoint"
        self.best_ckpt = self.root / "checkpoint-best"
        self._lock: IO[str] | None = None

    def lock(self) -> None:
        """Take the directory's write lock (created with the directory); RunDirLocked if another process holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        f = (self.root / ".lock").open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise RunDirLocked(f"{self.root} is being written by another process (pid {holder}); wait for it or "
                               "use another --out") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f

    def unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def check_free(self) -> None:
        """FileExistsError if the directory already holds a run (a new run must not overwrite one)."""
        if self.metrics_path.exists() or self.ckpt.exists():
            raise FileExistsError(f"{self.root} already holds a run; use --resume or another --out")

    def write_config(self, config_yaml: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.yaml").write_text(config_yaml)

    def write_record(self, record: dict[str, Any]) -> None:
        """``model.json``: what using the run's model needs without its data (classes, label words, templates,
        readout, backbone identity) and the data's fingerprint; written whole or not at all."""
        tmp = self.root / (RECORD + ".tmp")
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(self.root / RECORD)

    def read_record(self) -> dict[str, Any] | None:
        """The run's ``model.json``, or None for a run written before fedpeft kept one."""
        p = self.root / RECORD
        return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None

    def unfinish(self) -> None:
        """The run goes on past its end (``federation.rounds`` grew): it is no longer finished, so its summary.json
        goes until the new last round writes one."""
        (self.root / "summary.json").unlink(missing_ok=True)

    def saved_config(self) -> str | None:
        p = self.root / "config.yaml"
        return p.read_text() if p.exists() else None

    # ---------------------------------------------------------------- metrics

    def append_metrics(self, record: dict[str, Any]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True, allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        """The round records; a last line cut short by a crash (no newline yet) is left out, with a warning."""
        if not self.metrics_path.exists():
            return []
        text = self.metrics_path.read_text()
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            log.warning("%s: the last line was cut short (a crash while it was written); ignored", self.metrics_path)
            lines = lines[:-1]
        return [json.loads(line) for line in lines if line.strip()]

    def truncate_metrics(self, last_round: int) -> list[dict[str, Any]]:
        kept = [r for r in self.read_metrics() if r["round"] <= last_round]
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        tmp.replace(self.metrics_path)
        return kept

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, round: int, server: Message, clients: dict[int, Message],
                        extra: dict[str, Any] | None = None, best: bool = False) -> None:
        """Write the checkpoint of ``round`` (``best``: into ``checkpoint-best/``, the round that scored best on the
        validation split, ``evaluation.keep_best``); the one it replaces becomes ``<name>-prev/``."""
        final = self.best_ckpt if best else self.ckpt
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "clients").mkdir(parents=True)
        sums = {"server.safetensors": _save_message(tmp / "server.safetensors", server)}
        for cid, msg in clients.items():
            if msg.tensors or msg.scalars:
                sums[f"clients/{cid}.safetensors"] = _save_message(tmp / "clients" / f"{cid}.safetensors", msg)
        (tmp / "meta.json").write_text(json.dumps({"round": round, **(extra or {}), "files": sums}, sort_keys=True))
        prev = self.previous(final)
        shutil.rmtree(prev, ignore_errors=True)
        if final.exists():
            final.rename(prev)  # a crash here leaves only the previous one: the resume redoes this round
        tmp.rename(final)
        shutil.rmtree(final.with_name(final.name + ".old"), ignore_errors=True)  # the name before -prev

    @staticmethod
    def previous(folder: Path) -> Path:
        return folder.with_name(folder.name + "-prev")

    def load_checkpoint(self, best: bool = False) -> Checkpoint | None:
        """(round, server state, client states, meta) of the last checkpoint (``best``: of ``checkpoint-best/``),
        or None when the run has none. A damaged last checkpoint gives way to the previous one, with a warning
        naming what is wrong; ``CheckpointError`` when neither can be used."""
        final = self.best_ckpt if best else self.ckpt
        candidates = [f for f in (final, self.previous(final), final.with_name(final.name + ".old")) if f.exists()]
        if not candidates:
            return None
        problems = []
        for folder in candidates:
            try:
                ckpt = _read_checkpoint(folder)
            except CheckpointError as e:
                problems.append(str(e))
                continue
            if problems:
                log.warning("%s; using %s (round %d) instead", "; ".join(problems), folder, ckpt[0])
            return ckpt
        raise CheckpointError("; ".join(problems) + ": no checkpoint of this run can be used (start the run anew "
                              "without --resume, in another --out)")

    def checkpoint_meta(self) -> dict[str, Any]:
        """The last checkpoint's ``meta.json`` (its round and what the run recorded with it, such as ``threads`` and
        ``run_id``; not its files' checksums) without reading its tensors; {} when there is none."""
        for folder in (self.ckpt, self.previous(self.ckpt), self.ckpt.with_name(self.ckpt.name + ".old")):
            try:
                meta = json.loads((folder / "meta.json").read_text())
            except (OSError, ValueError):
                continue
            meta.pop("files", None)
            return meta
        return {}

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json marks a finished run, so it is written to a temporary file and renamed: whole or absent."""
        tmp = self.root / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.root / "summary.json")
