"""Full fine-tuning baseline: every backbone weight is trainable and exchanged (FedAvg over all of them).

The shared frozen module is never modified: the client trains its own copy of the weights and the
forward pass runs through ``torch.func.functional_call`` with them. Weights are exchanged under the model's own
names; LoRA layers another adapter injected into the shared backbone (``lora``) are skipped and their wrapped
``base_layer`` weights keep their original names.
"""

from __future__ import annotations

from fedpeft.adapters.base import ADAPTERS, AdapterBase, Params, Prepared
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy

torch = lazy("torch")

PREFIX = "backbone."


@ADAPTERS.register("full", "all backbone weights trained and exchanged (full fine-tuning baseline)")
class FullFineTuning(AdapterBase):
    checkpointable = True
    packable = True
    name = "full"

    def __init__(self, cfg: None = None) -> None:
        super().__init__(cfg)
        self._embed_key: str | None = None
        self._paths: dict[str, str] = {}  # exchanged name -> parameter path in the (possibly LoRA-wrapped) model

    def _weights(self, backbone: Backbone) -> list[tuple[str, str, torch.nn.Parameter]]:
        """(exchanged name, module path, parameter) of every backbone weight, adapter layers excluded."""
        out, injected = [], backbone.injected()
        for path, p in backbone.model.named_parameters():
            if path in injected:
                continue
            name = PREFIX + path.replace(".base_layer.", ".")
            self._paths[name] = path
            out.append((name, path, p))
        return out

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        emb = backbone.input_embeddings().weight
        params = {}
        for name, _, p in self._weights(backbone):
            params[name] = p.detach().cpu().clone()
            if p is emb:
                self._embed_key = name
        return params

    def _embedding_key(self, backbone: Backbone) -> str:
        if self._embed_key is None:
            emb = backbone.input_embeddings().weight
            self._embed_key = next(n for n, _, p in self._weights(backbone) if p is emb)
        return self._embed_key

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        embeds = torch.nn.functional.embedding(input_ids, params[self._embedding_key(backbone)])
        return Prepared(embeds, attention_mask, lead, 0)

    def overrides(self, params: Params) -> Params | None:
        return {self._paths.get(k, k[len(PREFIX):]): v for k, v in params.items() if k.startswith(PREFIX)}
