"""FedEx-LoRA (Singhal et al., ACL 2025, Sec. 3): exact aggregation by folding the averaging error into the frozen
weights, as the stage ``fedex`` over the ``lora`` adapter with the ``fedavg`` or ``uniform`` aggregator.

The server averages A and B as its aggregator does (``fedavg``: Ā = Σ_k p_k A_k, B̄ = Σ_k p_k B_k, p_k = n_k / Σ_j n_j;
``uniform``: p_k = 1 / K, as the authors' code averages) and adds the
residual Σ_k p_k B_k A_k − B̄Ā to each adapted module's base weight (Eq. 5–6, scaled by s = alpha / r as the LoRA
update is), so that the global model W₀ + s·(R + B̄Ā) is the exact average of the clients' W₀ + s·(R + B_k A_k).

Here the residual R of every module is a global tensor (``comm.lora_pairs.RESIDUAL``, in B A's units, one
full-size [d_out, d_in] matrix per adapted module, accumulated over the rounds): the pretrained weights in memory
stay untouched and shared by every client of the process, and R is checkpointed, resumed and sent with the factors
like any global tensor. It travels on the downlink in full every round from the second on (fedpeft's clients keep no
weights between rounds, so each receives the accumulated R, not only the round's increment as the authors'
simulation applies it in place); it is never uploaded. A client trains A and B on the base weight W₀ + s·R (its
forward's ``static`` weights; no gradient reaches R). The residual is exact in float64, stored in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import RESIDUAL, A, pairs
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.sharing.base import FOLD, SHARING, ClientPlan, Shapes, ShareAll

torch = lazy("torch")


def residual_step(glob: Params, before: Params, clients: Sequence[Params], weights: Sequence[float]) -> Params:
    """Each module's new residual R + Σ_k p_k B_k A_k − B̄Ā (Eq. 6), with B̄, Ā the aggregated factors in ``glob``, R
    the residual ``before`` the round (zero at first) and client k's factors in ``clients[k]`` (a factor it did not
    upload is read from ``before``)."""
    total = float(sum(weights))
    out = {}
    for a, b in pairs(glob).values():
        key = a[: -len(A)] + RESIDUAL
        exact = sum((w / total) * (c.get(b, before[b]).double() @ c.get(a, before[a]).double())
                    for w, c in zip(weights, clients))
        r = before[key].double() if key in before else 0.0
        out[key] = (r + exact - glob[b].double() @ glob[a].double()).float()
    return out


@SHARING.register("fedex", "FedEx-LoRA: A and B averaged, the residual Σ p_k B_k A_k − B̄Ā folded into the frozen "
                  "base weights each round (exact aggregation; a full-size residual on the downlink)")
class FoldResidual(ShareAll):
    adapters = frozenset({"lora"})
    aggregators = frozenset({"fedavg", "uniform"})  # the residual completes the (sample- or uniformly) weighted mean
    summable = False  # the residual needs each client's B_k A_k, which a sum of the factors does not give
    decides = frozenset({FOLD})
    needs_pairs = True

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        """The residual is sent, never uploaded."""
        return {k: v for k, v in update.items() if not k.endswith(RESIDUAL)}

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan | None:
        """Train the factors (and a head) on the base weights W₀ + s·R; R itself is no parameter of the step."""
        residual = {k: v for k, v in start.items() if k.endswith(RESIDUAL)}
        if not residual:
            return None
        return ClientPlan(params={k: v for k, v in start.items() if k not in residual},
                          static=self.ctx.objective.adapter.overrides(residual))

    def fold(self, glob: Params, before: Params, updates: Sequence[Update], weights: Sequence[float]) -> Params:
        if not updates:
            return {}
        return residual_step(glob, before, [u.tensors for u in updates], weights)
