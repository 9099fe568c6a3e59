"""``hf-trainers``: the task whose examples live in the user's transformers Trainers, not in a file.

``fedpeft.integrations.transformers`` names this task in the config it writes: each client's examples are its
trainer's tokenized ``train_dataset`` (its test shard, the ``eval_dataset``), turned into fedpeft's encoded rows
there. A run that only has the config (``fedpeft run``, a Flower node without its trainer) cannot read them, so
loading the task from the config is an error that says so.
"""

from __future__ import annotations

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.tasks.base import TASKS
from fedpeft.data.types import TaskData

NAME = "hf-trainers"


@TASKS.register(NAME, "the train_dataset (and eval_dataset) of each client's transformers Trainer, handed to "
                      "fedpeft.integrations.transformers (not loadable from a config alone)")
def load_from_trainers(cfg: TaskConfig, seed: int) -> TaskData:
    raise ConfigError(f"task.name: '{NAME}' holds the data of transformers Trainers handed to "
                      "fedpeft.integrations.transformers (federate, client_app) in the same process; a run from its "
                      "config alone has none: run it through that module")
