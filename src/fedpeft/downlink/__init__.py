"""How the server's global tensors reach the clients (the download codec axis): as they are, or compressed."""

from fedpeft.downlink.base import DOWNLINKS, DownlinkBase, DownlinkContext
from fedpeft.downlink import analogy, full, pca, quant, seed_history  # noqa: F401  (registration)

__all__ = ["DOWNLINKS", "DownlinkBase", "DownlinkContext"]
