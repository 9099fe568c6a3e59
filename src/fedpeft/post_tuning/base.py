"""The post-tuning contract (personalized gradient-free prompt tuning §2.9, Alg. 5) and its few-shot split.

``tune(params, data, rng)`` returns the client's personalised tensors and a report (queries, shots); it
never communicates. ``none`` (the default) scores the global tensors as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeft.model.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.comm.update import Params
from fedpeft.registry import Registry


@dataclass(frozen=True)
class PostTuningContext:
    objective: Classifier  # or a LanguageModel: what the forward pass is scored by
    eval_batch: int = 64


def shots(labels: np.ndarray, k: int, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
    """Up to ``k`` indices of every class present (all of a class that has fewer), none from ``exclude``."""
    taken = np.zeros(len(labels), dtype=bool)
    if exclude is not None:
        taken[exclude] = True
    out = []
    for c in np.unique(labels):
        idx = np.flatnonzero((labels == c) & ~taken)
        out.append(rng.choice(idx, size=min(k, idx.size), replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def few_shot_split(data: Encoded, k: int, dev: bool, rng: np.random.Generator) -> tuple[Encoded, Encoded | None]:
    """(k shots per class to tune on, an equally drawn disjoint dev set or None)."""
    train_idx = shots(data.labels, k, rng)
    dev_idx = shots(data.labels, k, rng, exclude=train_idx) if dev else None
    return data.subset(train_idx), (data.subset(dev_idx) if dev_idx is not None and len(dev_idx) else None)


class PostTuningBase:
    """No post-tuning: the global tensors are scored as they are."""

    active: ClassVar[bool] = False
    adapters: ClassVar[frozenset[str] | None] = None

    def __init__(self, settings: Any, ctx: PostTuningContext) -> None:
        self.settings, self.ctx = settings, ctx

    def tune(self, params: Params, data: Encoded, rng: np.random.Generator) -> tuple[Params, dict[str, float]]:
        return params, {}


POST_TUNING: Registry[type] = Registry("post-tuning")  # classes built as cls(settings, PostTuningContext)
POST_TUNING.add("none", PostTuningBase, "no post-tuning: every client is scored with the global tensors")
