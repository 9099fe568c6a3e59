"""Client workers for the embedded runtime (``runtime.client_workers``): a round's clients trained side by side.

The workers are forked once, after the backbone, task and method are built, so every worker shares the frozen
weights with the server process (copy-on-write; nothing is copied or loaded again) and uses the cores the way
Flower's simulation uses one Ray actor per core, without a second copy of the model. A worker gets a client's
encoded instruction and encoded persistent state, runs the same ``handle_train`` as every runtime, and returns
the encoded reply and new state. Every random draw derives from (seed, round, client), so the replies are those
of the sequential run with the same torch threads: each worker uses the run's count (``runtime.threads``; unset,
the usable cores divided among the workers, see ``runtime/threads.py``).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import torch

from fedpeft.comm.codec import Message, decode, encode, own_dtypes
from fedpeft.config import FaultConfig
from fedpeft.experiment import Experiment
from fedpeft.methods.base import Method
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.faults import inject

log = logging.getLogger("fedpeft")


@dataclass
class Done:
    """One client's outcome in a worker: the reply and new state (encoded), or the error; its own seconds."""

    client: int
    reply: bytes | None
    state: bytes | None
    error: str | None
    seconds: float


class _Worker:
    """What a forked worker holds: the built method and experiment, inherited from the parent at fork."""

    faults: FaultConfig
    seed: int
    method: Method
    exp: Experiment


def _init(faults: FaultConfig, seed: int, method: Method, exp: Experiment, threads: int) -> None:
    torch.set_num_threads(threads)
    _Worker.faults, _Worker.seed, _Worker.method, _Worker.exp = faults, seed, method, exp


def encode_state(state: Message) -> bytes:
    """A client state as codec bytes, every tensor in its own dtype (as checkpoints store it)."""
    return encode(state, own_dtypes(state))


def _train(round: int, client: int, payload: bytes, state: bytes) -> Done:
    t0 = time.monotonic()
    ctx = _Worker.exp.client(client)
    ctx.state = decode(state)
    try:
        inject(_Worker.faults, _Worker.seed, round, client)
        reply = handle_train(_Worker.method, payload, ctx)
    except Exception as e:  # noqa: BLE001 - reported to the server as this client's failure
        log.exception("round %d: client %d raised", round, client)
        return Done(client, None, None, f"{type(e).__name__}: {e}", time.monotonic() - t0)
    return Done(client, reply, encode_state(ctx.state), None, time.monotonic() - t0)


class ClientWorkers:
    """A pool of ``n`` forked workers, each computing with ``threads`` torch threads (the run's); ``train`` runs one
    round's clients on it, results in client order."""

    def __init__(self, n: int, faults: FaultConfig, seed: int, method: Method, exp: Experiment, threads: int) -> None:
        # fork: the workers inherit the built objects (no pickling, no second load); initargs are not pickled
        self.pool = multiprocessing.get_context("fork").Pool(n, initializer=_init,
                                                             initargs=(faults, seed, method, exp, threads))

    def train(self, round: int, jobs: list[tuple[int, bytes, bytes]]) -> list[Done]:
        return self.pool.starmap(_train, [(round, cid, payload, state) for cid, payload, state in jobs], chunksize=1)

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def __enter__(self) -> ClientWorkers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
