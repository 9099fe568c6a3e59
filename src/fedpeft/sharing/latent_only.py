"""Fed-SB (Singhal, Ponkshe et al. 2025, Sec. 3): federated LoRA-SB, as the stage ``fedsb`` over the ``lora_sb``
adapter. The server distributes the fixed B and A of every module with the global R; clients train R alone (and a
linear task head) and upload only R, r² numbers per module whatever the model's widths; the server averages the R_k.
With B and A common and fixed, the average of the clients' updates is exactly the update of the average,
Σ_k p_k B R_k A = B (Σ_k p_k R_k) A (Eq. 3), so the aggregation is exact with any averaging aggregator, the replies
stay summable (secure aggregation) and differential privacy's noise falls on r² numbers per module only.

B and A travel on the downlink in every round with R: fedpeft's clients keep no tensors between rounds, so each
receives them whenever it is selected (the paper counts their one distribution at the start). They are never
uploaded.
"""

from __future__ import annotations

from fedpeft.comm.lora_pairs import A, B
from fedpeft.sharing.base import SHARING, WHICH, Shapes, ShareAll


def _fixed(name: str) -> bool:
    return name.endswith(A) or name.endswith(B)


@SHARING.register("fedsb", "Fed-SB: LoRA-SB's fixed B and A sent with R, only the r x r R (and a task head) trained "
                  "and uploaded; averaging R is exact")
class LatentOnly(ShareAll):
    adapters = frozenset({"lora_sb"})
    decides = frozenset({WHICH})

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        """R and the tensors that are no LoRA factor; B and A are sent, never uploaded."""
        return {k: v for k, v in update.items() if not _fixed(k)}

    def finish(self, update, start, trained, instruction, client, round, plan):
        return update.with_tensors({k: v for k, v in update.tensors.items() if not _fixed(k)})
