"""FedPepTAO (Che et al., EMNLP 2023) and its ablations as presets (spec §5).

FedPepTAO = deep prompts (``adapters.deep_prompt``) × client AdamW (``trainers.gradient``) × server momentum
with control variates (``aggregators.momentum_cv``, Alg. 2) × score-selected shared layers after t warm-up
rounds (``sharing.layer_selection``, Alg. 1). ``fedavg-prefix`` is P-tuning v2 + FedAvg with every layer
exchanged; the others are the paper's optimiser ablations (Table 5).
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
