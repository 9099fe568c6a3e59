"""Config-time check that the chosen components can work together, from what each one declares.

Trainers declare the kind of update they produce (``kind``), the adapters they can train (``adapters``)
and the auxiliary values they upload (``provides``, as sharing policies do); aggregators and wrappers the kinds they
accept and the values they read (``accepts``, ``needs``); sharing policies and transforms what they need. A mismatch is
a ``ValueError`` naming the field and saying why, raised before anything is loaded.
"""

from __future__ import annotations

from fedpeft.adapters import ADAPTERS
from fedpeft.config import ExperimentConfig
from fedpeft.data.tasks.trainers import NAME as TRAINERS_TASK
from fedpeft.aggregators import AGGREGATORS, WRAPPERS
from fedpeft.downlink import DOWNLINKS
from fedpeft.post_tuning import POST_TUNING
from fedpeft.selection import SELECTORS
from fedpeft.exchange.stages import record as exchange_record
from fedpeft.sharing import SHARING
from fedpeft.trainers import TRAINERS
from fedpeft.trainers.base import NONE
from fedpeft.transforms import TRANSFORMS

KINDS = {"params": "trained tensors", "distribution": "a CMA-ES search distribution (mean, step size, covariance)",
         "none": "nothing (no local training)",
         "seeds": "(seed, scalar) pairs of zeroth-order steps"}


def is_generation_config(cfg: ExperimentConfig) -> bool:
    """Whether the configured task is a generation task (known from the config, before any data is read)."""
    from fedpeft.data.tasks.files import is_generation
    from fedpeft.data.tasks.generation import GENERATION_TASKS
    from fedpeft.data.tasks.preference import PREFERENCE_TASKS

    return cfg.task.name in GENERATION_TASKS + PREFERENCE_TASKS or is_generation(cfg.task)


def is_preference_config(cfg: ExperimentConfig) -> bool:
    """Whether the configured task is a preference task (known from the config, before any data is read)."""
    from fedpeft.data.tasks.files import is_preference
    from fedpeft.data.tasks.preference import PREFERENCE_TASKS

    return cfg.task.name in PREFERENCE_TASKS or is_preference(cfg.task)


def check_preference(cfg: ExperimentConfig) -> None:
    """A preference task is trained and scored by a preference trainer, which compares the adapted model with the
    frozen backbone; that trainer needs preference pairs."""
    preference = is_preference_config(cfg)
    trainer = cfg.method.trainer.name
    learns_preferences = TRAINERS.get(trainer).preference
    if preference and not learns_preferences:
        able = sorted(n for n in TRAINERS.names() if TRAINERS.get(n).preference)
        raise ValueError(f"method.trainer.name: task '{cfg.task.name}' holds preference pairs, which a preference "
                         f"trainer learns from ({', '.join(able)}), not '{trainer}' (the preset feddpo sets one)")
    if not preference and learns_preferences:
        raise ValueError(f"method.trainer.name: '{trainer}' learns from preference pairs (a chosen and a rejected "
                         f"response); task '{cfg.task.name}' has none (hh-rlhf, or a file task with "
                         "task.rejected_column)")


# settings that only classification reads, with the value a generation task needs
CLASSIFICATION_ONLY = {"model.readout": "auto", "model.calibration": "none", "model.pooling": "all",
                       "runtime.client_batch": 1}


def check_generation(cfg: ExperimentConfig) -> None:
    """A generation task is scored by the language-modelling objective: the classification readouts and their
    options, vectorised clients (stacked class logits) and the backdoor attack (label flips) cannot apply."""
    for field, need in CLASSIFICATION_ONLY.items():
        section, key = field.split(".")
        value = getattr(getattr(cfg, section), key)
        if value != need:
            raise ValueError(f"{field}: '{value}' applies to classification; task '{cfg.task.name}' is a generation "
                             f"task, scored by the response tokens' cross-entropy (leave {field} at '{need}')")
    if cfg.attack.active:
        raise ValueError(f"attack: the backdoor flips labels to a target class; task '{cfg.task.name}' is a "
                         "generation task and has none")


def check_combination(cfg: ExperimentConfig) -> None:
    if is_generation_config(cfg):
        check_generation(cfg)
    check_preference(cfg)
    AGGREGATORS.get(cfg.method.aggregator.name).check_federation(cfg.method.aggregator.typed_settings,
                                                                 cfg.federation.num_clients)
    if cfg.model.quantization != "none" and cfg.runtime.device == "cpu":
        raise ValueError(f"model.quantization: '{cfg.model.quantization}' quantizes with bitsandbytes on a CUDA GPU; "
                         "set runtime.device: cuda, or model.quantization: none on CPU")
    if cfg.runtime.gradient_checkpointing and not ADAPTERS.get(cfg.method.adapter.name).checkpointable:
        able = [e.name for e in ADAPTERS.entries() if e.obj.checkpointable]
        raise ValueError(f"runtime.gradient_checkpointing: adapter '{cfg.method.adapter.name}' does not declare "
                         "that a recomputed forward is safe (`checkpointable`: it feeds the model no key/value "
                         f"cache); it works with {', '.join(able)}")
    if cfg.runtime.padding_free and not is_generation_config(cfg):
        raise ValueError(f"runtime.padding_free: packs the training rows of a generation task; task "
                         f"'{cfg.task.name}' is a classification task (leave runtime.padding_free at false)")
    if cfg.runtime.padding_free and not ADAPTERS.get(cfg.method.adapter.name).packable:
        able = [e.name for e in ADAPTERS.entries() if e.obj.packable]
        raise ValueError(f"runtime.padding_free: adapter '{cfg.method.adapter.name}' puts rows or a key/value cache "
                         f"before each row's tokens, which one packed sequence cannot hold; it works with "
                         f"{', '.join(able)}")
    if cfg.runtime.gradient_checkpointing and cfg.runtime.client_batch > 1:
        raise ValueError("runtime.gradient_checkpointing: clients whose steps share one forward (client_batch > 1) "
                         "cannot hold their tensors in the model through the backward; keep client_batch 1")
    if cfg.model.quantization != "none" and cfg.method.adapter.name == "full":
        raise ValueError("model.quantization: full fine-tuning trains every weight, which quantized weights cannot "
                         "be; use an adapter (QLoRA: lora)")
    m = cfg.method
    trainer = TRAINERS.get(m.trainer.name)
    kind = trainer.kind
    if trainer.adapters is not None and m.adapter.name not in trainer.adapters:
        raise ValueError(f"method.trainer.name: '{m.trainer.name}' trains {' or '.join(sorted(trainer.adapters))}, "
                         f"not the adapter '{m.adapter.name}'")
    if getattr(trainer, "external", False) and cfg.task.name != TRAINERS_TASK:
        raise ValueError(f"method.trainer.name: '{m.trainer.name}' trains through the user's own trainers, whose data "
                         f"are task '{TRAINERS_TASK}' (fedpeft.integrations.transformers writes that config), not "
                         f"'{cfg.task.name}'")
    if cfg.runtime.client_batch > 1 and not trainer.vectorised:
        able = sorted(n for n in TRAINERS.names() if TRAINERS.get(n).vectorised)
        raise ValueError(f"runtime.client_batch: trainer '{m.trainer.name}' cannot run its clients' model calls "
                         f"together; these trainers can: {', '.join(able)}; keep 1")
    policy = exchange_record(m.stages())
    if cfg.runtime.client_batch > 1 and not policy.side_by_side:
        raise ValueError(f"runtime.client_batch: sharing '{policy.label}' with these settings cannot run its "
                         "clients side by side (it changes the shared model's settings during a client's step); "
                         "keep 1")
    needs: set[str] = set()
    wrappers = [(f"method.wrappers.{i}", w.name, WRAPPERS) for i, w in enumerate(m.wrappers)]
    for where, entry_name, registry in [("method.aggregator", m.aggregator.name, AGGREGATORS), *wrappers]:
        cls = registry.get(entry_name)
        if kind not in cls.accepts:
            allowed = sorted(n for n in AGGREGATORS.names() if kind in AGGREGATORS.get(n).accepts)
            accepted = " or ".join(KINDS[k] for k in sorted(cls.accepts))
            raise ValueError(f"{where}.name: '{entry_name}' combines {accepted}"
                             f"; trainer '{m.trainer.name}' uploads {KINDS[kind]} (aggregators for it: "
                             f"{', '.join(allowed)})")
        needs |= set(cls.needs)
        inner = getattr(cls, "inner_aggregators", None)
        if inner is not None and m.aggregator.name not in inner:
            raise ValueError(f"{where}.name: '{entry_name}' wraps only {', '.join(sorted(inner))}; set "
                             f"method.aggregator.name to it (not '{m.aggregator.name}')")
    name = policy.label
    missing = needs - set(trainer.provides) - set(policy.provides)
    if missing:
        raise ValueError(f"method.aggregator.name: '{m.aggregator.name}' reads {sorted(missing)} from every client, "
                         f"which neither trainer '{m.trainer.name}' nor sharing '{name}' uploads")
    if policy.aggregators is not None and m.aggregator.name not in policy.aggregators:
        raise ValueError(f"method.aggregator.name: sharing '{name}' uploads what only "
                         f"{' or '.join(sorted(policy.aggregators))} can combine, not '{m.aggregator.name}'")
    if (hasattr(trainer, "settings_for") and not ADAPTERS.get(m.adapter.name).differentiable
            and cfg.model.readout != "linear"):
        raise ValueError(f"method.trainer.name: '{m.trainer.name}' trains float tensors by gradient; adapter "
                         f"'{m.adapter.name}' has none (set model.readout: linear to train a head on it, or use "
                         "no-training)")
    if kind == NONE and policy.decides:
        raise ValueError(f"{_field(policy)}: '{name}' decides what a client trains and uploads; trainer "
                         f"'{m.trainer.name}' trains and uploads nothing (use method.sharing.name: all)")
    if AGGREGATORS.get(m.aggregator.name).reads_products and not policy.uploads_pairs:
        raise ValueError(f"method.aggregator.name: '{m.aggregator.name}' reads each client's LoRA product B_k A_k; "
                         f"sharing '{name}' keeps a factor on the clients, so the server never sees it (use fedavg)")
    if not getattr(m.trainer.typed_settings, "reset_optimizer", True) and not policy.same_tensors:
        raise ValueError(f"method.trainer.reset_optimizer: false carries optimizer moments from round to round; "
                         f"sharing '{name}' with these settings trains other tensors each round, so set it "
                         "true")
    if m.wrappers and not policy.deltas:
        raise ValueError(f"method.wrappers.0.name: '{m.wrappers[0].name}' works on each client's difference from the "
                         f"global model; sharing '{name}' uploads tensors that have none (e.g. fresh LoRA "
                         "blocks to stack), so it takes no server wrapper")
    if policy.adapters is not None and m.adapter.name not in policy.adapters:
        raise ValueError(f"{_field(policy)}: '{name}' shares the layers of "
                         f"{' or '.join(sorted(policy.adapters))}, not of the adapter '{m.adapter.name}'")
    for i, t in enumerate(m.transforms):
        if kind not in TRANSFORMS.get(t.name).accepts:
            raise ValueError(f"method.transforms.{i}.name: '{t.name}' transforms trained tensors; trainer "
                             f"'{m.trainer.name}' uploads {KINDS[kind]}")
    check_profiles(cfg)
    check_client_clipping(cfg)
    check_secure_aggregation(cfg)
    for field, registry in (("downlink", DOWNLINKS), ("post_tuning", POST_TUNING)):
        name = getattr(m, field).name
        adapters = registry.get(name).adapters
        if adapters is not None and m.adapter.name not in adapters:
            raise ValueError(f"method.{field}.name: '{name}' works on {' or '.join(sorted(adapters))}, not on the "
                             f"adapter '{m.adapter.name}'")


def _field(policy) -> str:
    """The config key that names the exchange: the one sharing stage, or the chain."""
    return "method.sharing.name" if len(policy.names) == 1 else "method.exchange"


def check_profiles(cfg: ExperimentConfig) -> None:
    """Resource tiers ask only what the method can honour: a rank needs a sharing policy that trains each client at
    its rank (``ranks``) and is at most the adapter's r; a step cap needs a gradient trainer."""
    m = cfg.method
    policy = exchange_record(m.stages())
    for i, p in enumerate(cfg.federation.client_profiles):
        where = f"federation.client_profiles.{i}"
        if p.rank is not None and not policy.ranked:
            ranked = sorted(n for n in SHARING.names() if SHARING.get(n).ranked)
            raise ValueError(f"{where}.rank: sharing '{policy.label}' sends every client the same tensors; clients "
                             f"of different LoRA ranks need method.sharing.name: {' or '.join(ranked)}")
        r = getattr(m.adapter.typed_settings, "r", None)
        if p.rank is not None and r is not None and p.rank > r:
            raise ValueError(f"{where}.rank: {p.rank} exceeds method.adapter.r ({r}), the global LoRA's rank")
        if p.max_steps is not None and not hasattr(TRAINERS.get(m.trainer.name), "settings_for"):
            raise ValueError(f"{where}.max_steps: trainer '{m.trainer.name}' takes no optimizer steps; a step cap "
                             "applies to the gradient trainers (adam, adamw, sgd)")


def check_secure_aggregation(cfg: ExperimentConfig) -> None:
    """Under secure aggregation the server learns only the sample-weighted mean of the replies' tensors: every
    component must need no more (``aggregators.base``'s ``secure_sum``, a sharing policy's ``summable``, a selector's
    ``reads_clients``). Refused here, with the reason; where the literature has a secure variant, the docs say."""
    secure = cfg.federation.secure_aggregation
    if cfg.faults.secure_stage is not None and (secure is None or cfg.runtime.name != "embedded"):
        raise ValueError("faults.secure_stage: drops clients at a SecAgg+ stage of the embedded runtime; set "
                         "federation.secure_aggregation and runtime.name: embedded, or leave it unset")
    if secure is None:
        return
    n = cfg.federation.clients_per_round or cfg.federation.num_clients
    if n * secure.quantization_range >= secure.modulus_range:
        raise ValueError(f"federation.secure_aggregation.modulus_range: {secure.modulus_range} cannot hold the sum of "
                         f"{n} clients' values of up to quantization_range {secure.quantization_range} (it wraps "
                         f"around); use a modulus above {n * secure.quantization_range} or a smaller "
                         "quantization_range")
    m = cfg.method
    agg = AGGREGATORS.get(m.aggregator.name)
    if not agg.secure_sum_with(m.aggregator.typed_settings):
        able = sorted(n for n in AGGREGATORS.names() if AGGREGATORS.get(n).secure_sum)
        settings = " with these settings (see its secure_sum_with)" if "secure_sum_with" in vars(agg) else ""
        raise ValueError(f"method.aggregator.name: '{m.aggregator.name}' needs each client's update{settings}; "
                         f"secure aggregation reveals only their weighted mean (aggregators that need no more: "
                         f"{', '.join(able)})")
    for i, w in enumerate(m.wrappers):
        if not WRAPPERS.get(w.name).secure_sum_with(w.typed_settings):
            raise ValueError(f"method.wrappers.{i}.name: '{w.name}' with these settings acts on each client's update "
                             "before aggregation, which secure aggregation hides from the server")
    trainer = TRAINERS.get(m.trainer.name)
    if trainer.kind not in ("params", "seeds"):
        raise ValueError(f"method.trainer.name: '{m.trainer.name}' uploads {KINDS[trainer.kind]}, not tensors to "
                         "sum (secure aggregation sums float tensors)")
    if not trainer.summable_with(m.trainer.typed_settings):
        raise ValueError(f"method.trainer.name: '{m.trainer.name}' uploads tensors that are not summed across "
                         "clients (token indices; method.trainer.upload: rows sends summable rows); secure "
                         "aggregation reveals only the sum")
    policy = exchange_record(m.stages())
    if not policy.summable:
        raise ValueError(f"{_field(policy)}: '{policy.label}' uploads what cannot be summed across clients "
                         "(see its summable note); secure aggregation reveals only the sum")
    if SELECTORS.get(m.selector.name).reads_clients:
        raise ValueError(f"method.selector.name: '{m.selector.name}' ranks clients by what each reported; under "
                         "secure aggregation use uniform or all")


def check_client_clipping(cfg: ExperimentConfig) -> None:
    """``dp_fedavg`` with ``clipping: client`` trusts the clients to clip to its S: the ``clip_delta`` transform must
    be there with that bound (its guarantee is void otherwise)."""
    m = cfg.method
    for i, w in enumerate(m.wrappers):
        s = w.typed_settings
        if w.name != "dp_fedavg" or s.clipping != "client":
            continue
        bounds = [t.typed_settings.max_norm for t in m.transforms if t.name == "clip_delta"]
        if bounds != [s.clip]:
            raise ValueError(f"method.wrappers.{i}.clipping: 'client' needs the clients to clip their deltas to "
                             f"clip={s.clip}: add method.transforms: [{{name: clip_delta, max_norm: {s.clip}}}] "
                             f"(found max_norm {bounds or 'none'})")
