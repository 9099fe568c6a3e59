"""Turn task examples into token ids once per client: template filling, truncation, special tokens.

Templates are split into segments (literal text, ``{text_a}``, ``{text_b}``, ``{mask}``) that are
tokenized separately, so the input text is truncated and never the template or the mask
(FedPrompt spec §7 #25). Prompts are inserted later, at ``lead`` (after [CLS]/<s>/BOS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.lazy import lazy

torch = lazy("torch")

_FIELD = re.compile(r"\{(text_a|text_b|mask)\}")


@dataclass
class Encoded:
    """Token ids of a dataset split for one backbone; ``mask_index`` is -1 when unused; ``response_start`` (generation
    tasks) is each row's first response position (its length for prompts alone), None for classification;
    ``prompt_cut`` (generation) whether each row's prompt lost tokens to ``task.max_length``, and ``cuts`` the
    encoding's counts (``instruction_encoding.Cuts``)."""

    input_ids: list[list[int]]
    labels: np.ndarray
    mask_index: np.ndarray
    lead: int
    response_start: np.ndarray | None = None
    prompt_cut: np.ndarray | None = None
    cuts: Any = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def subset(self, idx: np.ndarray | list[int]) -> Encoded:
        idx = list(map(int, idx))
        starts = None if self.response_start is None else self.response_start[idx]
        cut = None if self.prompt_cut is None else self.prompt_cut[idx]
        return Encoded([self.input_ids[i] for i in idx], self.labels[idx], self.mask_index[idx], self.lead, starts,
                       cut)


def special_tokens(tokenizer, family: str) -> tuple[list[int], list[int]]:
    """Ids the tokenizer puts before and after a single text (e.g. [CLS] ... [SEP])."""
    full = tokenizer("hello", add_special_tokens=True)["input_ids"]
    core = tokenizer("hello", add_special_tokens=False)["input_ids"]
    for i in range(len(full) - len(core) + 1):
        if full[i : i + len(core)] == core:
            lead, trail = full[:i], full[i + len(core) :]
            break
    else:  # pragma: no cover - tokenizers that rewrite the text
        lead, trail = [], []
    if family == "causal":
        trail = []  # the label word is predicted right after the template
    return lead, trail


def template_for(task: TaskData, family: str, readout: str) -> str:
    if readout in ("similarity", "linear"):
        return "{text_a} {text_b}" if task.is_pair else "{text_a}"
    if family == "causal":
        return task.causal_template
    return task.template


def template_segments(template: str, fields: re.Pattern = _FIELD) -> list[tuple[str, str]]:
    """``template`` as ("lit", text) pieces and (field name, "") placeholders, in order."""
    out, pos = [], 0
    for m in fields.finditer(template):
        if m.start() > pos:
            out.append(("lit", template[pos : m.start()]))
        out.append((m.group(1), ""))
        pos = m.end()
    if pos < len(template):
        out.append(("lit", template[pos:]))
    return out


def _layout(backbone: Backbone, task: TaskData, max_length: int, readout: str):
    """(template segments, literal ids per segment, lead and trail ids, the token budget left for the texts)."""
    tok, family = backbone.tokenizer, backbone.family
    template = template_for(task, family, readout)
    segs = template_segments(template)
    if readout == "verbalizer" and family == "mlm" and not any(k == "mask" for k, _ in segs):
        raise ValueError(f"task '{task.name}': masked-LM template needs a {{mask}}: {template!r}")
    lead, trail = special_tokens(tok, family)
    lit_ids = {i: tok(s.rstrip() if i + 1 < len(segs) and segs[i + 1][0] == "mask" else s,
                      add_special_tokens=False)["input_ids"]
               for i, (k, s) in enumerate(segs) if k == "lit"}
    fixed = len(lead) + len(trail) + sum(len(v) for v in lit_ids.values()) + sum(k == "mask" for k, _ in segs)
    budget = max_length - fixed
    if budget < 1:
        raise ValueError(f"max_length {max_length} leaves no room for text in template {template!r}")
    return segs, lit_ids, lead, trail, budget


def text_budget(backbone: Backbone, task: TaskData, max_length: int, readout: str) -> int:
    """Tokens left for text_a + text_b once the template, label mask and special tokens are placed."""
    return _layout(backbone, task, max_length, readout)[-1]


def concat(a: Encoded, b: Encoded) -> Encoded:
    """The examples of ``a`` followed by those of ``b`` (same template and lead)."""
    starts = None if a.response_start is None else np.concatenate([a.response_start, b.response_start])
    return Encoded(list(a.input_ids) + list(b.input_ids), np.concatenate([a.labels, b.labels]),
                   np.concatenate([a.mask_index, b.mask_index]), a.lead, starts)


def encode_examples(
    backbone: Backbone, task: TaskData, examples: list[Example], max_length: int, readout: str
) -> Encoded:
    """Tokenize ``examples`` with the task's template for this backbone family and readout."""
    tok = backbone.tokenizer
    segs, lit_ids, lead, trail, budget = _layout(backbone, task, max_length, readout)
    ids_all, mask_all = [], []
    for ex in examples:
        texts = {"text_a": tok(ex.text_a, add_special_tokens=False, verbose=False)["input_ids"],
                 "text_b": tok(ex.text_b or "", add_special_tokens=False, verbose=False)["input_ids"]}
        _truncate(texts, budget, keep_end=task.truncation == "keep_end")
        ids, mask_at = list(lead), -1
        for i, (kind, _) in enumerate(segs):
            if kind == "lit":
                ids += lit_ids[i]
            elif kind == "mask":
                mask_at = len(ids)
                ids.append(tok.mask_token_id)
            else:
                ids += texts[kind]
        ids_all.append(ids + trail)
        mask_all.append(mask_at)
    labels = np.array([ex.label for ex in examples], dtype=np.int64)
    return Encoded(ids_all, labels, np.array(mask_all, dtype=np.int64), len(lead))


def _truncate(texts: dict[str, list[int]], budget: int, keep_end: bool = False) -> None:
    """Cut the longest text first until both fit (HF's 'longest_first' strategy), at its end, or at its start
    with ``keep_end`` (``task.truncation: keep_end``, a tokenizer's left truncation)."""
    while len(texts["text_a"]) + len(texts["text_b"]) > budget:
        key = "text_a" if len(texts["text_a"]) >= len(texts["text_b"]) else "text_b"
        texts[key].pop(0 if keep_end else -1)


def collate(enc: Encoded, idx: np.ndarray | list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch tensors for the given example indices."""
    rows = [enc.input_ids[int(i)] for i in idx]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = torch.tensor(r)
        att[j, : len(r)] = 1
    rows_idx = list(map(int, idx))
    out = {
        "input_ids": ids,
        "attention_mask": att,
        "mask_index": torch.as_tensor(enc.mask_index[rows_idx]),
        "labels": torch.as_tensor(enc.labels[rows_idx]),
    }
    if enc.response_start is not None:
        out["response_start"] = torch.as_tensor(enc.response_start[rows_idx])
    return out
