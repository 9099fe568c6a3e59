"""Returning freed heap pages between simulated clients: throttled, and harmless to the numbers."""

from __future__ import annotations

import sys

import pytest

from fedpeft.runtime.heap import HeapTrimmer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_heap_is_trimmed_at_most_once_per_interval():
    clock, calls = FakeClock(), []
    t = HeapTrimmer(interval_s=1.0, clock=clock)
    t.trim = calls.append
    assert not t.maybe()  # no time has passed
    clock.now = 0.4
    assert not t.maybe()
    clock.now = 1.0
    assert t.maybe() and calls == [0]
    clock.now = 1.9
    assert not t.maybe()
    clock.now = 2.0
    assert t.maybe() and t.trims == 2 and calls == [0, 0]


def test_without_malloc_trim_nothing_is_called():
    clock = FakeClock()
    t = HeapTrimmer(interval_s=0.0, clock=clock)
    t.trim = None
    clock.now = 5.0
    assert not t.maybe() and t.trims == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_on_linux_the_real_malloc_trim_is_found_and_runs():
    t = HeapTrimmer(interval_s=0.0)
    assert t.trim is not None
    assert t.maybe() and t.trims == 1
