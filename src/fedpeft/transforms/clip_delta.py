"""Clip the client's delta on the client: w^k <- w^t + Δ·min(1, S/‖Δ‖₂), Δ = w^k − w^t over every update tensor.

The client-side half of DP-FedAvg with client-side fixed clipping (Flower's ``fixedclipping_mod`` beside
``DifferentialPrivacyClientSideFixedClipping``): the server never needs an individual update to bound each
client's influence, so it composes with secure aggregation (``dp_fedavg`` with ``clipping: client``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.clipping import clip_updates
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.transforms.base import TRANSFORMS, TransformBase

torch = lazy("torch")


class ClipDeltaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_norm: float = Field(..., gt=0, description="S: the client's delta is scaled to L2 norm at most S")


@TRANSFORMS.register("clip_delta", "scale the client's delta to L2 norm at most max_norm, on the client "
                     "(client-side clipping for DP-FedAvg)", ClipDeltaSettings)
class ClipDelta(TransformBase):
    def apply(self, update: Update, start: Params, round: int, generator: torch.Generator) -> Update:
        base = {k: start[k].float() for k, v in update.tensors.items() if k in start and v.is_floating_point()}
        (clipped,), _ = clip_updates(base, [update], self.settings.max_norm)
        return clipped
