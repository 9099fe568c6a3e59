"""Fault injection at the client handler, for the reliability tests and benchmark (``faults`` in the config).

Both runtimes call ``inject`` right before a client trains, so the same config makes the same clients fail in
the embedded runtime and on Flower: a listed client raises, a random share of (round, client) pairs raises (drawn
from the run seed, never from global state), a listed client sleeps before it replies (past
``federation.round_timeout`` its reply is late and ignored).
"""

from __future__ import annotations

import time

from fedpeft.config import FaultConfig
from fedpeft.rng import numpy_rng


class InjectedFault(RuntimeError):
    """A client failure caused on purpose by ``faults``."""


def fails(faults: FaultConfig, seed: int, round: int, client: int) -> bool:
    """Whether ``client``'s training in ``round`` raises: listed, or drawn with probability ``fail_rate``."""
    if not _faulty_round(faults, round):
        return False
    return client in faults.fail_clients or (
        faults.fail_rate > 0 and numpy_rng(seed, round, client, "fault").random() < faults.fail_rate)


def inject(faults: FaultConfig, seed: int, round: int, client: int) -> None:
    """Sleep and/or raise as ``faults`` asks for this (round, client); nothing when fault injection is off. A
    client that ``faults.secure_stage`` drops at a protocol stage does not raise here: the grid drops it there."""
    if not faults.active or not _faulty_round(faults, round):
        return
    if client in faults.hang_clients and faults.hang_s:
        time.sleep(faults.hang_s)
    if faults.secure_stage is None and fails(faults, seed, round, client):
        raise InjectedFault(f"injected failure of client {client} in round {round}")


def _faulty_round(faults: FaultConfig, round: int) -> bool:
    return faults.rounds is None or round in faults.rounds
