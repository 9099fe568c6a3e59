"""The ratio r of layers to keep, from the Hessian spectrum of the local loss (Alg. 1 lines 3–10; spec §2.6, A8).

Everything works on a flat prompt vector θ (all layers' prefixes) and a scalar loss ``F_i(θ)`` on one
local batch. Hessian-vector products use double backward (PyHessian's method); attention runs with the
math SDPA kernel because PyTorch's fused CPU attention has no second derivative. PyHessian itself is not
used: it differentiates ``nn.Module`` parameters and hard-codes CUDA, while our prompts are plain tensors.

- ``hessian_gap`` (paper): the spectrum λ_1 ≤ … ≤ λ_K (exact via K HVPs + ``eigvalsh`` when K is small,
  otherwise Lanczos Ritz values with their quadrature weights), the secant Lipschitz estimate
  ``𝓛 ≈ max_s ‖H·sΔ − ∇F(θ+sΔ) + ∇F(θ)‖ / ‖sΔ‖`` of the remainder ``B(Δ) = HΔ − ∇F(θ+Δ)``, the first k
  with ``λ_{k+1} − λ_k > 4𝓛``, and ``r = (K − k)/K`` (the spectral mass above the gap); r = 1 if no gap.
- ``slq_plateau`` (official code): stochastic Lanczos quadrature density, ``ratio(t) = 1 − CDF(t)``,
  t increased from 0 until the ratio plateaus.
- ``fixed``: r = ``keep_ratio`` (every published run ended at 0.5).

What they return on real models (measured with this code: MiniLM with h = 2 or 4, i.e. K = 9,216 or 18,432
prompt parameters, Lanczos; SST-2, BBC and synthetic sentiment; one batch of 8; at initialisation and after
2–3 FedPepTAO rounds; and tiny RoBERTa, K = 256, exact): the prompt Hessian is small and indefinite, its
spectrum roughly symmetric about 0 (|λ| ≲ 0.03).

- ``slq_plateau`` returned 0.495–0.496 in every case: the step of 0.1 exceeds the whole spectrum, so the
  "below half" test keeps halving it until the first steps are flat, and the result is ≈ 1 − CDF(0), the
  share of positive curvature. That would explain the "r = 50 %" of every published example (RoBERTa-large,
  GPT-2-large, LLaMA-7B; not measured here).
- ``hessian_gap`` keeps every layer: at initialisation Δ = 0 gives 𝓛 = 0, so the first gap qualifies and
  r = 1 − 1/K (exact) or 1 − τ_1² (Lanczos); after training MiniLM's 𝓛 ≈ 2–6·10⁻³ exceeds every gap
  between the 50 Ritz values, so no gap qualifies and r = 1, while tiny RoBERTa's 𝓛 ≈ 3·10⁻⁷ lets the 2nd or
  3rd gap qualify, r ≈ 0.99. Once (MiniLM, synthetic sentiment) only the gap below the top Ritz value
  qualified and r ≈ 0, i.e. one layer. Tests on a known spectrum: ``tests/methods/test_fedpeptao.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedpeft.lazy import lazy
from fedpeft.registry import Registry

attention = lazy("torch.nn.attention")
torch = lazy("torch")

LossFn = Callable[["torch.Tensor"], "torch.Tensor"]
Hvp = Callable[["torch.Tensor"], "torch.Tensor"]


def gradient(loss_fn: LossFn, theta: torch.Tensor) -> torch.Tensor:
    """∇F(θ) as a detached float64 vector."""
    x = theta.detach().float().clone().requires_grad_(True)
    with attention.sdpa_kernel(attention.SDPBackend.MATH):
        (g,) = torch.autograd.grad(loss_fn(x), x)
    return g.double()


class HessianOperator:
    """v ↦ H(θ)·v by double backward through one retained gradient graph."""

    def __init__(self, loss_fn: LossFn, theta: torch.Tensor) -> None:
        self.x = theta.detach().float().clone().requires_grad_(True)
        with attention.sdpa_kernel(attention.SDPBackend.MATH):
            (self.g,) = torch.autograd.grad(loss_fn(self.x), self.x, create_graph=True)
        self.dim = self.x.numel()
        self.calls = 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        with attention.sdpa_kernel(attention.SDPBackend.MATH):
            (hv,) = torch.autograd.grad(self.g, self.x, grad_outputs=v.to(self.g.dtype), retain_graph=True)
        return hv.double()


def exact_spectrum(hvp: Hvp, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All eigenvalues of H (K HVPs against the unit basis, symmetrised, ``eigvalsh``); weights 1/K each."""
    cols = [hvp(torch.nn.functional.one_hot(torch.tensor(j), dim).double()) for j in range(dim)]
    h = torch.stack(cols, dim=1)
    lam = torch.linalg.eigvalsh(0.5 * (h + h.T))
    return lam, torch.full((dim,), 1.0 / dim, dtype=torch.float64)


def lanczos_spectrum(hvp: Hvp, dim: int, iters: int, probes: int,
                     generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stochastic Lanczos quadrature (Ghorbani et al. 2019, PyHessian ``density``): Ritz values and weights.

    Each Rademacher probe gives ``m = min(iters, dim)`` Ritz values θ_j with weights τ_j² (first components
    of the tridiagonal's eigenvectors) / probes; full re-orthogonalisation keeps them clean.
    """
    nodes, weights = [], []
    m = min(iters, dim)
    for _ in range(probes):
        v = (torch.randint(0, 2, (dim,), generator=generator).double() * 2 - 1) / dim ** 0.5
        basis, alphas, betas = [v], [], []
        w = hvp(v)
        alphas.append(float(w @ v))
        w = w - alphas[-1] * v
        for _ in range(1, m):
            for u in basis:  # full re-orthogonalisation
                w = w - (w @ u) * u
            beta = float(w.norm())
            if beta < 1e-10:
                break
            v_new = w / beta
            basis.append(v_new)
            betas.append(beta)
            w = hvp(v_new) - beta * basis[-2]
            alphas.append(float(w @ v_new))
            w = w - alphas[-1] * v_new
        t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            t = t + torch.diag(off, 1) + torch.diag(off, -1)
        lam, vec = torch.linalg.eigh(t)
        nodes.append(lam)
        weights.append(vec[0] ** 2 / probes)
    lam, w = torch.cat(nodes), torch.cat(weights)
    order = torch.argsort(lam)
    return lam[order], w[order]


def secant_lipschitz(loss_fn: LossFn, hvp: Hvp, theta: torch.Tensor, delta: torch.Tensor,
                     scales: tuple[float, ...] = (0.25, 0.5, 1.0)) -> float:
    """𝓛 ≈ max_s ‖B(sΔ) − B(0)‖ / ‖sΔ‖ with B(Δ) = H·Δ − ∇F(θ+Δ) (spec §2.6, recommended computable form)."""
    g0 = gradient(loss_fn, theta)
    best = 0.0
    for s in scales:
        d = s * delta.double()
        norm = float(d.norm())
        if norm == 0.0:
            continue
        diff = hvp(d) - (gradient(loss_fn, theta.double() + d) - g0)
        best = max(best, float(diff.norm()) / norm)
    return best


def gap_ratio(eigenvalues: torch.Tensor, weights: torch.Tensor, lipschitz: float,
              factor: float = 4.0) -> tuple[float, int | None]:
    """Alg. 1 lines 9–10: first k with λ_{k+1} − λ_k > 4𝓛 (ascending); r = spectral mass above it.

    With the exact spectrum (weights 1/K) this is r = (K − k)/K. Returns (r, k), with (1.0, None) when
    no gap qualifies (keep every layer, spec §2.6).
    """
    lam = eigenvalues.double()
    gaps = lam[1:] - lam[:-1]
    hits = torch.nonzero(gaps > factor * lipschitz).flatten()
    if len(hits) == 0:
        return 1.0, None
    k = int(hits[0]) + 1  # eigenvalues λ_1..λ_k lie below the gap
    mass = float(weights[k:].sum() / weights.sum())
    return mass, k


def slq_plateau_ratio(nodes: torch.Tensor, weights: torch.Tensor, bins: int = 10_000, sigma_sq: float = 1e-5,
                      step: float = 0.1, tol: float = 0.005, window: int = 4, max_restarts: int = 30) -> float:
    """The official code's heuristic: Gaussian-smoothed SLQ density, ratio(t) = 1 − CDF(t).

    t starts at 0 and grows by ``step`` until ``window`` consecutive ratios differ by < ``tol`` (a plateau,
    i.e. a gap) and the last ratio is returned; if the ratio first falls below half of ratio(0), the step
    is halved and the search restarts.
    """
    lo, hi = float(nodes.min()), float(nodes.max())
    pad = 0.01 * max(1.0, hi - lo)
    grid = torch.linspace(lo - pad, hi + pad, bins, dtype=torch.float64)
    sigma = sigma_sq * max(1.0, hi - lo)
    dens = (weights[None, :] * torch.exp(-((grid[:, None] - nodes[None, :]) ** 2) / (2 * sigma))
            / (2 * torch.pi * sigma) ** 0.5).sum(1)
    dens = dens / dens.sum()
    cdf = torch.cumsum(dens, 0)

    def ratio(t: float) -> float:
        idx = int(torch.searchsorted(grid, torch.tensor(t, dtype=torch.float64)))
        return 1.0 if idx == 0 else float(1.0 - cdf[min(idx, bins) - 1])

    first = ratio(0.0)
    for _ in range(max_restarts):
        history, t = [first], 0.0
        while t <= hi + pad:
            t += step
            r = ratio(t)
            history.append(r)
            if r < first / 2:
                break
            if len(history) >= window and max(history[-window:]) - min(history[-window:]) < tol:
                return r
        else:
            return history[-1]
        step /= 2
    return first


@dataclass(frozen=True)
class RatioSettings:
    keep_ratio: float = 0.5
    max_exact_params: int = 2048
    lanczos_iters: int = 50
    lanczos_probes: int = 1
    gap_factor: float = 4.0


@dataclass
class RatioResult:
    ratio: float
    lipschitz: float = float("nan")
    gap_index: int | None = None
    num_params: int = 0
    spectrum_min: float = float("nan")
    spectrum_max: float = float("nan")
    exact: bool = False


def _spectrum(hvp: HessianOperator, s: RatioSettings, generator: torch.Generator):
    if hvp.dim <= s.max_exact_params:
        return (*exact_spectrum(hvp, hvp.dim), True)
    return (*lanczos_spectrum(hvp, hvp.dim, s.lanczos_iters, s.lanczos_probes, generator), False)


def _hessian_gap(loss_fn: LossFn, theta: torch.Tensor, theta0: torch.Tensor, s: RatioSettings,
                 generator: torch.Generator) -> RatioResult:
    hvp = HessianOperator(loss_fn, theta)
    lam, w, exact = _spectrum(hvp, s, generator)
    lip = secant_lipschitz(loss_fn, hvp, theta, theta0 - theta)  # Δ_i = w − w^t (Alg. 1 line 3)
    r, k = gap_ratio(lam, w, lip, s.gap_factor)
    return RatioResult(r, lip, k, hvp.dim, float(lam.min()), float(lam.max()), exact)


def _slq_plateau(loss_fn: LossFn, theta: torch.Tensor, theta0: torch.Tensor, s: RatioSettings,
                 generator: torch.Generator) -> RatioResult:
    hvp = HessianOperator(loss_fn, theta)
    lam, w = lanczos_spectrum(hvp, hvp.dim, s.lanczos_iters, s.lanczos_probes, generator)
    return RatioResult(slq_plateau_ratio(lam, w), num_params=hvp.dim, spectrum_min=float(lam.min()),
                       spectrum_max=float(lam.max()))


def _fixed(loss_fn, theta, theta0, s: RatioSettings, generator) -> RatioResult:
    return RatioResult(s.keep_ratio)


Estimator = Callable[[LossFn, "torch.Tensor", "torch.Tensor", RatioSettings, "torch.Generator"], RatioResult]
RATIO_ESTIMATORS: Registry[Estimator] = Registry("ratio estimator")
RATIO_ESTIMATORS.add("fixed", _fixed, "r = keep_ratio (0.5 in every published run); nothing computed on clients")
RATIO_ESTIMATORS.add("hessian_gap", _hessian_gap, "paper Alg. 1: first Hessian eigen-gap > 4·Lipschitz (secant)")
RATIO_ESTIMATORS.add("slq_plateau", _slq_plateau, "official code: SLQ spectral density plateau of 1 − CDF(t)")
