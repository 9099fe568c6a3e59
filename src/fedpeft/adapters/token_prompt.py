"""Discrete token prompt (personalized gradient-free prompt tuning, Eq. 1): T prompt rows right after the first
special token (``<s> P_1..P_T X ...``), each a vocabulary embedding e(v) after local token search.

The rows are exchanged as embeddings in the global state (after the server's compressed download they are
mixtures of token embeddings, Eq. 11); the local search moves each row back onto a token. Initialised from
T distinct natural (non-special) tokens drawn with the run seed, or from given words.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, Params
from fedpeft.adapters.soft_prompt import SoftPrompt, word_ids
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")


class TokenPromptSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: int = Field(50, ge=1, description="prompt length T (paper: 50)")
    init: Literal["vocab", "words"] = Field("vocab", description="T distinct seeded natural tokens, or init_words")
    init_words: list[str] | None = Field(None, description="words whose tokens start the prompt (repeated to T)")
    position: Literal["after_first", "before_all"] = Field("after_first", description="after <s>/[CLS] (paper) "
                                                                                       "or before everything")


def candidate_ids(backbone: Backbone) -> torch.Tensor:
    """The vocabulary a token prompt may use: every embedding row except the special tokens (spec §7.3)."""
    special = set(backbone.tokenizer.all_special_ids)
    rows = backbone.input_embeddings().weight.shape[0]
    return torch.tensor([i for i in range(rows) if i not in special])


@ADAPTERS.register("token_prompt", "T prompt rows that are vocabulary embeddings, found by forward-only token "
                   "search (personalized gradient-free prompt tuning)", TokenPromptSettings)
class TokenPrompt(SoftPrompt):
    """``prompt`` [T, d] spliced in like a soft prompt; ``init`` picks distinct natural tokens."""

    name = "token_prompt"

    def __init__(self, cfg: TokenPromptSettings | None = None) -> None:
        super().__init__(cfg or TokenPromptSettings())

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        table = backbone.input_embeddings().weight.detach()
        t = self.cfg.num_tokens
        if self.cfg.init == "words":
            ids = word_ids(backbone, self.cfg.init_words, t)
        else:
            allowed = candidate_ids(backbone)
            if len(allowed) < t:
                raise ValueError(f"method.adapter.num_tokens: {t} distinct tokens exceed the vocabulary")
            ids = allowed[torch.randperm(len(allowed), generator=generator)[:t]]
        return {"prompt": table[ids.to(table.device)].detach().float().cpu().clone()}
