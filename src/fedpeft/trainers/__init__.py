"""How a client improves its adapter locally (the local-trainer axis)."""

from fedpeft.trainers.base import DISTRIBUTION, NONE, PARAMS, SEEDS, TRAINERS, LocalTrainer, TrainerContext
from fedpeft.trainers import black_box, discrete_search, dpo, frozen, gradient, zo_sgd  # noqa: F401  (registration)

__all__ = ["DISTRIBUTION", "NONE", "PARAMS", "SEEDS", "TRAINERS", "LocalTrainer", "TrainerContext"]
