"""Batched greedy completions for the generative suites: prompts encoded as ``tokenizer(text)`` encodes them (or as
the run formats its instructions), decoded by ``model.decoding.greedy`` with left padding, longest prompts of a
token budget batched together (less padding; the tokens do not depend on the batch: tested), and cut at the
suite's stop strings, as lm-eval's ``until`` cuts a greedy continuation (greedy decoding never looks past them, so
cutting afterwards writes the same text)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeft.backbones.encoding import Encoded, special_tokens


def encode_texts(tokenizer: Any, texts: list[str]) -> Encoded:
    """Token ids as ``tokenizer.encode(text)`` gives them; ``lead`` counts the special tokens it puts first (where
    a prompt adapter inserts its rows, as in training)."""
    ids = [tokenizer(t)["input_ids"] for t in texts]
    lead_ids = special_tokens(tokenizer, "causal")[0]
    lead = len(lead_ids) if ids and all(r[:len(lead_ids)] == lead_ids for r in ids) else 0
    n = len(ids)
    return Encoded(ids, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), lead,
                   np.array([len(r) for r in ids], dtype=np.int64))


CALL = 8  # batches per decoding call


def cut_at(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the first of ``stops`` (lm-eval's ``until``)."""
    for stop in stops:
        if stop and stop in text:
            text = text.split(stop)[0]
    return text


def generate(objective: Any, params: dict[str, Any], enc: Encoded, max_new: list[int], batch_size: int,
             stops: tuple[str, ...] = (), progress: bool = False, label: str = "decoding") -> list[str]:
    """Greedy completions of the encoded prompts (each with its own token budget), decoded with
    ``skip_special_tokens`` and cut at ``stops``. Prompts of one budget go longest first, ``CALL`` batches to a
    decoding call (LoRA's update is merged into the weights once per call: once per batch would cost a merge of
    every adapted matrix for every 16 prompts), one step of the progress bar each."""
    from rich.progress import track

    tok = objective.backbone.tokenizer
    groups: dict[int, list[int]] = {}
    for i in sorted(range(len(enc)), key=lambda i: -len(enc.input_ids[i])):
        groups.setdefault(max_new[i], []).append(i)
    calls = [(budget, idx[s:s + CALL * batch_size]) for budget, idx in sorted(groups.items())
             for s in range(0, len(idx), CALL * batch_size)]
    out: list[str] = [""] * len(enc)
    for budget, idx in track(calls, description=label, disable=not progress, transient=True):
        ids = objective.generate(params, enc.subset(idx), budget, batch_size=batch_size)
        for i, t in zip(idx, ids):
            out[i] = cut_at(tok.decode(t, skip_special_tokens=True), stops)
    return out
