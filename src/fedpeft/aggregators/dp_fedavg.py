"""Central, client-level differential privacy: DP-FedAvg with fixed clipping (McMahan et al. 2018, "Learning
Differentially Private Recurrent Language Models", Alg. 1 with a fixed number of clients per round; the shape of
Flower's ``DifferentialPrivacyServerSideFixedClipping``).

The server clips every client delta Δ_k = x_k − x_t to L2 norm S (``clipping.clip_updates``; with ``clipping: client``
each client clips its own, ``transforms.clip_delta``, and the wrapper composes with secure aggregation), the inner
aggregator takes the uniform mean of the clipped updates, and Gaussian noise is added to the new global tensors:

    x_{t+1} = x_t + (1/m) Σ_k Δ_k · min(1, S/‖Δ_k‖₂) + N(0, (z·S/m)² I)

with m the clients aggregated this round. Adding or removing one client moves the uniform mean by at most S/m,
so each round is the Gaussian mechanism with noise multiplier z; sample-weighted FedAvg would change that
sensitivity, so the inner aggregator must be ``uniform`` (checked when the config is loaded). ε after t rounds at
``delta``: ``privacy.gaussian_epsilon`` (dp-accounting's RDP accountant, Poisson subsampling at the selector's
q = clients_per_round / N, the usual stand-in for fixed-size sampling; q = 1 where selection is not uniformly
random, see ``privacy.sampling_rate``), kept in the state and reported by ``diagnostics`` every round. The noise
comes from the derived stream (seed, round, "dp-fedavg"), so reruns and resumes are identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import WRAPPERS, AggregatorWrapper, Params, clients_in
from fedpeft.aggregators.clipping import clip_updates
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy
from fedpeft.privacy import gaussian_epsilon
from fedpeft.rng import SHARED, torch_rng

torch = lazy("torch")


class DpFedAvgSettings(BaseModel):
    """``method.wrappers`` entry keys of ``dp_fedavg``."""

    model_config = ConfigDict(extra="forbid")
    clip: float = Field(..., gt=0, description="S: every client delta is clipped to L2 norm at most S")
    noise_multiplier: float = Field(..., gt=0, description="z: noise std on the mean is z * S / m")
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta of the reported (epsilon, delta) guarantee")
    clipping: Literal["server", "client"] = Field(
        "server", description="server: the server clips every delta (Flower's server-side fixed clipping); client: "
                              "each client clips its own (the clip_delta transform with max_norm = clip; Flower's "
                              "client-side fixed clipping), so the server needs only the mean (secure aggregation)")


def dp_noise_std(clip: float, noise_multiplier: float, clients: int) -> float:
    """z·S/m: the Gaussian noise std on the uniform mean of m clipped deltas."""
    return noise_multiplier * clip / clients


@WRAPPERS.register("dp_fedavg", "central client-level DP (DP-FedAvg): clip each delta to S, uniform mean, add "
                   "N(0, (z S / m)^2) noise; epsilon from dp-accounting", DpFedAvgSettings)
class DpFedAvg(AggregatorWrapper):
    inner_aggregators = frozenset({"uniform"})  # the sensitivity S/m holds for the uniform mean only
    own_scalars = ("epsilon", "delta", "dp_noise_std", "clipped")

    @classmethod
    def secure_sum_with(cls, settings: DpFedAvgSettings) -> bool:
        """With client-side clipping the server only adds noise to the mean."""
        return settings.clipping == "client"

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        s = self.settings
        clipped, n_clipped = clip_updates(glob, updates, s.clip) if s.clipping == "server" else (list(updates), 0)
        new_glob, new_state = self.inner.aggregate(glob, clipped, self.inner_state(state), round)
        std = dp_noise_std(s.clip, s.noise_multiplier, clients_in(updates))
        gen = torch_rng(self.ctx.seed, round, SHARED, "dp-fedavg")
        noisy = {k: (v.double() + std * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float()
                 if k in glob else v for k, v in sorted(new_glob.items())}
        eps = gaussian_epsilon(round, s.noise_multiplier, self.ctx.sampling_rate, s.delta)
        return noisy, self.with_own(new_state, {"epsilon": eps, "delta": s.delta, "dp_noise_std": std,
                                                "clipped": int(n_clipped)})
