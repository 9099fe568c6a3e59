"""How far the LoRA update the server broadcasts is from the exact average of the clients' updates.

Averaging A and B separately gives B̄Ā, which is not Σ_k p_k B_k A_k (FedEx-LoRA, Singhal et al. 2025, Eq. 2; FFA-LoRA
Eq. 2): the relative deviation

    e = ‖P_new − (P_0 + Σ_k p_k P_k)‖_F / ‖P_0 + Σ_k p_k P_k‖_F,

over all adapted modules together, with P the product B A of a module (B R A with LoRA-SB's R, Fed-SB; plus the
residual R that FedEx-LoRA folds into the base weight: W + s·(B A + R); the scaling s = alpha / r, common to every
client, cancels), P_k client k's trained product, p_k its weight under the aggregator (n_k / Σ_j n_j, or 1 / K for an
unweighted mean) and P_new the broadcast product. P_0 is the global product the clients trained on top of when their
uploads are fresh blocks (FLoRA's stacking); it is zero when they upload their trained global factors. FedAvg-LoRA's
e is positive; FFA-LoRA's (A common and frozen), Fed-SB's (B and A common and fixed) and FLoRA's (stacked) are zero
up to float rounding; FlexLoRA's is what its rank-r SVD of Σ_k p_k P_k leaves out, HetLoRA's includes its
reweighting of the clients by their norms.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.comm.lora_pairs import RESIDUAL, A, pairs, product
from fedpeft.comm.update import Params
from fedpeft.lazy import lazy

torch = lazy("torch")


def aggregation_error(before: Params, after: Params, clients: Sequence[Params], weights: Sequence[float],
                      fresh: bool = False, skip: frozenset[str] = frozenset()) -> float | None:
    """e above for the modules of ``before`` whose factors are not in ``skip`` (tensors a client keeps to itself).
    ``clients[k]`` holds client k's factors; a factor it did not upload (FFA-LoRA's common A) is read from
    ``before``. None when no module qualifies or the exact product is zero."""
    total = float(sum(weights))
    if not clients or total <= 0:
        return None
    num = den = 0.0
    seen = False
    for a, b in pairs(before).values():
        if a in skip or b in skip or a not in after or b not in after:
            continue
        seen = True
        module = a[: -len(A)]
        exact = product(before, module) if fresh else 0.0
        for w, c in zip(weights, clients):
            exact = exact + (w / total) * product(c, module, before)
        got = product(after, module, before)
        res = module + RESIDUAL
        if res in after:  # the part of the round's update folded into the base weight
            got = got + after[res].double() - (before[res].double() if res in before else 0.0)
        num += float(((got - exact) ** 2).sum())
        den += float((torch.as_tensor(exact) ** 2).sum())
    if not seen or den == 0.0:
        return None
    return (num / den) ** 0.5
