"""A chain of exchange stages acting as one (``method.exchange: [ranks, fedsa]``).

Each stage keeps the contract of ``sharing.base.SharingPolicy`` and its own state; the chain composes them so that
every stage sees what it would see alone:

- server: the shared tensors are those every stage shares; what client k is sent passes through each stage in
  order (``for_client``); a reply is checked by every stage and expanded by each in reverse order (the last cut is
  undone first); after aggregation each stage updates its own state, and the shared set shrinks to what all keep;
- client: the start is built by each stage in order (``client_params``: the first stage's view is the second's
  received tensors); the plans before training are merged for the trainer (frozen masks OR-ed, penalties added;
  at most one stage may choose the tensors to train or the backbone weights) while each stage keeps its own plan
  for ``finish`` and ``upload_start``, which run in order; the private state is the union of the stages'.

The state layout: stage i's state tensors under ``<i>/``, its scalars under the key ``"<i>"``. A chain of one stage
is never built: the method uses the stage itself, so single-stage methods keep their state and numbers unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.exchange.capabilities import Capabilities
from fedpeft.sharing.base import ClientPlan


def _sub(state: Message, i: int) -> Message:
    prefix = f"{i}/"
    return Message({k[len(prefix):]: v for k, v in state.tensors.items() if k.startswith(prefix)},
                   dict(state.scalars.get(str(i), {})))


def _join(states: Sequence[Message]) -> Message:
    tensors = {f"{i}/{k}": v for i, s in enumerate(states) for k, v in s.tensors.items()}
    return Message(tensors, {str(i): dict(s.scalars) for i, s in enumerate(states)})


def merge_plans(plans: Sequence[ClientPlan], names: Sequence[str]) -> ClientPlan:
    """One plan for the trainer from the stages' plans: frozen masks OR-ed entry by entry (a tensor frozen by any
    stage stays frozen), penalties summed; ``params`` and ``static`` from the one stage that sets them; each
    stage's own plan kept under ``own["stages"]``."""
    out = ClientPlan(own={"stages": list(plans)})
    for key in ("params", "static"):
        setters = [n for n, p in zip(names, plans) if getattr(p, key) is not None]
        if len(setters) > 1:
            raise ValueError(f"method.exchange: stages {setters} both set the client's '{key}'")
        for p in plans:
            if getattr(p, key) is not None:
                setattr(out, key, getattr(p, key))
    frozen: dict[str, Any] = {}
    for p in plans:
        for k, m in (p.frozen or {}).items():
            frozen[k] = m if k not in frozen else frozen[k] | m
    out.frozen = frozen or None
    penalties = [p.penalty for p in plans if p.penalty is not None]
    if penalties:
        out.penalty = penalties[0] if len(penalties) == 1 else (lambda work: sum(f(work) for f in penalties))
    return out


class Pipeline:
    """Stages in order, behaving as one sharing policy (capability flags from the chain's record)."""

    def __init__(self, stages: Sequence[Any], caps: Capabilities) -> None:
        self.stages, self.caps = list(stages), caps
        self.adapters, self.aggregators = caps.adapters, caps.aggregators
        self.provides, self.per_client, self.ranked = caps.provides, caps.per_client, caps.ranked
        self.summable, self.deltas = caps.summable, caps.deltas
        self.dtypes = {k: v for s in self.stages for k, v in dict(s.dtypes).items()}

    # ---------------------------------------------------------------- server

    def init(self, glob: Params) -> Message:
        return _join([s.init(glob) for s in self.stages])

    def shared(self, glob: Params, state: Message, round: int) -> list[str]:
        keep = set(glob)
        for i, s in enumerate(self.stages):
            keep &= set(s.shared(glob, _sub(state, i), round))
        return sorted(keep)

    def instruction_scalars(self, state: Message, round: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, s in enumerate(self.stages):
            out |= s.instruction_scalars(_sub(state, i), round)
        return out

    def for_client(self, tensors: Params, client: int, state: Message) -> Params:
        for i, s in enumerate(self.stages):
            tensors = s.for_client(tensors, client, _sub(state, i))
        return tensors

    def report_schema(self, state: Message, round: int):
        shapes: dict[str, tuple[int, ...]] = {}
        scalars: tuple[str, ...] = ()
        for i, s in enumerate(self.stages):
            t, sc = s.report_schema(_sub(state, i), round)
            shapes |= t
            scalars += tuple(x for x in sc if x not in scalars)
        return shapes, scalars

    def wire_shapes(self, update):
        """Every stage's wire shapes of the update, a dimension variable where any stage makes it so, without the
        tensors a stage does not upload."""
        out: dict[str, tuple[int | None, ...]] = dict(update)
        for s in self.stages:
            theirs = s.wire_shapes(update)
            out = {k: tuple(None if a is None or b is None else a for a, b in zip(mine, theirs[k]))
                   for k, mine in out.items() if k in theirs}
        return out

    def check(self, reply: Message, client: int, state: Message) -> None:
        for i, s in enumerate(self.stages):
            s.check(reply, client, _sub(state, i))

    def expand(self, update: Update, shared: Params) -> Update:
        for s in reversed(self.stages):
            update = s.expand(update, shared)
        return update

    def after_aggregate(self, glob, updates, state, round):
        states, keep = [], None
        for i, s in enumerate(self.stages):
            new, k = s.after_aggregate(glob, updates, _sub(state, i), round)
            states.append(new)
            if k is not None:
                keep = set(k) if keep is None else keep & set(k)
        return _join(states), keep

    def fold(self, glob: Params, before: Params, updates, weights) -> Params:
        out: Params = {}
        for s in self.stages:
            out |= s.fold(glob | out, before, updates, weights)
        return out

    def diagnostics(self, state: Message) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, s in enumerate(self.stages):
            out |= s.diagnostics(_sub(state, i))
        return out

    def vectors(self, state: Message) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for i, s in enumerate(self.stages):
            out |= s.vectors(_sub(state, i))
        return out

    def record(self, reply: Message) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in self.stages:
            out |= s.record(reply)
        return out

    # ---------------------------------------------------------------- client

    def client_params(self, received: Params, private: Params) -> Params:
        for s in self.stages:
            received = s.client_params(received, private)
        return received

    def plan(self, start: Params, instruction: Message, client: ClientContext, round: int) -> ClientPlan:
        own = [s.plan(start, instruction, client, round) or ClientPlan() for s in self.stages]
        return merge_plans(own, self.caps.names)

    def finish(self, update: Update, start: Params, trained: Params, instruction: Message, client: ClientContext,
               round: int, plan: ClientPlan) -> Update:
        for s, own in zip(self.stages, plan.own["stages"]):
            update = s.finish(update, start, trained, instruction, client, round, own)
        return update

    def upload_start(self, start: Params, update: Update, plan: ClientPlan) -> Params:
        for s, own in zip(self.stages, plan.own["stages"]):
            start = s.upload_start(start, update, own)
        return start

    def private_state(self, trained: Params) -> Params:
        out: Params = {}
        for s in self.stages:
            out |= s.private_state(trained)
        return out
