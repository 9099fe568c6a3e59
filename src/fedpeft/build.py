"""One ``build(config)`` for every entry point: the embedded runtime, the Flower ServerApp and the ClientApp; and
the run's plan (``run_plan``), what the runtime reads of the config.

``build`` applies the process settings (a set ``runtime.threads``; a run resolves an unset one before it builds,
in ``runtime/threads.py``), builds the experiment (task, partitions, the shared backbone on ``runtime.device``)
and the method the config composes. ``run_plan`` derives, once, the typed record of run facts that the round
loop, the run directory, the thread count and the tracking sinks read (torchtune's recipe reads its config the same
way: once, at the top): no runtime function takes the config itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedpeft.config import (Component, EvaluationConfig, ExperimentConfig, FaultConfig, FederationConfig,
                            RuntimeConfig, dump_config)
from fedpeft.experiment import Experiment, build_experiment
from fedpeft.methods import ComposedMethod, Method
from fedpeft.methods.assembly import assemble, run_facts
from fedpeft.resolve import generation_task, preset_differences


@dataclass
class Built:
    plan: RunPlan  # what the runtime reads of the config
    exp: Experiment
    method: Method


def build_method(cfg: ExperimentConfig, exp: Experiment) -> Method:
    return ComposedMethod(cfg.method.name, run_facts(cfg), exp, assemble(cfg, exp))


def build(cfg: ExperimentConfig, experiment: Experiment | None = None) -> Built:
    """Everything a process needs to run its part of ``cfg`` (an existing experiment may be reused)."""
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    exp = experiment or build_experiment(cfg)
    return Built(run_plan(cfg), exp, build_method(cfg, exp))


@dataclass(frozen=True)
class RunPlan:
    """What the runtime reads of a run, derived once from the resolved config by ``run_plan``: the sections the
    round loop, the run directory and the clients' settings use, the tracking sinks, config.yaml as written, and
    the facts the summary records."""

    identity: dict[str, Any]  # summary.json's first fields: method, task, model, runtime, seed
    name: str | None  # the run's display name (``name``); the tracking sinks fall back to the directory's
    seed: int
    config_yaml: str  # config.yaml as written: the data paths absolute, so that a run resumes from any folder
    config: dict[str, Any]  # the same as JSON: what the tracking sinks log and a resume compares against
    generation: bool  # a generation task (keys that only act there are compared on resume)
    federation: FederationConfig
    evaluation: EvaluationConfig
    runtime: RuntimeConfig
    faults: FaultConfig
    tracking: tuple[Component, ...]
    method_resolved: dict[str, Any]  # each axis's component and settings, as resolved
    preset_overrides: tuple[str, ...]  # the ``method`` sections that differ from the preset's


def run_plan(cfg: ExperimentConfig) -> RunPlan:
    """The run facts of a resolved config (``RunPlan``)."""
    absolute = cfg.with_absolute_paths()
    return RunPlan(
        identity={"method": cfg.method.name, "task": cfg.task.name, "model": cfg.model.name,
                  "runtime": cfg.runtime.name, "seed": cfg.seed},
        name=cfg.name, seed=cfg.seed, config_yaml=dump_config(absolute), config=absolute.model_dump(mode="json"),
        generation=generation_task(cfg.task.model_dump()), federation=cfg.federation, evaluation=cfg.evaluation,
        runtime=cfg.runtime, faults=cfg.faults, tracking=tuple(cfg.tracking), method_resolved=cfg.method.components(),
        preset_overrides=tuple(sorted(preset_differences(cfg))))
