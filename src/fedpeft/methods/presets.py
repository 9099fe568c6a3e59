"""Paper methods as presets over the four axes, with each paper's defaults at CPU scale."""

from __future__ import annotations

from fedpeft.methods.base import PRESETS, Preset, requires
from fedpeft.methods.fedavg_adapter import FedAvgAdapter


PRESETS.add("fedprompt", Preset(
    name="fedprompt",
    description="FedPrompt (Zhao et al. 2023): soft prompt tuning on a frozen model, FedAvg over the prompt only",
    method_defaults={
        # 20 soft tokens and Adam as in the paper; lr/batch/epochs scaled for CPU runs (spec §3, §7 #1-4)
        "adapter": {"name": "soft_prompt", "num_tokens": 20, "init": "vocab", "position": "after_first"},
        "trainer": {"name": "adam", "lr": 0.03, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0,
                    "reset_optimizer": True},
        "aggregator": {"name": "fedavg"},
        "codec": {"dtype": "float32"},
    },
    build=lambda cfg, exp: FedAvgAdapter("fedprompt", cfg, exp),
    checks=(requires("adapter", "soft_prompt"),),
))

PRESETS.add("fedavg-full", Preset(
    name="fedavg-full",
    description="Full fine-tuning with FedAvg over every backbone weight (FedPrompt's Table II baseline)",
    method_defaults={
        # AdamW 2e-5 on the PLM, same rounds and local budget as FedPrompt (FedPrompt spec §7 #20)
        "adapter": {"name": "full"},
        "trainer": {"name": "adamw", "lr": 2e-5, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0,
                    "reset_optimizer": True},
        "aggregator": {"name": "fedavg"},
        "codec": {"dtype": "float32"},
    },
    build=lambda cfg, exp: FedAvgAdapter("fedavg-full", cfg, exp),
    checks=(requires("adapter", "full"),),
))
