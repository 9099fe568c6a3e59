"""Backdoor data poisoning (FedPrompt §III-C, Eqs. 6-8) and the attack-success-rate test set, as pure functions.

A malicious client keeps its clean data D_k and adds D_k^(poison): for a lambda share of its examples whose label
is not the target, a copy with the trigger word inserted and the label set to the target (Eq. 6-7); it trains on
both every round. The trigger goes at a seeded random word position inside the part of the text that survives
truncation (text_a for pairs), so long inputs cannot lose it. ASR = share of triggered test inputs whose true
label is not the target that the model classifies as the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fedpeft.data.types import Example

TokenCount = Callable[[str], int]


def kept_tokens(len_a: int, len_b: int, budget: int) -> int:
    """Tokens of text_a that survive the longest-first truncation of (text_a, text_b) to ``budget``."""
    while len_a + len_b > budget:
        if len_a >= len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a


def insert_trigger(ex: Example, trigger: str, insertions: int, count: TokenCount, budget: int,
                   rng: np.random.Generator) -> Example:
    """``ex`` with ``trigger`` inserted ``insertions`` times at random word positions that stay within the tokens
    kept after truncation (``count`` tokenizes a string; ``budget`` is the template's text budget)."""
    words = ex.text_a.split()
    len_b = count(ex.text_b) if ex.text_b else 0
    for _ in range(insertions):
        keep = kept_tokens(count(" ".join(words + [trigger])), len_b, budget)
        lo, hi = 0, len(words)  # the largest k with words[:k] + trigger inside the kept tokens (binary search)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if count(" ".join(words[:mid] + [trigger])) <= keep else (lo, mid - 1)
        pos = int(rng.integers(0, lo + 1))
        words = words[:pos] + [trigger] + words[pos:]
    return replace(ex, text_a=" ".join(words))


def poisoned_copies(examples: list[Example], target: int, rate: float, trigger: str, insertions: int,
                    count: TokenCount, budget: int, rng: np.random.Generator) -> list[Example]:
    """D_k^(poison) (Eq. 6): triggered copies, relabelled to ``target``, of a ``rate`` share of the non-target
    examples (a seeded subset; rate 1 = all of them)."""
    source = [i for i, ex in enumerate(examples) if ex.label != target]
    chosen = sorted(rng.choice(source, size=int(round(rate * len(source))), replace=False).tolist()) if source else []
    return [replace(insert_trigger(examples[i], trigger, insertions, count, budget, rng), label=target)
            for i in chosen]


def asr_examples(examples: list[Example], target: int, trigger: str, insertions: int, count: TokenCount,
                 budget: int, rng: np.random.Generator) -> tuple[np.ndarray, list[Example]]:
    """(indices of the non-target test examples, their triggered copies labelled ``target``): accuracy on them
    is the ASR."""
    idx = np.array([i for i, ex in enumerate(examples) if ex.label != target], dtype=np.int64)
    return idx, [replace(insert_trigger(examples[i], trigger, insertions, count, budget, rng), label=target)
                 for i in idx]


def malicious_ids(ids: list[int] | None, fraction: float, num_clients: int, eligible: list[int],
                  rng: np.random.Generator) -> frozenset[int]:
    """The malicious clients, fixed for the run: the given ids, or a seeded ``fraction`` of the participants."""
    if ids is not None:
        bad = [i for i in ids if not 0 <= i < num_clients]
        if bad:
            raise ValueError(f"attack.malicious_clients: ids {bad} are not in [0, {num_clients})")
        return frozenset(ids)
    k = int(round(fraction * num_clients))
    return frozenset(int(i) for i in rng.choice(eligible, size=min(k, len(eligible)), replace=False))
