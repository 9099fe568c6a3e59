"""Head pruning for federated LoRA (Venkatesha, Kundu & Panda) and its baselines (spec §5), as presets.

- ``headprune``: LoRA (r = 16, q/k/v) × AdamW (lr 5e-4, fresh each round, spec A6) × head importance pruning
  at 90 % (``sharing.head_pruning``, Eqs. 6–7) × head-weighted aggregation (``aggregators.head_weighted``,
  Eq. 8) × loss-difference selection (``selection.loss_difference``, Eq. 9).
- ``fedavg-lora``: B1, dense LoRA and FedAvg (Eq. 5), random selection (``method.selector.name=loss_difference``
  for B1 with loss selection); OPs still reported (``scoring: none``).
- ``headprune-random``: B2, random heads pruned at the same sparsity, plain FedAvg (spec A10).
- ``headprune-rand-cs``: the full method with random client selection ("Ours Rand", Table 1).
"""

from fedpeft.methods.base import preset

DENSE_LORA = {"name": "lora", "r": 16, "lora_alpha": 32.0}
# paper: lr 5e-4, batch 80, one local epoch; batch scaled to CPU
DENSE_ADAMW = {"name": "adamw", "lr": 5e-4, "batch_size": 16, "local_epochs": 1.0, "weight_decay": 0.0,
               "grad_clip": 1.0, "reset_optimizer": True}

preset("headprune", "Head pruning for federated LoRA: importance-pruned heads (s = 0.9), head-weighted "
       "aggregation (Eq. 8), loss-difference selection (Eq. 9)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "head_weighted"},
       sharing={"name": "head_pruning", "sparsity": 0.9, "scoring": "importance"},
       selector={"name": "loss_difference"})
preset("headprune-rand-cs", "Head pruning (s = 0.9, Eq. 8) with random client selection (Ours Rand)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "head_weighted"},
       sharing={"name": "head_pruning", "sparsity": 0.9, "scoring": "importance"})
preset("headprune-random", "B2: LoRA with random heads pruned (s = 0.9) and plain FedAvg",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"},
       sharing={"name": "head_pruning", "sparsity": 0.9, "scoring": "random"})
preset("fedavg-lora", "B1: dense LoRA (r = 16, q/k/v) with FedAvg",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"},
       sharing={"name": "head_pruning", "sparsity": 0.0, "scoring": "none"})
