"""Central, client-level differential privacy for seeded zeroth-order training (DeComFL, FedKSeed): DP-FedAvg on
the scalars (McMahan et al. 2018, Alg. 1 with a fixed number of clients per round, as ``dp_fedavg``).

What a client reveals in ``zo_sgd`` is its vector of projected gradients c_k (``formats.seeds``: [steps × P] for the
server's seeds, [K] for a seed pool); the seeds are public, and the global model is a deterministic function of the
rounds' mean vectors and the seeds (``aggregators.seed_replay``). So the mechanism acts on the scalars: the server
clips every client's vector to L2 norm S, takes their uniform mean and adds Gaussian noise to it before the steps are
replayed,

    c̄_t = (1/m) Σ_k c_k · min(1, S/‖c_k‖₂) + N(0, (z·S/m)² I),

and everything the run releases afterwards (the broadcast history, the model, its predictions) is post-processing
of the noised means. Adding or removing one client moves the uniform mean by at most S/m, so each round is the
Gaussian mechanism with noise multiplier z on the scalars, and the global model is (ε, δ)-DP at the client level
with ε from ``privacy.gaussian_epsilon`` (the same RDP accounting and subsampling rate as ``dp_fedavg``). S bounds a
client's scalars, not its step in parameter space: that step is η Σ_j c_j z_j, whose norm is about η‖c‖√d for d
trained weights; DP needs the bound only on what is released.

The noise is added to every position of the vector, so with a seed pool every one of the K candidates gets a
non-zero mean and the server (and a client catching up) replays K steps a round instead of the few sampled ones: the
price of hiding which candidates a client drew. The inner aggregator must be ``seed_replay`` with ``weighting:
uniform`` (the S/m sensitivity holds for the uniform mean only); FedKSeed-Pro's importance sampling is refused, since
its amplitude sums and draw counts would be released unprotected. The noise comes from the derived stream (seed,
round, "dp-seeds"): reruns and resumes are identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import SEEDS, WRAPPERS, AggregatorContext, AggregatorWrapper, Params, clients_in
from fedpeft.aggregators.dp_fedavg import dp_noise_std
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.formats.seeds import COEF
from fedpeft.lazy import lazy
from fedpeft.privacy import gaussian_epsilon
from fedpeft.rng import SHARED, torch_rng

torch = lazy("torch")


class DpSeedsSettings(BaseModel):
    """``method.wrappers`` entry keys of ``dp_seeds``."""

    model_config = ConfigDict(extra="forbid")
    clip: float = Field(..., gt=0, description="S: every client's vector of projected gradients is clipped to L2 "
                                               "norm at most S")
    noise_multiplier: float = Field(..., gt=0, description="z: noise std on the mean vector is z * S / m")
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta of the reported (epsilon, delta) guarantee")


def clip_scalars(coef: "torch.Tensor", clip: float) -> tuple["torch.Tensor", bool]:
    """``coef`` scaled to L2 norm at most ``clip``, and whether it was scaled."""
    norm = float(coef.double().norm())
    return (coef * (clip / norm), True) if norm > clip else (coef, False)


@WRAPPERS.register("dp_seeds", "central client-level DP for zeroth-order scalars (DP-FedAvg on DeComFL's and "
                   "FedKSeed's projected gradients): clip each vector to S, uniform mean, add N(0, (z S / m)^2); "
                   "epsilon from dp-accounting", DpSeedsSettings)
class DpSeeds(AggregatorWrapper):
    accepts = frozenset({SEEDS})
    inner_aggregators = frozenset({"seed_replay"})
    own_scalars = ("epsilon", "delta", "dp_noise_std", "clipped")

    def __init__(self, settings: DpSeedsSettings, ctx: AggregatorContext, inner) -> None:
        super().__init__(settings, ctx, inner)
        if not inner.uniform_weights:
            raise ValueError("method.aggregator.weighting: dp_seeds bounds one client's effect on the uniform mean "
                             "(S/m); set method.aggregator.weighting: uniform")
        if getattr(ctx.trainer, "sampling", "uniform") == "importance":
            raise ValueError("method.trainer.sampling: importance uploads per-candidate amplitudes and draw counts "
                             "that dp_seeds does not protect; use sampling: uniform with dp_seeds")

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        s = self.settings
        std = dp_noise_std(s.clip, s.noise_multiplier, clients_in(updates))
        shape = updates[0].tensors[COEF].shape
        noise = std * torch.randn(shape, generator=torch_rng(self.ctx.seed, round, SHARED, "dp-seeds"),
                                  dtype=torch.float64)
        noised, clipped = [], 0
        for u in updates:  # the same noise on every vector: their uniform mean carries it once
            c, was = clip_scalars(u.tensors[COEF], s.clip)
            clipped += was
            noised.append(replace(u, tensors=dict(u.tensors) | {COEF: (c.double() + noise).float()}))
        new_glob, new_state = self.inner.aggregate(glob, noised, self.inner_state(state), round)
        eps = gaussian_epsilon(round, s.noise_multiplier, self.ctx.sampling_rate, s.delta)
        return new_glob, self.with_own(new_state, {"epsilon": eps, "delta": s.delta, "dp_noise_std": std,
                                                   "clipped": clipped})
