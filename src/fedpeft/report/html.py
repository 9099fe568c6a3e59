"""The report page: one self-contained HTML file (inline CSS and SVG, no scripts, no external resources)."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from html import escape
from typing import Any

from fedpeft.report.data import (FLOWERTUNE_BUDGET_MB, ClassReport, Group, Run, _num, best_accuracy, bytes_to_target,
                                 class_report, final_accuracy, final_generation, final_macro_f1, flatten,
                                 is_generation, leaderboard_row, training_rounds, wall_seconds)
from fedpeft.report.plots import confusion
from fedpeft.report.svg import fmt_bytes

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 1.5em; margin: 0 0 4px; } h2 { font-size: 1.15em; margin: 28px 0 8px; }
.meta { color: #666; font-size: 0.9em; }
#generations td, #generations th { white-space: pre-wrap; max-width: 28em; text-align: left; vertical-align: top;
  font-weight: normal; }
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


def _plain(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(map(_plain, v)) if v else "–"
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_plain(x)}" for k, x in v.items())
    return str(v)


COMPONENT_ORDER = ("adapter", "trainer", "aggregator", "selector", "sharing", "downlink", "post_tuning", "transforms",
                   "wrappers")


def components(resolved: Any) -> str | None:
    """``method_resolved`` in one line, in the order a round runs them: ``adapter=lora, trainer=adamw, ...,
    transforms=ldp+clip`` (empty lists left out; keys not known here last)."""
    if not isinstance(resolved, dict) or not resolved:
        return None
    parts = []
    rank = {k: i for i, k in enumerate(COMPONENT_ORDER)}
    for k, v in sorted(resolved.items(), key=lambda kv: rank.get(kv[0], len(rank))):
        if isinstance(v, list):
            if v:
                parts.append(f"{k}={'+'.join(map(str, v))}")
        else:
            parts.append(f"{k}={_plain(v)}")
    return ", ".join(parts)


def method_label(method: Any, summary: dict[str, Any] | None) -> str:
    """The preset's name, marked with the sections the run's config set apart from the preset
    (``preset_overrides``): ``fedavg-lora (sharing, aggregator from config)``."""
    over = (summary or {}).get("preset_overrides")
    if isinstance(over, list) and over:
        return f"{method} ({', '.join(map(str, over))} from config)"
    return method


# summary.json keys whose dict values are written as text rather than JSON (older keys keep their JSON)
READABLE = {
    "method_resolved": lambda v: components(v) or "–",
    "client_names": lambda v: ", ".join(f"{k} {n}" for k, n in v.items()),
    "client_tiers": lambda v: ", ".join(f"{k} {n}" for k, n in v.items()),
    "per_class": lambda v: "; ".join(
        f"{c}: " + ", ".join(f"{k} {_plain(x)}" for k, x in m.items()) if isinstance(m, dict) else f"{c}: {m}"
        for c, m in v.items()),
}


# a local-only run's global adapter is its initialisation: its accuracy is not the method's
UNTRAINED = "– (global adapter never trained: see the clients' accuracy)"


def comparison(groups: list[Group], target: float) -> str:
    def pct(v: float) -> str:
        return f"{v:.4f}"

    runs = [r for g in groups for r in g.runs]
    if runs and all(is_generation(r) for r in runs):
        return _generation_comparison(groups)
    with_components = any(components((r.summary or {}).get("method_resolved")) for r in runs)
    with_f1 = any(final_macro_f1(r) is not None for r in runs)
    with_best = any(_num((r.summary or {}).get("accuracy_at_best_round")) is not None for r in runs)
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
        row = [g.label, len(g.runs), method_label(s["method"], g.runs[0].summary)]
        if with_components:
            row.append(next((c for c in (components((r.summary or {}).get("method_resolved")) for r in g.runs) if c),
                            "–"))
        untrained = all((r.summary or {}).get("global_adapter") == "untrained" for r in g.runs)
        row += [s["task"], s["model"], max(training_rounds(r) for r in g.runs),
                UNTRAINED if untrained else _mean_std([final_accuracy(r) for r in g.runs], pct)]
        if with_f1:
            row.append(_mean_std([final_macro_f1(r) for r in g.runs], pct))
        row.append(_mean_std([best_accuracy(r) for r in g.runs], pct))
        if with_best:
            at = [(r.summary or {}).get("accuracy_at_best_round") for r in g.runs]
            best = [(r.summary or {}).get("best_round") for r in g.runs]
            cell = _mean_std([_num(v) for v in at], pct)
            known = [str(b) for b in sorted({b for b in best if isinstance(b, int) and not isinstance(b, bool)})]
            row.append(cell + (f" (round{'s' if len(known) > 1 else ''} {', '.join(known)})" if known else ""))
        row += [to_target, _mean_std([wall_seconds(r) for r in g.runs], lambda v: f"{v:.1f} s")]
        rows.append(row)
    header = (["run", "runs", "method"] + (["components"] if with_components else [])
              + ["task", "model", "rounds", "final accuracy"] + (["final macro-F1"] if with_f1 else [])
              + ["best accuracy"] + (["accuracy at best validation round"] if with_best else [])
              + [f"bytes up to reach {target:.4f}", "wall time"])
    return _table("comparison", header, rows)


def _generation_comparison(groups: list[Group]) -> str:
    """Generation runs side by side by their own metrics: the final round's BLEU, chrF, ROUGE-L and exact match of
    what the global model wrote, its test loss and perplexity per response token, the upload and the time."""
    rows = []
    for g in groups:
        cfg = g.runs[0].config
        gens = [final_generation(r) or {} for r in g.runs]
        row = [g.label, len(g.runs), method_label(cfg.get("method", {}).get("name", "–"), g.runs[0].summary),
               cfg.get("task", {}).get("name", "–"), cfg.get("model", {}).get("name", "–"),
               max(training_rounds(r) for r in g.runs)]
        row += [_mean_std([_num(x.get(k)) for x in gens], lambda v: f"{v:.1f}")
                for k in ("bleu", "chrf", "rouge_l", "exact_match")]
        row += [_mean_std([_num(r.records[-1].get(k)) if r.records else None for r in g.runs], lambda v: f"{v:.4f}")
                for k in ("loss", "perplexity")]
        row += [_mean_std([_num((r.summary or {}).get("bytes_up_total")) for r in g.runs], fmt_bytes),
                _mean_std([wall_seconds(r) for r in g.runs], lambda v: f"{v:.1f} s")]
        rows.append(row)
    header = ["run", "runs", "method", "task", "model", "rounds", "final BLEU", "final chrF", "final ROUGE-L",
              "final exact match", "final test loss", "final perplexity", "bytes up (total)", "wall time"]
    return _table("comparison", header, rows)


def _group_classes(g: Group) -> tuple[list[ClassReport], list[list[int]] | None, str] | None:
    """The group's per-class report: its runs' reports and confusion matrices where they agree (classes, shape),
    else the first run's alone; the matrix to draw and what the numbers are (for the caption)."""
    reports = [(r, c) for r in g.runs if (c := class_report(r)) is not None]
    if not reports:
        return None
    first = reports[0][1]
    same = [(r, c) for r, c in reports if c.names == first.names and list(c.per_class) == list(first.per_class)]
    if len(same) == 1:
        what = ("" if len(g.runs) == 1 else
                f"The first run with per-class results ({same[0][0].path.name}, seed {same[0][0].seed}). ")
        return [first], first.confusion, what
    mats = [c.confusion for _, c in same]
    summed = None
    if all(m is not None and len(m) == len(mats[0]) for m in mats):
        summed = [[sum(m[i][j] for m in mats) for j in range(len(mats[0]))] for i in range(len(mats[0]))]
    what = (f"{len(same)} runs (seeds {', '.join(str(r.seed) for r, _ in same)}): precision, recall and F1 are "
            f"means ± std over the runs; support{' and the confusion matrix' if summed else ''} summed over them. ")
    if summed is None and first.confusion is not None:
        what += f"The confusion matrix is the first run's ({same[0][0].path.name}), the others have none. "
    return [c for _, c in same], summed, what


def per_class_sections(groups: list[Group]) -> str:
    """Per configuration group with per-class results: a table (precision, recall, F1, support, macro average)
    and the confusion-matrix heatmap (rows true class, columns predicted)."""
    out = []
    for i, g in enumerate(groups):
        found = _group_classes(g)
        if found is None:
            continue
        reports, matrix, what = found
        first = reports[0]
        rounds = sorted({c.round for c in reports if c.round is not None})
        when = (f", round {rounds[0]}" if len(rounds) == 1 else
                f", rounds {', '.join(map(str, rounds))}" if rounds else "")
        head = f"Per class (global model{when})" + ("" if len(groups) == 1 else f": {g.label}")

        def metric(name: str, key: str, reports=reports) -> str:
            return _mean_std([_num(c.per_class.get(name, {}).get(key)) for c in reports], lambda v: f"{v:.4f}")

        def support(name: str, reports=reports) -> str:
            vals = [_num(c.per_class.get(name, {}).get("support")) for c in reports]
            return "–" if None in vals else f"{sum(vals):.0f}"

        rows = [[name, metric(name, "precision"), metric(name, "recall"), metric(name, "f1"), support(name)]
                for name in first.per_class]
        avg = [_mean_std([c.macro(key) for c in reports], lambda v: f"{v:.4f}")
               for key in ("precision", "recall", "f1")]
        totals = [sum(_num(m.get("support")) or 0 for m in c.per_class.values()) for c in reports]
        rows.append(["macro average", *avg, f"{sum(totals):.0f}"])
        svg = confusion(f"plot-confusion-{i}", first, matrix)
        if svg is None and matrix is not None:
            note = "No confusion-matrix heatmap: its row shares do not vary. "
        elif svg is None:
            note = "No confusion matrix recorded. "
        else:
            note = ("Confusion matrix: cell colour is the share of the true class's examples (row-normalised), "
                    "the number the count. ")
        out.append(f"<h2>{escape(head)}</h2>\n<p class=\"meta\">{escape(what + note)}Macro average: unweighted "
                   f"mean over the classes that occur as a label or a prediction (scikit-learn's macro average).</p>\n"
                   + _table(f"per-class-{i}", ["class", "precision", "recall", "F1", "support"], rows)
                   + (f'\n<div class="plots">\n{svg}\n</div>' if svg else "") + "\n")
    return "".join(out)


def generation_samples(runs: list[Run]) -> str:
    """The fixed test prompts with their references (all of them, ‖ between; a run from before they were all kept:
    the first) and what the global model wrote at each decoding round (the first run of the report;
    ``evaluation.show_examples``), or nothing for classification runs."""
    run = next((r for r in runs if any((rec.get("generation") or {}).get("samples") for rec in r.records)), None)
    if run is None:
        return ""
    decoded = [rec for rec in run.records if (rec.get("generation") or {}).get("samples")]
    first = decoded[0]["generation"]["samples"]
    header = ["prompt", "references"] + [f"round {rec['round']}" for rec in decoded]
    rows = [[s["prompt"], " ‖ ".join(s["references"]) if "references" in s else s["reference"]]
            + [rec["generation"]["samples"][i]["generation"]
                                             if i < len(rec["generation"]["samples"]) else "" for rec in decoded]
            for i, s in enumerate(first)]
    return (f"<h2>Generations (<code>{escape(str(run.path))}</code>)</h2>\n"
            + _table("generations", header, rows))


def leaderboard(runs: list[Run]) -> str:
    """FlowerTune's general-NLP columns for the runs scored by ``flowertune-general-nlp``, or nothing."""
    rows = [(r, row) for r in runs if (row := leaderboard_row(r.summary, r.path)) is not None]
    if not rows:
        return ""
    body = [[r.path.name, f"{row['stem']:.2f}", f"{row['social_sciences']:.2f}", f"{row['humanities']:.2f}",
             f"{row['average']:.2f}", row["items"], f"{row['communication_mib']:,.1f}",
             "yes" if row["within_budget"] else "no"] for r, row in rows]
    return ("<h2>FlowerTune LLM leaderboard, general NLP</h2>\n<p class=\"meta\">Flower's generative MMLU "
            "(evaluation.suites: flowertune-general-nlp), accuracy in percent; communication: every array sent, "
            f"both directions, in MiB, against the board's budget of {FLOWERTUNE_BUDGET_MB:,} MB. A subset "
            "(fewer than 10,935 items) is not the board's number.</p>\n"
            + _table("leaderboard", ["run", "STEM", "social sciences", "humanities", "average", "items",
                                     "communication (MiB)", "within budget"], body))


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
    def value(k: str, v: Any) -> Any:
        return READABLE[k](v) if k in READABLE and isinstance(v, dict) and v else v

    rows = [[k] + [value(k, (r.summary or {}).get(k, "–")) for r in runs] for k in keys]
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
{leaderboard(runs)}{per_class_sections(groups)}{generation_samples(runs)}<h2>Summary (summary.json)</h2>
{summary_table(runs)}
<h2>Resolved config (config.yaml)</h2>
{config_tables(runs)}
</body></html>
"""
