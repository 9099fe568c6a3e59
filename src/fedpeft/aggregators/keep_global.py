"""No aggregation: the global state never changes (zero-shot and in-context baselines)."""

from __future__ import annotations

from fedpeft.aggregators.base import AGGREGATORS, NONE, AggregatorBase, Params
from fedpeft.comm.codec import Message


@AGGREGATORS.register("keep-global", "no aggregation: the global state never changes (zero-shot baselines)")
class KeepGlobal(AggregatorBase):
    accepts = frozenset({NONE})

    def aggregate(self, glob: Params, updates, state: Message, round: int):
        return dict(glob), state
