"""Where each layer's attention projections live in a backbone, and the per-client weight overrides that remove
(or silence) attention heads without touching the shared module (head-pruning paper §2.7 / spec A3).

``masked``: the output projection's input columns of the pruned heads are zeroed, so those heads contribute
nothing but are still computed. ``pruned``: the query/key/value rows and the output-projection columns of the
pruned heads are cut out, as ``transformers.pytorch_utils.prune_linear_layer`` does, so they are not computed at
all; transformers 5 reshapes q/k/v with ``view(..., -1, head_dim)``, so the sliced weights run through the
unchanged modules via ``functional_call``. Both give the same function of the kept parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")

# per architecture: (query, key, value, output) module names relative to a layer's attention block
LAYOUTS = {"bert": ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"),
           "roberta": ("attention.self.query", "attention.self.key", "attention.self.value",
                       "attention.output.dense"),
           "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")}


@dataclass(frozen=True)
class LayerAttention:
    q: str
    k: str
    v: str
    o: str


def _param_path(backbone: Backbone, module: str) -> str:
    """Path of the module's own Linear (inside a LoRA wrapper when one was injected)."""
    mod = backbone.model.get_submodule(module)
    return f"{module}.base_layer" if hasattr(mod, "base_layer") else module


def attention_layout(backbone: Backbone) -> list[LayerAttention]:
    kind = getattr(backbone.model.config, "model_type", "")
    if kind not in LAYOUTS:
        raise ValueError(f"method.sharing.mode: head removal knows no attention layout for model type '{kind}'")
    q_name = LAYOUTS[kind][0]
    layers = sorted({m.group(1) for n, _ in backbone.model.named_modules()
                     if (m := re.fullmatch(rf"(.*\.\d+)\.{re.escape(q_name)}", n))},
                    key=lambda p: int(p.rsplit(".", 1)[1]))
    return [LayerAttention(*(f"{prefix}.{leaf}" for leaf in LAYOUTS[kind])) for prefix in layers]


def head_rows(heads: list[int], head_dim: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads]) if heads \
        else torch.zeros(0, dtype=torch.long)


def head_overrides(backbone: Backbone, kept: list[int], mode: str) -> dict[str, torch.Tensor]:
    """Backbone weight overrides for one client that keeps the global heads ``kept`` (layer·H + h)."""
    cfg = backbone.model.config
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    params = dict(backbone.model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for layer, att in enumerate(attention_layout(backbone)):
        local = [h - layer * heads for h in kept if layer * heads <= h < (layer + 1) * heads]
        rows = head_rows(local, head_dim).to(params[f"{_param_path(backbone, att.o)}.weight"].device)
        o = _param_path(backbone, att.o)
        if mode == "masked":
            keep = torch.zeros(heads * head_dim, dtype=torch.bool, device=rows.device)
            keep[rows] = True
            out[f"{o}.weight"] = params[f"{o}.weight"].detach() * keep
            continue
        for proj in (att.q, att.k, att.v):
            base = _param_path(backbone, proj)
            out[f"{base}.weight"] = params[f"{base}.weight"].detach()[rows]
            if f"{base}.bias" in params:
                out[f"{base}.bias"] = params[f"{base}.bias"].detach()[rows]
        out[f"{o}.weight"] = params[f"{o}.weight"].detach()[:, rows]
    return out
