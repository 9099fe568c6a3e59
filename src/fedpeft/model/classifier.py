"""The classification objective: backbone + adapter + readout = class logits, cross-entropy over the classes.

The readouts (``model.readouts``: similarity, verbalizer, linear) are plug-ins; ``model.pooling`` ("text": the
similarity and linear readouts average over the text positions only, not over the adapter's inserted rows) and
``calibration="contextual"`` (verbalizer/similarity; Zhao et al. 2021, "Calibrate Before Use") apply across them:
calibrated logits are ``log softmax(raw) - log p_cf`` with p_cf the mean class softmax of content-free inputs (the
template filled with "N/A", "" and the mask token), computed with the same params in the same forward (appended
rows, per population candidate).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from fedpeft.adapters.base import Adapter, Params
from fedpeft.backbones.encoding import Encoded, encode_examples
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.lazy import lazy, no_grad
from fedpeft.model.forward import AdaptedModel, _cut, _sorted_forward
from fedpeft.model.readouts import READOUTS

torch = lazy("torch")
F = lazy("torch.nn.functional")


def resolve_readout(readout: str, family: str) -> str:
    if readout == "auto":
        return "similarity" if family == "encoder" else "verbalizer"
    if readout == "verbalizer" and family == "encoder":
        raise ValueError("model.readout: 'verbalizer' needs a masked or causal LM head; "
                         "this encoder has none (use similarity or linear)")
    return readout


def readout_option(field: str, value: str, choices: tuple[str, ...], readout: str, excluded: str, why: str) -> str:
    """``value`` if it is one of ``choices`` and, unless it is the default (the first), the readout is not
    ``excluded``; else a ValueError naming ``field``."""
    if value not in choices:
        raise ValueError(f"{field}: unknown '{value}' ({', '.join(choices)})")
    if value != choices[0] and readout == excluded:
        raise ValueError(f"{field}: '{value}' {why}")
    return value


class Classifier(AdaptedModel):
    """The classification objective: class logits of (adapter params, token batch) through the readout, and their
    cross-entropy as the loss every trainer minimises (or, forward-only, uses as the fitness)."""

    kind = "classification"
    generates = False  # it writes no text (``LanguageModel`` does)

    def __init__(self, backbone: Backbone, adapter: Adapter, task: TaskData, readout: str = "auto",
                 similarity_scale: float = 20.0, max_length: int = 128, autocast: str = "none",
                 calibration: str = "none", content_free: tuple[str, ...] | None = None,
                 pooling: str = "all") -> None:
        super().__init__(backbone, adapter, task, max_length, autocast)
        self.readout = resolve_readout(readout, backbone.family)
        self.pooling = readout_option("model.pooling", pooling, ("all", "text", "pooler"), self.readout, "verbalizer",
                                      "applies to the pooled readouts (similarity, linear); the verbalizer reads "
                                      "one position (use all)")
        self.calibration = readout_option("model.calibration", calibration, ("none", "contextual"), self.readout,
                                          "linear", "applies to the verbalizer and similarity readouts; a trained "
                                                    "linear head needs no calibration (use none)")
        mask = backbone.tokenizer.mask_token
        self.content_free = tuple(content_free) if content_free is not None else (
            ("N/A", "", mask) if mask else ("N/A", ""))
        if calibration == "contextual" and not self.content_free:
            raise ValueError("model.calibration: contextual calibration needs at least one content-free input")
        self._cf: Encoded | None = None
        self.scale = similarity_scale
        self.head = READOUTS.get(self.readout)()
        self.head.setup(self)

    @property
    def label_ids(self) -> torch.Tensor:
        """The verbalizer's label token ids (``model.readouts.verbalizer``)."""
        return self.head.label_ids

    @property
    def anchors(self) -> torch.Tensor:
        """The similarity readout's normalised label-description embeddings (``model.readouts.similarity``)."""
        return self.head.anchors

    # ---------------------------------------------------------------- data

    def encode(self, examples: list[Example]) -> Encoded:
        return encode_examples(self.backbone, self.task, examples, self.max_length, self.readout)

    @no_grad
    def show(self, example: Example, params: Params) -> str:
        """One example as the model sees it: its tokens after the template, with the rows the adapter inserts marked
        where they go, and the frozen text some adapters run first (``fedpeft run --dry-run``)."""
        enc = self.encode([example])
        b = self.batch(enc, [0])
        prep = self.adapter.prepare(self.backbone, {k: v.to(self.device) for k, v in params.items()},
                                    b["input_ids"], b["attention_mask"], int(b["lead"]))
        tok = self.backbone.tokenizer
        tokens = tok.convert_ids_to_tokens(list(enc.input_ids[0]))
        rows = f"⟨{prep.inserted} adapter rows⟩"
        if prep.text is not None:  # suffix placement: the frozen text first, the rows before its final token
            parts = [tok.convert_tokens_to_string(tokens[:-1]), rows, tok.convert_tokens_to_string(tokens[-1:])]
        elif prep.inserted:
            at = int(prep.insert_at if isinstance(prep.insert_at, int) else prep.insert_at[0])
            parts = [tok.convert_tokens_to_string(tokens[:at]), rows, tok.convert_tokens_to_string(tokens[at:])]
        else:
            parts = [tok.convert_tokens_to_string(tokens)]
        return " ".join(p for p in parts if p)

    # ---------------------------------------------------------------- params

    def init_params(self, generator: torch.Generator) -> Params:
        """Adapter tensors plus the readout's own (the linear head), drawn in that order from ``generator``, then
        the adapter's data-dependent initialisation (``Adapter.initialise``)."""
        params = self.adapter.init(self.backbone, generator)
        params |= self.head.init(self, generator)
        params = self.adapter.initialise(self, params, generator)
        return {k: v.cpu() for k, v in params.items()}

    # ---------------------------------------------------------------- forward

    def _reads_hidden_states(self) -> bool:
        return self.head.reads_hidden_states(self.backbone.family)

    def logits(self, params: Params, batch: dict[str, torch.Tensor], static: Params | None = None) -> torch.Tensor:
        """Class logits [batch, num_classes] of the adapted frozen model (float32); ``static`` replaces backbone
        weights for this call only (the shared module is never written). Contextually calibrated when
        ``calibration`` is "contextual" (the content-free rows ride along in the same forward pass)."""
        if self.calibration == "contextual":
            return self._calibrated_logits(params, batch, static)
        out, prep, params = self._forward(params, batch, static=static)
        with self._autocast():
            logits = self.readout_logits(out, prep, batch, params)
        return logits.float() if self.autocast is not None else logits

    def outputs(self, params: Params, batch: dict[str, torch.Tensor], static: Params | None = None) -> torch.Tensor:
        """What the loss scores: the class logits (the objective contract shared with ``LanguageModel``)."""
        return self.logits(params, batch, static)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy of the batch's labels."""
        return F.cross_entropy(logits.float(), batch["labels"])

    def evaluate(self, params: Params, enc: Encoded, batch_size: int = 64, predictions: bool = False) -> dict[str, Any]:
        """Accuracy and mean cross-entropy on ``enc`` (module-level ``evaluate``)."""
        return evaluate(self, params, enc, batch_size, predictions)

    def logits_stacked(self, calls: list[tuple[Params, dict[str, torch.Tensor]]],
                       passes: int | None = None) -> list[torch.Tensor] | None:
        """Class logits of several (params, batch) calls from one stacked backbone call (vectorised clients): each
        call's inputs are prepared by the adapter on their own, right-padded to a common width and stacked; each
        call's readout then reads its own rows, cut back to its width. None, with no forward run, where the calls
        cannot share one: fewer than two, the CPU default below, or calls that need their own forward
        (calibration rows, a cached frozen text, extra model arguments, weight overrides).

        ``passes``: the stacked rows, sorted by length, go through the model in this many forwards, each padded
        only to its own longest row (rows of a batch do not interact; ``_sorted_forward``). Default: one on an
        accelerator, where one large call is what pays; on CPU each call on its own (bitwise equal to sequential
        calls): a larger matrix is no cheaper per row there, and a population call already sorts its own rows
        (``_population_passes``), which was all the gain of sorting a group's rows together."""
        if not self.stacks_calls(passes) or len(calls) < 2 or self.calibration == "contextual" or \
                any(self.adapter.overrides(p) for p, _ in calls):
            return None
        calls = [({k: v.to(self.device) for k, v in p.items()}, b) for p, b in calls]
        preps = []
        for p, b in calls:  # stop at the first call that needs its own forward: at most one prepare is wasted
            prep = self.adapter.prepare(self.backbone, p, b["input_ids"], b["attention_mask"], int(b["lead"]))
            if prep.text is not None or prep.extra:
                return None
            preps.append(prep)
        width = max(prep.embeds.shape[1] for prep in preps)
        embeds = torch.cat([F.pad(prep.embeds, (0, 0, 0, width - prep.embeds.shape[1])) for prep in preps])
        mask = torch.cat([F.pad(prep.attention_mask, (0, width - prep.attention_mask.shape[1])) for prep in preps])
        passes = passes or 1
        split = self.backbone.body_and_head
        model = self.backbone.model if split is None else split[1]
        out_logits, start = [], 0
        with self._autocast():
            out = _sorted_forward(model, embeds, mask, passes, self._reads_hidden_states())
            for (p, b), prep in zip(calls, preps):
                rows, cols = prep.embeds.shape[0], prep.embeds.shape[1]
                own = SimpleNamespace(**{k: _cut(v, start, start + rows, cols) for k, v in out.items()})
                logits = self.readout_logits(own, prep, b, p)
                out_logits.append(logits.float() if self.autocast is not None else logits)
                start += rows
        return out_logits

    def stacks_calls(self, passes: int | None) -> bool:
        """Whether ``logits_stacked`` stacks its calls into shared forwards (given ``passes``, or on an accelerator)
        rather than running each call on its own (the CPU default)."""
        return passes is not None or self.device.type != "cpu"

    # ---------------------------------------------------------------- contextual calibration

    def content_free_encoded(self) -> Encoded:
        """The content-free inputs encoded like real examples (same template and max_length), cached."""
        if self._cf is None:
            pair = self.task.is_pair
            self._cf = self.encode([Example(t, 0, t if pair else None) for t in self.content_free])
        return self._cf

    def with_content_free(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        """``batch`` with the k content-free rows appended (all right-padded to a common width), and k."""
        cf = self.content_free_encoded()
        ids, att = batch["input_ids"], batch["attention_mask"]
        n, k = ids.shape[0], len(cf)
        width = max(ids.shape[1], max(len(r) for r in cf.input_ids))
        all_ids = torch.full((n + k, width), self.pad_id, dtype=ids.dtype, device=ids.device)
        all_att = torch.zeros((n + k, width), dtype=att.dtype, device=att.device)
        all_ids[:n, : ids.shape[1]], all_att[:n, : att.shape[1]] = ids, att
        for j, r in enumerate(cf.input_ids):
            all_ids[n + j, : len(r)] = torch.tensor(r, dtype=ids.dtype)
            all_att[n + j, : len(r)] = 1
        mask_index = torch.cat([batch["mask_index"].to(self.device),
                                torch.as_tensor(cf.mask_index, device=self.device)])
        return {"input_ids": all_ids, "attention_mask": all_att, "mask_index": mask_index,
                "lead": batch["lead"]}, k

    def _calibrated_logits(self, params: Params, batch: dict[str, torch.Tensor],
                           static: Params | None) -> torch.Tensor:
        """log p(y|x) - log p_cf(y) per population candidate, from ONE forward over batch + content-free rows.

        With a population axis the adapter tiles the (extended) batch candidate-major, so each block of
        n + k output rows is one candidate: its first n rows are the batch, its last k the content-free inputs.
        """
        ext, k = self.with_content_free(batch)
        n = batch["input_ids"].shape[0]
        out, prep, params = self._forward(params, ext, static=static)
        with self._autocast():
            raw = self.readout_logits(out, prep, ext, params)
        rows = raw.shape[0]
        if rows % (n + k):
            raise ValueError(f"model.calibration: {rows} output rows are not a multiple of the {n}+{k} "
                             "batch + content-free rows (an adapter that does not tile the batch candidate-major)")
        logp = F.log_softmax(raw.float().view(rows // (n + k), n + k, -1), dim=-1)
        log_pcf = torch.logsumexp(logp[:, n:], dim=1, keepdim=True) - math.log(k)  # log mean_cf softmax
        return (logp[:, :n] - log_pcf).reshape(-1, logp.shape[-1])

    def readout_logits(self, out, prep, batch: dict[str, torch.Tensor], params: Params) -> torch.Tensor:
        """Class logits of a forward's rows by the readout (``model.readouts``)."""
        return self.head.logits(self, out, prep, batch, params)


@no_grad
def evaluate(clf: Classifier, params: Params, enc: Encoded, batch_size: int = 64,
             predictions: bool = False) -> dict[str, Any]:
    """Accuracy and mean cross-entropy of ``params`` on an encoded split (with ``predictions``: also each
    example's predicted class, as a numpy array under ``predictions``)."""
    if len(enc) == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "num_examples": 0}
    correct, loss_sum, preds = 0, 0.0, []
    for start in range(0, len(enc), batch_size):
        idx = list(range(start, min(start + batch_size, len(enc))))
        b = clf.batch(enc, idx)
        logits = clf.logits(params, b)
        loss_sum += F.cross_entropy(logits, b["labels"], reduction="sum").item()
        pred = logits.argmax(-1)
        correct += (pred == b["labels"]).sum().item()
        preds.append(pred.cpu())
    out = {"accuracy": correct / len(enc), "loss": loss_sum / len(enc), "num_examples": len(enc)}
    return out | ({"predictions": torch.cat(preds).numpy()} if predictions else {})
