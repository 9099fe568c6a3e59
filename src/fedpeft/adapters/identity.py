"""Gradient-free baselines without trainable tensors (FedBPT spec §5, items 4-5).

- ``template_only``: the task template alone (manual prompt, zero-shot).
- ``demonstrations``: up to k labelled training examples, written with the same template and the
  label word filled in, are spliced in after the first special token (in-context learning,
  Brown et al. 2020; LM-BFF-style demonstrations). The demonstration token ids travel as an int64
  tensor ``demo_ids`` so they are plain data like any other adapter state.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, AdapterContext, Params, Prepared, insert_rows
from fedpeft.backbones.encoding import template_for
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.lazy import lazy
from fedpeft.rng import SERVER, numpy_rng

torch = lazy("torch")


@ADAPTERS.register("template_only", "no trainable tensors: the task template alone (manual prompt)")
class TemplateOnly(AdapterBase):
    name = "template_only"
    differentiable = False

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        return {}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        return Prepared(backbone.input_embeddings()(input_ids), attention_mask, lead, 0)


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


class DemonstrationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_demos: int = Field(5, ge=0, le=32, description="demonstrations (FedBPT's ICL baseline: up to 5)")
    max_words: int = Field(40, ge=1, description="words kept of each demonstration text")


@ADAPTERS.register("demonstrations", "in-context demonstrations spliced after the first special token (ICL)",
                   DemonstrationSettings)
class Demonstrations(AdapterBase):
    """``demo_ids``: k random training examples of the task's pool, drawn from the run seed at ``init``."""

    name = "demonstrations"
    differentiable = False  # token ids

    def __init__(self, cfg: DemonstrationSettings | None = None) -> None:
        super().__init__(cfg or DemonstrationSettings())
        self.ctx: AdapterContext | None = None

    def bind(self, ctx: AdapterContext) -> None:
        self.ctx = ctx

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        if self.ctx is None:
            return {"demo_ids": torch.zeros(0, dtype=torch.long)}
        pool = self.ctx.task.train
        rng = numpy_rng(self.ctx.seed, 0, SERVER, "icl-demos")
        k = min(self.cfg.num_demos, len(pool))
        demos = [pool[int(i)] for i in rng.choice(len(pool), size=k, replace=False)]
        return {"demo_ids": demonstration_ids(backbone, self.ctx.task, self.ctx.readout, demos, self.cfg.max_words)}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        embeds = backbone.input_embeddings()(input_ids)
        demo = params["demo_ids"].long().to(input_ids.device)
        if demo.numel() == 0:
            return Prepared(embeds, attention_mask, lead, 0)
        rows = backbone.input_embeddings()(demo).unsqueeze(0).expand(embeds.shape[0], -1, -1)
        embeds, attention_mask = insert_rows(embeds, attention_mask, rows, lead)
        return Prepared(embeds, attention_mask, lead, demo.numel())
