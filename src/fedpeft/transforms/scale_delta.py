"""Scale the client's delta: w^k <- w^t + gamma (w^k - w^t).

gamma > 1 is the boosting of a model-replacement attack (Bagdasaryan et al. 2020, Eq. 3: gamma = n/eta);
gamma < 1 damps a client's contribution. Applies to every update tensor the client started from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.transforms.base import TRANSFORMS, TransformBase

torch = lazy("torch")


class ScaleDeltaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    factor: float = Field(..., description="gamma: the delta w^k - w^t is multiplied by it")


@TRANSFORMS.register("scale_delta", "multiply the client's delta by a factor (boosting / damping)",
                     ScaleDeltaSettings)
class ScaleDelta(TransformBase):
    def apply(self, update: Update, start: Params, round: int, generator: torch.Generator) -> Update:
        g = self.settings.factor
        out = {k: (start[k].to(v.device, torch.float32) + g * (v.float() - start[k].to(v.device, torch.float32)))
               if k in start and v.is_floating_point() else v for k, v in update.tensors.items()}
        return update.with_tensors(out)
