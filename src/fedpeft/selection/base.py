"""The client-selection axis: which clients train in a round, called by the method (not the runtime).

A selector gets every client id, the round, the server's per-client history (``{client: {"round": last
round it replied, "loss": its last training loss, ...}}``, kept in the server state) and a seeded generator;
it returns the sorted ids that train this round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fedpeft.registry import Registry

History = dict[int, dict[str, float]]


@dataclass(frozen=True)
class SelectorContext:
    num_clients: int
    per_round: int | None  # ``federation.clients_per_round`` (None: all)


class Selector(Protocol):
    def select(self, clients: list[int], round: int, history: History, rng: np.random.Generator) -> list[int]: ...


class SelectorBase:
    reads_clients: bool = False  # ranks clients by what each one reported (refused under secure aggregation)

    def __init__(self, settings: Any, ctx: SelectorContext) -> None:
        self.settings, self.ctx = settings, ctx

    @property
    def k(self) -> int:
        """How many clients train per round."""
        return self.ctx.num_clients if self.ctx.per_round is None else min(self.ctx.per_round, self.ctx.num_clients)


SELECTORS: Registry[type] = Registry("selector")  # classes built as cls(settings, SelectorContext)
