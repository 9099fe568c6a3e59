"""Direct preference optimisation as a local trainer: ``dpo`` (Rafailov et al. 2023) and its IPO and robust variants.

With the policy's and the reference's summed response log-probabilities of a pair's chosen (c) and rejected (r)
response, the implicit rewards are β (log π(c) − log π_ref(c)) and β (log π(r) − log π_ref(r)), Δ their difference
over β. The per-pair losses, as TRL's ``DPOTrainer`` computes them (``loss_type``):

- ``sigmoid``: −log σ(β Δ) (DPO, Eq. 7); with ``label_smoothing`` ε > 0 the conservative DPO of Mitchell (2023),
  −(1 − ε) log σ(β Δ) − ε log σ(−β Δ) (TRL before 1.0 wrote it so; TRL 1.x's sigmoid ignores ε);
- ``robust``: the unbiased noisy-label loss of Chowdhury et al. (2024), (−(1 − ε) log σ(β Δ) + ε log σ(−β Δ)) /
  (1 − 2ε);
- ``ipo``: (Δc / |c| − Δr / |r| − 1 / (2β))² (Azar et al. 2024, Eq. 17, with β as τ), the log-ratios averaged per
  response token as TRL does (confirmed with the IPO authors, TRL's comment says).

The reference is the frozen backbone itself (``PreferenceModel.reference``): computed in every step on the step's
batch, without gradient (``reference: per_step``, TRL's default), or once per client for all its pairs and kept in
the process (``cached``, TRL's ``precompute_ref_log_probs``). Either way the numbers of a pair do not depend on what
ran before, so a resumed run repeats them. Training is the gradient trainers' loop (``gradient.train_local``) with
this loss; evaluation reports the reward accuracy (ties count half), the DPO loss, the mean rewards and margin, the
policy's log-probabilities, and whether the policy alone makes the chosen response more likely (per sequence and per
token: the starting model's preference, where every implicit reward is zero).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fedpeft.backbones.encoding import Encoded
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.base import floats
from fedpeft.lazy import lazy
from fedpeft.rng import torch_rng
from fedpeft.trainers.base import PARAMS, TRAINERS, Penalty
from fedpeft.trainers.gradient import GradientSettings, GradientTrainer, train_local

torch = lazy("torch")
F = lazy("torch.nn.functional")

LOSS_TYPES = ("sigmoid", "robust", "ipo")


class DPOSettings(GradientSettings):
    """Settings of the ``dpo`` trainer: the gradient trainers' (learning rate, batch of pairs, steps, ...), the
    optimizer, and the preference loss."""

    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="the optimizer (TRL's default: AdamW)")
    beta: float = Field(0.1, gt=0, description="beta: the strength of the KL tie to the reference (TRL: 0.1)")
    loss_type: Literal["sigmoid", "robust", "ipo"] = Field(
        "sigmoid", description="sigmoid: DPO (conservative DPO with label_smoothing); robust: the noisy-label "
                               "unbiased loss; ipo: IPO's squared loss, beta as its tau")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="epsilon: the assumed share of flipped "
                                                                  "preference labels (sigmoid, robust)")
    reference: Literal["per_step", "cached"] = Field(
        "per_step", description="the reference log-probabilities: computed on every step's batch, or once per "
                                "client for all its pairs and kept (TRL's precompute_ref_log_probs)")

    @model_validator(mode="after")
    def _ipo_smoothing(self) -> DPOSettings:
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError("method.trainer.label_smoothing: IPO's loss has no label smoothing; leave it at 0")
        return self


def dpo_losses(policy: Any, reference: Any, beta: float, loss_type: str = "sigmoid",
               label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-pair losses [b] from the policy's and the reference's ``PairLogps`` (the equations of the module doc)."""
    chosen = policy.chosen - reference.chosen
    rejected = policy.rejected - reference.rejected
    if loss_type == "ipo":
        delta = chosen / policy.chosen_tokens.clamp(min=1.0) - rejected / policy.rejected_tokens.clamp(min=1.0)
        return (delta - 1 / (2 * beta)) ** 2
    z, eps = beta * (chosen - rejected), label_smoothing
    if loss_type == "sigmoid":
        return -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)
    if loss_type == "robust":
        return (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)
    raise ValueError(f"method.trainer.loss_type: unknown '{loss_type}'; allowed: {', '.join(LOSS_TYPES)}")


class _Logps:
    """``PairLogps``-shaped view of per-pair numpy arrays (the rows ``rows``), as tensors."""

    def __init__(self, stats: dict[str, np.ndarray], rows: Any = slice(None), device: Any = "cpu",
                 dtype: Any = None) -> None:
        for k in ("chosen", "rejected", "chosen_tokens", "rejected_tokens"):
            setattr(self, k, torch.as_tensor(stats[k][rows], dtype=dtype or torch.float64, device=device))


def fingerprint(data: Encoded) -> str:
    """A digest of encoded pairs' token ids: what the reference's numbers of them depend on."""
    h = hashlib.sha1()
    for rows in (data.input_ids, getattr(data, "rejected_ids", [])):
        h.update(np.asarray([len(r) for r in rows], dtype=np.int64).tobytes())
        h.update(np.asarray([t for r in rows for t in r], dtype=np.int64).tobytes())
    h.update(np.asarray(data.response_start, dtype=np.int64).tobytes())
    return h.hexdigest()


def pair_metrics(policy: dict[str, np.ndarray], reference: dict[str, np.ndarray], cfg: DPOSettings
                 ) -> dict[str, np.ndarray]:
    """Per-pair numbers whose means are the evaluation's metrics: ``accuracy`` (1 when the chosen response's
    implicit reward is above the rejected one's, ½ when equal), ``loss``, ``reward_chosen``, ``reward_rejected``,
    ``reward_margin``, the policy's ``logp_chosen`` and ``logp_rejected``, and ``logp_preference`` (per sequence)
    and ``logp_preference_per_token``: the policy alone ranks the chosen response above (ties ½)."""
    pol, ref = _Logps(policy), _Logps(reference)
    loss = dpo_losses(pol, ref, cfg.beta, cfg.loss_type, cfg.label_smoothing).numpy()
    good = cfg.beta * (policy["chosen"] - reference["chosen"])
    bad = cfg.beta * (policy["rejected"] - reference["rejected"])
    ranked = lambda a, b: (a > b) + 0.5 * (a == b)  # noqa: E731
    per_token = (policy["chosen"] / np.maximum(policy["chosen_tokens"], 1),
                 policy["rejected"] / np.maximum(policy["rejected_tokens"], 1))
    return {"accuracy": ranked(good, bad), "loss": loss, "reward_chosen": good, "reward_rejected": bad,
            "reward_margin": good - bad, "logp_chosen": policy["chosen"], "logp_rejected": policy["rejected"],
            "logp_preference": ranked(policy["chosen"], policy["rejected"]),
            "logp_preference_per_token": ranked(*per_token)}


class PairScoring:
    """The evaluation of a preference trainer: the policy's per-pair log-probabilities against the reference's
    (computed once per set of pairs in this process), scored by ``pair_metrics`` with the trainer's ``beta``,
    ``loss_type`` and ``label_smoothing``. Shared by ``dpo`` and ``hf_dpo_trainer``."""

    clf: Any
    ctx: Any
    settings: Any

    def _reference(self, data: Encoded) -> dict[str, np.ndarray]:
        """The reference's per-pair log-probabilities of ``data``, computed once per set of pairs in this process
        (in ``pair_logps``'s fixed batches: the same numbers whenever they are computed)."""
        cached = self.__dict__.setdefault("_cached", {})
        key = fingerprint(data)
        if key not in cached:
            cached[key] = self.clf.pair_logps(None, data, self.ctx.eval_batch)
        return cached[key]

    def _stats(self, params: Params, data: Encoded) -> dict[str, np.ndarray]:
        policy = self.clf.pair_logps(floats(params), data, self.ctx.eval_batch)
        reference = self._reference(data)
        return pair_metrics(policy, reference, self.settings)

    def evaluate(self, params: Params, data: Encoded, predictions: bool = False) -> dict[str, Any]:
        if len(data) == 0:
            return {"num_examples": 0}
        stats = self._stats(params, data)
        return self.clf.summarise(stats) | ({"predictions": stats} if predictions else {})

    def evaluate_parts(self, params: Params, data: Encoded,
                       parts: list[np.ndarray]) -> tuple[dict[str, float], list[dict[str, float]]]:
        if len(data) == 0:
            return {"num_examples": 0}, [{"num_examples": 0} for _ in parts]
        stats = self._stats(params, data)
        return self.clf.summarise(stats) | {"predictions": stats}, [self.clf.summarise(stats, p) for p in parts]


@TRAINERS.register("dpo", "direct preference optimisation (DPO; IPO, robust and conservative variants) of the "
                          "adapter against the frozen backbone as reference", DPOSettings)
class DPOTrainer(PairScoring, GradientTrainer):
    """Local DPO on a client's preference pairs (``model.preference``); the update is the trained tensors."""

    kind = PARAMS
    vectorised = False
    preference = True

    @property
    def optimizer(self) -> str:  # type: ignore[override]
        return self.settings.optimizer

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen: dict[str, torch.Tensor] | None = None,
            static: Params | None = None, penalty: Penalty | None = None) -> tuple[Update, Params]:
        cfg, clf = self.settings_for(client), self.clf
        cached = None
        if cfg.reference == "cached":
            if static is not None:
                raise ValueError("method.trainer.reference: 'cached' keeps the reference of the unchanged backbone; "
                                 "this client's backbone weights change (head pruning): use per_step")
            cached = self._reference(client.train)

        def batch_of(data: Encoded, idx: list[int]) -> dict[str, Any]:
            batch = clf.batch(data, idx)
            batch["reference"] = (_Logps(cached, idx, clf.device, torch.float32) if cached is not None
                                  else clf.reference_logps(batch, static))  # before any weight is held
            return batch

        def loss_of(outputs, batch: dict[str, Any]) -> torch.Tensor:
            return dpo_losses(outputs, batch["reference"], cfg.beta, cfg.loss_type, cfg.label_smoothing).mean()

        gen = torch_rng(client.seed, round, client.client_id, "local-train")
        res = train_local(clf, params, client.train, self.optimizer, cfg, gen, state or None, frozen, static,
                          None, client.client_id, penalty, loss=loss_of, batch_of=batch_of)
        update = Update(client.client_id, res.params, client.num_examples,
                        scalars={"train_loss": res.mean_loss, "steps": res.steps})
        return update, (res.optimizer_state or {})
