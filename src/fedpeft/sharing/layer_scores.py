"""Training-free layer scores (FedPepTAO Eq. 2–4, meaning fixed by the official code; spec §2.5, §7 A1–A3).

For one client batch of ``n`` samples and layer ``l``: the rows of ``H_l ∈ R^{n × K_l}`` are the samples'
hidden states at the output of layer ``l`` (flattened over the padded tokens × hidden size; optionally with
the pad positions zeroed), the kernel is their cosine-similarity matrix (Eq. 2), and the score is
``ζ = (1/n) Σ_j log(λ_j+ε) + 1/(λ_j+ε)`` over its eigenvalues (Eq. 3). ``f(λ) = log λ + 1/λ`` is minimal
(= 1) at λ = 1: near-orthogonal samples give ζ ≈ 1, near-identical samples give ζ ≈ (n−1)/(n·ε).
Per-client scores are averaged with weights n_i/N (Eq. 4).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.lazy import lazy

torch = lazy("torch")
F = lazy("torch.nn.functional")


def cosine_kernel(h: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``K[a, b] = cos(h_a, h_b)`` for the rows of ``h`` ([n, K] or [n, ...], flattened per sample)."""
    z = F.normalize(h.reshape(h.shape[0], -1).double(), dim=1)
    return z @ z.T


def kernel_score(kernel: torch.Tensor, eps: float = 1e-5, reduce: str = "mean") -> float:
    """Eq. 3 over the eigenvalues of a symmetric PSD kernel (``eigvalsh``; λ clamped at 0 before adding ε, A3).

    ``reduce="mean"`` is the paper's 1/n factor (A2); ``"sum"`` is the official code's.
    """
    lam = torch.linalg.eigvalsh(kernel.double()).clamp_min(0.0) + eps
    terms = torch.log(lam) + 1.0 / lam
    return float(terms.mean() if reduce == "mean" else terms.sum())


def layer_scores(hidden_states: Sequence[torch.Tensor], eps: float = 1e-5, reduce: str = "mean",
                 score_last_layer: bool = True, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ζ_{i,l} for every layer from the per-layer outputs ``hidden_states[l]`` ([n, T, d]).

    ``hidden_states`` excludes the embedding output (HF ``hidden_states[1:]``). With
    ``score_last_layer=False`` the last layer keeps score 0, as in the official code (A5). ``mask`` ([n, T],
    1 at real tokens) zeroes the padded positions before flattening, so that each sample's row of ``H_l``
    holds its own tokens only (the code flattens over every padded position, A1).
    """
    num = len(hidden_states)
    out = torch.zeros(num, dtype=torch.float64)
    for l, h in enumerate(hidden_states):
        if l == num - 1 and not score_last_layer:
            continue
        rows = h if mask is None else h * mask.unsqueeze(-1).to(h.dtype)
        out[l] = kernel_score(cosine_kernel(rows), eps, reduce)
    return out


def aggregate_weighted(values: Sequence[torch.Tensor | float], weights: Sequence[float]) -> torch.Tensor:
    """Eq. 4: ``Σ_i (n_i / N) v_i`` over the reporting clients (scores per layer, or the ratio r)."""
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if len(values) == 0 or len(values) != len(w) or float(w.sum()) <= 0 or bool((w < 0).any()):
        raise ValueError("aggregate_weighted: need one non-negative weight per value with a positive sum, "
                         f"got {weights}")
    stacked = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in values])
    return torch.tensordot(w / w.sum(), stacked, dims=1)
