"""FedPepTAO's partial prompt sharing (Che et al. 2023, Alg. 1; spec §2.9–2.10) as a sharing policy.

- rounds 1..t share every layer's prompt; in round t (``warmup_rounds``) the sampled clients also report
  their layer scores ζ_{i,l} (Eq. 2–3, ``layer_scores``) and, unless the ratio is fixed, their Hessian ratio
  r_i (``hessian_ratio``); the server aggregates both with n_i weights (Eq. 4) and keeps the
  |SL| = max(1, ⌈r·L⌉) top-scored layers (``layer_orders``);
- afterwards only SL is exchanged; each device trains its own copy of the other layers (NSL) and keeps it
  as client state (``private.PrivateLayers``); global evaluation uses the server's NSL prompts frozen at
  selection time, the personalised evaluation each device's own.

Initial prompts E^0 come from the shared experiment seed, so every device derives its private copy without
communication. Works with any adapter whose tensors are per-layer ``prefix.<l>`` (deep prompts).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedpeft.adapters.deep_prompt import PREFIX, layer_of
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.lazy import lazy, no_grad
from fedpeft.rng import SERVER, numpy_rng, torch_rng
from fedpeft.sharing.base import SHARING, ClientPlan, Shapes
from fedpeft.sharing.hessian_ratio import RATIO_ESTIMATORS, RatioSettings
from fedpeft.sharing.layer_orders import LAYER_ORDERS, select_layers
from fedpeft.sharing.layer_scores import aggregate_weighted, layer_scores
from fedpeft.sharing.private import PrivateLayers

torch = lazy("torch")
F = lazy("torch.nn.functional")

SCORES = "peptao/layer_scores"  # reply tensor of the selection round
RATIO = "peptao_ratio"          # reply scalar of the selection round


class LayerSelectionSettings(BaseModel):
    """``method.sharing`` keys of ``layer_selection`` (spec §2.5–2.7, §7 A1–A8)."""

    model_config = ConfigDict(extra="forbid")
    warmup_rounds: int | None = Field(5, ge=1, description="t: all layers shared in rounds 1..t, selection in "
                                                           "round t (paper: 5 or 10); null: never select")
    ratio_estimator: str = Field("fixed", description="fixed | hessian_gap | slq_plateau (A8; the Hessian ones "
                                 "are experimental: no graded ratio on MiniLM)")
    keep_ratio: float = Field(0.5, gt=0, le=1, description="r of the fixed estimator")
    order: str = Field("score", description="score (PEPT) | random | ascending | descending")
    random_draw: int = Field(0, ge=0, description="order: random: which of the seed's independent draws")
    score_at: Literal["local", "global"] = Field(
        "local", description="score/Hessian at the client's trained prompts w_i^t or at the received global ones")
    score_batch: int = Field(8, ge=2, description="samples of the one seeded local batch (A6)")
    score_reduce: Literal["mean", "sum"] = Field("mean", description="Eq. 3 with the paper's 1/n or the code's sum")
    score_last_layer: bool = Field(True, description="false: the code leaves the last layer unscored (A5)")
    score_tokens: Literal["all", "nonpad"] = Field(
        "all", description="H_l flattened over every padded position (code, A1) or with the pad positions zeroed")
    score_eps: float = Field(1e-5, gt=0, description="epsilon added to the kernel's eigenvalues in the layer "
                                                      "score (Eq. 3)")
    max_exact_params: int = Field(2048, ge=1, description="exact Hessian up to this many prompt parameters")
    lanczos_iters: int = Field(50, ge=2, description="Lanczos iterations of the Hessian's extreme eigenvalues "
                                                     "(beyond max_exact_params)")
    lanczos_probes: int = Field(1, ge=1, description="random start vectors of the Lanczos estimate")
    gap_factor: float = Field(4.0, gt=0, description="spectral gap must exceed gap_factor·Lipschitz")

    @field_validator("ratio_estimator")
    @classmethod
    def _estimator(cls, v: str) -> str:
        return RATIO_ESTIMATORS.entry(v).name

    @field_validator("order")
    @classmethod
    def _order(cls, v: str) -> str:
        return LAYER_ORDERS.entry(v).name


@SHARING.register("layer_selection", "FedPepTAO: all layers during warm-up, then only the score-selected layers; "
                  "the others stay on each client", LayerSelectionSettings)
class LayerSelection(PrivateLayers):
    summable = False  # secure aggregation: see summable_with

    @classmethod
    def summable_with(cls, settings: LayerSelectionSettings) -> bool:
        """Under secure aggregation the layer scores ζ_{i,l} travel in the masked vector: Eq. 4 needs only their
        n_i-weighted mean, which is what the protocol reveals (quantized like the prompts, within its clipping
        range). A Hessian ratio r_i is a clear scalar, one per client: refused (only the fixed ratio composes)."""
        return settings.warmup_rounds is None or settings.ratio_estimator == "fixed"
    # ---------------------------------------------------------------- server

    def init(self, glob: Params) -> Message:
        return Message(scalars={"selected": None, "ratio": None})

    def selecting(self, state: Message, round: int) -> bool:
        """Round t selects; when round t failed (nothing applied, ``federation.on_round_failure: skip``), the next
        round that completes does, so a lost round does not leave every layer shared for the rest of the run."""
        t = self.settings.warmup_rounds
        return t is not None and round >= t and state.scalars.get("selected") is None

    def _reports(self) -> tuple[bool, bool]:
        """(scores, ratio): what the clients compute and upload in the selection round."""
        return self.settings.order == "score", self.settings.ratio_estimator != "fixed"

    def instruction_scalars(self, state: Message, round: int) -> dict[str, Any]:
        return {"select": self.selecting(state, round)}

    def report_schema(self, state: Message, round: int) -> tuple[Shapes, tuple[str, ...]]:
        if not self.selecting(state, round):
            return {}, ()
        scores, ratio = self._reports()
        return ({SCORES: (self.num_layers,)} if scores else {}), ((RATIO,) if ratio else ())

    def after_aggregate(self, glob, updates, state, round):
        """Alg. 1 lines 15–19 on the server: n_i-weighted ζ_l and r (Eq. 4), then the top ⌈r·L⌉ layers."""
        if not self.selecting(state, round):
            return state, None
        want_scores, want_ratio = self._reports()
        weights = [u.weight for u in updates]
        scores = (aggregate_weighted([u.aux_tensors[SCORES].double() for u in updates], weights)
                  if want_scores else torch.zeros(self.num_layers, dtype=torch.float64))
        ratio = (float(aggregate_weighted([float(u.scalars[RATIO]) for u in updates], weights))
                 if want_ratio else self.settings.keep_ratio)
        draw = self.settings.random_draw  # draw 0 keeps the stream name it has always had
        rng = numpy_rng(self.ctx.seed, round, SERVER, f"peptao-order/{draw}" if draw else "peptao-order")
        layers = select_layers(scores, ratio, self.settings.order, rng)
        scalars = dict(state.scalars) | {"selected": layers, "selection_round": round, "ratio": ratio}
        if want_scores:
            scalars["layer_scores"] = [float(x) for x in scores]
        keep = {k for k in glob if layer_of(k) is None or layer_of(k) in layers}
        return Message(scalars=scalars), keep

    def vectors(self, state: Message) -> dict[str, list[float]]:
        """Once selected: the aggregated layer scores (when the order uses them) and SL as a 0/1 vector."""
        out = super().vectors(state)
        if out and state.scalars.get("layer_scores") is not None:
            out["layer_scores"] = [float(x) for x in state.scalars["layer_scores"]]
        return out

    # ---------------------------------------------------------------- client

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update:
        """In the selection round: ζ_{i,l} (Eq. 2–3) and r_i (Alg. 1 l.3–10) added to the update."""
        if bool(instruction.scalars.get("select", False)):
            tensors, scalars = self.report(start if self.settings.score_at == "global" else trained, client, round)
            update.aux_tensors |= tensors
            update.scalars |= scalars
        return update

    def report(self, params: Params, client: ClientContext, round: int) -> tuple[Params, dict[str, Any]]:
        """ζ_{i,l} and r_i on one seeded local batch of min(B, n_i) samples (A6)."""
        want_scores, want_ratio = self._reports()
        n = len(client.train)
        idx = torch.randperm(n, generator=torch_rng(client.seed, round, client.client_id, "peptao-batch"))
        clf = self.ctx.objective
        batch = clf.batch(client.train, idx[: min(self.settings.score_batch, n)].tolist())
        tensors, scalars = {}, {}
        if want_scores:
            tensors[SCORES] = self.layer_scores(params, batch).float()
        if want_ratio:
            res = self.estimate_ratio(params, batch, torch_rng(client.seed, round, client.client_id, "peptao-slq"))
            scalars[RATIO] = res.ratio
            if res.lipschitz == res.lipschitz:  # not NaN
                scalars["peptao_lipschitz"] = res.lipschitz
            scalars["peptao_spectrum_max"] = res.spectrum_max
        return tensors, scalars

    @no_grad
    def layer_scores(self, params: Params, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-layer scores of one batch: hidden states of every layer's output with the prompts attached."""
        hidden = self.ctx.objective.hidden_states(params, batch)
        s = self.settings
        mask = batch["attention_mask"] if s.score_tokens == "nonpad" else None
        return layer_scores(hidden, s.score_eps, s.score_reduce, s.score_last_layer, mask)

    def estimate_ratio(self, params: Params, batch: dict[str, torch.Tensor], generator: torch.Generator):
        """r_i from the Hessian of F_i with respect to all layers' prompts (the estimator named in settings)."""
        clf = self.ctx.objective
        keys = sorted(k for k in params if k.startswith(PREFIX))
        shapes = [params[k].shape for k in keys]
        rest = {k: v.to(clf.device) for k, v in params.items() if not k.startswith(PREFIX)}
        init = self.ctx.initial_params()
        theta = torch.cat([params[k].flatten().float() for k in keys]).to(clf.device)
        theta0 = torch.cat([init[k].flatten() for k in keys]).to(clf.device)

        def loss_fn(th: torch.Tensor) -> torch.Tensor:
            ps, off = dict(rest), 0
            for k, s in zip(keys, shapes):
                ps[k] = th[off: off + s.numel()].view(s)
                off += s.numel()
            return F.cross_entropy(clf.logits(ps, batch).float(), batch["labels"])

        s = self.settings
        settings = RatioSettings(s.keep_ratio, s.max_exact_params, s.lanczos_iters, s.lanczos_probes, s.gap_factor)
        return RATIO_ESTIMATORS.get(s.ratio_estimator)(loss_fn, theta, theta0, settings, generator)


__all__ = ["LayerSelection", "LayerSelectionSettings", "RATIO", "SCORES"]
