"""A minimal SVG chart writer: line charts (with shaded bands) and grouped bar charts, axes with ticks,
labels and a legend. No JavaScript; hovering a point shows its value through an SVG ``<title>``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
DASHES = {"solid": "", "dashed": "7 4", "dotted": "2 3", "dashdot": "9 3 2 3", "longdash": "14 4",
          "dashdotdot": "9 3 2 3 2 3"}
W, H = 800, 340  # viewBox
L, R, T, B = 82, 570, 40, 290  # plot area (left, right, top, bottom)
Fmt = Callable[[float], str]


@dataclass
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    lo: Sequence[float] | None = None  # band, drawn when given
    hi: Sequence[float] | None = None
    color: str = PALETTE[0]
    dash: str = "solid"
    band: str = "std"  # band id kind: "std" (mean ± std over seeds) or "range" (min/max over clients)


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    if 1e4 <= abs(v) < 1e9 and v == int(v):
        return f"{v:,.0f}"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.4g}"


def fmt_bytes(v: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.3g} B"


def fit(label: str, px: float, min_chars: int = 3) -> str:
    """``label`` shortened (with an ellipsis) to about ``px`` pixels of 11 px tick text."""
    room = max(min_chars, int(px / 6.5))
    return label if len(label) <= room else label[:room - 1] + "…"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        lo, hi = lo - (abs(lo) * 0.1 or 0.5), hi + (abs(hi) * 0.1 or 0.5)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 12) for i in range(int(math.ceil((hi - start) / step + 1e-9)) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0 ** k for k in range(a, max(b, a + 1) + 1)]


def wants_log(values: Sequence[float]) -> bool:
    """Log scale when the positive values span more than three decades."""
    pos = [v for v in values if v > 0]
    return len(pos) >= 2 and max(pos) / min(pos) > 1e3


class _Scale:
    """Data to pixels; ``tight``: the axis spans the data exactly (ticks inside it), else whole ticks."""

    def __init__(self, values: Sequence[float], a: float, b: float, log: bool, integer: bool = False,
                 tight: bool = False, bounds: tuple[float, float] | None = None) -> None:
        self.log, self.a, self.b = log, a, b
        lo, hi = min(values), max(values)
        if log:
            ticks = log_ticks(lo, hi)
        elif integer and 0 < hi - lo <= 12:
            ticks = [float(t) for t in range(math.floor(lo), math.ceil(hi) + 1)]
        else:
            ticks = nice_ticks(lo, hi)
            if integer and sum(t == int(t) for t in ticks) >= 2:
                ticks = [t for t in ticks if t == int(t)]
        if bounds is not None and bounds[0] <= lo and hi <= bounds[1]:  # e.g. no tick above accuracy 1
            kept = [t for t in ticks if bounds[0] - 1e-12 <= t <= bounds[1] + 1e-12]
            ticks = kept if len(kept) >= 2 and kept[0] <= lo and kept[-1] >= hi else ticks
        if tight and hi > lo:
            eps = 1e-9 * (hi - lo) if not log else 1e-9 * hi
            inside = [t for t in ticks if lo - eps <= t <= hi + eps]
            self.lo, self.hi, self.ticks = lo, hi, inside if len(inside) >= 2 else [lo, hi]
        else:
            self.lo, self.hi, self.ticks = ticks[0], ticks[-1], ticks

    def __call__(self, v: float) -> float:
        f = (lambda x: math.log10(x)) if self.log else (lambda x: x)
        span = f(self.hi) - f(self.lo) or 1.0
        return self.a + (f(v) - f(self.lo)) / span * (self.b - self.a)


def _ok(v: float | None, log: bool) -> bool:
    return v is not None and math.isfinite(v) and (v > 0 or not log)


def _frame(plot_id: str, title: str, xlabel: str, ylabel: str, xticks: list[tuple[float, str]],
           yticks: list[tuple[float, str]], body: list[str], legend: list[tuple[str, str, str, bool]]) -> str:
    out = [f'<svg id="{escape(plot_id)}" class="chart" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>',
           f'<text class="title" x="{(L + R) / 2}" y="22" text-anchor="middle">{escape(title)}</text>',
           f'<rect x="{L}" y="{T}" width="{R - L}" height="{B - T}" fill="none" stroke="#999"/>']
    for x, label in xticks:
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{B + 5}" class="grid"/>'
                   f'<text class="tick" x="{x:.1f}" y="{B + 18}" text-anchor="middle">{escape(label)}</text>')
    for y, label in yticks:
        out.append(f'<line x1="{L - 5}" y1="{y:.1f}" x2="{R}" y2="{y:.1f}" class="grid"/>'
                   f'<text class="tick" x="{L - 8}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
    out.append(f'<text class="label" x="{(L + R) / 2}" y="{H - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text class="label" transform="translate(15 {(T + B) / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(ylabel)}</text>')
    out.extend(body)
    out.append(f'<g class="legend" id="legend-{escape(plot_id.removeprefix("plot-"))}">')
    for i, (label, color, dash, filled) in enumerate(legend[:14]):
        y = T + 8 + 18 * i
        mark = (f'<rect x="{R + 14}" y="{y - 6}" width="22" height="12" fill="{color}" fill-opacity="0.7"/>' if filled
                else f'<line x1="{R + 14}" y1="{y}" x2="{R + 36}" y2="{y}" stroke="{color}" stroke-width="2.5" '
                     f'stroke-dasharray="{DASHES[dash]}"/>')
        short = label if len(label) <= 34 else label[:33] + "…"
        out.append(f'<g>{mark}<text class="tick" x="{R + 42}" y="{y + 4}">{escape(short)}'
                   f'<title>{escape(label)}</title></text></g>')
    if len(legend) > 14:
        out.append(f'<text class="tick" x="{R + 14}" y="{T + 8 + 18 * 14}">+{len(legend) - 14} more</text>')
    out.append("</g></svg>")
    return "\n".join(out)


def empty_chart(plot_id: str, title: str, message: str) -> str:
    body = [f'<text class="label" x="{(L + R) / 2}" y="{(T + B) / 2}" text-anchor="middle">{escape(message)}</text>']
    return _frame(plot_id, title, "", "", [], [], body, [])


def line_chart(plot_id: str, title: str, xlabel: str, ylabel: str, series: list[Series], *, xfmt: Fmt = fmt_num,
               yfmt: Fmt = fmt_num, xlog: bool = False, ylog: bool = False, xint: bool = False,
               ybounds: tuple[float, float] | None = None,
               legend: list[tuple[str, str, str, bool]] | None = None) -> str:
    """Lines (with points and, where ``lo``/``hi`` are given, a shaded band); ``legend`` entries are
    ``(label, colour, dash, filled)``, by default one per series."""
    xs = [x for s in series for x in s.xs if _ok(x, xlog)]
    ys = [y for s in series for seq in (s.ys, s.lo or [], s.hi or []) for y in seq if _ok(y, ylog)]
    if not xs or not ys:
        return empty_chart(plot_id, title, "no data")
    sx, sy = _Scale(xs, L, R, xlog, integer=xint, tight=True), _Scale(ys, B, T, ylog, bounds=ybounds)
    key = plot_id.removeprefix("plot-")
    body = [f'<clipPath id="clip-{escape(key)}"><rect x="{L - 4}" y="{T - 4}" width="{R - L + 8}" '
            f'height="{B - T + 8}"/></clipPath>',
            f'<g clip-path="url(#clip-{escape(key)})">']
    for i, s in enumerate(series):
        if s.lo is not None and s.hi is not None:
            pts = [(x, lo, hi) for x, lo, hi in zip(s.xs, s.lo, s.hi)
                   if _ok(x, xlog) and _ok(lo, ylog) and _ok(hi, ylog)]
            if pts:
                ring = [(sx(x), sy(hi)) for x, _, hi in pts] + [(sx(x), sy(lo)) for x, lo, _ in reversed(pts)]
                d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in ring) + " Z"
                body.append(f'<path id="band-{s.band}-{escape(key)}-{i}" class="band" d="{d}" fill="{s.color}" '
                            f'fill-opacity="{0.2 if s.band == "std" else 0.12}" stroke="none"/>')
    for i, s in enumerate(series):
        pts = [(x, y) for x, y in zip(s.xs, s.ys) if _ok(x, xlog) and _ok(y, ylog)]
        if not pts:
            continue
        d = "M" + " L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        body.append(f'<path id="line-{escape(key)}-{i}" d="{d}" fill="none" stroke="{s.color}" stroke-width="2" '
                    f'stroke-dasharray="{DASHES[s.dash]}"/>')
        for x, y in pts:
            body.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{s.color}">'
                        f'<title>{escape(s.label)}: {escape(xfmt(x))}, {escape(yfmt(y))}</title></circle>')
    body.append("</g>")
    return _frame(plot_id, title, xlabel, ylabel, [(sx(t), xfmt(t)) for t in sx.ticks],
                  [(sy(t), yfmt(t)) for t in sy.ticks], body,
                  legend if legend is not None else [(s.label, s.color, s.dash, False) for s in series])


def bar_chart(plot_id: str, title: str, xlabel: str, ylabel: str, categories: list[str],
              groups: list[tuple[str, list[float | None], list[float | None]]], *, yfmt: Fmt = fmt_num,
              ybounds: tuple[float, float] | None = None) -> str:
    """Grouped bars: ``groups`` are ``(label, value per category, error per category or None)``."""
    vals = [v + (e or 0) for _, vs, es in groups for v, e in zip(vs, es) if v is not None] + [0.0]
    if not categories or len(vals) == 1:
        return empty_chart(plot_id, title, "no data")
    sy = _Scale(vals, B, T, False, bounds=ybounds)
    slot = (R - L) / len(categories)
    width = slot * 0.8 / len(groups)
    body = []
    for g, (label, vs, es) in enumerate(groups):
        color = PALETTE[g % len(PALETTE)]
        for c, (v, e) in enumerate(zip(vs, es)):
            if v is None:
                continue
            x = L + c * slot + slot * 0.1 + g * width
            body.append(f'<rect x="{x:.1f}" y="{sy(v):.1f}" width="{width:.1f}" height="{sy(0) - sy(v):.1f}" '
                        f'fill="{color}" fill-opacity="0.7"><title>{escape(label)}, client {escape(categories[c])}: '
                        f'{escape(yfmt(v))}{"" if not e else " ± " + escape(yfmt(e))}</title></rect>')
            if e:
                cx = x + width / 2
                body.append(f'<line x1="{cx:.1f}" y1="{sy(v - e):.1f}" x2="{cx:.1f}" y2="{sy(v + e):.1f}" '
                            f'stroke="#333"/>')
    every = max(1, math.ceil(len(categories) / 25))  # labels other than plain ids are shortened to their room
    xticks = [(L + (c + 0.5) * slot, cat if cat.isdigit() else fit(cat, slot * every))
              for c, cat in enumerate(categories) if c % every == 0]
    return _frame(plot_id, title, xlabel, ylabel, xticks, [(sy(t), yfmt(t)) for t in sy.ticks], body,
                  [(label, PALETTE[g % len(PALETTE)], "solid", True) for g, (label, _, _) in enumerate(groups)])


HEAT = ((247, 251, 255), (107, 174, 214), (8, 48, 107))  # sequential blues: low, middle, high


def heat_color(f: float) -> str:
    """The colour of ``f`` in [0, 1] on the sequential scale."""
    f = min(1.0, max(0.0, f))
    (a, b), t = ((HEAT[0], HEAT[1]), f * 2) if f <= 0.5 else ((HEAT[1], HEAT[2]), f * 2 - 1)
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


def heatmap(plot_id: str, title: str, xlabel: str, ylabel: str, rows: list[tuple[str, list[float | None]]], *,
            vfmt: Fmt = fmt_num, col_labels: Sequence[str] | None = None,
            cell_text: Sequence[Sequence[str]] | None = None, vrange: tuple[float, float] | None = None) -> str:
    """A grid of rects, one row per ``(label, values)`` (top first), one column per index, coloured on a
    sequential scale from the smallest to the largest value (colour bar on the right; missing values grey).

    ``col_labels`` name the columns (categorical axes: tick labels are shortened to fit, full in the tooltips);
    ``cell_text`` is written in the cells (where they are large enough) and leads their tooltips; ``vrange``
    fixes the colour scale's ends."""
    vals = [v for _, vs in rows for v in vs if v is not None and math.isfinite(v)]
    ncols = max((len(vs) for _, vs in rows), default=0)
    if not vals or not ncols:
        return empty_chart(plot_id, title, "no data")
    lo, hi = vrange if vrange is not None else (min(vals), max(vals))
    span = hi - lo or 1.0
    cw, ch = (R - L) / ncols, (B - T) / len(rows)
    key = plot_id.removeprefix("plot-")
    col = (lambda j: col_labels[j] if j < len(col_labels) else str(j)) if col_labels is not None else str
    body, texts = [f'<g id="cells-{escape(key)}">'], []
    size = min(12.0, ch * 0.45, cw / (0.62 * max((len(t) for r in (cell_text or []) for t in r), default=1) + 0.5))
    for i, (label, vs) in enumerate(rows):
        for j, v in enumerate(vs):
            ok = v is not None and math.isfinite(v)
            fill = heat_color((v - lo) / span) if ok else "#ddd"
            shown = escape(vfmt(v)) if ok else "–"
            text = cell_text[i][j] if cell_text is not None and j < len(cell_text[i]) else None
            if text is not None:
                shown = f"{escape(text)} ({shown})"
            body.append(f'<rect x="{L + j * cw:.2f}" y="{T + i * ch:.2f}" width="{cw:.2f}" height="{ch:.2f}" '
                        f'fill="{fill}"><title>{escape(ylabel)} {escape(label)}, {escape(xlabel)} {escape(col(j))}: '
                        f'{shown}</title></rect>')
            if text is not None and size >= 7:
                dark = ok and (v - lo) / span > 0.55
                texts.append(f'<text x="{L + (j + 0.5) * cw:.2f}" y="{T + (i + 0.5) * ch + size * 0.35:.2f}" '
                             f'text-anchor="middle" font-size="{size:.1f}" fill="{"#fff" if dark else "#222"}" '
                             f'pointer-events="none">{escape(text)}</text>')
    body.append("</g>")
    if texts:
        body += [f'<g id="text-{escape(key)}">', *texts, "</g>"]
    # colour bar (in the legend column), with the smallest, middle and largest value
    bx, steps = R + 20, 24
    for k in range(steps):
        y = B - (k + 1) * (B - T) / steps
        body.append(f'<rect x="{bx}" y="{y:.2f}" width="16" height="{(B - T) / steps + 0.5:.2f}" '
                    f'fill="{heat_color((k + 0.5) / steps)}"/>')
    body.append(f'<rect x="{bx}" y="{T}" width="16" height="{B - T}" fill="none" stroke="#999"/>')
    for f in (0.0, 0.5, 1.0):
        y = B - f * (B - T)
        body.append(f'<text class="tick" x="{bx + 22}" y="{y + 4:.1f}">{escape(vfmt(lo + f * (hi - lo)))}</text>')
    every = max(1, math.ceil(ncols / 16))
    xticks = [(L + (j + 0.5) * cw, str(j) if col_labels is None else fit(col(j), cw * every))
              for j in range(ncols) if j % every == 0]
    every = max(1, math.ceil(len(rows) / 12))
    yticks = [(T + (i + 0.5) * ch, label if col_labels is None else fit(label, L - 12))
              for i, (label, _) in enumerate(rows) if i % every == 0]
    return _frame(plot_id, title, xlabel, ylabel, xticks, yticks, body, [])
