"""FedBPT (Sun et al. 2023) and the gradient-free baselines of its Table 1, as presets.

- ``fedbpt``: projected prompt z (d = 500), local CMA-ES with the perturbation-ratio loss
  (``trainers.black_box``), server-level CMA-ES over the client means ranked by loss with the corrected
  step size (``aggregators.server_cmaes``, spec §2.5).
- ``fedavg-bbt``: the same clients running vanilla BBT (no perturbation); the server takes the n_k-weighted
  average of the local mean, step size and covariance (``aggregators.fedavg``, spec §2.7, Fig. 2).
- ``manual-prompt``: zero-shot with the task template (no training, one round).
- ``icl``: in-context learning with up to 5 random demonstrations from the few-shot pool.

What crosses the wire (FedBPT): down (z_t, sigma_t, C_t | diag C_t | nothing, per
``method.trainer.covariance``); up z^k (d), the I step sizes used, and the uploaded loss: d + I + 1 floats
plus framing. The projection A is never sent: every process rebuilds it from a seed derived from the
experiment seed. Clients reach the model only through ``BlackBox`` (forward only).
"""

from fedpeft.methods.base import preset

_PROJECTED = {"name": "projected_prompt", "num_tokens": 50, "intrinsic_dim": 500, "sigma0": 1.0}

preset("fedbpt", "FedBPT (Sun et al. 2023): black-box prompt z via CMA-ES, perturbation loss, server-level CMA-ES",
       # paper: d = 500, L_p = 50, I = 8, lambda = 5, sigma_1 = 1; r_p = 0.5 code default (0.6 SST-2, 0.4 AG News)
       adapter=dict(_PROJECTED),
       trainer={"name": "cmaes", "iterations": 8, "popsize": 5, "perturb_rate": 0.5},
       aggregator={"name": "server_cmaes", "sigma_rule": "eq16", "parents": "half"})

preset("fedavg-bbt", "FedAvg-BBT: local vanilla BBT (CMA-ES, no perturbation), n_k-weighted average of mean, "
       "sigma, C",
       adapter=dict(_PROJECTED),
       trainer={"name": "cmaes", "iterations": 8, "popsize": 5, "perturb_rate": 0.0},
       aggregator={"name": "fedavg"})

preset("manual-prompt", "Manual prompt: zero-shot with the task template and label words, no training",
       adapter={"name": "template_only"}, trainer={"name": "no-training"}, aggregator={"name": "keep-global"})

preset("icl", "In-context learning: up to 5 random few-shot demonstrations before each input, no training",
       adapter={"name": "demonstrations"}, trainer={"name": "no-training"}, aggregator={"name": "keep-global"})
