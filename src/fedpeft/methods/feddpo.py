"""FedDPO: federated direct preference optimisation as a preset (OpenFedLLM's ``main_dpo.py``: TRL's DPO inside a
FedAvg loop).

Each selected client trains LoRA (HF ``peft``) on its own preference pairs with the DPO loss (``trainers.dpo``), the
frozen backbone without the adapter as the reference model; the server averages the LoRA tensors weighted by pair
counts (FedAvg). LoRA sits on every linear layer but the output head, as in ``fedit``; starting from an SFT run's
adapter is the usual pipeline (instruction tuning, then alignment).
"""

from fedpeft.methods.base import preset

preset("feddpo", "FedDPO: LoRA on every linear layer trained by DPO against the frozen backbone, FedAvg (federated "
       "preference alignment; OpenFedLLM's main_dpo)",
       adapter={"name": "lora", "r": 16, "lora_alpha": 32.0, "target_modules": ["all-linear"]},
       trainer={"name": "dpo", "optimizer": "adamw", "lr": 5e-4, "beta": 0.1, "batch_size": 8, "local_epochs": 1.0,
                "grad_clip": 1.0, "reset_optimizer": True},
       aggregator={"name": "fedavg"})
