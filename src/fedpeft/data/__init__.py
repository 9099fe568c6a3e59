"""Tasks, file readers, synthetic data and seeded federated partitioners."""

from fedpeft.data.partition import (
    OTHER_GROUP,
    PARTITIONERS,
    dirichlet_label_partition,
    dirichlet_quantity_partition,
    few_shot_indices,
    group_order,
    group_partition,
    iid_partition,
    label_histogram,
    partition,
    pool_small_groups,
    split_by_group,
    split_like,
    stratified_subsample,
)
from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.data.tasks import TASKS, TaskSpec, domains_of, groups_of, load_task
from fedpeft.data.types import Example, TaskData

__all__ = [
    "OTHER_GROUP",
    "PARTITIONERS",
    "TASKS",
    "DataNotFoundError",
    "Example",
    "TaskData",
    "TaskSpec",
    "dirichlet_label_partition",
    "dirichlet_quantity_partition",
    "domains_of",
    "few_shot_indices",
    "group_order",
    "group_partition",
    "groups_of",
    "iid_partition",
    "label_histogram",
    "load_task",
    "partition",
    "pool_small_groups",
    "shared_data_dir",
    "split_by_group",
    "split_like",
    "stratified_subsample",
]
