"""Tasks, file readers, synthetic data and seeded federated partitioners."""

from fedpeft.data.partition import (
    PARTITIONERS,
    dirichlet_label_partition,
    dirichlet_quantity_partition,
    few_shot_indices,
    group_partition,
    iid_partition,
    label_histogram,
    partition,
    split_by_group,
    split_like,
    stratified_subsample,
)
from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.data.tasks import TASKS, TaskSpec, domains_of, load_task
from fedpeft.data.types import Example, TaskData

__all__ = [
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
    "group_partition",
    "iid_partition",
    "label_histogram",
    "load_task",
    "partition",
    "shared_data_dir",
    "split_by_group",
    "split_like",
    "stratified_subsample",
]
