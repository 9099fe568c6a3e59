"""Zeroth-order steps as (seed, scalar) pairs (DeComFL, FedKSeed): the reply is a vector of projected gradients.

A client is sent the shared tensors with what the server broadcasts (the round's step seeds, ``SEEDS``), starts from
the tensors and replies with ``COEF`` alone, one float per (seed, perturbation) it may use: [local steps × P] for
the server's seeds, [K] (one sum per candidate seed) for a seed pool. The tensors it trained never travel; the
server rebuilds them from the seeds and scalars (``trainers.spsa.replay_``, in the ``seed_replay`` aggregator).
The vector has the same length and meaning for every client, so replies add (secure aggregation sums them).
"""

from __future__ import annotations

from dataclasses import replace

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.base import ReplyFormat, Shapes, TensorFormat, floats
from fedpeft.lazy import lazy

torch = lazy("torch")

COEF = "zo.coef"    # the reply: the projected gradients (float, the wire dtype)
SEEDS = "zo.seeds"  # the instruction: the round's step seeds (int64), when the server draws them
PREFIX = "zo."      # names of the exchange's own tensors, never model tensors


class SeedFormat(TensorFormat):
    """Tensors (and the round's seeds) down, ``n`` projected gradients up."""

    def __init__(self, n: int) -> None:
        self.n = n

    def start(self, instruction: Message) -> Params:
        return floats({k: v for k, v in instruction.tensors.items() if not k.startswith(PREFIX)})

    def upload(self, update: Update, received: Params) -> Update:
        return replace(update, tensors={COEF: update.aux_tensors[COEF]},
                       aux_tensors={k: v for k, v in update.aux_tensors.items() if k != COEF})

    def reply(self, shared: Shapes) -> ReplyFormat:
        return ReplyFormat({COEF: (self.n,)})

    def check(self, reply: Message) -> None:
        coef = reply.tensors.get(COEF)
        if coef is not None and not bool(torch.isfinite(coef.float()).all()):
            raise ValueError(f"reply tensor '{COEF}': projected gradients must be finite")
