"""LoRA (Hu et al. 2022) on the frozen backbone, through HF ``peft``: ΔW = (alpha/r)·B A on the target modules.

The LoRA layers are injected once into the process's single backbone with ``peft.inject_adapter_in_model``
(``LoraConfig`` semantics and names); their own weights stay frozen at B = 0, so the shared model still
computes exactly its frozen function. Each client's A and B enter a forward as ``functional_call``
overrides, so no client ever gets a model copy. Tensors are exchanged under PEFT's state-dict names
(``<module>.lora_A.weight`` [r, d_in], ``<module>.lora_B.weight`` [d_out, r]), which is also what
``fedpeft export --format peft`` writes. No LoRA dropout: the shared backbone always runs in eval mode.

Head slices (head pruning, spec §2.3): rows [h·d_head, (h+1)·d_head) of a query projection's B feed query
head h. With grouped-query attention (LLaMA/SmolLM2) a key/value projection has ``n_kv`` heads; its row
block j feeds the G = H / n_kv query heads [j·G, (j+1)·G) that share it, so it belongs to that group of heads.
"""

from __future__ import annotations

import hashlib
import math
import re

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, AdapterContext, HeadSlices, Params, Prepared
from fedpeft.adapters.peft_layers import activate, inject_once, without_layers
from fedpeft.backbones.loading import Backbone
from fedpeft.comm.lora_pairs import RESIDUAL, pad, pairs
from fedpeft.lazy import lazy

torch = lazy("torch")

# default target modules per architecture: the query/key/value projections of every attention block
DEFAULT_TARGETS = {"bert": ("query", "key", "value"), "roberta": ("query", "key", "value"),
                   "llama": ("q_proj", "k_proj", "v_proj"), "t5": ("q", "k", "v"),
                   "bart": ("q_proj", "k_proj", "v_proj"),
                   "distilbert": ("q_lin", "k_lin", "v_lin"), "gpt2": ("c_attn",)}
QUERY_NAMES = {"query", "q_proj", "q", "q_lin"}
ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer of the model except its output head
KV_NAMES = {"key", "value", "k_proj", "v_proj", "k", "v", "k_lin", "v_lin"}
PEFT_PREFIX = "base_model.model."  # PEFT's state-dict names of a saved adapter: <prefix><module>.lora_A.weight


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(16, ge=1, description="LoRA rank (head-pruning paper: 16)")
    lora_alpha: float = Field(32.0, gt=0, description="scaling alpha / r (spec A6: 32)")
    target_modules: list[str] | None = Field(None, description="module name suffixes, or ['all-linear'] (PEFT: "
                                                               "every linear layer but the output head); default: "
                                                               "the q/k/v projections of every attention block")


@ADAPTERS.register("lora", "LoRA through HF peft: trainable low-rank A, B on the q/k/v projections (head pruning)",
                   LoraSettings)
class Lora(AdapterBase):
    checkpointable = True
    packable = True
    name = "lora"

    def __init__(self, cfg: LoraSettings | None = None) -> None:
        super().__init__(cfg or LoraSettings())
        key = f"{self.cfg.r}|{self.alpha}|{self.cfg.target_modules}"
        self.adapter_name = "fedpeft_" + hashlib.sha1(key.encode()).hexdigest()[:8]
        self._modules: dict[int, list[str]] = {}
        self._backbone: Backbone | None = None  # the one its layers were last used on (``modules``)

    @property
    def alpha(self) -> float:
        """LoRA's alpha: the update is scaled by alpha / r."""
        return self.cfg.lora_alpha

    # ---------------------------------------------------------------- injection (once per backbone)

    def bind(self, ctx: AdapterContext) -> None:
        """Inject the LoRA layers into the shared backbone when the experiment is built."""
        if ctx.backbone is not None:
            self.modules(ctx.backbone)

    def peft_config(self, backbone: Backbone):
        from peft import LoraConfig

        targets = self.targets(backbone)
        if targets == [ALL_LINEAR]:  # an encoder's pooler is not read by fedpeft's readouts: no LoRA there
            pooler = any(n.split(".")[-1] == "pooler" for n, _ in backbone.model.named_modules())
            return LoraConfig(r=self.cfg.r, lora_alpha=self.alpha, lora_dropout=0.0, bias="none",
                              target_modules=ALL_LINEAR, exclude_modules=r".*pooler.*" if pooler else None)
        return LoraConfig(r=self.cfg.r, lora_alpha=self.alpha, lora_dropout=0.0,
                          target_modules=targets, bias="none")

    def to_peft(self, backbone: Backbone, params: Params, task_type: str):
        """PEFT's ``LoraConfig`` at the rank the tensors have (FLoRA's stack grows beyond r), alpha scaled alike so
        that PEFT's alpha / r is the run's scaling; keys ``base_model.model.<module>.lora_{A,B}.weight``."""
        from fedpeft.comm.lora_pairs import rank_of

        peft_config = self.peft_config(backbone)
        peft_config.task_type = task_type  # AutoPeftModelFor<task> reads it (None: only PeftModel loads it)
        lora = with_residuals(params)
        rank = rank_of(lora)
        if rank is not None and rank != peft_config.r:
            peft_config.lora_alpha, peft_config.r = peft_config.lora_alpha * rank / peft_config.r, rank
        return peft_config, {PEFT_PREFIX + k: v for k, v in lora.items()}

    def targets(self, backbone: Backbone) -> list[str]:
        if self.cfg.target_modules:
            return list(self.cfg.target_modules)
        kind = getattr(backbone.model.config, "model_type", "")
        if kind not in DEFAULT_TARGETS:
            raise ValueError(f"method.adapter.target_modules: no default q/k/v modules for model type '{kind}'; "
                             f"name them")
        return list(DEFAULT_TARGETS[kind])

    def modules(self, backbone: Backbone) -> list[str]:
        """Names of the adapted modules (injecting the LoRA layers on first use), in model order."""
        from peft.tuners.lora import LoraLayer

        key = id(backbone.model)
        if key not in self._modules:
            self._modules[key] = inject_once(backbone, self.peft_config(backbone), self.adapter_name, LoraLayer)
            if not self._modules[key]:
                raise ValueError(f"method.adapter.target_modules: none of {self.targets(backbone)} is a module "
                                 f"of {backbone.name}")
        activate(backbone, self.adapter_name, LoraLayer)
        self._backbone = backbone  # the one a residual's base weights are read from (one backbone per process)
        return self._modules[key]

    # ---------------------------------------------------------------- adapter contract

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """A ~ U(±1/sqrt(d_in)) (peft's kaiming-uniform default, drawn from ``generator``), B = 0."""
        params = {}
        for name in self.modules(backbone):
            base = backbone.model.get_submodule(name).base_layer
            d_in, d_out = base.in_features, base.out_features
            bound = 1.0 / math.sqrt(d_in)
            params[f"{name}.lora_A.weight"] = (torch.rand(self.cfg.r, d_in, generator=generator) * 2 - 1) * bound
            params[f"{name}.lora_B.weight"] = torch.zeros(d_out, self.cfg.r)
        return params

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        self.modules(backbone)
        return Prepared(backbone.input_embeddings()(input_ids), attention_mask, lead, 0)

    def overrides(self, params: Params) -> Params | None:
        """PEFT state-dict names -> the injected layers' parameters of this adapter; a module's residual R
        (FedEx-LoRA, ``comm.lora_pairs.RESIDUAL``) -> its base weight W + s·R for this call (W itself untouched)."""
        out = {}
        for k, v in params.items():
            m = re.fullmatch(r"(.+)\.(lora_[AB])\.weight", k)
            if m:
                out[f"{m.group(1)}.{m.group(2)}.{self.adapter_name}.weight"] = v
            elif k.endswith(RESIDUAL):
                name = k[: -len(RESIDUAL)]
                out[f"{name}.base_layer.weight"] = self._with_residual(name, v)
        return out

    def _with_residual(self, name: str, residual: torch.Tensor) -> torch.Tensor:
        """W + s·R of module ``name`` of the backbone the layers were last used on (a new tensor)."""
        if self._backbone is None:
            raise RuntimeError("a LoRA residual needs the adapter bound to its backbone first (modules())")
        layer = self._backbone.model.get_submodule(name)
        w = layer.base_layer.weight
        if not w.is_floating_point():
            raise ValueError("model.quantization: a residual folded into the base weights (FedEx-LoRA) needs "
                             "float base weights; quantized ones cannot hold it")
        return w + layer.scaling[self.adapter_name] * residual.to(w)

    def merged(self, backbone: Backbone, params: Params) -> Params | None:
        """Base weights with the update merged in, W + (alpha/r)·B A, named as inside ``bypassed`` (the base layer in
        the LoRA layer's place), for decoding: one matrix product per projection instead of three. None for
        quantized base weights, which cannot absorb the update."""
        out = {}
        for name in self.modules(backbone):
            a, b = params.get(f"{name}.lora_A.weight"), params.get(f"{name}.lora_B.weight")
            if a is None or b is None:
                continue
            layer = backbone.model.get_submodule(name)
            w = layer.base_layer.weight
            if not w.is_floating_point():
                return None  # quantized base weights (QLoRA): decode with the LoRA branch instead
            delta = b.to(w) @ a.to(w)
            if name + RESIDUAL in params:
                delta = delta + params[name + RESIDUAL].to(w)
            out[f"{name}.weight"] = w + layer.scaling[self.adapter_name] * delta  # as bypassed
        return out

    def bypassed(self, backbone: Backbone):
        """Every LoRA layer replaced by its base layer while inside (merged weights in use): the plain model, without
        the LoRA wrappers' per-call work (each decoding step would pay it once per adapted projection)."""
        from peft.tuners.lora import LoraLayer

        return without_layers(backbone, LoraLayer)

    def head_slices(self, backbone: Backbone) -> HeadSlices:
        """For every B: (query heads it feeds, dim 0, row start, row end), global head id = layer·H + h."""
        cfg = backbone.model.config
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        group = heads // kv
        out: HeadSlices = {}
        for name in self.modules(backbone):
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in QUERY_NAMES | KV_NAMES:  # MLP, output projections, a pooler: no head of their own
                continue
            layer = _layer_index(name)
            key = f"{name}.lora_B.weight"
            if leaf in QUERY_NAMES:
                out[key] = [((layer * heads + h,), 0, h * head_dim, (h + 1) * head_dim) for h in range(heads)]
            elif leaf in KV_NAMES:
                out[key] = [(tuple(layer * heads + j * group + g for g in range(group)), 0, j * head_dim,
                             (j + 1) * head_dim) for j in range(kv)]
        return out


def with_residuals(params: Params) -> Params:
    """The LoRA factors, with every module's residual R (FedEx-LoRA) appended as its exact factorisation
    R = (U Σ) Vᵀ, so that B' A' = B A + R; all modules zero-padded to one rank (PEFT's config has one r)."""
    lora = {k: v for k, v in params.items() if ".lora_" in k}
    residual = {k[: -len(RESIDUAL)]: v for k, v in params.items() if k.endswith(RESIDUAL)}
    if not residual:
        return lora
    for module, (a, b) in pairs(lora).items():
        if module in residual:
            u, s, vh = torch.linalg.svd(residual[module].double(), full_matrices=False)
            lora[b] = torch.cat([lora[b].double(), u * s], dim=1).float()
            lora[a] = torch.cat([lora[a].double(), vh]).float()
    return pad(lora, max(lora[a].shape[0] for a, _ in pairs(lora).values()))


def _layer_index(module: str) -> int:
    m = re.search(r"\.(\d+)\.", module)
    if m is None:
        raise ValueError(f"cannot tell the layer of module '{module}'")
    return int(m.group(1))
