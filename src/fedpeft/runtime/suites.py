"""``evaluation.suites``: the standard suites scored on a finished run's global adapter, as ``fedpeft evaluate
RUN_DIR --suite NAME`` scores it afterwards. Each suite's scores and items go to ``suites/<name>.json`` and
``suites/<name>.items.jsonl`` in the run directory; the scores go into ``summary.json`` (``suites``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fedpeft.comm.codec import Message
from fedpeft.config import SuiteSpec
from fedpeft.methods.state import ServerState

log = logging.getLogger(__name__)


def check_suites(specs: list[SuiteSpec], kind: str, field: str = "suites") -> None:
    """ValueError naming ``evaluation.<field>`` (suites, round_suites) for an unknown suite, bad settings, or a
    classification run (the suites score a causal language model): before any round runs."""
    from fedpeft.suites import build_suite

    if specs and kind not in ("generation", "preference"):
        raise ValueError(f"evaluation.{field}: the standard suites score a causal language model; this is a "
                         "classification task")
    for k, spec in enumerate(specs):
        try:
            build_suite(spec.name, spec.limit, **spec.settings)
        except (ValueError, KeyError) as e:
            raise ValueError(f"evaluation.{field}[{k}] ({spec.name}): {e}") from None


def score_suites(specs: list[SuiteSpec], objective: Any, state: Message, root: Path,
                 batch_size: int) -> dict[str, dict[str, Any]]:
    """Each suite's scores of the global adapter in ``state`` (written under ``root / "suites"``). A suite that
    fails (its data gone since the run started, say) is logged and recorded as ``{"error": ...}``: the run's
    summary is still written, and ``fedpeft evaluate RUN_DIR --suite NAME`` scores it afterwards."""
    from fedpeft.suites import build_suite
    from fedpeft.suites.base import kept_result

    params = ServerState.from_message(state).glob
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        try:
            result = build_suite(spec.name, spec.limit, **spec.settings).run(objective, params, batch_size)
        except (OSError, ValueError, ImportError) as e:  # DataNotFoundError is an OSError
            log.error("suite %s failed, not scored: %s", spec.name, e)
            out[spec.name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        result.protocol["adapter"] = f"global adapter, round {ServerState.from_message(state).round}"
        result.write(kept_result(root, spec.name))
        out[spec.name] = result.scores | {"items": result.protocol.get("items", len(result.items))}
        log.info("suite %s: %s", spec.name, ", ".join(f"{k} {v:.2f}" for k, v in result.scores.items()
                                                      if isinstance(v, float) and not k.endswith("_se")))
    return out
