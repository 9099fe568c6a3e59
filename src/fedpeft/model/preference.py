"""The preference objective: a causal LM's log-likelihood of a chosen and a rejected response to one prompt.

What DPO-style trainers need (``trainers.dpo``): each sequence's log-probability, the sum over its response tokens
of log p(token | prompt, earlier tokens) (TRL's ``DPOTrainer``: completion tokens only, summed), under the policy
(the backbone with the adapter) and under the reference, which is the frozen backbone itself: the same shared
model with no adapter (``reference``: LoRA's tensors absent, a soft or deep prompt removed), so a client holds one
model, not two. A batch holds the chosen sequences then the rejected ones (``PairEncoded.sequences``).

``summarise`` averages the per-pair numbers a trainer computed (``trainers.dpo.pair_metrics``) over any rows, so
the metrics of the test set and of every client's shard and natural group come from one pass. Greedy generation
(``fedpeft generate``) is the language model's, on the prompt alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeft.adapters.base import Params
from fedpeft.adapters.identity import TemplateOnly
from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.preference_encoding import PairEncoded, encode_pairs
from fedpeft.data.types import Example
from fedpeft.lazy import lazy, no_grad
from fedpeft.model.language_model import LanguageModel, TokenScores

torch = lazy("torch")
F = lazy("torch.nn.functional")


@dataclass
class PairLogps:
    """Per pair of a batch: the summed response-token log-probabilities of the chosen and the rejected sequence
    [b], and their response-token counts [b]."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


def sequence_logps(scores: TokenScores) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-probability of its response tokens [rows] (float32, or float64 logits' dtype) and their
    count [rows]."""
    logits = scores.logits if scores.logits.dtype == torch.float64 else scores.logits.float()
    logp = torch.gather(F.log_softmax(logits, -1), 1, scores.targets.unsqueeze(1)).squeeze(1)
    total = torch.zeros(scores.rows, device=logp.device, dtype=logp.dtype).index_add(0, scores.row, logp)
    count = torch.zeros(scores.rows, device=logp.device, dtype=logp.dtype).index_add(0, scores.row,
                                                                                      torch.ones_like(logp))
    return total, count


def split_pairs(total: torch.Tensor, count: torch.Tensor) -> PairLogps:
    """The chosen half and the rejected half of a batch's rows."""
    b = total.shape[0] // 2
    return PairLogps(total[:b], total[b:], count[:b], count[b:])


class PreferenceModel(LanguageModel):
    """A causal LM with an adapter scored on preference pairs; ``reference`` is the same model without it."""

    kind = "preference"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reference = copy.copy(self)  # shares the backbone and the settings; its adapter adds nothing
        self.reference.adapter = TemplateOnly()

    def encode(self, examples: list[Example]) -> PairEncoded:
        """Prompt + chosen and prompt + rejected ids per pair, scored on the responses."""
        return encode_pairs(self.backbone, self.format, examples, self.max_length, self.max_response_length,
                            truncation=self.task.truncation)

    def batch(self, enc: Encoded, idx) -> dict[str, torch.Tensor]:
        """The pairs ``idx`` as one right-padded batch: their chosen sequences, then their rejected ones."""
        if not isinstance(enc, PairEncoded):
            return super().batch(enc, idx)
        rows = list(map(int, idx))
        return super().batch(enc.sequences(), rows + [len(enc) + i for i in rows])

    def outputs(self, params: Params, batch: dict[str, torch.Tensor], static: Params | None = None) -> PairLogps:
        """The policy's summed log-probabilities of each pair's two responses (packed rows with
        ``padding_free``)."""
        return split_pairs(*sequence_logps(self._scores(params, batch, static, pack=self.padding_free)))

    def loss(self, scores: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise ValueError("method.trainer: a preference task is trained by a preference trainer (dpo), which "
                         "compares the policy with the reference; a plain gradient trainer has no loss for it")

    @no_grad
    def reference_logps(self, batch: dict[str, torch.Tensor], static: Params | None = None) -> PairLogps:
        """``outputs`` of the frozen backbone without the adapter (the reference model), no gradient."""
        return self.reference.outputs({}, batch, static)

    @no_grad
    def pair_logps(self, params: Params | None, enc: PairEncoded, batch_size: int = 64) -> dict[str, np.ndarray]:
        """Per pair, float64: the summed log-probabilities of its chosen and rejected responses and their token
        counts, under ``params`` (None: the reference), in fixed batches of ``batch_size`` pairs (padded, not
        packed: the numbers do not depend on the run's packing)."""
        model = self.reference if params is None else self
        params = {} if params is None else {k: v.float() if v.is_floating_point() else v for k, v in params.items()}
        out = {k: np.zeros(len(enc)) for k in ("chosen", "rejected", "chosen_tokens", "rejected_tokens")}
        for start in range(0, len(enc), batch_size):
            idx = list(range(start, min(start + batch_size, len(enc))))
            lp = split_pairs(*sequence_logps(model._scores(params, model.batch(enc, idx), None, pack=False)))
            for k in out:
                out[k][start:start + len(idx)] = getattr(lp, k).double().cpu().numpy()
        return out

    @staticmethod
    def summarise(stats: dict[str, np.ndarray], rows: np.ndarray | None = None) -> dict[str, Any]:
        """The mean of every per-pair number over ``rows`` (all: None), and the pair count."""
        pick = slice(None) if rows is None else np.asarray(rows, dtype=np.int64)
        n = len(next(iter(stats.values()))[pick]) if stats else 0
        if n == 0:
            return {"num_examples": 0}
        return {k: float(np.mean(v[pick])) for k, v in stats.items()} | {"num_examples": n}

    def evaluate(self, params: Params, enc: Encoded, batch_size: int = 64, predictions: bool = False):
        raise ValueError("method.trainer: a preference task is scored by its preference trainer (dpo)")

    def evaluate_parts(self, params: Params, enc: Encoded, parts: list[np.ndarray], batch_size: int = 64):
        raise ValueError("method.trainer: a preference task is scored by its preference trainer (dpo)")
