"""The experiment schema: pydantic models that only compose sections; no registry or preset is imported here.

Each method component (``method.adapter``, ``trainer``, ``aggregator``, ``selector``, ``sharing``,
``downlink``, ``post_tuning``, and the lists ``transforms`` and ``wrappers``) is a ``Component``: ``name`` plus that
component's own keys, which its own settings model (registered next to its code) validates. Presets, registries and YAML
loading are resolved in ``fedpeft.resolve``, which only entry points import.

Long because it is the whole schema, one model tree that every entry point validates against.
"""

from __future__ import annotations

import hashlib
import re
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration problem, with the dotted path of the field in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskConfig(_Strict):
    name: str = Field("bbc", description="a registered task (`fedpeft tasks`), or jsonl/csv/tsv/parquet for your "
                                         "own data file at task.path")
    path: str | None = Field(None, description="data folder or file; defaults to ../shared/data/<dir>; file "
                                               "tasks: the data file, or a folder with train.<ext> (+ test.<ext>); "
                                               "a relative path is read from the working directory (not from the "
                                               "config file's folder) and recorded absolute in the run")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share for tasks without a test split")
    max_train: int | None = Field(None, gt=0, description="cap on training examples (seeded stratified sample)")
    max_test: int | None = Field(None, gt=0, description="cap on test examples (seeded stratified sample)")
    few_shot: int | None = Field(None, gt=0, description="k training examples per class, drawn before partitioning")
    max_length: int = Field(128, ge=8, description="tokens per input, prompt excluded (generation: prompt + "
                                                   "response)")
    num_examples: int = Field(600, gt=0, description="size of synthetic tasks")
    domains: list[str] | None = Field(None, min_length=1, description="domain tasks: which domains to load, "
                                                                       "default all")
    # file tasks (csv, tsv, jsonl, parquet): see fedpeft.data.tasks.files
    test_path: str | None = Field(None, description="file tasks: test file (default: test.<ext> beside train, "
                                                    "else a seeded stratified test_fraction split)")
    text_column: str = Field("text", min_length=1, description="file tasks: column of the input text")
    text_pair_column: str | None = Field(None, min_length=1, description="file tasks: second text of a pair")
    label_column: str = Field("label", min_length=1, description="file tasks: label column (strings or integers)")
    label_names: list[str] | None = Field(None, min_length=2, description="file tasks: class order (default: "
                                                                          "the labels found, sorted)")
    encoding: str = Field("utf-8", min_length=1, description="file tasks: text encoding of csv/tsv/jsonl files")
    # readout overrides, any task: replace the task's own after loading
    label_words: list[str] | None = Field(None, min_length=2, description="one verbalizer word per class")
    label_word_spacing: Literal["space", "as_written"] = Field(
        "space", description="verbalizer: 'space' reads each label word's first token with a leading space where "
                             "the tokenizer is space-sensitive (the word follows the template as after 'It was'); "
                             "'as_written' reads the word as given (a template ending in a newline, as DeComFL's "
                             "RTE prompt)")
    label_descriptions: list[str] | None = Field(None, min_length=2, description="one sentence per class "
                                                                                 "(similarity readout)")
    template: str | None = Field(None, min_length=1, description="masked-LM template with {text_a}, {mask} "
                                                                 "(and {text_b} for pairs)")
    causal_template: str | None = Field(None, min_length=1, description="causal-LM template; the label word "
                                                                        "follows it")
    # generation (instruction tuning): see fedpeft.data.tasks.generation and fedpeft.data.tasks.files
    kind: Literal["auto", "classification", "generation", "preference"] = Field(
        "auto", description="task kind; auto: file tasks are preference when rejected_column is set, else "
                            "generation when response_column is set, built-in tasks have their own kind")
    instruction_column: str = Field("instruction", min_length=1, description="file tasks, generation: column of "
                                                                              "the instruction")
    input_column: str | None = Field(None, min_length=1, description="file tasks, generation: optional column of "
                                                                     "the input/context")
    response_column: str | None = Field(None, min_length=1, description="file tasks: column of the response; "
                                                                        "setting it makes the task generation")
    rejected_column: str | None = Field(None, min_length=1, description="file tasks: column of the rejected "
                                                                        "response (response_column holds the "
                                                                        "chosen one); setting it makes the task "
                                                                        "preference")
    references_column: str | None = Field(None, min_length=1, description="file tasks, generation: several "
                                                                          "reference texts (a list, in csv/tsv a "
                                                                          "JSON array; a string is one)")
    prompt_template: str | None = Field(None, min_length=1, description="generation: user prompt with "
                                                                        "{instruction} (and optionally {input}); "
                                                                        "default: the model's chat template")
    max_response_length: int = Field(64, ge=1, description="generation: response tokens kept (longer responses "
                                                          "are cut at the end)")
    truncation: Literal["keep_start", "keep_end"] = Field(
        "keep_start", description="how a text longer than task.max_length is cut, longest field first: "
                                  "keep_start cuts a field at its end (a structured input keeps its first slots, "
                                  "as a tokenizer's right truncation), keep_end at its start (a long context keeps "
                                  "the question that ends it; DeComFL's left truncation of a review); generation "
                                  "counts the cuts in the run log and --dry-run, with a warning above 5 % of the "
                                  "examples")

    @field_validator("prompt_template")
    @classmethod
    def _prompt_template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        unknown = sorted({m for m in re.findall(r"\{(\w+)\}", value)} - {"instruction", "input"})
        if unknown:
            raise ValueError(f"task.prompt_template {value!r} has the unknown field(s) "
                             f"{', '.join('{' + u + '}' for u in unknown)}: a template fills {{instruction}} "
                             "(the instruction column) and {input} (task.input_column) only; put the column you "
                             "meant in task.instruction_column or task.input_column")
        if "{instruction}" not in value:
            raise ValueError(f"task.prompt_template {value!r} lacks {{instruction}} (the instruction's place; "
                             "{input} is optional)")
        return value

    @model_validator(mode="after")
    def _check_kind(self) -> TaskConfig:
        if self.input_column is not None and self.prompt_template is not None \
                and "{input}" not in self.prompt_template:
            raise ValueError(f"task.input_column '{self.input_column}' is set but task.prompt_template "
                             f"{self.prompt_template!r} never uses {{input}}, so the column would be dropped from "
                             "every prompt; add {input} to the template or unset task.input_column")
        if self.kind == "classification" and self.response_column is not None:
            raise ValueError("task.response_column is set, which makes a generation task, but task.kind is "
                             "'classification'; unset one of them")
        if self.rejected_column is not None and self.kind in ("classification", "generation"):
            raise ValueError(f"task.rejected_column is set, which makes a preference task, but task.kind is "
                             f"'{self.kind}'; unset one of them")
        if self.kind in ("generation", "preference") and self.max_response_length >= self.max_length:
            raise ValueError(f"task.max_response_length ({self.max_response_length}) must be below task.max_length "
                             f"({self.max_length}), which holds prompt and response")
        return self


class ModelConfig(_Strict):
    name: str = Field("minilm", description="a registered backbone (`fedpeft models`), a hub id or a local folder")
    trust_remote_code: bool = Field(False, description="hub ids and local paths: run Python code shipped with the "
                                                       "model (only for a model you trust)")
    readout: Literal["auto", "similarity", "verbalizer", "linear"] = Field(
        "auto", description="classification: how class scores are read from the frozen model (auto: the "
                            "verbalizer on causal and masked LMs, similarity on encoders without an LM head)")
    similarity_scale: float = Field(20.0, gt=0, description="logit scale of cosine similarities")
    pooling: Literal["all", "text", "pooler"] = Field(
        "all", description="pooling of the similarity/linear readouts: the mean of every attended row, or of the "
                           "text rows only (the adapter's inserted prompt rows left out), or the encoder's own "
                           "pretrained pooler (the first row through its dense + tanh: what HF's "
                           "BertForSequenceClassification reads); not with the verbalizer")
    quantization: Literal["none", "4bit", "8bit"] = Field(
        "none", description="load the frozen weights quantized with bitsandbytes (QLoRA: 4bit NF4, bf16 compute); "
                            "CUDA only")
    calibration: Literal["none", "contextual"] = Field(
        "none", description="contextual calibration (Zhao et al. 2021) of the verbalizer/similarity readout: "
                            "log p(y|x) - log p_cf(y), p_cf the mean class probabilities of content-free "
                            "inputs ('N/A', '', the mask token) under the same adapter params")


class PartitionConfig(_Strict):
    scheme: Literal["iid", "dirichlet", "dirichlet_quantity", "by_column", "domains"] = Field(
        "iid", description="how the training set is split over the clients: iid, Dirichlet over labels or over "
                           "quantities, one group of a column per client (by_column), or the task's domains")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    min_size: int = Field(2, ge=1, description="minimum examples per client (Dirichlet schemes redraw below it; "
                                               "by_column pools smaller groups into one '<other>' client)")
    clients_per_domain: int = Field(1, ge=1, description="by_column/domains scheme: IID clients per group")
    column: str | None = Field(None, min_length=1, description="by_column scheme, file tasks: one client per "
                                                               "value of this column")

    @property
    def by_groups(self) -> bool:
        """True for ``by_column`` and its alias ``domains``: one block of clients per group."""
        return self.scheme in ("by_column", "domains")

    @model_validator(mode="after")
    def _check_column(self) -> PartitionConfig:
        if self.column is not None and not self.by_groups:
            raise ValueError(f"partition.column needs partition.scheme 'by_column', got '{self.scheme}'")
        return self


class NonParticipantConfig(_Strict):
    """Clients that never train (evaluated only): a seeded share, or one fold of the sorted groups."""

    fraction: float = Field(0.0, ge=0, lt=1, description="seeded share of clients that never train")
    fold: int | None = Field(None, ge=0, description="by_column scheme: the clients of this fold of groups "
                                                     "never train")
    folds: int = Field(4, ge=2, description="by_column scheme: contiguous folds the sorted groups are split into")

    @model_validator(mode="after")
    def _check_choice(self) -> NonParticipantConfig:
        if self.fold is not None and self.fraction > 0:
            raise ValueError("non_participants.fraction and non_participants.fold are exclusive; set one")
        if self.fold is not None and self.fold >= self.folds:
            raise ValueError(f"non_participants.fold ({self.fold}) must be below non_participants.folds ({self.folds})")
        return self


class ClientProfile(_Strict):
    """One resource tier: the share of clients in it and what they can afford (HetLoRA, FlexLoRA, FLoRA)."""

    name: str = Field(min_length=1, description="the tier's name, shown in the run records")
    share: float | None = Field(None, gt=0, le=1, description="share of the clients in this tier (the shares sum to "
                                                              "1; counts are rounded by largest remainder, clients "
                                                              "drawn by the seed); or give clients")
    clients: list[int] | None = Field(None, min_length=1, description="the ids of the tier's clients, in place of a "
                                                                      "share (every client in one tier; "
                                                                      "fedpeft.integrations.transformers sets them "
                                                                      "from each trainer's LoRA rank)")
    rank: int | None = Field(None, ge=1, description="LoRA rank r_k the tier trains and exchanges (at most the "
                                                     "adapter's r; None: the adapter's r), with a rank-aware "
                                                     "sharing policy (method.sharing.name: ranks)")
    max_steps: int | None = Field(None, ge=1, description="cap on the tier's local optimizer steps per round "
                                                          "(gradient trainers; None: the trainer's)")

    @model_validator(mode="after")
    def _share_or_clients(self) -> ClientProfile:
        if (self.share is None) == (self.clients is None):
            raise ValueError(f"client_profiles: tier '{self.name}' gives its share or its clients (one of the two)")
        return self


class SecureAggregationConfig(_Strict):
    """SecAgg+ (Bell et al., CCS 2020) as Flower implements it: the server learns the weighted sum of the clients'
    update tensors, never one client's. Names and meanings follow Flower's ``SecAggPlusWorkflow``."""

    protocol: Literal["secaggplus"] = Field("secaggplus", description="the protocol: SecAgg+ (Bell et al. 2020)")
    num_shares: int | float = Field(
        3, gt=0, description="shares each client's secrets are split into (its neighbours, itself included); a float "
                             "is a share of the sampled clients (Flower's num_shares; its example app: 3)")
    reconstruction_threshold: int | float = Field(
        2, gt=0, description="shares needed to rebuild a secret (to unmask a dropped client); a float is a share of "
                             "num_shares (Flower's reconstruction_threshold; its example app: 2)")
    max_weight: float = Field(1000.0, gt=0, description="largest client weight (num_examples) the quantized field "
                                                        "holds without overflow")
    clipping_range: float = Field(8.0, gt=0, description="update values are clipped to [-c, c] before quantization")
    quantization_range: int = Field(4194304, gt=0, description="integers a clipped value is quantized to (2^22)")
    modulus_range: int = Field(4294967296, gt=0, description="the field of the masks, a power of 2 above "
                                                             "quantization_range (2^32)")
    timeout: float | None = Field(None, gt=0, description="seconds each protocol stage waits for replies "
                                                          "(None: no limit)")

    @model_validator(mode="after")
    def _check_ranges(self) -> SecureAggregationConfig:
        if self.modulus_range <= self.quantization_range or self.modulus_range & (self.modulus_range - 1):
            raise ValueError("secure_aggregation.modulus_range must be a power of 2 above quantization_range")
        if isinstance(self.num_shares, int) and self.num_shares <= 2:
            raise ValueError("secure_aggregation.num_shares as an integer must be greater than 2 (or a float share)")
        if isinstance(self.num_shares, float) and self.num_shares > 1:
            raise ValueError("secure_aggregation.num_shares as a float is a share of the sampled clients: at most 1")
        if isinstance(self.reconstruction_threshold, float) and self.reconstruction_threshold > 1:
            raise ValueError("secure_aggregation.reconstruction_threshold as a float is a share: at most 1")
        if isinstance(self.num_shares, int) and isinstance(self.reconstruction_threshold, int) \
                and self.reconstruction_threshold >= self.num_shares:
            raise ValueError("secure_aggregation.reconstruction_threshold must be below num_shares")
        return self

    def minority_threshold(self) -> bool:
        """Whether the threshold is at most half the shares: then a server that deviates from the protocol (telling
        some of a client's neighbours that it survived and the others that it dropped) can rebuild both of the
        client's secrets (``runtime.secure.checks``)."""
        t, k = self.reconstruction_threshold, self.num_shares
        if isinstance(t, float):  # a share of num_shares
            return t <= 0.5
        return isinstance(k, int) and 2 * t <= k  # a count of a float share: known only once a round samples


class FederationConfig(_Strict):
    num_clients: int = Field(10, ge=1, description="clients in the federation")
    clients_per_round: int | None = Field(None, ge=1, description="default: all clients")
    rounds: int = Field(5, ge=1, description="communication rounds")
    min_clients: int = Field(1, ge=1, description="fewest valid replies that still complete a round")
    on_round_failure: Literal["stop", "skip"] = Field(
        "stop", description="fewer than min_clients valid replies: stop the run (a resume retries the round), or "
                            "record the round as failed and go on with the server state unchanged (Flower's FedAvg)")
    round_timeout: float | None = Field(
        None, gt=0, description="seconds a client's reply may take; a later reply is ignored and logged (embedded "
                                "runtime: each client's own time, as if the clients ran side by side; Flower: the "
                                "round's wall clock)")
    max_message_bytes: int = Field(536_870_912, ge=1024, description="largest reply accepted, checked before it is "
                                                                     "decoded (default: Flower's gRPC limit)")
    partition: PartitionConfig = Field(PartitionConfig(), description="how the data is split over the clients")
    non_participants: NonParticipantConfig = Field(NonParticipantConfig(), description="clients that never train, "
                                                   "only evaluated (generalisation to unseen clients)")
    secure_aggregation: SecureAggregationConfig | None = Field(
        None, description="SecAgg+: the server learns only the weighted sum of the clients' updates (None: off)")
    client_profiles: list[ClientProfile] = Field(
        [], description="resource tiers (rank, local steps) assigned to seeded shares of the clients, or to the "
                        "clients each tier names; empty: every client alike")

    @model_validator(mode="after")
    def _check_counts(self) -> FederationConfig:
        if self.non_participants.fold is not None and not self.partition.by_groups:
            raise ValueError("non_participants.fold needs partition.scheme 'by_column' (or its alias 'domains'); "
                             "use non_participants.fraction")
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round ({self.clients_per_round}) exceeds num_clients ({self.num_clients})"
            )
        if self.client_profiles:
            listed = [p.clients is not None for p in self.client_profiles]
            if any(listed) and not all(listed):
                raise ValueError("client_profiles: every tier gives its clients, or every tier its share")
            if all(listed):
                ids = sorted(c for p in self.client_profiles for c in p.clients or ())
                if ids != list(range(self.num_clients)):
                    raise ValueError(f"client_profiles: the tiers' clients must be 0..{self.num_clients - 1}, each "
                                     f"once (num_clients), got {ids}")
            else:
                total = sum(p.share or 0 for p in self.client_profiles)
                if abs(total - 1) > 1e-6:
                    raise ValueError(f"client_profiles: the shares must sum to 1, got {total:g}")
            names = [p.name for p in self.client_profiles]
            if len(set(names)) != len(names):
                raise ValueError(f"client_profiles: tier names must be distinct, got {names}")
        per_round = self.clients_per_round or self.num_clients
        if self.min_clients > per_round:
            raise ValueError(f"min_clients ({self.min_clients}) exceeds clients per round ({per_round})")
        return self


class Component(BaseModel):
    """One component of a method: ``name`` picks a registered component and the other keys are that
    component's own settings, validated by the pydantic model it registered. Resolution fills in the
    component's defaults."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    name: str = Field(description="the registered component (`fedpeft components`)")
    _typed: Any = PrivateAttr(default=None)  # the settings object resolution validated (validated once)

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def typed_settings(self) -> Any:
        return self._typed

    def with_typed(self, typed: Any) -> Component:
        self._typed = typed
        return self


class CodecConfig(_Strict):
    dtype: Literal["float32", "float16"] = Field("float32", description="wire format of the float tensors in every "
                                                                         "message (float16 halves the bytes)")


class MethodConfig(_Strict):
    name: str = Field("fedprompt", description="a preset (`fedpeft methods`); the components below override its "
                                               "choices")
    adapter: Component = Field(Component(name="soft_prompt"), description="what is trained on the frozen model")
    trainer: Component = Field(Component(name="adam"), description="how a client trains the adapter locally")
    aggregator: Component = Field(Component(name="fedavg"), description="how the server combines the replies")
    selector: Component = Field(Component(name="uniform"), description="which clients train each round")
    sharing: Component = Field(Component(name="all"), description="which adapter tensors a client uploads (one "
                                                                  "exchange stage; see exchange)")
    exchange: list[Component] = Field(default_factory=list, description="the exchange stages in order, for a chain "
                                                                        "(e.g. [ranks, fedsa]); empty: [sharing]. "
                                                                        "When set, sharing mirrors its first stage")
    downlink: Component = Field(Component(name="dense"), description="how the global state is sent to clients")
    post_tuning: Component = Field(Component(name="none"), description="each client's own tuning after the last "
                                                                      "round (personalisation)")
    transforms: list[Component] = Field(default_factory=list, description="client-side update transforms, in order")
    wrappers: list[Component] = Field(default_factory=list, description="server-side aggregation wrappers, "
                                                                         "innermost first")
    codec: CodecConfig = Field(CodecConfig(), description="the wire format of every message")
    init_from: str | None = Field(None, min_length=1, description="a run directory whose final global adapter is "
                                                                  "the starting point instead of a fresh one (e.g. "
                                                                  "an instruction-tuning run before DPO); its "
                                                                  "tensors must have this adapter's names and shapes")

    def components(self) -> dict[str, Any]:
        """The component names this method resolves to (what runs, whatever the preset's name says)."""
        return {axis: getattr(self, axis).name for axis in AXES} | {
            "transforms": [t.name for t in self.transforms], "wrappers": [w.name for w in self.wrappers]} | (
            {"exchange": [s.name for s in self.exchange]} if len(self.exchange) > 1 else {})

    def stages(self) -> list[Component]:
        """The exchange stages that run: ``exchange``, or the one ``sharing`` names."""
        return list(self.exchange) or [self.sharing]


# the single components of ``method``
AXES = ("adapter", "trainer", "aggregator", "selector", "sharing", "downlink", "post_tuning")


class AttackConfig(_Strict):
    """Backdoor data poisoning (FedPrompt §III-C) by a fixed set of malicious clients, and its success rate."""

    malicious_clients: list[int] | None = Field(None, description="ids of the malicious clients (fixed for the run)")
    malicious_fraction: float = Field(0.0, ge=0, lt=1, description="or a seeded share of the participants")
    poison_rate: float = Field(1.0, gt=0, le=1, description="lambda: share of the non-target examples copied "
                                                            "with the trigger (paper: 1)")
    trigger: str = Field("cf", min_length=1, description="trigger word")
    insertions: int = Field(1, ge=1, description="trigger insertions per poisoned example")
    target: int = Field(1, ge=0, description="target class index")
    weight: Literal["honest", "poisoned"] = Field("honest", description="aggregation weight of a malicious "
                                                                        "client: its clean n_k or |D_k ∪ poison|")
    boost: float = Field(1.0, gt=0, description="gamma: malicious clients scale their delta by it before the "
                                                "upload (model replacement, Bagdasaryan et al. 2020; paper: 1)")
    asr: bool = Field(False, description="measure the attack success rate also without malicious clients "
                                         "(the natural-error baseline)")

    @property
    def active(self) -> bool:
        return bool(self.malicious_clients) or self.malicious_fraction > 0

    @property
    def measured(self) -> bool:
        return self.active or self.asr


class SuiteSpec(_Strict):
    name: str = Field(description="a standard evaluation suite (`fedpeft suites`; lmeval:TASK for lm-eval)")
    limit: int | None = Field(None, ge=1, description="a subset: on MMLU, this many items of every subject (a fixed "
                                                      "stratified draw); elsewhere the first this many items")
    settings: dict[str, Any] = Field(default_factory=dict, description="the suite's own settings "
                                                                       "(`fedpeft components` does not list them: "
                                                                       "see the suite's module)")


class EvaluationConfig(_Strict):
    batch_size: int = Field(64, ge=1, description="examples per evaluation forward pass")
    local: bool = Field(True, description="also evaluate on each client's local test shard")
    every: int = Field(1, ge=1, description="evaluate every k rounds (and always after the last round)")
    round_zero: bool = Field(True, description="evaluate the initial global state before any training and record "
                                               "it as round 0 in metrics.jsonl")
    report: bool = Field(True, description="write report.html (plots, tables) into the run directory at the end")
    reuse_global: bool = Field(True, description="where every client would score exactly the global tensors, take "
                                                 "its local metrics from the global test predictions (one pass) "
                                                 "instead of evaluating its shard again")
    keep_best: bool = Field(False, description="hold out a validation split of the training data (never the test "
                                               "set), score the global model on it whenever it is evaluated, and "
                                               "keep the checkpoint of the best round (validation accuracy; generation "
                                               "tasks: validation loss per response token) in "
                                               "checkpoint-best/ for predict/export/evaluate --best")
    validation_fraction: float = Field(0.1, gt=0, lt=1, description="with keep_best: the share of the training "
                                                                    "examples held out as the validation split "
                                                                    "(seeded, stratified, before partitioning)")
    generate_every: int | None = Field(None, ge=0, description="generation tasks: every k rounds (and after the "
                                                                "last) decode the test prompts greedily and record "
                                                                "BLEU, chrF, ROUGE-L and exact match; unset: after "
                                                                "the last round only (the run's headline); 0: never "
                                                                "(loss and perplexity are recorded at every "
                                                                "evaluation)")
    max_new_tokens: int = Field(64, ge=1, description="generation tasks: most tokens decoded per prompt")
    generate_examples: int | None = Field(200, ge=1, description="generation tasks: test examples decoded for "
                                                                 "the generation metrics (a seeded sample, the same "
                                                                 "every round; each natural client's share kept); "
                                                                 "unset: all")
    bootstrap: int = Field(0, ge=0, description="generation tasks: resamples of the decoded test sample for the "
                                                "standard errors of BLEU, chrF, ROUGE-L and exact match (0: none)")
    show_examples: int = Field(3, ge=0, description="generation tasks: fixed test prompts whose generations are "
                                                    "kept at each generating round (report.html table)")
    suites: list[SuiteSpec] = Field(default_factory=list, description="generation and preference tasks: standard "
                                                                      "suites scored on the final global adapter "
                                                                      "(e.g. [flowertune-general-nlp]); scores in "
                                                                      "summary.json, items in suites/")
    round_suites: list[SuiteSpec] = Field(default_factory=list,
                                          description="generation and preference tasks: standard suites scored on "
                                                      "the global adapter at every evaluated round, best on a fixed "
                                                      "subset (e.g. [{name: advbench, limit: 52}]); scores in "
                                                      "metrics.jsonl under 'suites'")

    @field_validator("suites", "round_suites", mode="before")
    @classmethod
    def _suite_names(cls, v: Any) -> Any:
        """A bare name stands for ``{name: NAME}``."""
        return [{"name": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v


class RuntimeConfig(_Strict):
    name: str = Field("embedded", description="embedded (one process), flower-sim (Flower's simulation) or "
                                              "flower (a Flower deployment)")
    threads: int | None = Field(None, ge=1, description="torch threads of the server and every client, in every "
                                                         "runtime; the numbers depend on the count in their last "
                                                         "bits, so the runtimes agree bit for bit at one count. "
                                                         "Unset: resolved when the run starts (summary.json's "
                                                         "threads; a resume keeps it) to torch's count in the "
                                                         "starting process (the cores, or OMP_NUM_THREADS), at most "
                                                         "the usable cores, divided among client_workers; "
                                                         "flower-sim reserves that many cores per ClientApp (at "
                                                         "the default: one ClientApp at a time; 1: one per core); "
                                                         "a deployment's nodes use the server's count")
    device: str = Field("cpu", description="cpu, cuda, cuda:N, or auto (cuda when available)")
    autocast: Literal["none", "bfloat16", "float16"] = Field(
        "none", description="mixed-precision forward passes on CUDA (the wire format is unchanged)")
    gradient_checkpointing: bool = Field(False, description="recompute the frozen model's activations in the "
                                                            "backward pass instead of keeping them (less memory, "
                                                            "about a third more compute; gradient trainers)")
    padding_free: bool = Field(False, description="generation tasks: the rows of a training batch are packed into "
                                                  "one sequence without pad tokens, position ids restarting at each "
                                                  "row and each row attending to itself alone (TRL's padding_free); "
                                                  "the same losses up to float rounding, no compute spent on "
                                                  "padding; adapters that insert no rows (lora, full); faster "
                                                  "on the CPU, slower on a GPU at small batches (one attention "
                                                  "call per row)")
    progress: bool = Field(True, description="show progress bars and per-round log lines")
    checkpoint_every: int = Field(1, ge=1, description="save a resumable checkpoint every k rounds (and after the "
                                                       "last)")
    client_workers: int = Field(1, ge=1, description="embedded runtime, CPU: processes that train a round's clients "
                                                     "side by side, forked after the backbone is loaded so they share "
                                                     "its weights; each uses runtime.threads threads (default: "
                                                     "the usable cores divided among the workers)")
    client_batch: int = Field(1, ge=1, description="embedded runtime: clients of a round whose model calls run "
                                                   "together (black-box forwards in one backbone call; gradient "
                                                   "steps in one forward and one backward); 1: one client after "
                                                   "another, as on CPU unless client_batch_passes is set "
                                                   "(stacking is no faster there)")
    client_batch_passes: int | None = Field(None, ge=1, description="with client_batch > 1: forward passes a "
                                                                   "group's stacked rows take, sorted by length, "
                                                                   "each padded to its own longest row; default: "
                                                                   "one on a GPU; on CPU no stacking (clients "
                                                                   "one after another)")

    @model_validator(mode="after")
    def _workers_on_cpu(self) -> RuntimeConfig:
        if self.client_workers > 1 and self.device != "cpu":
            raise ValueError("client_workers > 1 forks processes for CPU training; on a GPU keep 1")
        if self.client_workers > 1 and self.client_batch > 1:
            raise ValueError("client_batch > 1 runs clients together in one process; it does not combine with "
                             "client_workers > 1 (choose one)")
        for field in ("client_workers", "client_batch"):
            if getattr(self, field) > 1 and self.name != "embedded":
                raise ValueError(f"{field} > 1 is how the embedded runtime runs clients side by side; runtime "
                                 f"'{self.name}' runs each client in its own ClientApp (keep 1)")
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        head, _, index = value.partition(":")
        if value in ("auto", "cpu", "cuda") or (head == "cuda" and index.isdigit()):
            return value
        raise ValueError(f"unknown device '{value}'; allowed: auto, cpu, cuda, cuda:N")


class FaultConfig(_Strict):
    """Fault injection at the client handler, in every runtime: for the reliability tests and benchmark only."""

    fail_clients: list[int] = Field([], description="clients whose training raises in every faulty round")
    fail_rate: float = Field(0.0, ge=0, le=1, description="chance that a client's training raises in a faulty round "
                                                          "(drawn from the seed, round and client)")
    hang_clients: list[int] = Field([], description="clients that sleep hang_s before they reply")
    hang_s: float = Field(0.0, ge=0, description="seconds a hanging client sleeps before it replies")
    rounds: list[int] | None = Field(None, description="the faulty rounds (default: every round)")
    secure_stage: Literal["setup", "share_keys", "collect_masked_vectors", "unmask"] | None = Field(
        None, description="under secure aggregation in the embedded runtime: the SecAgg+ stage at which a failing "
                          "client drops out, sending nothing from then on (None: its training raises, in the "
                          "masked-vector stage)")

    @property
    def active(self) -> bool:
        return bool(self.fail_clients or self.fail_rate or (self.hang_clients and self.hang_s))


class ExperimentConfig(_Strict):
    seed: int = Field(0, description="fixes every random draw of the run (data split, initialisation, sampling)")
    name: str | None = Field(None, description="a label for the run (reports and listings)")
    task: TaskConfig = Field(TaskConfig(), description="the data: which task, its files and splits")
    model: ModelConfig = Field(ModelConfig(), description="the frozen pretrained model and how it is read")
    method: MethodConfig = Field(MethodConfig(), description="the federated method: a preset and its components")
    federation: FederationConfig = Field(FederationConfig(), description="clients, rounds and the data split")
    attack: AttackConfig = Field(AttackConfig(), description="a backdoor attack by malicious clients (off by "
                                                              "default)")
    evaluation: EvaluationConfig = Field(EvaluationConfig(), description="what is measured, when")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="where and how the run executes")
    faults: FaultConfig = Field(FaultConfig(), description="fault injection for the reliability tests (off by "
                                                           "default)")
    tracking: list[Component] = Field(default_factory=list, description="where every round's numbers also go, "
                                                                        "besides metrics.jsonl: tensorboard, mlflow, "
                                                                        "wandb (`fedpeft components`; the "
                                                                        "fedpeft[tracking] extra); none by default")
    _notes: list[str] = PrivateAttr(default_factory=list)  # warnings of resolution, for the entry point to show

    @property
    def notes(self) -> list[str]:
        """Warnings about this config found while resolving it (shown once by the command line)."""
        return self._notes

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int) -> int:
        if not 0 <= v < 2**63:
            raise ValueError("seed must be in [0, 2**63)")
        return v

    def default_name(self) -> str:
        """``<method>-<task>-<model>-<hash>-s<seed>``, the run directory's default name: the hash (6 hex digits of
        the resolved config; seed, name, display and tracking settings and ``federation.rounds`` aside) keeps two
        different configs apart and the seeds of one config side by side, and a run extended to more rounds keeps its
        name."""
        body = self.with_absolute_paths().model_dump(mode="json")
        for section, key in (("runtime", "progress"), ("evaluation", "report"), ("federation", "rounds")):
            body[section].pop(key)
        body.pop("seed"), body.pop("name"), body.pop("tracking")
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:6]
        model = Path(self.model.name).name or self.model.name
        return f"{self.method.name}-{self.task.name}-{model}-{digest}-s{self.seed}"

    def with_absolute_paths(self) -> ExperimentConfig:
        """A copy whose data paths (``task.path``, ``task.test_path``) are absolute, as a run directory records
        them: the run then reads the same files from any working directory."""
        paths = {k: str(Path(v).expanduser().absolute()) for k in ("path", "test_path")
                 if (v := getattr(self.task, k)) is not None}
        if not paths:
            return self
        return self.model_copy(update={"task": self.task.model_copy(update=paths)})


def read_yaml(text: str) -> Any:
    """``yaml.safe_load`` with libyaml's C parser where PyYAML has it (configs and overrides are parsed for every run
    and every resume check; the pure-Python parser is ~10x slower)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
