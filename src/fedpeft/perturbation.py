"""Perturbation-regularised local loss of FedBPT (spec §2.2 Eq. 7; dataset-level form of Alg. 1).

F^_k(z) = L(f(Az; X), Y) / L(f(Az; X (.) M + X^ (.) (1 - M)), Y): a fraction ``r_p`` of the input
tokens is replaced by random vocabulary tokens (M has a zero with probability r_p per token).
Decisions (spec §7): A6 dataset-level ratio by default with an epsilon floor, per-sample mean of
ratios as an option; A7 only the tokens of the input text are replaced (template, special, mask
and placeholder tokens are kept; lengths are preserved; on a generation task the prompt's fields, never the
response), replacements uniform over non-special
vocabulary ids, ``scope="all"`` perturbs every position like the authors' code; A8 the mask is
drawn per local iteration and shared by all candidates of that iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpeft.backbones.encoding import Encoded, encode_examples
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.lazy import lazy

torch = lazy("torch")


@dataclass(frozen=True)
class TextSpan:
    """Fixed template tokens around the input text: ``prefix`` before it, ``suffix`` after it."""

    prefix: int
    suffix: int


def text_span(backbone: Backbone, task: TaskData, readout: str, max_length: int) -> TextSpan:
    """Where the input text sits in every encoded row, found by encoding empty and one-word inputs.

    For sentence pairs the span runs from the start of ``text_a`` to the end of ``text_b`` and so
    also covers the literal between them (documented limitation).
    """
    pair = task.is_pair
    empty = encode_examples(backbone, task, [Example("", 0, "" if pair else None)], max_length, readout).input_ids[0]
    with_a = encode_examples(backbone, task, [Example("x", 0, "" if pair else None)], max_length, readout).input_ids[0]
    prefix = next(i for i in range(len(with_a)) if i >= len(empty) or with_a[i] != empty[i])
    if pair:
        with_b = encode_examples(backbone, task, [Example("", 0, "x")], max_length, readout).input_ids[0]
        b_at = next(i for i in range(len(with_b)) if i >= len(empty) or with_b[i] != empty[i])
        return TextSpan(prefix, len(empty) - b_at)
    return TextSpan(prefix, len(empty) - prefix)


def prompt_span(lm) -> TextSpan:
    """A generation task's ``TextSpan``: the template's tokens before the instruction and after the prompt's fields
    (up to where the response starts), found by encoding an empty and a one-word instruction (``encode_prompts``).
    With an input the span also covers the template's text between instruction and input, as for sentence pairs."""
    empty = lm.encode_prompts([Example("", 0)]).input_ids[0]
    with_a = lm.encode_prompts([Example("x", 0)]).input_ids[0]
    prefix = next(i for i in range(len(with_a)) if i >= len(empty) or with_a[i] != empty[i])
    return TextSpan(prefix, len(empty) - prefix)


def replacement_vocab(backbone: Backbone) -> np.ndarray:
    """Non-special vocabulary ids that random tokens are drawn from."""
    special = set(backbone.tokenizer.all_special_ids)
    size = min(len(backbone.tokenizer), backbone.input_embeddings().weight.shape[0])
    return np.array([i for i in range(size) if i not in special], dtype=np.int64)


def perturb(data: Encoded, rate: float, vocab: np.ndarray, rng: np.random.Generator,
            span: TextSpan | None) -> tuple[Encoded, int, int]:
    """X (.) M + X^ (.) (1 - M) over the text span (or every token when ``span`` is None).

    Returns the perturbed split (same lengths, labels, mask positions) and (replaced, eligible) counts.
    """
    rows, replaced, eligible = [], 0, 0
    for i, ids in enumerate(data.input_ids):
        end = len(ids) if data.response_start is None else int(data.response_start[i])  # a response is never touched
        lo, hi = (span.prefix, end - span.suffix) if span is not None else (0, end)
        row = np.array(ids, dtype=np.int64)
        n = max(hi - lo, 0)
        drop = rng.random(n) < rate
        new = vocab[rng.integers(0, len(vocab), size=n)]
        row[lo:hi] = np.where(drop, new, row[lo:hi])
        replaced += int(drop.sum())
        eligible += n
        rows.append(row.tolist())
    return Encoded(rows, data.labels, data.mask_index, data.lead, data.response_start), replaced, eligible


def ratio_fitness(clean: torch.Tensor, perturbed: torch.Tensor, form: str = "dataset",
                  eps: float = 1e-8) -> torch.Tensor:
    """Per-candidate fitness from per-example losses [P, n].

    ``dataset``: mean clean loss / max(mean perturbed loss, eps) (Alg. 1, spec A6);
    ``sample``: mean_i l_i / max(l'_i, eps) (Eq. 7 with a mean over samples, spec A5).
    """
    if form == "dataset":
        return clean.mean(1) / perturbed.mean(1).clamp_min(eps)
    if form == "sample":
        return (clean / perturbed.clamp_min(eps)).mean(1)
    raise ValueError(f"method.trainer.ratio_form: unknown '{form}' (allowed: dataset, sample)")
