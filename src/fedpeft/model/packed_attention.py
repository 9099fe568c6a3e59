"""Attention over packed rows (``runtime.padding_free``) at the cost of each row alone.

Hugging Face's SDPA path attends over a packed sequence with one block-diagonal mask of the whole pack, so every
row's queries are scored against every other row's keys before the mask drops them: for a pack of n rows that is
about n times the attention work of the rows alone, and on a CPU it ate what the pad tokens saved. This
implementation runs SDPA causally on each row's slice of the pack instead (the rows' boundaries come with the call
as ``packed_rows``) and is plain SDPA otherwise, so padded calls (evaluation, decoding) are unchanged. It is
registered under ``NAME`` with Hugging Face's ``AttentionInterface`` and SDPA's mask function.
"""

from __future__ import annotations

from typing import Any

from fedpeft.lazy import lazy

torch = lazy("torch")

NAME = "fedpeft_packed_sdpa"
ROWS = "packed_rows"  # call keyword: each packed row's (start, end) in the sequence, as Python ints


def packed_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA (HF's ``sdpa_attention_forward``), causal on each packed row's slice when ``packed_rows`` is given."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows = kwargs.pop(ROWS, None)
    if rows is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    outs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, is_causal=True,
                                   **kwargs)[0] for a, b in rows]
    return torch.cat(outs, dim=1), None  # [1, L, heads, head_dim], as SDPA's


def use_packed_attention(model: Any) -> bool:
    """Switch ``model`` from SDPA to ``packed_sdpa`` (registered once); False where it uses another attention (HF's
    flash attention packs by itself, eager attention reads the block mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if model.config._attn_implementation not in ("sdpa", NAME):
        return False
    AttentionInterface.register(NAME, packed_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
