"""Pack a benchmark's runs directory into a small archive under ``benchmarks/results/`` so its records survive the
machine: a finished run keeps only what the tables read (config, metrics, summary, post-hoc and validity records);
an unfinished run is kept whole (checkpoint included) so that ``tar xzf`` and the benchmark's command resume it,
unless it is above ``--max-unfinished-mb`` (a full fine-tuning checkpoint), when it is left out. A folder that is no
run but holds one (a comparison's seed folder, e.g. ``benchmarks.feddpo_openfedllm``'s ``s<seed>/``: fedpeft's run,
the other codebase's output and the scores) is packed by the same rules, one level down.

    python -m benchmarks.archive_runs runs/fedbpt benchmarks/results/fedbpt_runs.tgz
    python -m benchmarks.archive_runs runs/openfedllm_matched OUT.tgz --exclude data   # no copy of shared data
    tar xzf benchmarks/results/fedbpt_runs.tgz        # restores runs/fedbpt/...
"""

from __future__ import annotations

import argparse
import gzip
import tarfile
from pathlib import Path

FINISHED_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "posthoc.json", "validity.json", "run.log",
                  "local_unseen.json", "model.json", "result.json", "stdout.log")
DONE = ("summary.json", "result.json")  # a fedpeft run's, another codebase's run's (benchmarks.exact_lora)
SKIPPED = {".lock", "report.html"}


def finished(path: Path) -> bool:
    return any((path / f).exists() for f in DONE)


def is_group(path: Path) -> bool:
    """A folder of runs rather than a run: no record of its own that it finished, a sub-folder that has one."""
    return not finished(path) and any(c.is_dir() and finished(c) for c in path.iterdir())


def runs_in(runs_dir: Path) -> list[Path]:
    """The run folders under ``runs_dir``, groups opened (see ``is_group``)."""
    out: list[Path] = []
    for path in sorted(runs_dir.iterdir()):
        if path.is_dir() and not path.is_symlink():
            out += runs_in(path) if is_group(path) else [path]
    return out


def archive_members(runs_dir: Path, max_unfinished_bytes: float = float("inf"),
                    exclude: frozenset[str] = frozenset()) -> list[Path]:
    """The files to pack, relative paths under ``runs_dir``'s parent, sorted so archives are reproducible; entries
    of ``runs_dir`` named in ``exclude`` are left out (e.g. a benchmark's copy of data from ``../shared/data``)."""
    members: list[Path] = []
    for path in sorted(p for p in runs_dir.iterdir() if p.name not in exclude):
        if path.is_symlink():
            continue  # e.g. a checkout of another codebase linked in: not ours to pack
        if path.is_file() and path.name not in SKIPPED:
            members.append(path)  # per-benchmark records beside the runs (baselines, calibration)
        elif path.is_dir() and finished(path):
            members += [path / f for f in FINISHED_FILES if (path / f).exists()]
        elif path.is_dir() and is_group(path):
            members += archive_members(path, max_unfinished_bytes)
        elif path.is_dir():
            files = [p for p in sorted(path.rglob("*")) if p.is_file() and p.name not in SKIPPED]
            if sum(p.stat().st_size for p in files) <= max_unfinished_bytes:
                members += files
    return members


def archive(runs_dir: Path, target: Path, max_unfinished_bytes: float = float("inf"),
            exclude: frozenset[str] = frozenset()) -> tuple[int, int]:
    """Write ``target`` (.tgz) from ``runs_dir``; returns (finished runs, unfinished runs), the unfinished ones
    counted whether archived or left out by the size limit."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"runs directory {runs_dir} does not exist")
    target = Path(target)
    partial = target.with_name(f"{target.name}.tmp")  # renamed when whole: a reader never sees half an archive
    # gzip's header time fixed at 0: the same runs give the same bytes, so an unchanged archive is no new commit
    try:
        with open(partial, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w") as tar:
            for path in archive_members(runs_dir, max_unfinished_bytes, exclude):
                tar.add(path, arcname=str(path), recursive=False)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    runs = [p for p in runs_in(runs_dir) if p.relative_to(runs_dir).parts[0] not in exclude]
    done = sum(map(finished, runs))
    return done, len(runs) - done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--max-unfinished-mb", type=float, default=float("inf"),
                        help="leave out unfinished runs larger than this (default: keep every one)")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="NAME",
                        help="entries of the runs directory to leave out (a copy of shared data: never committed)")
    args = parser.parse_args()
    done, open_ = archive(args.runs_dir, args.target, args.max_unfinished_mb * 1e6, frozenset(args.exclude))
    size = args.target.stat().st_size / 1024
    print(f"{args.target}: {done} finished and {open_} unfinished runs, {size:.0f} KiB")


if __name__ == "__main__":
    main()
