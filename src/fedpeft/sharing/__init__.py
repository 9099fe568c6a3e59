"""Which adapter tensors are exchanged each round and which stay on the clients (the sharing policy)."""

from fedpeft.sharing.base import SHARING, ShareAll, SharingContext, SharingPolicy
from fedpeft.sharing import (  # noqa: F401  (registration)
    head_pruning,
    latent_only,
    layer_selection,
    lora_factors,
    lora_ranks,
    lora_stacking,
    fedex_residual,
    private,
    private_tensors,
)

__all__ = ["SHARING", "ShareAll", "SharingContext", "SharingPolicy"]
