"""Deterministic synthetic tasks for fast, self-contained tests."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np

from fedpeft.config import TaskConfig
from fedpeft.data.synthetic import TOPIC_NAMES, synthetic_pair, synthetic_sentiment, synthetic_topic
from fedpeft.data.tasks.base import (
    PAIR_TEMPLATE,
    TASKS,
    TaskLoader,
    TaskSpec,
    plain_split,
    sentiment_spec,
    stratified_split,
)
from fedpeft.data.tasks.preference import preference_task
from fedpeft.data.types import Example, TaskData

# ---------------------------------------------------------------- synthetic tasks

SYNTHETIC_SENTIMENT_SPEC = sentiment_spec("synthetic-sentiment", "sentence")
SYNTHETIC_TOPIC_SPEC = TaskSpec(
    name="synthetic-topic",
    class_names=list(TOPIC_NAMES),
    label_words=list(TOPIC_NAMES),
    label_descriptions=[
        "This text is about sports, games and teams.",
        "This text is about business, markets and companies.",
        "This text is about science and research.",
        "This text is about politics, elections and government.",
    ],
    template="{text_a} This is about {mask}.",
    causal_template="Text: {text_a}\nTopic (sports, business, science or politics):",
)
SYNTHETIC_PAIR_SPEC = TaskSpec(
    name="synthetic-pair",
    class_names=["different", "same"],
    label_words=["no", "yes"],
    label_descriptions=[
        "The two sentences are about different topics.",
        "The two sentences are about the same topic.",
    ],
    template=PAIR_TEMPLATE,
    causal_template="Sentence 1: {text_a}\nSentence 2: {text_b}\nSame topic (yes or no)? Answer:",
    is_pair=True,
)


def _synthetic(
    spec: TaskSpec, generate: Callable[[int, np.random.Generator], list[Example]]
) -> TaskLoader:
    """Loader generating ``cfg.num_examples`` examples from the seed, split by ``test_fraction``."""

    def load(cfg: TaskConfig, seed: int) -> TaskData:
        examples = generate(cfg.num_examples, np.random.default_rng([seed, zlib.crc32(spec.name.encode())]))
        if len(examples) < 2 * len(spec.class_names):
            raise ValueError(f"task.num_examples ({cfg.num_examples}) is too small for {spec.name}")
        train, test = stratified_split(examples, cfg.test_fraction, seed)
        return spec.build(train, test, generator=f"seed {seed}")

    return load


TASKS.add(
    "synthetic-sentiment",
    _synthetic(SYNTHETIC_SENTIMENT_SPEC, synthetic_sentiment),
    "synthetic binary sentiment: majority polarity of cue words among filler",
)
TASKS.add(
    "synthetic-topic",
    _synthetic(SYNTHETIC_TOPIC_SPEC, synthetic_topic),
    "synthetic 4-topic classification: topic keywords among filler",
)
TASKS.add(
    "synthetic-pair",
    _synthetic(SYNTHETIC_PAIR_SPEC, synthetic_pair),
    "synthetic sentence pairs: 1 if both sentences share a topic",
)


def synthetic_preference(n: int, rng: np.random.Generator) -> list[Example]:
    """``n`` prompts of filler words, one of three groups each; the chosen reply agrees ("yes, ...") and the rejected
    one refuses ("no, ..."), both ending in the same words: a preference a tiny model can learn."""
    words = ["apple", "river", "stone", "cloud", "green", "music", "table", "light", "paper", "smile"]
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words, size=4))
        tail = " ".join(rng.choice(words, size=2))
        out.append(Example(f"please answer: {body}", 0, None, TOPIC_NAMES[i % 3], target=f"yes, {tail}",
                           rejected=f"no, {tail}"))
    return out


def _load_synthetic_preference(cfg: TaskConfig, seed: int) -> TaskData:
    examples = synthetic_preference(cfg.num_examples, np.random.default_rng([seed, zlib.crc32(b"preference")]))
    train, test = plain_split(examples, cfg.test_fraction, seed)
    return preference_task("synthetic-preference", train, test, [], Counter(), {"generator": f"seed {seed}"})


TASKS.add(
    "synthetic-preference",
    _load_synthetic_preference,
    "synthetic preference pairs: the chosen reply agrees, the rejected one refuses; three groups",
)
