"""A method's exchange stages from its resolved config: their capability records, the one check that a chain can
run (before anything loads), and the built stages (the stage itself for one, a ``Pipeline`` for a chain)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedpeft.exchange.capabilities import Capabilities, combine, conflict, of_stage
from fedpeft.exchange.pipeline import Pipeline
from fedpeft.sharing import SHARING, SharingContext

STAGES = SHARING  # the registered stages (each one also usable alone as ``method.sharing``)


def record(stages: Sequence[Any]) -> Capabilities:
    """The chain's capability record from its resolved components (``name`` and settings); ValueError naming the
    pair when two stages cannot be chained."""
    records = [of_stage(s.name, STAGES.get(s.name), STAGES.settings_of(s)) for s in stages]
    why = conflict(records)
    if why is not None:
        raise ValueError(f"method.exchange: {why}")
    return combine(records)


def build(stages: Sequence[Any], ctx: SharingContext) -> Any:
    """The method's exchange policy: the single stage, or the chain of them."""
    built = [STAGES.get(s.name)(STAGES.settings_of(s), ctx) for s in stages]
    return built[0] if len(built) == 1 else Pipeline(built, record(stages))
