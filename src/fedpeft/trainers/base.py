"""The local-trainer axis: how a client improves its adapter from what the server sent.

A trainer keeps what is training: ``fit`` trains from the tensors a client starts from and returns its whole
result as an ``Update``; ``evaluate`` scores tensors on data the way this trainer may touch the model (gradient
trainers through the classifier, black-box trainers through the forward-only ``BlackBox``); ``evaluate_parts``
scores a set and subsets of it from one pass (the global test set and the clients' shards); ``diagnostics`` reads
the global state. What its kind of update looks like on the wire (the instruction, the reply cut from the result,
the server's check and decoding) is its update format, ``update_format()`` (``fedpeft.formats``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from fedpeft.model.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.formats.base import TensorFormat, UpdateFormat, floats
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy, no_grad
from fedpeft.registry import Registry

torch = lazy("torch")

Penalty = Callable[[Params], "torch.Tensor"]  # a differentiable term of the trained tensors added to the loss
F = lazy("torch.nn.functional")

PARAMS, DISTRIBUTION, NONE, SEEDS = "params", "distribution", "none", "seeds"


@dataclass(frozen=True)
class TrainerContext:
    """What a trainer may use: the shared objective (a ``Classifier`` or a ``LanguageModel``), the adapter's
    settings, the task's token budget, and what the aggregator reads."""

    objective: Classifier                 # or a LanguageModel: what the forward pass is scored by
    adapter_settings: Any
    max_length: int = 128                 # task.max_length: the tokens of an encoded text
    needs: frozenset[str] = frozenset()   # auxiliary values the aggregator reads from every update
    eval_batch: int = 64


class LocalTrainer(Protocol):
    kind: ClassVar[str]                        # PARAMS | DISTRIBUTION | NONE | SEEDS: what its updates are
    adapters: ClassVar[frozenset[str] | None]  # adapters it can train (None: any)
    scalars: ClassVar[tuple[str, ...]]         # auxiliary scalars every reply carries
    provides: ClassVar[frozenset[str]]         # auxiliary values (scalars and tensors) an aggregator may read

    def update_format(self) -> UpdateFormat:
        """What its updates look like on the wire (built once per method)."""
        ...

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen: dict[str, torch.Tensor] | None = None,
            static: Params | None = None, penalty: Penalty | None = None) -> tuple[Update, Params]:
        """Train from ``params`` (entries where ``frozen`` is True keep their values; ``static`` backbone weights
        replace the frozen ones in this client's forwards; ``penalty`` of the trained tensors is added to the loss);
        returns the whole result (the update format's ``upload`` cuts the reply from it) and the trainer's new
        client state."""
        ...

    def evaluate(self, params: Params, data: Encoded, predictions: bool = False) -> dict[str, Any]:
        """Accuracy, mean loss and example count of ``params`` on ``data``; with ``predictions`` also each
        example's predicted class (a numpy array under ``predictions``)."""
        ...

    def evaluate_parts(self, params: Params, data: Encoded,
                       parts: list[np.ndarray]) -> tuple[dict[str, float], list[dict[str, float]]] | None:
        """``evaluate`` on ``data`` (with its ``predictions``) and on each subset ``data.subset(part)`` from one pass
        over ``data``, or None where the trainer cannot score a subset from the predictions on the whole."""
        ...

    def diagnostics(self, glob: Params) -> dict[str, float]: ...


@no_grad
def predict(clf: Classifier, params: Params, data: Encoded, batch_size: int) -> torch.Tensor:
    """Class logits [n, C] of ``params`` on ``data``, computed in the batches ``classifier.evaluate`` uses."""
    return torch.cat([clf.logits(params, clf.batch(data, list(range(s, min(s + batch_size, len(data))))))
                      for s in range(0, len(data), batch_size)])


def score(logits: torch.Tensor, labels: torch.Tensor, batch_size: int) -> dict[str, float]:
    """``TrainerBase.evaluate``'s metrics from the logits of the examples it scores, with its arithmetic: per batch
    of ``batch_size`` a float32 cross-entropy sum and a count of correct argmaxes, summed over batches as Python
    numbers (``classifier.evaluate``), so equal logits give bit-identical metrics."""
    n = len(labels)
    if n == 0:
        return {"num_examples": 0}
    correct, loss_sum = 0, 0.0
    for start in range(0, n, batch_size):
        lg, y = logits[start:start + batch_size], labels[start:start + batch_size]
        loss_sum += F.cross_entropy(lg, y, reduction="sum").item()
        correct += (lg.argmax(-1) == y).sum().item()
    return {"accuracy": correct / n, "loss": loss_sum / n, "num_examples": n}


class TrainerBase:
    """Defaults: the instruction is the shared tensors themselves; evaluation through the classifier."""

    kind: ClassVar[str] = PARAMS
    vectorised: ClassVar[bool] = False  # its clients' model calls can run together (``runtime.client_batch``)
    adapters: ClassVar[frozenset[str] | None] = None
    scalars: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[frozenset[str]] = frozenset()
    summable: ClassVar[bool] = True  # its update tensors can be summed across clients (secure aggregation)
    forward_only: ClassVar[bool] = False  # it never computes a gradient (black-box access to the model suffices)
    preference: ClassVar[bool] = False  # it learns from preference pairs (a preference task's trainer)
    external: ClassVar[bool] = False  # it trains through the user's own loop (``ClientContext.external``)

    @classmethod
    def summable_with(cls, settings: Any) -> bool:
        """``summable`` with these settings (a trainer whose upload format is a setting overrides it)."""
        return cls.summable

    def __init__(self, settings: Any, ctx: TrainerContext) -> None:
        self.settings, self.ctx = settings, ctx
        self.clf = ctx.objective

    def update_format(self) -> UpdateFormat:
        return TensorFormat()

    def evaluate(self, params: Params, data: Encoded, predictions: bool = False) -> dict[str, Any]:
        if len(data) == 0:
            return {"num_examples": 0}
        return self.clf.evaluate(floats(params), data, self.ctx.eval_batch, predictions)

    def evaluate_parts(self, params: Params, data: Encoded,
                       parts: list[np.ndarray]) -> tuple[dict[str, float], list[dict[str, float]]] | None:
        """The metrics on ``data`` from its logits in ``evaluate``'s batches (bit-identical to ``evaluate``), and
        each part's rows of those logits scored as ``evaluate`` scores the part alone. A part's metrics equal
        ``evaluate(params, data.subset(part))`` bit for bit where an example's logits do not depend on the batch
        it runs in (BBC on MiniLM: every input fills the padded width). Where inputs differ in length they may, at
        float rounding (the padded width and the row count change the kernels' summation order): the part's loss
        then differs by ~1e-7, and its accuracy only if that flips an argmax. None for a trainer with its own
        ``evaluate`` (the black-box trainers score through their ``BlackBox``)."""
        if type(self).evaluate is not TrainerBase.evaluate:
            return None
        bs = self.ctx.eval_batch
        if self.clf.kind != "classification":  # per-example token sums: parts are exact sub-sums
            return self.clf.evaluate_parts(floats(params), data, parts, bs)
        logits = predict(self.clf, floats(params), data, bs) if len(data) else torch.empty(0)
        labels = torch.as_tensor(data.labels).to(logits.device)
        rows = [torch.as_tensor(np.asarray(p, dtype=np.int64), device=logits.device) for p in parts]
        whole = score(logits, labels, bs) | ({"predictions": logits.argmax(-1).cpu().numpy()} if len(data) else {})
        return whole, [score(logits[r], labels[r], bs) for r in rows]

    def diagnostics(self, glob: Params) -> dict[str, float]:
        return {}


TRAINERS: Registry[type] = Registry("trainer")  # classes built as cls(settings, TrainerContext)
