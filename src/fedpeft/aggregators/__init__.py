"""How replies become the new global state (the server-aggregator axis)."""

from fedpeft.aggregators.fedavg import AGGREGATORS, uniform_mean, weighted_mean
from fedpeft.aggregators import momentum_cv, server_cmaes  # noqa: F401  (registration)

__all__ = ["AGGREGATORS", "uniform_mean", "weighted_mean"]
