"""The table every registered component needs a row in: the least settings it validates with (the smallest that
still exercise it, as ``tests/conformance/test_presets.py`` runs them), and for aggregators how the shared tests drive
them.

A component registered without a row fails ``test_registries.py`` with the row to add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
from fedpeft.model import OBJECTIVES
from fedpeft.model.readouts import READOUTS
from fedpeft.tracking.sinks import SINKS

REGISTRIES = dict(AXIS_REGISTRIES | LIST_REGISTRIES, objective=OBJECTIVES, readout=READOUTS, tracking=SINKS)

# axis -> name -> the least settings (keys of its settings model) it needs
LEAST: dict[str, dict[str, dict[str, Any]]] = {
    "adapter": {"deep_prompt": {"num_tokens": 2}, "demonstrations": {}, "full": {}, "lora": {"r": 2},
                "lora_sb": {"r": 2}, "p_tuning": {"num_tokens": 3},
                "projected_prompt": {"num_tokens": 3, "intrinsic_dim": 8}, "soft_prompt": {"num_tokens": 3},
                "template_only": {}, "token_prompt": {"num_tokens": 3}},
    "trainer": {"adam": {"max_steps": 2}, "adamw": {"max_steps": 2}, "sgd": {"max_steps": 2},
                "cmaes": {"iterations": 2}, "discrete_search": {"steps": 3}, "no-training": {},
                "dpo": {"max_steps": 2}, "zo_sgd": {"local_steps": 2, "pool_size": 64},
                "hf_trainer": {"local_steps": 2}, "hf_dpo_trainer": {"local_steps": 2}},
    "aggregator": {"fedavg": {}, "uniform": {}, "fedavgm": {}, "fedadam": {}, "fedyogi": {}, "fedadagrad": {},
                   "median": {}, "trimmed_mean": {}, "krum": {"num_malicious": 1},
                   "multi_krum": {"num_malicious": 1, "num_selected": 3}, "momentum_cv": {}, "keep-global": {},
                   "hetlora": {}, "flexlora": {}, "stack": {}, "head_weighted": {}, "server_cmaes": {},
                   "seed_replay": {}},
    "wrappers": {"clip": {"max_norm": 0.5}, "dp_fedavg": {"clip": 1.0, "noise_multiplier": 0.5},
                 "dp_seeds": {"clip": 1.0, "noise_multiplier": 0.5}, "outlier_filter": {}},
    "selector": {"all": {}, "uniform": {}, "loss_difference": {}},
    "sharing": {"all": {}, "ffa": {}, "fedsa": {}, "local": {}, "fixed_split": {}, "head_pruning": {},
                "layer_selection": {"warmup_rounds": 1}, "ranks": {}, "stacking": {}, "private": {}, "fedex": {},
                "fedsb": {}},
    "downlink": {"dense": {}, "full16": {}, "analogy": {}, "pca": {"components": 2}, "quant": {}, "seed_history": {}},
    "post_tuning": {"none": {}, "bbt": {"iterations": 2, "intrinsic_dim": 8, "popsize": 4, "shots": 2},
                    "gradient": {"steps": 2, "shots": 2}},
    "transforms": {"clip_delta": {"max_norm": 1.0}, "ldp": {"noise": 0.1}, "scale_delta": {"factor": 2.0}},
    "objective": {"classification": {}, "generation": {}, "preference": {}},
    "readout": {"linear": {}, "similarity": {}, "verbalizer": {}},
    "tracking": {"mlflow": {}, "tensorboard": {}, "wandb": {}},
}


@dataclass(frozen=True)
class AggregatorCase:
    """How the shared aggregator tests drive one rule."""

    updates: str = "plain"           # plain: tensors a, b; lora: one module's lora_A / lora_B
    compare: str = "tensors"         # tensors, or product: B·A per module (the rule may refactor the factors)
    fixed_point: bool = False        # n identical updates x_c give x_c
    zero_fixed_point: bool = True    # updates equal to the global leave it unchanged
    inner: str = "fedavg"            # a wrapper's inner aggregator
    skip: str = ""                   # why the shared tests cannot drive it (and where it is tested instead)


AGGREGATOR_CASES: dict[str, AggregatorCase] = {
    "fedavg": AggregatorCase(fixed_point=True), "uniform": AggregatorCase(fixed_point=True),
    # the server optimisers step x_t + η m/(√v + τ) (or with momentum): their only fixed point is a zero
    # pseudo-gradient
    "fedavgm": AggregatorCase(), "fedadam": AggregatorCase(), "fedyogi": AggregatorCase(),
    "fedadagrad": AggregatorCase(),
    "median": AggregatorCase(fixed_point=True), "trimmed_mean": AggregatorCase(fixed_point=True),
    "krum": AggregatorCase(fixed_point=True), "multi_krum": AggregatorCase(fixed_point=True),
    "momentum_cv": AggregatorCase(fixed_point=True),  # round 1 has no server step (A16): w = w̄
    "keep-global": AggregatorCase(skip="accepts no updates: the zero-shot baselines train nothing"),
    "hetlora": AggregatorCase(updates="lora", fixed_point=True),
    "flexlora": AggregatorCase(updates="lora", compare="product", fixed_point=True),
    "stack": AggregatorCase(skip="the stack's rank grows with the clients (tests/methods/test_lora_ranks.py)"),
    "head_weighted": AggregatorCase(skip="needs an adapter's head slices (tests/methods/test_headprune.py)"),
    "server_cmaes": AggregatorCase(skip="accepts CMA-ES distributions, not tensors (tests/methods/test_fedbpt.py)"),
    "seed_replay": AggregatorCase(skip="accepts zeroth-order scalars, not tensors (tests/unit/test_zeroth_order.py)"),
    "clip": AggregatorCase(fixed_point=True),  # x_c within the clipping norm of x_t
    "dp_fedavg": AggregatorCase(inner="uniform", zero_fixed_point=False),  # the noise moves the mean
    "dp_seeds": AggregatorCase(skip="accepts zeroth-order scalars, not tensors (tests/unit/test_zeroth_order.py)"),
    "outlier_filter": AggregatorCase(fixed_point=True),
}


@dataclass(frozen=True)
class AdapterCase:
    """How the shared adapter tests train one adapter (any trainer that can: no preset is involved)."""

    trainer: dict[str, Any] = None  # method.trainer; None: Adam for 2 steps of batch 8
    aggregator: str = "fedavg"
    generation: bool = True          # it also tunes a causal LM to generate
    trains: bool = True              # it has tensors to train and upload


ADAM = {"name": "adam", "max_steps": 2, "batch_size": 8}
ADAPTER_CASES: dict[str, AdapterCase] = {
    "soft_prompt": AdapterCase(), "deep_prompt": AdapterCase(), "lora": AdapterCase(), "full": AdapterCase(),
    "p_tuning": AdapterCase(), "lora_sb": AdapterCase(),
    "projected_prompt": AdapterCase(trainer={"name": "cmaes", "iterations": 2}),
    "token_prompt": AdapterCase(trainer={"name": "discrete_search", "steps": 3}, aggregator="uniform"),
    "template_only": AdapterCase(trainer={"name": "no-training"}, aggregator="keep-global", generation=False,
                                 trains=False),
    "demonstrations": AdapterCase(trainer={"name": "no-training"}, aggregator="keep-global", generation=False,
                                  trains=False),
}


def adapter_case(name: str) -> AdapterCase:
    return _row(ADAPTER_CASES, "adapter", name, f"ADAPTER_CASES['{name}'] = AdapterCase(...) (a trainer that trains "
                "it, whether it generates)")


# trainer -> an adapter it trains, and the aggregator that takes its updates
TRAINER_CASES: dict[str, tuple[str, str]] = {
    "adam": ("soft_prompt", "fedavg"), "adamw": ("lora", "fedavg"), "sgd": ("deep_prompt", "fedavg"),
    "cmaes": ("projected_prompt", "fedavg"), "discrete_search": ("token_prompt", "uniform"),
    "no-training": ("template_only", "keep-global"), "dpo": ("lora", "fedavg"), "zo_sgd": ("full", "seed_replay"),
}
# trainer -> the task and model it needs where the default tiny classification task does not serve
TRAINER_TASKS: dict[str, dict[str, Any]] = {
    "dpo": {"task.name": "synthetic-preference", "model.name": "tiny-llama", "task.max_length": 64,
            "task.max_response_length": 8},
}


# trainers the shared one-round tests cannot drive from a config alone, and where they are tested instead
TRAINER_SKIPS: dict[str, str] = {
    "hf_trainer": "trains through the user's transformers Trainer, which a config alone does not hold "
                  "(tests/unit/test_integrations_transformers.py)",
    "hf_dpo_trainer": "trains through the user's TRL DPOTrainer, which a config alone does not hold "
                      "(tests/unit/test_integrations_dpo.py)",
}


def trainer_case(name: str) -> tuple[str, str]:
    return _row(TRAINER_CASES, "trainer", name, f"TRAINER_CASES['{name}'] = (an adapter it trains, an aggregator of "
                "its updates)")


def least(axis: str, name: str) -> dict[str, Any]:
    """The row of ``name`` on ``axis``, or a failure that says what to add."""
    return _row(LEAST.get(axis, {}), axis, name, f"LEAST['{axis}']['{name}'] = {{...the least settings it needs...}}")


def aggregator_case(name: str) -> AggregatorCase:
    return _row(AGGREGATOR_CASES, "aggregator", name, f"AGGREGATOR_CASES['{name}'] = AggregatorCase(...) (how its "
                "updates look, its fixed points, or why the shared tests cannot drive it)")


def _row(table: dict[str, Any], what: str, name: str, add: str) -> Any:
    if name not in table:
        raise AssertionError(f"{what} '{name}' is registered but has no row in tests/conformance/cases.py: add {add}")
    return table[name]


def registered() -> list[tuple[str, str]]:
    return [(axis, name) for axis, reg in REGISTRIES.items() for name in reg.names()]
