"""Seeded partitioners: coverage, sizes, skew, determinism and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeft.config import PartitionConfig
from fedpeft.data.partition import (
    PARTITIONERS,
    dirichlet_label_partition,
    dirichlet_quantity_partition,
    few_shot_indices,
    iid_partition,
    label_histogram,
    partition,
    split_like,
    stratified_subsample,
)
from fedpeft.registry import UnknownNameError

LABELS = np.repeat(np.arange(4), [300, 200, 100, 400])  # 1,000 examples, unequal classes


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.size == n
    assert np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "dirichlet_quantity"])
def test_every_scheme_is_disjoint_covering_and_seeded(scheme: str) -> None:
    cfg = PartitionConfig(scheme=scheme, alpha=0.5, min_size=5)
    parts = partition(LABELS, 10, cfg, rng(1))
    assert len(parts) == 10
    assert_disjoint_cover(parts, LABELS.size)
    assert min(p.size for p in parts) >= 5
    again = partition(LABELS, 10, cfg, rng(1))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition(LABELS, 10, cfg, rng(2))
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_registry_names_and_unknown_scheme() -> None:
    assert PARTITIONERS.names() == ["by_column", "dirichlet", "dirichlet_quantity", "domains", "iid"]
    with pytest.raises(UnknownNameError, match="allowed: by_column, dirichlet, dirichlet_quantity, domains, iid"):
        PARTITIONERS.get("pathological")


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = iid_partition(1003, 7, rng())
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == 1003
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no duplicates


def test_dirichlet_min_size_is_respected_at_small_alpha() -> None:
    parts = dirichlet_label_partition(LABELS, 10, alpha=0.1, min_size=10, rng=rng(3))
    assert min(p.size for p in parts) >= 10
    assert_disjoint_cover(parts, LABELS.size)


def test_dirichlet_large_alpha_is_close_to_iid() -> None:
    parts = dirichlet_label_partition(LABELS, 5, alpha=1e4, min_size=1, rng=rng(4))
    hist = label_histogram(LABELS, parts, 4)
    global_share = np.bincount(LABELS) / LABELS.size
    client_share = hist / hist.sum(axis=1, keepdims=True)
    assert np.abs(client_share - global_share).max() < 0.03
    sizes = hist.sum(axis=1)
    assert sizes.max() - sizes.min() <= 0.1 * sizes.mean()


def test_dirichlet_small_alpha_is_strongly_skewed() -> None:
    labels = np.repeat(np.arange(4), 250)
    parts = dirichlet_label_partition(labels, 10, alpha=0.05, min_size=1, rng=rng(5))
    hist = label_histogram(labels, parts, 4)
    dominant_share = hist.max(axis=1) / hist.sum(axis=1)
    assert np.median(dominant_share) > 0.8  # IID would give about 0.25-0.3


def test_quantity_skew_gives_unequal_sizes_without_label_skew() -> None:
    labels = np.repeat(np.arange(2), 2000)
    parts = dirichlet_quantity_partition(labels.size, 10, alpha=0.5, min_size=20, rng=rng(6))
    sizes = np.array([p.size for p in parts])
    assert sizes.max() > 3 * sizes.min()
    hist = label_histogram(labels, parts, 2)
    big = sizes >= 200  # label shares of larger clients stay near the global 50 %
    assert big.any()
    assert np.all(np.abs(hist[big, 0] / sizes[big] - 0.5) < 0.12)


def test_impossible_min_size_raises_after_max_tries() -> None:
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_label_partition(LABELS, 10, alpha=0.01, min_size=99, rng=rng(), max_tries=5)


def test_few_shot_takes_k_per_class() -> None:
    idx = few_shot_indices(LABELS, 8, rng(7))
    assert np.array_equal(np.bincount(LABELS[idx]), [8, 8, 8, 8])
    assert np.unique(idx).size == idx.size
    assert np.array_equal(idx, few_shot_indices(LABELS, 8, rng(7)))
    assert not np.array_equal(idx, few_shot_indices(LABELS, 8, rng(8)))
    with pytest.raises(ValueError, match="k"):
        few_shot_indices(LABELS, 101, rng())  # class 2 has 100


def test_stratified_subsample_keeps_class_shares() -> None:
    idx = stratified_subsample(LABELS, 100, rng(9))
    assert idx.size == 100 and np.unique(idx).size == 100
    assert np.array_equal(np.bincount(LABELS[idx]), [30, 20, 10, 40])
    assert np.array_equal(idx, stratified_subsample(LABELS, 100, rng(9)))


def test_split_like_follows_training_label_counts() -> None:
    train_labels = np.repeat([0, 1], [100, 100])
    parts = [np.arange(0, 80), np.concatenate([np.arange(80, 100), np.arange(100, 200)])]
    # client 0: 80 x class 0; client 1: 20 x class 0 + 100 x class 1
    test_labels = np.repeat([0, 1], [50, 40])
    shards = split_like(test_labels, parts, train_labels, rng(10))
    hist = label_histogram(test_labels, shards, 2)
    assert np.array_equal(hist, [[40, 0], [10, 40]])
    assert_disjoint_cover(shards, test_labels.size)
    again = split_like(test_labels, parts, train_labels, rng(10))
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))


def test_label_histogram_counts() -> None:
    hist = label_histogram(np.array([0, 1, 1, 2]), [np.array([0, 1]), np.array([2, 3])], 3)
    assert np.array_equal(hist, [[1, 1, 0], [0, 1, 1]])


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: iid_partition(10, 0, rng()), "num_clients"),
        (lambda: iid_partition(3, 5, rng()), "num_clients"),
        (lambda: dirichlet_label_partition(LABELS, 5, alpha=0.0, min_size=1, rng=rng()), "alpha"),
        (lambda: dirichlet_label_partition(LABELS, 5, alpha=float("inf"), min_size=1, rng=rng()), "alpha"),
        (lambda: dirichlet_label_partition(LABELS, 5, alpha=1.0, min_size=-1, rng=rng()), "min_size"),
        (lambda: dirichlet_label_partition(LABELS, 5, alpha=1.0, min_size=300, rng=rng()), "min_size"),
        (lambda: dirichlet_label_partition(np.array([0.5, 1.5]), 1, alpha=1.0, min_size=1, rng=rng()), "labels"),
        (lambda: dirichlet_label_partition(LABELS, 5, alpha=1.0, min_size=1, rng=rng(), max_tries=0), "max_tries"),
        (lambda: dirichlet_quantity_partition(100, 5, alpha=-1.0, min_size=1, rng=rng()), "alpha"),
        (lambda: dirichlet_quantity_partition(0, 5, alpha=1.0, min_size=1, rng=rng()), "n"),
        (lambda: few_shot_indices(LABELS, 0, rng()), "k"),
        (lambda: label_histogram(LABELS, [np.arange(3)], 2), "num_classes"),
        (lambda: split_like(LABELS, [], LABELS, rng()), "train_parts"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, name: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=name):
        call()
