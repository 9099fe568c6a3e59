"""Clients as domains: the sentiment-domains task, the 'domains' partition scheme and non-participants."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fedpeft.config import ConfigError, ExperimentConfig, NonParticipantConfig, TaskConfig
from fedpeft.data import domains_of, group_partition, load_task, partition, shared_data_dir, split_by_group
from fedpeft.data.participants import non_participants
from fedpeft.data.tasks.benchmarks import SST2_SPEC
from fedpeft.data.types import Example, TaskData
from fedpeft.experiment import split_clients
from fedpeft.resolve import load_config

DOMAINS = ["imdb", "mpqa", "mr", "sst2", "yelp"]
FOLDERS = ["IMDB", "MPQA", "MR", "SST-2", "YelpPolarity"]


def need_data() -> None:
    base = shared_data_dir()
    if base is None or not all((base / f).is_dir() for f in FOLDERS):
        pytest.skip("sentiment-domains needs shared/data/{IMDB,MPQA,MR,SST-2,YelpPolarity}")


@pytest.fixture(scope="module")
def small() -> TaskData:
    """sentiment-domains capped at 40 train / 20 test examples per domain (seed 0)."""
    need_data()
    return load_task(TaskConfig(name="sentiment-domains", max_train=40, max_test=20), 0)


def toy_task(sizes: dict[str, tuple[int, int]]) -> TaskData:
    """A two-class task whose examples carry a domain; ``sizes``: domain -> (train, test) counts."""
    def split(which: int) -> list[Example]:
        return [Example(f"{d} {i}", i % 2, group=d) for d, n in sizes.items() for i in range(n[which])]

    return TaskData("toy", ["neg", "pos"], split(0), split(1), ["bad", "good"], ["bad.", "good."])


def domains_cfg(num_clients: int, per_domain: int = 1, seed: int = 0, **np_cfg: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"seed": seed, "federation": {
        "num_clients": num_clients, "partition": {"scheme": "domains", "clients_per_domain": per_domain},
        "non_participants": np_cfg}})


def held_domains(examples: list[Example], part: np.ndarray) -> set[str | None]:
    return {examples[i].domain for i in part}


# ---------------------------------------------------------------- the task


def test_sentiment_domains_has_five_balanced_domains_with_both_labels(small: TaskData) -> None:
    data = small
    assert data.class_names == SST2_SPEC.class_names and data.label_words == SST2_SPEC.label_words
    assert data.label_descriptions == SST2_SPEC.label_descriptions
    for split, cap in ((data.train, 40), (data.test, 20)):
        assert Counter(e.domain for e in split) == dict.fromkeys(DOMAINS, cap)  # the cap is per domain
        for d in DOMAINS:
            assert {e.label for e in split if e.domain == d} == {0, 1}
    assert list(domains_of(data.train)) == sorted(domains_of(data.train))  # domain-major order
    again = load_task(TaskConfig(name="sentiment-domains", max_train=40, max_test=20), 0)
    assert again.train == data.train and again.test == data.test


def test_task_domains_picks_some_and_rejects_unknown_ones() -> None:
    need_data()
    data = load_task(TaskConfig(name="sentiment-domains", domains=["yelp", "mr"], max_train=10, max_test=10), 1)
    assert Counter(e.domain for e in data.train) == {"mr": 10, "yelp": 10}
    with pytest.raises(ConfigError, match="task.domains.*allowed: imdb, mpqa, mr, sst2, yelp"):
        load_task(TaskConfig(name="sentiment-domains", domains=["books"]), 0)


def test_task_domains_on_a_task_without_domains_is_an_error() -> None:
    with pytest.raises(ConfigError, match="task.domains"):
        load_task(TaskConfig(name="synthetic-sentiment", num_examples=40, domains=["a"]), 0)


def test_caps_apply_per_domain_and_untagged_tasks_are_unchanged() -> None:
    data = load_task(TaskConfig(name="synthetic-sentiment", num_examples=200, max_train=30), 2)
    assert len(data.train) == 30 and domains_of(data.train) is None


# ---------------------------------------------------------------- the partition


def test_group_partition_is_domain_major_disjoint_and_covering() -> None:
    groups = np.array(["b"] * 30 + ["a"] * 20 + ["c"] * 11)
    parts = group_partition(groups, 2, np.random.default_rng(0))
    assert [set(groups[p]) for p in parts] == [{"a"}, {"a"}, {"b"}, {"b"}, {"c"}, {"c"}]
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(groups.size))
    assert [p.size for p in parts] == [10, 10, 15, 15, 6, 5]
    again = group_partition(groups, 2, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_split_clients_gives_each_client_one_domain_in_train_and_test() -> None:
    task = toy_task({"x": (40, 9), "w": (30, 7), "y": (20, 5)})
    train, test, domains = split_clients(task, domains_cfg(6, per_domain=2))
    assert domains == ["w", "w", "x", "x", "y", "y"]
    for k, d in enumerate(domains):
        assert held_domains(task.train, train[k]) == {d} and held_domains(task.test, test[k]) == {d}
    for parts, n in ((train, len(task.train)), (test, len(task.test))):
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert sorted(p.size for p in test[:2]) == [3, 4]  # the domain's test examples split IID, sizes within one


def test_split_clients_on_real_data(small: TaskData) -> None:
    train, test, domains = split_clients(small, domains_cfg(10, per_domain=2))
    assert domains == [d for d in DOMAINS for _ in range(2)]
    for k, d in enumerate(domains):
        assert held_domains(small.train, train[k]) == {d} and held_domains(small.test, test[k]) == {d}
        assert train[k].size == 20 and test[k].size == 10


def test_wrong_num_clients_names_the_field_and_the_expected_number() -> None:
    task = toy_task({"a": (10, 4), "b": (10, 4), "c": (10, 4)})
    with pytest.raises(ConfigError, match=r"federation.num_clients must be 6 .*got 5"):
        split_clients(task, domains_cfg(5, per_domain=2))


def test_domains_scheme_needs_a_task_with_domains() -> None:
    task = TaskData("plain", ["neg", "pos"], [Example("a", 0), Example("b", 1)], [Example("c", 0)], ["x", "y"],
                    ["x.", "y."])
    with pytest.raises(ConfigError, match="federation.partition.scheme"):
        split_clients(task, domains_cfg(2))


def test_other_schemes_ignore_domains() -> None:
    labels = np.repeat([0, 1], 50)
    cfg = ExperimentConfig().federation.partition
    plain = partition(labels, 4, cfg, np.random.default_rng(3))
    tagged = partition(labels, 4, cfg, np.random.default_rng(3), groups=np.repeat(["a", "b"], 50))
    assert all(np.array_equal(a, b) for a, b in zip(plain, tagged, strict=True))


def test_split_by_group_rejects_clients_with_several_groups() -> None:
    groups = np.array(["a", "b", "a", "b"])
    with pytest.raises(ValueError, match="train_parts"):
        split_by_group(groups, [np.arange(4)], groups, np.random.default_rng())


# ---------------------------------------------------------------- non-participants


def test_fraction_draws_a_seeded_share() -> None:
    cfg = NonParticipantConfig(fraction=0.2)
    ids = non_participants(cfg, 20, seed=7)
    assert len(ids) == 4 and ids <= set(range(20))
    assert ids == non_participants(cfg, 20, seed=7)
    assert len({non_participants(cfg, 20, seed=s) for s in range(5)}) > 1
    assert non_participants(NonParticipantConfig(), 20, seed=7) == frozenset()


def test_fold_holds_out_one_group_of_sorted_domains() -> None:
    domains = [d for d in DOMAINS for _ in range(2)]  # 5 domains in 4 folds: [imdb, mpqa], [mr], [sst2], [yelp]
    assert non_participants(NonParticipantConfig(fold=0), 10, 0, domains) == {0, 1, 2, 3}
    assert non_participants(NonParticipantConfig(fold=2), 10, 0, domains) == {6, 7}
    assert non_participants(NonParticipantConfig(fold=1, folds=2), 10, 0, domains) == {6, 7, 8, 9}
    assert non_participants(NonParticipantConfig(fold=0), 10, 99, domains) == {0, 1, 2, 3}  # no randomness
    with pytest.raises(ConfigError, match="non_participants.folds"):
        non_participants(NonParticipantConfig(fold=0, folds=6), 10, 0, domains)


def test_at_least_one_client_must_participate() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        non_participants(NonParticipantConfig(fraction=0.9), 1, 0)


@pytest.mark.parametrize(("overrides", "field"), [
    (["federation.non_participants.fraction=0.2", "federation.non_participants.fold=1"], "fraction and "
                                                                                         "non_participants.fold"),
    (["federation.non_participants.fold=4"], "non_participants.fold"),
    (["federation.non_participants.fraction=1"], "federation.non_participants.fraction"),
    (["federation.non_participants.fold=0"], "non_participants.fold needs partition.scheme 'by_column'"),
    (["federation.partition.clients_per_domain=0"], "federation.partition.clients_per_domain"),
])
def test_config_errors_name_the_field(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert field in str(info.value)


def test_config_accepts_the_domains_setting() -> None:
    cfg = load_config(None, ["task.name=sentiment-domains", "task.domains=[mr, sst2]", "federation.num_clients=4",
                             "federation.partition.scheme=domains", "federation.partition.clients_per_domain=2",
                             "federation.non_participants.fold=1", "federation.non_participants.folds=2"])
    assert cfg.task.domains == ["mr", "sst2"] and cfg.federation.non_participants.fold == 1


def test_build_experiment_reports_domains_and_non_participants(tiny_cfg) -> None:  # noqa: ANN001
    need_data()
    from fedpeft.experiment import build_experiment

    exp = build_experiment(tiny_cfg(task__name="sentiment-domains", task__max_train=8, task__max_test=4,
                                    task__num_examples=None, federation__num_clients=5,
                                    federation__partition__scheme="domains", federation__non_participants__fold=3))
    assert exp.domains == DOMAINS and exp.non_participants == {4}  # fold 3 of [imdb, mpqa], [mr], [sst2], [yelp]
    assert all(len(exp.client(k).train) == 8 and len(exp.client(k).test) == 4 for k in range(5))
