"""The server and client state of ``ComposedMethod`` as one ``Message`` each (checkpointed as it is).

Server state: the global tensors under their own names, the aggregator's state under ``agg/``, the sharing
policy's under ``share/``, the download codec's message log under ``dl/``; scalars ``round``, ``agg``, ``sharing``
and ``history`` (per client: the last round it replied and its training loss, read by selectors), and when the
last aggregation measured something, ``measures`` (``exchange.aggregation_error``). Client state: the
trainer's under ``opt/``, the sharing policy's private tensors under ``u/``, the download codec's copy of the global
tensors under ``dl/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params

AGG, SHARE, DOWN = "agg/", "share/", "dl/"  # server-state prefixes
OPT, PRIVATE = "opt/", "u/"                 # client-state prefixes (and DOWN)
POST_TUNE = "post_tune"                     # evaluation instruction flag: adapt before scoring
GEN = "gen_"                                # a client's generation metrics in its evaluation reply


def _prefixed(prefix: str, tensors: Params) -> Params:
    return {prefix + k: v for k, v in tensors.items()}


@dataclass
class ServerState:
    round: int
    glob: Params
    agg: Message
    sharing: Message
    history: dict[int, dict[str, float]] = field(default_factory=dict)
    down: Params = field(default_factory=dict)
    measures: dict[str, float] = field(default_factory=dict)  # the last aggregation's (e.g. its LoRA error)

    def to_message(self) -> Message:
        tensors = (dict(self.glob) | _prefixed(AGG, self.agg.tensors) | _prefixed(SHARE, self.sharing.tensors)
                   | _prefixed(DOWN, self.down))
        return Message(tensors, {"round": self.round, "agg": self.agg.scalars, "sharing": self.sharing.scalars,
                                 "history": {str(c): h for c, h in sorted(self.history.items())}}
                       | ({"measures": dict(self.measures)} if self.measures else {}))

    @classmethod
    def from_message(cls, msg: Message) -> ServerState:
        glob = {k: v for k, v in msg.tensors.items() if not k.startswith((AGG, SHARE, DOWN))}
        s = msg.scalars
        return cls(int(s["round"]), glob, Message(sub_state(msg, AGG), dict(s.get("agg", {}))),
                   Message(sub_state(msg, SHARE), dict(s.get("sharing", {}))),
                   {int(c): dict(h) for c, h in s.get("history", {}).items()}, sub_state(msg, DOWN),
                   dict(s.get("measures", {})))
