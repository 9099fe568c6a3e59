"""A run's torch thread count: ``runtime.threads``, or resolved once when the run starts; used by every process.

With another thread count a matrix product may sum in another order, which changes the last bits of the numbers.
So one count holds for the whole run: the server sets it, and so does each process that trains or evaluates
clients: the embedded runtime's client workers, Flower's ClientApps in Ray actors and on SuperNodes (the server
sends it with every message, ``node_service.serve`` sets it). Unset, it is the count torch has in the process that
starts the run (torch's default: ``OMP_NUM_THREADS``, else the machine's cores), at most the cores this process
may use, divided among ``runtime.client_workers``; a resumed run keeps the count it started with (each checkpoint
records it). ``summary.json`` (``threads``) and a ``run.log`` line show the count a run used.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch

from fedpeft.config import RuntimeConfig
from fedpeft.tracking.rundir import RunDir

log = logging.getLogger("fedpeft")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``os.cpu_count`` where there is none, as on macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_threads(client_workers: int = 1) -> int:
    """The count an unset ``runtime.threads`` resolves to in this process: torch's, at most the usable cores,
    shared by ``client_workers`` processes (at least 1)."""
    return max(1, min(torch.get_num_threads(), usable_cores()) // client_workers)


def run_threads(runtime: RuntimeConfig, run: RunDir, resume: bool) -> tuple[int, str]:
    """The run's thread count and where it came from: ``runtime.threads``; on resume the count the run recorded;
    else ``default_threads``."""
    if runtime.threads:
        return runtime.threads, "runtime.threads"
    recorded = run.checkpoint_meta().get("threads") if resume else None
    if recorded:
        return int(recorded), "recorded when the run started"
    return default_threads(runtime.client_workers), "runtime.threads unset: resolved at the start of the run"


@contextlib.contextmanager
def using(threads: int) -> Iterator[int]:
    """torch computes with ``threads`` threads in this process until the block ends; the previous count is put
    back then (so one run's count never becomes the next run's default)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def for_run(runtime: RuntimeConfig, run: RunDir, resume: bool) -> Iterator[int]:
    """The run's count (``run_threads``), written to the log and set in this process for the block (``using``)."""
    threads, source = run_threads(runtime, run, resume)
    log.info("torch threads: %d (%s), for the server and every client of the run", threads, source)
    with using(threads):
        yield threads
