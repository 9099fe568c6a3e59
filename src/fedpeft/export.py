"""Export a run's global adapter (or a client's personalised one) in Hugging Face PEFT's format
(``PeftModel.from_pretrained`` loads it), with what using it as the run's classifier needs beside it.

The export is reusable as it is, from any folder, without fedpeft: ``adapter_config.json`` names the backbone by
its hub id or the absolute folder it loads from (``base_model_name_or_path``; a model built in code, such as the
tiny test models, has neither and keeps its fedpeft name), files are written with the usual permissions, and
``fedpeft_task.json`` holds the task: class names, label words and descriptions, templates, the readout and its
settings (scale, pooling, calibration, max length), the backbone's identity and the round exported. The adapter
comes from the run directory alone (``predict.open_model``: ``model.json``, never the training data).

The format is each adapter's own (``to_peft``): ``adapter_config.json`` (the PEFT config) and
``adapter_model.safetensors`` (PEFT's key names):
- ``lora``: the run's ``LoraConfig`` (at the stack's rank for FLoRA). Heads that no client ever kept keep B = 0
  rows. A linear readout (``model.readout: linear``) goes to ``task_head.safetensors`` (``head.weight``,
  ``head.bias``: logits = mean-pooled last hidden state · weightᵀ + bias).
- ``soft_prompt`` with ``position: before_all``: PEFT prompt tuning.
- ``deep_prompt`` with ``shift_positions: true``: PEFT prefix tuning without projection.
- Projected prompts and full fine-tuning are not exported: a projected prompt needs the shared projection
  (FedBPT's ``A``), and full fine-tuning is a whole model (save it with ``save_pretrained`` instead).

``--format hub`` (this folder with a model card, the training curve and the config) and ``--to mlflow`` are
``fedpeft.publish``; both write the adapter with ``write_peft``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save

from fedpeft.predict import TrainedModel, open_model
from fedpeft.tracking.rundir import RunDir

TASK_FILE = "fedpeft_task.json"


def export_peft(run_dir: str | Path, out: str | Path, best: bool = False,
                client: int | str | None = None) -> tuple[Path, str]:
    """Write the global adapter of ``run_dir`` (its last checkpoint, or with ``best`` the one ``evaluation.keep_best``
    kept), or client ``client``'s personalised one (e.g. FedSA-LoRA's own B), as a PEFT adapter directory ``out``;
    returns ``out`` and a line saying which adapter of which round it is."""
    model = open_model(run_dir, client=client, best=best)
    return write_peft(model, out), f"exported {model.describe()}"


def write_peft(model: TrainedModel, out: str | Path) -> Path:
    """Write ``model``'s adapter as a PEFT adapter directory ``out`` (created if missing); returns ``out``."""
    cfg, glob = model.cfg, model.params
    record = RunDir(model.run_dir).read_record() or {}
    backbone = model.objective.backbone
    base = (record.get("backbone") or {}).get("source") or backbone.source or cfg.model.name
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task_type = "CAUSAL_LM" if backbone.family == "causal" else "FEATURE_EXTRACTION"
    peft_config, tensors = model.objective.adapter.to_peft(backbone, glob, task_type)
    peft_config.base_model_name_or_path = base
    head = {k: v.float().contiguous() for k, v in glob.items() if k.startswith("head.")}
    if head:  # fedpeft's linear readout is not a module of the base model: saved beside the adapter
        (out / "task_head.safetensors").write_bytes(save(head))
    (out / "adapter_model.safetensors").write_bytes(save({k: v.float().contiguous() for k, v in tensors.items()}))
    (out / "adapter_config.json").write_text(json.dumps(peft_config.to_dict(), indent=2, default=_json) + "\n")
    (out / TASK_FILE).write_text(json.dumps(task_metadata(model, record, base), indent=2, ensure_ascii=False) + "\n",
                                 encoding="utf-8")
    return out


def task_metadata(model: TrainedModel, record: dict[str, Any], base: str) -> dict[str, Any]:
    """``fedpeft_task.json``: what scoring classes with the exported adapter needs, as the run scored them."""
    clf, cfg = model.objective, model.cfg
    if clf.generates:  # what prompts looked like: the chat template, or the template given
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
