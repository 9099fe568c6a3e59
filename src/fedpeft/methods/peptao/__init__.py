"""FedPepTAO's parameter-efficient partial prompt tuning (PEPT, Alg. 1): layer scores, Hessian ratio, selection."""

from fedpeft.methods.peptao.hessian import (
    RATIO_ESTIMATORS,
    exact_spectrum,
    gap_ratio,
    lanczos_spectrum,
    secant_lipschitz,
    slq_plateau_ratio,
)
from fedpeft.methods.peptao.layers import LAYER_ORDERS, num_selected, select_layers
from fedpeft.methods.peptao.scores import aggregate_weighted, cosine_kernel, kernel_score, layer_scores

__all__ = [
    "RATIO_ESTIMATORS", "LAYER_ORDERS", "aggregate_weighted", "cosine_kernel", "exact_spectrum", "gap_ratio",
    "kernel_score", "lanczos_spectrum", "layer_scores", "num_selected", "secant_lipschitz", "select_layers",
    "slq_plateau_ratio",
]
