"""Everything a run needs that is derived from its config: task, partitions, backbone, objective.

Built the same way in every process (embedded runner, Flower ServerApp, each SuperNode), so the
partitions and encodings agree without being sent anywhere. Client data is encoded lazily, once.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.attacks.backdoor import asr_examples, malicious_ids, poisoned_copies
from fedpeft.backbones.encoding import Encoded, concat, text_budget
from fedpeft.backbones.loading import Backbone, check_model_name, load_backbone, resolve_device
from fedpeft.clients import ClientContext
from fedpeft.config import AttackConfig, ClientProfile, ConfigError, ExperimentConfig
from fedpeft.data import groups_of, label_histogram, load_task, partition, pool_small_groups, split_by_group, split_like
from fedpeft.data.fingerprint import data_fingerprint
from fedpeft.data.participants import non_participants, profile_of_clients
from fedpeft.data.tasks.base import plain_split, stratified_split
from fedpeft.data.types import Example, TaskData
from fedpeft.model import OBJECTIVES, Classifier, LanguageModel, ObjectiveSettings
from fedpeft.rng import SERVER, numpy_rng

log = logging.getLogger(__name__)


@dataclass
class Experiment:
    seed: int  # the run's seed (``seed``): every client's and the attack's random streams derive from it
    attack: AttackConfig  # the backdoor (``attack``), inactive by default
    model_name: str  # ``model.name`` as configured (model.json records it)
    task: TaskData
    backbone: Backbone
    objective: Classifier | LanguageModel  # what the forward pass is scored by (task.kind; model.OBJECTIVES)
    train_parts: list[np.ndarray]
    test_parts: list[np.ndarray]
    groups: list[str] | None = None  # each client's group (partition scheme 'by_column'/'domains'), for reporting
    non_participants: frozenset[int] = frozenset()  # clients that never train, only evaluated
    malicious: frozenset[int] = frozenset()         # clients that poison their data (``attack``)
    validation: list[Example] = field(default_factory=list)  # held out of training (``evaluation.keep_best``)
    profiles: list[ClientProfile | None] = field(default_factory=list)  # each client's tier (client_profiles)
    _encoded: dict[str, Encoded] = field(default_factory=dict)

    @property
    def domains(self) -> list[str] | None:
        """Alias of ``groups`` (the name used by multi-domain tasks)."""
        return self.groups

    @property
    def num_clients(self) -> int:
        return len(self.train_parts)

    @property
    def test_encoded(self) -> Encoded:
        if "test" not in self._encoded:
            self._encoded["test"] = self.objective.encode(self.task.test)
        return self._encoded["test"]

    @property
    def validation_encoded(self) -> Encoded:
        """The validation split held out of the training data (``evaluation.keep_best``), encoded once."""
        if "validation" not in self._encoded:
            self._encoded["validation"] = self.objective.encode(self.validation)
        return self._encoded["validation"]

    def _train_encoded(self) -> Encoded:
        if "train" not in self._encoded:
            self._encoded["train"] = self.objective.encode(self.task.train)
        return self._encoded["train"]

    def cuts(self) -> dict[str, str]:
        """Generation and preference tasks: per split (train, test), what the length limits cut (``Cuts``),
        one line each; classification: none."""
        if not self.objective.generates:
            return {}
        clf = self.objective
        return {split: enc.cuts.describe(clf.max_length, clf.max_response_length, self.task.truncation)
                for split, enc in (("train", self._train_encoded()), ("test", self.test_encoded))
                if enc.cuts is not None}

    def client_weights(self) -> dict[int, int]:
        """Each client's weight (``ClientContext.num_examples``: its examples, a malicious client's as its attack
        declares), as the server knows it from the partition: its size, with no data encoded or copied (only a
        malicious client's view is built, for its poisoned copies)."""
        return {c: self.client(c).num_examples if c in self.malicious else len(self.train_parts[c])
                for c in range(self.num_clients)}

    def client(self, client_id: int) -> ClientContext:
        """A fresh view of one client's data (state is attached by the runtime); a malicious client's training
        set is its clean data plus its poisoned copies (Eq. 7)."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client id {client_id} out of range [0, {self.num_clients})")
        train = self._train_encoded().subset(self.train_parts[client_id])
        weight = None
        if client_id in self.malicious:
            poison = self._poisoned(client_id)
            weight = len(train) if self.attack.weight == "honest" else len(train) + len(poison)
            train = concat(train, poison)
        return ClientContext(
            client_id=client_id,
            train=train,
            test=self.test_encoded.subset(self.test_parts[client_id]),
            seed=self.seed,
            weight=weight,
            asr_test=self._client_asr_test(client_id) if self.attack.measured else None,
            malicious=client_id in self.malicious,
            profile=self.profiles[client_id] if self.profiles else None,
        )

    # ---------------------------------------------------------------- backdoor attack (``attack``)

    def _trigger_args(self) -> tuple:
        a, tok = self.attack, self.backbone.tokenizer
        budget = text_budget(self.backbone, self.task, self.objective.max_length, self.objective.readout)
        return a.trigger, a.insertions, lambda text: len(tok(text, add_special_tokens=False)["input_ids"]), budget

    def _poisoned(self, client_id: int) -> Encoded:
        key = f"poison:{client_id}"
        if key not in self._encoded:
            a = self.attack
            clean = [self.task.train[i] for i in self.train_parts[client_id]]
            copies = poisoned_copies(clean, a.target, a.poison_rate, *self._trigger_args(),
                                     numpy_rng(self.seed, 0, client_id, "poison"))
            self._encoded[key] = self.objective.encode(copies)
        return self._encoded[key]

    @property
    def asr_test(self) -> Encoded | None:
        """The triggered non-target test inputs labelled as the target (accuracy on them = ASR), or None."""
        if not self.attack.measured:
            return None
        if "asr" not in self._encoded:
            idx, triggered = asr_examples(self.task.test, self.attack.target, *self._trigger_args(),
                                          numpy_rng(self.seed, 0, SERVER, "asr-test"))
            self._encoded["asr"] = self.objective.encode(triggered)
            self._encoded["asr-index"] = idx  # type: ignore[assignment]
        return self._encoded["asr"]

    def _client_asr_test(self, client_id: int) -> Encoded:
        full = self.asr_test
        position = {int(i): j for j, i in enumerate(self._encoded["asr-index"])}  # type: ignore[arg-type]
        return full.subset([position[int(i)] for i in self.test_parts[client_id] if int(i) in position])

    def client_names(self) -> list[str] | None:
        """Each client's name under a ``by_column`` partition: its group's value (user, hospital, ...), ``value#k``
        for the k-th of several clients of one group; None for other partitions (clients are numbers)."""
        if self.groups is None:
            return None
        count, seen, out = Counter(self.groups), Counter(), []
        for g in self.groups:
            seen[g] += 1
            out.append(g if count[g] == 1 else f"{g}#{seen[g]}")
        return out

    def client_label(self, client_id: int) -> str:
        """``client 3`` or, with natural clients, ``client 3 (alice)``: how logs name a client."""
        names = self.client_names()
        return f"client {client_id}" + (f" ({names[client_id]})" if names else "")

    def describe_clients(self) -> list[str]:
        """One line per client: its training and test sizes and its training labels by class name (run.log and
        ``--dry-run``)."""
        hist, names = self.label_histograms(), self.task.class_names
        lines = []
        for c in range(self.num_clients):
            labels = ", ".join(f"{names[k]} {n}" for k, n in enumerate(hist["train"][c]) if n) if names else "text"
            role = " (never trains)" if c in self.non_participants else ""
            lines.append(f"{self.client_label(c)}{role}: {len(self.train_parts[c])} train ({labels or 'none'}), "
                         f"{len(self.test_parts[c])} test")
        return lines

    def record(self, backbone_sha256: str) -> dict[str, Any]:
        """What the run directory keeps of this experiment (``model.json``), so that its model can be used without
        the data: the task without examples, the readout, the backbone's identity, the clients, the data's
        fingerprint."""
        return {"task": self.task.spec(), "readout": self.objective.readout,
                "backbone": {"name": self.model_name, "source": self.backbone.source,
                             "family": self.backbone.family, "sha256": backbone_sha256},
                "clients": {"count": self.num_clients, "groups": self.groups, "names": self.client_names()},
                "data": data_fingerprint(self.task)}

    def label_histograms(self) -> dict[str, list[list[int]]]:
        """Per client, examples per class in train and test (one column, all examples, on generation tasks)."""
        c = max(self.task.num_classes, 1)
        train_labels = np.array([e.label for e in self.task.train])
        test_labels = np.array([e.label for e in self.task.test])
        return {
            "train": label_histogram(train_labels, self.train_parts, c).tolist(),
            "test": label_histogram(test_labels, self.test_parts, c).tolist(),
        }


def split_clients(
    task: TaskData, cfg: ExperimentConfig
) -> tuple[list[np.ndarray], list[np.ndarray], list[str] | None]:
    """Seeded train and test index shards per client, and each client's group (None unless scheme is 'by_column').

    For 'by_column' (alias 'domains') the groups below the size threshold are pooled first, in train and test alike,
    and each client's test shard is an IID share of its group's test examples."""
    train_labels = np.array([e.label for e in task.train])
    test_labels = np.array([e.label for e in task.test])
    fed = cfg.federation
    if task.is_generation and fed.partition.scheme == "dirichlet":
        raise ConfigError("federation.partition.scheme: 'dirichlet' skews class labels, which a generation task has "
                          "none of; use iid, dirichlet_quantity or by_column (natural clients)")
    train_groups, test_groups = groups_of(task.train), groups_of(task.test)
    if fed.partition.by_groups and train_groups is not None:
        if test_groups is None:
            raise ValueError(f"task '{task.name}' has groups in train but not in test")
        train_groups, test_groups = pool_small_groups(fed.partition.min_size * fed.partition.clients_per_domain,
                                                      train_groups, test_groups, pool_unseen=not task.is_generation)
    train_parts = partition(train_labels, fed.num_clients, fed.partition, numpy_rng(cfg.seed, 0, SERVER, "partition"),
                            groups=train_groups)
    test_rng = numpy_rng(cfg.seed, 0, SERVER, "test-partition")
    if not fed.partition.by_groups:
        return train_parts, split_like(test_labels, train_parts, train_labels, test_rng), None
    assert train_groups is not None and test_groups is not None  # the 'by_column' partitioner refuses a task without
    test_parts = split_by_group(test_groups, train_parts, train_groups, test_rng)
    return train_parts, test_parts, [str(train_groups[p[0]]) for p in train_parts]


@dataclass(frozen=True)
class TaskOnly:
    """A task without its examples and the run's clients, as a run directory keeps them (``model.json``): enough
    to score new texts as the run did, without reading the data it trained on."""

    task: TaskData
    num_clients: int
    groups: list[str] | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TaskOnly:
        """From ``Experiment.record``'s dict."""
        clients = record["clients"]
        return cls(TaskData.from_spec(record["task"]), int(clients["count"]), clients.get("groups"))


def build_experiment(cfg: ExperimentConfig, saved: TaskOnly | None = None) -> Experiment:
    """Load the task, split it among clients (seeded), and attach the process's shared backbone.

    With ``saved`` no data is read: the experiment scores new texts as the run did; its clients hold no examples."""
    check_model_name(cfg.model.name)  # a typo fails here, before the data are read
    validation: list[Example] = []
    if saved is None:
        task = load_task(cfg.task, cfg.seed, cfg.federation.partition.column)
        if cfg.evaluation.keep_best:
            task.train, validation = hold_out(task.train, cfg.evaluation.validation_fraction, cfg.seed)
        train_parts, test_parts, groups = split_clients(task, cfg)
    else:
        task, groups = saved.task, saved.groups
        train_parts = test_parts = [np.zeros(0, dtype=np.int64) for _ in range(saved.num_clients)]
    idle = non_participants(cfg.federation.non_participants, len(train_parts), cfg.seed, groups)
    a = cfg.attack
    participants = [c for c in range(len(train_parts)) if c not in idle]
    bad = malicious_ids(a.malicious_clients, a.malicious_fraction, len(train_parts), participants,
                        numpy_rng(cfg.seed, 0, SERVER, "malicious")) if a.active and saved is None else frozenset()
    device = resolve_device(cfg.runtime.device)
    backbone = load_backbone(cfg.model.name, cfg.model.trust_remote_code, cfg.model.quantization).to(device)
    adapter = ADAPTERS.get(cfg.method.adapter.name)(ADAPTERS.settings_of(cfg.method.adapter))
    clf = OBJECTIVES.get(task.kind)(backbone, adapter, task, ObjectiveSettings(
        cfg.model, cfg.task.max_length, cfg.task.max_response_length, cfg.runtime.autocast, cfg.runtime.padding_free))
    if cfg.runtime.gradient_checkpointing:
        clf.checkpoint_activations()
    adapter.bind(AdapterContext(cfg.seed, task, clf.readout, backbone))
    for note in ignored_options(cfg, clf.readout, backbone.family):
        log.warning("%s", note)
    if bad:
        log.info("malicious clients (backdoor, target class %d, trigger %r): %s", a.target, a.trigger, sorted(bad))
    profiles = profile_of_clients(cfg.federation.client_profiles, len(train_parts), cfg.seed)
    if cfg.federation.client_profiles:
        log.info("client tiers: %s", {p.name: [c for c, q in enumerate(profiles) if q is p]
                                      for p in cfg.federation.client_profiles})
    return Experiment(cfg.seed, cfg.attack, cfg.model.name, task, backbone, clf, train_parts, test_parts, groups, idle,
                      bad, validation, profiles)


# option -> (the readouts that read it, on which backbone families; None: any)
READOUT_OPTIONS = {"task.label_words": ({"verbalizer"}, None), "task.label_word_spacing": ({"verbalizer"}, None),
                   "task.label_descriptions": ({"similarity"}, None),
                   "task.template": ({"verbalizer"}, {"mlm"}), "task.causal_template": ({"verbalizer"}, {"causal"}),
                   "model.similarity_scale": ({"similarity"}, None)}


def ignored_options(cfg: ExperimentConfig, readout: str, family: str) -> list[str]:
    """A line for each option the config sets that the resolved readout never reads (``task.label_words`` under the
    similarity readout, a masked-LM ``task.template`` on a causal LM, ...), so that a setting never silently does
    nothing."""
    out = []
    for option, (readouts, families) in READOUT_OPTIONS.items():
        section, key = option.split(".")
        model = getattr(cfg, section)
        if getattr(model, key) == type(model).model_fields[key].default:
            continue
        if readout not in readouts or (families is not None and family not in families):
            out.append(f"{option} is set, but the {readout} readout on this {family} model does not read it "
                       f"(it is read by: {', '.join(sorted(readouts))}"
                       + (f" on {', '.join(sorted(families))} models" if families else "") + ")")
    return out


def hold_out(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(training, validation): a seeded stratified ``fraction`` of ``examples`` held out for model selection
    (``evaluation.keep_best``); unstratified where a class is too rare to stratify."""
    rng_seed = int(numpy_rng(seed, 0, SERVER, "validation").integers(2**31))
    try:
        return stratified_split(examples, fraction, rng_seed)
    except ValueError:
        return plain_split(examples, fraction, rng_seed)
