"""The experiment of a federation of transformers Trainers: each client's data are its trainer's tokenized rows, the
backbone is the trainers' base model shared in place, the adapter is fedpeft's ``lora`` at the trainers' settings.

Rows. A trainer's ``train_dataset`` (``eval_dataset``: the client's test shard) after the trainer prepared it (TRL
tokenizes, adds the end token, truncates, drops fully masked rows): ``input_ids`` and the positions the loss scores,
from ``labels`` (-100 elsewhere: TRL's prompt-completion rows, ``completion_only_loss``), else ``completion_mask`` or
``assistant_masks``, else every token (what ``DataCollatorForLanguageModeling`` makes of a plain LM dataset). fedpeft's
encoded rows hold a response start and score every token after it (``model.language_model``), so the scored
positions must be one block at the end of the row; a row scored elsewhere (a multi-turn chat's ``assistant_only_loss``)
is refused. The task's examples are those rows decoded (prompt, response) for the records and the data's
fingerprint; training and scoring use the token ids themselves.

Pairs. A TRL ``DPOTrainer``'s rows (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) make a preference task: each
pair is prompt + chosen and prompt + rejected, cut as TRL's ``DataCollatorForPreference`` cuts them when it trains
(``DPOConfig.max_length``: ``keep_start`` keeps the first tokens, so both sequences keep the same prompt; a pair that
``keep_end`` would cut is refused, since its two sequences would then start at different prompt tokens), scored on
the response tokens (``model.preference``).

Everything else is fedpeft's ``Experiment``: ``client(c)`` is client ``c``'s rows with its trainer attached
(``ClientContext.external``, what the ``hf_trainer`` trains through), and its weight the rows' count, which the
server checks against each reply's ``num_examples`` where it holds every client's data (else it takes the replies'
word for it: a Flower server without the clients' trainers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.preference_encoding import PairEncoded
from fedpeft.backbones.shared import shared_backbone
from fedpeft.clients import ClientContext
from fedpeft.comm.lora_pairs import truncate
from fedpeft.config import ExperimentConfig
from fedpeft.data.participants import profile_of_clients
from fedpeft.data.tasks.trainers import NAME
from fedpeft.data.types import Example, TaskData
from fedpeft.experiment import Experiment
from fedpeft.lazy import lazy
from fedpeft.model import OBJECTIVES, ObjectiveSettings
from fedpeft.rng import SERVER, torch_rng
from fedpeft.trainers.hf_trainer import check_trainer

torch = lazy("torch")
IGNORE = -100


def _scored(row: dict[str, Any], n: int) -> list[bool]:
    """Which of the row's ``n`` tokens the loss scores (see the module doc)."""
    if row.get("labels") is not None:
        return [int(v) != IGNORE for v in row["labels"][:n]]
    for key in ("completion_mask", "assistant_masks"):
        if row.get(key) is not None:
            return [bool(v) for v in row[key][:n]]
    return [True] * n


def encoded_rows(dataset: Any, tokenizer: Any, what: str) -> tuple[Encoded, list[Example]]:
    """fedpeft's encoded rows of a prepared dataset and its examples, decoded; ``what`` names it in errors."""
    ids_all, starts, examples = [], [], []
    for i in range(len(dataset)):
        row = dataset[i]
        if "input_ids" not in row:
            raise ValueError(f"{what} row {i}: no input_ids; give the trainer a tokenized dataset (TRL's trainers "
                             "tokenize theirs)")
        ids = [int(t) for t in row["input_ids"]]
        if row.get("attention_mask") is not None:  # right-padded rows: their tokens only
            ids = ids[:int(sum(row["attention_mask"]))]
        scored = _scored(row, len(ids))
        start = next((j for j, s in enumerate(scored) if s), len(ids))
        if not all(scored[start:]) or any(scored[:start]):
            raise ValueError(f"{what} row {i}: the loss scores tokens in more than one block (a multi-turn "
                             "assistant_only_loss?); fedpeft scores one response at the end of a row (not "
                             "supported yet)")
        labels = row.get("labels")
        if labels is not None and any(int(labels[j]) != ids[j] for j in range(start, len(ids))):
            raise ValueError(f"{what} row {i}: its labels differ from its input_ids where they are scored; fedpeft "
                             "scores the next token of the row itself")
        start = max(start, 1)  # the first token is never predicted
        ids_all.append(ids)
        starts.append(start)
        examples.append(Example(tokenizer.decode(ids[:start]), 0, target=tokenizer.decode(ids[start:])))
    n = len(ids_all)
    enc = Encoded(ids_all, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), 0,
                  np.asarray(starts, dtype=np.int64))
    return enc, examples


def is_pair_row(row: Any) -> bool:
    """Whether a prepared row is a preference pair (TRL's ``DPOTrainer``)."""
    return isinstance(row, dict) and {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(row)


def encoded_pairs(dataset: Any, tokenizer: Any, what: str, max_length: int | None,
                  truncation_mode: str = "keep_start") -> tuple[PairEncoded, list[Example]]:
    """fedpeft's encoded pairs of a DPOTrainer's prepared dataset, cut as its collator cuts them (the module doc),
    and the pairs decoded; ``what`` names the dataset in errors."""
    chosen, rejected, starts, examples = [], [], [], []
    for i in range(len(dataset)):
        row = dataset[i]
        if not is_pair_row(row):
            raise ValueError(f"{what} row {i}: no prompt_ids, chosen_ids and rejected_ids; give the DPOTrainer a "
                             "preference dataset (TRL tokenizes it)")
        prompt = [int(t) for t in row["prompt_ids"]]
        good = prompt + [int(t) for t in row["chosen_ids"]]
        bad = prompt + [int(t) for t in row["rejected_ids"]]
        if max_length is not None and max(len(good), len(bad)) > max_length:
            if truncation_mode != "keep_start":
                raise ValueError(f"{what} row {i}: DPOConfig.truncation_mode '{truncation_mode}' cuts this pair's "
                                 "two sequences at different prompt tokens; fedpeft scores pairs that share their "
                                 "prompt: use keep_start, or a max_length that holds the pair")
            good, bad = good[:max_length], bad[:max_length]
        start = max(1, min(len(prompt), len(good), len(bad)))  # the first token is never predicted
        chosen.append(good)
        rejected.append(bad)
        starts.append(start)
        examples.append(Example(tokenizer.decode(prompt), 0, target=tokenizer.decode(good[start:]),
                                rejected=tokenizer.decode(bad[start:])))
    n = len(chosen)
    enc = PairEncoded(chosen, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), 0,
                      np.asarray(starts, dtype=np.int64), rejected_ids=rejected)
    return enc, examples


def trainer_rows(dataset: Any, trainer: Any, tokenizer: Any, what: str) -> tuple[Encoded, list[Example]]:
    """A trainer's prepared dataset as fedpeft's rows: pairs for a DPOTrainer's, single rows otherwise."""
    if len(dataset) and is_pair_row(dataset[0]):
        return encoded_pairs(dataset, tokenizer, what, getattr(trainer.args, "max_length", None),
                             str(getattr(trainer.args, "truncation_mode", "keep_start")))
    return encoded_rows(dataset, tokenizer, what)


def _concat(parts: list[Encoded], pairs: bool) -> Encoded:
    ids = [r for p in parts for r in p.input_ids]
    starts = np.concatenate([p.response_start for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    n = len(ids)
    base = (ids, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), 0, starts.astype(np.int64))
    if pairs:
        return PairEncoded(*base, rejected_ids=[r for p in parts for r in p.rejected_ids])
    return Encoded(*base)


def eval_set(trainer: Any) -> Any:
    """The trainer's prepared evaluation dataset, or None; a dict of several is refused."""
    ds = trainer.eval_dataset
    if isinstance(ds, dict):
        raise ValueError("trainer: eval_dataset is a dict of datasets; give each client one eval_dataset (its "
                         "test shard)")
    return ds


@dataclass
class TrainerExperiment(Experiment):
    """An ``Experiment`` whose clients' data are their trainers' rows, and whose clients train through them."""

    trainers: dict[int, Any] = field(default_factory=dict)  # client id -> its transformers Trainer in this process

    def client(self, client_id: int) -> ClientContext:
        ctx = super().client(client_id)
        ctx.external = self.trainers.get(client_id)
        return ctx

    def client_weights(self) -> dict[int, int] | None:  # type: ignore[override]
        """Each client's row count where this process holds every client's trainer, else None (the server then
        takes each reply's ``num_examples``)."""
        if set(self.trainers) != set(range(self.num_clients)):
            return None
        return super().client_weights()


def trainer_experiment(cfg: ExperimentConfig, trainers: dict[int, Any], server: Any = None) -> TrainerExperiment:
    """The experiment of ``cfg`` over ``trainers`` (client id -> trainer: all of them embedded, a node's own under
    Flower; client ids without a trainer here have no rows here). ``server``: a trainer of the same model that a
    server without the clients' trainers holds instead (the backbone and adapter come from it, the global test set
    is its ``eval_dataset``)."""
    num = cfg.federation.num_clients
    outside = sorted(c for c in trainers if not 0 <= c < num)
    if outside:
        raise ValueError(f"trainers: client ids {outside} outside federation.num_clients ({num})")
    views = {c: check_trainer(t) for c, t in sorted(trainers.items())}
    if server is not None:
        views[SERVER] = check_trainer(server)
    if not views:
        raise ValueError("trainers: none given")
    first = min(trainers) if trainers else SERVER
    _check_same_base(views, first)
    holder = trainers.get(first, server)
    tokenizer = holder.processing_class
    if tokenizer is None:
        raise ValueError("trainer: it has no processing_class (tokenizer); fedpeft decodes the rows with it")
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    backbone = shared_backbone(views[first].base, tokenizer, cfg.model.name)
    if backbone.family != "causal":
        raise ValueError(f"model: the trainers' model is {'an' if backbone.family[0] in 'aeiou' else 'a'} "
                         f"{backbone.family} model; fedpeft federates the trainers of causal LMs for now")
    kind = cfg.task.kind if cfg.task.kind == "preference" else "generation"
    train, test, train_parts, test_parts, offsets = [], [], [], [], [0, 0]
    for c in range(num):
        t = trainers.get(c)
        tr = trainer_rows(t.train_dataset, t, tokenizer, f"client {c}'s train_dataset") if t is not None else None
        ev = eval_set(t) if t is not None else None
        te = trainer_rows(ev, t, tokenizer, f"client {c}'s eval_dataset") if ev is not None else None
        for rows, parts, out, k in ((tr, train_parts, train, 0), (te, test_parts, test, 1)):
            size = len(rows[0]) if rows is not None else 0
            parts.append(np.arange(offsets[k], offsets[k] + size, dtype=np.int64))
            offsets[k] += size
            if rows is not None:
                out.append(rows)
    if server is not None and eval_set(server) is not None:  # the server's own test set, no client's shard
        test.append(trainer_rows(eval_set(server), server, tokenizer, "the server trainer's eval_dataset"))
    pairs = [isinstance(rows, PairEncoded) for rows, _ in train + test]
    if any(p != (kind == "preference") for p in pairs):
        raise ValueError("trainers: a federation's trainers are all DPOTrainers (preference pairs) or all "
                         "SFT/Trainer ones (single rows), their eval_datasets too")
    task = TaskData(name=NAME, class_names=[], train=[e for _, ex in train for e in ex],
                    test=[e for _, ex in test for e in ex], label_words=[], label_descriptions=[], kind=kind,
                    info={"kind": kind, "source": "the clients' transformers Trainers"})
    adapter = ADAPTERS.get(cfg.method.adapter.name)(ADAPTERS.settings_of(cfg.method.adapter))
    objective = OBJECTIVES.get(kind)(backbone, adapter, task, ObjectiveSettings(
        cfg.model, cfg.task.max_length, cfg.task.max_response_length, cfg.runtime.autocast, cfg.runtime.padding_free))
    adapter.bind(AdapterContext(cfg.seed, task, objective.readout, backbone))
    fresh = objective.init_params(torch_rng(cfg.seed, 0, SERVER, "adapter-init"))
    for view in views.values():  # a lower tier's trainer holds the first r_k ranks (sharing.lora_ranks)
        view.check(truncate(fresh, view.rank) if view.rank < cfg.method.adapter.r else fresh)
    exp = TrainerExperiment(cfg.seed, cfg.attack, cfg.model.name, task, backbone, objective, train_parts, test_parts,
                            profiles=profile_of_clients(cfg.federation.client_profiles, num, cfg.seed),
                            trainers=dict(trainers))
    exp._encoded["train"] = _concat([e for e, _ in train], kind == "preference")
    exp._encoded["test"] = _concat([e for e, _ in test], kind == "preference")
    return exp


def _check_same_base(views: dict[int, Any], first: int) -> None:
    """ValueError unless every trainer's base weights are the first's (one model shared, or equal copies): FedAvg
    of LoRA factors only means something on one base model."""
    ref = dict(views[first].base.named_parameters())
    for c, view in views.items():
        if view.base is views[first].base:
            continue
        mine = dict(view.base.named_parameters())
        same = mine.keys() == ref.keys() and all(
            ".lora_" in k or (mine[k].shape == ref[k].shape and torch.equal(mine[k].detach().cpu(),
                                                                          ref[k].detach().cpu())) for k in ref)
        if not same:
            raise ValueError(f"trainers: client {c}'s base model differs from client {first}'s; every client "
                             "fine-tunes the same base weights")
