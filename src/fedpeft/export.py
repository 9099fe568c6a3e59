"""Export a run's global adapter (or a client's personalised one) in Hugging Face PEFT's format
(``PeftModel.from_pretrained`` loads it), with what using it as the run's classifier needs beside it.

The export is reusable as it is, from any folder, without fedpeft: ``adapter_config.json`` names the backbone by
its hub id or the absolute folder it loads from (``base_model_name_or_path``; a model built in code, such as the
tiny test models, has neither and keeps its fedpeft name), files are written with the usual permissions, and
``fedpeft_task.json`` holds the task: class names, label words and descriptions, templates, the readout and its
settings (scale, pooling, calibration, max length), the backbone's identity and the round exported. The adapter
comes from the run directory alone (``predict.open_model``: ``model.json``, never the training data).

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
from typing import Any

import torch
from safetensors.torch import save

from fedpeft.predict import TrainedModel, open_model
from fedpeft.tracking.rundir import RunDir

PEFT_PREFIX = "base_model.model."
TASK_FILE = "fedpeft_task.json"


def export_peft(run_dir: str | Path, out: str | Path, best: bool = False,
                client: int | str | None = None) -> tuple[Path, str]:
    """Write the global adapter of ``run_dir`` (its last checkpoint, or with ``best`` the one ``evaluation.keep_best``
    kept), or client ``client``'s personalised one (e.g. FedSA-LoRA's own B), as a PEFT adapter directory ``out``;
    returns ``out`` and a line saying which adapter of which round it is."""
    model = open_model(run_dir, client=client, best=best)
    cfg, glob = model.cfg, model.params
    record = RunDir(run_dir).read_record() or {}
    backbone = model.classifier.backbone
    base = (record.get("backbone") or {}).get("source") or backbone.source or cfg.model.name
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = cfg.method.adapter.name
    if name == "lora":
        peft_config, tensors = _lora(model, glob)
    elif name == "soft_prompt":
        peft_config, tensors = _prompt_tuning(model, glob)
    elif name == "deep_prompt":
        peft_config, tensors = _prefix_tuning(model, glob)
    else:
        raise ValueError(f"method.adapter.name: '{name}' has no PEFT format (lora, soft_prompt and deep_prompt "
                         f"export; see fedpeft.export)")
    peft_config.base_model_name_or_path = base
    head = {k: v.float().contiguous() for k, v in glob.items() if k.startswith("head.")}
    if head:  # fedpeft's linear readout is not a module of the base model: saved beside the adapter
        (out / "task_head.safetensors").write_bytes(save(head))
    (out / "adapter_model.safetensors").write_bytes(save({k: v.float().contiguous() for k, v in tensors.items()}))
    (out / "adapter_config.json").write_text(json.dumps(peft_config.to_dict(), indent=2, default=_json) + "\n")
    (out / TASK_FILE).write_text(json.dumps(task_metadata(model, record, base), indent=2, ensure_ascii=False) + "\n",
                                 encoding="utf-8")
    return out, f"exported {model.describe()}"


def task_metadata(model: TrainedModel, record: dict[str, Any], base: str) -> dict[str, Any]:
    """``fedpeft_task.json``: what scoring classes with the exported adapter needs, as the run scored them."""
    clf, cfg = model.classifier, model.cfg
    if clf.kind == "generation":  # what prompts looked like: the chat template, or the template given
        scoring = {"max_response_length": clf.max_response_length, "chat_template": clf.format.chat,
                   "end_token_id": clf.end_id}
    else:
        scoring = {"similarity_scale": clf.scale, "pooling": clf.pooling, "calibration": clf.calibration,
                   "task_head": "task_head.safetensors" if clf.readout == "linear" else None}
    return {"task": clf.task.spec(), "readout": clf.readout, "max_length": clf.max_length, **scoring,
            "backbone": {"name": cfg.model.name, "base_model_name_or_path": base, "family": clf.backbone.family,
                         "sha256": (record.get("backbone") or {}).get("sha256") or clf.backbone.fingerprint()},
            "round": model.round, "rounds": model.rounds, "best_on_validation": model.best,
            "method": cfg.method.name, "components": cfg.method.components()}


def _json(value):
    return sorted(value) if isinstance(value, set) else str(value)


def _lora(model: TrainedModel, glob):
    """PEFT's LoRA config at the rank the tensors have (FLoRA's stack grows beyond the adapter's r), with alpha
    scaled alike so that PEFT's alpha / r is the scaling the run used."""
    from fedpeft.comm.lora_pairs import rank_of

    peft_config = model.classifier.adapter.peft_config(model.classifier.backbone)
    rank = rank_of({k: v for k, v in glob.items() if ".lora_" in k})
    if rank is not None and rank != peft_config.r:
        peft_config.lora_alpha, peft_config.r = peft_config.lora_alpha * rank / peft_config.r, rank
    return peft_config, {PEFT_PREFIX + k: v for k, v in glob.items() if ".lora_" in k}


def _prompt_tuning(model: TrainedModel, glob):
    from peft import PromptTuningConfig

    cfg = model.cfg
    if cfg.method.adapter.settings().get("position") != "before_all":
        raise ValueError("method.adapter.position: PEFT prompt tuning prepends the prompt; only a soft prompt with "
                         "position 'before_all' exports")
    prompt = glob["prompt"]
    config = model.classifier.backbone.model.config
    peft_config = PromptTuningConfig(task_type=_task_type(model), num_virtual_tokens=prompt.shape[0],
                                     token_dim=prompt.shape[1], num_transformer_submodules=1,
                                     num_attention_heads=config.num_attention_heads,
                                     num_layers=config.num_hidden_layers)
    return peft_config, {"prompt_embeddings": prompt}


def _prefix_tuning(model: TrainedModel, glob):
    from peft import PrefixTuningConfig

    from fedpeft.adapters.deep_prompt import kv_geometry, layer_key

    if not model.cfg.method.adapter.settings().get("shift_positions", True):
        raise ValueError("method.adapter.shift_positions: PEFT's prefix tuning numbers input positions after the "
                         "prefix; only deep prompts with shift_positions true export")
    backbone = model.classifier.backbone
    layers, _, _ = kv_geometry(backbone)
    prefix = torch.stack([glob[layer_key(l)] for l in range(layers)], dim=1)  # [h, L, 2, d_kv]
    model_cfg = backbone.model.config
    peft_config = PrefixTuningConfig(task_type=_task_type(model), num_virtual_tokens=prefix.shape[0],
                                     num_layers=layers, token_dim=int(model_cfg.hidden_size),
                                     num_attention_heads=int(model_cfg.num_attention_heads),
                                     num_transformer_submodules=1, prefix_projection=False)
    return peft_config, {"prompt_embeddings": prefix.reshape(prefix.shape[0], -1)}


def _task_type(model: TrainedModel) -> str:
    return "CAUSAL_LM" if model.classifier.backbone.family == "causal" else "FEATURE_EXTRACTION"
