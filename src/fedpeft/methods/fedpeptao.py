"""FedPepTAO (Che et al., EMNLP 2023): deep prompts, partial layer sharing (Alg. 1) and server momentum with
control variates over client AdamW (Alg. 2), following the spec's executable form (§2.9–2.10).

Round r (spec §2.10):
- the server sends the shared slice w (all layers while r ≤ t, then only the selected layers SL, plus an
  always-shared linear head if that readout is used);
- each sampled client trains (w on SL, its own private u_i on NSL) with a fresh AdamW for E epochs,
  keeps its full prompt copy as persistent client state and uploads only the SL slice (+ n_i, T_i);
- the server runs ``aggregators.momentum_cv`` (or plain FedAvg for the baselines);
- in round t the sampled clients also report their layer scores ζ_{i,l} (Eq. 2–3) and, unless the ratio is
  fixed, their Hessian ratio r_i; the server aggregates both with n_i weights (Eq. 4), keeps the
  |SL| = max(1, ⌈r·L⌉) top-scored layers and slices its state to them (§2.9 step 6).

Initial prompts E^0 come from the shared experiment seed, so every device derives its private copy (and
w^0 for Δ_i = w − w^t) without communication. Global evaluation (``evaluate_global``) uses the global SL
prompts plus the server's copy of the NSL prompts frozen at selection time; ``client_evaluate`` is the
paper's personalised evaluation with each client's own NSL prompts.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedpeft.adapters.deep_prompt import PREFIX, layer_of
from fedpeft.aggregators import AGGREGATORS
from fedpeft.aggregators.momentum_cv import (
    MomentumCVSettings,
    MomentumState,
    init_state,
    momentum_cv_step,
    pack,
    restrict,
    unpack,
)
from fedpeft.backbones.classifier import evaluate
from fedpeft.comm.codec import WIRE_DTYPES, Message, WireSpec
from fedpeft.components import settings_of
from fedpeft.config import ExperimentConfig
from fedpeft.methods.base import PRESETS, ClientContext, Preset, ReplySchema
from fedpeft.methods.peptao.hessian import RATIO_ESTIMATORS, RatioSettings
from fedpeft.methods.peptao.layers import LAYER_ORDERS, select_layers
from fedpeft.methods.peptao.scores import aggregate_weighted, layer_scores
from fedpeft.rng import SERVER, numpy_rng, torch_rng
from fedpeft.trainers import TRAINERS, train_local

SCORES = "peptao/layer_scores"  # reply tensor of the selection round
RATIO = "peptao_ratio"          # reply scalar of the selection round
PRIVATE = "u/"                  # client state: the device's own latest full prompt copy
OPT = "opt/"                    # client state: persistent optimizer buffers (code-literal variant only)
NSL_COPY = "nsl/"               # server state: NSL prompts as of the selection round (global evaluation)


class PepTAOOptions(BaseModel):
    """``method.options`` of the FedPepTAO family (spec §2.5–2.7, §7 A1–A8)."""

    model_config = ConfigDict(extra="forbid")
    warmup_rounds: int | None = Field(5, ge=1, description="t: all layers shared in rounds 1..t, selection in "
                                                           "round t (paper: 5 or 10); null: never select")
    ratio_estimator: str = Field("fixed", description="fixed | hessian_gap | slq_plateau (A8)")
    keep_ratio: float = Field(0.5, gt=0, le=1, description="r of the fixed estimator")
    order: str = Field("score", description="score (PEPT) | random | ascending | descending")
    score_at: Literal["local", "global"] = Field(
        "local", description="score/Hessian at the client's trained prompts w_i^t or at the received global ones")
    score_batch: int = Field(8, ge=2, description="samples of the one seeded local batch (A6)")
    score_reduce: Literal["mean", "sum"] = Field("mean", description="Eq. 3 with the paper's 1/n or the code's sum")
    score_last_layer: bool = Field(True, description="false: the code leaves the last layer unscored (A5)")
    score_eps: float = Field(1e-5, gt=0)
    max_exact_params: int = Field(2048, ge=1, description="exact Hessian up to this many prompt parameters")
    lanczos_iters: int = Field(50, ge=2)
    lanczos_probes: int = Field(1, ge=1)
    gap_factor: float = Field(4.0, gt=0, description="spectral gap must exceed gap_factor·Lipschitz")

    @field_validator("ratio_estimator")
    @classmethod
    def _estimator(cls, v: str) -> str:
        return RATIO_ESTIMATORS.entry(v).name

    @field_validator("order")
    @classmethod
    def _order(cls, v: str) -> str:
        return LAYER_ORDERS.entry(v).name


def _float(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in t.items()}


class FedPepTAO:
    """Deep prompts with partial sharing and a stateful server; FedAvg-prefix and the ablations are settings."""

    def __init__(self, name: str, cfg: ExperimentConfig, experiment) -> None:
        self.name, self.cfg, self.exp = name, cfg, experiment
        self.clf = experiment.classifier
        self.optimizer = cfg.method.trainer.name
        self.trainer = settings_of(cfg.method.trainer, TRAINERS)
        self.opts = PepTAOOptions.model_validate(cfg.method.options)
        agg = settings_of(cfg.method.aggregator, AGGREGATORS)
        self.mcv: MomentumCVSettings | None = agg if isinstance(agg, MomentumCVSettings) else None
        self.combine = None if self.mcv else AGGREGATORS.get(cfg.method.aggregator.name)
        self.wire = WireSpec(cfg.method.codec.dtype)
        self.eval_batch = cfg.evaluation.batch_size
        self._init: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ shared helpers

    def initial_params(self) -> dict[str, torch.Tensor]:
        """E^0 ~ N(0, 0.02²) from the experiment seed (same on the server and on every device)."""
        if self._init is None:
            self._init = self.clf.init_params(torch_rng(self.cfg.seed, 0, SERVER, "adapter-init"))
        return {k: v.clone() for k, v in self._init.items()}

    @property
    def num_layers(self) -> int:
        return sum(1 for k in self.initial_params() if k.startswith(PREFIX))

    def _selecting(self, state: Message, round: int) -> bool:
        t = self.opts.warmup_rounds
        return t is not None and round == t and state.scalars.get("selected") is None

    def _client_reports(self) -> tuple[bool, bool]:
        """(scores, ratio): what the clients compute and upload in the selection round."""
        return self.opts.order == "score", self.opts.ratio_estimator != "fixed"

    # ------------------------------------------------------------------ server

    def server_init(self) -> Message:
        ms = init_state(self.initial_params()) if self.mcv else MomentumState(self.initial_params(), {}, {})
        return Message(tensors=pack(ms), scalars={"round": 0, "selected": None, "ratio": None})

    def _shared(self, state: Message) -> dict[str, torch.Tensor]:
        return {k[2:]: v for k, v in state.tensors.items() if k.startswith("w/")}

    def configure_round(self, state: Message, round: int, clients: list[int],
                        rng: np.random.Generator) -> dict[int, Message]:
        msg = Message(tensors=self._shared(state), scalars={"round": round, "select": self._selecting(state, round)})
        return {c: msg for c in clients}

    def reply_schema(self, state: Message) -> ReplySchema:
        shapes = {k: tuple(v.shape) for k, v in self._shared(state).items()}
        scalars = ("num_examples", "train_loss", "steps")
        if self._selecting(state, int(state.scalars.get("round", 0)) + 1):
            scores, ratio = self._client_reports()
            if scores:
                shapes[SCORES] = (self.num_layers,)
            if ratio:
                scalars += (RATIO,)
        return ReplySchema(shapes, WIRE_DTYPES[self.wire.default], scalars)

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        order = sorted(replies)
        ms = unpack(state.tensors)
        uploads = {c: _float({k: replies[c].tensors[k] for k in ms.w}) for c in order}
        n = {c: int(replies[c].scalars["num_examples"]) for c in order}
        if self.mcv:
            steps = {c: int(replies[c].scalars["steps"]) for c in order}
            ms = momentum_cv_step(ms, uploads, n, steps, self.trainer.lr, self.cfg.federation.num_clients,
                                  round, self.mcv)
        else:
            ms = MomentumState(self.combine([uploads[c] for c in order], [n[c] for c in order]), {}, {})
        scalars = dict(state.scalars) | {"round": round}
        nsl_copy = {k: v for k, v in state.tensors.items() if k.startswith(NSL_COPY)}
        if self._selecting(state, round):
            layers, info = self._select(replies, order, n, round)
            keep = {k for k in ms.w if layer_of(k) is None or layer_of(k) in layers}
            nsl_copy = {NSL_COPY + k: v for k, v in ms.w.items() if k not in keep}
            ms = restrict(ms, keep)
            scalars |= {"selected": layers, "selection_round": round, **info}
        return Message(tensors=pack(ms) | nsl_copy, scalars=scalars)

    def _select(self, replies: dict[int, Message], order: list[int], n: dict[int, int],
                round: int) -> tuple[list[int], dict]:
        """Alg. 1 lines 15–19 on the server: n_i-weighted ζ_l and r (Eq. 4), then the top ⌈r·L⌉ layers."""
        want_scores, want_ratio = self._client_reports()
        weights = [n[c] for c in order]
        scores = (aggregate_weighted([replies[c].tensors[SCORES].double() for c in order], weights)
                  if want_scores else torch.zeros(self.num_layers, dtype=torch.float64))
        ratio = (float(aggregate_weighted([float(replies[c].scalars[RATIO]) for c in order], weights))
                 if want_ratio else self.opts.keep_ratio)
        layers = select_layers(scores, ratio, self.opts.order, numpy_rng(self.cfg.seed, round, SERVER, "peptao-order"))
        info = {"ratio": ratio}
        if want_scores:
            info["layer_scores"] = [float(x) for x in scores]
        return layers, info

    def evaluate_global(self, state: Message) -> dict[str, float]:
        params = self._shared(state) | {k[len(NSL_COPY):]: v for k, v in state.tensors.items()
                                        if k.startswith(NSL_COPY)}
        return evaluate(self.clf, _float(params), self.exp.test_encoded, self.eval_batch)

    def trainable_params(self, state: Message) -> int:
        return sum(v.numel() for v in self.initial_params().values())

    # ------------------------------------------------------------------ client

    def _local_params(self, instruction: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The device's prompts: its private copy (or E^0 if never trained), shared slices from the server."""
        params = self.initial_params()
        params |= {k[len(PRIVATE):]: v.float() for k, v in client.state.tensors.items() if k.startswith(PRIVATE)}
        params |= _float(instruction.tensors)
        return params

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        round = int(instruction.scalars["round"])
        select = bool(instruction.scalars.get("select", False))
        params = self._local_params(instruction, client)
        report: tuple[dict, dict] = ({}, {})
        if select and self.opts.score_at == "global":
            report = self._selection_report(params, client, round)
        opt_state = {k[len(OPT):]: v for k, v in client.state.tensors.items() if k.startswith(OPT)}
        gen = torch_rng(client.seed, round, client.client_id, "local-train")
        result = train_local(self.clf, params, client.train, self.optimizer, self.trainer, gen,
                             optimizer_state=opt_state or None)
        if select and self.opts.score_at == "local":
            report = self._selection_report(result.params, client, round)
        state = {PRIVATE + k: v.clone() for k, v in result.params.items() if k.startswith(PREFIX)}
        state |= {OPT + k: v for k, v in (result.optimizer_state or {}).items()}
        client.state = Message(tensors=state)
        tensors = {k: result.params[k] for k in instruction.tensors} | report[0]
        return Message(tensors=tensors, scalars={"num_examples": len(client.train), "train_loss": result.mean_loss,
                                                 "steps": result.steps} | report[1])

    def _selection_report(self, params: dict[str, torch.Tensor], client: ClientContext,
                          round: int) -> tuple[dict, dict]:
        """ζ_{i,l} (Eq. 2–3) and r_i (Alg. 1 l.3–10) on one seeded local batch of min(B, n_i) samples (A6)."""
        want_scores, want_ratio = self._client_reports()
        n = len(client.train)
        idx = torch.randperm(n, generator=torch_rng(client.seed, round, client.client_id, "peptao-batch"))
        batch = self.clf.batch(client.train, idx[: min(self.opts.score_batch, n)].tolist())
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

    @torch.no_grad()
    def layer_scores(self, params: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-layer scores of one batch: hidden states of every layer's output with the prompts attached."""
        bb = self.clf.backbone
        prep = self.clf.adapter.prepare(bb, params, batch["input_ids"], batch["attention_mask"], int(batch["lead"]))
        out = bb.model(**({"inputs_embeds": prep.embeds, "attention_mask": prep.attention_mask} | prep.extra),
                       output_hidden_states=True)
        hidden = list(out.hidden_states[1:])  # outputs of layers 0..L-1 (index 0 is the embedding output)
        return layer_scores(hidden, self.opts.score_eps, self.opts.score_reduce, self.opts.score_last_layer)

    def estimate_ratio(self, params: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
                       generator: torch.Generator):
        """r_i from the Hessian of F_i with respect to all layers' prompts (the estimator named in options)."""
        keys = sorted(k for k in params if k.startswith(PREFIX))
        shapes = [params[k].shape for k in keys]
        rest = {k: v for k, v in params.items() if not k.startswith(PREFIX)}
        init = self.initial_params()
        theta = torch.cat([params[k].flatten().float() for k in keys])
        theta0 = torch.cat([init[k].flatten() for k in keys])

        def loss_fn(th: torch.Tensor) -> torch.Tensor:
            ps, off = dict(rest), 0
            for k, s in zip(keys, shapes):
                ps[k] = th[off: off + s.numel()].view(s)
                off += s.numel()
            return F.cross_entropy(self.clf.logits(ps, batch), batch["labels"])

        o = self.opts
        settings = RatioSettings(o.keep_ratio, o.max_exact_params, o.lanczos_iters, o.lanczos_probes, o.gap_factor)
        return RATIO_ESTIMATORS.get(o.ratio_estimator)(loss_fn, theta, theta0, settings, generator)

    # ------------------------------------------------------------------ federated evaluation

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        msg = Message(tensors=self._shared(state), scalars={"round": round})
        return {c: msg for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        """Personalised evaluation (spec §4.4): global SL prompts + this device's own NSL prompts."""
        metrics = evaluate(self.clf, self._local_params(instruction, client), client.test, self.eval_batch)
        return Message(scalars=metrics)


# ---------------------------------------------------------------------- presets (spec §5)


def _check_family(cfg) -> None:
    if cfg.method.adapter.name != "deep_prompt":
        raise ValueError(f"method.adapter.name: preset '{cfg.method.name}' needs 'deep_prompt', "
                         f"got '{cfg.method.adapter.name}'")
    if cfg.method.aggregator.name not in ("momentum_cv", "fedavg", "uniform"):
        raise ValueError(f"method.aggregator.name: preset '{cfg.method.name}' supports momentum_cv, fedavg or "
                         f"uniform, got '{cfg.method.aggregator.name}'")


_ADAPTER = {"name": "deep_prompt", "num_tokens": 8}
# client AdamW as in the official code (A13): lr 4e-2, betas (0.9, 0.999), wd 0.1, clip 1.0, reset every round
_ADAMW = {"name": "adamw", "lr": 4e-2, "batch_size": 8, "local_epochs": 2.0, "weight_decay": 0.1,
          "grad_clip": 1.0, "reset_optimizer": True}
_SGD = {"name": "sgd", "lr": 0.1, "batch_size": 8, "local_epochs": 2.0, "grad_clip": 1.0, "reset_optimizer": True}
_MOMD = _SGD | {"momentum": 0.9}
_SERVER = {"name": "momentum_cv", "server_lr": 1e-3, "momentum": 0.9}
_FEDAVGM = _SERVER | {"server_lr": 1.0, "momentum_input": "pseudo_grad", "base": "previous"}
_NO_SELECTION = {"warmup_rounds": None}


def _preset(name: str, description: str, trainer: dict, aggregator: dict, options: dict) -> None:
    PRESETS.add(name, Preset(
        name=name, description=description,
        method_defaults={"adapter": dict(_ADAPTER), "trainer": dict(trainer), "aggregator": dict(aggregator),
                         "codec": {"dtype": "float32"}, "options": dict(options)},
        build=lambda cfg, exp, _n=name: FedPepTAO(_n, cfg, exp),
        checks=(_check_family,),
        options=PepTAOOptions,
    ))


_preset("fedpeptao", "FedPepTAO (Che et al. 2023): deep prompts, score-selected shared layers after t warm-up "
        "rounds, client AdamW + server momentum with control variates", _ADAMW, _SERVER, {"warmup_rounds": 5})
_preset("fedavg-prefix", "P-tuning v2 + FedAvg: deep prompts on every layer, all layers exchanged",
        _ADAMW, {"name": "fedavg"}, _NO_SELECTION)
_preset("moms-adamd", "MomS+AdamD ablation: client AdamW, server momentum without control variates, all layers",
        _ADAMW, _SERVER | {"control_variates": False}, _NO_SELECTION)
_preset("momd", "MomD ablation: client SGD with momentum (reset per round), FedAvg server, all layers",
        _MOMD, {"name": "fedavg"}, _NO_SELECTION)
_preset("moms", "MomS ablation: client SGD, FedAvgM server momentum (Reddi et al.), all layers",
        _SGD, _FEDAVGM | {"control_variates": False}, _NO_SELECTION)
_preset("moms-con", "MomS+Con ablation: client SGD, server momentum + control variates, all layers",
        _SGD, _FEDAVGM | {"control_variates": True}, _NO_SELECTION)
_preset("adamd", "AdamD ablation: client AdamW (reset per round), FedAvg server, all layers",
        _ADAMW, {"name": "fedavg"}, _NO_SELECTION)
