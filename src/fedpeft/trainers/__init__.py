"""How a client improves its adapter locally (the local-trainer axis)."""

from fedpeft.trainers.gradient import GradientSettings, TRAINERS, train_local

__all__ = ["GradientSettings", "TRAINERS", "train_local"]
