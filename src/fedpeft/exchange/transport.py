"""The exchange's outermost stage: how the global tensors travel to the clients (``method.downlink``).

The sharing stages decide which tensors a client is sent and in what shape; this stage decides how they travel: as
they are (``dense``: every hook is the identity, nothing is kept), or as a download codec's messages from which
every client rebuilds them (``downlink``: a quantised or PCA-compressed copy, the discrete prompts' word-analogy
residuals, DeComFL's seed history). Its four hooks are all the method calls:

- server, after aggregation: ``after_round`` replaces the codec's global tensors by the p' that every client will
  rebuild (the server keeps exactly that) and logs the round's message (``downlink.sync.record``);
- server, per client: ``send`` puts the codec's message in place of the tensors it compresses (a residual codec:
  every message since the round the client last replied in, or p' whole where that is smaller);
- client: ``receive`` rebuilds the tensors from the message and the copy it holds, and returns its new copy;
- ``rebuilds``: whether clients score what they rebuild rather than the server's tensors as sent (so a client's
  evaluation cannot be read off one pass over the global tensors).

Its state lives where it always has: the message log under the server state's ``dl/``, each client's copy under its
own ``dl/`` (``methods.state``), so checkpoints keep their layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params
from fedpeft.downlink import sync
from fedpeft.downlink.base import SEP


class Transport:
    """The download codec as the exchange's last stage (``codec``: a ``downlink.base.DownlinkBase``)."""

    def __init__(self, codec: Any, initial: Callable[[], Params]) -> None:
        self.codec, self.initial = codec, initial
        self.keys: tuple[str, ...] = tuple(codec.keys)

    @property
    def rebuilds(self) -> bool:
        return bool(self.keys)

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return self.codec.wire_overrides()

    def after_round(self, glob: Params, before: Params, aggregator_state: Any, log: Params,
                    round: int) -> tuple[Params, Params]:
        """(the global tensors as every client will rebuild them, the server's message log after ``round``)."""
        if not self.keys:
            return glob, log
        rebuilt, message = self.codec.encode_round({k: glob[k] for k in self.keys}, {k: before[k] for k in self.keys},
                                                   aggregator_state)
        return glob | rebuilt, sync.record(self.codec, log, message, round)

    def send(self, msg: Message, glob: Params, log: Params, first: int, upto: int) -> Message:
        """``msg`` with the codec's message in place of the tensors it compresses, for a client that last replied
        in round ``first`` and is to hold p' of round ``upto``."""
        if not self.keys:
            return msg
        down = sync.instruction(self.codec, log, glob, first, upto)
        rest = {k: v for k, v in msg.tensors.items() if k not in self.keys}
        return Message(rest | down.tensors, dict(msg.scalars) | down.scalars)

    def receive(self, instruction: Message, held: Params) -> tuple[Message, Params | None]:
        """Client side: (the instruction with the tensors rebuilt, the client's new copy; None: nothing kept)."""
        if not self.keys:
            return instruction, None
        coded = {k: v for k, v in instruction.tensors.items() if k.split(SEP)[0] in self.keys and SEP in k}
        current, held = sync.rebuild(self.codec, Message(coded, instruction.scalars), held, self.initial)
        rest = {k: v for k, v in instruction.tensors.items() if k not in coded}
        if self.codec.stateful:  # the held copy stays as rebuilt: a trainer may work on what it is given in place
            current = {k: v.clone() for k, v in current.items()}
        return Message(rest | current, dict(instruction.scalars)), held
