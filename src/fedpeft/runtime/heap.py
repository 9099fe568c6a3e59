"""Give freed heap pages back to the operating system while a simulation holds many small per-client buffers.

Each simulated client's training frees megabytes of temporaries, then keeps a few small long-lived buffers (its
new state, its reply). glibc cannot shrink a heap below a live block, so with 1,000 clients in one process these
freed pages stay resident: +42 MiB of peak RSS beyond the client states at 1,000 MiniLM clients (``benchmarks/
perf.py`` figure 4). ``malloc_trim(0)`` returns every whole free page inside the heap (``madvise(MADV_DONTNEED)``)
without moving anything, so numbers are unaffected. It walks the heap (a few ms), hence ``HeapTrimmer`` calls it
at most once per ``interval_s`` (0.25 s: under 2 % of the time at 1,000 clients). Without glibc (macOS, musl, Windows)
it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class HeapTrimmer:
    """``maybe()`` after each client: trims the heap if ``interval_s`` has passed since the last trim."""

    def __init__(self, interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.trim = _malloc_trim()
        self.last = clock()
        self.trims = 0

    def maybe(self) -> bool:
        """Trim now if due (and possible); True if it did."""
        if self.trim is None or self.clock() - self.last < self.interval_s:
            return False
        self.trim(0)
        self.last = self.clock()
        self.trims += 1
        return True
