"""Feeds a run's round records to its tracking sinks (``tracking:``), remembering in ``tracking.json`` each sink's
run id and the last round it was sent: a resumed run appends to the same TensorBoard folder, MLflow run and W&B run,
sends the rounds the sinks missed, and never sends a round twice (a resumed run's rounds equal the first try's).

A sink that fails while the run goes on is logged and left out for the rest of the run; the run directory keeps
every number, and the next resume sends the sink what it missed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from fedpeft.tracking.sinks import SINKS, SinkBase, require, round_scalars, summary_scalars
from fedpeft.tracking.sinks.base import flat_params

log = logging.getLogger(__name__)
STATE = "tracking.json"


def check_sinks(sections: list[Any]) -> None:
    """ImportError naming the extra for a sink whose package is missing (before any model is loaded)."""
    for section in sections:
        require(SINKS.get(section.name).module, section.name)


class Tracker:
    """The run's open sinks and what each has been sent."""

    def __init__(self, sections: list[Any], root: Path, name: str, config: dict[str, Any]) -> None:
        self.root = root
        self.state: dict[str, dict[str, Any]] = json.loads((root / STATE).read_text()) if (root / STATE).exists() \
            else {}
        self.sinks: dict[str, SinkBase] = {}
        try:
            for section in sections:
                kept = self.state.get(section.name, {})
                sink = SINKS.get(section.name)(SINKS.settings_of(section), root, name, kept.get("id"))
                self.sinks[section.name] = sink
                if kept.get("id") is None:
                    sink.log_params(flat_params(config))
                self.state[section.name] = {"id": sink.run_id, "last_round": kept.get("last_round", -1)}
        except BaseException:
            self.close()
            raise
        self._save()

    def _save(self) -> None:
        if not self.state:  # a run without sinks writes no tracking.json
            return
        tmp = self.root / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.root / STATE)

    def _each(self, what: str, call: Any) -> None:
        """``call(name, sink)`` for every sink; one that raises is logged and dropped."""
        for name, sink in list(self.sinks.items()):
            try:
                call(name, sink)
            except Exception as e:  # noqa: BLE001 - a tracking server's trouble never stops the run
                log.warning("tracking sink '%s' failed to %s (%s: %s); left out for the rest of this run, the "
                            "run directory has every number and a resume sends it what it missed",
                            name, what, type(e).__name__, e)
                self.sinks.pop(name)
                _close_quietly(sink)

    def rounds(self, records: list[dict[str, Any]]) -> None:
        """Send each sink the records it has not had yet."""
        def send(name: str, sink: SinkBase) -> None:
            for rec in records:
                if rec["round"] > self.state[name]["last_round"]:
                    sink.log_round(rec["round"], round_scalars(rec))
                    self.state[name]["last_round"] = rec["round"]

        self._each("log a round", send)
        self._save()

    def finish(self, last_round: int, summary: dict[str, Any], files: list[Path]) -> None:
        """The summary's scalars at the last round, and the files that exist of ``files``."""
        self._each("finish", lambda _, sink: sink.finish(last_round, summary_scalars(summary),
                                                         [f for f in files if f.exists()]))

    def close(self) -> None:
        for sink in self.sinks.values():
            _close_quietly(sink)
        self.sinks = {}


def _close_quietly(sink: SinkBase) -> None:
    try:
        sink.close()
    except Exception as e:  # noqa: BLE001 - closing is best effort; the numbers are in the run directory
        log.warning("tracking sink could not be closed cleanly: %s: %s", type(e).__name__, e)
