"""Merge the runs a GPU machine sent back (``kit.sh``'s tarballs, made by ``benchmarks.archive_runs``) into the local
runs directories. A finished run is taken unless one is finished here already or a process here holds the run's
lock; an unfinished one only where this machine has none (a local unfinished run is the one its grid resumes).
Records beside the runs are taken when absent.

    python -m benchmarks.device.merge /work/.device/8/lora_family_runs.tgz
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
import tarfile
from collections import defaultdict
from pathlib import Path, PurePosixPath


def _held(run: Path) -> bool:
    """Whether a process holds the run directory's write lock (``RunDir.lock``): a grid is resuming it here."""
    if not (run / ".lock").exists():
        return False
    with (run / ".lock").open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def merge(archive: Path, root: Path = Path(".")) -> dict[str, list[str]]:
    """Extract ``archive``'s runs (``runs/<benchmark>/<run>/...``) under ``root`` by the rules above; returns the
    run names taken and skipped."""
    taken, skipped = [], []
    with tarfile.open(archive) as tar:
        runs: dict[str, list[tarfile.TarInfo]] = defaultdict(list)
        for m in tar.getmembers():
            parts = PurePosixPath(m.name).parts
            if len(parts) < 3 or parts[0] != "runs" or ".." in parts:
                raise ValueError(f"{archive}: member {m.name!r} is not under runs/<benchmark>/")
            runs[str(PurePosixPath(*parts[:3]))].append(m)
        for run, members in sorted(runs.items()):
            local = root / run
            single_file = len(members) == 1 and members[0].name == run
            done_there = any(m.name == f"{run}/summary.json" for m in members)
            if single_file or not done_there:
                keep = not local.exists()
            else:
                keep = not (local / "summary.json").exists() and not _held(local)
                if keep and local.exists():
                    shutil.rmtree(local)  # an unfinished local run of what finished there, no process in it
            (taken if keep else skipped).append(run)
            if keep:
                tar.extractall(root, members=members, filter="data")
    return {"taken": taken, "skipped": skipped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archives", nargs="+", type=Path)
    args = parser.parse_args()
    for archive in args.archives:
        result = merge(archive)
        print(f"{archive}: {len(result['taken'])} taken, {len(result['skipped'])} already here")


if __name__ == "__main__":
    main()
