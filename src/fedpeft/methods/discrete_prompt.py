"""Personalized gradient-free discrete prompt tuning (Wang et al., NAACL Findings 2024) and the baselines of its
Table 2, as presets.

- ``discrete-prompt``: a token prompt (T = 50) found by forward-only local token search (S = 40 steps of
  K = 5 nearest tokens, ``trainers.discrete_search``), uploaded as T uint16 indices (Alg. 4), averaged
  uniformly (Eq. 5) and downloaded as Phi = 5 (token, float16 coefficient) pairs per position from the
  two-stage LASSO on the residual (``downlink.analogy``, Alg. 2); after the last round each client
  post-tunes with BBT at sigma = 0.1 on 16 shots per class (``post_tuning.bbt``, Alg. 5).
- ``discrete-prompt-phi3``, ``-full`` (FullDownload, float16), ``-pca10`` (PCA-n, n = 10), ``-quant3``
  (Quant-b, b = 3): the download alternatives of Table 6.
- ``bbt-local``: BBT on each client alone (no federation; sigma = 1), ``bbt-fed``: FedAvg-BBT + BBT
  post-tuning, ``prompt-tuning-fed``: soft-prompt FedAvg (lr 1e-2, batch 16) + gradient post-tuning.
"""

from fedpeft.methods.base import preset

_TOKENS = {"name": "token_prompt", "num_tokens": 50, "init": "vocab", "position": "after_first"}
_SEARCH = {"name": "discrete_search", "steps": 40, "candidates": 5, "acceptance": "keep_current"}
_POST = {"name": "bbt", "sigma": 0.1, "shots": 16, "popsize": 20}


def _discrete(name: str, description: str, downlink: dict) -> None:
    preset(name, description, adapter=dict(_TOKENS), trainer=dict(_SEARCH), aggregator={"name": "uniform"},
           downlink=downlink, post_tuning=dict(_POST))


_discrete("discrete-prompt", "Personalized gradient-free prompt tuning (Wang et al. 2024): token search, uint16 "
          "uploads, Phi = 5 LASSO downloads, BBT post-tuning", {"name": "analogy", "phi": 5, "alpha": 0.2})
_discrete("discrete-prompt-phi3", "Discrete prompt search with Phi = 3 tokens per position in the download",
          {"name": "analogy", "phi": 3, "alpha": 0.2})
_discrete("discrete-prompt-full", "Discrete prompt search with FullDownload (the global prompt in float16)",
          {"name": "full16"})
_discrete("discrete-prompt-pca10", "Discrete prompt search with a PCA-10 download", {"name": "pca", "components": 10})
_discrete("discrete-prompt-quant3", "Discrete prompt search with a 3-bit quantised download",
          {"name": "quant", "bits": 3})

preset("bbt-local", "BBT on each client alone: no federation, CMA-ES (sigma = 1) on 16 shots per class",
       adapter={"name": "projected_prompt", "num_tokens": 50, "intrinsic_dim": 500, "sigma0": 1.0},
       trainer={"name": "no-training"}, aggregator={"name": "keep-global"},
       post_tuning=dict(_POST, sigma=1.0))

preset("bbt-fed", "BBT(Fed): FedAvg-BBT, then BBT post-tuning (sigma = 0.1) on each client",
       adapter={"name": "projected_prompt", "num_tokens": 50, "intrinsic_dim": 500, "sigma0": 1.0},
       trainer={"name": "cmaes", "iterations": 8, "popsize": 20, "perturb_rate": 0.0, "covariance": "none"},
       aggregator={"name": "uniform"}, post_tuning=dict(_POST))

preset("prompt-tuning-fed", "Prompt Tuning (Fed): soft-prompt FedAvg, then gradient post-tuning on each client",
       adapter={"name": "soft_prompt", "num_tokens": 50, "init": "vocab", "position": "after_first"},
       trainer={"name": "adam", "lr": 1e-2, "batch_size": 16, "local_epochs": 1.0, "grad_clip": 1.0},
       aggregator={"name": "uniform"}, post_tuning={"name": "gradient", "lr": 1e-2, "shots": 16})
