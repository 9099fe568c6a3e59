"""Federated LoRA variants that exchange one factor, as presets over dense LoRA (``fedavg-lora``'s adapter and
trainer: r = 16 on q/k/v, AdamW), so that they differ from it in the sharing policy alone.

- ``ffa-lora``: FFA-LoRA (Sun et al., ICLR 2024): A frozen at its seeded initialisation, B trained and averaged
  (``sharing.lora_factors``); exact aggregation at half the bytes.
- ``fedsa-lora``: FedSA-LoRA (Guo et al., ICLR 2025): A averaged, B kept on each client; scored per client.
- ``hetlora``: HetLoRA (Cho et al., 2024): each client at its tier's rank (``sharing.lora_ranks``), zero-padded
  factors averaged by the norm of B·A (``aggregators.hetlora``), rank self-pruning.
- ``flexlora``: FlexLoRA (Bai et al., NeurIPS 2024): the same clients, the server averages B·A and re-factorises it
  by SVD (``aggregators.flexlora``); each client takes the leading components at its rank.
- ``fedex-lora``: FedEx-LoRA (Singhal et al., ACL 2025): FedAvg of A and B, and the residual Σ p_k B_k A_k − B̄Ā
  folded into the frozen weights each round (``sharing.fedex_residual``): exact, a full-size residual sent down.
- ``fed-sb``: Fed-SB (Singhal, Ponkshe et al. 2025): LoRA-SB's fixed B and A, initialised from an approximated
  first step of full fine-tuning (``adapters.lora_sb``, r = 24 as the authors' GLUE runs), with a trainable r x r R
  between them; only R is uploaded and averaged (``sharing.latent_only``): exact, r² numbers per module.
- ``fedper-lora``: FedPer (Arivazhagan et al. 2019) over dense LoRA: the LoRA of the base layers is federated, each
  client keeps its personalisation layers (the top layer's LoRA and the task head; ``sharing.private_tensors``);
  scored per client.
- ``flora``: FLoRA (Wang et al., NeurIPS 2024): clients merge the stacked global LoRA and train a fresh one at
  their rank; the server stacks the fresh factors (``aggregators.stacking``): exact, its download grows.

The tiers are a federation setting, e.g. three ranks under the global r = 16::

    federation:
      client_profiles:
        - {name: small, share: 0.34, rank: 4}
        - {name: medium, share: 0.33, rank: 8}
        - {name: large, share: 0.33, rank: 16}

Exchange stages that decide different things chain (``method.exchange``): ``exchange: [ranks, fedsa]`` trains each
tier at its rank with B kept on the clients; ``exchange: [head_pruning, private]`` prunes heads of a federated LoRA
with a private head.

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
preset("hetlora", "HetLoRA: clients at their tiers' LoRA ranks (federation.client_profiles), zero-padded "
       "aggregation weighted by the norm of B·A, rank self-pruning",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "hetlora"},
       sharing={"name": "ranks", "self_prune": True})
preset("flexlora", "FlexLoRA: clients at their tiers' LoRA ranks; the server averages B·A and hands each client the "
       "rank-r_k truncated SVD",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "flexlora"}, sharing={"name": "ranks"})
preset("flora", "FLoRA: clients merge the stacked global LoRA and train a fresh LoRA at their tiers' ranks; the "
       "server stacks them (exact aggregation of any mix of ranks)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "stack"},
       sharing={"name": "stacking"})
preset("fedper-lora", "FedPer over LoRA: the base layers' LoRA federated (FedAvg), the top layer's LoRA and the "
       "task head kept on each device (personalised)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"},
       sharing={"name": "private", "tensors": ["head.*"], "top_layers": 1})
preset("fedex-lora", "FedEx-LoRA: LoRA factors averaged (FedAvg) and the residual of the average folded into the "
       "frozen base weights each round (exact aggregation)",
       adapter=dict(DENSE_LORA), trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"}, sharing={"name": "fedex"})
preset("fed-sb", "Fed-SB: LoRA-SB's fixed B and A (SVD of an approximated first step) with a trainable r x r R "
       "between them; only R uploaded and averaged (FedAvg; exact, r² numbers per module)",
       adapter={"name": "lora_sb", "r": 24}, trainer=dict(DENSE_ADAMW), aggregator={"name": "fedavg"},
       sharing={"name": "fedsb"})
