"""DeComFL's download: the seeds and mean scalars of the rounds a client missed, replayed on its own copy.

With seeded zeroth-order training (``trainers.zo_sgd`` with ``aggregators.seed_replay``) the server's tensors after a
round are the previous ones with that round's steps replayed, so a round's message is just its step seeds (server
seeds) and the mean scalars, a few bytes whatever the model's size (Li et al. 2025, §3: both directions independent
of the model). The codec is stateful (``downlink.sync``): a client gets every message since the round it last
took part in, and replays them on the tensors it holds (its initial ones, derived from the run seed, before it
first takes part); where that history is larger than the tensors themselves, it gets the tensors (float32), which
the instruction's scalars and byte count show. The replay is the server's own arithmetic, so every client holds the
server's tensors bit for bit; the scalars travel in float32 whatever the method's wire dtype.
"""

from __future__ import annotations

from typing import Any

from fedpeft.aggregators.seed_replay import HIST_COEF, HIST_SEEDS, replay_round
from fedpeft.comm.update import Params
from fedpeft.downlink.base import DOWNLINKS, SEP, DownlinkBase, DownlinkContext
from fedpeft.downlink.sync import full_name
from fedpeft.lazy import lazy
from fedpeft.trainers.zo_sgd import ZOSettings, seed_pool

torch = lazy("torch")


@DOWNLINKS.register("seed_history", "the seeds and mean scalars of every round a client missed, replayed on its "
                    "own copy (DeComFL's download; zo_sgd with seed_replay)")
class SeedHistory(DownlinkBase):
    stateful = True

    def __init__(self, settings: Any, ctx: DownlinkContext) -> None:
        super().__init__(settings, ctx)
        if not isinstance(ctx.trainer, ZOSettings) or ctx.initial is None:
            raise ValueError("method.downlink.name: 'seed_history' sends the steps of zeroth-order training; use "
                             "method.trainer.name: zo_sgd with method.aggregator.name: seed_replay")
        self.zo = ctx.trainer
        self._keys: tuple[str, ...] | None = None
        self._pool = None if self.zo.seeds == "server" else torch.from_numpy(seed_pool(ctx.seed, self.zo.pool_size))

    @property
    def keys(self) -> tuple[str, ...]:  # every trained tensor: the whole model travels as its steps
        if self._keys is None:
            self._keys = tuple(sorted(self.ctx.initial()))
        return self._keys

    def _names(self) -> tuple[str, str]:
        return self.keys[0] + SEP + "zo.seeds", self.keys[0] + SEP + "zo.coef"

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return ((self._names()[1], "float32"), *((full_name(k), "float32") for k in self.keys))

    def encode_round(self, new: Params, prev: Params, aggregator_state: Any) -> tuple[Params, Params]:
        seeds, coef = self._names()
        message = {coef: aggregator_state.tensors[HIST_COEF][-1].clone()}  # its own storage, as checkpoints need
        if self.zo.seeds == "server":
            message[seeds] = aggregator_state.tensors[HIST_SEEDS][-1].clone()
        return dict(new), message

    def decode(self, message: Params, prev: Params) -> Params:
        seeds, coef = self._names()
        return replay_round(prev, message[coef].float(), message.get(seeds), self.zo, self._pool)
