"""Uniform sampling without replacement of ``federation.clients_per_round`` clients (FedAvg's selection)."""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.selection.base import SELECTORS, History, SelectorBase


class UniformSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fraction: float | None = Field(None, gt=0, le=1, description="share of all clients per round, ceil(f·N) "
                                                                 "(Flower's fraction_train); overrides "
                                                                 "federation.clients_per_round")


def select_clients(client_ids: list[int], per_round: int | None, rng: np.random.Generator) -> list[int]:
    """All clients when ``per_round`` is None or covers everyone, else a uniform sample without replacement."""
    if per_round is None or per_round >= len(client_ids):
        return sorted(client_ids)
    if per_round < 1:
        raise ValueError(f"per_round must be >= 1, got {per_round}")
    return sorted(int(c) for c in rng.choice(client_ids, size=per_round, replace=False))


@SELECTORS.register("uniform", "a uniform sample of federation.clients_per_round clients (all when unset), or "
                    "of a fraction of them", UniformSettings)
class Uniform(SelectorBase):
    def select(self, clients: list[int], round: int, history: History, rng: np.random.Generator) -> list[int]:
        f = self.settings.fraction if self.settings is not None else None
        k = max(1, math.ceil(f * len(clients))) if f is not None else self.ctx.per_round
        return select_clients(clients, k, rng)
