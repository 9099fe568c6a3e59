"""Export a run's final global adapter in Hugging Face PEFT's format (``PeftModel.from_pretrained`` loads it).

- ``lora``: ``adapter_config.json`` (the run's ``LoraConfig``) and ``adapter_model.safetensors`` with PEFT's
  key names ``base_model.model.<module>.lora_{A,B}.weight``. Heads that no client ever kept keep B = 0 rows.
  A linear readout (``model.readout: linear``) goes to ``task_head.safetensors`` (``head.weight``, ``head.bias``:
  logits = mean-pooled last hidden state · weightᵀ + bias).
- ``soft_prompt`` with ``position: before_all``: PEFT prompt tuning (``prompt_embeddings`` [m, d]). fedpeft's
  default ``after_first`` places the prompt after [CLS]/BOS, which PEFT's prompt tuning cannot express.
- ``deep_prompt`` (P-tuning v2): PEFT prefix tuning without projection (``prompt_embeddings`` [h, L·2·d_kv], the
  layers' ``[h, 2, d_kv]`` prefixes side by side, which is PEFT's ``[h, L, 2, kv heads, head dim]`` cache
  layout; with grouped-query attention PEFT narrows ``token_dim`` to the key/value heads itself). Only with
  ``shift_positions: true``: PEFT's models number the input positions after the prefix.
- Projected prompts and full fine-tuning are not exported: a projected prompt needs the shared projection
  (FedBPT's ``A``), and full fine-tuning is a whole model (save it with ``save_pretrained`` instead).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from fedpeft.config import ExperimentConfig
from fedpeft.experiment import build_experiment
from fedpeft.methods.composed import ServerState
from fedpeft.resolve import load_config
from fedpeft.tracking.rundir import RunDir

PEFT_PREFIX = "base_model.model."


def export_peft(run_dir: str | Path, out: str | Path) -> Path:
    """Write the final global adapter of ``run_dir`` as a PEFT adapter directory ``out``; returns ``out``."""
    run = RunDir(run_dir)
    config = Path(run_dir) / "config.yaml"
    if not config.exists():
        raise FileNotFoundError(f"{config}: not a fedpeft run directory")
    ckpt = run.load_checkpoint()
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir}/checkpoint: the run has no checkpoint yet")
    cfg = load_config(config)
    glob = ServerState.from_message(ckpt[1]).glob
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = cfg.method.adapter.name
    if name == "lora":
        peft_config, tensors = _lora(cfg, glob)
    elif name == "soft_prompt":
        peft_config, tensors = _prompt_tuning(cfg, glob)
    elif name == "deep_prompt":
        peft_config, tensors = _prefix_tuning(cfg, glob)
    else:
        raise ValueError(f"method.adapter.name: '{name}' has no PEFT format (lora, soft_prompt and deep_prompt "
                         f"export; see fedpeft.export)")
    head = {k: v.float().contiguous() for k, v in glob.items() if k.startswith("head.")}
    if head:  # fedpeft's linear readout is not a module of the base model: saved beside the adapter
        save_file(head, str(out / "task_head.safetensors"))
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(peft_config.to_dict(), indent=2, default=_json) + "\n")
    return out


def _json(value):
    return sorted(value) if isinstance(value, set) else str(value)


def _lora(cfg: ExperimentConfig, glob):
    exp = build_experiment(cfg)
    adapter = exp.classifier.adapter
    peft_config = adapter.peft_config(exp.backbone)
    peft_config.base_model_name_or_path = cfg.model.name
    return peft_config, {PEFT_PREFIX + k: v for k, v in glob.items() if ".lora_" in k}


def _prompt_tuning(cfg: ExperimentConfig, glob):
    from peft import PromptTuningConfig

    if cfg.method.adapter.settings().get("position") != "before_all":
        raise ValueError("method.adapter.position: PEFT prompt tuning prepends the prompt; only a soft prompt with "
                         "position 'before_all' exports")
    prompt = glob["prompt"]
    exp = build_experiment(cfg)
    peft_config = PromptTuningConfig(task_type=_task_type(exp), num_virtual_tokens=prompt.shape[0], token_dim=prompt.shape[1],
                                     num_transformer_submodules=1,
                                     num_attention_heads=exp.backbone.model.config.num_attention_heads,
                                     num_layers=exp.backbone.model.config.num_hidden_layers,
                                     base_model_name_or_path=cfg.model.name)
    return peft_config, {"prompt_embeddings": prompt}


def _prefix_tuning(cfg: ExperimentConfig, glob):
    from peft import PrefixTuningConfig

    from fedpeft.adapters.deep_prompt import kv_geometry, layer_key

    if not cfg.method.adapter.settings().get("shift_positions", True):
        raise ValueError("method.adapter.shift_positions: PEFT's prefix tuning numbers input positions after the "
                         "prefix; only deep prompts with shift_positions true export")
    exp = build_experiment(cfg)
    layers, _, _ = kv_geometry(exp.backbone)
    prefix = torch.stack([glob[layer_key(l)] for l in range(layers)], dim=1)  # [h, L, 2, d_kv]
    model_cfg = exp.backbone.model.config
    peft_config = PrefixTuningConfig(task_type=_task_type(exp), num_virtual_tokens=prefix.shape[0],
                                     num_layers=layers, token_dim=int(model_cfg.hidden_size),
                                     num_attention_heads=int(model_cfg.num_attention_heads),
                                     num_transformer_submodules=1, prefix_projection=False,
                                     base_model_name_or_path=cfg.model.name)
    return peft_config, {"prompt_embeddings": prefix.reshape(prefix.shape[0], -1)}


def _task_type(exp) -> str:
    return "CAUSAL_LM" if exp.backbone.family == "causal" else "FEATURE_EXTRACTION"
