"""Federate your own transformers ``Trainer`` or TRL ``SFTTrainer`` or ``DPOTrainer``: one per client, each on its
client's data, with a fedpeft method on the server.

Your script builds its trainers as usual (a PEFT model with one LoRA adapter, a dataset, its ``TrainingArguments`` or
``SFTConfig``) and hands them over::

    fed = federate([trainer_a, trainer_b, trainer_c], rounds=5, local_steps=20, method="fedit")
    summary = fed.run("runs/mine")           # in this process: fedpeft's embedded runtime

or, under Flower, ``client_app(make_trainer)`` is the ClientApp each node runs (``make_trainer(client_id)`` builds that
node's trainer; the config comes with every message) and ``server_federation(trainer, num_clients=...)``'s
``serve(grid, out_dir)`` the ServerApp's body (``fed.run_flower_sim`` runs both in Flower's simulation). The
trainers of one process may share one PEFT model. A run is an ordinary fedpeft run directory: metrics, bytes per
client and direction, checkpoints, ``--resume``, report, ``fedpeft export``.

What happens, and where (each module's doc says why it is so):

- the clients' data are their trainers' prepared rows, the backbone their base model shared in place, the adapter
  fedpeft's ``lora`` at the trainers' r, alpha and modules (``integrations.trainer_data``, ``backbones.shared``,
  ``adapters.peft_model``);
- each round, a client's ``hf_trainer`` writes the global tensors into its PEFT model, runs ``local_steps`` of its
  own ``train()``, the learning-rate schedule running over rounds × local steps and the optimizer state over the
  client's rounds, and hands the trained tensors to the method's exchange (``trainers.hf_trainer``,
  ``trainers.hf_rounds``): the codec counts the bytes, the server validates and aggregates the replies as any
  client's;
- the global adapter (and each client's, under ``evaluation.local``) is scored by fedpeft's language-modelling
  objective on the trainers' ``eval_dataset`` rows: the loss per scored token (SFTTrainer's ``eval_loss``),
  perplexity and next-token accuracy;
- DPOTrainers' pairs make a preference task (``integrations.trainer_data``), trained by ``hf_dpo_trainer`` (the same
  round through the trainer's own DPO ``train()``) and scored as fedpeft's ``dpo`` trainer scores, with the
  trainers' ``beta``, ``loss_type`` and ``label_smoothing``, against the base model with the adapter disabled (TRL's
  reference for a PEFT model): reward accuracy, DPO loss, rewards (``trainers.hf_dpo_trainer``).

Supported: causal LMs under ``Trainer``, ``SFTTrainer`` or ``DPOTrainer`` with a PEFT LoRA adapter; methods whose
client trains the LoRA tensors it receives: the FedAvg and FedOpt families (``fedit``, ``fedavg-lora``,
``method.aggregator``), FFA-LoRA (``ffa-lora``), rank tiers (``flexlora``, ``hetlora`` without self-pruning: trainers
whose LoRA ranks differ make ``federation.client_profiles``, one tier per rank, all at one scaling alpha/r), robust
aggregators, ``method.wrappers`` (clipping, DP-FedAvg), secure aggregation (``federation.secure_aggregation``), client
selection (``federation.clients_per_round``). Refused with an error
naming the option: models that are not PEFT LoRA models, and LoRA settings fedpeft's adapter does not compute (the
list in ``adapters.peft_model``); trainer options a round cannot keep (``trainers.hf_trainer``); exchanges that
reshape the client's training (head pruning, HetLoRA's penalty, static backbone weights) or send it tensors its PEFT
model does not hold (FedEx-LoRA's residuals, FLoRA's stacked ranks); evaluation that re-tokenizes
prompts in fedpeft's own format (``evaluation.generate_every``, ``suites``, ``round_suites``, ``keep_best``); forked
client workers; what fedpeft's DPO scoring cannot follow (``trainers.hf_dpo_trainer``). Not yet: quantized base
models, several processes per client, multi-turn rows scored in several blocks.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fedpeft.config import ExperimentConfig, TaskConfig
from fedpeft.data.tasks.trainers import NAME
from fedpeft.integrations.trainer_data import TrainerExperiment, eval_set, is_pair_row, trainer_experiment
from fedpeft.resolve import load_config
from fedpeft.trainers.hf_dpo_trainer import dpo_settings, is_dpo_trainer
from fedpeft.trainers.hf_trainer import check_trainer

__all__ = ["Federation", "client_app", "federate", "federation_config", "server_federation"]

TRAINER = "hf_trainer"
DPO_TRAINER = "hf_dpo_trainer"


def _row_length(row: Mapping[str, Any], cap: int | None) -> int:
    """A prepared row's tokens (a pair's longer sequence, within the DPO collator's ``cap``)."""
    if is_pair_row(row):
        n = len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))
        return min(n, cap) if cap else n
    return len(row.get("input_ids", ()))


def _longest(trainers: Sequence[Any]) -> int:
    """The longest prepared row of every trainer's datasets (``task.max_length`` holds it: the rows are the trainers'
    own, never cut here; ``fedpeft generate`` on the run frames prompts in fedpeft's format within it)."""
    longest = 0
    for t in trainers:
        cap = getattr(t.args, "max_length", None) if is_dpo_trainer(t) else None
        for ds in (t.train_dataset, eval_set(t)):
            if ds is not None and len(ds):
                longest = max(longest, max(_row_length(ds[i], cap) for i in range(len(ds))))
    return longest


def _trainer_keys(trainers: Sequence[Any]) -> dict[str, Any]:
    """The trainer axis of the config: ``hf_dpo_trainer`` with the DPOConfig's loss for DPOTrainers (all alike),
    ``hf_trainer`` for the others."""
    dpo = [is_dpo_trainer(t) for t in trainers]
    if any(dpo) != all(dpo):
        raise ValueError("trainers: all DPOTrainers or none (one task per federation: preference pairs or rows)")
    if not all(dpo):
        return {"task.kind": "generation", "method.trainer.name": TRAINER}
    settings = [dpo_settings(t) for t in trainers]
    if any(s != settings[0] for s in settings):
        raise ValueError(f"trainers: their DPOConfigs differ in beta, loss_type or label_smoothing ({settings[0]} "
                         "and others); the server scores every client with one")
    return {"task.kind": "preference", "method.trainer.name": DPO_TRAINER,
            **{f"method.trainer.{k}": v for k, v in settings[0].items()}}


def federation_config(trainers: Sequence[Any], *, rounds: int, local_steps: int | None = None,
                      method: str = "fedit", seed: int = 0, model_name: str | None = None,
                      settings: Mapping[str, Any] | None = None, num_clients: int | None = None) -> ExperimentConfig:
    """The fedpeft config of a federation of ``trainers`` (the module doc); ``settings``: any further config keys,
    dotted (``{"method.aggregator.name": "fedadam", "federation.secure_aggregation": {...}}``), applied last;
    ``num_clients``: the federation's clients where ``trainers`` are not all of them (a Flower server's)."""
    if rounds < 1:
        raise ValueError(f"rounds: at least 1, got {rounds}")
    views = [check_trainer(t) for t in trainers]
    lora = max(views, key=lambda v: v.rank)  # the global adapter: the largest rank (tiers below it)
    base = trainers[0].model.get_base_model().config
    name = model_name or getattr(base, "_name_or_path", "") or ""
    if not name:
        raise ValueError("model_name: the trainers' model was built in code (its config names no checkpoint); name "
                         "it (a hub id, a folder, or a fedpeft backbone such as tiny-llama) so that the run records "
                         "which weights its adapter belongs to")
    room = max(_longest(trainers) + 1, TaskConfig.model_fields["max_length"].default)  # every row fits
    keys: dict[str, Any] = {
        "seed": seed, "method.name": method, "task.name": NAME, "task.max_length": room,
        "model.name": name, "federation.num_clients": num_clients or len(trainers), "federation.rounds": rounds,
        "evaluation.generate_every": 0, "method.adapter.name": "lora",
        **{f"method.adapter.{k}": v for k, v in lora.settings().items()}, **_tiers(views, lora)}
    other = dict(settings or {})
    ours = _trainer_keys(trainers)
    if other.get("method.trainer.name", ours["method.trainer.name"]) == ours["method.trainer.name"]:
        local_steps = local_steps or _split_steps(trainers[0].args.max_steps, rounds)
        keys |= ours | {"method.trainer.local_steps": local_steps,
                        "method.trainer.schedule_steps": rounds * local_steps}
    else:
        keys["task.kind"] = ours["task.kind"]
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in (keys | other).items()])
    check_config(cfg)
    return cfg


def _tiers(views: Sequence[Any], top: Any) -> dict[str, Any]:
    """``federation.client_profiles`` naming each client's tier by its trainer's LoRA rank, where the ranks differ
    (HetLoRA, FlexLoRA: each client trains at its own rank r_k, one scaling alpha/r for all, as fedpeft's ``lora``
    computes it); ValueError naming a trainer whose LoRA differs otherwise."""
    if len({v.rank for v in views}) == 1:
        return {}
    scaling = top.config.lora_alpha / top.rank
    for c, v in enumerate(views):
        if abs(v.config.lora_alpha / v.rank - scaling) > 1e-12 * scaling:
            raise ValueError(f"trainers: client {c}'s LoRA scales by lora_alpha/r = {v.config.lora_alpha}/{v.rank}, "
                             f"the rank-{top.rank} adapter's by {top.config.lora_alpha}/{top.rank}; tiers of LoRA "
                             f"ranks share one scaling: set its lora_alpha to {scaling * v.rank:g}")
        if v.modules != top.modules:
            raise ValueError(f"trainers: client {c}'s LoRA adapts other modules than the rank-{top.rank} adapter's")
    ranks = sorted({v.rank for v in views})
    return {"federation.client_profiles": [
        {"name": f"r{r}", "rank": r, "clients": [c for c, v in enumerate(views) if v.rank == r]} for r in ranks]}


def _split_steps(max_steps: int, rounds: int) -> int:
    """The steps per round of a trainer's ``max_steps`` split evenly over the rounds."""
    if max_steps <= 0 or max_steps % rounds:
        raise ValueError(f"local_steps: give the optimizer steps per round, or set TrainingArguments.max_steps to a "
                         f"multiple of rounds ({rounds}), split evenly over them (it is {max_steps})")
    return max_steps // rounds


def check_config(cfg: ExperimentConfig) -> None:
    """ValueError naming a setting a federation of trainers cannot honour (the module doc)."""
    ev, rt = cfg.evaluation, cfg.runtime
    refusals = [
        (cfg.task.name != NAME, f"task.name: a federation of trainers reads the trainers' data (task '{NAME}')"),
        (ev.generate_every not in (0, None) or ev.suites or ev.round_suites,
         "evaluation.generate_every, suites, round_suites: generating re-tokenizes prompts in fedpeft's own format, "
         "not your trainer's; leave them off (evaluate with your trainer on the exported adapter)"),
        (ev.keep_best, "evaluation.keep_best: the validation split would come from fedpeft's own task loading"),
        (rt.client_workers > 1, "runtime.client_workers: the trainers live in this process; leave it at 1"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(why)


@dataclass
class Federation:
    """A federation of transformers trainers: its resolved config and experiment (``federate`` makes one)."""

    config: ExperimentConfig
    experiment: TrainerExperiment

    def run(self, out_dir: str | Path, resume: bool = False, stop_after_round: int | None = None,
            reply_hook: Any = None) -> dict[str, Any]:
        """Run (or resume) the rounds in this process (fedpeft's embedded runtime); returns summary.json's dict.
        ``reply_hook(round, client, bytes) -> bytes`` stands for the wire (tests corrupt a reply with it)."""
        from fedpeft.runtime.embedded import run_embedded

        if set(self.experiment.trainers) != set(range(self.config.federation.num_clients)):
            raise ValueError("run: this process holds the trainers of clients "
                             f"{sorted(self.experiment.trainers)} of {self.config.federation.num_clients}; the "
                             "embedded runtime trains them all here (serve the others under Flower)")
        return run_embedded(self.config, out_dir, resume, stop_after_round, reply_hook, experiment=self.experiment)

    def serve(self, grid: Any, out_dir: str | Path, **kwargs: Any) -> dict[str, Any]:
        """The rounds with the clients reached through a Flower ``Grid`` (the body of your ServerApp's main; the
        nodes run ``client_app``); ``kwargs``: ``runtime.flower.server_app.serve``'s."""
        from fedpeft.runtime.flower.server_app import serve

        return serve(grid, self.config, out_dir, experiment=self.experiment, **kwargs)

    def run_flower_sim(self, out_dir: str | Path, make_trainer: Callable[[int], Any],
                       resume: bool = False) -> dict[str, Any]:
        """The rounds in Flower's simulation runtime: this process serves, each virtual node builds its client's
        trainer with ``make_trainer(client_id)`` (picklable: a module-level function) in its own process."""
        from fedpeft.runtime.flower.simulation import run_flower_sim

        return run_flower_sim(self.config, out_dir, resume, client_app=client_app(make_trainer),
                              experiment=self.experiment)


def federate(trainers: Sequence[Any] | Mapping[int, Any], *, rounds: int, local_steps: int | None = None,
             method: str = "fedit", seed: int = 0, model_name: str | None = None,
             settings: Mapping[str, Any] | None = None) -> Federation:
    """A federation of ``trainers`` (client ``i`` trains with ``trainers[i]``): ``rounds`` rounds of ``local_steps``
    optimizer steps each (default: each trainer's ``max_steps`` split over the rounds), the method preset
    ``method`` with its components, any further config keys in ``settings``. ``model_name``: what the base model
    is loaded as later (a hub id or a folder; default: its config's ``name_or_path``). Errors name what is not
    supported (the module doc)."""
    listed = [trainers[c] for c in sorted(trainers)] if isinstance(trainers, Mapping) else list(trainers)
    if isinstance(trainers, Mapping) and sorted(trainers) != list(range(len(listed))):
        raise ValueError(f"trainers: client ids must be 0..{len(listed) - 1}, got {sorted(trainers)}")
    if not listed:
        raise ValueError("trainers: none given")
    cfg = federation_config(listed, rounds=rounds, local_steps=local_steps, method=method, seed=seed,
                            model_name=model_name, settings=settings)
    return Federation(cfg, trainer_experiment(cfg, dict(enumerate(listed))))


def server_federation(trainer: Any, *, num_clients: int, rounds: int, local_steps: int | None = None,
                      method: str = "fedit", seed: int = 0, model_name: str | None = None,
                      settings: Mapping[str, Any] | None = None) -> Federation:
    """The federation as a Flower server without the clients' trainers sees it (``Federation.serve``): ``trainer``,
    of the clients' model and LoRA settings and the same ``TrainingArguments`` (``local_steps``' default), gives the
    backbone, the adapter and, from its ``eval_dataset``, the global test set; each reply's ``num_examples`` is
    taken as its client's weight."""
    cfg = federation_config([trainer], rounds=rounds, local_steps=local_steps, method=method, seed=seed,
                            model_name=model_name, settings=settings, num_clients=num_clients)
    return Federation(cfg, trainer_experiment(cfg, {}, server=trainer))


# ---------------------------------------------------------------- Flower nodes

_NODE_LOCK = threading.Lock()
_NODE_BUILT: dict[tuple[str, tuple[int, ...]], Any] = {}  # one federation per node process, built once


def _node_built(make_trainer: Callable[[int], Any], config_yaml: str, node_config: dict[str, Any]) -> Any:
    """What a node's clients train with: the run's config (sent with every message), the node's trainers made by
    ``make_trainer``, their experiment and the method; built once per process."""
    import yaml

    from fedpeft.build import Built, build_method, run_plan
    from fedpeft.resolve import resolve
    from fedpeft.runtime.flower.client_app import owned_clients

    ids = tuple(owned_clients(node_config))
    with _NODE_LOCK:
        key = (config_yaml, ids)
        if key not in _NODE_BUILT:
            cfg = resolve(yaml.safe_load(config_yaml))
            check_config(cfg)
            exp = trainer_experiment(cfg, {c: make_trainer(c) for c in ids})
            _NODE_BUILT.clear()  # a node serves one federation at a time: the last run's trainers go
            _NODE_BUILT[key] = Built(run_plan(cfg), exp, build_method(cfg, exp))
        return _NODE_BUILT[key]


def client_app(make_trainer: Callable[[int], Any]) -> Any:
    """A Flower ``ClientApp`` serving fedpeft's ServerApp with your trainers: the node's clients (``partition-ids``,
    in simulation its ``partition-id``) each get ``make_trainer(client_id)``, built once per process; everything
    else (state on disk between rounds, secure aggregation, errors reported per client) is fedpeft's ClientApp
    (``runtime.flower.client_app``)."""
    from fedpeft.runtime.flower.client_app import make_client_app

    return make_client_app(partial(_node_built, make_trainer))
