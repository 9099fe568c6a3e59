"""The server of seeded zeroth-order federations (DeComFL, FedKSeed): average the scalars, replay the steps.

Replies are vectors of projected gradients (``formats.seeds``), one position per (seed, perturbation) for every
client alike. The round's aggregate is their mean per position, weighted by example counts (FedKSeed, Eq. 4) or
uniform (DeComFL's ``fed_avg`` in ``cezo_fl/server.py``); the new global tensors are the old ones with the mean's
steps replayed (``trainers.spsa.replay_``): for DeComFL's [steps × P] scalars the steps of the round's seeds in order,
for FedKSeed's [K] sums one step per candidate seed with a non-zero sum, in pool order. The aggregate is exact (the
scalars of one seed add) and computable from the mean alone, so it runs under secure aggregation.

State: the seeds of the coming round (DeComFL: drawn by the server, broadcast with the instruction) and the history
of every round's seeds and mean scalars, which rebuilds the global tensors from the initial ones bit for bit
(``replay_history``) and is what a client that missed rounds would replay. With FedKSeed-Pro's importance sampling
(``method.trainer.sampling: importance``) also, per candidate seed, the sum of every clipped amplitude |g| the
clients reported and how many there were; the instruction carries the probabilities made of them
(``trainers.zo_sgd.importance_probabilities``, K floats down per client-round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, SEEDS, AggregatorBase, AggregatorContext, Params
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.formats.seeds import ABS, COEF, HITS, PROBS
from fedpeft.formats.seeds import SEEDS as SEED_TENSOR
from fedpeft.lazy import lazy
from fedpeft.rng import SERVER, numpy_rng
from fedpeft.trainers.spsa import replay_
from fedpeft.trainers.zo_sgd import ZOSettings, importance_probabilities, seed_pool

torch = lazy("torch")

NEXT, HIST_SEEDS, HIST_COEF = "next_seeds", "history.seeds", "history.coef"
IMP_ABS, IMP_HITS = "importance.abs_sum", "importance.hits"  # FedKSeed-Pro's per-candidate history, summed


class SeedReplaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weighting: Literal["examples", "uniform"] = Field(
        "examples", description="mean of the clients' scalars weighted by their example counts (FedKSeed) or "
                                "uniform (DeComFL's fed_avg)")


def round_seeds(seed: int, round: int, steps: int) -> "torch.Tensor":
    """The server's step seeds of ``round`` (DeComFL: ``random.randint`` per local step; here from the run seed)."""
    return torch.from_numpy(numpy_rng(seed, round, SERVER, "zo-seeds").integers(0, 2**31, steps))


def replay_round(glob: Params, coef: "torch.Tensor", seeds: "torch.Tensor | None", settings: ZOSettings,
                 pool: "torch.Tensor | None") -> Params:
    """The tensors after one round's mean scalars ``coef``: ``seeds`` [steps] of the server's seeds, or the
    candidates of ``pool`` [K] with a non-zero sum."""
    new = {k: v.detach().clone().float() for k, v in glob.items()}
    names = sorted(k for k, v in new.items() if v.is_floating_point())
    if seeds is not None:
        replay_(new, names, seeds.tolist(), coef.reshape(len(seeds), -1), settings.lr)
    else:
        used = torch.nonzero(coef).flatten()
        replay_(new, names, pool[used].tolist(), coef[used].reshape(-1, 1), settings.lr)
    return new


@AGGREGATORS.register("seed_replay", "mean of zeroth-order scalars per seed, steps replayed on the global tensors "
                      "(DeComFL, FedKSeed)", SeedReplaySettings)
class SeedReplay(AggregatorBase):
    accepts = frozenset({SEEDS})
    secure_sum = True

    def __init__(self, settings: SeedReplaySettings, ctx: AggregatorContext) -> None:
        super().__init__(settings, ctx)
        if not isinstance(ctx.trainer, ZOSettings):
            raise ValueError("method.aggregator.name: 'seed_replay' replays zeroth-order steps; use "
                             "method.trainer.name: zo_sgd")
        self.zo = ctx.trainer
        self.uniform_weights = settings.weighting == "uniform"
        self.server_seeds = self.zo.seeds == "server"
        self.pool = None if self.server_seeds else torch.from_numpy(seed_pool(ctx.seed, self.zo.pool_size))
        self.importance = self.zo.sampling == "importance"
        if self.importance and self.uniform_weights:
            raise ValueError("method.aggregator.weighting: FedKSeed-Pro's amplitude sums and draw counts are "
                             "recovered from the example-weighted mean of the replies (as secure aggregation gives "
                             "it); set method.aggregator.weighting: examples with method.trainer.sampling: "
                             "importance")

    def _next(self, round: int) -> dict[str, "torch.Tensor"]:
        return {NEXT: round_seeds(self.ctx.seed, round, self.zo.local_steps)} if self.server_seeds else {}

    def init(self, glob: Params) -> Message:
        zeros = torch.zeros(self.zo.pool_size, dtype=torch.float64)
        return Message(self._next(1) | ({IMP_ABS: zeros, IMP_HITS: zeros.clone()} if self.importance else {}))

    def broadcast(self, state: Message) -> Message:
        if self.server_seeds:
            return Message({SEED_TENSOR: state.tensors[NEXT]})
        if self.importance:
            return Message({PROBS: importance_probabilities(state.tensors[IMP_ABS], state.tensors[IMP_HITS],
                                                            self.zo.importance_initial,
                                                            self.zo.importance_clip).float()})
        return Message()

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        weights = [1.0 if self.uniform_weights else float(u.weight) for u in updates]
        total = sum(weights)
        acc = torch.zeros(updates[0].tensors[COEF].shape, dtype=torch.float64)
        for u, w in zip(updates, weights):
            acc += (w / total) * u.tensors[COEF].double()
        coef = acc.float()
        seeds = state.tensors[NEXT] if self.server_seeds else None
        new = replay_round(glob, coef, seeds, self.zo, self.pool)
        hist = dict(state.tensors)
        rows = {HIST_COEF: coef[None]} | ({HIST_SEEDS: seeds[None]} if seeds is not None else {})
        for k, v in rows.items():
            hist[k] = torch.cat([hist[k], v]) if k in hist else v
        if self.importance:  # the replies hold sums over weight: weight x reply adds up to the plain sums
            for key, name in ((IMP_ABS, ABS), (IMP_HITS, HITS)):
                hist[key] = state.tensors[key] + sum(float(u.weight) * u.tensors[name].double() for u in updates)
        return new, Message(hist | self._next(round + 1), dict(state.scalars))

    def diagnostics(self, state: Message) -> dict[str, float]:
        coef = state.tensors.get(HIST_COEF)
        return {} if coef is None else {"zo_scalar_abs_mean": float(coef[-1].abs().mean())}


def replay_history(initial: Params, state: Message, settings: ZOSettings, seed: int) -> Params:
    """The global tensors rebuilt from ``initial`` and the aggregator's history alone, as a client replays it."""
    pool = None if settings.seeds == "server" else torch.from_numpy(seed_pool(seed, settings.pool_size))
    out = initial
    coefs = state.tensors.get(HIST_COEF, torch.zeros(0, 0))
    for r in range(coefs.shape[0]):
        seeds = state.tensors[HIST_SEEDS][r] if settings.seeds == "server" else None
        out = replay_round(out, coefs[r], seeds, settings, pool)
    return out
