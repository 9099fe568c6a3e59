"""What a generation run records about the text its model writes, and its loss per natural client.

``by_group``: the teacher-forced loss and perplexity of every test example grouped by its natural client
(category), from the one pass over the test set. ``generation_metrics``: greedy generations for a fixed seeded
sample of the test prompts (``evaluation.generate_examples``, each group's share kept; the same sample every
round), scored by BLEU, chrF, ROUGE-L and exact match overall, per group, and over the groups seen in training
and those never seen (WebNLG's unseen categories), plus the first ``evaluation.show_examples`` prompts with their
reference and generation. ``file_scores``: the same scores of a labelled file (``fedpeft evaluate``), with each
example's generation, references and own scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeft.data.types import Example
from fedpeft.rng import SERVER, numpy_rng
from fedpeft.text_metrics import bootstrap, exact_match, rouge_l, text_metrics


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
    hyps = generations(objective, params, picked, max_new_tokens, batch_size)
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
    out["samples"] = [{"prompt": objective.format.prompt_text(e), "references": list(e.refs), "generation": h}
                      for e, h in zip(picked[:show], hyps[:show])]
    out["num_generated"] = len(hyps)
    return out


def generations(objective: Any, params: dict, examples: list[Example], max_new_tokens: int,
                batch_size: int, encoded: Any = None) -> list[str]:
    """The greedy completions of ``examples``' prompts (``encoded``: their ``encode_prompts``, when the caller has
    them), decoded without special tokens and stripped."""
    encoded = objective.encode_prompts(examples) if encoded is None else encoded
    ids = objective.generate(params, encoded, max_new_tokens, batch_size)
    tok = objective.backbone.tokenizer
    return [tok.decode(t, skip_special_tokens=True).strip() for t in ids]


def file_scores(objective: Any, stats: dict[str, np.ndarray], examples: list[Example], hyps: list[str],
                resamples: int = 0) -> dict[str, Any]:
    """A labelled file's scores as a run scores its test set: the teacher-forced loss, perplexity and next-token
    accuracy per response token (``stats``: ``token_stats`` of ``examples``; the accuracy as ``token_accuracy``),
    BLEU, chrF, ROUGE-L and exact match of the greedy ``hyps`` (with bootstrap standard errors over ``resamples``),
    and per example its generation, references, loss, perplexity, ROUGE-L and exact match (BLEU and chrF are
    corpus scores)."""
    refs = [list(e.refs) for e in examples]
    teacher = objective.summarise(stats)
    out: dict[str, Any] = {"num_examples": len(examples), "num_tokens": teacher.get("num_tokens", 0),
                           "loss": teacher.get("loss"), "perplexity": teacher.get("perplexity"),
                           "token_accuracy": teacher.get("accuracy")}
    out |= text_metrics(hyps, refs) | (bootstrap(hyps, refs, resamples) if resamples and len(hyps) > 1 else {})
    rouge, exact = rouge_l(hyps, refs), exact_match(hyps, refs)
    out["examples"] = [{"instruction": e.text_a, "input": e.text_b, "references": r, "generation": h,
                        **_example_loss(stats, i), "rouge_l": float(rouge[i]), "exact_match": float(exact[i])}
                       for i, (e, r, h) in enumerate(zip(examples, refs, hyps))]
    return out


def _example_loss(stats: dict[str, np.ndarray], i: int) -> dict[str, float | None]:
    """Example ``i``'s mean cross-entropy per response token and its perplexity (None without response tokens)."""
    tokens = int(stats["tokens"][i])
    if not tokens:
        return {"loss": None, "perplexity": None}
    loss = float(stats["nll"][i] / tokens)
    return {"loss": loss, "perplexity": float(np.exp(min(loss, 700.0)))}
