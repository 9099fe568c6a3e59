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
PROBS = "zo.probs"  # the instruction: each candidate seed's sampling probability (FedKSeed-Pro)
ABS, HITS = "zo.abs", "zo.hits"  # the reply, FedKSeed-Pro: per candidate, Σ |clip(g)| and the draws, over weight
PREFIX = "zo."      # names of the exchange's own tensors, never model tensors


class SeedFormat(TensorFormat):
    """Tensors (and the round's seeds or probabilities) down, ``n`` projected gradients up (with ``importance``,
    also the ``n`` amplitude sums and draw counts FedKSeed-Pro's probabilities are made of)."""

    def __init__(self, n: int, importance: bool = False) -> None:
        self.n = n
        self.names = (COEF, ABS, HITS) if importance else (COEF,)

    def start(self, instruction: Message) -> Params:
        return floats({k: v for k, v in instruction.tensors.items() if not k.startswith(PREFIX)})

    def upload(self, update: Update, received: Params) -> Update:
        return replace(update, tensors={k: update.aux_tensors[k] for k in self.names},
                       aux_tensors={k: v for k, v in update.aux_tensors.items() if k not in self.names})

    def reply(self, shared: Shapes) -> ReplyFormat:
        return ReplyFormat({k: (self.n,) for k in self.names})

    def check(self, reply: Message) -> None:
        for k in self.names:
            t = reply.tensors.get(k)
            if t is not None and not bool(torch.isfinite(t.float()).all()):
                raise ValueError(f"reply tensor '{k}': zeroth-order scalars must be finite")
            if t is not None and k != COEF and bool((t.float() < 0).any()):
                raise ValueError(f"reply tensor '{k}': amplitude sums and draw counts cannot be negative")
