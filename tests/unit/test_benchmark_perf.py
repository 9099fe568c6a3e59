"""The performance table's helpers: the order arms run in (load drifts hit every arm alike) and the rows' order."""

from benchmarks.perf.common import alternate, rotate
from benchmarks.perf.report import figure_order


def test_rotate_puts_every_arm_in_every_slot():
    calls: list[str] = []

    def arm(name: str):
        def run():
            calls.append(name)
            return float(len(calls)), name
        return run

    out = rotate([arm("A"), arm("B"), arm("C")], 3)
    assert calls == list("ABCBCACAB")
    assert [o for _, o in out] == ["A", "B", "C"]
    assert out[0][0] == [1.0, 6.0, 8.0]  # each arm's own seconds, per repetition


def test_alternate_is_a_b_then_b_a():
    calls: list[str] = []
    ta, tb = alternate(lambda: calls.append("A"), lambda: calls.append("B"), 4)
    assert calls == list("ABBAABBA")
    assert len(ta) == len(tb) == 4


def test_figures_sort_by_number_then_letter():
    assert sorted(["10a", "2", "9", "1a", "2s", "10c", "6c"], key=figure_order) == \
        ["1a", "2", "2s", "6c", "9", "10a", "10c"]
