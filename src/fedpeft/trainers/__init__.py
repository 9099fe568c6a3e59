"""How a client improves its adapter locally (the local-trainer axis)."""

from fedpeft.trainers.base import DISTRIBUTION, NONE, PARAMS, SEEDS, TRAINERS, LocalTrainer, TrainerContext
from fedpeft.trainers import (  # noqa: F401  (registration)
    black_box, discrete_search, dpo, frozen, gradient, hf_dpo_trainer, hf_trainer, zo_sgd)

__all__ = ["DISTRIBUTION", "NONE", "PARAMS", "SEEDS", "TRAINERS", "LocalTrainer", "TrainerContext"]
