"""HetLoRA's sparsity-weighted aggregation (Cho et al., 2024, Sec. 3.2).

The clients' LoRA factors arrive zero-padded to the global rank (``sharing.lora_ranks``) and are averaged with
weights proportional to the Frobenius norm of each client's update, p_k = ‖B_k A_k‖_F / Σ_j ‖B_j A_j‖_F (norms over
all modules together), so that a client whose low-rank update is small (near-sparse) pulls the padded global
factors less than one that learned much. Tensors that are not LoRA factors take the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedpeft.aggregators.base import AGGREGATORS, AggregatorBase, Params
from fedpeft.aggregators.fedavg import weighted_mean
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import products
from fedpeft.comm.update import Update


def sparsity_weights(updates: Sequence[Params]) -> list[float]:
    """p_k ∝ ‖B_k A_k‖_F over all modules (uniform when every update is zero)."""
    norms = [math.sqrt(sum(float((d ** 2).sum()) for d in products(u).values())) for u in updates]
    total = sum(norms)
    return [n / total for n in norms] if total > 0 else [1.0 / len(updates)] * len(updates)


@AGGREGATORS.register("hetlora", "HetLoRA: zero-padded LoRA factors averaged with weights proportional to the norm of "
                      "each client's B·A (sparsity-weighted aggregation)")
class HetLoRA(AggregatorBase):
    reads_products = True

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        tensors = [u.tensors for u in updates]
        return weighted_mean(tensors, sparsity_weights(tensors)), state
