"""FLoRA's stacking aggregation (Wang et al., NeurIPS 2024, Sec. 3.2): exact, and of any mix of ranks.

For every LoRA module the server stacks the clients' factors, each A scaled by its weight p_k = n_k / N:
A ← [A; p_1 A_1; …; p_K A_K] (rows) and B ← [B, B_1, …, B_K] (columns), so the new product is the old one plus
Σ_k p_k B_k A_k exactly (Eq. 5), where averaging A and B separately would add cross terms. The stack is the
global update ΔW that the clients add to their frozen weights before they train a fresh LoRA
(``sharing.lora_stacking``); the initial LoRA (B = 0, so ΔW = 0) is dropped at the first stacking. It grows by
Σ_k r_k every round; once it is longer than D = the largest min(d_out, d_in) of the modules it cannot gain rank,
and is replaced by its exact factorisation B = U Σ, A = Vᵀ (SVD, all min(d_out, d_in) components, zero-padded to
D so that every module keeps one rank). Other tensors are averaged.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.aggregators.base import AGGREGATORS, AggregatorBase, Params, weights_of
from fedpeft.aggregators.fedavg import weighted_mean
from fedpeft.aggregators.flexlora import svd_factors
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import pairs
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


def stack(glob: Params, updates: Sequence[Params], weights: Sequence[float]) -> Params:
    """The stacked factors of every module (Eq. 5): A rows p_k A_k, B columns B_k, after the global ones. The
    initial LoRA (every B zero: no update yet, the paper's bare base model) is left out, not stacked as zeros."""
    total = float(sum(weights))
    modules = pairs(glob).values()
    base = [] if all(not bool(glob[b].any()) for _, b in modules) else [glob]
    out = {}
    for a, b in modules:
        out[a] = torch.cat([g[a].double() for g in base]
                           + [(w / total) * u[a].double() for w, u in zip(weights, updates)]).float()
        out[b] = torch.cat([g[b].double() for g in base] + [u[b].double() for u in updates], dim=1).float()
    return out


def compact(factors: Params) -> Params:
    """Every module's B A re-factorised exactly at rank D = max over modules of min(d_out, d_in), when the stack is
    longer than D (unchanged otherwise)."""
    modules = pairs(factors)
    if not modules:
        return factors
    bound = max(min(factors[b].shape[0], factors[a].shape[1]) for a, b in modules.values())
    if all(factors[a].shape[0] <= bound for a, _ in modules.values()):
        return factors
    out = dict(factors)
    for a, b in modules.values():
        out[b], out[a] = (t.float() for t in svd_factors(factors[b].double() @ factors[a].double(), bound))
    return out


@AGGREGATORS.register("stack", "FLoRA: the clients' LoRA factors stacked (A scaled by n_k / N), exact aggregation of "
                      "any mix of ranks; the stack is re-factorised exactly once it outgrows the modules")
class StackFactors(AggregatorBase):
    needs = frozenset({"fresh_lora"})  # fresh LoRA blocks (sharing.lora_stacking), not trained global tensors

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        weights = weights_of(updates)
        stacked = compact(stack(glob, [u.tensors for u in updates], weights))
        rest = [k for k in glob if k not in stacked]
        if rest:
            stacked |= weighted_mean([{k: u.tensors[k] for k in rest} for u in updates], weights)
        return stacked, state
