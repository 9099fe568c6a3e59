"""``hf:<dataset>[:<config>]``: any Hugging Face dataset, for users with a network."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fedpeft.config import TaskConfig
from fedpeft.data.paths import DataNotFoundError
from fedpeft.data.tasks.base import (
    PAIR_TEMPLATE,
    default_label_words,
    stratified_split,
)
from fedpeft.data.types import Example, TaskData

# ---------------------------------------------------------------- Hugging Face datasets

_HF_TEXT_COLUMNS = ("text", "sentence", "content", "review", "document", "question")
_HF_PAIR_COLUMNS = (
    ("premise", "hypothesis"),
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("passage", "question"),
)


def _hf_columns(columns: Sequence[str]) -> tuple[str, str | None, str]:
    """Autodetect (text_a, text_b, label) columns of a Hugging Face split."""
    label = next((c for c in ("label", "labels") if c in columns), None)
    if label is None:
        raise ValueError(f"no 'label' column among {list(columns)}")
    for a, b in _HF_PAIR_COLUMNS:
        if a in columns and b in columns:
            return a, b, label
    text = next((c for c in _HF_TEXT_COLUMNS if c in columns), None)
    if text is None:
        raise ValueError(f"no text column ({', '.join(_HF_TEXT_COLUMNS)}) among {list(columns)}")
    return text, None, label


def _hf_examples(split: Any, a: str, b: str | None, label: str) -> list[Example]:
    """Examples of one split, dropping unlabelled rows (label -1, as in GLUE test splits)."""
    return [
        Example(str(row[a]), int(row[label]), None if b is None else str(row[b]))
        for row in split
        if int(row[label]) >= 0
    ]


def load_hf(cfg: TaskConfig, seed: int) -> TaskData:
    """``hf:<dataset>[:<config>]`` via Hugging Face ``datasets``; test = test split if labelled, else validation."""
    try:
        import datasets  # noqa: PLC0415 (optional dependency, imported lazily)
    except ImportError:
        raise ImportError(
            f"task '{cfg.name}' needs the Hugging Face `datasets` package: pip install datasets"
        ) from None
    _, _, rest = cfg.name.partition(":")
    dataset, _, config = rest.partition(":")
    if not dataset:
        raise ValueError(f"task.name '{cfg.name}' must look like hf:<dataset>[:<config>]")
    try:
        dd = datasets.load_dataset(dataset, config or None, cache_dir=cfg.path)
    except Exception as err:  # network, hub or name problems all surface here
        raise DataNotFoundError(
            f"could not load Hugging Face dataset '{rest}' ({type(err).__name__}: {err}); "
            "it needs network access to the hub, or a local cache (task.path is used as cache_dir)"
        ) from err
    if "train" not in dd:
        raise ValueError(f"Hugging Face dataset '{rest}' has no train split (splits: {list(dd)})")
    a, b, label = _hf_columns(dd["train"].column_names)
    train = _hf_examples(dd["train"], a, b, label)
    test: list[Example] = []
    for name in ("test", "validation", "validation_matched"):
        if name in dd:
            test = _hf_examples(dd[name], a, b, label)
            if test:
                break
    if not test:
        train, test = stratified_split(train, cfg.test_fraction)
    feature = dd["train"].features.get(label)
    names = list(getattr(feature, "names", None) or [str(i) for i in range(max(e.label for e in train) + 1)])
    words = default_label_words(names)
    return TaskData(
        name=cfg.name,
        class_names=names,
        train=train,
        test=test,
        label_words=words,
        label_descriptions=[f"This example belongs to the class '{n}'." for n in names],
        template=PAIR_TEMPLATE if b else "{text_a} It was {mask}.",
        causal_template=(
            "Text 1: {text_a}\nText 2: {text_b}\nAnswer:" if b else "Text: {text_a}\nAnswer:"
        ),
        is_pair=b is not None,
        info={"source": f"huggingface:{rest}", "columns": json.dumps([a, b, label])},
    )


