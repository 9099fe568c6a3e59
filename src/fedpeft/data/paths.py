"""Where the offline benchmark files live, and the error raised when they are not there.

The benchmark files sit in ``shared/data`` beside the project checkout (``/work/shared/data`` for a
checkout at ``/work/main``); ``FEDPEFT_DATA_DIR`` or a task's ``path`` points elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "FEDPEFT_DATA_DIR"


class DataNotFoundError(FileNotFoundError):
    """A task's data folder or file is missing; the message says where it was expected and how to point at it."""

    @classmethod
    def for_task(cls, task: str, folder: str, expected: Path | None) -> DataNotFoundError:
        """Build the error for ``task`` whose folder ``folder`` was looked for at ``expected`` (None: no data dir)."""
        where = (
            f"expected {expected}"
            if expected is not None
            else f"no shared/data folder was found above the working directory, and {ENV_VAR} is not set"
        )
        return cls(
            f"data for task '{task}' not found ({where}). Put the '{folder}' folder in shared/data beside "
            f"the repository, set {ENV_VAR} to the folder that contains '{folder}/', "
            f"or set task.path to the '{folder}' folder itself."
        )


def _find_upward(start: Path) -> Path | None:
    """First ``<ancestor>/shared/data`` directory at or above ``start``."""
    for ancestor in (start, *start.parents):
        candidate = ancestor / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return None


def shared_data_dir() -> Path | None:
    """The benchmark data folder: ``$FEDPEFT_DATA_DIR``, else the nearest ``<ancestor>/shared/data``; None if absent."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    for start in (Path.cwd().resolve(), Path(__file__).resolve().parent):
        found = _find_upward(start)
        if found is not None:
            return found
    return None
