"""Clients of different LoRA ranks (``federation.client_profiles[].rank``): the sharing policy ``ranks`` over the
``lora`` adapter, which HetLoRA and FlexLoRA share; they differ in the aggregator (``aggregators.hetlora``,
``aggregators.flexlora``).

The global LoRA has the adapter's rank r (the largest tier's). Client k of rank r_k receives the first r_k rows of
every A and columns of every B (HetLoRA Sec. 3.1, "distribution by truncation"; for FlexLoRA's SVD factors, the
rank-r_k truncated SVD of the aggregated ΔW, Sec. 3.2), trains them with the rest zero and frozen, and uploads
them at its rank; the reply is accepted only at the rank the server holds for that client (or lower, after
HetLoRA's self-pruning), and expanded by zero-padding (HetLoRA Sec. 3.2) for the aggregator.

HetLoRA's rank self-pruning (Sec. 3.3) is ``self_prune``: with the tail t = [⌊γ r_k⌋, r_k) of the ranks, the client
adds λ·Σ_m ‖B_m[:, t]‖_F·‖A_m[t, :]‖_F to its local loss, and after training drops the tail (its rank becomes
max(r_min, ⌊γ r_k⌋)) when that score is below the score of the factors it received; the server keeps each client's
current rank. (The paper's defaults γ = 0.99, λ = 0.01 are read from public reimplementations; the authors' code
is not public.)
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import RANK_DIM, factor, pad, pairs, rank_mask, rank_of, truncate
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.sharing.base import SHAPE, SHARING, ClientPlan, Shapes, ShareAll, SharingContext

torch = lazy("torch")

RANK = "rank"          # reply scalar: the rank the client uploads at
RANKS = "ranks"        # server state: client id -> its current rank
TAIL = "tail_score"    # reply scalar (self-pruning): the trained factors' tail score


class RankSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    self_prune: bool = Field(False, description="HetLoRA's rank self-pruning (Sec. 3.3): a tail-norm penalty in the "
                                                "local loss, and the tail dropped when its score falls")
    prune_lambda: float = Field(0.01, ge=0, description="λ: weight of the tail score Σ_m ‖B_m[:, t]‖_F·‖A_m[t, :]‖_F, "
                                                        "t the ranks from ⌊γr⌋ on")
    prune_gamma: float = Field(0.99, gt=0, lt=1, description="γ: a pruned rank becomes ⌊γ r⌋")
    min_rank: int = Field(1, ge=1, description="r_min: self-pruning never goes below it")


@SHARING.register("ranks", "LoRA at each client's own rank (federation.client_profiles): truncated download, "
                  "zero-padded upload (HetLoRA, FlexLoRA)", RankSettings)
class RankTiers(ShareAll):
    summable = False  # secure aggregation: each client uploads at its own rank
    adapters = frozenset({"lora"})
    decides = frozenset({SHAPE})  # each client's rank
    per_client = True
    ranked = True

    def __init__(self, settings: RankSettings, ctx: SharingContext) -> None:
        super().__init__(settings, ctx)
        self.r_max = int(ctx.rank)
        for p in {id(p): p for p in ctx.profiles if p is not None}.values():
            if p.rank is not None and p.rank > self.r_max:
                raise ValueError(f"federation.client_profiles: tier '{p.name}' has rank {p.rank}, above "
                                 f"method.adapter.r ({self.r_max}), the global LoRA's rank")

    def tier_rank(self, client: int) -> int:
        """The rank of the client's tier (the adapter's r without tiers)."""
        p = self.ctx.profiles[client] if client < len(self.ctx.profiles) else None
        return p.rank if p is not None and p.rank is not None else self.r_max

    def rank(self, client: int, state: Message) -> int:
        """The client's current rank: its tier's, or lower after self-pruning."""
        return int(state.scalars.get(RANKS, {}).get(str(client), self.tier_rank(client)))

    # ---------------------------------------------------------------- server

    def init(self, glob: Params) -> Message:
        return Message(scalars={RANKS: {str(c): self.tier_rank(c) for c in range(len(self.ctx.profiles))}})

    def for_client(self, tensors: Params, client: int, state: Message) -> Params:
        return truncate(tensors, self.rank(client, state))

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        return rank_wire_shapes(update)

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]:
        return {}, (RANK,)

    def check(self, reply: Message, client: int, state: Message) -> None:
        """At the client's current rank, or at its pruned rank ⌊γ r⌋ with self-pruning."""
        r = self.rank(client, state)
        check_rank(reply, client, r, pruned=self.pruned_rank(r) if self.settings.self_prune else None)

    def expand(self, update: Update, shared: Params) -> Update:
        """Zero-padded to the global rank (HetLoRA Sec. 3.2): the client's B A is unchanged."""
        return update.with_tensors(pad(update.tensors, self.r_max))

    def after_aggregate(self, glob, updates, state, round):
        """Each replying client's rank (lower after self-pruning)."""
        ranks = dict(state.scalars.get(RANKS, {})) | {str(u.client): int(u.scalars[RANK]) for u in updates}
        return Message(dict(state.tensors), dict(state.scalars) | {RANKS: ranks}), None

    def diagnostics(self, state: Message) -> dict[str, float]:
        ranks = list(state.scalars.get(RANKS, {}).values())
        return {"mean_rank": sum(ranks) / len(ranks)} if ranks else {}

    # ---------------------------------------------------------------- client

    def client_params(self, received: Params, private: Params) -> Params:
        """The received factors zero-padded to the global rank (the padding stays frozen at zero)."""
        return pad(received, self.r_max)

    def pruned_rank(self, r: int) -> int:
        """The rank a self-pruning client of rank r drops to: max(r_min, ⌊γ r⌋)."""
        return max(self.settings.min_rank, math.floor(self.settings.prune_gamma * r))

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan:
        r = rank_of({k: v for k, v in instruction.tensors.items() if factor(k)}) or self.r_max
        plan = ClientPlan(frozen=rank_mask(start, r), own={RANK: r})
        s = self.settings
        keep = self.pruned_rank(r)
        if s.self_prune and keep < r:
            lam, modules = s.prune_lambda, list(pairs(start).values())
            plan.own |= {"keep": keep, "before": float(tail_score(start, modules, keep, r))}
            plan.penalty = lambda work: lam * tail_score(work, modules, keep, r)
        return plan

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update:
        """Upload at the client's rank, or at ⌊γ r⌋ when self-pruning finds the tail's norm fell this round."""
        own = plan.own
        r = own[RANK]
        scalars = {}
        if "keep" in own:
            after = float(tail_score(trained, list(pairs(trained).values()), own["keep"], r))
            scalars[TAIL] = after
            if after < own["before"]:
                r = own["keep"]
        update = update.with_tensors(truncate(update.tensors, r))
        update.scalars |= {RANK: r, **scalars}
        return update

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        return truncate(start, int(update.scalars[RANK]))


def tail_score(params: Params, modules: list[tuple[str, str]], keep: int, r: int) -> torch.Tensor:
    """Σ_m ‖B_m[:, keep:r]‖_F · ‖A_m[keep:r, :]‖_F (differentiable; a zero subgradient at zero)."""
    norm = torch.linalg.vector_norm
    return sum(norm(params[b][:, keep:r]) * norm(params[a][keep:r]) for a, b in modules)


def rank_wire_shapes(update: Shapes) -> dict[str, tuple[int | None, ...]]:
    """LoRA factors travel at the client's rank: a variable size along the rank dimension."""
    return {k: tuple(None if (f := factor(k)) and d == RANK_DIM[f] else n for d, n in enumerate(s))
            for k, s in update.items()}


def check_rank(reply: Message, client: int, allowed: int, pruned: int | None = None) -> None:
    """The reply states rank ``allowed`` (or ``pruned``, the rank self-pruning drops to) and its factors have it."""
    r = reply.scalars[RANK]
    if not isinstance(r, int) or isinstance(r, bool) or r not in {allowed, pruned}:
        also = f" (or {pruned} after self-pruning)" if pruned is not None else ""
        raise ValueError(f"'{RANK}' is {r!r}; client {client} trains LoRA at rank {allowed}{also}")
    got = rank_of({k: v for k, v in reply.tensors.items() if factor(k)})
    if got is not None and got != r:
        raise ValueError(f"LoRA factors at rank {got}, the reply states rank {r}")
