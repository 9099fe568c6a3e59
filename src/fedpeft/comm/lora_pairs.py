"""LoRA's factor tensors by name, and the rank operations the federated LoRA variants share.

Tensors travel under PEFT's state-dict names: ``<module>.lora_A.weight`` [r, d_in] and ``<module>.lora_B.weight``
[d_out, r], so ΔW = s·B A for the module (s = alpha / r, the same on every client). The rank is A's first and B's
second dimension; truncating or zero-padding both along it keeps B A's meaning (a zero row of A and a zero column
of B add nothing). A module may also carry a full-size residual ``<module>.base_residual`` (FedEx-LoRA's exact
aggregation), added to the frozen weight as s·R, and LoRA-SB's [r, r] matrix ``<module>.lora_R.weight`` between the two
factors (Fed-SB): ΔW = s·B R A.
"""

from __future__ import annotations

from fedpeft.comm.update import Params
from fedpeft.lazy import lazy

torch = lazy("torch")

A, B = ".lora_A.weight", ".lora_B.weight"
RANK_DIM = {A: 0, B: 1}  # the rank dimension of each factor
# FedEx-LoRA's residual R of a module [d_out, d_in], in B A's units: the module computes W + s·(B A + R)
RESIDUAL = ".base_residual"
LATENT = ".lora_R.weight"  # LoRA-SB's trainable r x r matrix between fixed B and A: the module computes W + s·B R A


def factor(name: str) -> str | None:
    """``A`` or ``B`` when ``name`` is a LoRA factor, else None."""
    return A if name.endswith(A) else B if name.endswith(B) else None


def pairs(params: Params) -> dict[str, tuple[str, str]]:
    """Module prefix -> (its A name, its B name), for every module whose two factors are both in ``params``."""
    return {k[: -len(A)]: (k, k[: -len(A)] + B) for k in sorted(params) if k.endswith(A) and k[: -len(A)] + B in params}


def rank_of(params: Params) -> int | None:
    """The rank of the LoRA factors in ``params`` (None when there are none); every factor must agree."""
    ranks = {v.shape[RANK_DIM[f]] for k, v in params.items() if (f := factor(k))}
    if len(ranks) > 1:
        raise ValueError(f"LoRA factors of different ranks: {sorted(ranks)}")
    return ranks.pop() if ranks else None


def truncate(params: Params, rank: int) -> Params:
    """The first ``rank`` rows of every A and columns of every B (other tensors unchanged)."""
    return {k: v.narrow(RANK_DIM[f], 0, rank).contiguous() if (f := factor(k)) else v for k, v in params.items()}


def pad(params: Params, rank: int) -> Params:
    """Every A and B zero-padded along the rank dimension to ``rank`` (HetLoRA's zero-padding)."""
    out = {}
    for k, v in params.items():
        f = factor(k)
        if f is None or v.shape[RANK_DIM[f]] == rank:
            out[k] = v
            continue
        shape = list(v.shape)
        shape[RANK_DIM[f]] = rank
        full = torch.zeros(shape, dtype=v.dtype, device=v.device)
        full.narrow(RANK_DIM[f], 0, v.shape[RANK_DIM[f]]).copy_(v)
        out[k] = full
    return out


def rank_mask(params: Params, rank: int) -> dict[str, torch.Tensor]:
    """True on the entries of every A and B beyond the first ``rank`` (what a rank-``rank`` client keeps frozen)."""
    masks = {}
    for k, v in params.items():
        if f := factor(k):
            m = torch.ones_like(v, dtype=torch.bool)
            m.narrow(RANK_DIM[f], 0, min(rank, v.shape[RANK_DIM[f]])).fill_(False)
            masks[k] = m
    return masks


def products(params: Params) -> dict[str, torch.Tensor]:
    """Module prefix -> B A in float64 (without the scaling s, which every client shares)."""
    return {m: product(params, m) for m in pairs(params)}


def product(params: Params, module: str, fallback: Params | None = None) -> torch.Tensor:
    """B A of ``module`` in float64, B R A where it has LoRA-SB's R; a factor not in ``params`` is read from
    ``fallback`` (a common one the client did not upload)."""
    def get(suffix: str) -> torch.Tensor:
        key = module + suffix
        return (params[key] if key in params else fallback[key]).double()

    has_r = module + LATENT in params or (fallback is not None and module + LATENT in fallback)
    return get(B) @ get(LATENT) @ get(A) if has_r else get(B) @ get(A)
