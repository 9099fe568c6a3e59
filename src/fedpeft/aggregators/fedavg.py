"""FedAvg (McMahan et al. 2017; FedPrompt Eq. 5) and the uniform mean, over named tensors."""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.aggregators.base import AGGREGATORS, DISTRIBUTION, PARAMS, AggregatorBase, Params, weights_of
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


def weighted_mean(updates: Sequence[Params], weights: Sequence[float]) -> Params:
    """sum_k (w_k / sum w) * P_k, computed in float64 and returned as float32 (Eq. 5)."""
    if not updates:
        raise ValueError("weighted_mean: no updates to aggregate")
    if len(updates) != len(weights):
        raise ValueError("weighted_mean: one weight per update is required")
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"weighted_mean: weights must be non-negative with a positive sum, got {list(weights)}")
    keys = updates[0].keys()
    out = {}
    for k in keys:
        acc = torch.zeros(updates[0][k].shape, dtype=torch.float64)
        for u, w in zip(updates, weights):
            acc += (w / total) * u[k].double()
        out[k] = acc.float()
    return out


def uniform_mean(updates: Sequence[Params]) -> Params:
    """Plain mean 1/|S| sum_k P_k (FedAvg with equal client weights)."""
    return weighted_mean(updates, [1.0] * len(updates))


@AGGREGATORS.register("fedavg", "sample-weighted average of the uploaded tensors (FedAvg, FedPrompt Eq. 5)")
class FedAvg(AggregatorBase):
    """P_{t+1} = sum_k (n_k / N_t) P_{t+1}^k; also averages CMA-ES distributions (FedAvg-BBT)."""

    accepts = frozenset({PARAMS, DISTRIBUTION})
    secure_sum = True

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        return weighted_mean([u.tensors for u in updates], weights_of(updates)), state


@AGGREGATORS.register("uniform", "unweighted mean of the uploaded tensors")
class Uniform(AggregatorBase):
    accepts = frozenset({PARAMS, DISTRIBUTION})
    secure_sum = True
    uniform_weights = True  # under secure aggregation every client masks weight 1

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        return uniform_mean([u.tensors for u in updates]), state
