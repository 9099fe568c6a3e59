"""The report's charts, one function each; several groups are overlaid (colour = group, dash = quantity)."""

from __future__ import annotations

import re
import statistics

from fedpeft.report.data import (ClassReport, Group, aggregate, client_names, cumulative, last_local, per_round,
                                 server_keys, varies, vector_keys, vector_rows)
from fedpeft.report.svg import PALETTE, Series, bar_chart, fmt_bytes, heatmap, line_chart, wants_log

GREY = "#555"


def _color(groups: list[Group], g: int, s: int) -> str:
    return PALETTE[(s if len(groups) == 1 else g) % len(PALETTE)]


def _legend(groups: list[Group], series: list[Series], kinds: list[tuple[str, str]]):
    """One entry per series for a single group; else one per group (colour) and one per quantity (dash)."""
    if len(groups) == 1:
        return None
    return (([(label, GREY, dash, False) for label, dash in kinds] if len(kinds) > 1 else [])
            + [(g.short, PALETTE[i % len(PALETTE)], "solid", False) for i, g in enumerate(groups)
               if any(s.label.startswith(f"{g.short}: ") for s in series)])


def _lines(groups: list[Group], kinds: list[tuple[str, str, object]]) -> tuple[list[Series], list[tuple[str, str]]]:
    """Series for every group and every quantity ``(label, dash, record -> value)`` that has data."""
    series, used = [], []
    for gi, g in enumerate(groups):
        for si, (label, dash, get) in enumerate(kinds):
            a = aggregate([per_round(r, get) for r in g.runs])
            if a.xs:
                name = label if len(groups) == 1 else f"{g.short}: {label}"
                series.append(Series(name, a.xs, a.mean, a.lo, a.hi, _color(groups, gi, si), dash))
                if (label, dash) not in used:
                    used.append((label, dash))
    return series, used


def accuracy(groups: list[Group]) -> str:
    kinds = [("global", "solid", lambda r: r.get("accuracy")),
             ("local mean", "dashed", lambda r: r.get("local_accuracy_mean")),
             ("local P", "dotted", lambda r: r.get("local_accuracy_P")),
             ("local NP", "dashdot", lambda r: r.get("local_accuracy_NP")),
             ("global macro-F1", "longdash", lambda r: r.get("macro_f1")),
             ("validation accuracy", "dashdotdot", lambda r: r.get("val_accuracy"))]
    series, used = _lines(groups, kinds)
    if len(groups) == 1:  # the spread over clients as a band around the local mean
        g = groups[0]
        lo = aggregate([per_round(r, lambda rec: rec.get("local_accuracy_min")) for r in g.runs])
        hi = aggregate([per_round(r, lambda rec: rec.get("local_accuracy_max")) for r in g.runs])
        for s in series:
            if s.label == "local mean" and lo.xs == list(s.xs) and hi.xs == list(s.xs):
                s.lo, s.hi, s.band, s.label = lo.mean, hi.mean, "range", "local mean (band: min–max)"
    return line_chart("plot-accuracy", "Accuracy per round", "round", "accuracy", series, xint=True,
                      ybounds=(0, 1), legend=_legend(groups, series, used))


def bytes_(groups: list[Group]) -> str:
    series, used = [], [("up", "solid"), ("down", "dashed")]
    for gi, g in enumerate(groups):
        for si, (label, dash) in enumerate(used):
            a = aggregate([cumulative(r, f"bytes_{label}") for r in g.runs])
            name = f"bytes {label}" if len(groups) == 1 else f"{g.short}: {label}"
            series.append(Series(name, a.xs, a.mean, a.lo, a.hi, _color(groups, gi, si), dash))
    ylog = wants_log([y for s in series for y in s.ys])
    return line_chart("plot-bytes", "Cumulative bytes per round (training messages)", "round",
                      "cumulative bytes" + (" (log)" if ylog else ""), series, yfmt=fmt_bytes, ylog=ylog, xint=True,
                      legend=_legend(groups, series, used))


def acc_vs_bytes(groups: list[Group]) -> str:
    series = []
    for gi, g in enumerate(groups):
        up = aggregate([cumulative(r, "bytes_up") for r in g.runs])
        acc = aggregate([per_round(r, lambda rec: rec.get("accuracy")) for r in g.runs])
        at = dict(zip(up.xs, up.mean))
        xs = [at[k] for k in acc.xs]
        series.append(Series("global accuracy" if len(groups) == 1 else g.short, xs, acc.mean, acc.lo, acc.hi,
                             PALETTE[gi % len(PALETTE)]))
    xlog = wants_log([x for s in series for x in s.xs])
    return line_chart("plot-acc-vs-bytes", "Accuracy vs cumulative bytes up", "cumulative bytes up"
                      + (" (log)" if xlog else ""), "accuracy", series, xfmt=fmt_bytes, xlog=xlog,
                      ybounds=(0, 1))


def clients(groups: list[Group]) -> str:
    local = [[last_local(r) for r in g.runs] for g in groups]
    cats = sorted({c for runs in local for d in runs for c in d}, key=lambda c: (len(c), c))
    bars = []
    for g, runs in zip(groups, local):
        vals, errs = [], []
        for c in cats:
            v = [d[c] for d in runs if c in d]
            vals.append(statistics.fmean(v) if v else None)
            errs.append(statistics.stdev(v) if len(v) > 1 else None)
        bars.append((g.short, vals, errs))
    names = client_names([r for g in groups for r in g.runs])  # natural clients: "3 alice", still in id order
    return bar_chart("plot-clients", "Local accuracy per client (last evaluated round)", "client", "accuracy",
                     [f"{c} {names[c]}" if c in names else c for c in cats], bars, ybounds=(0, 1))


def loss(groups: list[Group]) -> str:
    series, used = _lines(groups, [("train loss", "solid", lambda r: r.get("train_loss")),
                                   ("test loss", "dashed", lambda r: r.get("loss")),
                                   ("validation loss", "dotted", lambda r: r.get("val_loss"))])
    return line_chart("plot-loss", "Loss per round", "round", "loss", series, xint=True,
                      legend=_legend(groups, series, used))


def server(groups: list[Group], key: str) -> str:
    series, used = _lines(groups, [(key, "solid", lambda r: (r.get("server") or {}).get(key))])
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", key)
    return line_chart(f"plot-server-{slug}", f"Server diagnostic: {key}", "round", key, series, xint=True,
                      legend=_legend(groups, series, used))


VECTORS = {  # key -> (title, column label); other keys: "Per-round vector: <key>", "index"
    "head_importance": ("Head importance per round (mean over the round's clients, pruned = 0)",
                        "head (layer·H + h)"),
    "head_kept": ("Clients that kept each head per round", "head (layer·H + h)"),
    "layer_scores": ("FedPepTAO layer scores (aggregated in the selection round)", "layer"),
    "selected_layers": ("FedPepTAO selected layers per round (1 = shared)", "layer"),
}


def _heatmap(plot_id: str, title: str, xlabel: str, ylabel: str, rows: list[tuple[str, list[float | None]]],
             **kwargs) -> str | None:
    """Every heatmap of the report is drawn here: none (None) where its data do not vary, since one colour
    everywhere (a colour bar reading 1 / 1 / 1) shows nothing."""
    if not varies(v for _, vs in rows for v in vs):
        return None
    return heatmap(plot_id, title, xlabel, ylabel, rows, **kwargs)


def vectors(groups: list[Group], key: str) -> str | None:
    """Heatmap of a ``server_vectors`` key: rounds × elements (several groups: their rows one after another);
    None where the values do not vary (a dense run's head counters, say)."""
    rows = []
    for g in groups:
        for rnd, vals in vector_rows(g.runs, key).items():
            rows.append((str(rnd) if len(groups) == 1 else f"{g.short} {rnd}", vals))
    title, xlabel = VECTORS.get(key, (f"Per-round vector: {key}", "index"))
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", key)
    return _heatmap(f"plot-heatmap-{slug}", title, xlabel, "round", rows)


def confusion(plot_id: str, report: ClassReport, matrix: list[list[int]] | None = None) -> str | None:
    """Confusion matrix of the global model: rows true class, columns predicted, colour the share of the true
    class's examples (row-normalised), the counts written in the cells; ``matrix`` replaces the report's (a
    group's summed matrix). None where it has no matrix or the shares do not vary."""
    m = matrix if matrix is not None else report.confusion
    if m is None:
        return None
    rows = [(name, [v / sum(row) if sum(row) else None for v in row]) for name, row in zip(report.names, m)]
    return _heatmap(plot_id, "Confusion matrix (rows: true class, columns: predicted)", "predicted", "true", rows,
                    col_labels=report.names, cell_text=[[str(v) for v in row] for row in m], vrange=(0.0, 1.0),
                    vfmt=lambda f: f"{100 * f:.0f} %")


def asr(groups: list[Group]) -> str:
    series, used = _lines(groups, [("attack success rate", "solid", lambda r: r.get("asr"))])
    return line_chart("plot-asr", "Attack success rate per round", "round", "ASR", series, xint=True, ybounds=(0, 1),
                      legend=_legend(groups, series, used))


def perplexity(groups: list[Group]) -> str:
    series, used = _lines(groups, [("test perplexity", "solid", lambda r: r.get("perplexity")),
                                   ("seen groups", "dashed", lambda r: (r.get("seen") or {}).get("perplexity")),
                                   ("unseen groups", "dotted", lambda r: (r.get("unseen") or {}).get("perplexity"))])
    return line_chart("plot-perplexity", "Test perplexity per response token", "round", "perplexity", series,
                      xint=True, legend=_legend(groups, series, used))


def text_scores(groups: list[Group]) -> str:
    """BLEU, chrF and ROUGE-L of the global model's greedy generations in the rounds that decode."""
    series, used = _lines(groups, [(name, style, lambda r, k=key: (r.get("generation") or {}).get(k))
                                   for name, style, key in (("BLEU", "solid", "bleu"), ("chrF", "dashed", "chrf"),
                                                            ("ROUGE-L", "dotted", "rouge_l"))])
    return line_chart("plot-generation", "What the model writes: BLEU, chrF, ROUGE-L (0-100)", "round", "score",
                      series, xint=True, ybounds=(0, 100), legend=_legend(groups, series, used))


def all_plots(groups: list[Group]) -> list[str]:
    runs = [r for g in groups for r in g.runs]
    out = [accuracy(groups), bytes_(groups), acc_vs_bytes(groups), clients(groups), loss(groups)]
    if any(rec.get("perplexity") is not None for r in runs for rec in r.records):
        out.append(perplexity(groups))
    if any(rec.get("generation") for r in runs for rec in r.records):
        out.append(text_scores(groups))
    out += [server(groups, k) for k in server_keys(runs)]
    out += [svg for svg in (vectors(groups, k) for k in vector_keys(runs)) if svg is not None]
    if any(rec.get("asr") is not None for r in runs for rec in r.records):
        out.append(asr(groups))
    return out
