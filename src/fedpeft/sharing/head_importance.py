"""Attention-head importance as "confidence" (head-pruning paper Eq. 6, read as Voita et al. 2019; spec A1).

For one sample, head h's confidence is the mean over valid query positions of the largest attention
probability that query gives to a valid key other than the end-of-sequence token ([SEP] for BERT-style
models); queries with no such key are skipped, probabilities are not renormalised. alpha_h is the mean
confidence over the client's samples (Eq. 6). Probabilities lie in [0, 1], so heads of different layers
compare under one global threshold and serve as non-negative aggregation weights (Eq. 8).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedpeft.lazy import lazy

torch = lazy("torch")


def key_token_ids(input_ids: torch.Tensor, num_keys: int, insert_at: int = 0, inserted: int = 0) -> torch.Tensor:
    """Token id at every key position [n, num_keys]: -1 where the adapter put rows that are not tokens
    (soft-prompt rows spliced in at ``insert_at``; prefix keys of deep prompts in front)."""
    n = input_ids.shape[0]
    ids = input_ids
    if inserted:
        fill = torch.full((n, inserted), -1, dtype=ids.dtype, device=ids.device)
        ids = torch.cat([ids[:, :insert_at], fill, ids[:, insert_at:]], dim=1)
    if num_keys > ids.shape[1]:
        ids = torch.cat([torch.full((n, num_keys - ids.shape[1]), -1, dtype=ids.dtype, device=ids.device), ids], 1)
    return ids


def confidence(attn: torch.Tensor, query_mask: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample, per-head confidence [n, H] of one layer's attention probabilities ``attn`` [n, H, Tq, Tk];
    ``query_mask`` [n, Tq] and ``key_mask`` [n, Tk] say which positions count (True)."""
    a = attn.float().masked_fill(~key_mask[:, None, None, :].bool(), -1.0)
    best = a.max(dim=-1).values                                   # [n, H, Tq]; -1 where no valid key
    valid = query_mask[:, None, :].bool() & (best >= 0)
    total = (best.clamp_min(0) * valid).sum(-1)
    count = valid.sum(-1).clamp_min(1)
    return total / count


def head_confidence(attentions: Sequence[torch.Tensor], query_mask: torch.Tensor, key_ids: torch.Tensor,
                    key_mask: torch.Tensor, excluded: int | Sequence[int] | None) -> torch.Tensor:
    """Summed confidence per global head (layer·H + h) over the batch's samples, [L·H] (divide by n for Eq. 6);
    keys holding an ``excluded`` token id (the end-of-sequence token, optionally also [CLS]) do not count."""
    ids = [] if excluded is None else [excluded] if isinstance(excluded, int) else list(excluded)
    keys_ok = key_mask.bool()
    for i in ids:
        keys_ok = keys_ok & (key_ids != i)
    return torch.cat([confidence(a, query_mask, keys_ok).sum(0) for a in attentions])
