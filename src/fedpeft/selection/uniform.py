"""Uniform sampling without replacement of ``federation.clients_per_round`` clients (FedAvg's selection)."""

from __future__ import annotations

import numpy as np

from fedpeft.selection.base import SELECTORS, History, SelectorBase


def select_clients(client_ids: list[int], per_round: int | None, rng: np.random.Generator) -> list[int]:
    """All clients when ``per_round`` is None or covers everyone, else a uniform sample without replacement."""
    if per_round is None or per_round >= len(client_ids):
        return sorted(client_ids)
    if per_round < 1:
        raise ValueError(f"per_round must be >= 1, got {per_round}")
    return sorted(int(c) for c in rng.choice(client_ids, size=per_round, replace=False))


@SELECTORS.register("uniform", "a uniform sample of federation.clients_per_round clients (all when unset)")
class Uniform(SelectorBase):
    def select(self, clients: list[int], round: int, history: History, rng: np.random.Generator) -> list[int]:
        return select_clients(clients, self.ctx.per_round, rng)
