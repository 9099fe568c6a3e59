"""The adapter contract: initial trainable tensors, and how they enter the frozen forward pass."""

from __future__ import annotations

from typing import Protocol

import torch

from fedpeft.backbones.loading import Backbone
from fedpeft.registry import Registry

Params = dict[str, torch.Tensor]


class Adapter(Protocol):
    """Trainable tensors around a frozen backbone.

    ``init`` returns the initial tensors (plain data, exchanged by name). ``embed`` maps token ids
    to input embeddings, ``extend`` splices extra positions (e.g. soft prompt rows) into the
    embedded sequence, and ``overrides`` returns backbone weights to use instead of the frozen ones
    (full fine-tuning) for ``torch.func.functional_call``.
    """

    name: str

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params: ...

    def embed(self, backbone: Backbone, params: Params, input_ids: torch.Tensor) -> torch.Tensor: ...

    def extend(
        self, params: Params, embeds: torch.Tensor, attention_mask: torch.Tensor, lead: int
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Returns (embeds, attention_mask, insert position, number of inserted positions)."""
        ...

    def overrides(self, params: Params) -> Params | None: ...


ADAPTERS: Registry[type] = Registry("adapter")
