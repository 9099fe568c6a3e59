"""What every tracking sink is: one destination of a run's numbers besides ``metrics.jsonl``, fed the same records.

A sink is opened once per process that runs the rounds (again when the run is resumed, with the id it kept in
``tracking.json``), given the resolved config as parameters, each round's scalars with the round as the step, and at
the end ``summary.json``'s scalars and the report. The scalars are a pure function of a ``metrics.jsonl`` line
(``round_scalars``), so what a sink shows is what the file says.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedpeft.registry import Registry

SINKS: Registry[type[SinkBase]] = Registry("tracking sink")

# per-client fields of a round record: the run directory keeps them; the sinks show the federation's scalars
PER_CLIENT = ("clients", "local_accuracy", "local_loss", "local_generation", "confusion")


def _numbers(value: Any, prefix: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, (int, float)):  # bools too (1.0 / 0.0)
        yield prefix, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{prefix}/{k}")


def round_scalars(record: dict[str, Any]) -> dict[str, float]:
    """Every number of one ``metrics.jsonl`` line but the per-client ones, nested keys joined by ``/``
    (``server/server_lr``, ``generation/bleu``); missing values (``null``) and lists are left out."""
    return {k: v for key, value in record.items() if key not in PER_CLIENT and key != "round"
            for k, v in _numbers(value, key)}


def summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The numbers of ``summary.json`` at its top level (totals, final and best metrics, byte counts), and each
    standard suite's scores (``evaluation.suites``) as ``suite/<name>/<score>``."""
    top = {k: v for key, value in summary.items() if not isinstance(value, dict) for k, v in _numbers(value, key)}
    return top | dict(_numbers(summary.get("suites") or {}, "suite"))


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved config as ``dotted.key -> text`` (lists written as YAML-like ``[a, b]``), for a sink's
    parameters."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def require(module: str, sink: str) -> None:
    """ImportError naming the extra when the package a sink writes with is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"tracking sink '{sink}' needs the '{module}' package, which is not installed: "
                          "pip install 'fedpeft[tracking]' (or drop it from `tracking`)")


class SinkBase:
    """One open destination. ``run_id`` is what the sink needs to append to the same run after a resume (None
    for a new run); ``run_id`` after opening is what it wants kept for the next time."""

    module = ""  # the package the sink writes with (checked before the model loads)

    def __init__(self, settings: Any, root: Path, name: str, run_id: str | None) -> None:
        self.settings, self.root, self.name = settings, root, name
        self.run_id = run_id

    def log_params(self, params: dict[str, str]) -> None:
        """The resolved config, once per new run."""

    def log_round(self, step: int, scalars: dict[str, float]) -> None:
        """One round's scalars."""
        raise NotImplementedError

    def finish(self, step: int, summary: dict[str, float], files: list[Path]) -> None:
        """The summary's scalars (at the last round) and the run's files worth keeping (summary.json,
        report.html)."""

    def close(self) -> None:
        """Flush and release; also called when the run stops early (it can be resumed)."""
