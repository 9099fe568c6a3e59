"""Full participation: every client trains every round, whatever ``federation.clients_per_round`` says."""

from __future__ import annotations

import numpy as np

from fedpeft.selection.base import SELECTORS, History, SelectorBase


@SELECTORS.register("all", "every client, every round")
class AllClients(SelectorBase):
    def select(self, clients: list[int], round: int, history: History, rng: np.random.Generator) -> list[int]:
        return sorted(clients)
