"""Coordinate-wise median (Yin et al., ICML 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates", Alg. 1 Option I).

For every coordinate j of every shared tensor, x_{t+1}[j] = med{x_k[j] : k ∈ S}, unweighted (the client
weights n_k are ignored, as in the paper and in Flower's ``FedMedian``). The median of an even number of
values is the mean of the two middle ones (``numpy.median``, which Flower 1.41's ``fedmedian.py`` uses;
note that ``torch.median`` would return the lower one instead). Float64 math, float32 result; stateless.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.aggregators.base import AGGREGATORS, PARAMS, AggregatorBase, Params
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


def sorted_stack(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """The values stacked on a new leading axis (float64) and sorted along it, coordinate by coordinate."""
    if not values:
        raise ValueError("no updates to aggregate")
    return torch.sort(torch.stack([v.double() for v in values]), dim=0).values


def coordinate_median(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Coordinate-wise median of equally shaped tensors; mean of the two middle values for an even count."""
    s = sorted_stack(values)
    n = s.shape[0]
    if n % 2:
        return s[n // 2]
    return (s[n // 2 - 1] + s[n // 2]) / 2.0


def median_params(glob: Params, updates: Sequence[Update]) -> Params:
    """Yin et al. Option I over every tensor named in ``glob`` (float32 result)."""
    return {k: coordinate_median([u.tensors[k] for u in updates]).float() for k in glob}


@AGGREGATORS.register("median", "coordinate-wise median of the uploaded tensors (Yin et al. 2018, Option I; "
                      "Flower's FedMedian)")
class Median(AggregatorBase):
    accepts = frozenset({PARAMS})
    needs = frozenset()

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        return median_params(glob, updates), state
