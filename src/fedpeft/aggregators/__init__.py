"""How updates become the new global state (the server-aggregator axis), and server-side wrappers."""

from fedpeft.aggregators.base import AGGREGATORS, WRAPPERS, Aggregator, AggregatorContext
from fedpeft.aggregators.fedavg import uniform_mean, weighted_mean
from fedpeft.aggregators import fedavg, keep_global, momentum_cv, server_cmaes  # noqa: F401  (registration)

__all__ = ["AGGREGATORS", "WRAPPERS", "Aggregator", "AggregatorContext", "uniform_mean", "weighted_mean"]
