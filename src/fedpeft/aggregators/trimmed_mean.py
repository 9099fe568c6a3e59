"""Coordinate-wise β-trimmed mean (Yin et al., ICML 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", Alg. 1 Option II, Definition 2).

For every coordinate j, sort {x_k[j] : k ∈ S} (n = |S| values), drop the b = ⌊β n⌋ smallest and the b largest,
and average the remaining n − 2b values uniformly (client weights are ignored, as in the paper):

    x_{t+1}[j] = 1/(n − 2b) Σ_{x ∈ U_j} x,   U_j = the values ranked b+1 … n−b.

Numerics as Flower 1.41's ``FedTrimmedAvg`` / ``trim_mean`` (scipy's convention: b = int(β·n), β ∈ [0, 0.5),
Flower's default β = 0.2). Float64 math, float32 result; stateless.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, PARAMS, AggregatorBase, Params
from fedpeft.aggregators.median import sorted_stack
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


class TrimmedMeanSettings(BaseModel):
    """``method.aggregator`` keys of ``trimmed_mean``."""

    model_config = ConfigDict(extra="forbid")
    beta: float = Field(0.2, ge=0, lt=0.5,
                        description="fraction β trimmed at each end: ⌊β n⌋ values per side (Flower: 0.2)")


def num_trimmed(n: int, beta: float) -> int:
    """b = int(β·n) values dropped at each end (scipy's / Flower's rounding)."""
    return int(beta * n)


def trimmed_mean(values: Sequence[torch.Tensor], beta: float) -> torch.Tensor:
    """Coordinate-wise β-trimmed mean of equally shaped tensors (float64)."""
    n = len(values)
    if n == 0:
        raise ValueError("no updates to aggregate")
    b = num_trimmed(n, beta)
    if n - 2 * b < 1:
        raise ValueError(f"method.aggregator.beta: trimming {b} of {n} updates at each end leaves none to "
                         f"average (beta = {beta}); lower beta or accept more clients per round")
    return sorted_stack(values)[b: n - b].mean(dim=0)


def trimmed_mean_params(glob: Params, updates: Sequence[Update], beta: float) -> Params:
    """Yin et al. Option II over every tensor named in ``glob`` (float32 result)."""
    return {k: trimmed_mean([u.tensors[k] for u in updates], beta).float() for k in glob}


@AGGREGATORS.register("trimmed_mean", "coordinate-wise beta-trimmed mean of the uploaded tensors (Yin et al. "
                      "2018, Option II; Flower's FedTrimmedAvg)", TrimmedMeanSettings)
class TrimmedMean(AggregatorBase):
    accepts = frozenset({PARAMS})
    needs = frozenset()

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        return trimmed_mean_params(glob, updates, self.settings.beta), state
