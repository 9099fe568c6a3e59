"""What is trainable and exchanged around the frozen backbone (the adapter axis)."""

from fedpeft.adapters.base import ADAPTERS, Adapter, AdapterBase, AdapterContext, HeadSlices, Prepared
from fedpeft.adapters import (  # noqa: F401  (registration)
    deep_prompt,
    full,
    identity,
    lora,
    lora_sb,
    p_tuning,
    projected_prompt,
    soft_prompt,
    token_prompt,
)

__all__ = ["ADAPTERS", "Adapter", "AdapterBase", "AdapterContext", "HeadSlices", "Prepared"]
