"""FedIT (Zhang et al. 2024, "Towards Building the FederatedGPT"): federated instruction tuning as a preset.

Each selected client fine-tunes LoRA (HF ``peft``) on its own instruction data with the completion-only language
-modelling loss (``model.language_model``) and AdamW; the server averages the LoRA tensors weighted by example
counts (FedAvg). This is also the baseline of Flower's FlowerTune LLM template. LoRA sits on every linear layer but
the output head (PEFT's ``all-linear``): the attention and MLP projections, of any architecture.
"""

from fedpeft.methods.base import preset

LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # = all-linear on LLaMA

preset("fedit", "FedIT: LoRA on the attention and MLP projections, AdamW, FedAvg (federated instruction tuning; "
       "FlowerTune's baseline)",
       # FlowerTune LLM template: LoRA r 32 / alpha 64 on a 7B model; r 16 / alpha 32 at SmolLM2's size,
       # learning rate and batch scaled for CPU runs
       adapter={"name": "lora", "r": 16, "lora_alpha": 32.0, "target_modules": ["all-linear"]},
       trainer={"name": "adamw", "lr": 3e-4, "batch_size": 8, "local_epochs": 1.0, "grad_clip": 1.0,
                "reset_optimizer": True},
       aggregator={"name": "fedavg"})
