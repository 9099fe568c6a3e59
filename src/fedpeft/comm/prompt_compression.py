"""Download compressions of the aggregated prompt: the word-analogy codec (Alg. 2, Eqs. 8-11) and the
PCA-n (Eqs. 13-16) and Quant-b (Eqs. 17-18) alternatives, plus the bit accounting of Table 1.

All functions are pure and deterministic: the server and every client decode the same bits to the same
float32 prompt, because decoding starts from the float16 values that travel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedpeft.lazy import lazy

torch = lazy("torch")

LASSO_MAX_ITER = 10_000
LASSO_TOL = 1e-6


def _sparse_fit(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """Eq. 8, x* = argmin ||A x - b||^2 + alpha ||x||_1. sklearn's Lasso minimises
    (1/(2D))||A x - b||^2 + alpha' ||x||_1 (D = rows of A), which is Eq. 8 divided by 2D when
    alpha' = alpha / (2D). alpha == 0 is plain minimum-norm least squares."""
    if alpha == 0:
        return np.linalg.lstsq(a, b, rcond=None)[0]
    from sklearn.linear_model import Lasso

    model = Lasso(alpha=alpha / (2 * a.shape[0]), fit_intercept=False, max_iter=LASSO_MAX_ITER,
                  tol=LASSO_TOL, selection="cyclic")
    return model.fit(np.asfortranarray(a), b).coef_


def _top(ids: np.ndarray, x: np.ndarray, corr: np.ndarray, k: int) -> np.ndarray:
    """Eq. 9: the k ids of largest |x|, ties by id; ids with x == 0 are ranked by |corr| (then id)."""
    second = np.where(x == 0, -np.abs(corr), 0.0)
    order = np.lexsort((ids, second, -np.abs(x)))
    return ids[order[:k]]


def _analogy_row(r: np.ndarray, table: np.ndarray, cand: np.ndarray, phi: int, alpha: float, stage1: int):
    """Alg. 2 for one position: two LASSO + top-L stages (L = stage1, phi), then the Eq. 10 OLS refit."""
    ids = cand
    for k in (stage1, phi):
        ids = np.sort(ids)  # a canonical column order for the fit
        rows = table[ids]
        ids = _top(ids, _sparse_fit(rows.T, r, alpha), rows @ r, k)
    coef = np.linalg.lstsq(table[ids].T, r, rcond=None)[0]
    return ids, coef


def analogy_compress(residual: torch.Tensor, table: torch.Tensor, phi: int, alpha: float = 0.2,
                     stage1: int = 100, exclude: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 2 / Eqs. 8-10: per position, phi token ids and float16 coefficients with
    residual[t] ~ sum_j coef[t, j] * table[ids[t, j]]; ids are ordered by importance (Eq. 9 rank)."""
    vocab, dim = table.shape
    if residual.dim() != 2 or residual.shape[1] != dim:
        raise ValueError(f"residual {tuple(residual.shape)} must be [T, {dim}]")
    cand = np.setdiff1d(np.arange(vocab), np.asarray(list(exclude), dtype=np.int64))
    l1 = min(stage1, cand.size)
    if not 1 <= phi <= l1:
        raise ValueError(f"phi must be in [1, {l1}] (stage-1 size over {cand.size} candidate ids), got {phi}")
    tab = table.detach().cpu().to(torch.float64).numpy()
    res = residual.detach().cpu().to(torch.float64).numpy()
    ids = np.empty((res.shape[0], phi), dtype=np.int64)
    coef = np.empty((res.shape[0], phi), dtype=np.float64)
    for t, r in enumerate(res):
        ids[t], coef[t] = _analogy_row(r, tab, cand, phi, alpha, l1)
    return torch.from_numpy(ids), torch.from_numpy(coef).to(torch.float16)


def analogy_reconstruct(base: torch.Tensor, ids: torch.Tensor, coef: torch.Tensor,
                        table: torch.Tensor) -> torch.Tensor:
    """Eq. 11: p' = base + sum_j coef[:, j] * table[ids[:, j]], accumulated in float64 in the order j = 0, 1, ...
    from the float16 coefficients, then cast to float32; bitwise identical wherever it runs."""
    if ids.shape != coef.shape or ids.dim() != 2 or ids.shape[0] != base.shape[0]:
        raise ValueError(f"ids {tuple(ids.shape)} and coef {tuple(coef.shape)} must be [T, phi], T = {base.shape[0]}")
    tab = table.to(torch.float64)
    c = coef.to(torch.float16).to(torch.float64)
    out = base.to(torch.float64).clone()
    for j in range(ids.shape[1]):
        out = out + c[:, j : j + 1] * tab[ids[:, j].to(torch.int64)]
    return out.to(torch.float32)


def pca_basis(table: torch.Tensor, n: int) -> torch.Tensor:
    """Eqs. 13-14: the top-n principal directions U_n [D, n] (float64) of the uncentered embedding matrix,
    from its SVD; each column's sign makes its largest-magnitude entry positive."""
    if not 1 <= n <= min(table.shape):
        raise ValueError(f"n must be in [1, {min(table.shape)}], got {n}")
    vh = torch.linalg.svd(table.detach().cpu().to(torch.float64), full_matrices=False).Vh
    u = vh[:n].T.contiguous()
    peak = u.gather(0, u.abs().argmax(dim=0, keepdim=True))
    return u * torch.where(peak < 0, -1.0, 1.0).to(torch.float64)


def pca_compress(prompt: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Eq. 15: p_hat = p U_n, sent as float16 [T, n]."""
    return (prompt.to(torch.float64) @ basis.to(torch.float64)).to(torch.float16)


def pca_reconstruct(coded: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Eq. 16: p ~ p_hat U_n^T from the float16 p_hat, as float32 [T, D]."""
    return (coded.to(torch.float16).to(torch.float64) @ basis.to(torch.float64).T).to(torch.float32)


def _levels(bits: int) -> int:
    """k = 2^(b-1) - 1 of Eq. 17 (2k + 1 levels)."""
    if not 2 <= bits <= 16:
        raise ValueError(f"bits must be in [2, 16], got {bits}")
    return 2 ** (bits - 1) - 1


def quantize(prompt: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 17-18: per-row beta = max|p_t| (float16), codes round(clip(p/beta, -1, 1) k) + k in [0, 2k]
    (round half to even), each written as b bits, most significant first, packed big-endian into uint8."""
    k = _levels(bits)
    beta = prompt.detach().cpu().abs().amax(dim=1).to(torch.float16)
    if not torch.isfinite(beta).all():
        raise ValueError("prompt: a row's max |value| is not finite in float16")
    b64 = beta.to(torch.float64)[:, None]
    ratio = torch.where(b64 > 0, prompt.detach().cpu().to(torch.float64) / torch.where(b64 > 0, b64, 1.0), 0.0)
    codes = (torch.round(ratio.clamp(-1.0, 1.0) * k) + k).to(torch.int64).flatten().numpy()
    bitplanes = (codes[:, None] >> np.arange(bits - 1, -1, -1)) & 1
    return torch.from_numpy(np.packbits(bitplanes.astype(np.uint8).ravel())), beta


def dequantize(packed: torch.Tensor, beta: torch.Tensor, shape: tuple[int, int], bits: int) -> torch.Tensor:
    """Eq. 17 decode: w_q = beta_t (code - k) / k, float32 [T, D]; a row with beta = 0 decodes to zeros."""
    k = _levels(bits)
    rows, dim = shape
    if packed.numel() != math.ceil(rows * dim * bits / 8) or beta.shape != (rows,):
        raise ValueError(f"packed ({packed.numel()} bytes) or beta {tuple(beta.shape)} does not fit shape {shape}")
    planes = np.unpackbits(packed.cpu().numpy().astype(np.uint8), count=rows * dim * bits).reshape(-1, bits)
    codes = planes.astype(np.int64) @ (1 << np.arange(bits - 1, -1, -1))
    if codes.max(initial=0) > 2 * k:
        raise ValueError(f"packed: a code exceeds 2k = {2 * k}")
    levels = torch.from_numpy(codes - k).to(torch.float64).reshape(rows, dim) / k
    return (beta.to(torch.float16).to(torch.float64)[:, None] * levels).to(torch.float32)


def download_bits(kind: str, T: int, D: int, phi: int | None = None, n: int | None = None,
                  bits: int | None = None) -> int:
    """Table 1 per-round bits for one client: analogy T*2*phi*16, full T*D*16, pca T*n*16,
    quant (D*b + 16)*T, token_index_upload T*16."""
    need = {"analogy": phi, "pca": n, "quant": bits}
    if kind in need and need[kind] is None:
        raise ValueError(f"download_bits({kind!r}) needs its size parameter")
    table = {
        "analogy": lambda: T * 2 * phi * 16,
        "full": lambda: T * D * 16,
        "pca": lambda: T * n * 16,
        "quant": lambda: (D * bits + 16) * T,
        "token_index_upload": lambda: T * 16,
    }
    if kind not in table:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(table)}")
    return table[kind]()
