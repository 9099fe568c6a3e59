"""HF PEFT's tuner layers in the one shared frozen backbone, for any peft-backed adapter (LoRA now): inject a config's
layers once, make one adapter the active one, and take the layers out while merged weights are in use.

A tuner layer class (``peft.tuners.lora.LoraLayer``, ``IA3Layer``, …) names its trainable parts in
``adapter_layer_names``; an adapter is present in a layer when the first of them holds its name. The injected
parameters stay frozen (each client's tensors enter a forward as overrides); ``forget_slots`` is called whenever the
model's structure changes, so that a client's tensors are looked up again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fedpeft.backbones.loading import Backbone
from fedpeft.backbones.weights import forget_slots


def _holds(layer: Any, adapter_name: str) -> bool:
    return adapter_name in getattr(layer, layer.adapter_layer_names[0])


def inject_once(backbone: Backbone, peft_config: Any, adapter_name: str, layer_cls: type) -> list[str]:
    """Names of the modules that carry ``adapter_name``'s layers, in model order, injecting them the first time (a
    later call, or another config under another name, leaves what is there); every injected parameter is frozen."""
    from peft import inject_adapter_in_model

    model = backbone.model
    if not any(isinstance(m, layer_cls) and _holds(m, adapter_name) for m in model.modules()):
        inject_adapter_in_model(peft_config, model, adapter_name=adapter_name)
        forget_slots()  # the model's structure changed: look its weights up again
    parts = set(layer_cls.adapter_layer_names)
    for name, p in model.named_parameters():
        if parts & set(name.split(".")):
            p.requires_grad_(False)
    return [n for n, m in model.named_modules() if isinstance(m, layer_cls) and _holds(m, adapter_name)]


def activate(backbone: Backbone, adapter_name: str, layer_cls: type) -> None:
    """Make ``adapter_name`` the only active adapter of every ``layer_cls`` layer (other configs may share the
    backbone); remembered in the backbone's cache, so that a repeated call costs nothing."""
    key = f"active:{layer_cls.__name__}"
    if backbone.cache.get(key) == adapter_name:
        return
    for m in backbone.model.modules():
        if isinstance(m, layer_cls):
            m._active_adapter = [adapter_name] if _holds(m, adapter_name) else []
    backbone.cache[key] = adapter_name


@contextlib.contextmanager
def without_layers(backbone: Backbone, layer_cls: type) -> Iterator[None]:
    """Every ``layer_cls`` layer replaced by its base layer while inside: the plain model (for merged weights),
    without the wrappers' per-call work."""
    swaps = []
    for parent in backbone.model.modules():
        for child, m in list(parent._modules.items()):
            if isinstance(m, layer_cls):
                swaps.append((parent, child, m))
                parent._modules[child] = m.base_layer
    forget_slots()  # weights are looked up under the plain structure inside, under the wrapped one after
    try:
        yield
    finally:
        for parent, child, m in reversed(swaps):
            parent._modules[child] = m
        forget_slots()
