"""Analytic cost of a client's training step (head-pruning paper §2.7 / App. A Table 6; spec §2.7), two modes.

- ``paper``: the formula that reproduces the paper's numbers (spec §2.7, reverse-engineered; T5-small r = 16:
  33.07 G dense, 8.47 G at 90 % sparsity), per training sequence of T tokens, with k = 1 − s the kept share:
  OPs = L·[(2 + 6k)·T·d² + 5.125·k·T²·d + (12 + 6k)·T·d·r].
- ``clean``: a dimensionally correct MAC count of one forward + backward of the frozen transformer with LoRA on
  q/k/v, the FFN included; pruned heads' q/k/v projections, attention and output-projection inputs are not
  computed (physical pruning, spec A3). Backward = input gradients of every matmul + weight gradients of the
  LoRA matrices only (the backbone is frozen) + the two attention gradient products.

And the paper's communication arithmetic: LoRA upload = Σ_m (r·d_in + (1 − s)·r·d_out) values (spec §2.6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GIGA = 1e9


def paper_ops(layers: int, d: int, tokens: int, r: int, sparsity: float) -> float:
    """MACs per training sequence as the paper counts them (LoRA on q/k/v; spec §2.7)."""
    k = 1.0 - sparsity
    return layers * ((2 + 6 * k) * tokens * d * d + 5.125 * k * tokens ** 2 * d + (12 + 6 * k) * tokens * d * r)


@dataclass(frozen=True)
class Dims:
    layers: int
    d: int
    heads: int
    kv_heads: int
    d_ff: int
    ffn_mats: int  # 2 (up, down) or 3 (gated: gate, up, down)


def clean_ops(dims: Dims, tokens: int, r: int, kept: float) -> dict[str, float]:
    """Forward and backward MACs per sequence, LoRA (rank r, 0 for none) on q/k/v, a share ``kept`` of heads."""
    t, d, k = tokens, dims.d, kept
    d_kv = d * dims.kv_heads // dims.heads
    proj = t * d * (k * d + 2 * k * d_kv) + t * (k * d) * d           # q, k, v (kept heads) and o (their input)
    attn = 2 * k * t * t * d                                          # Q K^T and A V over the kept heads
    ffn = dims.ffn_mats * t * d * dims.d_ff
    lora = t * r * (3 * d) + t * r * k * (d + 2 * d_kv)               # A (full input) and B (kept rows)
    fwd = dims.layers * (proj + attn + ffn + lora)
    bwd = dims.layers * (proj + 2 * attn + ffn + 2 * lora)            # input grads; + weight grads of LoRA
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def dims_of(config) -> Dims:
    heads = int(config.num_attention_heads)
    gated = getattr(config, "model_type", "") in ("llama", "mistral", "qwen2", "gemma")
    return Dims(int(config.num_hidden_layers), int(config.hidden_size), heads,
                int(getattr(config, "num_key_value_heads", None) or heads), int(config.intermediate_size),
                3 if gated else 2)


def lora_upload_values(modules: Sequence[tuple[int, int]], r: int, sparsity: float) -> float:
    """Values a client uploads per round (spec §2.6): every A, and the kept share of every B."""
    return sum(r * d_in + (1 - sparsity) * r * d_out for d_in, d_out in modules)


def client_ops(classifier, kept: float, data, steps: int, batch_size: int) -> dict[str, float]:
    """OPs of one client round, in G MACs: per sequence (paper and clean mode, at the local data's mean length)
    and for the round's sequences (steps × batch)."""
    cfg = classifier.backbone.model.config
    r = int(getattr(getattr(classifier.adapter, "cfg", None), "r", 0) or 0)
    lengths = [len(x) for x in data.input_ids] or [0]
    tokens = round(sum(lengths) / len(lengths))
    dims = dims_of(cfg)
    per_seq_paper = paper_ops(dims.layers, dims.d, tokens, r, 1 - kept)
    per_seq_clean = clean_ops(dims, tokens, r, kept)["total"]
    seqs = steps * min(batch_size, len(lengths))
    return {"gops_seq_paper": per_seq_paper / GIGA, "gops_seq_clean": per_seq_clean / GIGA,
            "gops_round_clean": per_seq_clean * seqs / GIGA}
