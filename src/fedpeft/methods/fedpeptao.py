"""FedPepTAO (Che et al., EMNLP 2023) and its ablations as presets (spec §5).

FedPepTAO = deep prompts (``adapters.deep_prompt``) × client AdamW (``trainers.gradient``) × server momentum
with control variates (``aggregators.momentum_cv``, Alg. 2) × score-selected shared layers after t warm-up
rounds (``sharing.layer_selection``, Alg. 1). ``fedavg-prefix`` is P-tuning v2 + FedAvg with every layer
exchanged; the others are the paper's optimiser ablations (Table 5).

Personalisation baselines that FedPepTAO's private layers should beat (not in the paper), with its adapter and
client optimiser; ``local-only`` and ``fedavg-ft`` work with any adapter (``method.adapter.name``):

- ``local-only``: each client trains its own tensors and never aggregates (``sharing.private`` ``local``);
- ``fedavg-ft``: FedAvg on every layer, then each client fine-tunes the final global tensors on its whole
  training shard before it is scored (``post_tuning.gradient`` with ``shots: null``);
- ``fedper`` / ``lg-fedavg``: a fixed private split from round 1, the top / bottom k prompt layers kept on each
  client (``sharing.private`` ``fixed_split``; default k = ⌊L/2⌋, as many shared layers as FedPepTAO at r = 0.5).
"""

from fedpeft.methods.base import preset

_ADAPTER = {"name": "deep_prompt", "num_tokens": 8}
# client AdamW as in the official code (A13): lr 4e-2, betas (0.9, 0.999), wd 0.1, clip 1.0, reset every round
_ADAMW = {"name": "adamw", "lr": 4e-2, "batch_size": 8, "local_epochs": 2.0, "weight_decay": 0.1,
          "grad_clip": 1.0, "reset_optimizer": True}
_SGD = {"name": "sgd", "lr": 0.1, "batch_size": 8, "local_epochs": 2.0, "grad_clip": 1.0, "reset_optimizer": True}
_MOMD = _SGD | {"momentum": 0.9}
_SERVER = {"name": "momentum_cv", "server_lr": 1e-3, "momentum": 0.9}
_FEDAVGM = _SERVER | {"server_lr": 1.0, "momentum_input": "pseudo_grad", "base": "previous"}
_SELECT = {"name": "layer_selection", "warmup_rounds": 5}
_ALL_LAYERS = {"name": "layer_selection", "warmup_rounds": None}


def _preset(name: str, description: str, trainer: dict, aggregator: dict, sharing: dict) -> None:
    preset(name, description, adapter=dict(_ADAPTER), trainer=dict(trainer), aggregator=dict(aggregator),
           sharing=dict(sharing))


_preset("fedpeptao", "FedPepTAO (Che et al. 2023): deep prompts, score-selected shared layers after t warm-up "
        "rounds, client AdamW + server momentum with control variates", _ADAMW, _SERVER, _SELECT)
_preset("fedavg-prefix", "P-tuning v2 + FedAvg: deep prompts on every layer, all layers exchanged",
        _ADAMW, {"name": "fedavg"}, _ALL_LAYERS)
_preset("moms-adamd", "MomS+AdamD ablation: client AdamW, server momentum without control variates, all layers",
        _ADAMW, _SERVER | {"control_variates": False}, _ALL_LAYERS)
_preset("momd", "MomD ablation: client SGD with momentum (reset per round), FedAvg server, all layers",
        _MOMD, {"name": "fedavg"}, _ALL_LAYERS)
_preset("moms", "MomS ablation: client SGD, FedAvgM server momentum (Reddi et al.), all layers",
        _SGD, _FEDAVGM | {"control_variates": False}, _ALL_LAYERS)
_preset("moms-con", "MomS+Con ablation: client SGD, server momentum + control variates, all layers",
        _SGD, _FEDAVGM | {"control_variates": True}, _ALL_LAYERS)
_preset("adamd", "AdamD ablation: client AdamW (reset per round), FedAvg server, all layers",
        _ADAMW, {"name": "fedavg"}, _ALL_LAYERS)

preset("local-only", "Local-only: every client trains its own deep prompts and never aggregates; scored on its "
       "own test shard", adapter=dict(_ADAPTER), trainer=dict(_ADAMW), aggregator={"name": "fedavg"},
       sharing={"name": "local"})
preset("fedavg-ft", "FedAvg + FT: FedAvg on every layer, then each client fine-tunes the final global prompts on "
       "its training shard before it is scored", adapter=dict(_ADAPTER), trainer=dict(_ADAMW),
       aggregator={"name": "fedavg"},
       post_tuning={"name": "gradient", "shots": None, "select": "last", "lr": 4e-2, "batch_size": 8, "steps": 20})
_preset("fedper", "FedPer split: the top k prompt layers stay on each client from round 1, the others are "
        "federated (FedAvg)", _ADAMW, {"name": "fedavg"}, {"name": "fixed_split", "private": "top"})
_preset("lg-fedavg", "LG-FedAvg split: the bottom k prompt layers stay on each client from round 1, the others are "
        "federated (FedAvg)", _ADAMW, {"name": "fedavg"}, {"name": "fixed_split", "private": "bottom"})
