"""What is trainable and exchanged around the frozen backbone (the adapter axis)."""

from fedpeft.adapters.base import ADAPTERS, Adapter, AdapterBase, AdapterContext, Prepared
from fedpeft.adapters import deep_prompt, full, identity, projected_prompt, soft_prompt  # noqa: F401  (registration)

__all__ = ["ADAPTERS", "Adapter", "AdapterBase", "AdapterContext", "Prepared"]
