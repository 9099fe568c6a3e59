"""``training_curve.png`` of a hub export: the run's loss and accuracy per round, read from ``metrics.jsonl``.

Two panels drawn with matplotlib's object-oriented API (``matplotlib.figure.Figure`` on the Agg canvas, never
``pyplot``, so no global figure state and no display): the global model's test loss with the clients' mean training
loss, and its test accuracy with the clients' mean local accuracy where the run measured it. A generation run's
``accuracy`` is the next-token accuracy on the test responses (``tracking.summary.round_record``), and is labelled
so. Rounds without a value (round 0 has no training loss; a skipped evaluation) are left out of that line.
matplotlib is the optional ``fedpeft[hub]`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CURVE_FILE = "training_curve.png"

# (record key, label) per panel; the accuracy panel's test label depends on the task kind
LOSS_LINES = (("loss", "test loss (global model)"), ("train_loss", "training loss (mean over the clients)"))
ACCURACY_LINES = (("accuracy", None), ("local_accuracy_mean", "local accuracy (mean over the clients)"))


def require_matplotlib() -> None:
    """ImportError naming the extra when matplotlib is not installed (before anything is written)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError("--format hub draws training_curve.png with matplotlib, which is not installed: "
                          "pip install 'fedpeft[hub]'")


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["round"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def write_curve(records: list[dict[str, Any]], path: str | Path, generation: bool, title: str) -> Path:
    """Draw loss and accuracy per round of ``records`` (``metrics.jsonl``'s lines) into the PNG ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not records:
        raise ValueError("metrics.jsonl has no round: the run has not finished a round, so there is no training "
                         "curve to draw")
    fig = Figure(figsize=(9, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    test_label = "next-token accuracy (global model)" if generation else "test accuracy (global model)"
    for ax, lines, ylabel in ((loss_ax, LOSS_LINES, "loss"), (acc_ax, ACCURACY_LINES, "accuracy")):
        for key, label in lines:
            rounds, values = _series(records, key)
            if rounds:
                ax.plot(rounds, values, marker="o", markersize=3, label=label or test_label)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    fig.savefig(path, format="png")
    return path
