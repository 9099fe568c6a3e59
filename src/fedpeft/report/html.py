"""The report page: one self-contained HTML file (inline CSS and SVG, no scripts, no external resources)."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from html import escape
from typing import Any

from fedpeft.report.data import (Group, Run, best_accuracy, bytes_to_target, final_accuracy, flatten,
                                 wall_seconds)
from fedpeft.report.svg import fmt_bytes

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 1.5em; margin: 0 0 4px; } h2 { font-size: 1.15em; margin: 28px 0 8px; }
.meta { color: #666; font-size: 0.9em; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 12px; }
svg.chart { width: 100%; height: auto; background: #fff; border: 1px solid #ddd; border-radius: 4px; }
svg .title { font-size: 15px; font-weight: 600; } svg .label { font-size: 12px; fill: #333; }
svg .tick { font-size: 11px; fill: #444; } svg .grid { stroke: #e4e4e4; }
table { border-collapse: collapse; font-size: 0.85em; background: #fff; margin-bottom: 8px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.diff td { background: #fff6dd; } .scroll { overflow-x: auto; max-width: 100%; }
details { margin: 6px 0; } code { font-size: 0.95em; }
"""


def _mean_std(values: list[float | None], fmt) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(statistics.fmean(vals))} ± {fmt(statistics.stdev(vals))}"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        v = f"{v:.6g}"
    elif isinstance(v, (list, dict)):
        v = json.dumps(v)
    cls = ' class="num"' if isinstance(v, (int, float)) or (isinstance(v, str) and v[:1].isdigit()) else ""
    return f"<td{cls}>{escape(str(v))}</td>"


def _table(table_id: str, header: list[str], rows: list[list[Any]], diff: list[bool] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    out = [f'<div class="scroll"><table id="{table_id}"><tr>{head}</tr>']
    for i, row in enumerate(rows):
        cls = ' class="diff"' if diff and diff[i] else ""
        out.append(f"<tr{cls}><th>{escape(str(row[0]))}</th>" + "".join(_cell(v) for v in row[1:]) + "</tr>")
    return "\n".join(out) + "</table></div>"


def comparison(groups: list[Group], target: float) -> str:
    def pct(v: float) -> str:
        return f"{v:.4f}"

    rows = []
    for g in groups:
        cfg = g.runs[0].config
        s = {"method": cfg.get("method", {}).get("name", "–"), "task": cfg.get("task", {}).get("name", "–"),
             "model": cfg.get("model", {}).get("name", "–")} | (g.runs[0].summary or {})
        reach = [bytes_to_target(r, target) for r in g.runs]
        reached = sum(v is not None for v in reach)
        to_target = _mean_std(reach, fmt_bytes)
        if reached < len(reach):
            to_target += f" ({reached}/{len(reach)} reached)"
        rows.append([g.label, len(g.runs), s["method"], s["task"], s["model"], max(len(r.records) for r in g.runs),
                     _mean_std([final_accuracy(r) for r in g.runs], pct),
                     _mean_std([best_accuracy(r) for r in g.runs], pct), to_target,
                     _mean_std([wall_seconds(r) for r in g.runs], lambda v: f"{v:.1f} s")])
    header = ["run", "runs", "method", "task", "model", "rounds", "final accuracy", "best accuracy",
              f"bytes up to reach {target:.4f}", "wall time"]
    return _table("comparison", header, rows)


def config_tables(runs: list[Run]) -> str:
    flat = [flatten(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    if len(runs) == 1:
        return _table("config", ["key", "value"], [[k, flat[0][k]] for k in keys])
    rows = [[k] + [f.get(k, "–") for f in flat] for k in keys]
    diff = [len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flat}) > 1 for k in keys]
    differing = [row for row, d in zip(rows, diff) if d]
    names = [r.path.name for r in runs]
    return ("<p>Keys that differ between the runs:</p>"
            + (_table("config-diff", ["key"] + names, differing) if differing else "<p>none</p>")
            + "<details><summary>full configs</summary>"
            + _table("config", ["key"] + names, rows, diff) + "</details>")


def summary_table(runs: list[Run]) -> str:
    keys = list(dict.fromkeys(k for r in runs for k in (r.summary or {})))
    if not keys:
        return "<p>no summary.json (run unfinished)</p>"
    rows = [[k] + [(r.summary or {}).get(k, "–") for r in runs] for k in keys]
    return _table("summary", ["key"] + [r.path.name for r in runs], rows)


def page(groups: list[Group], target: float, plots: list[str]) -> str:
    runs = [r for g in groups for r in g.runs]
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    title = groups[0].label if len(groups) == 1 else f"{len(groups)} configurations, {len(runs)} runs"
    run_list = "".join(f"<li><code>{escape(str(r.path))}</code></li>" for r in runs)
    note = ("" if all(len(g.runs) == 1 for g in groups) else
            "<p class=meta>Runs whose config.yaml differ only in <code>seed</code> and <code>name</code> are "
            "aggregated: lines are means, shaded bands ± one standard deviation.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>fedpeft report: {escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>fedpeft report: {escape(title)}</h1>
<p class="meta">generated {escape(when)}</p>
<details><summary>run directories</summary><ul>{run_list}</ul></details>
<h2>Comparison</h2>
{comparison(groups, target)}
{note}
<h2>Plots</h2>
<div class="plots">
{chr(10).join(plots)}
</div>
<h2>Summary (summary.json)</h2>
{summary_table(runs)}
<h2>Resolved config (config.yaml)</h2>
{config_tables(runs)}
</body></html>
"""
