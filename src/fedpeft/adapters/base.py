"""The adapter contract: initial trainable tensors, and how they enter the frozen forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedpeft.backbones.loading import Backbone
from fedpeft.registry import Registry

Params = dict[str, torch.Tensor]


@dataclass
class Prepared:
    """Model inputs after the adapter: embeddings, mask, where (and how many) positions were inserted,
    and extra keyword arguments for the backbone call (e.g. ``past_key_values`` for deep prompts)."""

    embeds: torch.Tensor
    attention_mask: torch.Tensor
    insert_at: int = 0
    inserted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    """Trainable tensors around a frozen backbone.

    ``init`` returns the initial tensors (plain data, exchanged by name). ``prepare`` turns a token
    batch into backbone inputs using them; ``overrides`` returns backbone weights to use instead of
    the frozen ones (full fine-tuning) through ``torch.func.functional_call``, or None.
    """

    name: str

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params: ...

    def prepare(self, backbone: Backbone, params: Params, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, lead: int) -> Prepared: ...

    def overrides(self, params: Params) -> Params | None: ...


ADAPTERS: Registry[type] = Registry("adapter")  # class taking its settings object (or None)
