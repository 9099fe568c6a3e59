"""How updates become the new global state (the server-aggregator axis), and server-side wrappers."""

from fedpeft.aggregators.base import AGGREGATORS, WRAPPERS, Aggregator, AggregatorContext
from fedpeft.aggregators.fedavg import uniform_mean, weighted_mean
from fedpeft.aggregators import (  # noqa: F401  (registration)
    clipping,
    dp_fedavg,
    dp_seeds,
    fedavg,
    flexlora,
    fedopt,
    head_weighted,
    hetlora,
    keep_global,
    krum,
    median,
    momentum_cv,
    outlier_filter,
    seed_replay,
    server_cmaes,
    stacking,
    trimmed_mean,
)

__all__ = ["AGGREGATORS", "WRAPPERS", "Aggregator", "AggregatorContext", "uniform_mean", "weighted_mean"]
