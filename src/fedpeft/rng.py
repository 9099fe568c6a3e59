"""Deterministic random streams derived from (experiment seed, round, client, purpose).

Every random choice draws from its own stream, so results do not depend on execution order,
on which process runs a client, or on whether the run was resumed.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedpeft.lazy import lazy

torch = lazy("torch")

SERVER = -1  # client id used for server-side streams
SHARED = -2  # client id of streams that every client draws alike (common random numbers)


def derive_seed(seed: int, round: int, client: int, purpose: str) -> int:
    """A 63-bit seed that is a pure function of its arguments (blake2b of their text form)."""
    digest = hashlib.blake2b(f"{seed}|{round}|{client}|{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def numpy_rng(seed: int, round: int, client: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, round, client, purpose))


def torch_rng(seed: int, round: int, client: int, purpose: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, round, client, purpose))
    return g
