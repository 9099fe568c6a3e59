"""Federated LoRA variants that exchange one factor, as presets over dense LoRA (``fedavg-lora``'s adapter and
trainer: r = 16 on q/k/v, AdamW), so that they differ from it in the sharing policy alone.

- ``ffa-lora``: FFA-LoRA (Sun et al., ICLR 2024): A frozen at its seeded initialisation, B trained and averaged
  (``sharing.lora_factors``); exact aggregation at half the bytes.
- ``fedsa-lora``: FedSA-LoRA (Guo et al., ICLR 2025): A averaged, B kept on each client; scored per client.

On generation tasks give the same sharing to ``fedit``: ``method.name=fedit method.sharing.name=ffa``.
"""

from fedpeft.methods.base import preset
from fedpeft.methods.headprune import DENSE_ADAMW, DENSE_LORA

preset("ffa-lora", "FFA-LoRA: LoRA with A frozen at its seeded initialisation; only B trained and exchanged, "
       "FedAvg (exact, half the bytes)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"}, sharing={"name": "ffa"})
preset("fedsa-lora", "FedSA-LoRA: LoRA with A shared and averaged, B trained and kept on each client "
       "(personalised)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"}, sharing={"name": "fedsa"})
