"""Task registry, ``TaskSpec`` and helpers shared by the task modules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedpeft.config import TaskConfig
from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.data.types import Example, TaskData
from fedpeft.registry import Registry

TaskLoader = Callable[[TaskConfig, int], TaskData]
TASKS: Registry[TaskLoader] = Registry("task")

SPLIT_SEED = 0  # fixed seed of train/test splits made here, independent of the experiment seed


@dataclass(frozen=True)
class TaskSpec:
    """Everything about a task except its examples."""

    name: str
    class_names: list[str]
    label_words: list[str]
    label_descriptions: list[str]
    template: str
    causal_template: str
    is_pair: bool = False
    info: dict[str, str] = field(default_factory=dict)

    def build(self, train: list[Example], test: list[Example], **info: str) -> TaskData:
        """Combine this spec with loaded splits."""
        return TaskData(
            name=self.name,
            class_names=list(self.class_names),
            train=train,
            test=test,
            label_words=list(self.label_words),
            label_descriptions=list(self.label_descriptions),
            template=self.template,
            causal_template=self.causal_template,
            is_pair=self.is_pair,
            info=self.info | info,
        )


# ---------------------------------------------------------------- shared pieces

_SENTIMENT_WORDS = ["bad", "great"]
_SENTIMENT_CLASSES = ["negative", "positive"]


def sentiment_spec(name: str, noun: str, subject: str = "it") -> TaskSpec:
    """Binary sentiment of a ``noun`` (review, phrase, ...) judging ``subject`` (the movie, ...).

    The causal template was picked by a zero-shot check with SmolLM2-135M-Instruct on 400 SST-2 dev
    examples: "In one word, the movie was (bad or great):" reached 0.78 accuracy with a median
    threshold, against 0.67 for "Sentiment (bad or great):" and 0.72 for "Sentiment (positive or negative):".
    """
    return TaskSpec(
        name=name,
        class_names=list(_SENTIMENT_CLASSES),
        label_words=list(_SENTIMENT_WORDS),
        label_descriptions=[
            f"This {noun} expresses a negative opinion; it is bad.",
            f"This {noun} expresses a positive opinion; it is great.",
        ],
        template="{text_a} It was {mask}.",
        causal_template=f"{noun.capitalize()}: {{text_a}}\nIn one word, {subject} was (bad or great):",
    )


_NLI3_CLASSES = ["entailment", "neutral", "contradiction"]
_NLI3_WORDS = ["yes", "maybe", "no"]
_NLI3_DESCRIPTIONS = [
    "The second sentence follows from the first sentence.",
    "The second sentence may or may not be true given the first sentence.",
    "The second sentence contradicts the first sentence.",
]
NLI3_MAP = {c: i for i, c in enumerate(_NLI3_CLASSES)}
NLI2_MAP = {"entailment": 0, "not_entailment": 1}
PAIR_TEMPLATE = "{text_a} ? {mask} , {text_b}"


def nli3_spec(name: str) -> TaskSpec:
    """Three-way natural language inference (MNLI, SNLI)."""
    return TaskSpec(
        name=name,
        class_names=list(_NLI3_CLASSES),
        label_words=list(_NLI3_WORDS),
        label_descriptions=list(_NLI3_DESCRIPTIONS),
        template=PAIR_TEMPLATE,
        causal_template="Premise: {text_a}\nHypothesis: {text_b}\nDoes the premise entail the hypothesis "
        "(yes, maybe or no)? Answer:",
        is_pair=True,
    )


def data_folder(cfg: TaskConfig, folder: str) -> Path:
    """The task's folder: ``task.path`` if set, else ``<shared data dir>/<folder>``; DataNotFoundError if missing."""
    if cfg.path is not None:
        path = Path(cfg.path).expanduser()
    else:
        base = shared_data_dir()
        if base is None:
            raise DataNotFoundError.for_task(cfg.name, folder, None)
        path = base / folder
    if not path.is_dir():
        raise DataNotFoundError.for_task(cfg.name, folder, path)
    return path


def need_files(folder: Path, *names: str, task: str) -> list[Path]:
    """Paths of required files in ``folder``; DataNotFoundError naming the first one missing."""
    paths = [folder / n for n in names]
    for p in paths:
        if not p.is_file():
            raise DataNotFoundError.for_task(task, folder.name, p)
    return paths


def default_label_words(names: list[str]) -> list[str]:
    """One word per class name, lower-cased: its first word, else (where first words collide, as in 'very good' and
    'very bad') its last, else the whole name."""
    words = [n.replace("_", " ").split() or [str(i)] for i, n in enumerate(names)]
    for pick in (lambda w: w[0], lambda w: w[-1], lambda w: " ".join(w)):
        out = [pick(w).lower() for w in words]
        if len(set(out)) == len(out):
            return out
    return out


def labels_of(examples: Sequence[Example]) -> np.ndarray:
    return np.fromiter((e.label for e in examples), dtype=np.int64, count=len(examples))


def groups_of(examples: Sequence[Example]) -> np.ndarray | None:
    """The examples' groups (domain, user, ...) as a string array; None when no example has one (ValueError if only
    some do)."""
    groups = [e.group for e in examples]
    if all(g is None for g in groups):
        return None
    if any(g is None for g in groups):
        raise ValueError("some examples have a group and others not; a grouped task must tag every example")
    return np.array(groups, dtype=str)


domains_of = groups_of  # the name used by multi-domain tasks


def stratified_split(
    examples: list[Example], test_fraction: float, seed: int = SPLIT_SEED
) -> tuple[list[Example], list[Example]]:
    """Stratified train/test split of a task that ships without one."""
    from sklearn.model_selection import train_test_split

    train_idx, test_idx = train_test_split(
        np.arange(len(examples)), test_size=test_fraction, stratify=labels_of(examples), random_state=seed
    )
    return [examples[i] for i in sorted(train_idx)], [examples[i] for i in sorted(test_idx)]


def plain_split(examples: list[Example], test_fraction: float, seed: int = SPLIT_SEED) -> tuple[list[Example],
                                                                                                 list[Example]]:
    """Seeded train/test split without stratification (where a class is too rare to stratify)."""
    from sklearn.model_selection import train_test_split

    train_idx, test_idx = train_test_split(np.arange(len(examples)), test_size=test_fraction, random_state=seed)
    return [examples[i] for i in sorted(train_idx)], [examples[i] for i in sorted(test_idx)]


