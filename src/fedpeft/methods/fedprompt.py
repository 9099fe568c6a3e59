"""FedPrompt (Zhao et al. 2023) and its full fine-tuning baseline as presets.

FedPrompt's "split aggregation" (Alg. 1, Eq. 5): the frozen PLM is never sent; the server sends the global
soft prompt P_t, each selected client trains it with Adam and returns P_{t+1}^k, and the server sets
P_{t+1} = sum_k (n_k / N_t) P_{t+1}^k (``aggregators.fedavg``). With the ``full`` adapter the same
composition is the full fine-tuning FedAvg baseline (Table II).
"""

from fedpeft.methods.base import preset

preset("fedprompt", "FedPrompt (Zhao et al. 2023): soft prompt tuning on a frozen model, FedAvg over the prompt only",
       # 20 soft tokens and Adam as in the paper; lr/batch/epochs scaled for CPU runs (spec §3, §7 #1-4)
       adapter={"name": "soft_prompt", "num_tokens": 20, "init": "vocab", "position": "after_first"},
       trainer={"name": "adam", "lr": 0.03, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0,
                "reset_optimizer": True},
       aggregator={"name": "fedavg"})

preset("fedprompt-ptuning", "FedPrompt's P-tuning variant (Table VI β): an LSTM prompt encoder, the whole template "
       "trained and exchanged",
       # OpenPrompt PtuningTemplate, 20 soft tokens (25.420M parameters on BERT-base, FedPrompt spec §2.6)
       adapter={"name": "p_tuning", "num_tokens": 20, "encoder": "lstm", "position": "after_first"},
       trainer={"name": "adam", "lr": 0.03, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0,
                "reset_optimizer": True},
       aggregator={"name": "fedavg"})

preset("fedavg-full", "Full fine-tuning with FedAvg over every backbone weight (FedPrompt's Table II baseline)",
       # AdamW 2e-5 on the PLM, same rounds and local budget as FedPrompt (FedPrompt spec §7 #20)
       adapter={"name": "full"},
       trainer={"name": "adamw", "lr": 2e-5, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0,
                "reset_optimizer": True},
       aggregator={"name": "fedavg"})
