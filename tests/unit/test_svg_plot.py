"""The results pages' line plot (``benchmarks/svg_plot.py``): valid SVG, one line per series, a log axis that leaves
out what it cannot draw."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from benchmarks.svg_plot import line_plot

NS = "{http://www.w3.org/2000/svg}"


def test_one_polyline_per_series_and_log_axis_drops_non_positive(tmp_path):
    path = line_plot(tmp_path / "p.svg", {"exact": [(1, 0.0), (2, 1e-8)], "inexact": [(1, 0.2), (2, 0.1)],
                                          "none": [(1, None)]}, "t", "round", "error", log_y=True)
    root = ET.parse(path).getroot()
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 2  # "none" has nothing to draw
    assert [len(pl.get("points").split()) for pl in lines] == [1, 2]  # the 0 is not on a log axis
    labels = [t.text for t in root.findall(f"{NS}text")]
    assert "exact" in labels and "inexact" in labels and "none" not in labels
    assert {"1e-8", "1e0"} <= set(labels)  # decades from the smallest to the largest value
