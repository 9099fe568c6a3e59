"""What a generation run records about the text its model writes, and its loss per natural client.

``by_group``: the teacher-forced loss and perplexity of every test example grouped by its natural client
(category), from the one pass over the test set. ``generation_metrics``: greedy generations for a fixed seeded
sample of the test prompts (``evaluation.generate_examples``, each group's share kept; the same sample every
round), scored by BLEU, chrF, ROUGE-L and exact match overall, per group, and over the groups seen in training
and those never seen (WebNLG's unseen categories), plus the first ``evaluation.show_examples`` prompts with their
reference and generation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeft.data.types import Example
from fedpeft.rng import SERVER, numpy_rng
from fedpeft.text_metrics import bootstrap, text_metrics


def by_group(objective: Any, stats: dict[str, np.ndarray], examples: list[Example],
             seen: set[str]) -> dict[str, Any]:
    """Loss/perplexity per group of ``examples`` (rows of ``stats``), and over the seen and the unseen groups."""
    groups = np.array([e.group if e.group is not None else "" for e in examples])
    if not groups.any():
        return {}
    out: dict[str, Any] = {"by_group": {str(g): objective.summarise(stats, np.flatnonzero(groups == g))
                                        for g in sorted(set(groups))}}
    unseen = np.array([g not in seen for g in groups])
    if unseen.any() and (~unseen).any():
        out["seen"] = objective.summarise(stats, np.flatnonzero(~unseen))
        out["unseen"] = objective.summarise(stats, np.flatnonzero(unseen))
    return out


def sample_rows(examples: list[Example], size: int | None, seed: int) -> np.ndarray:
    """A fixed seeded sample of ``size`` example indices (all when unset), each group's share kept, in order."""
    n = len(examples)
    if size is None or size >= n:
        return np.arange(n)
    rng = numpy_rng(seed, 0, SERVER, "generation-sample")
    groups = np.array([e.group or "" for e in examples])
    picked = []
    for g in sorted(set(groups)):
        rows = np.flatnonzero(groups == g)
        k = max(1, round(size * len(rows) / n))
        picked.append(rng.choice(rows, min(k, len(rows)), replace=False))
    return np.sort(np.concatenate(picked))[:max(size, 1)] if picked else np.arange(0)


def generation_metrics(objective: Any, params: dict, examples: list[Example], rows: np.ndarray, seen: set[str],
                       max_new_tokens: int, batch_size: int, show: int, resamples: int = 0) -> dict[str, Any]:
    """Greedy generations of ``examples[rows]`` scored against their references, overall, per group, seen and
    unseen (with bootstrap standard errors over ``resamples`` resamples); the first ``show`` prompts with their
    reference and generation."""
    def scored(h: list[str], r: list) -> dict[str, float]:
        return text_metrics(h, r) | (bootstrap(h, r, resamples) if resamples and len(h) > 1 else {})

    picked = [examples[i] for i in rows]
    if not picked:
        return {}
    ids = objective.generate(params, objective.encode_prompts(picked), max_new_tokens, batch_size)
    tok = objective.backbone.tokenizer
    hyps = [tok.decode(t, skip_special_tokens=True).strip() for t in ids]
    refs = [e.refs for e in picked]
    out: dict[str, Any] = dict(scored(hyps, refs))
    groups = [e.group for e in picked]
    if any(g is not None for g in groups):
        out["by_group"] = {g: text_metrics([h for h, x in zip(hyps, groups) if x == g],
                                           [r for r, x in zip(refs, groups) if x == g])
                           for g in sorted({g for g in groups if g is not None})}
        unseen = [g not in seen for g in groups]
        if any(unseen) and not all(unseen):
            for name, want in (("seen", False), ("unseen", True)):
                out[name] = scored([h for h, u in zip(hyps, unseen) if u == want],
                                   [r for r, u in zip(refs, unseen) if u == want])
    out["samples"] = [{"prompt": objective.format.prompt_text(e), "reference": e.refs[0] if e.refs else "",
                       "generation": h} for e, h in zip(picked[:show], hyps[:show])]
    out["num_generated"] = len(hyps)
    return out
