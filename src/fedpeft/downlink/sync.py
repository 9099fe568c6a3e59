"""Keeping every client's copy of p' equal to the server's across rounds (spec §7.11), as pure functions.

The server logs each round's message (``record``). A stateless codec's latest message stands for p' itself.
For a residual codec a client needs every message since the p' it holds: ``instruction`` sends the messages of
rounds ``first``..``last`` stacked on a leading axis (``first`` = the last round the client replied in, which it
started from p'_{first-1}), or p' whole in float32 when that is smaller; ``rebuild`` applies on the client the
ones it has not applied yet and refuses a gap. Before the first aggregation every client starts from the
adapter's initial tensors, which it derives from the run seed (like the frozen model, never sent per round).
"""

from __future__ import annotations

from collections.abc import Callable

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params
from fedpeft.downlink.base import SEP
from fedpeft.lazy import lazy

torch = lazy("torch")

LAST = "last"
FULL, FIRST, UPTO = "full", "dl_first", "dl_last"   # whole-p' fallback; scalars: rounds the chain covers
VERSION = "version"                                  # client state: the round of the p' it holds


def record(codec, down: Params, message: Params, round: int) -> Params:
    """The server's message log after ``round``: every round's for residual codecs, the latest otherwise."""
    if codec.stateful:
        return dict(down) | {f"{round}/{k}": v for k, v in message.items()}
    return {f"{LAST}/{k}": v for k, v in message.items()}


def full_name(key: str) -> str:
    return key + SEP + FULL


def instruction(codec, down: Params, glob: Params, first: int, last: int) -> Message:
    """Message tensors and scalars that let a client holding p'_{first-1} (or later) rebuild p'_{last}."""
    if not codec.stateful:
        tensors = {k[len(LAST) + 1:]: v for k, v in down.items() if k.startswith(LAST + "/")}
        return Message(tensors, {UPTO: last})
    names = sorted({k.split("/", 1)[1] for k in down})
    chain = {n: torch.stack([down[f"{r}/{n}"] for r in range(first, last + 1)]) for n in names} \
        if last >= first else {}
    whole = {full_name(k): glob[k].float() for k in codec.keys}
    if chain and codec.message_bytes(chain) > codec.message_bytes(whole):
        return Message(whole, {UPTO: last})
    return Message(chain, {FIRST: first, UPTO: last})


def rebuild(codec, msg: Message, state: Params, initial: Callable[[], Params]) -> tuple[Params, Params]:
    """Client side: (p' of round ``dl_last``, the client's new codec state)."""
    last = int(msg.scalars[UPTO])
    if not codec.stateful:
        current = codec.decode(msg.tensors, {}) if msg.tensors else {k: initial()[k] for k in codec.keys}
        return current, {}
    if full_name(codec.keys[0]) in msg.tensors:
        current = {k: msg.tensors[full_name(k)].float() for k in codec.keys}
        return current, current | {VERSION: torch.tensor(last)}
    first = int(msg.scalars[FIRST])
    held = int(state[VERSION]) if VERSION in state else 0
    current = {k: state[k] for k in codec.keys} if VERSION in state else {k: initial()[k] for k in codec.keys}
    if held < first - 1 or held > last:
        raise ValueError(f"downlink: this client holds p' of round {held}; the message covers rounds {first}..{last}")
    for r in range(max(first, held + 1), last + 1):
        current = codec.decode({k: v[r - first] for k, v in msg.tensors.items()}, current)
    held = max(held, last)
    return current, current | {VERSION: torch.tensor(held)}
