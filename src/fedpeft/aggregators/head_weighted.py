"""Head-specific weighted aggregation (head-pruning paper Eq. 8) with FedAvg (Eq. 5) for the rest.

For every head-assignable slice p_h of the global adapter (LoRA B rows of one head, a deep prompt's key/value
head) and the selected clients c with importances alpha_hc (0 where c pruned h, Eq. 7):

    p_hg <- p_hg + eta · Σ_c alpha_hc Δp_hc / (Σ_c alpha_hc + eps)                         (Eq. 8)

so a head kept by one client takes that client's slice, and a head no client kept stays unchanged. A slice that
feeds a group of query heads (grouped-query attention) is weighted by the sum of the group's importances. All
other tensors (LoRA A, a linear head) follow sample-weighted FedAvg, Φ <- Φ + eta · Σ n_c ΔΦ_c / Σ n_c (Eq. 5).
Reads the importances over all heads (``head_alpha``) that the head-pruning sharing policy supplies.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, AggregatorBase, Params, deltas, weights_of
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")

ALPHA = "head_alpha"


class HeadWeightedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server_lr: float = Field(1.0, gt=0, description="eta (spec A7: 1.0)")
    eps: float = Field(1e-8, gt=0, description="epsilon of Eq. 8 (spec A7)")


def head_weighted(glob: Params, updates: Sequence[Update], slices: dict, server_lr: float = 1.0,
                  eps: float = 1e-8) -> Params:
    """Eq. 8 on the head slices of ``slices`` and Eq. 5 on everything else; float64 math, float32 result."""
    ds = deltas(glob, updates)
    n = torch.tensor(weights_of(updates), dtype=torch.float64)
    p = n / n.sum()
    out = {}
    for k, g in glob.items():
        step = sum(float(p[i]) * d[k] for i, d in enumerate(ds))                          # Eq. 5
        if k in slices:
            step = step.clone()
            for heads, dim, a, b in slices[k]:
                idx = torch.tensor(heads, dtype=torch.long)
                w = torch.stack([u.aux_tensors[ALPHA].double()[idx].sum() for u in updates])  # alpha_hc
                num = sum(float(w[i]) * d[k].narrow(dim, a, b - a) for i, d in enumerate(ds))
                step.narrow(dim, a, b - a).copy_(num / (float(w.sum()) + eps))          # Eq. 8
        out[k] = (g.double() + server_lr * step).float()
    return out


@AGGREGATORS.register("head_weighted", "head-pruning Eq. 8: each head's slice averaged with the clients' head "
                      "importances; FedAvg (Eq. 5) for the rest", HeadWeightedSettings)
class HeadWeighted(AggregatorBase):
    needs = frozenset({ALPHA})

    def __init__(self, settings: HeadWeightedSettings, ctx) -> None:
        super().__init__(settings, ctx)
        if not ctx.head_slices:
            raise ValueError("method.aggregator.name: 'head_weighted' needs an adapter with head-assignable "
                             "tensors (lora, deep_prompt)")

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        ordered = sorted(updates, key=lambda u: u.client)
        return head_weighted(glob, ordered, self.ctx.head_slices, self.settings.server_lr, self.settings.eps), state
