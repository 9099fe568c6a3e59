"""The language-modelling objective: token cross-entropy of a causal LM on the response tokens only.

A generation task's rows are prompt + response (``backbones.instruction_encoding``); position t's logits score
token t + 1, and only the positions that predict a response token count (the completion-only loss of TRL's
``SFTTrainer`` and FedIT). The transformer body runs alone and the LM head is applied to those rows only, as the
verbalizer does for its one read row. Rows the adapter inserts (soft prompts) are skipped; a deep prompt's prefix
sits in the key/value cache and shifts no row. Trainers see the same contract as for classification:
``outputs`` then ``loss`` (gradient trainers), ``example_losses`` (forward-only trainers' fitness: an example's
mean response-token cross-entropy, per population candidate), ``evaluate`` (loss, perplexity and next-token
accuracy per response token, teacher-forced). ``generate`` decodes greedily (``model.decoding``). With
``padding_free`` a training batch's rows run as one sequence without pad tokens (``packed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeft.adapters.base import Adapter, Params, Prepared
from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.instruction_encoding import PromptFormat, encode_instructions, end_token_id
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.lazy import lazy, no_grad
from fedpeft.model.forward import AdaptedModel
from fedpeft.model.packed_attention import ROWS, use_packed_attention

torch = lazy("torch")
F = lazy("torch.nn.functional")

IGNORE = -100


@dataclass
class TokenScores:
    """Vocabulary logits [N, V] of the N positions that predict a response token, those tokens [N], and the row of
    each [N] among ``rows`` rows (candidate-major when a population is stacked)."""

    logits: torch.Tensor
    targets: torch.Tensor
    row: torch.Tensor
    rows: int

    def float(self) -> TokenScores:
        return TokenScores(self.logits.float(), self.targets, self.row, self.rows)


def response_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n, T] token ids at response positions (from ``response_start`` to the row's end), ``IGNORE`` elsewhere."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    j = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    keep = (j >= batch["response_start"].to(ids.device).unsqueeze(1)) & mask.bool()
    return torch.where(keep, ids, torch.full_like(ids, IGNORE))


def insert_ignored(labels: torch.Tensor, at: int | torch.Tensor, m: int) -> torch.Tensor:
    """``labels`` with ``m`` ignored positions spliced in at ``at`` (one position, or one per row): the adapter's
    inserted rows, which score nothing."""
    if m == 0:
        return labels
    n, t = labels.shape
    at_rows = torch.as_tensor(at, device=labels.device).expand(n).unsqueeze(1)
    j = torch.arange(t + m, device=labels.device).unsqueeze(0)
    src = torch.where(j < at_rows, j, j - m).clamp(0, t - 1)
    inside = (j >= at_rows) & (j < at_rows + m)
    return torch.where(inside, torch.full_like(src, IGNORE), labels.gather(1, src))


def packed(prep: Prepared, lengths: torch.Tensor) -> tuple[Prepared, torch.Tensor]:
    """The right-padded rows of ``prep`` as one sequence without pads [1, sum(lengths), d], and each row's first
    position in it. Position ids restart at every row; each row attends to itself alone, through the rows'
    boundaries (``packed_attention``) or, under another attention than SDPA, HF's block mask for restarting
    position ids (``find_packed_sequence_indices``, which a cache would stop: none is built)."""
    n, width, dim = prep.embeds.shape
    positions = torch.cat([torch.arange(int(k)) for k in lengths])
    rows = torch.repeat_interleave(torch.arange(n), lengths)
    flat = (rows * width + positions).to(prep.embeds.device, non_blocking=True)  # from CPU lengths: no device wait
    starts = torch.cumsum(lengths, 0) - lengths
    extra = {"position_ids": positions.unsqueeze(0).to(prep.embeds.device, non_blocking=True), "use_cache": False,
             ROWS: [(int(a), int(a + k)) for a, k in zip(starts, lengths)]}
    return Prepared(prep.embeds.reshape(n * width, dim)[flat].unsqueeze(0), None, prep.insert_at, 0, extra), starts


def scored_positions(batch: dict[str, torch.Tensor], rows: int, insert_at: int | torch.Tensor, inserted: int,
                     target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, position) of every position whose next token is a response token, over ``rows`` stacked rows.

    From the batch's CPU copies of lengths and response starts where it has them (``LanguageModel.batch``): no
    wait for the device, which can then run ahead; else from ``target`` on the device."""
    if ("lengths_cpu" not in batch or not isinstance(insert_at, int)
            or (inserted and insert_at > int(batch["response_start_cpu"].min()))):
        return (target != IGNORE).nonzero(as_tuple=True)
    lengths, starts = batch["lengths_cpu"], batch["response_start_cpu"]
    reps = rows // len(lengths)
    per_row = [torch.arange(int(s) - 1, int(n) - 1) for s, n in zip(starts, lengths)]
    counts = torch.tensor([len(p) for p in per_row])
    pos = torch.cat(per_row) if per_row else torch.zeros(0, dtype=torch.long)
    pos = pos + inserted  # the adapter's rows come before every response
    row = torch.repeat_interleave(torch.arange(len(lengths)), counts)
    row = torch.cat([row + r * len(lengths) for r in range(reps)])
    pos = pos.repeat(reps)
    device = target.device
    return row.to(device, non_blocking=True), pos.to(device, non_blocking=True)


class LanguageModel(AdaptedModel):
    """A causal LM with an adapter, scored by its response-token cross-entropy; also decodes greedily."""

    kind = "generation"
    readout = "lm"
    generates = True  # greedy decoding (``generate``): fedpeft generate, the suites, export

    def __init__(self, backbone: Backbone, adapter: Adapter, task: TaskData, max_length: int = 256,
                 max_response_length: int = 64, autocast: str = "none", padding_free: bool = False) -> None:
        if backbone.family != "causal":
            raise ValueError(f"model.name: task '{task.name}' is a generation task and needs a causal LM; "
                             f"{backbone.name} is {'an' if backbone.family[0] in 'aeiou' else 'a'} "
                             f"{backbone.family} model")
        super().__init__(backbone, adapter, task, max_length, autocast)
        if self.pad_id is None:
            self.pad_id = end_token_id(backbone.tokenizer)
        self.max_response_length = max_response_length
        self.padding_free = padding_free
        self.format = PromptFormat.of(backbone, task.prompt_template)
        self.end_id = end_token_id(backbone.tokenizer)

    @property
    def padding_free(self) -> bool:
        """Whether training calls pack the batch's rows (``runtime.padding_free``)."""
        return self._padding_free

    @padding_free.setter
    def padding_free(self, on: bool) -> None:
        if on:
            use_packed_attention(self.backbone.model)
        self._padding_free = on

    # ---------------------------------------------------------------- data

    def encode(self, examples: list[Example]) -> Encoded:
        """Prompt + response ids, scored on the response (training and teacher-forced evaluation)."""
        return encode_instructions(self.backbone, self.format, examples, self.max_length, self.max_response_length,
                                   truncation=self.task.truncation)

    def encode_prompts(self, examples: list[Example]) -> Encoded:
        """Prompt ids alone, room left for ``max_response_length`` new tokens (generation)."""
        return encode_instructions(self.backbone, self.format, examples, self.max_length, self.max_response_length,
                                   with_response=False, truncation=self.task.truncation)

    @no_grad
    def show(self, example: Example, params: Params) -> str:
        """One example as the model sees it: the prompt, the adapter's rows where they go, then the response."""
        enc = self.encode([example])
        b = self.batch(enc, [0])
        prep = self.adapter.prepare(self.backbone, {k: v.to(self.device) for k, v in params.items()},
                                    b["input_ids"], b["attention_mask"], int(b["lead"]))
        tok = self.backbone.tokenizer
        ids, start = list(enc.input_ids[0]), int(enc.response_start[0])
        at = int(prep.insert_at if isinstance(prep.insert_at, int) else prep.insert_at[0])
        rows = [f"⟨{prep.inserted} adapter rows⟩"] if prep.inserted else []
        parts = [tok.decode(ids[:at]), *rows, tok.decode(ids[at:start]), "⟨response⟩ " + tok.decode(ids[start:])]
        return " ".join(p for p in parts if p)

    def batch(self, enc: Encoded, idx) -> dict[str, torch.Tensor]:
        """Right-padded batch tensors on the device, with CPU copies of the lengths and response starts."""
        b = super().batch(enc, idx)
        if enc.response_start is not None:
            rows = list(map(int, idx))
            b["lengths_cpu"] = torch.tensor([len(enc.input_ids[i]) for i in rows])
            b["response_start_cpu"] = torch.as_tensor(enc.response_start[rows])
        return b

    # ---------------------------------------------------------------- scoring

    def outputs(self, params: Params, batch: dict[str, torch.Tensor], static: Params | None = None) -> TokenScores:
        """Logits of the positions that predict a response token (LM head on those rows only); with
        ``padding_free``, of the batch's rows packed into one sequence (training calls)."""
        return self._scores(params, batch, static, pack=self.padding_free)

    def _scores(self, params: Params, batch: dict[str, torch.Tensor], static: Params | None,
                pack: bool) -> TokenScores:
        params, prep = self._prepare(params, batch)
        if prep.text is not None:
            raise ValueError("method.adapter: a frozen-text key/value cache (suffix placement) is for "
                             "classification; use the prefix placement on generation tasks")
        rows = prep.embeds.shape[0]
        labels = response_labels(batch).repeat(rows // batch["input_ids"].shape[0], 1)
        labels = insert_ignored(labels, prep.insert_at, prep.inserted)
        target = labels[:, 1:]
        row, pos = scored_positions(batch, rows, prep.insert_at, prep.inserted, target)
        read_row, read_pos = row, pos
        if pack and "lengths_cpu" in batch and rows == batch["input_ids"].shape[0]:  # not a stacked population
            if prep.inserted or prep.extra:
                raise ValueError(f"runtime.padding_free: adapter '{self.adapter.name}' puts rows or a key/value "
                                 "cache before the tokens; packing needs an adapter that inserts none")
            prep, starts = packed(prep, batch["lengths_cpu"])
            read_row, read_pos = torch.zeros_like(row), starts.to(pos.device)[row] + pos
        out = self._run(params, prep, batch, static=static)
        split = self.backbone.body_and_head
        with self._autocast():
            if split is None:
                logits = out.logits[read_row, read_pos]
            else:
                logits = self._head_rows(out.last_hidden_state[read_row, read_pos], params)
        return TokenScores(logits, target[row, pos], row, rows)

    def loss(self, scores: TokenScores, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy over the batch's response tokens (TRL's SFT loss)."""
        return F.cross_entropy(scores.logits.float(), scores.targets)

    def example_losses(self, scores: TokenScores) -> torch.Tensor:
        """Each row's mean response-token cross-entropy [rows] (0 for a row without response tokens)."""
        nll = F.cross_entropy(scores.logits.float(), scores.targets, reduction="none")
        total = torch.zeros(scores.rows, device=nll.device).index_add_(0, scores.row, nll)
        count = torch.zeros(scores.rows, device=nll.device).index_add_(0, scores.row, torch.ones_like(nll))
        return total / count.clamp_min(1.0)

    @no_grad
    def token_stats(self, params: Params, enc: Encoded, batch_size: int = 64) -> dict[str, np.ndarray]:
        """Per example: summed response-token cross-entropy, response tokens, and tokens predicted right
        (teacher-forced greedy), as float64/int64 arrays: every loss and accuracy aggregate is a sum of these."""
        nll, count, right = np.zeros(len(enc)), np.zeros(len(enc), dtype=np.int64), np.zeros(len(enc), dtype=np.int64)
        params = {k: v.float() if v.is_floating_point() else v for k, v in params.items()}
        for start in range(0, len(enc), batch_size):
            idx = list(range(start, min(start + batch_size, len(enc))))
            # padded: one pack of a whole evaluation batch would need a mask over all its tokens
            s = self._scores(params, self.batch(enc, idx), None, pack=False).float()
            loss = F.cross_entropy(s.logits, s.targets, reduction="none").double()
            rows = s.row.cpu().numpy() + start
            np.add.at(nll, rows, loss.cpu().numpy())
            np.add.at(count, rows, 1)
            np.add.at(right, rows, (s.logits.argmax(-1) == s.targets).cpu().numpy().astype(np.int64))
        return {"nll": nll, "tokens": count, "correct": right}

    @no_grad
    def next_token_logprobs(self, params: Params, enc: Encoded, tokens: list[list[int]],
                            batch_size: int = 64) -> list[tuple[np.ndarray, int]]:
        """For each row, the log-probabilities of the candidates ``tokens[row]`` as the token at its response start
        and the greedy token there (one forward scores every candidate: single-token choices sharing a context)."""
        out: list[tuple[np.ndarray, int]] = [(np.zeros(0), -1)] * len(enc)
        params = {k: v.float() if v.is_floating_point() else v for k, v in params.items()}
        for start in range(0, len(enc), batch_size):
            idx = list(range(start, min(start + batch_size, len(enc))))
            s = self._scores(params, self.batch(enc, idx), None, pack=False).float()
            first = torch.ones_like(s.row, dtype=torch.bool)
            first[1:] = s.row[1:] != s.row[:-1]  # each row's first scored position: its response start
            logp = F.log_softmax(s.logits[first], -1)
            for j, r in enumerate(s.row[first].tolist()):
                out[start + r] = (logp[j, tokens[start + r]].double().cpu().numpy(), int(logp[j].argmax()))
        return out

    @staticmethod
    def summarise(stats: dict[str, np.ndarray], rows: np.ndarray | None = None) -> dict[str, Any]:
        """Loss (mean per response token), perplexity = exp(loss), next-token accuracy and counts over ``rows``."""
        pick = slice(None) if rows is None else np.asarray(rows, dtype=np.int64)
        n_ex = len(stats["nll"][pick])
        tokens = int(stats["tokens"][pick].sum())
        if tokens == 0:
            return {"num_examples": n_ex}
        loss = float(stats["nll"][pick].sum() / tokens)
        return {"accuracy": int(stats["correct"][pick].sum()) / tokens, "loss": loss,
                "perplexity": math.exp(min(loss, 700.0)), "num_examples": n_ex, "num_tokens": tokens}

    def evaluate(self, params: Params, enc: Encoded, batch_size: int = 64, predictions: bool = False) -> dict[str, Any]:
        """Teacher-forced loss, perplexity and next-token accuracy per response token on ``enc``."""
        if len(enc) == 0:
            return {"num_examples": 0}
        stats = self.token_stats(params, enc, batch_size)
        return self.summarise(stats) | ({"predictions": stats} if predictions else {})

    def evaluate_parts(self, params: Params, enc: Encoded, parts: list[np.ndarray],
                       batch_size: int = 64) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``evaluate`` on ``enc`` (with its per-example token sums) and on each subset of its rows, from one pass."""
        stats = self.token_stats(params, enc, batch_size) if len(enc) else None
        if stats is None:
            return {"num_examples": 0}, [{"num_examples": 0} for _ in parts]
        return self.summarise(stats) | {"predictions": stats}, [self.summarise(stats, p) for p in parts]

    # ---------------------------------------------------------------- generation

    def generate(self, params: Params, prompts: Encoded, max_new_tokens: int, batch_size: int = 16,
                 static: Params | None = None) -> list[list[int]]:
        """Greedy completions (token ids, the end token excluded) of encoded prompts (``model.decoding``)."""
        from fedpeft.model.decoding import greedy

        return greedy(self, params, prompts, max_new_tokens, batch_size, static)

    def stacks_calls(self, passes: int | None) -> bool:
        """Vectorised clients share forwards on classification only."""
        return False
