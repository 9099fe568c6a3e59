"""Similarity readout: cosine between the mean-pooled output and each class's label-description embedding.

For encoders without an MLM head (MiniLM): nothing but the adapter is trained. The anchors are the pooled,
normalised label descriptions through the plain frozen model, computed once per process.
"""

from __future__ import annotations

from typing import Any

from fedpeft.adapters.base import Params, Prepared
from fedpeft.lazy import lazy
from fedpeft.model.readouts.base import READOUTS, Readout, last_hidden, mean_pool

torch = lazy("torch")
F = lazy("torch.nn.functional")


@READOUTS.register("similarity", "cosine of the pooled output with each class's label-description embedding "
                                 "(scaled by model.similarity_scale)")
class Similarity(Readout):
    name = "similarity"

    def setup(self, clf: Any) -> None:
        self.anchors = anchors(clf)

    def logits(self, clf, out, prep: Prepared, batch, params: Params) -> torch.Tensor:
        return clf.scale * F.normalize(self.pooled_states(clf, out, prep), dim=-1) @ self.anchors.T


def anchors(clf: Any) -> torch.Tensor:
    """Pooled, normalised label-description embeddings from the plain frozen model (cached per process)."""
    backbone = clf.backbone
    key = ("anchors", tuple(clf.task.label_descriptions))
    if key not in backbone.cache:
        tok = backbone.tokenizer
        b = tok(clf.task.label_descriptions, padding=True, truncation=True, max_length=128,
                return_tensors="pt").to(clf.device)
        with torch.no_grad():
            out = backbone.model(**b, output_hidden_states=backbone.family != "encoder")
        backbone.cache[key] = F.normalize(mean_pool(last_hidden(out, backbone.family), b["attention_mask"]), dim=-1)
    return backbone.cache[key]
