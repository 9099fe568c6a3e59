"""FLoRA's clients (Wang et al., NeurIPS 2024, Sec. 3.2-3.3): the sharing policy ``stacking`` over the ``lora``
adapter, with the ``stack`` aggregator (``aggregators.stacking``).

The global tensors are the stacked LoRA factors of all earlier rounds, ΔW = s·B A (s = alpha / r for every
client, so the stack keeps one scale). A client adds ΔW to its frozen weights and trains a fresh LoRA of its own
rank r_k (``federation.client_profiles[].rank``; default the adapter's r): A drawn anew every round (PEFT's
kaiming-uniform, seeded by client and round), B = 0. Here the merge is the stack kept as a frozen first block of
the same LoRA layers, [A; A_k] and [B, B_k], which computes W + s·B A + s·B_k A_k as the merged model does, without
a copy of the weights. Only the fresh block (r_k rows of A, columns of B) is uploaded.

The download differs from the paper's accounting: FLoRA's clients keep their merged weights between rounds and
receive only the round's new stack; fedpeft's clients keep no weights, so every round they receive the whole
stack (at most D rows, ``aggregators.stacking``), counted as sent.
"""

from __future__ import annotations

import math
from typing import Any

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import RANK_DIM, factor, pairs
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.rng import torch_rng
from fedpeft.sharing.base import SHAPE, SHARING, WHICH, ClientPlan, Shapes, ShareAll, SharingContext
from fedpeft.sharing.lora_ranks import RANK, check_rank, rank_wire_shapes

torch = lazy("torch")

FRESH = "fresh_lora"  # what the clients upload: a fresh LoRA block to stack, not the trained global tensors


def fresh_block(params: Params, r: int) -> Params:
    """The last ``r`` rows of every A and columns of every B: the client's fresh LoRA (other tensors unchanged)."""
    return {k: v.narrow(RANK_DIM[f], v.shape[RANK_DIM[f]] - r, r).contiguous() if (f := factor(k)) else v
            for k, v in params.items()}


@SHARING.register("stacking", "FLoRA: clients merge the stacked global LoRA into their frozen weights and train a "
                  "fresh LoRA at their own rank; only the fresh factors are uploaded")
class FreshLora(ShareAll):
    summable = False  # secure aggregation: the fresh factors are stacked, not summed
    deltas = False    # a fresh block is stacked as it is; its difference from the stack means nothing
    adapters = frozenset({"lora"})
    decides = frozenset({WHICH, SHAPE})  # a fresh block of the client's rank, not the global tensors
    ranked = True
    aggregators = frozenset({"stack"})
    provides = frozenset({FRESH})

    def __init__(self, settings: Any, ctx: SharingContext) -> None:
        super().__init__(settings, ctx)
        self.r = int(ctx.rank)

    @classmethod
    def same_tensors(cls, settings: Any) -> bool:
        """No: every round a fresh LoRA block is trained over a stack that grows."""
        return False

    def tier_rank(self, client: int) -> int:
        p = self.ctx.profiles[client] if client < len(self.ctx.profiles) else None
        return p.rank if p is not None and p.rank is not None else self.r

    # ---------------------------------------------------------------- client

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan:
        """The received stack, frozen, followed by a fresh rank-r_k LoRA: A ~ U(±1/√d_in), B = 0 (Sec. 3.3)."""
        r = self.tier_rank(client.client_id)
        gen = torch_rng(client.seed, round, client.client_id, "flora-fresh-lora")
        params, frozen = dict(start), {}
        for a, b in pairs(start).values():
            d_out, d_in = start[b].shape[0], start[a].shape[1]
            fresh_a = (torch.rand(r, d_in, generator=gen) * 2 - 1) / math.sqrt(d_in)
            params[a] = torch.cat([start[a].float(), fresh_a])
            params[b] = torch.cat([start[b].float(), torch.zeros(d_out, r)], dim=1)
            frozen[a] = torch.arange(params[a].shape[0])[:, None].expand_as(params[a]) < start[a].shape[0]
            frozen[b] = torch.arange(params[b].shape[1])[None, :].expand_as(params[b]) < start[b].shape[1]
        return ClientPlan(params=params, frozen=frozen, own={RANK: r})

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update:
        """Upload the fresh block only: the last r_k rows of every A and columns of every B."""
        update = update.with_tensors(fresh_block(update.tensors, plan.own[RANK]))
        update.scalars |= {RANK: plan.own[RANK]}
        return update

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        """The fresh block as drawn (A) and zero (B): ``start`` is the plan's stack + fresh block."""
        return fresh_block(start, plan.own[RANK])

    # ---------------------------------------------------------------- server

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        return rank_wire_shapes(update)

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]:
        return {}, (RANK,)

    def check(self, reply: Message, client: int, state: Message) -> None:
        check_rank(reply, client, self.tier_rank(client))
