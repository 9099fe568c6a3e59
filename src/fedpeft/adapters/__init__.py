"""What is trainable and exchanged around the frozen backbone (the adapter axis)."""

from fedpeft.adapters.base import ADAPTERS, Adapter
from fedpeft.adapters import full, soft_prompt  # noqa: F401  (registration)

__all__ = ["ADAPTERS", "Adapter"]
