"""report.html shows what runs now record: per-class results and the confusion matrix, macro-F1 and validation
curves, natural clients' names, the resolved method. Run directories are written by hand (no training); a run
in the old format (none of these keys) renders as before."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fedpeft.report import write_report
from fedpeft.report.data import class_report, load_run, varies
from fedpeft.report.svg import DASHES, heat_color, heatmap

NAMES = ["World", "Sports", "Business", "Sci/Tech"]
CM = [[5, 1, 0, 0], [2, 6, 0, 0], [0, 0, 7, 1], [1, 0, 2, 5]]  # rows true, columns predicted
RESOLVED = {"adapter": "lora", "trainer": "adamw", "aggregator": "fedavg", "selector": "uniform", "sharing": "all",
            "downlink": "dense", "post_tuning": "none", "transforms": ["ldp", "clip"], "wrappers": []}
OLD_HEADER = ["run", "runs", "method", "task", "model", "rounds", "final accuracy", "best accuracy",
              "bytes up to reach 0.0000", "wall time"]


def per_class_of(cm: list[list[int]]) -> dict[str, dict[str, float]]:
    out = {}
    for i, name in enumerate(NAMES):
        tp, support, predicted = cm[i][i], sum(cm[i]), sum(row[i] for row in cm)
        p, r = tp / predicted, tp / support
        out[name] = {"precision": p, "recall": r, "f1": 2 * p * r / (p + r), "support": support}
    return out


def write_run(path: Path, *, seed: int = 0, rounds: int = 3, new: bool = True, summary: bool = True,
              cm: list[list[int]] = CM, overrides: tuple[str, ...] = ("sharing", "aggregator"),
              method: str = "fedavg-lora") -> Path:
    """Records for rounds 0..rounds and a summary; ``new``: with the keys runs now record."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: {path.name}\nseed: {seed}\nmethod: {{name: {method}}}\n"
                                      "task: {name: agnews}\nmodel: {name: tiny-bert}\n")
    recs = []
    for rnd in range(rounds + 1):
        rec = {"round": rnd, "accuracy": 0.4 + 0.1 * rnd, "loss": 1.0 / (rnd + 1), "bytes_up": 100 * rnd,
               "bytes_down": 50, "train_loss": None if rnd == 0 else 0.8 / rnd, "local_accuracy_mean": 0.5,
               "local_accuracy": {"0": 0.5, "1": 0.6, "2": 0.7, "10": 0.4}, "wall_seconds": 1.0}
        if new:
            rec |= {"macro_f1": 0.35 + 0.1 * rnd, "confusion": cm if rnd == rounds else [[1, 0, 0, 0]] * 4,
                    "val_accuracy": 0.45 + 0.05 * rnd, "val_loss": 1.5 / (rnd + 1), "val_macro_f1": 0.3}
        recs.append(rec)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if summary:
        s = {"method": method, "task": "agnews", "model": "tiny-bert", "seed": seed, "rounds": rounds,
             "final_accuracy": recs[-1]["accuracy"], "best_accuracy": recs[-1]["accuracy"], "wall_seconds": 4.0,
             "label_histograms": {"train": [[3, 4]], "test": [[1, 2]]}}
        if new:
            pc = per_class_of(cm)
            s |= {"class_names": NAMES, "client_names": {"0": "alice", "1": "bob", "2": "carol", "10": "zed"},
                  "per_class": pc, "macro_f1": sum(v["f1"] for v in pc.values()) / len(pc), "confusion": cm,
                  "confusion_round": rounds, "preset_overrides": list(overrides),
                  "method_resolved": dict(sorted(RESOLVED.items())),  # summary.json is written with sorted keys
                  "best_round": 2, "best_val_accuracy": 0.55, "accuracy_at_best_round": 0.6}
        (path / "summary.json").write_text(json.dumps(s))
    return path


def render(tmp_path: Path, *runs: Path) -> str:
    return write_report(list(runs), tmp_path / "out.html", target=0.0).read_text()


def svgs(html: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r'<svg id="([^"]+)".*?</svg>', html, re.S)}


def table(html: str, table_id: str) -> list[list[str]]:
    """The rows (header first) of a table, cell texts."""
    m = re.search(rf'<table id="{re.escape(table_id)}">.*?</table>', html, re.S)
    assert m, table_id
    return [["".join(c.itertext()) for c in tr] for tr in ET.fromstring(m.group(0))]


def comparison(html: str) -> list[dict[str, str]]:
    header, *rows = table(html, "comparison")
    return [dict(zip(header, r)) for r in rows]


def xticks(svg: str) -> list[str]:
    """The x axis's tick labels (below the plot area)."""
    return [t.text for t in ET.fromstring(svg).iter("text") if t.get("class") == "tick" and t.get("y") == "308"]


def titles(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter("title")]


# ---------------------------------------------------------------- per class

def test_per_class_table_and_confusion_heatmap_of_one_run(tmp_path):
    html = render(tmp_path, write_run(tmp_path / "r"))
    assert "<h2>Per class (global model, round 3)</h2>" in html
    header, *rows = table(html, "per-class-0")
    assert header == ["class", "precision", "recall", "F1", "support"]
    pc = per_class_of(CM)
    assert [r[0] for r in rows] == NAMES + ["macro average"]
    for name, row in zip(NAMES, rows):
        m = pc[name]
        assert row[1:] == [f"{m['precision']:.4f}", f"{m['recall']:.4f}", f"{m['f1']:.4f}", str(m["support"])]
    macro = rows[-1]
    assert macro[1] == f"{sum(m['precision'] for m in pc.values()) / 4:.4f}"
    assert macro[3] == f"{sum(m['f1'] for m in pc.values()) / 4:.4f}" and macro[4] == str(sum(map(sum, CM)))

    svg = svgs(html)["plot-confusion-0"]
    tree = ET.fromstring(svg)
    (cells,) = [g for g in tree.iter("g") if g.get("id") == "cells-confusion-0"]
    assert len(cells) == 16
    # row-normalised colour, the count in the cell and the tooltip; class names on both axes
    assert cells[0].get("fill") == heat_color(5 / 6) and cells[2].get("fill") == heat_color(0)
    assert "true Sci/Tech, predicted Business: 2 (25 %)" in titles(svg)
    (text,) = [g for g in tree.iter("g") if g.get("id") == "text-confusion-0"]
    assert [t.text for t in text] == [str(v) for row in CM for v in row]
    ticks = [t.text for t in tree.iter("text") if t.get("class") == "tick"]
    assert all(ticks.count(n) == 2 for n in NAMES)  # columns (predicted) and rows (true)
    assert "row-normalised" in html


def test_per_class_of_seeds_sums_the_confusion_and_says_so(tmp_path):
    other = [[6, 0, 0, 0], [1, 7, 0, 0], [0, 1, 7, 0], [0, 0, 3, 5]]
    html = render(tmp_path, write_run(tmp_path / "agnews-s0"), write_run(tmp_path / "agnews-s1", seed=1, cm=other))
    assert "2 runs (seeds 0, 1)" in html and "support and the confusion matrix summed over them" in html
    rows = table(html, "per-class-0")[1:]
    w0, w1 = per_class_of(CM)["World"], per_class_of(other)["World"]
    assert rows[0][1].startswith(f"{(w0['precision'] + w1['precision']) / 2:.4f} ± ")
    assert rows[0][4] == str(w0["support"] + w1["support"])
    tree = ET.fromstring(svgs(html)["plot-confusion-0"])
    (text,) = [g for g in tree.iter("g") if g.get("id") == "text-confusion-0"]
    assert [int(t.text) for t in text] == [a + b for ra, rb in zip(CM, other) for a, b in zip(ra, rb)]


def test_one_section_per_configuration_group(tmp_path):
    html = render(tmp_path, write_run(tmp_path / "a"), write_run(tmp_path / "b", method="fedbpt"),
                  write_run(tmp_path / "old", new=False, method="fedit"))
    assert html.count("<h2>Per class (global model, round 3): ") == 2
    assert {"plot-confusion-0", "plot-confusion-1"} <= set(svgs(html)) and "plot-confusion-2" not in svgs(html)


def test_per_class_from_the_records_when_the_run_has_no_summary_yet(tmp_path):
    run = load_run(write_run(tmp_path / "r", summary=False))
    rep = class_report(run)
    assert rep.round == 3 and rep.names == ["0", "1", "2", "3"] and rep.confusion == CM
    assert rep.per_class["3"]["recall"] == pytest.approx(5 / 8) and rep.per_class["0"]["precision"] == 5 / 8
    html = render(tmp_path, tmp_path / "r")
    assert "Per class (global model, round 3)" in html and "plot-confusion-0" in svgs(html)


def test_macro_average_runs_over_the_classes_that_occur(tmp_path):
    """As scikit-learn's macro average: a class neither present nor predicted does not pull the means down."""
    html = render(tmp_path, write_run(tmp_path / "r", summary=False, cm=[[3, 1, 0], [1, 3, 0], [0, 0, 0]]))
    rows = table(html, "per-class-0")[1:]
    assert rows[2] == ["2", "0.0000", "0.0000", "0.0000", "0"]
    assert rows[-1] == ["macro average", "0.7500", "0.7500", "0.7500", "8"]
    tree = ET.fromstring(svgs(html)["plot-confusion-0"])
    (cells,) = [g for g in tree.iter("g") if g.get("id") == "cells-confusion-0"]
    assert [c.get("fill") for c in cells][6:] == ["#ddd"] * 3  # no true examples: no shares


def test_a_uniform_confusion_matrix_gets_no_heatmap(tmp_path):
    html = render(tmp_path, write_run(tmp_path / "r", cm=[[2] * 4] * 4))
    assert "per-class-0" in html and "plot-confusion-0" not in svgs(html)
    assert "No confusion-matrix heatmap" in html


# ---------------------------------------------------------------- curves, clients, comparison, summary

def test_macro_f1_and_validation_curves(tmp_path):
    plots = svgs(render(tmp_path, write_run(tmp_path / "r")))
    acc = titles(plots["plot-accuracy"])
    assert "global macro-F1: 2, 0.55" in acc and "validation accuracy: 3, 0.6" in acc
    assert f'stroke-dasharray="{DASHES["longdash"]}"' in plots["plot-accuracy"]
    assert f'stroke-dasharray="{DASHES["dashdotdot"]}"' in plots["plot-accuracy"]
    assert "validation loss: 2, 0.5" in titles(plots["plot-loss"])


def test_clients_are_labelled_by_name_in_id_order(tmp_path):
    svg = svgs(render(tmp_path, write_run(tmp_path / "r")))["plot-clients"]
    assert xticks(svg) == ["0 alice", "1 bob", "2 carol", "10 zed"]
    assert any(t.startswith("r, client 10 zed: 0.4") for t in titles(svg))


def test_comparison_shows_resolved_method_macro_f1_and_best_validation_round(tmp_path):
    html = render(tmp_path, write_run(tmp_path / "r"), write_run(tmp_path / "plain", overrides=(), method="fedbpt"))
    r, plain = comparison(html)
    assert r["method"] == "fedavg-lora (sharing, aggregator from config)" and plain["method"] == "fedbpt"
    assert r["components"] == ("adapter=lora, trainer=adamw, aggregator=fedavg, selector=uniform, sharing=all, "
                               "downlink=dense, post_tuning=none, transforms=ldp+clip")
    macro = sum(m["f1"] for m in per_class_of(CM).values()) / 4
    assert r["final macro-F1"] == f"{macro:.4f}" and r["rounds"] == "3"
    assert r["accuracy at best validation round"] == "0.6000 (round 2)"
    (pair,) = comparison(render(tmp_path, write_run(tmp_path / "s0"), write_run(tmp_path / "s1", seed=1)))
    assert pair["accuracy at best validation round"] == "0.6000 ± 0.0000 (round 2)"


def test_summary_table_keeps_dicts_readable(tmp_path):
    rows = {row[0]: row[1] for row in table(render(tmp_path, write_run(tmp_path / "r")), "summary")[1:]}
    assert rows["method_resolved"].startswith("adapter=lora, trainer=adamw")
    assert rows["client_names"] == "0 alice, 1 bob, 2 carol, 10 zed"
    assert rows["per_class"].startswith("World: precision 0.625, recall 0.8333, f1 0.7143, support 6; Sports: ")
    assert "{" not in rows["per_class"] + rows["method_resolved"] + rows["client_names"]
    assert rows["label_histograms"] == '{"train": [[3, 4]], "test": [[1, 2]]}'  # older keys: JSON as before


# ---------------------------------------------------------------- old runs

def test_an_old_format_run_renders_as_before(tmp_path):
    html = render(tmp_path, write_run(tmp_path / "old", new=False))
    assert table(html, "comparison")[0] == OLD_HEADER
    (row,) = comparison(html)
    assert row["method"] == "fedavg-lora" and row["rounds"] == "3"
    plots = svgs(html)
    assert list(plots) == ["plot-accuracy", "plot-bytes", "plot-acc-vs-bytes", "plot-clients", "plot-loss"]
    legend = ET.fromstring(plots["plot-accuracy"])
    assert {"".join(t.itertext()) for g in legend.iter("g") if g.get("class") == "legend" for t in g.iter("title")} \
        == {"global", "local mean"}
    assert "validation" not in html and "macro" not in html.lower() and "Per class" not in html
    assert xticks(plots["plot-clients"]) == ["0", "1", "2", "10"]
    # the page differs from the new-format run's only by what the new keys add
    new = render(tmp_path, write_run(tmp_path / "new", new=True))
    for marker in ("per-class-0", "plot-confusion-0", "components", "final macro-F1", "from config)"):
        assert marker in new and marker not in html


# ---------------------------------------------------------------- pieces

def test_heatmap_column_labels_cell_text_and_fixed_range():
    long = "a-very-long-class-name"
    svg = heatmap("plot-heatmap-c", "t", "predicted", "true", [("a", [0.25, 0.75]), (long, [None, 1.0])],
                  col_labels=["a", long], cell_text=[["1", "3"], ["0", "4"]], vrange=(0.0, 1.0))
    tree = ET.fromstring(svg)
    assert "true a-very-long-class-name, predicted a-very-long-class-name: 4 (1)" in titles(svg)
    assert f'fill="{heat_color(0.25)}"' in svg  # the fixed range, not the data's (0.25 .. 1)
    ticks = [t.text for t in tree.iter("text") if t.get("class") == "tick"]
    assert xticks(svg) == ["a", "a-very-long-class-name"]  # room enough below the columns
    assert "a-very-lo…" in ticks and ">0<" in svg and ">1<" in svg  # shortened row label; colour bar 0 .. 1
    (text,) = [g for g in tree.iter("g") if g.get("id") == "text-heatmap-c"]
    assert [t.text for t in text] == ["1", "3", "0", "4"]


def test_varies():
    assert varies([0.0, 1.0]) and varies([None, 2, 3])
    assert not varies([]) and not varies([1, 1.0, None, float("nan")]) and not varies([True, False, 1])
