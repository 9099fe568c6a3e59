"""What an exchange stage declares before anything loads (its capability record), and whether a chain of stages is
one that can run: the compatibility checker decides ``method.exchange`` from these records alone.

A stage decides one or more *aspects* of the round's exchange:

- ``which``: which tensors are exchanged and which stay on the clients (FedSA-LoRA's private B, FFA-LoRA's frozen
  A, local-only, FedPepTAO's layers, a private task head);
- ``shape``: the shape a tensor travels in and how the server expands it (a client's LoRA rank, the kept heads'
  slices, FLoRA's fresh block);
- ``fold``: what the server folds into the global model after aggregation (FedEx-LoRA's residual).

Two stages of one chain may not decide the same aspect (two ``which`` stages would each withhold tensors the other
expects to exchange; two ``shape`` stages would cut a tensor the other already cut): that is the one rule of
composition beside the records' own (adapters both serve, aggregators both accept, summable only if both are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedpeft.sharing.base import FOLD, SHAPE, WHICH

ASPECTS = {WHICH: "which tensors are exchanged", SHAPE: "the shape a tensor travels in",
           FOLD: "what the server folds into the global model"}


@dataclass(frozen=True)
class Capabilities:
    """One stage's record, or a chain's (``combine``)."""

    names: tuple[str, ...]
    adapters: frozenset[str] | None      # adapters whose tensors it understands (None: any)
    aggregators: frozenset[str] | None   # aggregators that can combine its replies (None: any)
    provides: frozenset[str]             # auxiliary values its clients upload
    decides: frozenset[str]              # aspects of the exchange it decides (WHICH, SHAPE)
    per_client: bool                     # clients receive different tensors
    ranked: bool                         # trains each client at its tier's LoRA rank
    summable: bool                       # replies can be summed across clients (with these settings)
    deltas: bool                         # replies are trained global tensors (w_k − w is an update)
    same_tensors: bool                   # the same tensors are trained every round (optimizer moments carry over)
    side_by_side: bool                   # client steps may run in threads beside others
    uploads_pairs: bool                  # the server sees both LoRA factors of every client (or the common one)
    needs_pairs: bool = False            # needs them from every client (FedEx-LoRA's residual)

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else "[" + ", ".join(self.names) + "]"


def of_stage(name: str, cls: type, settings: Any) -> Capabilities:
    """The record a registered stage class declares, with these settings."""
    return Capabilities((name,), cls.adapters, cls.aggregators, frozenset(cls.provides), frozenset(cls.decides),
                        bool(cls.per_client), bool(cls.ranked), bool(cls.summable_with(settings)), bool(cls.deltas),
                        bool(cls.same_tensors(settings)), bool(cls.side_by_side(settings)), bool(cls.uploads_pairs),
                        bool(cls.needs_pairs))


def _meet(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return b if a is None else a if b is None else a & b


def conflict(records: Sequence[Capabilities]) -> str | None:
    """Why these stages cannot form one chain (None when they can), naming the pair."""
    for i, first in enumerate(records):
        for second in records[i + 1:]:
            if first.names == second.names:
                return f"'{first.label}' appears twice"
            both = first.decides & second.decides
            if both:
                aspect = ASPECTS[sorted(both)[0]]
                return (f"'{first.label}' and '{second.label}' both decide {aspect}; a chain takes one stage per "
                        f"aspect ({', '.join(f'{k}: {v}' for k, v in ASPECTS.items())})")
            for needs, keeps in ((first, second), (second, first)):
                if needs.needs_pairs and not keeps.uploads_pairs:
                    return (f"'{needs.label}' needs both LoRA factors of every client; '{keeps.label}' keeps one on "
                            "the clients")
            if first.adapters is not None and second.adapters is not None and not first.adapters & second.adapters:
                return (f"'{first.label}' serves {' or '.join(sorted(first.adapters))}, '{second.label}' "
                        f"{' or '.join(sorted(second.adapters))}: no adapter both serve")
    return None


def combine(records: Sequence[Capabilities]) -> Capabilities:
    """The record of the chain: what every stage allows, what any stage provides."""
    out = records[0]
    for r in records[1:]:
        out = Capabilities(out.names + r.names, _meet(out.adapters, r.adapters), _meet(out.aggregators, r.aggregators),
                           out.provides | r.provides, out.decides | r.decides, out.per_client or r.per_client,
                           out.ranked or r.ranked, out.summable and r.summable, out.deltas and r.deltas,
                           out.same_tensors and r.same_tensors, out.side_by_side and r.side_by_side,
                           out.uploads_pairs and r.uploads_pairs, out.needs_pairs or r.needs_pairs)
    return out
