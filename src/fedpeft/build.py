"""One ``build(config)`` for every entry point: the embedded runtime, the Flower ServerApp and the ClientApp.

It applies the process settings (a set ``runtime.threads``; a run resolves an unset one before it builds, in
``runtime/threads.py``), builds the experiment (task, partitions, the shared backbone on ``runtime.device``) and
the method the config composes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpeft.config import ExperimentConfig
from fedpeft.experiment import Experiment, build_experiment
from fedpeft.methods import ComposedMethod, Method
from fedpeft.methods.assembly import assemble, run_facts


@dataclass
class Built:
    cfg: ExperimentConfig
    exp: Experiment
    method: Method


def build_method(cfg: ExperimentConfig, exp: Experiment) -> Method:
    return ComposedMethod(cfg.method.name, run_facts(cfg), exp, assemble(cfg, exp))


def build(cfg: ExperimentConfig, experiment: Experiment | None = None) -> Built:
    """Everything a process needs to run its part of ``cfg`` (an existing experiment may be reused)."""
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    exp = experiment or build_experiment(cfg)
    return Built(cfg, exp, build_method(cfg, exp))
