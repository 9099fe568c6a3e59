"""The user's own transformers ``Trainer`` (or TRL ``SFTTrainer``) as a client's local trainer: ``hf_trainer``.

A client's ``ClientContext.external`` is its trainer (``fedpeft.integrations.transformers`` puts it there). Each round
the global LoRA tensors are written into the trainer's PEFT model by name (``adapters.peft_model``), the round's
``local_steps`` run through the trainer's own ``train()`` (its loss, collator, optimizer type, precision, callbacks),
with the schedule, the optimizer's state and the batches kept continuous across rounds (``trainers.hf_rounds``), and
the trained tensors leave the model as the update: from here on the method's exchange, the codec and the server's
checks treat it like any gradient trainer's (``kind`` params, summable: FedAvg and FedOpt, FFA-LoRA, SecAgg+,
DP-FedAvg). Scoring goes through the objective as for the gradient trainers (the language-modelling loss on the
trainers' tokenized rows), not through ``Trainer.evaluate``.

Refused (``check_trainer``, before any round, each error naming the option): a model that is not a PEFT LoRA model
(``adapters.peft_model``); a ``model_init`` (it rebuilds the model at every ``train()``); a scheduler of the user's
(``optimizers=(optimizer, scheduler)``), and ``lr_scheduler_type`` values stepped on metrics; a dataset without a
length; another ``train_sampling_strategy`` than random; ``auto_find_batch_size``, ``load_best_model_at_end``,
distributed training (several processes, DeepSpeed, FSDP). Per round (``fit``): a sharing policy that freezes part of
a tensor (head pruning), swaps backbone weights or adds a penalty: those need fedpeft's own gradient loop
(``trainers.gradient``). A client of a lower rank tier (HetLoRA, FlexLoRA: ``federation.client_profiles``) trains
with a trainer whose PEFT model has the tier's rank: it takes the first r_k ranks of what it received, and its
trained factors go back zero-padded to the global rank, as fedpeft's own trainers leave the frozen padding.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.peft_model import PeftLora
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import RANK_DIM, factor, pad, rank_of, truncate
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy
from fedpeft.rng import torch_rng
from fedpeft.trainers.base import PARAMS, TRAINERS, Penalty, TrainerBase
from fedpeft.trainers.hf_rounds import NO_SCHEDULE_STEP, round_order, run_round, step_batch

torch = lazy("torch")


class HFTrainerSettings(BaseModel):
    """Settings of the ``hf_trainer`` trainer; everything else is the user's ``TrainingArguments``."""

    model_config = ConfigDict(extra="forbid")
    local_steps: int = Field(10, ge=1, description="optimizer steps of each round: the max_steps of every round's "
                                                   "trainer.train()")
    schedule_steps: int | None = Field(
        None, ge=1, description="length in optimizer steps of the learning-rate schedule (the trainer's "
                                "lr_scheduler_type and warm-up over it), stepped to (round - 1) x local_steps when a "
                                "round starts, so that it runs on across rounds as one training (federate sets "
                                "rounds x local_steps); none: local_steps, the schedule restarted every round")
    reset_optimizer: bool = Field(False, description="a fresh optimizer state (Adam's moments) every round; false: "
                                                     "each client's optimizer state runs on across its rounds")


def check_trainer(trainer: Any) -> PeftLora:
    """ValueError naming what ``trainer`` does that a federated round cannot keep (the module doc); its PEFT view."""
    from transformers import Trainer

    if not isinstance(trainer, Trainer):
        raise ValueError(f"trainer: a {type(trainer).__name__} is not a transformers Trainer (or a TRL trainer)")
    lora = PeftLora(trainer.model)
    args = trainer.args
    scheduler_type = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    ds = trainer.train_dataset
    refusals = [
        (trainer.model_init is not None, "model_init: it builds the model anew at every train(); pass the model"),
        (trainer.lr_scheduler is not None, "optimizers: the trainer has its own lr_scheduler; fedpeft makes the "
                                           "schedule from TrainingArguments over all rounds: pass "
                                           "optimizers=(optimizer, None)"),
        (scheduler_type in NO_SCHEDULE_STEP, f"TrainingArguments.lr_scheduler_type '{scheduler_type}' steps on "
                                              "evaluation metrics, not on optimizer steps"),
        (ds is None or not hasattr(ds, "__len__"), "train_dataset: a client needs a dataset with a length (an "
                                                   "IterableDataset has none)"),
        (str(getattr(args, "train_sampling_strategy", "random")) != "random",
         f"TrainingArguments.train_sampling_strategy '{getattr(args, 'train_sampling_strategy', '')}': fedpeft "
         "draws each round's batches (a seeded shuffle per round); leave it 'random'"),
        (args.auto_find_batch_size, "TrainingArguments.auto_find_batch_size: a round's batches are fixed"),
        (args.load_best_model_at_end, "TrainingArguments.load_best_model_at_end: it would replace the round's "
                                      "trained adapter with a checkpoint"),
        (args.world_size > 1 or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled,
         "distributed training (several processes, DeepSpeed, FSDP) is not supported yet: one process per client"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"trainer: {why}")
    return lora


@TRAINERS.register("hf_trainer", "the user's transformers Trainer / TRL SFTTrainer of each client "
                                 "(fedpeft.integrations.transformers): its train() runs the round's steps on a PEFT "
                                 "LoRA model, schedule and optimizer state running on across rounds",
                   HFTrainerSettings)
class HFTrainer(TrainerBase):
    """Local training through the client's own ``transformers.Trainer``; the update is its trained LoRA tensors."""

    kind = PARAMS
    adapters = frozenset({"lora"})
    scalars = ("train_loss", "steps")
    provides = frozenset(scalars)
    external = True

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen: dict[str, torch.Tensor] | None = None,
            static: Params | None = None, penalty: Penalty | None = None) -> tuple[Update, Params]:
        trainer = client.external
        if trainer is None:
            raise ValueError(f"method.trainer.name: 'hf_trainer' trains through a transformers Trainer handed to "
                             f"fedpeft.integrations.transformers; client {client.client_id} has none in this process")
        if static is not None or penalty is not None:
            raise ValueError("method.sharing: this exchange swaps backbone weights or adds a loss penalty per client "
                             "(head pruning, HetLoRA), which a transformers Trainer's own loop cannot take; use a "
                             "fedpeft gradient trainer (adamw)")
        lora = PeftLora(trainer.model)
        glob_rank = rank_of({k: v for k, v in params.items() if factor(k)})
        tiered = glob_rank is not None and lora.rank < glob_rank  # HetLoRA / FlexLoRA: a lower tier's trainer
        if tiered:
            params, frozen = _own_rank(params, frozen or {}, lora.rank)
        lora.load(params)
        hold = _held(frozen or {}, lora.params)
        s = self.settings
        count = s.local_steps * step_batch(trainer)
        order = round_order(len(trainer.train_dataset), count, torch_rng(client.seed, round, client.client_id,
                                                                         "local-train"))
        seed = int(torch.randint(2**31 - 1, (1,), generator=torch_rng(client.seed, round, client.client_id,
                                                                      "hf-trainer")))
        total = s.schedule_steps or s.local_steps
        start = (round - 1) * s.local_steps if s.schedule_steps else 0
        try:
            for p in hold.values():
                p.requires_grad_(False)
            loss, steps, opt_state = run_round(trainer, s.local_steps, order, (total, start),
                                               {} if s.reset_optimizer else dict(state), seed)
        finally:
            for p in hold.values():
                p.requires_grad_(True)
        trained = lora.read()
        trained |= {k: params[k].detach().to(torch.float32).cpu().clone() for k in hold}
        if tiered:  # back to the global rank, the padding zero as the exchange froze it
            trained = pad(trained, glob_rank)
        update = Update(client.client_id, trained, client.num_examples, scalars={"train_loss": loss, "steps": steps})
        return update, ({} if s.reset_optimizer else opt_state)


def _own_rank(params: Params, frozen: dict[str, Any], rank: int) -> tuple[Params, dict[str, Any]]:
    """A lower tier's round (``sharing.lora_ranks``): the received factors zero-padded to the global rank, frozen
    beyond the client's own ``rank``, as the trainer's rank-``rank`` PEFT model holds them (the first ``rank`` rows
    of every A and columns of every B); ValueError if the exchange would train an entry beyond it."""
    for k, v in params.items():
        if (f := factor(k)) is not None:
            dim, mask = RANK_DIM[f], frozen.get(k)
            if mask is None or not bool(mask.narrow(dim, rank, v.shape[dim] - rank).all()):
                raise ValueError(f"method.sharing: the exchange trains '{k}' beyond this client's LoRA rank {rank} "
                                 "(its trainer's LoraConfig.r); give the trainer the tier's rank")
    return truncate(params, rank), truncate(frozen, rank)


def _held(frozen: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The live parameters that stay as received this round: whole tensors the exchange freezes (FFA-LoRA's A); a
    mask over part of a tensor is refused."""
    held = {}
    for k, mask in frozen.items():
        if not bool(mask.any()):
            continue
        if not bool(mask.all()):
            raise ValueError(f"method.sharing: the exchange freezes part of '{k}' (head pruning); the hf_trainer "
                             "freezes whole tensors only (FFA-LoRA's A): use a fedpeft gradient trainer (adamw)")
        held[k] = live[k]
    return held
