"""A model the user already holds in memory as the process's frozen ``Backbone``, its weights shared, not copied.

The user's model may carry PEFT's layers (a ``peft.PeftModel`` under a transformers ``Trainer``): fedpeft must not
inject its own adapter into it nor freeze it, and copying it would double the memory. ``shared_backbone`` builds an
empty shell of the same class (``accelerate.init_empty_weights``: parameters on the meta device, buffers real) and
assigns it the user's pretrained tensors themselves (``load_state_dict(assign=True)``), PEFT's ``base_layer`` names
mapped back to the plain model's and PEFT's own tensors left out, as ``tests/conftest.py``'s ``plain_copy`` does
with a copy. The shell computes the base model's function on the very same storage; its ``checksum`` proves at the
end of a run that training through the user's model never moved a pretrained weight.
"""

from __future__ import annotations

import copy
from typing import Any

from fedpeft.backbones.loading import Backbone, _family_of, _freeze


def family_of_model(model: Any) -> str:
    """The fedpeft family of a transformers model: its class name says it for causal LMs built in code (their
    config may name no architecture), else its config does (``loading._family_of``)."""
    name = type(model).__name__
    if "CausalLM" in name or "LMHeadModel" in name:
        return "causal"
    return _family_of(model.config)


def shared_backbone(base: Any, tokenizer: Any, name: str, source: str | None = None) -> Backbone:
    """A frozen ``Backbone`` named ``name`` whose weights are ``base``'s own tensors (``base``: the transformers model,
    PEFT's layers inside it or not); ``base`` itself is left as it is (trainable flags, mode, layers)."""
    from accelerate import init_empty_weights

    if getattr(base, "is_quantized", False) or getattr(base.config, "quantization_config", None) is not None:
        raise ValueError("model: a quantized base model (bitsandbytes, QLoRA) cannot be shared with fedpeft's "
                         "backbone yet; federate a float model")
    state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if ".lora_" not in k}
    with init_empty_weights():
        shell = type(base)(copy.deepcopy(base.config))
    shell.load_state_dict(state, strict=True, assign=True)
    device = next(iter(state.values())).device
    shell.to(device)  # the buffers (rotary frequencies) made on the CPU; the shared weights are there already
    return Backbone(name, _freeze(shell), tokenizer, family_of_model(base), source=source)  # type: ignore[arg-type]
