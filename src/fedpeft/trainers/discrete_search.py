"""Discrete local token search (personalized gradient-free prompt tuning, Alg. 3, Eqs. 6-7), forward passes only.

Each of the S steps picks one prompt position t at random, takes the K vocabulary tokens whose embeddings are
nearest in cosine to the current row (Eq. 7; the current token is among them when the row is a token) and
scores all K candidate prompts in ONE batched forward through the ``BlackBox``; the lowest loss wins (Eq. 6).
Keep-current rule (spec §7.1, default): a candidate replaces the row only if its loss is strictly below the
current prompt's on the same data, so the local loss never increases; ``literal_eq6`` always replaces.

Upload (Alg. 4, ``formats.token_indices``): one index per position, the token a changed row now holds or
the sentinel |V| for rows left as received (``fedpeft.comm.token_index``): T x 16 bits. The server decodes it against
the prompt it sent. ``upload: rows`` sends the decoded rows instead (T x d floats, the same prompt): the server's
FedAvg of the rows is then a weighted sum, which secure aggregation can compute without seeing one client's tokens
(an index is not summed; one-hot vote counts would be, at T x |V| values against T x d). The trainer returns the
searched prompt with its token ids and changed rows; the format cuts the reply.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.model.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.token_indices import CHANGED, PROMPT, TOKEN_IDS, TokenIndexFormat
from fedpeft.lazy import lazy
from fedpeft.rng import numpy_rng
from fedpeft.trainers.base import PARAMS, TRAINERS, TrainerBase, TrainerContext

torch = lazy("torch")

class DiscreteSearchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(40, ge=1, description="S, local search steps per round (paper: 40)")
    candidates: int = Field(5, ge=1, description="K, nearest tokens tried per step (paper: 5)")
    acceptance: Literal["keep_current", "literal_eq6"] = Field(
        "keep_current", description="replace a row only if a candidate lowers the loss, or always (Eq. 6)")
    batch_size: int = Field(32, ge=1, description="examples per step when the local set is larger than "
                                                  "full_set_max (one minibatch shared by the step's candidates)")
    full_set_max: int = Field(64, ge=1, description="local sets up to this size are scored whole at every step")
    max_rows: int = Field(256, ge=1, description="rows per forward pass (candidates x examples)")
    upload: Literal["indices", "rows"] = Field(
        "indices", description="indices: one uint16 token id per row (Alg. 4); rows: the prompt's rows as floats, "
                               "the same average, summable under secure aggregation")


class Vocabulary:
    """e(V) with its allowed ids (special tokens excluded) and their unit-normalised rows, built once."""

    def __init__(self, table: torch.Tensor, special: list[int]) -> None:
        self.table = table
        keep = torch.ones(table.shape[0], dtype=torch.bool)
        self.special = torch.tensor(special, dtype=torch.long)
        keep[self.special] = False
        self.ids = torch.nonzero(keep).squeeze(1)
        rows = table[self.ids].double()
        self.unit = (rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)).float()

    def nearest(self, row: torch.Tensor, k: int) -> torch.Tensor:
        """The k allowed ids of highest cosine similarity to ``row`` (Eq. 7); ties go to the lower id."""
        sims = self.unit @ (row / row.norm().clamp_min(1e-12))
        order = torch.sort(-sims, stable=True).indices[:k]
        return self.ids[order]


def search(box: BlackBox, vocab: Vocabulary, prompt: torch.Tensor, data: Encoded, cfg: DiscreteSearchSettings,
           rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[float]]:
    """Alg. 3 from ``prompt`` [T, d]: returns (new prompt, changed [T] bool, token ids [T], loss per step).

    With the whole local set as data the current loss is cached (one evaluation of the starting prompt, then
    K per step); with minibatches the current prompt is scored in the same forward as the K candidates."""
    p = prompt.float().clone()
    t_len, n = p.shape[0], len(data)
    whole = n <= cfg.full_set_max
    current = float(box.losses(p, data)[0]) if whole else float("nan")
    changed = torch.zeros(t_len, dtype=torch.bool)
    tokens = torch.zeros(t_len, dtype=torch.long)
    near: dict[int, torch.Tensor] = {}  # position -> its candidates, until the row changes
    trace = []
    for _ in range(cfg.steps):
        t = int(rng.integers(t_len))
        if t not in near:
            near[t] = vocab.nearest(p[t], cfg.candidates)
        cand = near[t]
        batch = data if whole else data.subset(np.sort(rng.choice(n, min(cfg.batch_size, n), replace=False)))
        stack = p.unsqueeze(0).repeat(len(cand) + (0 if whole else 1), 1, 1)
        stack[: len(cand), t] = vocab.table[cand]
        losses = box.losses(stack, batch)
        j = int(torch.argmin(losses[: len(cand)]))
        best = float(losses[j])
        if not whole:
            current = float(losses[-1])
        if cfg.acceptance == "literal_eq6" or best < current:
            p[t] = vocab.table[cand[j]]
            changed[t], tokens[t] = True, cand[j]
            current = best
            near.pop(t)
        trace.append(current)
    return p, changed, tokens, trace


@TRAINERS.register("discrete_search", "forward-only discrete token search: S steps of K nearest-token "
                   "candidates, uint16 index upload (personalized gradient-free prompt tuning)",
                   DiscreteSearchSettings)
class DiscreteSearchTrainer(TrainerBase):
    forward_only = True
    kind = PARAMS
    summable = False  # token indices are not summed: see summable_with
    vectorised = True
    adapters = frozenset({"token_prompt"})
    scalars = ("train_loss",)
    provides = frozenset({"train_loss"})

    def __init__(self, settings: DiscreteSearchSettings, ctx: TrainerContext) -> None:
        super().__init__(settings, ctx)
        self._vocab: Vocabulary | None = None

    def _box(self, max_rows: int, client: ClientContext | None = None) -> BlackBox:
        """The black box, sharing its forwards with other clients where the runtime groups them."""
        return BlackBox(self.clf, max_rows=max_rows, param_name=PROMPT, param_dims=2,
                        gather=client.forward if client is not None else None,
                        client=client.client_id if client is not None else 0)

    def vocabulary(self) -> Vocabulary:
        if self._vocab is None:
            box = self._box(self.settings.max_rows)
            self._vocab = Vocabulary(box.embedding_table(), box.special_ids())
        return self._vocab

    @classmethod
    def summable_with(cls, settings: DiscreteSearchSettings) -> bool:
        """With ``upload: rows`` the reply is the prompt's rows, whose weighted mean is the server's FedAvg."""
        return settings.upload == "rows"

    def update_format(self) -> TokenIndexFormat:
        """The prompt down; one token index per row (Alg. 4), or the rows with ``upload: rows``, up."""
        return TokenIndexFormat(self.settings.upload, self.vocabulary)

    # ---------------------------------------------------------------- local search

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen=None, static=None, penalty=None) -> tuple[Update, Params]:
        if frozen or static or penalty:
            raise ValueError("method.trainer.name: 'discrete_search' searches whole rows; it cannot freeze parts")
        vocab = self.vocabulary()
        box = self._box(self.settings.max_rows, client)
        rng = numpy_rng(client.seed, round, client.client_id, "discrete-search")
        prompt, changed, tokens, trace = search(box, vocab, params[PROMPT], client.train, self.settings, rng)
        if len(client.train) <= self.settings.full_set_max:
            loss = trace[-1]
        else:  # the trace holds minibatch losses: report the whole local set (not counted as search queries)
            loss = float(self._box(self.settings.max_rows, client).losses(prompt, client.train)[0])
        scalars = {"train_loss": loss, "rows_changed": int(changed.sum()), **box.usage.as_dict()}
        return Update(client.client_id, {PROMPT: prompt}, client.num_examples,
                      {TOKEN_IDS: tokens, CHANGED: changed}, scalars), {}

    # ---------------------------------------------------------------- evaluation through the black box

    def evaluate(self, params: Params, data: Encoded, predictions: bool = False) -> dict[str, Any]:
        return self._box(self.ctx.eval_batch).metrics(params[PROMPT].float(), data, predictions)
