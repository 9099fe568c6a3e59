"""The user's own TRL ``DPOTrainer`` as a client's local trainer: ``hf_dpo_trainer``.

The round is the ``hf_trainer``'s (``trainers.hf_trainer``): the global LoRA tensors written into the trainer's PEFT
model, the round's ``local_steps`` through its own ``train()`` (TRL's DPO loss, its reference, its collator), the
schedule, the optimizer state and the batches running on across rounds (``trainers.hf_rounds``). Scoring is the
``dpo`` trainer's (``trainers.dpo.PairScoring``) on the trainers' tokenized pairs, with the trainers' ``beta``,
``loss_type`` and ``label_smoothing``: the reward accuracy, the DPO loss, the rewards and the policy's
log-probabilities, against the same reference TRL trains against (the base model with the adapter disabled: TRL's
default for a PEFT model without ``ref_model``).

Refused (``dpo_settings``, before any round, each error naming the option), besides what ``hf_trainer`` refuses: a
``ref_model`` of the user's (fedpeft's reference is the base model without the adapter), a loss that is not one of
``sigmoid``, ``robust``, ``ipo`` alone (``loss_type`` lists; the evaluation would report another loss than the one
trained), an ``f_divergence_type`` other than ``reverse_kl``, ``ld_alpha`` and ``use_weighting`` (they reweigh the
log-probabilities that fedpeft's scoring sums).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fedpeft.trainers.base import TRAINERS
from fedpeft.trainers.dpo import LOSS_TYPES, PairScoring
from fedpeft.trainers.hf_trainer import HFTrainer, HFTrainerSettings


class HFDPOTrainerSettings(HFTrainerSettings):
    """Settings of the ``hf_dpo_trainer``: the ``hf_trainer``'s and the DPO loss its evaluation scores (federate reads
    them from the trainers' ``DPOConfig``)."""

    beta: float = Field(0.1, gt=0, description="the trainers' DPOConfig.beta (the evaluation's rewards and loss)")
    loss_type: Literal["sigmoid", "robust", "ipo"] = Field(
        "sigmoid", description="the trainers' DPOConfig.loss_type (its one entry): the evaluation's loss")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="the trainers' DPOConfig.label_smoothing (robust: "
                                                                  "the evaluation's loss)")


def dpo_settings(trainer: Any) -> dict[str, Any]:
    """The ``hf_dpo_trainer`` settings a TRL ``DPOTrainer``'s ``DPOConfig`` gives; ValueError naming what fedpeft's
    scoring cannot follow (the module doc)."""
    args = trainer.args
    losses = list(args.loss_type) if isinstance(args.loss_type, (list, tuple)) else [args.loss_type]
    refusals = [
        (getattr(trainer, "ref_model", None) is not None,
         "ref_model: fedpeft scores against the base model with the adapter disabled (TRL's reference for a PEFT "
         "model without ref_model): omit ref_model"),
        (len(losses) != 1 or losses[0] not in LOSS_TYPES,
         f"DPOConfig.loss_type {losses}: fedpeft's evaluation scores one of {', '.join(LOSS_TYPES)}"),
        (getattr(args, "f_divergence_type", "reverse_kl") != "reverse_kl",
         f"DPOConfig.f_divergence_type '{getattr(args, 'f_divergence_type', '')}': fedpeft scores reverse_kl (DPO)"),
        (getattr(args, "ld_alpha", None) is not None, "DPOConfig.ld_alpha: it reweighs the response log-probabilities "
                                                      "that fedpeft's scoring sums; leave it None"),
        (getattr(args, "use_weighting", False), "DPOConfig.use_weighting: fedpeft's scoring weighs every pair alike"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"trainer: {why}")
    return {"beta": float(args.beta), "loss_type": losses[0], "label_smoothing": float(args.label_smoothing)}


def is_dpo_trainer(trainer: Any) -> bool:
    """Whether ``trainer`` is a TRL ``DPOTrainer`` (or a subclass)."""
    try:
        from trl import DPOTrainer
    except ImportError:
        return False
    return isinstance(trainer, DPOTrainer)


@TRAINERS.register("hf_dpo_trainer", "the user's TRL DPOTrainer of each client (fedpeft.integrations.transformers): "
                                     "its train() runs the round's DPO steps on a PEFT LoRA model, schedule and "
                                     "optimizer state running on across rounds; scored as the dpo trainer scores",
                   HFDPOTrainerSettings)
class HFDPOTrainer(PairScoring, HFTrainer):
    """Local DPO through the client's own TRL ``DPOTrainer``; evaluation on preference pairs."""

    preference = True
