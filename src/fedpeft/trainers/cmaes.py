"""CMA-ES (Hansen 2016, no active update) and FedBPT's local black-box trainer (spec §2.5 C1-C10).

Own numpy implementation rather than pycma, as the spec recommends (A29): the server step injects
client means that were not produced by ``ask`` (pycma may rescale such long steps), the state must
cross the wire as explicit arrays (mean, sigma, C; never a pickled object), and every random draw
must come from a ``fedpeft.rng`` stream. ``tests/methods/test_fedbpt_cmaes.py`` checks the constants against
the spec's worked values for d = 500 and that the optimiser minimises a sphere.

State update (per ``tell``): y_i = (x_i - m)/sigma, <y>_w = sum_{i<=mu} w_i y_{i:lambda},
m <- m + sigma <y>_w, p_sigma <- (1-c_s) p_sigma + sqrt(c_s(2-c_s) mu_eff) C^{-1/2} <y>_w,
p_c <- (1-c_c) p_c + h_sigma sqrt(c_c(2-c_c) mu_eff) <y>_w,
C <- (1 - c_1 - c_mu + (1-h_sigma) c_1 c_c (2-c_c)) C + c_1 p_c p_c^T + c_mu sum w_i y_i y_i^T,
sigma <- sigma exp((c_s/d_s)(|p_sigma|/E|N(0,I)| - 1)). C^{-1/2} only in p_sigma (spec A17).

Covariance models (``Covariance``): ``full`` as above; ``diagonal`` keeps C diagonal, C <- diag of the update
above (sep-CMA-ES's model, Ros & Hansen 2008, without its larger learning rates), so sampling and C^{-1/2}
use that same diagonal; ``none`` keeps C = I (spec A23). pycma options reproduced on request, defaults off:
log recombination weights (``parent_weights``) and delayed selective mirroring (``selective_mirrors``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.model.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.lazy import lazy
from fedpeft.perturbation import TextSpan, perturb, ratio_fitness

torch = lazy("torch")

Covariance = Literal["full", "diagonal", "none"]

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
    """Recombination weights of the mu (default floor(lam/2)) best, normalised to sum 1.

    ``equal``: 1/mu (FedBPT App. A). ``log``: w_i proportional to ln((lam'+1)/2) - ln(i), i <= mu, pycma's
    default (``cma/recombination_weights.py``, ``RecombinationWeights.__init__``: raw weights
    ``log((len_+1)/2) - log(i)``; its positive part, without the negative active-CMA weights), with
    lam' = max(lam, 2 mu): pycma's ``CMA_mu = mu`` builds ``RecombinationWeights(2 mu)``
    (``options_parameters.py``), so every parent keeps a positive weight when mu > lam/2 (e.g. the
    authors' server, all |S| clients as parents).
    """
    mu = max(1, lam // 2) if mu is None else mu
    if kind == "equal":
        w = np.ones(mu)
    elif kind == "log":
        w = math.log((max(lam, 2 * mu) + 1) / 2) - np.log(np.arange(1, mu + 1))
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


def sample(state: CMAState, lam: int, rng: np.random.Generator, injected: np.ndarray | None = None) -> np.ndarray:
    """lam candidates x_i = m + sigma y_i, y_i ~ N(0, C) (Eq. 3; spec A11).

    ``injected`` directions dx (e.g. ``selective_mirrors``) come first, as m + dx, like pycma's ``ask_geno``
    (``cma/evolution_strategy.py``): a dx whose Mahalanobis length |C^{-1/2} dx|/sigma exceeds sqrt(n) is
    rescaled to the length |N(0, I)| of a fresh draw (``CMA_injections_threshold_keep_len = 1``); the
    remaining lam - k candidates are drawn as usual. Without ``injected`` the draws are unchanged.

    y = C^{1/2} z with the symmetric root B D B^T (pycma: B D z; the same N(0, C)): it is unique where C has
    repeated eigenvalues or the eigensolver picks other signs, which an eigenbasis is not, so a run draws the same
    candidates on every CPU (numpy's LAPACK kernels differ in the basis they return).
    """
    b, d = _eig(state.cov)
    n = state.mean.shape[0]
    kept = [] if injected is None else [_injection(dx, b, d, state.sigma, rng) for dx in injected]
    y = ((rng.standard_normal((lam - len(kept), n)) @ b) * d) @ b.T
    return np.vstack([state.mean + np.reshape(kept, (-1, n)), state.mean + state.sigma * y])


def _injection(dx: np.ndarray, b: np.ndarray, d: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """dx, or dx rescaled to the length of a N(0, I) draw when its Mahalanobis length exceeds sqrt(n)."""
    length = float(np.linalg.norm((b.T @ dx) / d)) / sigma
    n = dx.shape[0]
    return dx if length <= math.sqrt(n) else dx * (float(np.linalg.norm(rng.standard_normal(n))) / length)


def selective_mirrors(old_mean: np.ndarray, x: np.ndarray, fitness: np.ndarray, number: int,
                      were_mirrors: int = 0) -> np.ndarray:
    """Directions m_old - x for the ``number`` worst candidates, to inject into the next iteration.

    pycma's default at lambda < 6, delayed selective mirroring (``CMA_mirrors``, ``CMA_mirrormethod = 2``;
    ``get_selective_mirrors`` in ``cma/evolution_strategy.py``, Brockhoff et al. 2010): the next iteration
    samples m_new + (m_old - x_worst), the worst candidate reflected through the mean it was drawn around.
    A worst candidate that was itself a mirror (the first ``were_mirrors`` rows of ``x``) is not mirrored back.
    """
    worst = np.argsort(np.asarray(fitness), kind="stable")[::-1][:number]
    return np.array([old_mean - x[i] for i in worst if i >= were_mirrors]).reshape(-1, x.shape[1])


def tell(state: CMAState, k: CMAConstants, x: np.ndarray, fitness: np.ndarray,
         covariance: Covariance = "full") -> CMAState:
    """One CMA-ES update from candidates ``x`` [lam, n] and their fitness (lower is better); c_m = 1.

    ``covariance``: ``full`` update of C, ``diagonal`` (only diag C is kept and updated) or ``none`` (C fixed).
    """
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
    decay = 1 - k.c1 - k.cmu + (0.0 if hsig else k.c1 * k.cc * (2 - k.cc))
    if covariance == "full":
        cov = decay * cov + k.c1 * np.outer(pc, pc) + k.cmu * (y.T * k.weights) @ y
    elif covariance == "diagonal":
        cov = np.diag(decay * np.diagonal(cov) + k.c1 * pc ** 2 + k.cmu * (k.weights @ y ** 2))
    elif covariance != "none":
        raise ValueError(f"unknown covariance model '{covariance}' (allowed: full, diagonal, none)")
    sigma = state.sigma * math.exp((k.cs / k.ds) * (norm_ps / k.chin - 1))
    return replace(state, mean=state.mean + state.sigma * yw, sigma=sigma, cov=cov, ps=ps, pc=pc, g=state.g + 1)


# ---------------------------------------------------------------- local trainer (FedBPT ClientUpdate)


class CMAESSettings(BaseModel):
    """Local CMA-ES of FedBPT / BBT clients (paper: I = 8, lambda = 5, sigma_1 = 1)."""

    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(8, ge=1, description="I, local CMA-ES iterations per round")
    popsize: int = Field(5, ge=2, description="lambda_k, candidates per iteration")
    weights: Literal["equal", "log"] = Field("equal", description="local recombination weights alpha: equal "
                                                                  "1/mu_l (paper App. A) or log (pycma default, "
                                                                  "authors' code; recombination_weights.py)")
    mirrors: int = Field(0, ge=0, description="selectively mirrored candidates per iteration, the worst of the "
                                              "previous one reflected through its mean (pycma CMA_mirrors, "
                                              "CMA_mirrormethod=2; pycma default at lambda=5, authors' code: 1)")
    batched: bool = Field(True, description="evaluate all lambda candidates in one stacked forward")
    max_rows: int = Field(256, ge=1, description="rows per forward pass (candidates x examples)")
    perturb_rate: float = Field(0.5, ge=0, lt=1, description="r_p, share of input-text tokens replaced "
                                                             "(paper best: 0.6 SST-2, 0.4 AG News; 0 = vanilla BBT)")
    perturb_scope: Literal["text", "all"] = Field("text", description="replace only input-text tokens (spec A7) "
                                                                      "or every token (authors' code)")
    perturb_resample: Literal["iteration", "round"] = Field(
        "iteration", description="new mask per local iteration (Alg. 1) or per round (code)")
    ratio_form: Literal["dataset", "sample"] = Field("dataset", description="Alg. 1 ratio of dataset losses or "
                                                                            "Eq. 7 mean of per-sample ratios")
    eps: float = Field(1e-8, gt=0, description="floor of the perturbed loss in the ratio")

    @model_validator(mode="after")
    def _mirrors_fit(self) -> CMAESSettings:
        if self.mirrors > self.popsize // 2:  # pycma raises the same (options_parameters.py)
            raise ValueError(f"mirrors ({self.mirrors}) must be at most popsize // 2 ({self.popsize // 2})")
        return self


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
                vocab: np.ndarray | None = None, span: TextSpan | None = None, evaluate_start: bool = False,
                covariance: Covariance = "full", noise_rng: np.random.Generator | None = None) -> LocalResult:
    """I iterations of sample / evaluate (forward only) / update from the server's (m, sigma, C) (C1-C10).

    Evolution paths start at zero each round (C1, A16). With ``perturb_rate > 0`` the fitness is the
    perturbation ratio (Eq. 7, dataset form); the perturbed split is shared by all candidates of an
    iteration (A8). The sampling noise (and mirror rescaling) draws from ``noise_rng``, by default the
    same stream ``rng`` that draws the perturbations. ``covariance`` is the model of C (``tell``).
    """
    n = start.mean.shape[0]
    consts = cma_constants(n, parent_weights(cfg.popsize, kind=cfg.weights))
    state = CMAState(start.mean.copy(), float(start.sigma), start.cov.copy())  # fresh paths, g = 0
    noise_rng = rng if noise_rng is None else noise_rng
    perturbing = cfg.perturb_rate > 0
    if perturbing and vocab is None:
        raise ValueError("local_cmaes: perturbation needs the replacement vocabulary")
    first = float(box.losses(torch.from_numpy(state.mean).float(), data)[0]) if evaluate_start else float("nan")
    sigmas, replaced, eligible = [], 0, 0
    pert: Encoded | None = None
    mirrors: np.ndarray | None = None  # none in the first iteration: pycma's fresh instance has none to inject
    ratio = float("nan")
    for j in range(cfg.iterations):
        if perturbing and (pert is None or cfg.perturb_resample == "iteration"):
            pert, r, e = perturb(data, cfg.perturb_rate, vocab, rng, span if cfg.perturb_scope == "text" else None)
            replaced, eligible = replaced + r, eligible + e
        sigmas.append(state.sigma)
        x = sample(state, cfg.popsize, noise_rng, mirrors)
        z = torch.from_numpy(x).float()
        clean = box.sample_losses(z, data)
        fit = (ratio_fitness(clean, box.sample_losses(z, pert), cfg.ratio_form, cfg.eps) if perturbing
               else clean.mean(1)).double().numpy()
        if cfg.mirrors:
            mirrors = selective_mirrors(state.mean, x, fit, cfg.mirrors, 0 if mirrors is None else len(mirrors))
        state = tell(state, consts, x, fit, covariance)
    zf = torch.from_numpy(state.mean).float()
    clean_final = box.sample_losses(zf, data)
    if perturbing:
        ratio = float(ratio_fitness(clean_final, box.sample_losses(zf, pert), cfg.ratio_form, cfg.eps)[0])
    return LocalResult(state, np.array(sigmas), float(clean_final.mean()), ratio, first, box.usage.as_dict(),
                       replaced / eligible if eligible else 0.0)
