"""The adapter contract: initial trainable tensors, and how they enter the frozen forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedpeft.backbones.loading import Backbone
from fedpeft.registry import Registry

Params = dict[str, torch.Tensor]
# tensor name -> [(query heads it feeds (global ids layer·H + h), dim, start, end)]: the head-assignable slices
HeadSlices = dict[str, list[tuple[tuple[int, ...], int, int, int]]]


@dataclass
class Prepared:
    """Model inputs after the adapter: embeddings, mask, where (and how many) positions were inserted,
    and extra keyword arguments for the backbone call (e.g. ``past_key_values`` for deep prompts)."""

    embeds: torch.Tensor
    attention_mask: torch.Tensor
    insert_at: int = 0
    inserted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AdapterContext:
    """What every process knows without communication: the run seed, the task, the resolved readout and the
    shared backbone (an adapter that changes its structure, like LoRA, does so here, once)."""

    seed: int
    task: Any
    readout: str
    backbone: Backbone | None = None


class Adapter(Protocol):
    """Trainable tensors around a frozen backbone.

    ``bind`` receives the run's shared context once (a projection seed, a demonstration pool); ``init``
    returns the initial tensors (plain data, exchanged by name); ``units`` groups tensor names into the
    units a method may share or prune separately (layers, heads); ``prepare`` turns a token batch into
    backbone inputs using them; ``overrides`` returns backbone weights to use instead of the frozen ones
    (full fine-tuning) through ``torch.func.functional_call``, or None.
    """

    name: str

    def bind(self, ctx: AdapterContext) -> None: ...

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params: ...

    def units(self, params: Params) -> dict[str, str]: ...

    def prepare(self, backbone: Backbone, params: Params, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, lead: int) -> Prepared: ...

    def overrides(self, params: Params) -> Params | None: ...


class AdapterBase:
    """Defaults: nothing to bind, every tensor its own unit, no backbone weight overridden."""

    name = ""

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    def bind(self, ctx: AdapterContext) -> None:
        pass

    def units(self, params: Params) -> dict[str, str]:
        return {k: k for k in params}

    def head_slices(self, backbone: Backbone) -> HeadSlices:
        """Slices of the tensors that feed one attention head (empty: nothing is head-assignable)."""
        return {}

    def overrides(self, params: Params) -> Params | None:
        return None


def insert_rows(embeds: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Splice ``rows`` ([n, m, d]) into every sequence at position ``at``; the mask gets m ones there."""
    ones = torch.ones(rows.shape[0], rows.shape[1], dtype=attention_mask.dtype, device=attention_mask.device)
    embeds = torch.cat([embeds[:, :at], rows.to(embeds.device, embeds.dtype), embeds[:, at:]], dim=1)
    return embeds, torch.cat([attention_mask[:, :at], ones, attention_mask[:, at:]], dim=1)


ADAPTERS: Registry[type] = Registry("adapter")  # class taking its settings object (or None)
