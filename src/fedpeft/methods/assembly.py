"""Builds a method's components from its resolved ``method`` config section and hands them to ``ComposedMethod``:
each axis's registry class with its settings and its context (what it may read of the experiment), the server-side
wrappers around the aggregator in config order, and the wire format the download codec asks for; and the run facts
the method itself reads (``RunFacts``), so that no component and not the method reads the config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedpeft.adapters import ADAPTERS
from fedpeft.aggregators import AGGREGATORS, WRAPPERS, AggregatorContext
from fedpeft.comm.codec import WireSpec
from fedpeft.comm.update import Params
from fedpeft.config import EvaluationConfig, ExperimentConfig
from fedpeft.downlink import DOWNLINKS, DownlinkContext
from fedpeft.lazy import lazy
from fedpeft.post_tuning import POST_TUNING, PostTuningContext
from fedpeft.privacy import sampling_rate
from fedpeft.rng import SERVER, torch_rng
from fedpeft.selection import SELECTORS, SelectorContext
from fedpeft.exchange.stages import build as build_exchange
from fedpeft.exchange.transport import Transport
from fedpeft.sharing import SharingContext
from fedpeft.trainers import TRAINERS, TrainerContext
from fedpeft.transforms import TRANSFORMS
from fedpeft.transforms.base import TransformContext
from fedpeft.transforms.scale_delta import ScaleDelta, ScaleDeltaSettings

torch = lazy("torch")


class Shared:
    """What several components read of the frozen model, computed once: the adapter's initial tensors from the
    experiment seed (identical on the server and every client), or a finished run's global adapter
    (``method.init_from``), and e(V) as float32 on the CPU."""

    def __init__(self, classifier: Any, seed: int, init_from: str | None = None) -> None:
        self.clf, self.seed, self.init_from = classifier, seed, init_from
        self._init: Params | None = None
        self._table: torch.Tensor | None = None

    def initial_params(self) -> Params:
        if self._init is None:
            self._init = self.clf.init_params(torch_rng(self.seed, 0, SERVER, "adapter-init"))
            if self.init_from is not None:
                self._init = started_from(self.init_from, self._init)
        return {k: v.clone() for k, v in self._init.items()}

    def embedding_table(self) -> torch.Tensor:
        if self._table is None:
            self._table = self.clf.backbone.input_embeddings().weight.detach().float().cpu().clone()
        return self._table


def started_from(run_dir: str, fresh: Params) -> Params:
    """The global adapter of the last checkpoint of ``run_dir`` in place of ``fresh``; ValueError naming
    ``method.init_from`` when it is no run, has no checkpoint, or its tensors are not this adapter's."""
    from pathlib import Path

    from fedpeft.methods.state import ServerState
    from fedpeft.tracking.rundir import RunDir

    if not (Path(run_dir) / "config.yaml").is_file():
        raise ValueError(f"method.init_from: {run_dir} is not a fedpeft run directory (no config.yaml)")
    ckpt = RunDir(run_dir).load_checkpoint()
    if ckpt is None:
        raise ValueError(f"method.init_from: {run_dir} has no checkpoint yet")
    glob = ServerState.from_message(ckpt[1]).glob
    theirs = {k: tuple(v.shape) for k, v in glob.items() if k in fresh}
    mine = {k: tuple(v.shape) for k, v in fresh.items()}
    if theirs != mine:
        missing = sorted(set(mine) - set(theirs))
        wrong = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
        raise ValueError(f"method.init_from: {run_dir}'s adapter does not fit this one ("
                         + (f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}" if missing else
                            f"shapes differ: {wrong[0]} {theirs[wrong[0]]} vs {mine[wrong[0]]}")
                         + "); use the same adapter settings as that run")
    return {k: glob[k].detach().to(fresh[k].dtype).clone() for k in fresh}


@dataclass(frozen=True)
class RunFacts:
    """What the method reads of the run, derived once from the config: the run seed, the number of rounds and the
    evaluation section (what is scored and generated when)."""

    seed: int
    rounds: int
    evaluation: EvaluationConfig


def run_facts(cfg: ExperimentConfig) -> RunFacts:
    return RunFacts(cfg.seed, cfg.federation.rounds, cfg.evaluation)


@dataclass
class Components:
    """One method's components, built and bound to their contexts."""

    aggregator: Any  # the configured aggregator inside its wrappers
    trainer: Any
    selector: Any
    sharing: Any  # the exchange stage, or the chain of them (``exchange``)
    transforms: list[tuple[str, Any]]
    attacker_transforms: list[tuple[str, Any]]  # applied after the others by malicious clients only
    transport: Any  # the exchange's outermost stage: the download codec (``exchange.transport``)
    post_tuning: Any
    wire: WireSpec
    update_format: Any  # the trainer's (``fedpeft.formats``): the innermost stage of the exchange
    initial_params: Callable[[], Params]
    embedding_table: Callable[[], Any]


def assemble(cfg: ExperimentConfig, experiment: Any) -> Components:
    """The components ``cfg.method`` names, each with its settings and context."""
    m, clf = cfg.method, experiment.objective
    shared = Shared(clf, cfg.seed, m.init_from)
    adapter = ADAPTERS.settings_of(m.adapter)
    trainer_settings = TRAINERS.settings_of(m.trainer)
    head_slices = clf.adapter.head_slices(clf.backbone)
    agg_ctx = AggregatorContext(cfg.federation.num_clients, cfg.seed, trainer_settings, adapter, head_slices,
                                sampling_rate(cfg.federation, m.selector))
    aggregator = AGGREGATORS.get(m.aggregator.name)(AGGREGATORS.settings_of(m.aggregator), agg_ctx)
    for w in m.wrappers:
        aggregator = WRAPPERS.get(w.name)(WRAPPERS.settings_of(w), agg_ctx, aggregator)
    trainer = TRAINERS.get(m.trainer.name)(trainer_settings, TrainerContext(
        clf, adapter, cfg.task.max_length, aggregator.needs, cfg.evaluation.batch_size))
    selector = SELECTORS.get(m.selector.name)(SELECTORS.settings_of(m.selector), SelectorContext(
        cfg.federation.num_clients, cfg.federation.clients_per_round))
    sharing = build_exchange(m.stages(), SharingContext(
        clf, cfg.seed, shared.initial_params, head_slices, trainer_settings,
        tuple(getattr(experiment, "profiles", ()) or ()), getattr(adapter, "r", None)))
    transform_ctx = TransformContext(sampling_rate(cfg.federation, m.selector))
    transforms = [(t.name, TRANSFORMS.get(t.name)(TRANSFORMS.settings_of(t), transform_ctx)) for t in m.transforms]
    # model replacement (Bagdasaryan et al. 2020): an attacker boosts its delta by attack.boost
    boost = cfg.attack.boost
    attacker = [("scale_delta", ScaleDelta(ScaleDeltaSettings(factor=boost), transform_ctx))] if boost != 1 else []
    transport = Transport(DOWNLINKS.get(m.downlink.name)(DOWNLINKS.settings_of(m.downlink), DownlinkContext(
        shared.embedding_table, tuple(clf.backbone.tokenizer.all_special_ids), shared.initial_params,
        trainer_settings, cfg.seed)), shared.initial_params)
    post_tuning = POST_TUNING.get(m.post_tuning.name)(POST_TUNING.settings_of(m.post_tuning),
                                                      PostTuningContext(clf, cfg.evaluation.batch_size))
    return Components(aggregator, trainer, selector, sharing, transforms, attacker, transport, post_tuning,
                      WireSpec(m.codec.dtype, transport.wire_overrides()), trainer.update_format(),
                      shared.initial_params, shared.embedding_table)
