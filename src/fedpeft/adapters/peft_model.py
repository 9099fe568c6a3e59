"""A user's PEFT LoRA model seen as fedpeft's ``lora`` adapter: the settings that rebuild it, and its LoRA tensors read
and written under fedpeft's names.

Names. PEFT's saved state dict names a tensor ``base_model.model.<module>.lora_A.weight`` (``PEFT_PREFIX``, the
adapter name dropped: ``get_peft_model_state_dict``), the live parameter is ``base_model.model.<module>.lora_A.
<adapter>.weight``, and fedpeft's ``lora`` adapter names it ``<module>.lora_A.weight``: the module's path inside the
transformers model (``adapters.lora``). So fedpeft's tensors enter the user's model by name, in place (the
optimizer keeps its parameters), and leave it as float32 copies on the CPU.

Settings. r and lora_alpha are the user's; the adapted modules are taken from the model itself (what PEFT injected,
whatever ``target_modules``, ``exclude_modules`` or ``layers_to_transform`` said): their leaf names when those pick
exactly the same modules (the usual ``["q_proj", "v_proj"]``), else every module's full path. ``lora_dropout`` only
acts in the user's training steps (fedpeft's shared backbone runs in eval mode, as ``adapters.lora`` says).

One second adapter is taken: ``ref``, the frozen copy of the user's adapter that TRL's ``DPOTrainer`` adds to a
PEFT model to compute its reference with, when it adds nothing (every B zero: a fresh adapter), so that TRL's
reference is the base model, as fedpeft's is; it is never exchanged.

Refused, naming the ``LoraConfig`` field: several adapters, other PEFT methods, and every LoraConfig field that
changes what LoRA computes or trains beyond ΔW = (alpha / r)·B A on the adapted modules (DoRA, rsLoRA's scaling,
per-module ranks or alphas, ``modules_to_save``, bias training, trainable tokens, target parameters, ...: any field
not at its default that this module does not read), initialisations that change the base weights (PiSSA, OLoRA,
LoftQ, ...: fedpeft starts every client from its seeded global adapter, B = 0, on the unchanged base), and any
trainable parameter that is not one of the LoRA A and B tensors.
"""

from __future__ import annotations

import re
from typing import Any

from fedpeft.adapters.base import Params
from fedpeft.adapters.lora import PEFT_PREFIX
from fedpeft.lazy import lazy

torch = lazy("torch")

# LoraConfig fields read here, or that change nothing fedpeft exchanges; every other field must keep its default
READ = {"task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
        "inference_mode", "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules",
        "layers_to_transform", "layers_pattern", "fan_in_fan_out", "init_lora_weights", "megatron_core",
        "qalora_group_size", "runtime_config", "ensure_weight_tying"}
PLAIN_INITS = (True, False, "gaussian")  # initialisations of A and B alone, which fedpeft's global init replaces
REFERENCE = "ref"  # TRL's DPOTrainer: the frozen copy of a user's adapter it computes the reference with


def _check_reference(model: Any) -> None:
    """ValueError unless TRL's reference copy of the adapter adds nothing (every B zero: the reference is the base
    model, fedpeft's reference, ``model.preference``)."""
    for name, p in model.named_parameters():
        m = _LIVE.fullmatch(name)
        if m and m.group(3) == REFERENCE and m.group(2) == "lora_B" and bool(p.detach().abs().max() > 0):
            raise ValueError("model: the PEFT model's 'ref' adapter (TRL DPOTrainer's reference: a copy of your "
                             "adapter when the trainer was made) is not zero, so TRL's reference is not the base "
                             "model that fedpeft scores against: start from a fresh LoRA adapter (B = 0), or give the "
                             "DPOTrainer a plain model and peft_config=")
_LIVE = re.compile(r"(.+)\.(lora_[AB])\.([^.]+)\.weight")


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, (set, frozenset)) else value


class PeftLora:
    """The LoRA adapter of a ``peft.PeftModel``, checked on construction (``ValueError`` naming what is refused)."""

    def __init__(self, model: Any) -> None:
        from peft import LoraConfig, PeftModel

        if not isinstance(model, PeftModel):
            raise ValueError(f"model: the trainer's model is a {type(model).__name__}, not a PEFT model; wrap it with "
                             "peft.get_peft_model(model, LoraConfig(...)) or give the TRL trainer peft_config=")
        active = model.active_adapter
        if set(model.peft_config) not in ({active}, {active, REFERENCE}) or active == REFERENCE:
            raise ValueError(f"model: the PEFT model holds adapters {sorted(model.peft_config)}; fedpeft federates one")
        self.adapter_name, config = active, model.peft_config[active]
        if REFERENCE in model.peft_config:
            _check_reference(model)
        if not isinstance(config, LoraConfig):
            raise ValueError(f"model: the PEFT adapter is {type(config).__name__}; fedpeft federates LoRA (LoraConfig)")
        defaults = LoraConfig().to_dict()
        for key, value in config.to_dict().items():
            if key not in READ and _plain(value) != _plain(defaults.get(key)):
                raise ValueError(f"LoraConfig.{key}={value!r} is not supported by fedpeft's lora adapter (it federates "
                                 f"ΔW = (alpha/r)·B A on the adapted modules only); leave it at "
                                 f"{defaults.get(key)!r}")
        if config.init_lora_weights not in PLAIN_INITS:
            raise ValueError(f"LoraConfig.init_lora_weights={config.init_lora_weights!r} changes the base weights; "
                             "fedpeft starts every client from its seeded global adapter (B = 0) on the unchanged "
                             f"base: use one of {list(PLAIN_INITS)}")
        self.model, self.config = model, config
        self.base = model.get_base_model()
        self.params: dict[str, Any] = {}  # fedpeft name -> the live parameter
        for name, p in model.named_parameters():
            m = _LIVE.fullmatch(name)
            if m and m.group(3) == self.adapter_name and name.startswith(PEFT_PREFIX):
                self.params[f"{m.group(1)[len(PEFT_PREFIX):]}.{m.group(2)}.weight"] = p
            elif m and m.group(3) == REFERENCE and not p.requires_grad:
                continue  # TRL's frozen reference copy (checked above)
            elif p.requires_grad:
                raise ValueError(f"model: parameter '{name}' is trainable but is no LoRA A or B tensor; fedpeft "
                                 "exchanges those only (freeze it, or leave LoraConfig.modules_to_save unset)")
        if not self.params:
            raise ValueError("model: the PEFT model has no LoRA A/B weights (LoRA on embeddings or convolutions is "
                             "not supported yet)")
        self.modules = sorted({k.rsplit(".", 2)[0] for k in self.params})
        self.rank = int(config.r)

    def settings(self) -> dict[str, Any]:
        """``method.adapter`` keys of fedpeft's ``lora`` adapter that inject the same layers (see the module doc)."""
        leaves = sorted({m.rsplit(".", 1)[-1] for m in self.modules})
        picked = {n for n, _ in self.base.named_modules() if n.rsplit(".", 1)[-1] in leaves}
        targets = leaves if picked == set(self.modules) else list(self.modules)
        return {"r": int(self.config.r), "lora_alpha": float(self.config.lora_alpha), "target_modules": targets}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(p.shape) for k, p in self.params.items()}

    def check(self, params: Params) -> None:
        """ValueError unless ``params`` are exactly this adapter's tensors, by name and shape."""
        theirs, mine = {k: tuple(v.shape) for k, v in params.items()}, self.shapes()
        if theirs != mine:
            extra, missing = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
            wrong = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
            raise ValueError("model: fedpeft's lora tensors do not fit the trainer's PEFT model ("
                             + "; ".join(s for s in (f"not in the model: {extra[:3]}" if extra else "",
                                                     f"not in fedpeft's: {missing[:3]}" if missing else "",
                                                     f"shapes differ: {wrong[:3]}" if wrong else "") if s) + ")")

    def load(self, params: Params) -> None:
        """Copy ``params`` (fedpeft's names) into the model's LoRA weights in place."""
        self.check(params)
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(params[k].to(device=p.device, dtype=p.dtype))

    def read(self) -> Params:
        """The model's LoRA weights under fedpeft's names, as float32 copies on the CPU."""
        return {k: p.detach().to("cpu", torch.float32).clone() for k, p in self.params.items()}
