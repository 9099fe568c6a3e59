"""Non-participants: the clients that never train and are only evaluated (P/NP evaluation, pFL-Bench style)."""

from __future__ import annotations

import numpy as np

from fedpeft.config import ConfigError, NonParticipantConfig
from fedpeft.rng import SERVER, numpy_rng


def non_participants(
    cfg: NonParticipantConfig, num_clients: int, seed: int, client_domains: list[str] | None = None
) -> frozenset[int]:
    """Ids of the clients that never train: a seeded ``fraction`` of all clients (rounded to nearest), or the
    clients of group ``fold`` when the sorted domains are cut into ``folds`` contiguous groups."""
    if cfg.fold is not None:
        ids = _fold_clients(cfg.fold, cfg.folds, client_domains)
    elif cfg.fraction > 0:
        count = int(np.floor(cfg.fraction * num_clients + 0.5))
        rng = numpy_rng(seed, 0, SERVER, "non-participants")
        ids = frozenset(int(k) for k in rng.choice(num_clients, size=count, replace=False))
    else:
        ids = frozenset()
    if len(ids) >= num_clients:
        raise ConfigError(f"federation.non_participants: all {num_clients} clients would be non-participants; "
                          "at least one must train")
    return ids


def _fold_clients(fold: int, folds: int, client_domains: list[str] | None) -> frozenset[int]:
    """Clients whose domain is in group ``fold`` of the sorted domains split into ``folds`` contiguous groups."""
    if client_domains is None:
        raise ConfigError("federation.non_participants.fold needs federation.partition.scheme 'domains'")
    names = sorted(set(client_domains))
    if folds > len(names):
        raise ConfigError(f"federation.non_participants.folds ({folds}) exceeds the {len(names)} domains")
    held = {str(d) for d in np.array_split(np.array(names), folds)[fold]}
    return frozenset(k for k, d in enumerate(client_domains) if d in held)
