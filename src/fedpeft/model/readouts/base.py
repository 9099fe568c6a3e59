"""The readout contract: how a classifier turns the adapted model's outputs into class logits.

A readout is built once per classifier (``setup``: label token ids, label-description anchors), may add trainable
tensors that travel with the adapter (``init``: a linear head), says whether it reads the last layer's hidden
states of a decoder (``reads_hidden_states``) and computes the logits of a forward's rows (``logits``). Pooled
readouts (similarity, linear) average the hidden states over ``pooling_mask``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedpeft.adapters.base import Params, Prepared, text_mask
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")

READOUTS: Registry[type] = Registry("readout")  # classes built with no arguments; ``setup(classifier)`` binds them


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def pooling_mask(prep: Prepared, pooling: str) -> torch.Tensor:
    """Rows to mean-pool: every attended row (``all``) or the text rows only (``text``: adapter rows out)."""
    if pooling == "text":
        return text_mask(prep.attention_mask, prep.insert_at, prep.inserted)
    return prep.attention_mask


def last_hidden(out: Any, family: str) -> torch.Tensor:
    """The last layer's hidden states: an encoder's ``last_hidden_state``, a decoder's ``hidden_states[-1]``."""
    return out.last_hidden_state if family == "encoder" else out.hidden_states[-1]


class Readout:
    """Defaults: nothing to set up, no trainable tensors, pooled over the hidden states."""

    name: ClassVar[str] = ""
    pooled: ClassVar[bool] = True

    def setup(self, clf: Any) -> None:
        pass

    def init(self, clf: Any, generator: torch.Generator) -> Params:
        return {}

    def reads_hidden_states(self, family: str) -> bool:
        """A decoder's pooled readouts read the last layer's hidden states (HF returns no last_hidden_state)."""
        return self.pooled and family != "encoder"

    def pooled_states(self, clf: Any, out: Any, prep: Prepared) -> torch.Tensor:
        if clf.pooling == "pooler":
            pooled = getattr(out, "pooler_output", None)
            if pooled is None:
                raise ValueError(f"model.pooling: 'pooler' reads the encoder's pooler output; {clf.backbone.name} "
                                 "gives none (use all or text)")
            return pooled
        return mean_pool(last_hidden(out, clf.backbone.family), pooling_mask(prep, clf.pooling))

    def logits(self, clf: Any, out: Any, prep: Prepared, batch: dict[str, torch.Tensor],
               params: Params) -> torch.Tensor:
        raise NotImplementedError
