"""What the resumable benchmark scripts share: their common options, running their jobs in a process pool, reusing
only finished runs of the same config and writing the results file (the statistics are in ``benchmarks.stats``,
the arms' budgets in ``benchmarks.budget``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def grid_parser(name: str, doc: str, *, seeds: tuple[int, ...] = (0, 1, 2), threads: int = 1,
                workers: int = 2) -> argparse.ArgumentParser:
    """The options every grid benchmark has (runs in ``runs/NAME``, results in ``results/NAME.md`` with the text of
    ``results/NAME_notes.md`` under the setup); the script adds its own."""
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--runs-dir", default=f"runs/{name}")
    p.add_argument("--results", default=str(RESULTS / f"{name}.md"))
    p.add_argument("--notes", default=str(RESULTS / f"{name}_notes.md"),
                   help="text (where it ran, the reading) put under the setup paragraph")
    p.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    p.add_argument("--threads", type=int, default=threads, help="torch threads per run")
    p.add_argument("--workers", type=int, default=workers, help="runs at once, one process each")
    p.add_argument("--render-only", action="store_true", help="rewrite the results file from the finished runs")
    return p


def parse_grid_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options, with ``argv`` kept for the results file's "Rendered with" line."""
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    return args


def run_grid(args, job: Callable[..., str], jobs: list[tuple], render: Callable[..., Path]) -> None:
    """Run the jobs ``job(args, *j)`` not finished yet (unless ``--render-only``), then rewrite the results file;
    ``--render-only`` without the runs folder is refused (the table would be rewritten empty: a fresh checkout holds
    the runs only in ``results/*_runs.tgz``)."""
    if args.render_only and not Path(args.runs_dir).is_dir():
        raise SystemExit(f"--runs-dir {args.runs_dir}: no such folder, so every row would render empty; extract the "
                         "benchmark's archive first (tar xzf benchmarks/results/<name>_runs.tgz) or pass the folder")
    if not args.render_only:
        run_pool(job, [(args, *j) for j in jobs], args.workers)
    print(f"wrote {render(args)}")


def write_results(path, lines: list[str]) -> Path:
    """The results file, its folder made if needed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def run_pool(job: Callable[..., str], jobs: list[tuple], workers: int) -> None:
    """Run ``job(*args)`` for every entry of ``jobs`` in ``workers`` processes, printing each result line; a failed
    run is reported and left for the next invocation to resume, without losing the others."""
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(job, *j) for j in jobs]
        for f in as_completed(futures):
            try:
                print(f.result(), flush=True)
            except Exception as e:
                print(f"failed: {type(e).__name__}: {e}", flush=True)


# keys a finished run may differ in and still count: where it ran (the tables say where), and whether round 0 was
# scored (a record before any training, which changes no later number)
COUNTS_ANYWAY = ("runtime.device", "runtime.threads", "evaluation.round_zero")


def finished(out, overrides: list[str]) -> bool:
    """Whether run directory ``out`` holds a finished run of the config the overrides give, on any device and
    thread count (a grid's GPU rows and CPU rows side by side), with or without round 0 scored; a finished run of
    another config (other rounds, budget, ...) is an error naming the directory, never silently reused."""
    from fedpeft.build import run_plan
    from fedpeft.resolve import load_config
    from fedpeft.runtime.session import config_changes

    out = Path(out)
    if not (out / "summary.json").exists():
        return False
    changes = config_changes((out / "config.yaml").read_text(), run_plan(load_config(None, overrides)))
    if [key for key, _, _ in changes if key not in COUNTS_ANYWAY]:
        raise ValueError(f"{out} finished with another config than this benchmark's; use another --runs-dir")
    return True


def run_config(out, overrides: list[str]) -> str:
    """One fedpeft run in directory ``out`` from ``--set``-style overrides: skipped when finished (with the same
    config), resumed when interrupted; returns a line for the log."""
    import time

    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded

    out = Path(out)
    if finished(out, overrides):
        return f"{out.name}: done before"
    cfg = load_config(None, overrides)
    t0 = time.time()
    run_embedded(cfg, out, resume=(out / "config.yaml").exists())
    return f"{out.name}: {time.time() - t0:.0f} s"
