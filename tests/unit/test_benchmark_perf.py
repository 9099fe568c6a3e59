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


def test_flowertune_speedup_is_per_repetition(tmp_path):
    """Each repetition's speed-up pairs the template's run with the arm's run of the same repetition; a file of one
    run per arm (before repetitions) still renders."""
    import argparse

    from benchmarks.flowertune import ARMS, PEER, render

    def run(*seconds):
        return {"round_seconds": list(seconds), "train_loss": [1.0], "peak_rss": 1e9}

    arm = next(a for a in ARMS if a != PEER)
    args = argparse.Namespace(notes=str(tmp_path / "none.md"), results=str(tmp_path / "out.md"), clients=2, rounds=3,
                              steps=4, batch=4, train_per_category=10, r=16, alpha=32.0, lr=3e-4)
    text = render(args, {PEER: [run(9, 4, 4), run(9, 8, 8)], arm: [run(5, 2, 2), run(5, 2, 2)]}).read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| {arm} |"))
    assert "| 3.00× (2.00–4.00) |" in row and "| 2.0 (5, 2, 2; 5, 2, 2) |" in row
    text = render(args, {PEER: run(9, 4, 4), arm: run(5, 2, 2)}).read_text()
    assert "| 2.00× |" in next(line for line in text.splitlines() if line.startswith(f"| {arm} |"))
