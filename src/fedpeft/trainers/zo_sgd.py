"""Zeroth-order local SGD from forward passes (``zo-sgd``): DeComFL's and FedKSeed's client.

Every local step draws a batch and P seeded perturbations of the trained tensors, estimates one projected gradient
per perturbation from two (central) or 1 + 1/P (forward) forward passes, and moves θ <- θ - η Σ_i (g_i / P) z_i
(``trainers.spsa``). No gradient, no optimizer state and no copy: the tensors it is given (the client's own copy,
decoded from its instruction) are perturbed and updated in place; a download that keeps a copy on the client
(``seed_history``) gives the trainer a second one, as DeComFL's client keeps a snapshot. What it uploads is the
scalars (``formats.seeds``):

- ``seeds: server`` (DeComFL, Li et al. 2025, Alg. 2): the server draws one seed per local step and sends them with
  the instruction; every client uses the same seeds, so the reply is [local steps × P] scalars and the server averages
  them per position;
- ``seeds: pool`` (FedKSeed, Qin et al. 2024, §4.1): K candidate seeds fixed by the run seed (both sides draw the
  same pool, ``seed_pool``); each perturbation samples one uniformly; the reply is one summed scalar per candidate
  (a [K] vector, zero where unsampled), the server's weighted mean of them per seed is the exact aggregate;
- ``sampling: importance`` (FedKSeed-Pro, §4.2): each perturbation samples a candidate with the probability the
  server sends (``importance_probabilities``: a softmax of the min-max-normalised mean amplitude |g| each candidate
  has had, Eq. 6-7); the reply adds, per candidate, the sum of this round's clipped amplitudes and the number of
  draws, each divided by the client's weight, so that the weighted mean of the replies times the total weight is
  their plain sum, which the server adds to its history (and secure aggregation can give it).

The tensors' scalars are rounded to float32 (the wire's float) before the client applies them, so its step is the
replay's arithmetic. Works with any adapter whose tensors are floats (``full``: every backbone weight, as
``fedavg-full``; LoRA; soft prompts) on classification, generation and preference objectives (its loss is the
objective's own).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.seeds import ABS, COEF, HITS, PROBS, SEEDS, SeedFormat
from fedpeft.lazy import lazy, no_grad
from fedpeft.rng import SHARED, numpy_rng, torch_rng
from fedpeft.trainers.base import SEEDS as SEED_KIND
from fedpeft.trainers.base import TRAINERS, TrainerBase, TrainerContext
from fedpeft.trainers.spsa import add_perturbation_, forward_passes, generator_seed, projected_gradients

torch = lazy("torch")


class ZOSettings(BaseModel):
    """Zeroth-order SGD (defaults: DeComFL's OPT-125M SST-2 recipe, its README)."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-5, gt=0, description="η, the step size of θ <- θ - η Σ_i (g_i / P) z_i")
    mu: float = Field(1e-3, gt=0, description="μ, the perturbation scale of the finite difference")
    perturbations: int = Field(5, ge=1, description="P, seeded perturbations (projected gradients) per local step")
    local_steps: int = Field(1, ge=1, description="local steps per round, one batch each")
    batch_size: int = Field(32, ge=1, description="examples per local step")
    difference: Literal["forward", "central"] = Field(
        "forward", description="forward: (L(θ+μz) - L(θ))/μ, P + 1 forward passes a step (DeComFL's rge-forward); "
                               "central: (L(θ+μz) - L(θ-μz))/2μ, 2P passes (MeZO, FedKSeed)")
    seeds: Literal["server", "pool"] = Field(
        "server", description="server: the server draws one seed per local step and sends them, every client "
                              "uses them (DeComFL); pool: each perturbation samples one of K candidate seeds fixed "
                              "by the run seed (FedKSeed)")
    pool_size: int = Field(4096, ge=1, description="K, candidate seeds of seeds: pool (FedKSeed's default)")
    sampling: Literal["uniform", "importance"] = Field(
        "uniform", description="seeds: pool: how a perturbation picks its candidate: uniform (FedKSeed) or "
                               "importance (FedKSeed-Pro: by the probabilities the server sends, from the mean "
                               "amplitude of each candidate's scalars so far)")
    importance_clip: float = Field(1000.0, gt=0, description="sampling: importance: amplitudes are clipped at "
                                                             "this value (FedKSeed-Pro's bias_loss_clip)")
    importance_initial: float = Field(0.0, description="sampling: importance: the scalar every candidate's "
                                                       "history starts with (FedKSeed-Pro's grad_initial)")

    @model_validator(mode="after")
    def _importance_needs_a_pool(self) -> "ZOSettings":
        if self.sampling == "importance" and self.seeds != "pool":
            raise ValueError("sampling: importance draws among the K candidate seeds of seeds: pool; set "
                             "method.trainer.seeds: pool")
        return self


def seed_pool(seed: int, size: int) -> np.ndarray:
    """FedKSeed's K candidate seeds (``np.random.randint(1, 1e11, K)`` in its ``main.py``), drawn from the run seed
    by server and clients alike."""
    return numpy_rng(seed, 0, SHARED, "zo-seed-pool").integers(1, 10**11, size, dtype=np.int64)


def importance_probabilities(abs_sum: "torch.Tensor", hits: "torch.Tensor", initial: float,
                             clip: float) -> "torch.Tensor":
    """FedKSeed-Pro's sampling probabilities (Qin et al. 2024, Eq. 6-7; ``calculate_probabilities`` in its
    ``server.py``): ψ_j, the mean of the clipped amplitudes |g| of every scalar candidate j has had, its history
    starting with ``initial``; p = softmax((ψ - min ψ) / (max ψ - min ψ + 1e-10)). ``abs_sum`` and ``hits`` are
    the sums of the amplitudes and the number of scalars per candidate."""
    psi = (min(abs(initial), clip) + abs_sum.double()) / (1.0 + hits.double())
    norm = (psi - psi.min()) / (psi.max() + 1e-10 - psi.min())
    return torch.softmax(norm, 0)


def reply_length(s: ZOSettings) -> int:
    """How many scalars a reply holds: [local steps × P] of the server's seeds, or one per candidate seed."""
    return s.local_steps * s.perturbations if s.seeds == "server" else s.pool_size


@TRAINERS.register("zo_sgd", "zeroth-order SGD from seeded perturbations, forward passes only; uploads (seed, "
                   "scalar) pairs (DeComFL, FedKSeed)", ZOSettings)
class ZOSGDTrainer(TrainerBase):
    kind = SEED_KIND
    forward_only = True
    scalars = ("train_loss", "steps", "forward_passes")
    provides = frozenset(scalars)

    def __init__(self, settings: ZOSettings, ctx: TrainerContext) -> None:
        super().__init__(settings, ctx)
        self._pool: tuple[int, np.ndarray] | None = None  # (run seed, its candidate seeds)

    def update_format(self) -> SeedFormat:
        return SeedFormat(reply_length(self.settings), self.settings.sampling == "importance")

    def pool(self, seed: int) -> np.ndarray:
        if self._pool is None or self._pool[0] != seed:
            self._pool = (seed, seed_pool(seed, self.settings.pool_size))
        return self._pool[1]

    @no_grad
    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen=None, static=None, penalty=None) -> tuple[Update, Params]:
        if frozen or penalty is not None:
            raise ValueError("method.trainer.name: 'zo_sgd' perturbs every tensor it trains; it cannot freeze parts "
                             "of them or add a penalty")
        s, clf = self.settings, self.clf
        central, per = s.difference == "central", s.perturbations
        work = {k: v.to(clf.device, torch.float32) for k, v in params.items()}  # in place: its own decoded copy
        fixed = set(clf.adapter.fixed(work))
        names = sorted(k for k, v in work.items() if k not in fixed and v.is_floating_point())
        if s.seeds == "server" and SEEDS not in instruction.tensors:
            raise ValueError(f"zo_sgd with seeds: server needs the round's seeds ('{SEEDS}') in its instruction; use "
                             "method.aggregator.name: seed_replay")
        step_seeds = [int(x) for x in instruction.tensors[SEEDS].tolist()] if s.seeds == "server" else []
        importance = s.sampling == "importance"
        if importance and PROBS not in instruction.tensors:
            raise ValueError(f"zo_sgd with sampling: importance needs the candidates' probabilities ('{PROBS}') in "
                             "its instruction; use method.aggregator.name: seed_replay")
        probs = instruction.tensors[PROBS].double().numpy() if importance else None
        draw = numpy_rng(client.seed, round, client.client_id, "zo-pool-draw")
        coef = torch.zeros(reply_length(s), dtype=torch.float32)
        amp, hits = torch.zeros_like(coef, dtype=torch.float64), torch.zeros_like(coef, dtype=torch.float64)
        order = torch.empty(0, dtype=torch.long)
        gen, n, total = torch_rng(client.seed, round, client.client_id, "local-train"), len(client.train), 0.0
        for t in range(s.local_steps):
            if len(order) < s.batch_size:  # a new pass over the data; the tail of the last pass is kept
                order = torch.cat([order, torch.randperm(n, generator=gen)])
            idx, order = order[: min(s.batch_size, n)], order[min(s.batch_size, n):]
            batch = clf.batch(client.train, idx.tolist())

            def loss() -> float:
                return float(clf.loss(clf.outputs(work, batch, static), batch))

            if s.seeds == "server":  # P perturbations of the step's seed; reply positions [t, i]
                seeds = [generator_seed(step_seeds[t], i) for i in range(per)]
                slots = list(range(t * per, (t + 1) * per))
            else:  # each perturbation samples a candidate (its perturbation 0); reply position: the candidate
                slots = (draw.choice(s.pool_size, per, p=probs / probs.sum()) if importance
                         else draw.integers(0, s.pool_size, per)).tolist()
                seeds = [generator_seed(int(self.pool(client.seed)[j]), 0) for j in slots]
            grads, value = projected_gradients(work, names, loss, seeds, s.mu, central)
            g = torch.tensor(grads, dtype=torch.float32)  # as they travel
            for seed, slot, gi in zip(seeds, slots, g.tolist()):
                add_perturbation_(work, names, seed, -s.lr * gi / per)
                coef[slot] += gi if s.seeds == "server" else gi / per
                amp[slot] += min(abs(gi), s.importance_clip)
                hits[slot] += 1
            total += value
        scalars = {"train_loss": total / s.local_steps, "steps": s.local_steps,
                   "forward_passes": s.local_steps * forward_passes(per, central)}
        aux = {COEF: coef} | ({ABS: (amp / client.num_examples).float(), HITS: (hits / client.num_examples).float()}
                              if importance else {})
        return Update(client.client_id, work, client.num_examples, aux, scalars), {}
