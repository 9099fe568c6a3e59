"""Soft prompt (Lester et al. 2021; FedPrompt §2.1): m trainable vectors spliced into the input embeddings.

``prompt`` may carry a leading population axis ``[P, m, d]``: the batch of n rows is then tiled P times
(candidate-major, rows [c*n:(c+1)*n] belong to candidate c) so that P candidate prompts run in ONE forward
(the forward-only searches: token search, post-tuning by CMA-ES).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, Params, Prepared, insert_rows
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")


class SoftPromptSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: int = Field(20, ge=1, description="soft prompt length m")
    init: Literal["vocab", "words", "normal"] = Field("vocab", description="initial rows: embeddings of seeded "
                                                      "vocabulary tokens, of init_words, or N(0, std of the table)")
    init_words: list[str] | None = Field(None, description="init 'words': the words whose embeddings start the "
                                                           "prompt (repeated to num_tokens)")
    position: Literal["after_first", "before_all"] = Field(
        "after_first", description="after the first special token ([CLS] / <s>), or before everything")


def word_ids(backbone: Backbone, words: list[str] | None, m: int) -> torch.Tensor:
    """The token ids of ``words``, repeated to length m (prompt initialisation from given words)."""
    if not words:
        raise ValueError("method.adapter.init_words: required when init is 'words'")
    tok = backbone.tokenizer
    ids = [i for w in words for i in tok(w, add_special_tokens=False)["input_ids"]]
    return torch.tensor((ids * (m // max(len(ids), 1) + 1))[:m])


@ADAPTERS.register("soft_prompt", "m trainable virtual-token embeddings in front of the input (FedPrompt)",
                   SoftPromptSettings)
class SoftPrompt(AdapterBase):
    """Trainable ``prompt`` of shape [m, hidden]; only it is trained and exchanged."""
    checkpointable = True

    name = "soft_prompt"

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """Rows copied from vocabulary embeddings (seeded sample or given words), or N(0, σ_emb²)."""
        table = backbone.input_embeddings().weight.detach()
        m = self.cfg.num_tokens
        if self.cfg.init == "words":
            rows = table[word_ids(backbone, self.cfg.init_words, m)]
        elif self.cfg.init == "vocab":
            special = set(backbone.tokenizer.all_special_ids)
            lo = 1000 if table.shape[0] > 5000 else 0  # skip reserved/unused ids at the head of BERT vocabs
            ids = torch.randint(lo, table.shape[0], (4 * m,), generator=generator)
            ids = torch.tensor([i for i in ids.tolist() if i not in special][:m])
            rows = table[ids]
        else:
            rows = torch.randn(m, table.shape[1], generator=generator) * table.std()
        return {"prompt": rows.clone().float()}

    def to_peft(self, backbone: Backbone, params: Params, task_type: str):
        """PEFT prompt tuning (``prompt_embeddings`` [m, d]), which prepends the prompt: ``position: before_all``
        only (fedpeft's default places it after [CLS]/BOS, which PEFT cannot express)."""
        from peft import PromptTuningConfig

        if self.cfg.position != "before_all":
            raise ValueError("method.adapter.position: PEFT prompt tuning prepends the prompt; only a soft prompt "
                             "with position 'before_all' exports")
        prompt, config = params["prompt"], backbone.model.config
        peft_config = PromptTuningConfig(task_type=task_type, num_virtual_tokens=prompt.shape[0],
                                         token_dim=prompt.shape[1], num_transformer_submodules=1,
                                         num_attention_heads=config.num_attention_heads,
                                         num_layers=config.num_hidden_layers)
        return peft_config, {"prompt_embeddings": prompt}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        embeds = backbone.input_embeddings()(input_ids)
        prompt = params["prompt"]
        at = lead if self.cfg.position == "after_first" else 0
        n = embeds.shape[0]
        if prompt.dim() == 3:  # a population of candidate prompts, candidate-major tiling
            embeds, attention_mask = embeds.repeat(prompt.shape[0], 1, 1), attention_mask.repeat(prompt.shape[0], 1)
            rows = prompt.repeat_interleave(n, dim=0)
        else:
            rows = prompt.unsqueeze(0).expand(n, -1, -1)
        embeds, attention_mask = insert_rows(embeds, attention_mask, rows, at)
        return Prepared(embeds, attention_mask, at, prompt.shape[-2])
