"""A line plot as a standalone SVG file, for the results pages.

Our own, small: no plotting library installs offline here (``../shared/ENVIRONMENT.md`` lists none), and a results
page needs only lines over rounds with a legend. Log-scale y where asked (values ≤ 0 are left out of a log plot).
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def line_plot(path: Path, series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
              log_y: bool = False, width: int = 720, height: int = 420) -> Path:
    """Write ``series`` (label -> [(x, y)]) as lines with markers, one colour each, a legend at the right."""
    pts = {k: [(x, y) for x, y in v if y is not None and (y > 0 or not log_y)] for k, v in series.items()}
    pts = {k: v for k, v in pts.items() if v}
    left, right, top, bottom = 70, 260, 40, 50
    w, h = width - left - right, height - top - bottom
    xs = [x for v in pts.values() for x, _ in v] or [0.0, 1.0]
    ys = [y for v in pts.values() for _, y in v] or [1.0]
    ty = (lambda y: math.log10(y)) if log_y else (lambda y: y)  # noqa: E731
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    lo, hi = min(map(ty, ys)), max(map(ty, ys))
    if log_y:
        lo, hi = math.floor(lo), math.ceil(hi) if math.ceil(hi) > math.floor(lo) else math.floor(lo) + 1
    elif hi == lo:
        hi = lo + 1
    px = lambda x: left + (x - x0) / (x1 - x0) * w  # noqa: E731
    py = lambda y: top + h - (ty(y) - lo) / (hi - lo) * h  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#444"/>']
    ticks = range(int(lo), int(hi) + 1) if log_y else [lo + i * (hi - lo) / 4 for i in range(5)]
    for t in ticks:
        y = top + h - (t - lo) / (hi - lo) * h
        label = f"1e{int(t)}" if log_y else f"{t:.3g}"
        out += [f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>',
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>']
    for x in sorted({round(x) for x in xs}):
        out.append(f'<text x="{px(x):.1f}" y="{top + h + 16}" text-anchor="middle">{x}</text>')
    out += [f'<text x="{left + w / 2:.0f}" y="{height - 12}" text-anchor="middle">{escape(xlabel)}</text>',
            f'<text x="16" y="{top + h / 2:.0f}" text-anchor="middle" transform="rotate(-90 16 {top + h / 2:.0f})">'
            f'{escape(ylabel)}</text>']
    for i, (label, v) in enumerate(pts.items()):
        c = COLOURS[i % len(COLOURS)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in v)
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="1.6"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.2" fill="{c}"/>' for x, y in v]
        ly = top + 14 + i * 18
        out += [f'<line x1="{left + w + 12}" x2="{left + w + 32}" y1="{ly - 4}" y2="{ly - 4}" stroke="{c}" '
                'stroke-width="2"/>', f'<text x="{left + w + 38}" y="{ly}">{escape(label)}</text>']
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return path
