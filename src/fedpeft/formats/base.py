"""The update format's contract and its two plain cases (see ``fedpeft.formats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class ReplyFormat:
    """What a valid reply holds: its update tensors' and auxiliary tensors' shapes, and the tensors that do not
    travel in the float wire dtype (e.g. uint16 token indices)."""

    update: Shapes
    aux: Shapes = field(default_factory=dict)
    dtypes: dict[str, Any] = field(default_factory=dict)


def floats(p: Params) -> Params:
    """Floating tensors as float32 (wire float16 upcast); integer tensors (token ids) unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in p.items()}


class UpdateFormat(Protocol):
    def send(self, shared: Params, broadcast: Message | None) -> Message:
        """The instruction built from the shared global tensors and what the aggregator broadcasts; ``broadcast``
        is None for an evaluation instruction (nothing to train from)."""
        ...

    def start(self, instruction: Message) -> Params:
        """Client side: the tensors a client starts from (or is scored with), read from its instruction."""
        ...

    def upload(self, update: Update, received: Params) -> Update:
        """Client side: the reply cut from the trainer's whole result (``LocalTrainer.fit``); ``received``: the
        tensors the client was sent (a tensor kept private, never sent, is never uploaded in any form)."""
        ...

    def reply(self, shared: Shapes) -> ReplyFormat:
        """Server side: what a valid reply holds, given the shapes of the shared tensors."""
        ...

    def check(self, reply: Message) -> None:
        """Server side: format-specific validity of a reply (raise ValueError to reject it before aggregation)."""
        ...

    def decode(self, update: Update, shared: Params) -> Update:
        """Server side: the update with tensors named and shaped like the shared global tensors."""
        ...


class TensorFormat:
    """The tensors themselves: a client is sent the shared tensors (with the aggregator's broadcast), starts from
    them and replies with a tensor of each shared shape."""

    def send(self, shared: Params, broadcast: Message | None) -> Message:
        if broadcast is None:
            return Message(tensors=dict(shared))
        return Message(tensors=dict(shared) | broadcast.tensors, scalars=dict(broadcast.scalars))

    def start(self, instruction: Message) -> Params:
        return floats(instruction.tensors)

    def upload(self, update: Update, received: Params) -> Update:
        return update

    def reply(self, shared: Shapes) -> ReplyFormat:
        return ReplyFormat(dict(shared))

    def check(self, reply: Message) -> None:
        pass

    def decode(self, update: Update, shared: Params) -> Update:
        return update


class NoUpdate(TensorFormat):
    """Nothing to train from and nothing back (zero-shot and in-context baselines): a training instruction carries
    the round number only, a reply no tensor; an evaluation instruction is the shared tensors."""

    def send(self, shared: Params, broadcast: Message | None) -> Message:
        return super().send(shared, None) if broadcast is None else Message()

    def reply(self, shared: Shapes) -> ReplyFormat:
        return ReplyFormat({})
