"""The adapted frozen model's forward pass, shared by every objective (classification readouts, language modelling).

``AdaptedModel`` holds the backbone, the adapter and the device, and runs a token batch through the adapter and the
frozen model: under autocast when asked (CUDA only), with backbone weights overridden for one call (full fine-tuning,
a client's pruned heads), a frozen text run once to a kept key/value cache (the projected prompt's suffix placement),
and a population of stacked candidates sorted by length into several passes on CPU. What the outputs are scored by
is the objective's job (``model.classifier``, ``model.language_model``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from fedpeft.adapters.base import Adapter, FrozenText, Params, Prepared
from fedpeft.backbones.encoding import Encoded, collate
from fedpeft.backbones.loading import Backbone
from fedpeft.backbones.weights import call_with, swapped
from fedpeft.lazy import lazy, lazy_dict, no_grad

torch = lazy("torch")
F = lazy("torch.nn.functional")

AUTOCAST = lazy_dict(lambda: {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16})
TEXT_KV = "text_kv"  # Backbone.cache key of the kept frozen-text key/value caches


def tile_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], repeats: int, config):
    """A fresh ``DynamicCache`` holding every layer's keys/values tiled ``repeats`` times along the batch
    (candidate-major: rows [c*n:(c+1)*n] are candidate c's); the kept cache is never written."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(k.repeat(repeats, 1, 1, 1), v.repeat(repeats, 1, 1, 1)) for k, v in layers],
                        config=config)


def _cut(value, start: int, stop: int, cols: int):
    """Rows ``start:stop`` and the first ``cols`` positions of a model output (a tensor or a tuple of them)."""
    if isinstance(value, tuple):
        return tuple(v[start:stop, :cols] for v in value)
    return value[start:stop, :cols]


_OUTPUTS = ("logits", "last_hidden_state", "hidden_states")


def _sorted_forward(model, embeds: torch.Tensor, mask: torch.Tensor, passes: int,
                    hidden_states: bool) -> dict[str, Any]:
    """``model`` on right-padded rows [R, W, d] in ``passes`` passes over the rows sorted by length, each pass cut
    to its longest row; the outputs put back in row order, zero beyond each pass's width (pad positions only,
    which no readout reads)."""
    kwargs: dict[str, Any] = {"output_hidden_states": True} if hidden_states else {}
    if passes <= 1:
        out = model(inputs_embeds=embeds, attention_mask=mask, **kwargs)
        return {k: v for k, v in out.items() if k in _OUTPUTS}
    width = mask.shape[1]
    lengths = width - torch.flip(mask, [1]).to(torch.int64).argmax(1)  # last attended position + 1
    order = torch.argsort(lengths, stable=True)
    parts: dict[str, list] = {}
    for idx in torch.tensor_split(order, min(passes, len(order))):
        w = int(lengths[idx].max())
        out = model(inputs_embeds=embeds[idx, :w], attention_mask=mask[idx, :w], **kwargs)
        for k, v in out.items():
            if k in _OUTPUTS:
                parts.setdefault(k, []).append(v)
    back = torch.argsort(order)

    def join(pieces: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([F.pad(x, (0, 0) * (x.dim() - 2) + (0, width - x.shape[1])) for x in pieces])[back]

    return {k: tuple(map(join, zip(*v))) if isinstance(v[0], tuple) else join(v) for k, v in parts.items()}


class AdaptedModel:
    """Stateless forward of (adapter params, token batch) through the shared frozen backbone.

    The one place where the device is applied: batches and adapter tensors are moved to the backbone's device
    here, and forward passes run under autocast when ``autocast`` names a dtype (CUDA only).
    """

    def __init__(self, backbone: Backbone, adapter: Adapter, task: Any, max_length: int = 128,
                 autocast: str = "none") -> None:
        self.backbone, self.adapter, self.task = backbone, adapter, task
        self.max_length = max_length
        self.pad_id = backbone.tokenizer.pad_token_id
        self.device = backbone.device
        self.autocast = AUTOCAST[autocast] if self.device.type == "cuda" else None
        self._held = False  # the adapter's tensors are in the model's slots already (``held``)
        self.checkpointing = False

    def checkpoint_activations(self) -> None:
        """Activation checkpointing (``runtime.gradient_checkpointing``): each transformer layer keeps only its input
        and recomputes its activations in the backward pass (HF's non-reentrant checkpoint). The model stays in eval
        mode (no dropout); only the layers are marked training, which is what HF checks before checkpointing.
        Trainers then run forward and backward with the adapter's tensors ``held`` in the model."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        model = self.backbone.model
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise ValueError(f"runtime.gradient_checkpointing: {self.backbone.name} has no checkpointable layers")
        for m in layers:
            m.training = True
        self.checkpointing = True

    @contextlib.contextmanager
    def held(self, params: Params, static: Params | None = None):
        """The adapter's tensors (and ``static`` weights) in the shared model for the forwards and backward inside:
        what activation checkpointing needs, since it reruns the forward during the backward."""
        over = (self.adapter.overrides(params) or {}) | dict(static or {})
        with swapped(self.backbone.model, {k: v.to(self.device) for k, v in over.items()}):
            self._held = True
            try:
                yield
            finally:
                self._held = False

    def init_params(self, generator: torch.Generator) -> Params:
        """The adapter's initial tensors (after its data-dependent initialisation, ``Adapter.initialise``), on the
        CPU."""
        params = self.adapter.initialise(self, self.adapter.init(self.backbone, generator), generator)
        return {k: v.cpu() for k, v in params.items()}

    def _reads_hidden_states(self) -> bool:
        """Whether the objective reads the hidden states of every layer (a decoder's pooled readouts)."""
        return False

    def _autocast(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def _forward(self, params: Params, batch: dict[str, torch.Tensor], hidden_states: bool = False,
                 attentions: bool = False, static: Params | None = None):
        """(model outputs, the adapter's ``Prepared`` inputs, the params on the device) of one batch."""
        params, prep = self._prepare(params, batch)
        return self._run(params, prep, batch, hidden_states, attentions, static), prep, params

    def _prepare(self, params: Params, batch: dict[str, torch.Tensor]) -> tuple[Params, Prepared]:
        """The params on the device and the adapter's model inputs for ``batch``."""
        params = {k: v.to(self.device) for k, v in params.items()}
        return params, self.adapter.prepare(self.backbone, params, batch["input_ids"], batch["attention_mask"],
                                            int(batch["lead"]))

    def _run(self, params: Params, prep: Prepared, batch: dict[str, torch.Tensor], hidden_states: bool = False,
             attentions: bool = False, static: Params | None = None):
        """The frozen model (its body alone where the objective applies the head itself) on prepared inputs."""
        kwargs = {"inputs_embeds": prep.embeds, "attention_mask": prep.attention_mask, **prep.extra}
        if hidden_states or self._reads_hidden_states():
            kwargs["output_hidden_states"] = True
        if attentions:
            kwargs["output_attentions"] = True
        over = {} if self._held else self.adapter.overrides(params) or {}
        if static and not self._held:  # fixed backbone weights for this call (e.g. a client's pruned heads)
            over = over | {k: v.to(self.device) for k, v in static.items()}
        model, split = self.backbone.model, self.backbone.body_and_head
        if split is not None:  # the body only: the verbalizer applies the LM head to the rows it reads
            prefix = split[0] + "."
            model = split[1]
            over = {k[len(prefix):]: v for k, v in over.items() if k.startswith(prefix)}
        passes = self._population_passes(prep, batch) if not (over or attentions) else 1
        with self._autocast():
            if prep.text is not None:
                kwargs["past_key_values"] = self._text_cache(prep.text, model, over)
            if passes > 1:
                out = SimpleNamespace(**_sorted_forward(model, prep.embeds, prep.attention_mask, passes,
                                                        "output_hidden_states" in kwargs))
            else:
                out = call_with(model, over, **kwargs)
        return out

    def _population_passes(self, prep: Prepared, batch: dict[str, torch.Tensor]) -> int:
        """Forwards for a call whose adapter stacks several candidates over one batch (a CMA-ES population, the K
        tokens of a search step): on CPU one per candidate over the rows sorted by length, each padded only to its
        own longest row (the same matrix sizes as a candidate at a time, far fewer pad tokens); one otherwise."""
        rows, n = prep.embeds.shape[0], batch["input_ids"].shape[0]
        if self.device.type != "cpu" or rows <= n or prep.text is not None or prep.extra:
            return 1
        return rows // n

    def _text_cache(self, text: FrozenText, model, over: Params):
        """Key/value cache of the frozen text, tiled for ``text.repeats`` candidates: computed once, and kept (up to
        ``text.keep``, keyed by token ids, mask and autocast dtype) for later calls while no weight is overridden;
        ``keep = 0``: neither kept nor looked up."""
        kept = self.backbone.cache.setdefault(TEXT_KV, OrderedDict())
        key = (str(self.autocast), tuple(text.input_ids.shape), text.input_ids.cpu().numpy().tobytes(),
               text.attention_mask.cpu().numpy().tobytes())
        reuse = text.keep > 0 and not over
        layers = kept.pop(key, None) if reuse else None
        if layers is None:
            kwargs = {"input_ids": text.input_ids, "attention_mask": text.attention_mask, "use_cache": True}
            out = call_with(model, over, **kwargs)
            if any(out.past_key_values.is_sliding):
                raise ValueError(f"method.adapter.kv_cache: {self.backbone.name} has sliding-window attention layers; "
                                 "a shared text cache needs full attention (set kv_cache=false)")
            layers = [(k, v) for k, v, *_ in out.past_key_values]
        if reuse:
            kept[key] = layers  # now the most recently used
            while len(kept) > text.keep:
                kept.popitem(last=False)
        return tile_cache(layers, text.repeats, self.backbone.model.config)

    def _head_rows(self, hidden: torch.Tensor, params: Params) -> torch.Tensor:
        """Vocabulary logits of the LM head on the read rows [n, d] only (the head's own weights, or the
        adapter's overrides of them), instead of on every position."""
        _, _, name, head = self.backbone.body_and_head
        prefix = name + "."
        over = {} if self._held else {k[len(prefix):]: v for k, v in (self.adapter.overrides(params) or {}).items()
                                      if k.startswith(prefix)}
        return call_with(head, over, hidden)

    @no_grad
    def attentions(self, params: Params, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], Prepared]:
        """Each layer's attention probabilities [n, H, T, T] with the adapter applied (eager attention)."""
        model = self.backbone.model
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            out, prep, _ = self._forward(params, batch, attentions=True)
        finally:
            model.set_attn_implementation(before)
        return list(out.attentions), prep

    def hidden_states(self, params: Params, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each layer's output [n, T, d] with the adapter applied (HF ``hidden_states[1:]``)."""
        out, _, _ = self._forward(params, batch, hidden_states=True)
        return list(out.hidden_states[1:])

    def batch(self, enc: Encoded, idx) -> dict[str, torch.Tensor]:
        """Right-padded batch tensors on the classifier's device."""
        b = {k: v.to(self.device) for k, v in collate(enc, idx, self.pad_id).items()}
        b["lead"] = enc.lead
        return b
