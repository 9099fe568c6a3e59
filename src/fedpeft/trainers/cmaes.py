"""CMA-ES (Hansen 2016, no active update) and FedBPT's local black-box trainer (spec §2.5 C1-C10).

Own numpy implementation rather than pycma, as the spec recommends (A29): the server step injects
client means that were not produced by ``ask`` (pycma may rescale such long steps), the state must
cross the wire as explicit arrays (mean, sigma, C; never a pickled object), and every random draw
must come from a ``fedpeft.rng`` stream. ``tests/test_fedbpt_cmaes.py`` checks the constants against
the spec's worked values for d = 500 and that the optimiser minimises a sphere.

State update (per ``tell``): y_i = (x_i - m)/sigma, <y>_w = sum_{i<=mu} w_i y_{i:lambda},
m <- m + sigma <y>_w, p_sigma <- (1-c_s) p_sigma + sqrt(c_s(2-c_s) mu_eff) C^{-1/2} <y>_w,
p_c <- (1-c_c) p_c + h_sigma sqrt(c_c(2-c_c) mu_eff) <y>_w,
C <- (1 - c_1 - c_mu + (1-h_sigma) c_1 c_c (2-c_c)) C + c_1 p_c p_c^T + c_mu sum w_i y_i y_i^T,
sigma <- sigma exp((c_s/d_s)(|p_sigma|/E|N(0,I)| - 1)). C^{-1/2} only in p_sigma (spec A17).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.backbones.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.perturbation import TextSpan, perturb, ratio_fitness

# ---------------------------------------------------------------- CMA-ES core (pure functions)


@dataclass(frozen=True)
class CMAConstants:
    """Strategy constants for dimension n and parent weights w (Hansen 2016 defaults)."""

    n: int
    weights: np.ndarray
    mueff: float
    cs: float
    ds: float
    cc: float
    c1: float
    cmu: float
    chin: float

    @property
    def mu(self) -> int:
        return len(self.weights)


def parent_weights(lam: int, mu: int | None = None, kind: str = "equal") -> np.ndarray:
    """Recombination weights of the mu = floor(lam/2) best: equal 1/mu (FedBPT App. A) or Hansen's log weights."""
    mu = max(1, lam // 2) if mu is None else mu
    if kind == "equal":
        w = np.ones(mu)
    elif kind == "log":
        w = math.log((lam + 1) / 2) - np.log(np.arange(1, mu + 1))
    else:
        raise ValueError(f"unknown weights '{kind}' (allowed: equal, log)")
    return w / w.sum()


def cma_constants(n: int, weights: np.ndarray) -> CMAConstants:
    """c_sigma, d_sigma, c_c, c_1, c_mu and E|N(0,I)| from n and mu_eff (spec §2.5 constants)."""
    mueff = 1.0 / float(np.sum(weights ** 2))
    cs = (mueff + 2) / (n + mueff + 5)
    ds = 1 + 2 * max(0.0, math.sqrt((mueff - 1) / (n + 1)) - 1) + cs
    cc = (4 + mueff / n) / (n + 4 + 2 * mueff / n)
    c1 = 2 / ((n + 1.3) ** 2 + mueff)
    cmu = min(1 - c1, 2 * (mueff - 2 + 1 / mueff) / ((n + 2) ** 2 + mueff))
    chin = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n ** 2))
    return CMAConstants(n, weights, mueff, cs, ds, cc, c1, cmu, chin)


@dataclass
class CMAState:
    """Search distribution m + sigma N(0, C) with evolution paths and generation counter (float64)."""

    mean: np.ndarray
    sigma: float
    cov: np.ndarray
    ps: np.ndarray = field(default=None)  # type: ignore[assignment]
    pc: np.ndarray = field(default=None)  # type: ignore[assignment]
    g: int = 0

    def __post_init__(self) -> None:
        self.mean = np.asarray(self.mean, dtype=np.float64)
        self.cov = np.asarray(self.cov, dtype=np.float64)
        n = self.mean.shape[0]
        self.ps = np.zeros(n) if self.ps is None else np.asarray(self.ps, dtype=np.float64)
        self.pc = np.zeros(n) if self.pc is None else np.asarray(self.pc, dtype=np.float64)


def _eig(cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, D) with C = B diag(D^2) B^T; diagonal C takes the cheap path."""
    if not np.any(cov - np.diag(np.diagonal(cov))):
        return np.eye(cov.shape[0]), np.sqrt(np.maximum(np.diagonal(cov), 1e-300))
    vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
    return vecs, np.sqrt(np.maximum(vals, 1e-300))


def sample(state: CMAState, lam: int, rng: np.random.Generator) -> np.ndarray:
    """lam candidates x_i = m + sigma y_i, y_i ~ N(0, C) (Eq. 3; spec A11)."""
    b, d = _eig(state.cov)
    y = (rng.standard_normal((lam, state.mean.shape[0])) * d) @ b.T
    return state.mean + state.sigma * y


def tell(state: CMAState, k: CMAConstants, x: np.ndarray, fitness: np.ndarray,
         update_cov: bool = True) -> CMAState:
    """One CMA-ES update from candidates ``x`` [lam, n] and their fitness (lower is better); c_m = 1."""
    order = np.argsort(np.asarray(fitness), kind="stable")[: k.mu]
    y = (x[order] - state.mean) / state.sigma
    yw = k.weights @ y
    b, d = _eig(state.cov)
    c_inv_half_yw = b @ ((b.T @ yw) / d)
    ps = (1 - k.cs) * state.ps + math.sqrt(k.cs * (2 - k.cs) * k.mueff) * c_inv_half_yw
    norm_ps = float(np.linalg.norm(ps))
    hsig = norm_ps / math.sqrt(1 - (1 - k.cs) ** (2 * (state.g + 1))) < (1.4 + 2 / (k.n + 1)) * k.chin
    pc = (1 - k.cc) * state.pc + (math.sqrt(k.cc * (2 - k.cc) * k.mueff) * yw if hsig else 0.0)
    cov = state.cov
    if update_cov:
        decay = 1 - k.c1 - k.cmu + (0.0 if hsig else k.c1 * k.cc * (2 - k.cc))
        cov = decay * cov + k.c1 * np.outer(pc, pc) + k.cmu * (y.T * k.weights) @ y
    sigma = state.sigma * math.exp((k.cs / k.ds) * (norm_ps / k.chin - 1))
    return replace(state, mean=state.mean + state.sigma * yw, sigma=sigma, cov=cov, ps=ps, pc=pc, g=state.g + 1)


# ---------------------------------------------------------------- local trainer (FedBPT ClientUpdate)


class CMAESSettings(BaseModel):
    """Local CMA-ES of FedBPT / BBT clients (paper: I = 8, lambda = 5, sigma_1 = 1)."""

    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(8, ge=1, description="I, local CMA-ES iterations per round")
    popsize: int = Field(5, ge=2, description="lambda_k, candidates per iteration")
    weights: Literal["equal", "log"] = Field("equal", description="local recombination weights alpha "
                                                                  "(paper App. A: equal 1/mu_l)")
    batched: bool = Field(True, description="evaluate all lambda candidates in one stacked forward")
    max_rows: int = Field(256, ge=1, description="rows per forward pass (candidates x examples)")
    perturb_rate: float = Field(0.5, ge=0, lt=1, description="r_p, share of input-text tokens replaced "
                                                             "(paper best: 0.6 SST-2, 0.4 AG News; 0 = vanilla BBT)")
    perturb_scope: Literal["text", "all"] = Field("text", description="replace only input-text tokens (spec A7) "
                                                                      "or every token (authors' code)")
    perturb_resample: Literal["iteration", "round"] = Field("iteration", description="new mask per local "
                                                                                     "iteration (Alg. 1) or per round (code)")
    ratio_form: Literal["dataset", "sample"] = Field("dataset", description="Alg. 1 ratio of dataset losses or "
                                                                            "Eq. 7 mean of per-sample ratios")
    eps: float = Field(1e-8, gt=0, description="floor of the perturbed loss in the ratio")


@dataclass
class LocalResult:
    """What a client has after ClientUpdate: final local state, the I step sizes used, losses, usage."""

    state: CMAState
    sigmas: np.ndarray          # sigma_{t,1..I}: the step sizes used for sampling (spec A10)
    clean_loss: float           # F^k(z_{t+1}^k), clean mean CE at the final local mean (C9)
    ratio_loss: float           # F^_k at the final mean with the last mask (nan without perturbation)
    first_loss: float           # clean loss of the incoming global mean (for diagnostics)
    usage: dict[str, int]
    replaced_share: float       # realised replacement rate of the perturbations


def local_cmaes(box: BlackBox, data: Encoded, start: CMAState, cfg: CMAESSettings, rng: np.random.Generator,
                vocab: np.ndarray | None = None, span: TextSpan | None = None,
                evaluate_start: bool = False) -> LocalResult:
    """I iterations of sample / evaluate (forward only) / update from the server's (m, sigma, C) (C1-C10).

    Evolution paths start at zero each round (C1, A16). With ``perturb_rate > 0`` the fitness is the
    perturbation ratio (Eq. 7, dataset form); the perturbed split is shared by all candidates of an
    iteration (A8). All randomness comes from ``rng``.
    """
    n = start.mean.shape[0]
    consts = cma_constants(n, parent_weights(cfg.popsize, kind=cfg.weights))
    state = CMAState(start.mean.copy(), float(start.sigma), start.cov.copy())  # fresh paths, g = 0
    perturbing = cfg.perturb_rate > 0
    if perturbing and vocab is None:
        raise ValueError("local_cmaes: perturbation needs the replacement vocabulary")
    first = float(box.losses(torch.from_numpy(state.mean).float(), data)[0]) if evaluate_start else float("nan")
    sigmas, replaced, eligible = [], 0, 0
    pert: Encoded | None = None
    ratio = float("nan")
    for j in range(cfg.iterations):
        if perturbing and (pert is None or cfg.perturb_resample == "iteration"):
            pert, r, e = perturb(data, cfg.perturb_rate, vocab, rng, span if cfg.perturb_scope == "text" else None)
            replaced, eligible = replaced + r, eligible + e
        sigmas.append(state.sigma)
        x = sample(state, cfg.popsize, rng)
        z = torch.from_numpy(x).float()
        clean = box.sample_losses(z, data)
        fit = ratio_fitness(clean, box.sample_losses(z, pert), cfg.ratio_form, cfg.eps) if perturbing \
            else clean.mean(1)
        state = tell(state, consts, x, fit.double().numpy())
    zf = torch.from_numpy(state.mean).float()
    clean_final = box.sample_losses(zf, data)
    if perturbing:
        ratio = float(ratio_fitness(clean_final, box.sample_losses(zf, pert), cfg.ratio_form, cfg.eps)[0])
    return LocalResult(state, np.array(sigmas), float(clean_final.mean()), ratio, first, box.usage.as_dict(),
                       replaced / eligible if eligible else 0.0)

