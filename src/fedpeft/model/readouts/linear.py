"""Linear readout: a trainable head on the mean-pooled output, logits = pooled · weightᵀ + bias.

``head.weight`` [C, d] and ``head.bias`` [C] are trained and exchanged with the adapter and counted in the payload.
"""

from __future__ import annotations

from typing import Any

from fedpeft.adapters.base import Params, Prepared
from fedpeft.lazy import lazy
from fedpeft.model.readouts.base import READOUTS, Readout

torch = lazy("torch")


@READOUTS.register("linear", "a trainable linear head on the pooled output, trained and exchanged with the adapter")
class Linear(Readout):
    name = "linear"

    def init(self, clf: Any, generator: torch.Generator) -> Params:
        """weight ~ U(±1/sqrt(d)), bias = 0 (drawn after the adapter's tensors, from the same generator)."""
        d, c = clf.backbone.hidden_size, clf.task.num_classes
        bound = d ** -0.5
        return {"head.weight": (torch.rand(c, d, generator=generator) * 2 - 1) * bound, "head.bias": torch.zeros(c)}

    def logits(self, clf, out, prep: Prepared, batch, params: Params) -> torch.Tensor:
        return self.pooled_states(clf, out, prep) @ params["head.weight"].T + params["head.bias"]
