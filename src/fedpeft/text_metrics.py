"""What generated text is scored by: corpus BLEU and chrF (sacrebleu), ROUGE-L (rouge-score), exact match.

Every metric takes several references per example where the task has them (WebNLG): sacrebleu's reference streams
(a missing reference is None), ROUGE-L's best F-measure over the references (``RougeScorer.score_multi``, Porter
stemming as in the summarisation literature), exact match against any reference after whitespace and case folding.
All on a 0-100 scale. ``bootstrap`` gives their standard errors by resampling examples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METRICS = ("bleu", "chrf", "rouge_l", "exact_match")


def _streams(refs: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """sacrebleu's reference streams: stream k holds each example's k-th reference, None where it has fewer."""
    depth = max((len(r) for r in refs), default=0)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(depth)]


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def rouge_l(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> np.ndarray:
    """Per-example ROUGE-L F-measure (best over the references), 0-100."""
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(["rougeL"], use_stemmer=True)
    return np.array([100.0 * scorer.score_multi(list(r), h)["rougeL"].fmeasure for h, r in zip(hyps, refs)])


def exact_match(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> np.ndarray:
    """Per example 100 when the generation equals a reference (case and whitespace folded), else 0."""
    return np.array([100.0 * any(_norm(h) == _norm(x) for x in r) for h, r in zip(hyps, refs)])


def text_metrics(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus BLEU, chrF, mean ROUGE-L and exact match of ``hyps`` against each example's references."""
    import sacrebleu

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} generations for {len(refs)} reference sets")
    if not hyps:
        return {}
    streams = _streams(refs)
    return {"bleu": float(sacrebleu.corpus_bleu(list(hyps), streams).score),
            "chrf": float(sacrebleu.corpus_chrf(list(hyps), streams).score),
            "rouge_l": float(rouge_l(hyps, refs).mean()),
            "exact_match": float(exact_match(hyps, refs).mean())}


def bootstrap(hyps: Sequence[str], refs: Sequence[Sequence[str]], samples: int = 200,
              seed: int = 0) -> dict[str, float]:
    """Standard error of each of ``text_metrics`` over ``samples`` resamples of the examples (with replacement)."""
    rng = np.random.default_rng(seed)
    n = len(hyps)
    draws: dict[str, list[float]] = {m: [] for m in METRICS}
    for _ in range(samples):
        idx = rng.integers(0, n, n)
        for k, v in text_metrics([hyps[i] for i in idx], [refs[i] for i in idx]).items():
            draws[k].append(v)
    return {f"{k}_se": float(np.std(v, ddof=1)) for k, v in draws.items() if len(v) > 1}
