"""How replies become the new global state (the server-aggregator axis)."""

from fedpeft.aggregators.fedavg import AGGREGATORS, uniform_mean, weighted_mean

__all__ = ["AGGREGATORS", "uniform_mean", "weighted_mean"]
