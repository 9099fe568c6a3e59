"""Deep prompts (P-tuning v2, Liu et al. 2022; FedPepTAO spec §2.2): a key/value prefix of length h per layer.

Layer ``l`` owns the tensor ``prefix.{l}`` of shape ``[h, 2, d_kv]`` (``[:, 0]`` keys, ``[:, 1]`` values,
``d_kv = n_kv_heads * head_dim``; ``d_kv = d`` without grouped-query attention). Together they are the
code's ``E ∈ R^{h × (L·2·d)}`` viewed as ``[h, L, 2, d]``, split per layer so a *subset* of layers can be
exchanged by name while the rest stay on the device. The prefixes enter the frozen model as a
``transformers.DynamicCache`` filled before the forward pass (accepted by ``BertModel`` and ``LlamaModel``
in transformers 5); the attention mask gets ``h`` ones in front of every row; queries and sequence length
are unchanged.

Positions: BERT- and LLaMA-style models offset the positions of ``inputs_embeds`` by the cache length ``h``
themselves, as the P-tuning v2 code's ``past_key_values_length = h`` does. RoBERTa-style models (fairseq
positions: RoBERTa, XLM-R, CamemBERT, …) derive positions from ``inputs_embeds`` as ``padding_idx + 1, …``
with neither the cache offset nor the padding, so for them the adapter passes the positions the official
code gets from ``input_ids`` (``fairseq_positions``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, HeadSlices, Params, Prepared
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")

PREFIX = "prefix."


def layer_key(layer: int) -> str:
    """Name of layer ``layer``'s prefix tensor (the unit that is shared or kept local)."""
    return f"{PREFIX}{layer}"


def layer_of(key: str) -> int | None:
    """Layer index of a prefix key, None for other tensors (e.g. a linear head)."""
    return int(key[len(PREFIX):]) if key.startswith(PREFIX) else None


def fairseq_padding_idx(backbone: Backbone) -> int | None:
    """``padding_idx`` of a backbone with fairseq-style positions (RoBERTa and its relatives), whose embeddings
    number ``inputs_embeds`` from ``padding_idx + 1`` regardless of cache and padding; None for the others."""
    emb = getattr(backbone.model.base_model, "embeddings", None)
    return int(emb.padding_idx) if hasattr(emb, "create_position_ids_from_inputs_embeds") else None


def fairseq_positions(input_ids: torch.Tensor, padding_idx: int, offset: int) -> torch.Tensor:
    """RoBERTa's positions of ``input_ids`` after ``offset`` cached tokens: ``padding_idx + offset + 1, + 2, …``
    over the non-pad tokens and ``padding_idx`` at pads (HF ``create_position_ids_from_input_ids`` with
    ``past_key_values_length = offset``, which the official code reaches with ``offset = h``)."""
    real = input_ids.ne(padding_idx).long()
    return (torch.cumsum(real, dim=1) + offset) * real + padding_idx


def kv_geometry(backbone: Backbone) -> tuple[int, int, int]:
    """(num layers L, key/value heads, head dim) of the backbone's self-attention."""
    cfg = backbone.model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return int(cfg.num_hidden_layers), int(kv_heads), int(head_dim)


class DeepPromptSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: int = Field(20, ge=1, description="prefix length h per layer (code: 20 RoBERTa, 5 GPT-2/LLaMA)")
    init_std: float = Field(0.02, gt=0, description="E ~ N(0, init_std^2) (HF initializer_range)")
    shift_positions: bool = Field(True, description="input positions start at h (RoBERTa-style: at padding_idx + "
                                                    "h + 1), as in the P-tuning v2 code (past_key_values_length = "
                                                    "h); false: the model's own positions, as without a prefix")


@ADAPTERS.register("deep_prompt", "P-tuning v2 deep prompts: a trainable key/value prefix of length h at every "
                   "layer (FedPepTAO, fedavg-prefix)", DeepPromptSettings)
class DeepPrompt(AdapterBase):
    """Per-layer key/value prefixes passed to the frozen backbone as a pre-filled cache."""

    name = "deep_prompt"

    def __init__(self, cfg: DeepPromptSettings | None = None) -> None:
        super().__init__(cfg or DeepPromptSettings())

    def units(self, params: Params) -> dict[str, str]:
        """Each layer's prefix is one unit (``layer<l>``); other tensors (a linear head) are their own."""
        return {k: (f"layer{layer_of(k)}" if layer_of(k) is not None else k) for k in params}

    def head_slices(self, backbone: Backbone) -> HeadSlices:
        """Layer l's prefix columns [j·d_head, (j+1)·d_head) are key/value head j's (dim 2 of [h, 2, d_kv]); with
        grouped-query attention they feed the G query heads that share it."""
        layers, kv_heads, head_dim = kv_geometry(backbone)
        heads = int(backbone.model.config.num_attention_heads)
        group = heads // kv_heads
        return {layer_key(l): [(tuple(l * heads + j * group + g for g in range(group)), 2, j * head_dim,
                                (j + 1) * head_dim) for j in range(kv_heads)] for l in range(layers)}

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """E ~ N(0, σ²) drawn as one ``[h, L, 2, d_kv]`` tensor (code layout), split into per-layer tensors."""
        layers, kv_heads, head_dim = kv_geometry(backbone)
        h = self.cfg.num_tokens
        e = torch.randn(h, layers, 2, kv_heads * head_dim, generator=generator) * self.cfg.init_std
        return {layer_key(l): e[:, l].clone() for l in range(layers)}

    def to_peft(self, backbone: Backbone, params: Params, task_type: str):
        """PEFT prefix tuning without projection: ``prompt_embeddings`` [h, L·2·d_kv], the layers' prefixes side by
        side (PEFT's ``[h, L, 2, kv heads, head dim]`` cache layout). Only with ``shift_positions: true``: PEFT's
        models number the input positions after the prefix."""
        from peft import PrefixTuningConfig

        if not self.cfg.shift_positions:
            raise ValueError("method.adapter.shift_positions: PEFT's prefix tuning numbers input positions after "
                             "the prefix; only deep prompts with shift_positions true export")
        layers, _, _ = kv_geometry(backbone)
        prefix = torch.stack([params[layer_key(l)] for l in range(layers)], dim=1)  # [h, L, 2, d_kv]
        config = backbone.model.config
        peft_config = PrefixTuningConfig(task_type=task_type, num_virtual_tokens=prefix.shape[0], num_layers=layers,
                                         token_dim=int(config.hidden_size),
                                         num_attention_heads=int(config.num_attention_heads),
                                         num_transformer_submodules=1, prefix_projection=False)
        return peft_config, {"prompt_embeddings": prefix.reshape(prefix.shape[0], -1)}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        from transformers import DynamicCache

        layers, kv_heads, head_dim = kv_geometry(backbone)
        embeds = backbone.input_embeddings()(input_ids)
        n, seq = input_ids.shape
        h = self.cfg.num_tokens
        cache = DynamicCache(config=backbone.model.config)
        for l in range(layers):
            p = params[layer_key(l)].to(embeds.dtype)  # [h, 2, d_kv]
            if p.shape[0] != h:
                raise ValueError(f"{layer_key(l)} has {p.shape[0]} rows, method.adapter.num_tokens is {h}")
            kv = p.view(h, 2, kv_heads, head_dim).permute(1, 2, 0, 3)  # [2, heads, h, head_dim]
            cache.update(kv[0].unsqueeze(0).expand(n, -1, -1, -1), kv[1].unsqueeze(0).expand(n, -1, -1, -1), l)
        ones = torch.ones(n, h, dtype=attention_mask.dtype, device=attention_mask.device)
        full_mask = torch.cat([ones, attention_mask], dim=1)
        extra = {"past_key_values": cache, "attention_mask": full_mask, "use_cache": False}
        offset = h if self.cfg.shift_positions else 0
        pad = fairseq_padding_idx(backbone)
        if pad is not None:
            limit = int(backbone.model.config.max_position_embeddings)
            if pad + offset + seq >= limit:
                raise ValueError(f"deep_prompt: {seq} tokens after a {offset}-token position shift exceed the "
                                 f"model's {limit} positions (padding_idx {pad}); lower task.max_length or set "
                                 "method.adapter.shift_positions=false")
            extra["position_ids"] = fairseq_positions(input_ids, pad, offset)
        elif not self.cfg.shift_positions:
            extra["position_ids"] = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(n, -1)
        # the readout sees the unprefixed sequence: its mask stays [n, seq]; the backbone gets ``full_mask``
        return Prepared(embeds, attention_mask, lead, 0, extra)
