"""Classification metrics beyond accuracy (scikit-learn): macro-F1, the confusion matrix, per-class P/R/F1.

A round's record keeps the global model's confusion matrix (rows: true class, columns: predicted class) and its
macro-F1; the summary and ``fedpeft evaluate`` derive the per-class table from a confusion matrix, so the table
of any recorded round can be rebuilt without predicting again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def confusion(labels: Sequence[int] | np.ndarray, preds: Sequence[int] | np.ndarray,
              num_classes: int) -> list[list[int]]:
    """C×C counts, rows the true class and columns the predicted one (``sklearn.metrics.confusion_matrix``)."""
    from sklearn.metrics import confusion_matrix

    if len(labels) == 0:
        return [[0] * num_classes for _ in range(num_classes)]
    return confusion_matrix(np.asarray(labels), np.asarray(preds), labels=list(range(num_classes))).tolist()


def _pairs(matrix: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(true, predicted) label arrays with the counts of a confusion matrix."""
    m = np.asarray(matrix, dtype=np.int64)
    c = m.shape[0]
    rows, cols = np.repeat(np.arange(c), c), np.tile(np.arange(c), c)
    counts = m.reshape(-1)
    return np.repeat(rows, counts), np.repeat(cols, counts)


def macro_f1(matrix: Sequence[Sequence[int]]) -> float | None:
    """Unweighted mean F1 over the classes that occur as a label or a prediction (scikit-learn's macro average);
    None for an empty matrix."""
    from sklearn.metrics import f1_score

    y, p = _pairs(matrix)
    return float(f1_score(y, p, average="macro", zero_division=0)) if len(y) else None


def class_metrics(labels: Sequence[int] | np.ndarray, preds: Sequence[int] | np.ndarray,
                  num_classes: int) -> dict[str, Any]:
    """``macro_f1`` and ``confusion`` of predictions against labels: what a round's record keeps."""
    matrix = confusion(labels, preds, num_classes)
    return {"macro_f1": macro_f1(matrix), "confusion": matrix}


def per_class(matrix: Sequence[Sequence[int]], class_names: Sequence[str]) -> dict[str, dict[str, float | int]]:
    """``{class name: {precision, recall, f1, support}}`` from a confusion matrix (a class never predicted has
    precision 0, one never present recall 0: scikit-learn's ``zero_division=0``)."""
    from sklearn.metrics import precision_recall_fscore_support

    y, p = _pairs(matrix)
    if not len(y):
        return {}
    prec, rec, f1, support = precision_recall_fscore_support(y, p, labels=list(range(len(class_names))),
                                                             zero_division=0)
    return {name: {"precision": float(prec[i]), "recall": float(rec[i]), "f1": float(f1[i]),
                   "support": int(support[i])} for i, name in enumerate(class_names)}


def table(matrix: Sequence[Sequence[int]], class_names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, the per-class table and the confusion matrix itself: ``fedpeft evaluate``'s output and
    the summary's last-round section."""
    m = np.asarray(matrix, dtype=np.int64)
    n = int(m.sum())
    return {"num_examples": n, "accuracy": float(np.trace(m) / n) if n else None, "macro_f1": macro_f1(matrix),
            "per_class": per_class(matrix, class_names), "confusion": m.tolist()}
