"""What the resumable benchmark scripts share: running their jobs in a process pool, and mean ± std cells."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed


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


def mean_std(xs: list, scale: float = 100.0, digits: int = 1) -> str:
    """'m ± s' of the non-missing values (scaled), 'm' for one value, '–' for none."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.fmean(xs) * scale
    return f"{m:.{digits}f} ± {statistics.stdev(xs) * scale:.{digits}f}" if len(xs) > 1 else f"{m:.{digits}f}"
