"""Gradient-free baselines without trainable tensors (FedBPT spec §5, items 4-5).

- ``template_only``: the task template alone (manual prompt, zero-shot).
- ``demonstrations``: up to k labelled training examples, written with the same template and the
  label word filled in, are spliced in after the first special token (in-context learning,
  Brown et al. 2020; LM-BFF-style demonstrations). The demonstration token ids travel as an int64
  tensor ``demo_ids`` so they are plain data like any other adapter state.
"""

from __future__ import annotations

import torch

from fedpeft.adapters.base import ADAPTERS, Params, Prepared
from fedpeft.backbones.encoding import template_for
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData


@ADAPTERS.register("template_only", "no trainable tensors: the task template alone (manual prompt)")
class TemplateOnly:
    name = "template_only"

    def __init__(self, cfg: None = None) -> None:
        pass

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        return {}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        return Prepared(backbone.input_embeddings()(input_ids), attention_mask, lead, 0)

    def overrides(self, params: Params) -> Params | None:
        return None


def demonstration_text(task: TaskData, family: str, readout: str, ex: Example, max_words: int = 40) -> str:
    """One filled-in demonstration: the template with the text (cut to ``max_words``) and the label word."""
    cut = lambda s: " ".join((s or "").split()[:max_words])
    word = task.label_words[ex.label]
    text = template_for(task, family, readout).replace("{text_a}", cut(ex.text_a)).replace("{text_b}", cut(ex.text_b))
    if "{mask}" in text:
        return text.replace("{mask}", word)
    return f"{text} {word}"


def demonstration_ids(backbone: Backbone, task: TaskData, readout: str, examples: list[Example],
                      max_words: int = 40) -> torch.Tensor:
    """Token ids of the demonstrations joined by blank lines (no special tokens), ending with a separator."""
    texts = [demonstration_text(task, backbone.family, readout, ex, max_words) for ex in examples]
    joined = "\n\n".join(texts) + "\n\n"
    return torch.tensor(backbone.tokenizer(joined, add_special_tokens=False)["input_ids"], dtype=torch.long)


@ADAPTERS.register("demonstrations", "in-context demonstrations spliced after the first special token (ICL)")
class Demonstrations:
    name = "demonstrations"

    def __init__(self, cfg: None = None) -> None:
        pass

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        return {"demo_ids": torch.zeros(0, dtype=torch.long)}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        embeds = backbone.input_embeddings()(input_ids)
        demo = params["demo_ids"].long()
        if demo.numel() == 0:
            return Prepared(embeds, attention_mask, lead, 0)
        n = embeds.shape[0]
        rows = backbone.input_embeddings()(demo).unsqueeze(0).expand(n, -1, -1)
        ones = torch.ones(n, demo.numel(), dtype=attention_mask.dtype)
        embeds = torch.cat([embeds[:, :lead], rows, embeds[:, lead:]], dim=1)
        attention_mask = torch.cat([attention_mask[:, :lead], ones, attention_mask[:, lead:]], dim=1)
        return Prepared(embeds, attention_mask, lead, demo.numel())

    def overrides(self, params: Params) -> Params | None:
        return None
