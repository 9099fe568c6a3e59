"""Verbalizer readout: the logits of each class's label word at the mask (masked LMs) or as the next token (causal
LMs); softmax over the label words only (OpenPrompt One2oneVerbalizer).

The transformer body runs alone and the LM head is applied to the one read row per input, not to every position
(the same numbers up to float rounding; SmolLM2's full-vocabulary logits at every position were ~21 % of its FLOPs).
"""

from __future__ import annotations

from typing import Any

from fedpeft.adapters.base import Params, Prepared
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy
from fedpeft.model.readouts.base import READOUTS, Readout

torch = lazy("torch")


def label_token_ids(backbone: Backbone, words: list[str], spacing: str = "space") -> list[int]:
    """First sub-token of each label word; with a leading space where the tokenizer is space-sensitive, unless
    ``spacing`` is ``as_written`` (``task.label_word_spacing``: a word after a newline, as DeComFL's RTE prompt)."""
    tok = backbone.tokenizer
    spaced = spacing == "space" and (tok(" a", add_special_tokens=False)["input_ids"]
                                     != tok("a", add_special_tokens=False)["input_ids"])
    ids = [tok((" " + w) if spaced else w, add_special_tokens=False)["input_ids"][0] for w in words]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task.label_words: label words {words} share a first token for {backbone.name}; "
                         "set task.label_words to words whose first tokens differ (one per class)")
    return ids


@READOUTS.register("verbalizer", "each class's label word at the mask (masked LMs) or as the next token (causal "
                                 "LMs), softmax over the label words")
class Verbalizer(Readout):
    name = "verbalizer"
    pooled = False

    def setup(self, clf: Any) -> None:
        self.label_ids = torch.tensor(label_token_ids(clf.backbone, clf.task.label_words,
                                                       clf.task.label_word_spacing), device=clf.device)

    def logits(self, clf, out, prep: Prepared, batch: dict[str, torch.Tensor], params: Params) -> torch.Tensor:
        split = clf.backbone.body_and_head
        states = out.logits if split is None else out.last_hidden_state
        if clf.backbone.family == "mlm":
            mask_index = batch["mask_index"].repeat(states.shape[0] // batch["mask_index"].shape[0])
            pos = mask_index + torch.where(mask_index >= prep.insert_at, prep.inserted, 0)
        else:
            pos = prep.attention_mask.sum(1) - 1  # right padding: last attended position
        rows = states[torch.arange(states.shape[0], device=pos.device), pos]
        if split is not None:
            rows = clf._head_rows(rows, params)
        return rows[:, self.label_ids]
