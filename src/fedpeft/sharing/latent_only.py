"""Fed-SB (Singhal, Ponkshe et al. 2025, Sec. 3): federated LoRA-SB, as the stage ``fedsb`` over the ``lora_sb``
adapter. The server distributes the fixed B and A of every module; clients train R alone (and a linear task head)
and upload only R, r² numbers per module whatever the model's widths; the server averages the R_k. With B and A
common and fixed, the average of the clients' updates is exactly the update of the average,
Σ_k p_k B R_k A = B (Σ_k p_k R_k) A, so the aggregation is exact with any averaging aggregator, the replies stay
summable (secure aggregation) and differential privacy's noise falls on r² numbers per module only.

B and A travel down once per client, as the paper counts them: with R in the first round a client takes part in; the
client keeps them (its private state) and later rounds send it R (and the head) alone. The server knows who holds
them from the replies it aggregated; under secure aggregation, where it sees only their sum, it sends them every
round (an over-count, never an under-count). They are never uploaded.
"""

from __future__ import annotations

from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import A, B
from fedpeft.comm.update import Params
from fedpeft.sharing.base import SHARING, WHICH, Shapes, ShareAll

HOLDING = "holding"  # state scalar: the clients that hold B and A (sorted ids)


def _fixed(name: str) -> bool:
    return name.endswith(A) or name.endswith(B)


@SHARING.register("fedsb", "Fed-SB: LoRA-SB's fixed B and A sent once to each client, only the r x r R (and a task "
                  "head) trained, uploaded and averaged (exact)")
class LatentOnly(ShareAll):
    adapters = frozenset({"lora_sb"})
    decides = frozenset({WHICH})
    per_client = True  # B and A go only to the clients that do not hold them yet

    def init(self, glob: Params) -> Message:
        return Message(scalars={HOLDING: []})

    def for_client(self, tensors: Params, client: int, state: Message) -> Params:
        if client in state.scalars.get(HOLDING, []):
            return {k: v for k, v in tensors.items() if not _fixed(k)}
        return tensors

    def after_aggregate(self, glob, updates, state, round):
        """The clients whose replies were aggregated hold B and A now."""
        new = {u.client for u in updates if u.client >= 0}
        return Message(scalars={HOLDING: sorted(set(state.scalars.get(HOLDING, [])) | new)}), None

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        """R and the tensors that are no LoRA factor; B and A are sent, never uploaded."""
        return {k: v for k, v in update.items() if not _fixed(k)}

    def client_params(self, received: Params, private: Params) -> Params:
        return {k: v.float() for k, v in private.items()} | received

    def private_state(self, trained: Params) -> Params:
        return {k: v.clone() for k, v in trained.items() if _fixed(k)}

    def finish(self, update, start, trained, instruction, client, round, plan):
        return update.with_tensors({k: v for k, v in update.tensors.items() if not _fixed(k)})
