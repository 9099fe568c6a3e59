"""How a client improves its adapter locally (the local-trainer axis)."""

from fedpeft.trainers.gradient import GradientSettings, TRAINERS, train_local
from fedpeft.trainers import cmaes  # noqa: F401  (registration)

__all__ = ["GradientSettings", "TRAINERS", "train_local"]
