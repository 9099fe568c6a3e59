"""The download codec contract: what the server sends for its global tensors, and what every client rebuilds.

``encode`` runs on the server after aggregation: from the new global tensors and the previous broadcast p'
it returns the p' that every client will rebuild (the server keeps exactly that as its global state) and
the round's message. ``decode`` runs on the client: p' from a message and the client's own previous p'.
A ``stateful`` codec sends residuals against the previous p' (the word-analogy codec), so a client that
missed rounds gets the missed messages (or the whole p' when that is smaller); stateless codecs send p'
itself in compressed form. ``dense`` (the default) sends the tensors unchanged, as every method did before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from fedpeft.comm.update import Params
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")

SEP = "::"  # message tensor names: <global tensor>::<part>


@dataclass(frozen=True)
class DownlinkContext:
    table: Callable[[], torch.Tensor]   # e(V), float32 on the CPU, identical on the server and every client
    special_ids: tuple[int, ...] = ()
    initial: Callable[[], Params] | None = None  # the adapter's initial tensors (every client derives them too)
    trainer: Any = None                          # the local trainer's settings
    seed: int = 0                                # the run seed


class DownlinkBase:
    """Identity codec: sends the tensors as they are (in the method's wire dtype)."""

    stateful: ClassVar[bool] = False
    adapters: ClassVar[frozenset[str] | None] = None  # adapters whose tensors it can compress (None: any)
    keys: ClassVar[tuple[str, ...]] = ()               # global tensors it compresses (the rest pass unchanged)

    def __init__(self, settings: Any, ctx: DownlinkContext) -> None:
        self.settings, self.ctx = settings, ctx

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        """(message tensor name, wire dtype) pairs that must not follow the method's float wire dtype."""
        return ()

    def encode(self, new: Params, prev: Params) -> tuple[Params, Params]:
        """(p' as every client will rebuild it, the message tensors) for the tensors in ``keys``."""
        return dict(new), dict(new)

    def encode_round(self, new: Params, prev: Params, aggregator_state: Any) -> tuple[Params, Params]:
        """``encode``, given also the aggregator's new state (a codec that sends what the aggregator did, not the
        tensors it produced, reads it: ``seed_history``)."""
        return self.encode(new, prev)

    def decode(self, message: Params, prev: Params) -> Params:
        """p' from a message and the client's previous p' (the tensors in ``keys``)."""
        return {k: message[k].float() for k in self.keys}

    def message_bytes(self, message: Params) -> int:
        return sum(t.numel() * t.element_size() for t in message.values())


DOWNLINKS: Registry[type] = Registry("downlink")  # classes built as cls(settings, DownlinkContext)
DOWNLINKS.add("dense", DownlinkBase, "the global tensors themselves, in the method's wire dtype (default)")
