"""FlexLoRA (Bai et al., NeurIPS 2024, Sec. 3.2): aggregate the full-size updates, redistribute by SVD.

For every LoRA module the server averages the clients' products, weighted by their example counts,
ΔW_g = Σ_k (n_k / N) B_k A_k (Eq. 3; clients of any rank, zero-padded by ``sharing.lora_ranks``), and factorises
it by SVD, ΔW_g = U Σ Vᵀ. The global LoRA at rank r keeps the r leading components, B = U_r Σ_r and A = V_rᵀ
(Eq. 4); as the components are sorted, a rank-r_k client's truncation (the first r_k of them) is the rank-r_k
truncated SVD of ΔW_g, the matrix closest to it in Frobenius norm. Tensors that are not LoRA factors are averaged.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.aggregators.base import AGGREGATORS, AggregatorBase, Params, weights_of
from fedpeft.aggregators.fedavg import weighted_mean
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import pairs, products
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


def svd_factors(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) with B A the rank-``rank`` truncated SVD of ``delta`` [d_out, d_in]: B = U_r Σ_r, A = V_rᵀ (Eq. 4),
    zero-padded when ``delta`` has fewer singular values than ``rank``."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    k = min(rank, s.numel())
    b = torch.zeros(delta.shape[0], rank, dtype=torch.float64, device=delta.device)
    a = torch.zeros(rank, delta.shape[1], dtype=torch.float64, device=delta.device)
    b[:, :k], a[:k] = u[:, :k] * s[:k], vh[:k]
    return b, a


@AGGREGATORS.register("flexlora", "FlexLoRA: sample-weighted average of the clients' B·A, re-factorised by SVD at the "
                      "global rank (clients take its leading r_k components)")
class FlexLoRA(AggregatorBase):
    reads_products = True

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        weights = weights_of(updates)
        modules = pairs(glob)
        factors = {n for pair in modules.values() for n in pair}
        rest = [n for n in glob if n not in factors]
        out = weighted_mean([{n: u.tensors[n] for n in rest} for u in updates], weights) if rest else {}
        total = float(sum(weights))
        deltas = [products(u.tensors) for u in updates]
        for m, (a, b) in modules.items():
            delta = sum((w / total) * d[m] for w, d in zip(weights, deltas))
            out[b], out[a] = (t.float() for t in svd_factors(delta, glob[a].shape[0]))
        return out, state
