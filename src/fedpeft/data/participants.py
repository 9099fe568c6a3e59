"""Who does what among the clients: non-participants (only evaluated, pFL-Bench style) and resource tiers."""

from __future__ import annotations

import numpy as np

from fedpeft.config import ClientProfile, ConfigError, NonParticipantConfig
from fedpeft.data.partition import group_order
from fedpeft.rng import SERVER, numpy_rng


def non_participants(
    cfg: NonParticipantConfig, num_clients: int, seed: int, client_groups: list[str] | None = None
) -> frozenset[int]:
    """Ids of the clients that never train: a seeded ``fraction`` of all clients (rounded to nearest), or the
    clients of fold ``fold`` when the groups (in client order) are cut into ``folds`` contiguous folds."""
    if cfg.fold is not None:
        ids = _fold_clients(cfg.fold, cfg.folds, client_groups)
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


def _fold_clients(fold: int, folds: int, client_groups: list[str] | None) -> frozenset[int]:
    """Clients whose group is in fold ``fold`` of the groups (``group_order``) split into ``folds`` contiguous folds."""
    if client_groups is None:
        raise ConfigError("federation.non_participants.fold needs federation.partition.scheme 'by_column' "
                          "(or its alias 'domains')")
    names = group_order(client_groups)
    if folds > len(names):
        raise ConfigError(f"federation.non_participants.folds ({folds}) exceeds the {len(names)} groups")
    held = {str(d) for d in np.array_split(np.array(names), folds)[fold]}
    return frozenset(k for k, d in enumerate(client_groups) if d in held)


def profile_of_clients(profiles: list[ClientProfile], num_clients: int, seed: int) -> list[ClientProfile | None]:
    """Each client's resource tier (``federation.client_profiles``): the clients a tier names, or tier i gets
    round(share_i · K) clients by largest remainder (ties to the earlier tier), the clients drawn by a seeded
    permutation; [None] * K without tiers."""
    if not profiles:
        return [None] * num_clients
    if all(p.clients is not None for p in profiles):  # named: each tier's own clients
        named: list[ClientProfile | None] = [None] * num_clients
        for p in profiles:
            for c in p.clients or ():
                named[c] = p
        return named
    exact = [(p.share or 0.0) * num_clients for p in profiles]
    counts = [int(np.floor(x)) for x in exact]
    for i in sorted(range(len(profiles)), key=lambda i: (-(exact[i] - counts[i]), i))[: num_clients - sum(counts)]:
        counts[i] += 1
    order = numpy_rng(seed, 0, SERVER, "client-profiles").permutation(num_clients)
    out: list[ClientProfile | None] = [None] * num_clients
    start = 0
    for p, n in zip(profiles, counts):
        for c in order[start: start + n]:
            out[int(c)] = p
        start += n
    return out
