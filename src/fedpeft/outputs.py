"""Output locations checked before any work: a run directory, a report, an export, a predictions file.

Every command that writes checks where it will write first, so a path under a file, a read-only folder or a
missing permission is one line naming the path, before a model loads or a round trains, not a traceback after
the work. ``OutputError`` is a ``ValueError``: the command line prints it as one line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputError(ValueError):
    """An output location that cannot be written; the message names the option and the path."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (a file or a folder)."""
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(path.anchor or ".")


def _probe(folder: Path, option: str, target: Path) -> None:
    """Create and remove a file in ``folder``: the one test that also sees read-only mounts, ACLs and quotas."""
    try:
        fd, name = tempfile.mkstemp(prefix=".fedpeft-probe-", dir=folder)
    except OSError as e:
        raise OutputError(f"{option}: cannot write {target}: {folder} is not writable ({e.strerror})") from None
    os.close(fd)
    os.unlink(name)


def check_output_dir(path: str | Path, option: str, target: Path | None = None) -> Path:
    """``path`` can be used as (or created as) a folder to write in; OutputError naming ``option`` and ``target``
    (what is to be written there, default ``path``) otherwise."""
    path = Path(path).expanduser()
    target = target or path
    base = _nearest_existing(path.absolute())
    if not base.is_dir():
        what = "is a file, not a folder" if base == path.absolute() else "is a file, so nothing can be created under it"
        raise OutputError(f"{option}: cannot write {target}: {base} {what}")
    _probe(base, option, target)
    return path


def check_output_file(path: str | Path, option: str) -> Path:
    """``path`` can be written as a file (its folder exists or can be created); OutputError otherwise."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputError(f"{option}: cannot write {path}: it is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{option}: cannot write {path}: the file is not writable")
    check_output_dir(path.parent, option, path)
    return path


def os_error_line(err: OSError) -> str:
    """One line for an operating-system error: the path(s) it names and the reason, no traceback."""
    paths = " -> ".join(str(p) for p in (err.filename, err.filename2) if p is not None)
    reason = err.strerror or type(err).__name__
    return f"{paths}: {reason}" if paths else f"{reason}: {err}"
