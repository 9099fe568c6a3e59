"""Small fixed runs of every preset whose ``metrics.jsonl`` (timing fields removed) was recorded before the
composable-core refactor; ``tests/golden/test_golden.py`` checks that the refactored code reproduces them (up to the
last bits of float32, which differ between CPUs). The configs keep every discrete decision that floats feed (which
CMA-ES candidates are parents) far from a tie, so that those last bits cannot send a run down another path on
another CPU (``_BPT``; re-recordings listed at ``ADDED_SERVER_FIELDS``).

``python tests/golden/cases.py`` re-records the fixtures (only when a change of numbers is intended).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
TIMING = ("wall_seconds", "train_seconds", "eval_seconds")

_TINY = {"task.name": "synthetic-sentiment", "task.num_examples": 96, "task.max_length": 24,
         "federation.num_clients": 3, "federation.rounds": 2, "evaluation.batch_size": 64,
         "runtime.progress": False, "runtime.threads": 1}
_GRAD = {"method.trainer.max_steps": 3, "method.trainer.batch_size": 8}
_PEP = {"method.adapter.num_tokens": 3, "federation.rounds": 3, "federation.num_clients": 4,
        "federation.clients_per_round": 3, **_GRAD}
# Black-box (CMA-ES) cases turn floats into discrete decisions, which must sit far from ties to be portable across
# CPUs (``test_golden.test_black_box_decisions_are_far_from_ties`` checks it): which candidates are parents, a
# ranking of their losses. Texts cut to 16 tokens give the prompt rows a larger share of the pooled similarity
# readout (the llama case reads out by similarity too: its verbalizer logits barely move with the prompt), and the
# seed and d of each full-C case were picked (among d in 2..12, seeds 0..3) for wide decisive gaps with a C that
# has repeated eigenvalues (d > mu + 1): >= 3e-4 relative against float32 differences between CPU kernels of
# <= 1.2e-6. (A larger similarity_scale widens the gaps but the differences with them: 1e-5 at 200.) The eigenbasis
# a C is decomposed in no longer matters: candidates are drawn through the symmetric root B D B^T
# (``trainers.cmaes.sample``), the same for any basis of a repeated eigenvalue (I plus a rank-mu update has one,
# d - mu times over).
_BPT = {"method.adapter.num_tokens": 4, "method.adapter.intrinsic_dim": 12, "method.trainer.iterations": 2,
        "task.max_length": 16}

# case name -> overrides (method.name and model.name included)
CASES: dict[str, dict[str, object]] = {
    "fedprompt-bert": {"method.name": "fedprompt", "model.name": "tiny-bert", "method.adapter.num_tokens": 4, **_GRAD},
    "fedprompt-llama": {"method.name": "fedprompt", "model.name": "tiny-llama", "method.adapter.num_tokens": 4,
                        **_GRAD},
    "fedprompt-linear-partial": {"method.name": "fedprompt", "model.name": "tiny-bert", "model.readout": "linear",
                                 "method.adapter.num_tokens": 4, "federation.num_clients": 4,
                                 "federation.clients_per_round": 2, "federation.rounds": 3,
                                 "method.trainer.reset_optimizer": False, "federation.partition.scheme": "dirichlet",
                                 **_GRAD},
    "fedprompt-uniform-fp16": {"method.name": "fedprompt", "model.name": "tiny-bert", "method.adapter.num_tokens": 4,
                               "method.aggregator.name": "uniform", "method.codec.dtype": "float16", **_GRAD},
    "fedavg-full-bert": {"method.name": "fedavg-full", "model.name": "tiny-bert", **_GRAD},
    "fedbpt-bert": {"method.name": "fedbpt", "model.name": "tiny-bert", **_BPT, "method.adapter.intrinsic_dim": 8,
                    "seed": 2},
    "fedbpt-llama-diag": {"method.name": "fedbpt", "model.name": "tiny-llama", "method.trainer.covariance": "diagonal",
                          "method.trainer.server_fitness": "ratio", "model.readout": "similarity", **_BPT},
    "fedavg-bbt-bert": {"method.name": "fedavg-bbt", "model.name": "tiny-bert", **_BPT, "seed": 1},
    "manual-prompt-llama": {"method.name": "manual-prompt", "model.name": "tiny-llama", "federation.rounds": 1},
    "icl-llama": {"method.name": "icl", "model.name": "tiny-llama", "federation.rounds": 1},
    "fedpeptao-bert": {"method.name": "fedpeptao", "model.name": "tiny-bert", "method.sharing.warmup_rounds": 1,
                       **_PEP},
    "fedpeptao-llama-hessian": {"method.name": "fedpeptao", "model.name": "tiny-llama",
                                "method.sharing.warmup_rounds": 2, "method.sharing.ratio_estimator": "hessian_gap",
                                "method.sharing.score_at": "global", **_PEP},
    "fedavg-prefix-bert": {"method.name": "fedavg-prefix", "model.name": "tiny-bert", **_PEP},
    "moms-adamd-bert": {"method.name": "moms-adamd", "model.name": "tiny-bert", **_PEP},
    "momd-bert": {"method.name": "momd", "model.name": "tiny-bert", **_PEP},
    "moms-bert": {"method.name": "moms", "model.name": "tiny-bert", **_PEP},
    "moms-con-bert": {"method.name": "moms-con", "model.name": "tiny-bert", **_PEP},
    "adamd-bert": {"method.name": "adamd", "model.name": "tiny-bert", **_PEP},
}


def overrides(case: str) -> list[str]:
    return [f"{k}={v}" for k, v in (_TINY | CASES[case]).items()]


def strip(records: list[dict]) -> list[dict]:
    """Records without timing fields (at any depth)."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in TIMING}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    return [clean(r) for r in records]


# Fields added since (new information, no recorded number changes): the local accuracy over participants,
# per-round vectors for the report's heatmaps (FedPepTAO's layer scores and selected layers), and the global
# model's macro-F1 and confusion matrix (from the same predictions as the recorded accuracy).
ADDED_FIELDS = {"local_accuracy_P", "server_vectors", "macro_f1", "confusion"}
# Records added since: round 0, the initial global state evaluated before any training (``evaluation.round_zero``).
ADDED_ROUNDS = {0}
# Fixtures re-recorded on purpose because a fix changed their numbers (bytes and every other case unchanged):
# fedbpt-llama-diag -- ``method.trainer.covariance: diagonal`` keeps C diagonal on the clients and the server
# (before, the server updated a full C of which clients received the diagonal, and each client's own C turned
# full after its first local iteration).
# fedbpt-bert, fedbpt-llama-diag -- the perturbations draw from their own stream (``cmaes-perturb``), so that
# they no longer shift the sampling noise (common random numbers with FedAvg-BBT and r_p = 0).
# fedbpt-bert, fedavg-bbt-bert, fedbpt-llama-diag -- new configs, no code change (issue 35): the fixtures did not
# travel to other CPUs. The full-C cases (d = 12) drew their second local iteration's samples in an eigenbasis of
# a degenerate C that numpy's OpenBLAS picks per CPU (kernels of an AMD EPYC without AVX-512, or
# OPENBLAS_CORETYPE=Prescott, gave other samples from the first round on), and all three ranked candidates whose
# losses differed by as little as 7e-7 relative (fedbpt-llama-diag), 1.6e-6 (fedavg-bbt-bert) or 2.6e-5
# (fedbpt-bert), against differences between CPU kernels of up to 1e-6. Now texts cut to 16 tokens, the llama case
# reads out by similarity, and seeds and d chosen for wide gaps (see ``_BPT``): decisive gaps >= 3e-4 relative
# (>= 250 times the differences between CPU kernels).
# fedbpt-bert, fedavg-bbt-bert -- and a code change (issue 35): CMA-ES draws y = B D B^T z instead of B D z, the
# same distribution, but the same candidates whatever basis (and signs) the eigensolver returns.
# Server diagnostics added since: momentum_cv's η^r and ‖η^r m^r‖ / ‖w̄^r − w^{r−1}‖ (new information only).
ADDED_SERVER_FIELDS = {"server_lr", "server_step_ratio"}


def comparable(records: list[dict]) -> list[dict]:
    """Records as the fixtures hold them: without the rounds, fields and diagnostics added since."""
    return [{k: v for k, v in rec.items() if k not in ADDED_FIELDS}
            | {"server": {k: v for k, v in rec["server"].items() if k not in ADDED_SERVER_FIELDS}}
            for rec in records if rec["round"] not in ADDED_ROUNDS]


def run_case(case: str, out: Path) -> list[dict]:
    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded

    run_embedded(load_config(None, overrides(case)), out)
    return strip([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])


def fixture(case: str) -> Path:
    return HERE / f"{case}.json"


if __name__ == "__main__":
    import tempfile

    for case in sys.argv[1:] or CASES:
        with tempfile.TemporaryDirectory() as d:
            recs = comparable(run_case(case, Path(d) / case))
        fixture(case).write_text(json.dumps(recs, indent=1, sort_keys=True) + "\n")
        print(case, [r["accuracy"] for r in recs], [r["bytes_up"] for r in recs])
