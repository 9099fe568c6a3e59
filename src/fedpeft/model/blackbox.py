"""Forward-only black-box access to a frozen classifier (FedBPT's inference API f(Az; X), spec §8.1).

Clients of black-box methods get a ``BlackBox``: prompt vectors in, label logits or cross-entropy
out, under ``torch.inference_mode`` (no autograd graph can be built, no gradient can reach the
backbone). It exposes no parameters. It counts model calls (``queries``), candidate evaluations
and the tokens it ran through the model (prompt tokens included).

The client may also read the word-embedding matrix e(V) (``embedding_table``), as the discrete-prompt
paper's clients do (spec: "PLM API (forward only) and embedding matrix e(V)").

Population evaluation: ``losses(Z [P, d], ...)`` (or ``[P, T, d]`` prompts with ``param_dims=2``) stacks all P
candidates along the batch dimension and runs them in ONE forward per data chunk (``batched=True``); ``batched=False``
runs one forward per candidate, for comparison. Both give the same per-candidate losses up to float rounding. With a
``gather`` (vectorised clients, ``runtime.client_batch``) each forward is run together with other clients' (``gather``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedpeft.model.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.lazy import inference_mode, lazy

torch = lazy("torch")
F = lazy("torch.nn.functional")

if TYPE_CHECKING:
    from fedpeft.model.gather import ForwardGather


@dataclass
class Usage:
    """What the black box has been asked so far."""

    queries: int = 0      # forward calls into the model
    candidates: int = 0   # (prompt, dataset) evaluations requested
    examples: int = 0     # example rows scored (candidates x examples)
    tokens: int = 0       # attended tokens processed, prompt tokens included

    def as_dict(self) -> dict[str, int]:
        return {"queries": self.queries, "candidates": self.candidates, "examples": self.examples,
                "tokens": self.tokens}


class BlackBox:
    """``losses``/``logits`` of prompt vectors ``z`` on encoded data; nothing else of the model is reachable."""

    def __init__(self, classifier: Classifier, batched: bool = True, max_rows: int = 256,
                 param_name: str = "z", param_dims: int = 1, gather: ForwardGather | None = None,
                 client: int = 0) -> None:
        self.__clf = classifier  # name-mangled: the client code has no business with the model
        self.gather, self.client = gather, client  # vectorised clients: forwards shared with the group's others
        self.batched = batched
        self.max_rows = max_rows
        self.param_name = param_name
        self.param_dims = param_dims  # dims of one candidate: 1 for z [d], 2 for a prompt [T, d]
        self.usage = Usage()

    def embedding_table(self) -> torch.Tensor:
        """e(V) as a detached float32 CPU copy (rows = vocabulary ids)."""
        return self.__clf.backbone.input_embeddings().weight.detach().float().cpu().clone()

    def special_ids(self) -> list[int]:
        return sorted(self.__clf.backbone.tokenizer.all_special_ids)

    @property
    def num_classes(self) -> int:
        return self.__clf.task.num_classes

    @inference_mode
    def logits(self, z: torch.Tensor, data: Encoded) -> torch.Tensor:
        """Class logits [P, n, C] of every candidate of ``z`` (one candidate, or P stacked on a leading axis)."""
        zz = z.unsqueeze(0) if z.dim() == self.param_dims else z
        pop, n = zz.shape[0], len(data)
        out = torch.empty(pop, n, self.num_classes)
        groups = [list(range(pop))] if self.batched else [[c] for c in range(pop)]
        for cands in groups:
            chunk = max(1, self.max_rows // len(cands))
            for start in range(0, n, chunk):
                idx = list(range(start, min(start + chunk, n)))
                out[cands[0]:cands[-1] + 1, start:start + len(idx)] = self._forward(zz[cands], data, idx)
        self.usage.candidates += pop
        return out

    def _forward(self, zc: torch.Tensor, data: Encoded, idx: list[int]) -> torch.Tensor:
        batch = self.__clf.batch(data, idx)
        params = {self.param_name: zc.float()}
        logits = (self.__clf.logits(params, batch) if self.gather is None  # [P*n, C], candidate-major
                  else self.gather.logits(self.client, params, batch))
        p, n = zc.shape[0], len(idx)
        self.usage.queries += 1
        self.usage.examples += p * n
        self.usage.tokens += p * (int(batch["attention_mask"].sum()) + self._inserted() * n)
        return logits.float().view(p, n, -1).cpu()

    def _inserted(self) -> int:
        """Prompt positions the adapter adds per row (0 for adapters without ``num_tokens``)."""
        cfg = getattr(self.__clf.adapter, "cfg", None)
        return int(getattr(cfg, "num_tokens", 0) or 0)

    def sample_losses(self, z: torch.Tensor, data: Encoded) -> torch.Tensor:
        """Per-example cross-entropy over the label words, [P, n]; on a generation task each example's mean
        response-token cross-entropy (``LanguageModel.example_losses``)."""
        if self.__clf.kind == "generation":
            return self._example_losses(z, data)
        logits = self.logits(z, data)
        labels = torch.as_tensor(data.labels).long()
        p, n, c = logits.shape
        return F.cross_entropy(logits.reshape(p * n, c), labels.repeat(p), reduction="none").view(p, n)

    def losses(self, z: torch.Tensor, data: Encoded) -> torch.Tensor:
        """Mean cross-entropy on the whole local set per candidate, [P] (spec A5: mean, not sum)."""
        return self.sample_losses(z, data).mean(dim=1)

    @inference_mode
    def _example_losses(self, z: torch.Tensor, data: Encoded) -> torch.Tensor:
        """[P, n] example losses of a generation objective, all candidates stacked in one forward per chunk."""
        zz = z.unsqueeze(0) if z.dim() == self.param_dims else z
        pop, n = zz.shape[0], len(data)
        out = torch.empty(pop, n)
        chunk = max(1, self.max_rows // pop)
        for start in range(0, n, chunk):
            idx = list(range(start, min(start + chunk, n)))
            batch = self.__clf.batch(data, idx)
            scores = self.__clf.outputs({self.param_name: zz.float()}, batch)
            out[:, start:start + len(idx)] = self.__clf.example_losses(scores).view(pop, len(idx)).cpu()
            self.usage.queries += 1
            self.usage.examples += pop * len(idx)
            self.usage.tokens += pop * (int(batch["attention_mask"].sum()) + self._inserted() * len(idx))
        self.usage.candidates += pop
        return out

    def metrics(self, z: torch.Tensor, data: Encoded, predictions: bool = False) -> dict:
        """A trainer's ``evaluate`` metrics of one prompt vector on ``data``: accuracy, mean loss (and each
        example's predicted class) on classification; the objective's loss, perplexity and token accuracy on
        generation."""
        if len(data) == 0:
            return {"num_examples": 0}
        if self.__clf.kind == "generation":
            return self.__clf.evaluate({self.param_name: z.float()}, data, self.max_rows, predictions)
        acc, loss, preds = self.accuracy(z, data)
        return {"accuracy": acc, "loss": loss, "num_examples": len(data)} | ({"predictions": preds} if predictions
                                                                                else {})

    def accuracy(self, z: torch.Tensor, data: Encoded) -> tuple[float, float, np.ndarray]:
        """(accuracy, mean loss, each example's predicted class) of one prompt vector on ``data``."""
        logits = self.logits(z.unsqueeze(0) if z.dim() == self.param_dims else z, data)[0]
        labels = torch.as_tensor(data.labels).long()
        preds = logits.argmax(-1)
        return float((preds == labels).float().mean()), float(F.cross_entropy(logits, labels)), preds.numpy()
