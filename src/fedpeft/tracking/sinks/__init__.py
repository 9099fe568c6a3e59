"""Tracking sinks (``tracking:`` in the config): TensorBoard, MLflow and Weights & Biases, fed the same records as
``metrics.jsonl``. Each is one file + a registration; their packages are the optional ``fedpeft[tracking]`` extra."""

from fedpeft.tracking.sinks.base import SINKS, SinkBase, require, round_scalars, summary_scalars
from fedpeft.tracking.sinks import mlflow, tensorboard, wandb  # noqa: F401  (registration)

__all__ = ["SINKS", "SinkBase", "require", "round_scalars", "summary_scalars"]
