"""FedBPT (Sun et al. 2023) and the gradient-free baselines of its Table 1, as presets.

- ``fedbpt``: projected prompt z (d = 500), local CMA-ES with the perturbation-ratio loss, server-level
  CMA-ES over the client means ranked by loss with the corrected step size (spec §2.5).
- ``fedavg-bbt``: the same clients running vanilla BBT (no perturbation); the server takes the
  n_k-weighted average of the local mean, step size and covariance (spec §2.7, Fig. 2).
- ``manual-prompt``: zero-shot with the task template (no training, one round).
- ``icl``: in-context learning with up to 5 random demonstrations from the few-shot pool.

What crosses the wire (FedBPT): down (z_t, sigma_t, C_t | diag C_t | nothing, per
``method.options.covariance``); up z^k (d), the I step sizes used, and the uploaded loss: d + I + 1
floats plus framing. The projection A is never sent: every process rebuilds it from a seed derived
from the experiment seed. Clients reach the model only through ``BlackBox`` (forward only).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters import ADAPTERS
from fedpeft.adapters.identity import demonstration_ids
from fedpeft.aggregators import AGGREGATORS
from fedpeft.aggregators.server_cmaes import server_cmaes_step
from fedpeft.backbones.blackbox import BlackBox
from fedpeft.backbones.classifier import evaluate
from fedpeft.comm.codec import WIRE_DTYPES, Message, WireSpec
from fedpeft.components import settings_of
from fedpeft.config import ExperimentConfig
from fedpeft.methods.base import PRESETS, ClientContext, Preset, ReplySchema, requires
from fedpeft.perturbation import replacement_vocab, text_span
from fedpeft.rng import SERVER, derive_seed, numpy_rng
from fedpeft.trainers import TRAINERS
from fedpeft.trainers.cmaes import CMAState, local_cmaes

Covariance = Literal["full", "diagonal", "none"]


class FedBPTOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    covariance: Covariance = Field("full", description="C_t on the downlink: full d x d, its diagonal, or none "
                                                       "(C = I everywhere, spec A23)")
    server_fitness: Literal["clean", "ratio"] = Field("clean", description="uploaded loss: clean F^k (paper) "
                                                                           "or the perturbation ratio (code)")
    evaluate_start: bool = Field(False, description="clients also report the clean loss of the incoming mean")


class ICLOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_demos: int = Field(5, ge=0, le=32, description="demonstrations (paper: up to 5)")
    max_words: int = Field(40, ge=1, description="words kept of each demonstration text")


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def _cov_tensors(cov: np.ndarray, mode: Covariance) -> dict[str, torch.Tensor]:
    if mode == "full":
        return {"cov": torch.from_numpy(cov)}
    if mode == "diagonal":
        return {"cov_diag": torch.from_numpy(np.ascontiguousarray(np.diagonal(cov)))}
    return {}


def _cov_from(tensors: dict[str, torch.Tensor], d: int) -> np.ndarray:
    if "cov" in tensors:
        return _f64(tensors["cov"])
    if "cov_diag" in tensors:
        return np.diag(_f64(tensors["cov_diag"]))
    return np.eye(d)


class BlackBoxPromptTuning:
    """FedBPT (``server="cmaes"``) or FedAvg-BBT (``server="fedavg"``) over the projected prompt z."""

    def __init__(self, name: str, cfg: ExperimentConfig, experiment, server: Literal["cmaes", "fedavg"]) -> None:
        self.name, self.cfg, self.exp, self.server = name, cfg, experiment, server
        self.clf = experiment.classifier
        self.adapter_cfg = settings_of(cfg.method.adapter, ADAPTERS)
        self.clf.adapter.bind(derive_seed(cfg.seed, 0, SERVER, "projection"))  # shared A, never sent
        self.trainer = settings_of(cfg.method.trainer, TRAINERS)
        self.agg_cfg = settings_of(cfg.method.aggregator, AGGREGATORS)
        self.combine = AGGREGATORS.get(cfg.method.aggregator.name)
        self.opts = FedBPTOptions.model_validate(cfg.method.options)
        self.wire = WireSpec(cfg.method.codec.dtype)
        self.d = self.adapter_cfg.intrinsic_dim
        self.eval_rows = cfg.evaluation.batch_size
        self._perturb_data: tuple[np.ndarray, object] | None = None

    # ------------------------------------------------------------------ server

    def server_init(self) -> Message:
        """z_0 = 0, sigma_0, C_0 = I, zero paths (spec S2)."""
        st = CMAState(np.zeros(self.d), self.adapter_cfg.sigma0, np.eye(self.d))
        return self._to_message(st, 0)

    @staticmethod
    def _to_message(st: CMAState, round: int, **diag: float) -> Message:
        tensors = {"mean": torch.from_numpy(st.mean), "cov": torch.from_numpy(st.cov),
                   "ps": torch.from_numpy(st.ps), "pc": torch.from_numpy(st.pc)}
        return Message(tensors=tensors, scalars={"round": round, "sigma": float(st.sigma), "g": int(st.g), **diag})

    @staticmethod
    def _state(msg: Message) -> CMAState:
        t = msg.tensors
        return CMAState(_f64(t["mean"]), float(msg.scalars["sigma"]), _f64(t["cov"]), _f64(t["ps"]),
                        _f64(t["pc"]), int(msg.scalars["g"]))

    def configure_round(self, state: Message, round: int, clients: list[int],
                        rng: np.random.Generator) -> dict[int, Message]:
        """S5: send (z_t, sigma_t, C_t) -- C_t as configured (full / diagonal / none)."""
        st = self._state(state)
        tensors = {"mean": torch.from_numpy(st.mean), **_cov_tensors(st.cov, self.opts.covariance)}
        msg = Message(tensors=tensors, scalars={"round": round, "sigma": st.sigma})
        return {c: msg for c in clients}

    def reply_schema(self, state: Message) -> ReplySchema:
        d, dtype = self.d, WIRE_DTYPES[self.wire.default]
        scalars = ("num_examples", "train_loss")
        if self.server == "cmaes":
            return ReplySchema({"z": (d,), "sigmas": (self.trainer.iterations,), "loss": (1,)}, dtype, scalars)
        cov = {"full": {"cov": (d, d)}, "diagonal": {"cov_diag": (d,)}, "none": {}}[self.opts.covariance]
        return ReplySchema({"z": (d,), "sigma": (1,), "loss": (1,), **cov}, dtype, scalars)

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        order = sorted(replies)
        st = self._state(state)
        if self.server == "cmaes":
            step = server_cmaes_step(
                st, [_f64(replies[c].tensors["z"]) for c in order], [_f64(replies[c].tensors["sigmas"]) for c in order],
                [float(replies[c].tensors["loss"][0]) for c in order], self.trainer.popsize, self.agg_cfg,
                update_cov=self.opts.covariance != "none")
            return self._to_message(step.state, round, sigma_prime=step.sigma_prime, sigma_server=step.sigma_server)
        # FedAvg-BBT: n_k-weighted average of the local mean, sigma and covariance (spec §2.7)
        stats = [{"mean": r.tensors["z"], "sigma": r.tensors["sigma"],
                  **({k: r.tensors[k] for k in ("cov", "cov_diag") if k in r.tensors})}
                 for r in (replies[c] for c in order)]
        avg = self.combine([{k: v.double() for k, v in s.items()} for s in stats],
                           [int(replies[c].scalars["num_examples"]) for c in order])
        new = CMAState(_f64(avg["mean"]), float(avg["sigma"][0]), _cov_from(avg, self.d))
        return self._to_message(new, round)

    def evaluate_global(self, state: Message) -> dict[str, float]:
        """Final-prompt accuracy of A z_t on the global test set, through the black box."""
        box = BlackBox(self.clf, max_rows=self.eval_rows)
        acc, loss = box.accuracy(state.tensors["mean"].float(), self.exp.test_encoded)
        return {"accuracy": acc, "loss": loss, "num_examples": len(self.exp.test_encoded)}

    def trainable_params(self, state: Message) -> int:
        return self.d

    # ------------------------------------------------------------------ client

    def _perturbation_inputs(self):
        if self._perturb_data is None:
            span = text_span(self.exp.backbone, self.exp.task, self.clf.readout, self.cfg.task.max_length)
            self._perturb_data = (replacement_vocab(self.exp.backbone), span)
        return self._perturb_data

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        """C1-C10: local CMA-ES from the global state; upload z^k, the I sigmas and the loss."""
        round = int(instruction.scalars["round"])
        start = CMAState(_f64(instruction.tensors["mean"]), float(instruction.scalars["sigma"]),
                         _cov_from(instruction.tensors, self.d))
        vocab, span = self._perturbation_inputs() if self.trainer.perturb_rate > 0 else (None, None)
        box = BlackBox(self.clf, batched=self.trainer.batched, max_rows=self.trainer.max_rows)
        res = local_cmaes(box, client.train, start, self.trainer, numpy_rng(client.seed, round, client.client_id,
                                                                            "cmaes"),
                          vocab, span, evaluate_start=self.opts.evaluate_start)
        upload = res.ratio_loss if self.opts.server_fitness == "ratio" and self.trainer.perturb_rate > 0 \
            else res.clean_loss
        scalars = {"num_examples": len(client.train), "train_loss": res.clean_loss, **res.usage,
                   "final_sigma": float(res.state.sigma)}
        if self.trainer.perturb_rate > 0:
            scalars |= {"ratio_loss": res.ratio_loss, "replaced_share": res.replaced_share}
        if self.opts.evaluate_start:
            scalars["start_loss"] = res.first_loss
        z = torch.from_numpy(res.state.mean)
        loss = torch.tensor([upload], dtype=torch.float64)
        if self.server == "cmaes":
            tensors = {"z": z, "sigmas": torch.from_numpy(res.sigmas), "loss": loss}
        else:
            tensors = {"z": z, "sigma": torch.tensor([res.state.sigma], dtype=torch.float64), "loss": loss,
                       **_cov_tensors(res.state.cov, self.opts.covariance)}
        return Message(tensors=tensors, scalars=scalars)

    # ------------------------------------------------------------------ federated evaluation

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        msg = Message(tensors={"mean": state.tensors["mean"]}, scalars={"round": round})
        return {c: msg for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        if len(client.test) == 0:
            return Message(scalars={"num_examples": 0})
        box = BlackBox(self.clf, max_rows=self.eval_rows)
        acc, loss = box.accuracy(instruction.tensors["mean"].float(), client.test)
        return Message(scalars={"accuracy": acc, "loss": loss, "num_examples": len(client.test)})


class FrozenPrompt:
    """Zero-shot baselines: the global state is fixed (template only, or ICL demonstrations); no training."""

    def __init__(self, name: str, cfg: ExperimentConfig, experiment) -> None:
        self.name, self.cfg, self.exp = name, cfg, experiment
        self.clf = experiment.classifier
        self.wire = WireSpec(cfg.method.codec.dtype)
        self.eval_batch = cfg.evaluation.batch_size
        self.icl = ICLOptions.model_validate(cfg.method.options) if name == "icl" else None

    def server_init(self) -> Message:
        if self.icl is None:
            return Message(tensors={}, scalars={"round": 0})
        pool = self.exp.task.train
        rng = numpy_rng(self.cfg.seed, 0, SERVER, "icl-demos")
        k = min(self.icl.num_demos, len(pool))
        demos = [pool[int(i)] for i in rng.choice(len(pool), size=k, replace=False)]
        ids = demonstration_ids(self.exp.backbone, self.exp.task, self.clf.readout, demos, self.icl.max_words)
        return Message(tensors={"demo_ids": ids}, scalars={"round": 0, "num_demos": k})

    def configure_round(self, state, round, clients, rng) -> dict[int, Message]:
        return {c: Message(scalars={"round": round}) for c in clients}

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        return Message(scalars={"num_examples": len(client.train)})

    def reply_schema(self, state: Message) -> ReplySchema:
        return ReplySchema({}, WIRE_DTYPES[self.wire.default], ("num_examples",))

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        return Message(tensors=dict(state.tensors), scalars={**state.scalars, "round": round})

    def evaluate_global(self, state: Message) -> dict[str, float]:
        return evaluate(self.clf, dict(state.tensors), self.exp.test_encoded, self.eval_batch)

    def trainable_params(self, state: Message) -> int:
        return 0

    def configure_evaluate(self, state, round, clients) -> dict[int, Message]:
        return {c: Message(tensors=dict(state.tensors), scalars={"round": round}) for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        if len(client.test) == 0:
            return Message(scalars={"num_examples": 0})
        return Message(scalars=evaluate(self.clf, dict(instruction.tensors), client.test, self.eval_batch))


# ---------------------------------------------------------------- presets


_PROJECTED = {"name": "projected_prompt", "num_tokens": 50, "intrinsic_dim": 500, "sigma0": 1.0}

PRESETS.add("fedbpt", Preset(
    name="fedbpt",
    description="FedBPT (Sun et al. 2023): black-box prompt z via CMA-ES, perturbation loss, server-level CMA-ES",
    method_defaults={
        # paper: d = 500, L_p = 50, I = 8, lambda = 5, sigma_1 = 1; r_p = 0.5 code default (0.6 SST-2, 0.4 AG News)
        "adapter": dict(_PROJECTED),
        "trainer": {"name": "cmaes", "iterations": 8, "popsize": 5, "perturb_rate": 0.5},
        "aggregator": {"name": "server_cmaes", "sigma_rule": "eq16", "parents": "half"},
        "codec": {"dtype": "float32"},
    },
    build=lambda cfg, exp: BlackBoxPromptTuning("fedbpt", cfg, exp, "cmaes"),
    checks=(requires("adapter", "projected_prompt"), requires("trainer", "cmaes"), requires("aggregator", "server_cmaes")),
    options=FedBPTOptions,
))

PRESETS.add("fedavg-bbt", Preset(
    name="fedavg-bbt",
    description="FedAvg-BBT: local vanilla BBT (CMA-ES, no perturbation), n_k-weighted average of mean, sigma, C",
    method_defaults={
        "adapter": dict(_PROJECTED),
        "trainer": {"name": "cmaes", "iterations": 8, "popsize": 5, "perturb_rate": 0.0},
        "aggregator": {"name": "fedavg"},
        "codec": {"dtype": "float32"},
    },
    build=lambda cfg, exp: BlackBoxPromptTuning("fedavg-bbt", cfg, exp, "fedavg"),
    checks=(requires("adapter", "projected_prompt"), requires("trainer", "cmaes"), requires("aggregator", "fedavg", "uniform")),
    options=FedBPTOptions,
))

PRESETS.add("manual-prompt", Preset(
    name="manual-prompt",
    description="Manual prompt: zero-shot with the task template and label words, no training",
    method_defaults={"adapter": {"name": "template_only"}, "trainer": {"name": "no-training"},
                     "aggregator": {"name": "keep-global"}, "codec": {"dtype": "float32"}},
    build=lambda cfg, exp: FrozenPrompt("manual-prompt", cfg, exp),
    checks=(requires("adapter", "template_only"),),
))

PRESETS.add("icl", Preset(
    name="icl",
    description="In-context learning: up to 5 random few-shot demonstrations before each input, no training",
    method_defaults={"adapter": {"name": "demonstrations"}, "trainer": {"name": "no-training"},
                     "aggregator": {"name": "keep-global"}, "codec": {"dtype": "float32"}},
    build=lambda cfg, exp: FrozenPrompt("icl", cfg, exp),
    checks=(requires("adapter", "demonstrations"),),
    options=ICLOptions,
))


__all__ = ["BlackBoxPromptTuning", "FedBPTOptions", "FrozenPrompt", "ICLOptions"]
