"""P-tuning (Liu et al. 2021, "GPT Understands, Too"; FedPrompt §2.6 β, Table VI): m soft tokens produced by a
trainable prompt encoder, as OpenPrompt's ``PtuningTemplate``.

The prompt rows are ``mlp(lstm(E))`` (``lstm`` encoder: a 2-layer bidirectional LSTM d → d per direction, then
Linear(2d, d), ReLU, Linear(d, d)) or ``mlp(E)`` (``mlp`` encoder: Linear(d, d), ReLU, Linear(d, d)), with
``E`` [m, d] the trainable ``new_embedding``. The whole template (E and the encoder) is trained and exchanged,
as flat named tensors ``ptuning.embedding``, ``ptuning.lstm.weight_ih_l0`` … ``ptuning.mlp.2.bias``. The rows
are spliced in like ``soft_prompt`` (after [CLS] / <s> by default).

Parameter accounting: OpenPrompt's ``PtuningTemplate`` also inherits MixedTemplate's ``soft_embedding``
[(m+1), d], which its forward never uses but which the paper counts (25,420,032 = 25.420M for BERT-base).
Here it is NOT a tensor (it would get no gradient and only cost bytes); ``template_shapes(...,
openprompt_soft_embedding=True)`` adds it to the count to reproduce Table VI.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, Params, Prepared, insert_rows
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")
nn = lazy("torch.nn")

PREFIX = "ptuning."


class PTuningSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: int = Field(20, ge=1, description="number of soft tokens m")
    encoder: Literal["lstm", "mlp"] = Field("lstm", description="prompt encoder over the new embedding")
    position: Literal["after_first", "before_all"] = Field(
        "after_first", description="after the first special token ([CLS] / <s>), or before everything")
    init_std: float = Field(1.0, gt=0, description="new_embedding ~ N(0, init_std²) (nn.Embedding default: 1)")


@functools.cache
def prompt_encoder() -> type[nn.Module]:
    """The class ``PromptEncoder``, defined at its first use (subclassing ``nn.Module`` imports torch)."""

    class PromptEncoder(nn.Module):
        """OpenPrompt's new_embedding + new_lstm_head + new_mlp_head; ``forward()`` returns the m prompt rows."""

        def __init__(self, m: int, d: int, encoder: str) -> None:
            super().__init__()
            self.embedding = nn.Parameter(torch.empty(m, d))
            if encoder == "lstm":
                self.lstm = nn.LSTM(d, d, num_layers=2, bidirectional=True, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(2 * d if encoder == "lstm" else d, d), nn.ReLU(), nn.Linear(d, d))

        def forward(self) -> torch.Tensor:
            x = self.embedding.unsqueeze(0)
            if hasattr(self, "lstm"):
                x = self.lstm(x)[0]
            return self.mlp(x)[0]

    return PromptEncoder


def template(m: int, d: int, encoder: str) -> nn.Module:
    """The encoder's structure on the meta device (no memory): real tensors come in through functional_call."""
    with torch.device("meta"):
        return prompt_encoder()(m, d, encoder)


def template_shapes(d: int, m: int, encoder: str = "lstm",
                    openprompt_soft_embedding: bool = False) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the exchanged tensors; optionally with OpenPrompt's unused ``soft_embedding`` [(m+1), d]
    (accounting only, as the paper's Table VI counts it)."""
    shapes = {PREFIX + k: tuple(p.shape) for k, p in template(m, d, encoder).named_parameters()}
    return shapes | ({"openprompt.soft_embedding": (m + 1, d)} if openprompt_soft_embedding else {})


def _bound(name: str, shapes: dict[str, tuple[int, ...]], d: int) -> float:
    """torch's default U(-b, b) bounds: LSTM 1/sqrt(hidden); Linear weight and bias 1/sqrt(fan_in)."""
    if ".lstm." in name:
        return 1 / math.sqrt(d)
    return 1 / math.sqrt(shapes[name.replace(".bias", ".weight")][1])


@ADAPTERS.register("p_tuning", "P-tuning: m soft tokens from a trainable LSTM/MLP prompt encoder, the whole "
                   "template trained and exchanged (FedPrompt Table VI β)", PTuningSettings)
class PTuning(AdapterBase):
    """Tensors ``ptuning.*``; the prompt rows are computed from them in every forward."""

    name = "p_tuning"

    def __init__(self, cfg: PTuningSettings | None = None) -> None:
        super().__init__(cfg or PTuningSettings())
        self._templates: dict[int, nn.Module] = {}

    def _template(self, d: int) -> nn.Module:
        if d not in self._templates:
            self._templates[d] = template(self.cfg.num_tokens, d, self.cfg.encoder)
        return self._templates[d]

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """torch's default initialisations drawn from ``generator``, in the module's parameter order:
        new_embedding N(0, init_std²), LSTM U(±1/sqrt(d)), Linear weight and bias U(±1/sqrt(fan_in))."""
        d = backbone.input_embeddings().weight.shape[1]
        shapes = template_shapes(d, self.cfg.num_tokens, self.cfg.encoder)
        out = {}
        for name, shape in shapes.items():
            if name == PREFIX + "embedding":
                out[name] = torch.randn(shape, generator=generator) * self.cfg.init_std
            else:
                b = _bound(name, shapes, d)
                out[name] = torch.rand(shape, generator=generator) * (2 * b) - b
        return out

    def prompt(self, params: Params, d: int) -> torch.Tensor:
        """The m prompt rows [m, d], a differentiable function of every ``ptuning.*`` tensor."""
        tensors = {k[len(PREFIX):]: v for k, v in params.items() if k.startswith(PREFIX)}
        return torch.func.functional_call(self._template(d), tensors, (), strict=True)

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        embeds = backbone.input_embeddings()(input_ids)
        rows = self.prompt(params, embeds.shape[-1])
        at = lead if self.cfg.position == "after_first" else 0
        embeds, attention_mask = insert_rows(embeds, attention_mask, rows.unsqueeze(0).expand(embeds.shape[0], -1, -1),
                                             at)
        return Prepared(embeds, attention_mask, at, rows.shape[0])
