"""Preference pairs as token ids: one prompt, then the chosen or the rejected response (DPO's two sequences).

Both sequences share the prompt's ids exactly: the prompt is laid out as a generation prompt
(``instruction_encoding``: the chat template with the dialogue's history, fields cut longest first) in the room the
longer of the two responses leaves in ``task.max_length``; each response is its text and the end token, cut at
``task.max_response_length``. As TRL's ``DataCollatorForPreference``, a batch holds the chosen sequences, then the
rejected ones, and only response positions are scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.instruction_encoding import (Cuts, PromptFormat, count_cut, end_token_id, log_cuts,
                                                    prompt_ids, response_ids)
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example

@dataclass
class PairEncoded(Encoded):
    """``input_ids``: prompt + chosen response per pair; ``rejected_ids``: prompt + rejected response; both
    responses start at ``response_start`` (the prompt's length). ``len`` counts pairs."""

    rejected_ids: list[list[int]] = field(default_factory=list)

    def subset(self, idx: np.ndarray | list[int]) -> PairEncoded:
        idx = list(map(int, idx))
        base = super().subset(idx)
        return PairEncoded(base.input_ids, base.labels, base.mask_index, base.lead, base.response_start,
                           base.prompt_cut, None, [self.rejected_ids[i] for i in idx])

    def sequences(self) -> Encoded:
        """Every pair's two sequences as one ``Encoded`` of 2n rows: the chosen ones [0, n), the rejected [n, 2n)."""
        n = len(self)
        starts = np.concatenate([self.response_start, self.response_start])
        return Encoded(self.input_ids + self.rejected_ids, np.zeros(2 * n, dtype=np.int64),
                       np.full(2 * n, -1, dtype=np.int64), self.lead, starts)


def encode_pairs(backbone: Backbone, fmt: PromptFormat, examples: list[Example], max_length: int,
                 max_response_length: int, truncation: str = "keep_start") -> PairEncoded:
    """The pairs' ids (``PairEncoded``); cuts counted (``Encoded.cuts``: a pair whose responses lost tokens counts
    once); a dialogue too long for its template loses its oldest exchanges first (``prompt_ids``)."""
    tok = backbone.tokenizer
    end = end_token_id(tok)
    cuts = Cuts(examples=len(examples))
    chosen, rejected, starts, prompt_cut = [], [], [], []
    lit_cache: dict[str, list[int]] = {}
    for ex in examples:
        each = Cuts()
        good = response_ids(tok, ex.target, end, max_response_length, each)
        bad = response_ids(tok, ex.rejected, end, max_response_length, each)
        cuts.responses += bool(each.responses)  # a pair counts once
        prompt, cut = prompt_ids(tok, fmt, ex, max_length, max(len(good), len(bad)), max_response_length, lit_cache,
                                 truncation)
        count_cut(cuts, cut)
        prompt_cut.append(bool(cut))
        chosen.append(prompt + good)
        rejected.append(prompt + bad)
        starts.append(len(prompt))
    log_cuts(cuts, "preference pairs", max_length, max_response_length, truncation)
    n = len(examples)
    return PairEncoded(chosen, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), len(fmt.lead),
                       np.array(starts, dtype=np.int64), np.array(prompt_cut, dtype=bool), cuts, rejected)
