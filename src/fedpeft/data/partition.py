"""Seeded partitioners: which example indices each federated client holds.

Every function draws only from the ``np.random.Generator`` it is given, so a seed fixes the result.
Each returns one sorted ``int64`` index array per client; together they are disjoint and, for the
partitioners, cover ``range(n)``. Bad arguments raise ``ValueError`` naming the argument.

The partitioners sit side by side because they share their checks and their output contract.
"""

from __future__ import annotations

import math
import warnings
from typing import Protocol

import numpy as np

from fedpeft.config import ConfigError, PartitionConfig
from fedpeft.registry import Registry


OTHER_GROUP = "<other>"  # by_column: the one client block that pools the groups below the size threshold


class Partitioner(Protocol):
    """A registered scheme; ``groups`` (each example's group: domain, user, ...) is given where examples carry
    one, None otherwise."""

    def __call__(
        self, labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
        groups: np.ndarray | None = None,
    ) -> list[np.ndarray]: ...


# ---------------------------------------------------------------- validation


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")


def _check_labels(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0:
        raise ValueError(f"{name} must hold non-negative integer class indices")
    return arr.astype(np.int64)


def _check_groups(groups: np.ndarray, name: str = "groups") -> np.ndarray:
    arr = np.asarray(groups)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    return arr


def _check_min_size(n: int, num_clients: int, min_size: int) -> None:
    _check_int("min_size", min_size, 0)
    if min_size * num_clients > n:
        raise ValueError(
            f"min_size ({min_size}) x num_clients ({num_clients}) exceeds the {n} examples available"
        )


def _sorted_parts(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# ---------------------------------------------------------------- partitioners


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``range(n)`` and cut it into ``num_clients`` parts whose sizes differ by at most one."""
    _check_int("num_clients", num_clients, 1)
    _check_int("n", n, 1)
    if num_clients > n:
        raise ValueError(f"num_clients ({num_clients}) exceeds the number of examples n ({n})")
    return _sorted_parts(np.array_split(rng.permutation(n), num_clients))


def dirichlet_label_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed split: for each class c draw q_c ~ Dir(alpha * 1_K) and give client k a q_ck share of class c.

    Hsu, Qi & Brown (2019), "Measuring the Effects of Non-Identical Data Distribution for Federated
    Visual Classification", arXiv:1909.06335. Small ``alpha`` -> few classes per client; large
    ``alpha`` -> close to IID. The whole draw is repeated until every client has ``min_size`` examples.
    """
    labels = _check_labels(labels)
    _check_int("num_clients", num_clients, 1)
    _check_alpha(alpha)
    _check_min_size(labels.size, num_clients, min_size)
    _check_int("max_tries", max_tries, 1)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(q)[:-1] * idx.size).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        merged = [np.concatenate(p) for p in parts]
        if min(p.size for p in merged) >= min_size:
            return _sorted_parts(merged)
    raise ValueError(
        f"could not give every client min_size={min_size} examples in max_tries={max_tries} Dirichlet "
        f"draws (alpha={alpha}, num_clients={num_clients}, n={labels.size}); lower min_size or raise alpha"
    )


def dirichlet_quantity_partition(
    n: int,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Quantity-skewed split: q ~ Dir(alpha * 1_K), cut the shuffled indices at the cumulative shares of q.

    The non-IID setting of FedPrompt (Zhao et al., 2023, "FedPrompt: Communication-Efficient and
    Privacy-Preserving Prompt Tuning in Federated Learning", ICASSP): client sizes vary, labels are
    not skewed on purpose. Redrawn until every client has ``min_size`` examples.
    """
    _check_int("n", n, 1)
    _check_int("num_clients", num_clients, 1)
    _check_alpha(alpha)
    _check_min_size(n, num_clients, min_size)
    _check_int("max_tries", max_tries, 1)
    for _ in range(max_tries):
        q = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(q)[:-1] * n).astype(np.int64)
        sizes = np.diff(np.concatenate([[0], cuts, [n]]))
        if sizes.min() >= min_size:
            return _sorted_parts(np.split(rng.permutation(n), cuts))
    raise ValueError(
        f"could not give every client min_size={min_size} examples in max_tries={max_tries} Dirichlet "
        f"draws (alpha={alpha}, num_clients={num_clients}, n={n}); lower min_size or raise alpha"
    )


def group_order(groups: np.ndarray | list[str]) -> list[str]:
    """The distinct groups in client order: sorted, with the pooled ``OTHER_GROUP`` last."""
    return sorted({str(g) for g in groups}, key=lambda g: (g == OTHER_GROUP, g))


def pool_small_groups(min_count: int, train_groups: np.ndarray, *others: np.ndarray,
                      pool_unseen: bool = True) -> list[np.ndarray]:
    """Rename every group with fewer than ``min_count`` examples in ``train_groups`` to ``OTHER_GROUP``, in
    ``train_groups`` and each of ``others``; idempotent. Groups absent from training count 0 (pooled) unless
    ``pool_unseen`` is False: then they keep their names, so that ``split_by_group`` gives them to no client
    (generation tasks whose test set holds unseen categories, such as WebNLG's, keep them out of every shard)."""
    train_groups = _check_groups(train_groups, "train_groups").astype(str)
    names, counts = np.unique(train_groups, return_counts=True)
    small = [str(g) for g, c in zip(names, counts, strict=True) if c < min_count]
    out = []
    for arr in (train_groups, *others):
        arr = np.asarray(arr).astype(str)
        unseen = ~np.isin(arr, names) if pool_unseen else np.zeros(arr.shape, dtype=bool)
        out.append(np.where(np.isin(arr, small) | unseen, OTHER_GROUP, arr).astype(str))
    return out


def unseen_groups(train_groups: np.ndarray, test_groups: np.ndarray) -> list[str]:
    """The test groups that occur nowhere in training, sorted (WebNLG's unseen categories): by_column gives them to
    no client, and they stay in the global test set only."""
    seen = set(np.asarray(train_groups).astype(str).tolist())
    return sorted(set(np.asarray(test_groups).astype(str).tolist()) - seen)


def group_partition(groups: np.ndarray, clients_per_group: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One block of ``clients_per_group`` IID clients per group, groups in ``group_order`` (client ids group-major)."""
    groups = _check_groups(groups).astype(str)
    _check_int("clients_per_group", clients_per_group, 1)
    parts: list[np.ndarray] = []
    for g in group_order(groups):
        idx = np.flatnonzero(groups == g)
        if idx.size < clients_per_group:
            raise ValueError(f"clients_per_group ({clients_per_group}) exceeds the {idx.size} examples of group '{g}'")
        parts += [idx[p] for p in iid_partition(idx.size, clients_per_group, rng)]
    return _sorted_parts(parts)


# ---------------------------------------------------------------- sampling helpers


def few_shot_indices(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``k`` examples of every class without replacement (the k-shot setting of LM-BFF, Gao et al. 2021)."""
    labels = _check_labels(labels)
    _check_int("k", k, 1)
    chosen = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if idx.size < k:
            raise ValueError(f"k ({k}) exceeds the {idx.size} examples of class {c}")
        chosen.append(rng.choice(idx, size=k, replace=False))
    return np.sort(np.concatenate(chosen))


def stratified_subsample(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a ``size``-example sample whose class proportions follow ``labels`` (sklearn's stratified
    split).

    Falls back to a plain random sample, with a warning, where stratification is impossible
    (a class with a single example, or ``size`` below the number of classes).
    """
    from sklearn.model_selection import train_test_split

    labels = _check_labels(labels)
    _check_int("size", size, 1)
    if size >= labels.size:
        return np.arange(labels.size, dtype=np.int64)
    seed = int(rng.integers(2**31 - 1))
    try:
        idx, _ = train_test_split(np.arange(labels.size), train_size=size, stratify=labels, random_state=seed)
    except ValueError as err:
        warnings.warn(f"stratified sample impossible ({err}); drawing a plain random sample", stacklevel=2)
        idx = rng.choice(labels.size, size=size, replace=False)
    return np.sort(np.asarray(idx, dtype=np.int64))


def _proportional_counts(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest remainder, ties to lower index)."""
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    remainder = total - counts.sum()
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


def split_like(
    test_labels: np.ndarray,
    train_parts: list[np.ndarray],
    train_labels: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Local test shards whose class mix follows each client's training labels.

    Each class's (shuffled) test indices are divided among clients in proportion to how many
    training examples of that class they hold, as in personalized-FL evaluation on local test
    sets. Test examples of a class that no client trains on are left out.
    """
    test_labels = _check_labels(test_labels, "test_labels")
    train_labels = _check_labels(train_labels, "train_labels")
    if not train_parts:
        raise ValueError("train_parts must hold at least one client")
    num_classes = int(max(test_labels.max(), train_labels.max())) + 1
    hist = label_histogram(train_labels, train_parts, num_classes)
    shards: list[list[np.ndarray]] = [[] for _ in train_parts]
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(test_labels == c))
        weights = hist[:, c].astype(np.float64)
        if idx.size == 0 or weights.sum() == 0:
            continue
        counts = _proportional_counts(idx.size, weights)
        for k, chunk in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            shards[k].append(chunk)
    return _sorted_parts([np.concatenate(s) if s else np.empty(0, np.int64) for s in shards])


def split_by_group(
    test_groups: np.ndarray,
    train_parts: list[np.ndarray],
    train_groups: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Local test shards for one-group clients: each group's (shuffled) test indices are split IID among its clients.

    Every client must train on exactly one group; test examples of a group no client holds are left out.
    """
    test_groups, train_groups = _check_groups(test_groups, "test_groups"), _check_groups(train_groups, "train_groups")
    if not train_parts:
        raise ValueError("train_parts must hold at least one client")
    owners = []
    for k, part in enumerate(train_parts):
        held = np.unique(train_groups[np.asarray(part, dtype=np.int64)])
        if held.size != 1:
            raise ValueError(f"train_parts: client {k} holds {held.size} groups; split_by_group needs exactly one")
        owners.append(held[0])
    shards = [np.empty(0, np.int64) for _ in train_parts]
    for g in sorted(set(owners)):
        clients = [k for k, o in enumerate(owners) if o == g]
        idx = rng.permutation(np.flatnonzero(test_groups == g))
        for k, chunk in zip(clients, np.array_split(idx, len(clients)), strict=True):
            shards[k] = chunk
    return _sorted_parts(shards)


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Counts per client and class, shape ``[clients, classes]``."""
    labels = _check_labels(labels)
    _check_int("num_classes", num_classes, 1)
    if labels.max() >= num_classes:
        raise ValueError(f"num_classes ({num_classes}) must exceed the largest label ({labels.max()})")
    return np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes) for p in parts])


# ---------------------------------------------------------------- registry

PARTITIONERS: Registry[Partitioner] = Registry("partition scheme")


@PARTITIONERS.register("iid", "uniform random split, client sizes differ by at most one")
def _iid(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    return iid_partition(len(labels), num_clients, rng)


@PARTITIONERS.register("dirichlet", "label skew: per-class shares ~ Dir(alpha) (Hsu et al. 2019)")
def _dirichlet(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    return dirichlet_label_partition(labels, num_clients, cfg.alpha, cfg.min_size, rng)


@PARTITIONERS.register("dirichlet_quantity", "quantity skew: client sizes ~ Dir(alpha) (FedPrompt)")
def _dirichlet_quantity(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    return dirichlet_quantity_partition(len(labels), num_clients, cfg.alpha, cfg.min_size, rng)


def _by_column(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Natural clients: groups with fewer than min_size x clients_per_domain examples pooled into OTHER_GROUP,
    then ``group_partition``."""
    if groups is None:
        raise ConfigError(f"federation.partition.scheme: '{cfg.scheme}' needs federation.partition.column (a "
                          "column of a csv, tsv, jsonl or parquet task) or a task whose examples carry a group "
                          "(such as sentiment-domains)")
    (pooled,) = pool_small_groups(cfg.min_size * cfg.clients_per_domain, groups)
    num_groups = len(group_order(pooled))
    expected = num_groups * cfg.clients_per_domain
    if num_clients != expected:
        what = f"values of column '{cfg.column}'" if cfg.column else "groups"
        note = (f", those under partition.min_size x clients_per_domain = {cfg.min_size * cfg.clients_per_domain} "
                f"examples pooled into '{OTHER_GROUP}'" if OTHER_GROUP in pooled else "")
        raise ConfigError(f"federation.num_clients must be {expected} for the '{cfg.scheme}' scheme ({num_groups} "
                          f"{what}{note}, x partition.clients_per_domain {cfg.clients_per_domain}), "
                          f"got {num_clients}")
    return group_partition(pooled, cfg.clients_per_domain, rng)


PARTITIONERS.add("by_column", _by_column, "natural clients, one block of clients_per_domain IID clients per "
                 "value of partition.column (or per domain), values sorted, smaller than min_size pooled last")
PARTITIONERS.add("domains", _by_column, "alias of by_column: one domain per client (FDU-MTL)")


def partition(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split example indices among clients with the scheme ``cfg.scheme``; ``groups``: each example's group."""
    labels = np.asarray(labels)
    if groups is not None and np.shape(groups) != labels.shape:
        raise ValueError(f"groups must match labels in shape, got {np.shape(groups)} and {labels.shape}")
    return PARTITIONERS.get(cfg.scheme)(labels, num_clients, cfg, rng, groups=groups)
