"""Evaluation beyond accuracy (issue 35): macro-F1 per round, the confusion matrix and per-class table of the global
model in summary.json, and ``fedpeft evaluate`` scoring a labelled file with the same table."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import tiny_overrides
from sklearn.metrics import classification_report, f1_score
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.experiment import build_experiment
from fedpeft.metrics import class_metrics, confusion, macro_f1, per_class, table
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

runner = CliRunner()


def test_metrics_equal_scikit_learn_on_small_cases():
    y, p = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 0, 2]
    cm = confusion(y, p, 4)  # class 3 never occurs
    assert cm == [[1, 1, 0, 0], [0, 1, 0, 0], [1, 0, 2, 0], [0, 0, 0, 0]]
    assert macro_f1(cm) == pytest.approx(f1_score(y, p, average="macro"))
    report = classification_report(y, p, labels=[0, 1, 2, 3], output_dict=True, zero_division=0)
    got = per_class(cm, ["a", "b", "c", "d"])
    for i, name in enumerate("abcd"):
        want = report[str(i)]
        assert got[name] == pytest.approx({"precision": want["precision"], "recall": want["recall"],
                                           "f1": want["f1-score"], "support": want["support"]})
    assert table(cm, list("abcd"))["accuracy"] == pytest.approx(4 / 6)
    assert class_metrics([], [], 2) == {"macro_f1": None, "confusion": [[0, 0], [0, 0]]}


@pytest.fixture(scope="module")
def topic_run(tmp_path_factory):
    old = __import__("torch").get_num_threads()
    __import__("torch").set_num_threads(1)
    cfg = load_config(None, tiny_overrides(task__name="synthetic-topic", federation__rounds=2,
                                           evaluation__round_zero=True))
    exp = build_experiment(cfg)
    run_dir = tmp_path_factory.mktemp("metrics") / "run"
    run_embedded(cfg, run_dir, experiment=exp)
    yield exp, run_dir
    __import__("torch").set_num_threads(old)


def test_every_round_records_macro_f1_and_its_confusion(topic_run):
    exp, run_dir = topic_run
    records = RunDir(run_dir).read_metrics()
    assert [r["round"] for r in records] == [0, 1, 2]
    for r in records:
        cm = np.array(r["confusion"])
        assert cm.shape == (exp.task.num_classes,) * 2 and cm.sum() == len(exp.task.test)
        assert np.trace(cm) / cm.sum() == pytest.approx(r["accuracy"])  # the same predictions as the accuracy
        assert r["macro_f1"] == pytest.approx(macro_f1(r["confusion"]))
        assert cm.sum(1).tolist() == np.bincount([e.label for e in exp.task.test], minlength=cm.shape[0]).tolist()


def test_summary_has_the_last_rounds_per_class_table(topic_run):
    exp, run_dir = topic_run
    summary = json.loads((run_dir / "summary.json").read_text())
    last = RunDir(run_dir).read_metrics()[-1]
    assert summary["class_names"] == exp.task.class_names
    assert summary["confusion_round"] == 2 and summary["confusion"] == last["confusion"]
    assert summary["final_macro_f1"] == summary["macro_f1"] == last["macro_f1"]
    assert summary["per_class"] == per_class(last["confusion"], exp.task.class_names)
    assert sum(m["support"] for m in summary["per_class"].values()) == len(exp.task.test)


def test_evaluate_scores_a_labelled_file_with_the_same_table(topic_run, tmp_path):
    """The run's own test split written as a CSV (labels as class names, one as an index): ``fedpeft evaluate``
    gives the summary's confusion matrix and per-class table."""
    exp, run_dir = topic_run
    path = tmp_path / "labelled.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        for i, e in enumerate(exp.task.test):
            w.writerow([i, e.text_a, str(e.label) if i == 0 else exp.task.class_names[e.label]])
    res = runner.invoke(app, ["evaluate", str(run_dir), "--file", str(path), "--out", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "m.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert got["confusion"] == summary["confusion"] and got["per_class"] == summary["per_class"]
    assert got["accuracy"] == pytest.approx(summary["final_accuracy"])
    assert "macro-F1" in res.output and "after round 2 of 2" in " ".join(res.output.split())
    for name in exp.task.class_names:
        assert name in res.output


@pytest.mark.parametrize("label, message", [("NaN", "reads as a missing value"),
                                            ("nonsense", "not a class of the run"), ("", "has no label")])
def test_evaluate_refuses_bad_labels_at_their_line(topic_run, tmp_path, label, message):
    _, run_dir = topic_run
    path = tmp_path / "bad.csv"
    path.write_text(f"text,label\nsome text,{label}\n")
    res = runner.invoke(app, ["evaluate", str(run_dir), "--file", str(path)])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and "bad.csv line 2" in res.output
