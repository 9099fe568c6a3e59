"""Deterministic synthetic classification tasks, generated from a seed, for fast self-contained tests.

Sentences mix filler words with class cue words, so a bag-of-words model can learn them while a
prompt still has something to read. Classes are exactly balanced; the same seed gives the same task.
"""

from __future__ import annotations

import numpy as np

from fedpeft.data.types import Example

FILLER = (
    "the a this that it was is and of to in on with for about some very quite today people "
    "we they one just really also then here there again"
).split()

NEGATIVE_CUES = "bad terrible awful poor boring dull horrible worst".split()
POSITIVE_CUES = "good great excellent wonderful happy superb lovely best".split()

TOPIC_NAMES = ("sports", "business", "science", "politics")
TOPIC_CUES: dict[str, list[str]] = {
    "sports": "game team match coach score player league season".split(),
    "business": "market stock profit company bank trade price investor".split(),
    "science": "research study lab experiment data physics theory scientist".split(),
    "politics": "election vote government minister party law senate policy".split(),
}


def _balanced_labels(n: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` labels with class counts differing by at most one, in random order."""
    return rng.permutation(np.arange(n) % num_classes)


def _sentence(cues: list[str], rng: np.random.Generator) -> str:
    """Place ``cues`` among filler words in a sentence of 8-16 words."""
    length = int(rng.integers(8, 17))
    words = list(rng.choice(FILLER, size=length - len(cues)))
    for cue in cues:
        words.insert(int(rng.integers(0, len(words) + 1)), cue)
    return " ".join(words)


def _sentiment_example(label: int, rng: np.random.Generator) -> Example:
    """1, 3 or 5 polarity cues whose majority is ``label`` (0 negative, 1 positive)."""
    num_cues = int(rng.choice([1, 3, 5]))
    num_major = int(rng.integers(num_cues // 2 + 1, num_cues + 1))
    major, minor = (POSITIVE_CUES, NEGATIVE_CUES) if label == 1 else (NEGATIVE_CUES, POSITIVE_CUES)
    cues = list(rng.choice(major, size=num_major)) + list(rng.choice(minor, size=num_cues - num_major))
    return Example(_sentence(cues, rng), label)


def _topic_text(topic: int, rng: np.random.Generator) -> str:
    """2-4 keywords of ``topic`` plus, sometimes, one distractor keyword of another topic."""
    cues = list(rng.choice(TOPIC_CUES[TOPIC_NAMES[topic]], size=int(rng.integers(2, 5)), replace=False))
    if rng.random() < 0.3:
        other = (topic + int(rng.integers(1, len(TOPIC_NAMES)))) % len(TOPIC_NAMES)
        cues.append(str(rng.choice(TOPIC_CUES[TOPIC_NAMES[other]])))
    return _sentence(cues, rng)


def _pair_example(label: int, rng: np.random.Generator) -> Example:
    """Two topic sentences: same topic when ``label`` is 1, different topics when 0."""
    topic_a = int(rng.integers(len(TOPIC_NAMES)))
    topic_b = topic_a if label == 1 else (topic_a + int(rng.integers(1, len(TOPIC_NAMES)))) % len(TOPIC_NAMES)
    return Example(_topic_text(topic_a, rng), label, _topic_text(topic_b, rng))


def synthetic_sentiment(n: int, rng: np.random.Generator) -> list[Example]:
    """Binary sentiment: label = majority polarity of the cue words."""
    return [_sentiment_example(int(y), rng) for y in _balanced_labels(n, 2, rng)]


def synthetic_topic(n: int, rng: np.random.Generator) -> list[Example]:
    """Four topics (sports, business, science, politics) marked by keywords among filler."""
    return [Example(_topic_text(int(y), rng), int(y)) for y in _balanced_labels(n, len(TOPIC_NAMES), rng)]


def synthetic_pair(n: int, rng: np.random.Generator) -> list[Example]:
    """Sentence pairs: label 1 when text_b shares the topic of text_a."""
    return [_pair_example(int(y), rng) for y in _balanced_labels(n, 2, rng)]
