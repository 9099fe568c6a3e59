"""Client-side head pruning (Venkatesha et al., head-pruning paper §3, Eqs. 6–7; spec §2.5 C2–C7) as a
sharing policy over any adapter with head-assignable slices (LoRA's B rows, deep prompts' key/value heads).

Each selected client scores every attention head on its local data with the received global adapter
(``importance``: confidence, Eq. 6, before training, spec A2; ``random``: the B2 baseline; ``none``: dense)
and keeps the top n_keep = ⌈(1 − s)·N⌉ heads of all N with one global threshold (Eq. 7, spec A5; ties to the
lower id). The slices of pruned heads are frozen at their global values while training (spec A4)
and are not uploaded: the reply carries only the kept slices of each head-assignable tensor, concatenated
in slice order, plus the kept head ids (int32) and their importances. Tensors that no head owns (LoRA A, a
linear head) travel in full. The server expands a reply back to full shape (pruned slices = global, so
their delta is 0) with the importances of pruned heads set to 0, for Eq. 8 (``aggregators.head_weighted``)
or plain FedAvg (B2, spec A10). The analytic OPs of the client step (spec §2.7) are reported per client.

Variants beside the paper's scoring, to test whether importance beats random pruning: ``scoring: lowest`` keeps the
least confident heads; ``scoring: random_fixed`` keeps one seeded random set in every client and round (``random``
redraws it per client and round, so it trains most heads over a run where a scored variant trains a few: the fair
control for "which heads" is the fixed set); ``sinks: cls_and_eos`` also discounts attention to the first token
([CLS]/BOS), which with [SEP] absorbs most of a confident head's attention; ``quota: per_layer`` keeps the same number
in every layer.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import HeadSlices
from fedpeft.backbones.attention_layout import head_overrides
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.costs import client_ops
from fedpeft.lazy import lazy, lazy_dict
from fedpeft.rng import SHARED, torch_rng
from fedpeft.sharing.base import SHAPE, SHARING, ClientPlan, Shapes, ShareAll, SharingContext
from fedpeft.sharing.head_importance import head_confidence, key_token_ids

torch = lazy("torch")

HEADS, ALPHA = "heads", "head_alpha"  # reply tensors: kept head ids, their importances


class HeadPruningSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sparsity: float = Field(0.9, ge=0, lt=1, description="s: share of all attention heads pruned per client")
    scoring: Literal["importance", "lowest", "random", "random_fixed", "none"] = Field(
        "importance", description="importance (Eq. 6 confidence: the most confident heads kept), lowest (the least "
                                  "confident kept, a control), random (B2 baseline: a new draw per client and "
                                  "round), random_fixed (one seeded draw kept by every client in every round: as "
                                  "few distinct heads trained as a scored variant), none (dense: keep all)")
    sinks: Literal["eos", "cls_and_eos"] = Field(
        "eos", description="key tokens whose attention does not count as confidence: the end-of-sequence token "
                           "([SEP]; the paper), or also the first token ([CLS] / BOS), the other attention sink")
    quota: Literal["global", "per_layer"] = Field(
        "global", description="one threshold over all heads (Eq. 7), or the same number of kept heads in every "
                              "layer (the remainder to the layers whose next head scores best)")
    importance_batches: int | None = Field(None, ge=1, description="cap on local batches of the importance pass")
    importance_batch_size: int = Field(32, ge=1, description="examples per batch of the importance pass")
    mode: Literal["lora_only", "masked", "pruned"] = Field(
        "lora_only", description="lora_only: pruned heads' slices frozen, backbone heads intact (paper, spec A3); "
                                 "masked: their outputs also zeroed; pruned: not computed at all (LoRA only)")


def n_keep(sparsity: float, num_heads: int) -> int:
    """Kept heads: ⌈(1 − s)·N⌉, at least 1 (T5-small, s = 0.9: 15 of 144 heads, the paper's 1.86 MB)."""
    return max(1, min(num_heads, math.ceil((1 - sparsity) * num_heads - 1e-9)))


def kept_heads(order: list[int], keep: int, per_layer: int | None = None) -> list[int]:
    """The first ``keep`` heads of ``order`` (best first; Eq. 7's global threshold), or with ``per_layer`` heads
    in each layer (ids l·H + h) the best ⌊keep / L⌋ of every layer plus one more in the layers whose next head
    comes first in ``order``, sorted."""
    if per_layer is None:
        return sorted(order[:keep])
    layers = len(order) // per_layer
    base, taken, out = keep // layers, [0] * layers, []
    for h in order:
        if taken[h // per_layer] < base:
            taken[h // per_layer] += 1
            out.append(h)
    for h in order:  # the remainder: at most one more head per layer, in order
        if len(out) == keep:
            break
        if h not in out and taken[h // per_layer] == base:
            taken[h // per_layer] += 1
            out.append(h)
    return sorted(out)


def kept_slices(slices: HeadSlices, kept: set[int]) -> dict[str, list[int]]:
    """Per head-assignable tensor: indices of its slices that feed at least one kept head."""
    return {k: [i for i, (heads, *_rest) in enumerate(v) if kept.intersection(heads)] for k, v in slices.items()}


def _take(t: torch.Tensor, spec: list[tuple], idx: list[int]) -> torch.Tensor:
    """The slices ``idx`` of ``t`` concatenated along their dim (a zero-size tensor when none)."""
    dim = spec[0][1] if spec else 0
    parts = [t.narrow(dim, spec[i][2], spec[i][3] - spec[i][2]) for i in idx]
    return torch.cat(parts, dim) if parts else t.narrow(dim, 0, 0)


@SHARING.register("head_pruning", "per-client pruning of attention heads by importance (head-pruning paper Eq. 6-7): "
                  "pruned heads' slices frozen and not uploaded", HeadPruningSettings)
class HeadPruning(ShareAll):
    summable = False  # secure aggregation: sparse uploads with per-client head ids and importances
    adapters = frozenset({"lora", "deep_prompt"})
    decides = frozenset({SHAPE})  # the kept heads' slices travel, expanded on the server
    dtypes = lazy_dict(lambda: {HEADS: torch.int32})
    provides = frozenset({HEADS, ALPHA})

    @classmethod
    def same_tensors(cls, settings: HeadPruningSettings) -> bool:
        """Not when pruned: the cut tensors' entries belong to other heads as the kept heads change."""
        return settings.mode != "pruned"

    @classmethod
    def side_by_side(cls, settings: HeadPruningSettings) -> bool:
        """Not while scoring importance: reading attentions switches the shared model to eager attention."""
        return settings.scoring not in ("importance", "lowest")

    def __init__(self, settings: HeadPruningSettings, ctx: SharingContext) -> None:
        super().__init__(settings, ctx)
        self.slices = ctx.head_slices
        if not self.slices:
            raise ValueError("method.sharing.name: 'head_pruning' needs an adapter with head-assignable tensors "
                             "(lora, deep_prompt)")
        self.num_heads = 1 + max(h for v in self.slices.values() for heads, *_ in v for h in heads)
        if settings.mode == "pruned":
            cfg = ctx.objective.backbone.model.config
            heads = int(cfg.num_attention_heads)
            if int(getattr(cfg, "num_key_value_heads", None) or heads) != heads:
                raise ValueError("method.sharing.mode: 'pruned' cannot cut heads out of grouped-query attention "
                                 "(key/value heads are shared); use 'masked'")
            if ctx.objective.adapter.name != "lora":
                raise ValueError("method.sharing.mode: 'pruned' trains LoRA's kept rows in their cut form; it needs "
                                 "the lora adapter (use 'masked' for other adapters)")
        self.keep = n_keep(settings.sparsity, self.num_heads) if settings.scoring != "none" else self.num_heads

    # ---------------------------------------------------------------- client

    def importance(self, params: Params, client: ClientContext) -> torch.Tensor:
        """alpha_c (Eq. 6): mean confidence of every head over the client's local data (or the first batches)."""
        clf, data = self.ctx.objective, client.train
        tok = clf.backbone.tokenizer
        eos = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        first = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        excluded = [i for i in (eos, first if self.settings.sinks == "cls_and_eos" else None) if i is not None]
        total = torch.zeros(self.num_heads, dtype=torch.float64)
        bs = self.settings.importance_batch_size
        starts = list(range(0, len(data), bs))[: self.settings.importance_batches]
        seen = 0
        for start in starts:
            batch = clf.batch(data, list(range(start, min(start + bs, len(data)))))
            attn, prep = clf.attentions(params, batch)
            keys = prep.extra.get("attention_mask", prep.attention_mask)
            ids = key_token_ids(batch["input_ids"], keys.shape[1], prep.insert_at, prep.inserted)
            total += head_confidence(attn, prep.attention_mask, ids, keys, excluded).double().cpu()
            seen += batch["input_ids"].shape[0]
        return total / max(seen, 1)

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan:
        """Eq. 7 before training: the kept heads, their importances, and the frozen mask of pruned slices."""
        s = self.settings
        if s.scoring in ("importance", "lowest"):
            alpha = self.importance(start, client)
            sign = -1.0 if s.scoring == "importance" else 1.0
            order = sorted(range(self.num_heads), key=lambda h: (sign * float(alpha[h]), h))
        elif s.scoring in ("random", "random_fixed"):
            alpha = torch.ones(self.num_heads, dtype=torch.float64)
            gen = (torch_rng(client.seed, round, client.client_id, "random-heads") if s.scoring == "random" else
                   torch_rng(client.seed, 0, SHARED, "random-heads-fixed"))  # one draw, every client alike
            order = torch.randperm(self.num_heads, generator=gen).tolist()
        else:
            alpha = torch.ones(self.num_heads, dtype=torch.float64)
            order = list(range(self.num_heads))
        model_cfg = self.ctx.objective.backbone.model.config
        per_layer = int(model_cfg.num_attention_heads) if s.quota == "per_layer" else None
        kept = kept_heads(order, self.keep, per_layer)
        frozen = {}
        keep_set = set(kept)
        for name, spec in self.slices.items():
            mask = torch.ones_like(start[name], dtype=torch.bool)
            for i in kept_slices({name: spec}, keep_set)[name]:
                _, dim, a, b = spec[i]
                mask.narrow(dim, a, b - a).fill_(False)
            frozen[name] = mask
        plan = ClientPlan(frozen=frozen, own={"kept": kept, "alpha": alpha[kept].float()})
        if s.mode != "lora_only":
            plan.static = head_overrides(self.ctx.objective.backbone, kept, s.mode)
        if s.mode == "pruned":  # train the kept slices only, compressed as they travel
            idx = kept_slices(self.slices, keep_set)
            plan.params = {k: _take(v, self.slices[k], idx[k]).clone() if k in self.slices else v
                           for k, v in start.items()}
            plan.frozen = None
        return plan

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update:
        """Upload only the kept slices (+ ids and importances) and report the step's analytic OPs."""
        kept = plan.own["kept"]
        update = update.with_tensors(self._wire_form(update.tensors, kept))
        update.aux_tensors |= {HEADS: torch.tensor(kept, dtype=torch.int32), ALPHA: plan.own["alpha"]}
        ops = client_ops(self.ctx.objective, len(kept) / self.num_heads, client.train,
                         int(update.scalars.get("steps", 0)), int(getattr(self.ctx.trainer, "batch_size", 1)))
        update.scalars |= {"kept_heads": len(kept), **ops}
        return update

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        return self._wire_form(start, plan.own["kept"])

    def _wire_form(self, params: Params, kept: list[int]) -> Params:
        """Only the kept heads' slices of the head-assignable tensors (a pruned step trained them in that form)."""
        if self.settings.mode == "pruned":
            return params
        idx = kept_slices(self.slices, set(kept))
        return {k: _take(v, self.slices[k], idx[k]).contiguous() if k in self.slices else v for k, v in params.items()}

    # ---------------------------------------------------------------- server

    def wire_shapes(self, update: Shapes) -> dict[str, tuple[int | None, ...]]:
        """Head-assignable tensors travel with a variable size along their slice dimension."""
        out: dict[str, tuple[int | None, ...]] = dict(update)
        for name, spec in self.slices.items():
            if name in out:
                out[name] = tuple(None if d == spec[0][1] else n for d, n in enumerate(out[name]))
        return out

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]:
        return {HEADS: (self.keep,), ALPHA: (self.keep,)}, ()

    def after_aggregate(self, glob, updates, state, round):
        """Keep this round's per-head mean importance (pruned = 0) and keep counts over the clients (report)."""
        scalars = {k: v for k, v in state.scalars.items() if k not in ("head_importance", "head_kept")}
        if updates:
            alphas = torch.stack([u.aux_tensors[ALPHA].double() for u in updates])
            kept = torch.zeros(self.num_heads, dtype=torch.float64)
            for u in updates:
                kept[u.aux_tensors[HEADS].long()] += 1
            scalars |= {"head_importance": [float(x) for x in alphas.mean(0)],
                        "head_kept": [float(x) for x in kept]}
        return Message(dict(state.tensors), scalars), None

    def vectors(self, state: Message) -> dict[str, list[float]]:
        return {k: list(state.scalars[k]) for k in ("head_importance", "head_kept") if k in state.scalars}

    def record(self, reply: Message) -> dict[str, Any]:
        """The ids of the heads the client kept (layer-major: head h of layer l is l·H + h), so that each round's
        selection can be audited from the run records."""
        return {"kept_head_ids": [int(h) for h in reply.tensors[HEADS].tolist()]}

    def check(self, reply: Message, client: int, state: Message) -> None:
        """The kept slices' sizes must be what the kept head ids imply (else the reply is rejected)."""
        heads = reply.tensors[HEADS].tolist()
        if len(set(heads)) != len(heads) or any(not 0 <= h < self.num_heads for h in heads):
            raise ValueError(f"'{HEADS}' must be distinct head ids in [0, {self.num_heads})")
        if not bool((reply.tensors[ALPHA] >= 0).all()):
            raise ValueError(f"'{ALPHA}' must be non-negative")
        idx = kept_slices(self.slices, set(heads))
        for name, spec in self.slices.items():
            if name in reply.tensors:
                want = sum(spec[i][3] - spec[i][2] for i in idx[name])
                got = reply.tensors[name].shape[spec[0][1]]
                if got != want:
                    raise ValueError(f"'{name}' carries {got} rows for the kept heads, expected {want}")

    def expand(self, update: Update, shared: Params) -> Update:
        """Full-size tensors (pruned slices = the global values: zero delta) and alpha over all N heads."""
        kept = update.aux_tensors[HEADS].long().tolist()
        idx = kept_slices(self.slices, set(kept))
        tensors = dict(update.tensors)
        for name, spec in self.slices.items():
            if name not in tensors:
                continue
            full = shared[name].clone().float()
            off, dim = 0, spec[0][1]
            for i in idx[name]:
                _, _, a, b = spec[i]
                full.narrow(dim, a, b - a).copy_(tensors[name].narrow(dim, off, b - a))
                off += b - a
            tensors[name] = full
        alpha = torch.zeros(self.num_heads, dtype=torch.float32)
        alpha[torch.tensor(kept, dtype=torch.long)] = update.aux_tensors[ALPHA].float()
        update = update.with_tensors(tensors)
        update.aux_tensors = dict(update.aux_tensors) | {ALPHA: alpha}
        return update
