"""Token-index upload (Alg. 4): a client sends one vocabulary id per prompt row instead of the row.

Every row changed by the gradient-free local search equals a token embedding e(c), so it travels as the id
c; unchanged rows travel as the sentinel |V|, and the server copies them from the prompt p' it sent.
"""

from __future__ import annotations

from fedpeft.lazy import lazy

torch = lazy("torch")


def index_dtype(vocab_size: int) -> torch.dtype:
    """Wire dtype of Alg. 4's indices: uint16 (16 bits per row) when the sentinel |V| fits, else a wider
    index, int32."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return torch.uint16 if vocab_size <= 65535 else torch.int32


def encode_tokens(tokens: torch.Tensor, changed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Alg. 4 Encode_Upload: U[t] = tokens[t] where changed[t], else the sentinel vocab_size.

    Only the ids of changed rows are checked (unchanged rows need not be tokens)."""
    if tokens.dim() != 1 or changed.shape != tokens.shape:
        raise ValueError(f"tokens {tuple(tokens.shape)} and changed {tuple(changed.shape)} must be equal 1-D")
    tokens = tokens.to(torch.int64)
    changed = changed.to(torch.bool)
    sent = tokens[changed]
    if ((sent < 0) | (sent >= vocab_size)).any():
        raise ValueError(f"tokens: a changed row's id is outside [0, {vocab_size})")
    out = torch.where(changed, tokens, torch.full_like(tokens, vocab_size))
    return out.to(index_dtype(vocab_size))


def decode_tokens(indices: torch.Tensor, base: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Alg. 4 Decode_Upload: row t = table[U[t]] if U[t] != |V| else base[t]; rows are copied, so the
    client's prompt is reproduced bit for bit."""
    vocab, dim = table.shape
    if indices.dim() != 1 or base.dim() != 2 or indices.shape[0] != base.shape[0]:
        raise ValueError(f"indices {tuple(indices.shape)} must have one entry per row of base {tuple(base.shape)}")
    if base.shape[1] != dim or base.dtype != table.dtype:
        raise ValueError(f"base {tuple(base.shape)} {base.dtype} must match table {tuple(table.shape)} {table.dtype}")
    idx = indices.to(torch.int64)
    if ((idx < 0) | (idx > vocab)).any():
        raise ValueError(f"indices: an entry is outside [0, {vocab}] (|V| = {vocab} is the sentinel)")
    out = base.clone()
    is_token = idx != vocab
    out[is_token] = table[idx[is_token]]
    return out
