"""Sharing one of LoRA's two factors: FFA-LoRA and FedSA-LoRA, each a sharing policy over the ``lora`` adapter.

- ``ffa`` (FFA-LoRA, Sun et al., ICLR 2024, Sec. 4): every client keeps A frozen at its seeded initialisation (the
  same on every device, since initial tensors come from the experiment seed) and trains only B, which is all that
  is exchanged: half of LoRA's upload and download (for square projections). With A common and fixed, the average
  of the clients' products is the product of the average, (1/K)·Σ_k B_k·A = B̄·A, so FedAvg on B aggregates the
  updates ΔW exactly (the inexactness of averaging A and B separately, Eq. 2 of the paper, is gone).
- ``fedsa`` (FedSA-LoRA, Guo et al., ICLR 2025, Sec. 4.2): A is trained and averaged (it learns what the clients
  share), B is trained and kept on each device (what is client-specific): each client's model is B_k·Ā, scored on
  its own test shard; the global B stays at its initial zeros, so the global model alone is the frozen backbone.
  A linear task head stays on the device with B, as the authors' classification runs keep it (their GLUE
  configuration's personalised parameters are B and the classifier); ``share_head: true`` averages it instead.

FFA-LoRA trains and averages tensors that are not LoRA factors (a linear task head), as FedAvg does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import A, B
from fedpeft.comm.update import Params
from fedpeft.lazy import lazy
from fedpeft.sharing.base import SHARING, WHICH, ClientPlan, ShareAll

torch = lazy("torch")


class FrozenA(ShareAll):
    """FFA-LoRA: only the B factors are trained and exchanged; every A stays at the seeded initialisation."""

    adapters = frozenset({"lora"})
    decides = frozenset({WHICH})

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        """B and any tensor that is not a LoRA factor (a linear task head), averaged as in FedAvg."""
        return sorted(k for k in glob if not k.endswith(A))

    def client_params(self, received: Params, private: Params) -> Params:
        return self.ctx.initial_params() | received

    def plan(self, start: Params, instruction: Message, client: Any, round: int) -> ClientPlan:
        return ClientPlan(frozen={k: torch.ones_like(v, dtype=torch.bool) for k, v in start.items() if k.endswith(A)})


class PersonalBSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    share_head: bool = Field(False, description="average a linear task head (model.readout: linear) with A; by "
                                                "default it stays on each client with B, as in the authors' "
                                                "classification runs")


class PersonalB(ShareAll):
    """FedSA-LoRA: the A factors are exchanged and averaged; each client trains and keeps its own B factors (and,
    unless ``share_head``, its own task head)."""

    adapters = frozenset({"lora"})
    decides = frozenset({WHICH})
    uploads_pairs = False  # each B stays on its client: the server never sees a client's product

    def _is_shared(self, key: str) -> bool:
        return key.endswith(A) or (self.settings.share_head and not key.endswith(B))

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        """A (and the task head with ``share_head``), averaged as in FedAvg."""
        return sorted(k for k in glob if self._is_shared(k))

    def client_params(self, received: Params, private: Params) -> Params:
        """Ā from the server, the device's own B and head (their initial values until it first trains)."""
        return self.ctx.initial_params() | {k: v.float() for k, v in private.items()} | received

    def private_state(self, trained: Params) -> Params:
        return {k: v.clone() for k, v in trained.items() if not self._is_shared(k)}


SHARING.add("ffa", FrozenA, "FFA-LoRA: A frozen at its seeded initialisation on every client; only B trained and "
            "exchanged (exact aggregation, half the bytes)")
SHARING.add("fedsa", PersonalB, "FedSA-LoRA: A shared and averaged, B (and a task head) trained and kept on each "
            "client (personalised)", PersonalBSettings)
