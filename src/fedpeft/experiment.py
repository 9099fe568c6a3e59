"""Everything a run needs that is derived from its config: task, partitions, backbone, classifier.

Built the same way in every process (embedded runner, Flower ServerApp, each SuperNode), so the
partitions and encodings agree without being sent anywhere. Client data is encoded lazily, once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.backbones.classifier import Classifier
from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.loading import Backbone, load_backbone, resolve_device
from fedpeft.clients import ClientContext
from fedpeft.config import ExperimentConfig
from fedpeft.data import label_histogram, load_task, partition, split_like
from fedpeft.data.types import TaskData
from fedpeft.rng import SERVER, numpy_rng

log = logging.getLogger(__name__)


@dataclass
class Experiment:
    cfg: ExperimentConfig
    task: TaskData
    backbone: Backbone
    classifier: Classifier
    train_parts: list[np.ndarray]
    test_parts: list[np.ndarray]
    _encoded: dict[str, Encoded] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.train_parts)

    @property
    def test_encoded(self) -> Encoded:
        if "test" not in self._encoded:
            self._encoded["test"] = self.classifier.encode(self.task.test)
        return self._encoded["test"]

    def _train_encoded(self) -> Encoded:
        if "train" not in self._encoded:
            self._encoded["train"] = self.classifier.encode(self.task.train)
        return self._encoded["train"]

    def client(self, client_id: int) -> ClientContext:
        """A fresh view of one client's data (state is attached by the runtime)."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client id {client_id} out of range [0, {self.num_clients})")
        return ClientContext(
            client_id=client_id,
            train=self._train_encoded().subset(self.train_parts[client_id]),
            test=self.test_encoded.subset(self.test_parts[client_id]),
            seed=self.cfg.seed,
        )

    def label_histograms(self) -> dict[str, list[list[int]]]:
        c = self.task.num_classes
        train_labels = np.array([e.label for e in self.task.train])
        test_labels = np.array([e.label for e in self.task.test])
        return {
            "train": label_histogram(train_labels, self.train_parts, c).tolist(),
            "test": label_histogram(test_labels, self.test_parts, c).tolist(),
        }


def build_experiment(cfg: ExperimentConfig) -> Experiment:
    """Load the task, split it among clients (seeded), and attach the process's shared backbone."""
    task = load_task(cfg.task, cfg.seed)
    train_labels = np.array([e.label for e in task.train])
    test_labels = np.array([e.label for e in task.test])
    fed = cfg.federation
    train_parts = partition(train_labels, fed.num_clients, fed.partition, numpy_rng(cfg.seed, 0, SERVER, "partition"))
    test_parts = split_like(test_labels, train_parts, train_labels, numpy_rng(cfg.seed, 0, SERVER, "test-partition"))
    backbone = load_backbone(cfg.model.name).to(resolve_device(cfg.runtime.device))
    adapter = ADAPTERS.get(cfg.method.adapter.name)(ADAPTERS.settings_of(cfg.method.adapter))
    clf = Classifier(backbone, adapter, task, cfg.model.readout, cfg.model.similarity_scale, cfg.task.max_length,
                     cfg.runtime.autocast)
    adapter.bind(AdapterContext(cfg.seed, task, clf.readout, backbone))
    return Experiment(cfg, task, backbone, clf, train_parts, test_parts)
