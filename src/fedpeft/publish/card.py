"""The model card (``README.md``) of a hub export, read from the run directory: the YAML metadata the Hugging Face
Hub reads, then what a reader needs to trust and use the adapter.

The metadata is written by huggingface_hub's ``ModelCardData`` (the Hub's own field names and YAML) and the card by
``ModelCard``, which also reads it back. The fields (https://huggingface.co/docs/hub/model-cards#model-card-metadata):

- ``library_name: peft`` and ``base_model``: the Hub id of the frozen model. It is the id the run loaded
  (``model.name``), the original of a packaged model (MiniLM, SmolLM2: ``Backbone.hub_id``), or ``--base-model``;
  a local folder or a model built in code has none, and the card then leaves ``base_model`` out and says so, since
  the Hub refuses a ``base_model`` that is no model id.
- ``license``: ``--license``, else the base model's own card's where its folder (or the hub cache) holds one; an
  adapter is a derivative of its base model, so that license is the default, never invented.
- ``tags``: ``fedpeft``, ``federated-learning``, the method preset and the adapter; ``datasets``: the dataset id of
  an ``hf:<dataset>`` task (a built-in or file task names no Hub dataset); ``pipeline_tag``: ``text-classification``
  or ``text-generation``.

The body: the method (its preset's registered description, and the paper as the first paragraph of the docstring
of the module that registered the preset names it: ``methods.base.preset`` records the module; the documentation's
Methods page cites each paper in full), the components it resolved to, the data (``model.json``), the
federation (clients, clients per round from ``metrics.jsonl``, rounds, partition, bytes up and down in total and
per client-round from ``summary.json``; secure aggregation, client transforms such as local DP, server wrappers such
as DP-FedAvg, and the ε of the last round's ``server`` record where a DP component accounts one), the final metrics
(every ``final_*``/``best_*`` number of ``summary.json``, and each standard suite's scores), the training curve,
and a ``PeftModel.from_pretrained`` snippet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedpeft.predict import TrainedModel
from fedpeft.publish.curve import CURVE_FILE
from fedpeft.report.svg import fmt_bytes
from fedpeft.tracking.rundir import RunDir

CARD_FILE = "README.md"
AUTO_CLASS = {"encoder": "AutoModel", "mlm": "AutoModelForMaskedLM", "causal": "AutoModelForCausalLM"}


def read_summary(run: RunDir) -> dict[str, Any]:
    """``summary.json``; FileNotFoundError saying how to finish the run when it has none."""
    path = run.root / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the run is unfinished (fedpeft run --resume {run.root} "
                                "finishes it); --format hub's card reports a finished run's totals")
    return json.loads(path.read_text())


def base_model_id(model: TrainedModel, given: str | None) -> str | None:
    """The base model's Hub id: ``given`` (``--base-model``, checked as a repo id), else the backbone's own."""
    if given is None:
        return model.objective.backbone.hub_id
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(given)
    except HFValidationError as e:
        raise ValueError(f"--base-model: '{given}' is not a Hugging Face Hub model id ({e})") from None
    return given


def base_license(source: str | None, hub_id: str | None) -> str | None:
    """The license of the base model's own card: ``README.md`` in its folder, or in the hub cache for a hub id."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    path = Path(source) / CARD_FILE if source and Path(source).is_dir() else None
    if (path is None or not path.exists()) and hub_id:
        cached = try_to_load_from_cache(hub_id, CARD_FILE)
        path = Path(cached) if isinstance(cached, str) else None
    if path is None or not path.exists():
        return None
    return ModelCard.load(path, ignore_metadata_errors=True).data.license


def adapter_name(model: TrainedModel, summary: dict[str, Any]) -> str:
    """The adapter component the run trained (``lora``, ``soft_prompt``, ...)."""
    return (summary.get("method_resolved") or {}).get("adapter") or model.cfg.method.adapter.name


def metadata(model: TrainedModel, summary: dict[str, Any], base_model: str | None, license: str | None) -> Any:
    """The card's YAML metadata as ``ModelCardData``."""
    from huggingface_hub import ModelCardData

    cfg = model.cfg
    adapter = adapter_name(model, summary)
    task = cfg.task.name
    datasets = [task.removeprefix("hf:").split(":")[0]] if task.startswith("hf:") else None
    return ModelCardData(base_model=base_model, library_name="peft", license=license, datasets=datasets,
                         tags=list(dict.fromkeys(["fedpeft", "federated-learning", cfg.method.name, adapter])),
                         pipeline_tag="text-generation" if model.objective.generates else "text-classification")


def _settings(section: Any) -> str:
    """A component as ``name (key: value, ...)``, its settings as the resolved config holds them."""
    items = ", ".join(f"{k}: {v}" for k, v in section.settings().items())
    return f"`{section.name}`" + (f" ({items})" if items else "")


def _table(rows: list[tuple[str, str]], head: tuple[str, str]) -> list[str]:
    return [f"| {head[0]} | {head[1]} |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]


def _bytes(n: float) -> str:
    return f"{n:,.0f} ({fmt_bytes(n)})"


def _markdown(text: str) -> str:
    """Docstring text as one Markdown line: RST literals as code spans, references to fedpeft's internal method
    specs (``spec §5``) left out."""
    import re

    text = re.sub(r" \(spec [^)]*\)", "", " ".join(text.split()))
    return re.sub(r", spec [^),]*", "", text).replace("``", "`")


def paper_lines(preset: Any) -> list[str]:
    """What the docstring of the module that registered ``preset`` (``Preset.module``) says of it: its first
    paragraph, which names the paper its presets follow (``FedPrompt (Zhao et al. 2023) and its full fine-tuning
    baseline as presets.``), and the bullet of this preset where there is one (the LoRA family's and the zeroth-order
    presets' papers are named there). Empty for a preset registered without a docstring."""
    import importlib
    import inspect

    if not preset.module:
        return []
    doc = inspect.getdoc(importlib.import_module(preset.module)) or ""
    paragraphs = doc.split("\n\n")
    bullets = [b for p in paragraphs for b in ("\n" + p).split("\n- ")[1:]]
    own = next((b for b in bullets if f"``{preset.name}``" in b.split(":")[0]), None)
    return [_markdown(t) for t in (paragraphs[0], own) if t and t.strip()]


def method_section(model: TrainedModel, summary: dict[str, Any]) -> list[str]:
    """The preset, its registered description, the paper (``paper_lines``), and the components it resolved to."""
    from fedpeft.methods.base import PRESETS

    cfg = model.cfg
    preset = PRESETS.get(cfg.method.name)
    notes = paper_lines(preset)
    resolved = summary.get("method_resolved") or cfg.method.components()
    parts = [f"{axis} `{name}`" for axis, name in resolved.items() if isinstance(name, str)]
    parts += [f"{axis} " + ", ".join(f"`{n}`" for n in names) for axis, names in resolved.items()
              if isinstance(names, list) and names]
    overrides = summary.get("preset_overrides") or []
    lines = ["## Method", "", f"`{preset.name}`: {preset.description}.", ""]
    if notes:
        lines += [f"From `{preset.module}`, where the preset is defined:", "", *(f"> {n}\n>" for n in notes[:-1]),
                  f"> {notes[-1]}", ""]
    lines += ["Components: " + "; ".join(parts) + "."]
    if overrides:
        lines += ["", "The run overrode the preset's " + ", ".join(f"`{o}`" for o in overrides) + "."]
    return lines + ["", "`fedpeft methods` lists the presets; fedpeft's documentation (Methods) cites each "
                        "preset's paper in full.", ""]


def data_section(model: TrainedModel, record: dict[str, Any]) -> list[str]:
    """The task and its data as ``model.json`` recorded them."""
    task = model.objective.task
    data = record.get("data") or {}
    rows = [("task", f"`{model.cfg.task.name}` ({task.kind})")]
    if task.kind == "classification":
        rows.append(("classes", ", ".join(task.class_names)))
    for key, label in (("train_examples", "training examples"), ("test_examples", "test examples")):
        if data.get(key) is not None:
            rows.append((label, f"{data[key]:,}"))
    if data.get("examples_sha256"):
        rows.append(("data fingerprint (SHA-256 of the examples)", f"`{data['examples_sha256']}`"))
    return ["## Data", "", *_table(rows, ("", ""))]


def _partition(cfg: Any) -> str:
    p = cfg.federation.partition
    if p.scheme.startswith("dirichlet"):
        return f"`{p.scheme}` (α = {p.alpha})"
    if p.by_groups:
        per = f", {p.clients_per_domain} clients per group" if p.clients_per_domain > 1 else ""
        return f"`{p.scheme}`" + (f" (column `{p.column}`{per})" if p.column else (f" ({per[2:]})" if per else ""))
    return f"`{p.scheme}`"


def _per_round(records: list[dict[str, Any]], configured: int | None, clients: int) -> str:
    selected = sorted({r["num_selected"] for r in records if r.get("round", 0) > 0 and "num_selected" in r})
    text = " to ".join(str(n) for n in (selected[:1] + selected[-1:] if len(selected) > 1 else selected)) or "–"
    return text + (" (all)" if configured is None and selected == [clients] else "")


def _epsilon(records: list[dict[str, Any]]) -> str | None:
    """The privacy spent after the last round that accounted it (a DP component's ``server`` scalars)."""
    last = next((r for r in reversed(records) if (r.get("server") or {}).get("epsilon") is not None), None)
    if last is None:
        return None
    s = last["server"]
    text = f"ε = {s['epsilon']:.4g}" + (f" at δ = {s['delta']:.3g}" if s.get("delta") is not None else "")
    if s.get("epsilon_local") is not None:
        text += f"; against the server that sees each upload ε = {s['epsilon_local']:.4g}"
    return text + f", after round {last['round']}"


def federation_section(model: TrainedModel, summary: dict[str, Any], records: list[dict[str, Any]],
                       record: dict[str, Any]) -> list[str]:
    """Clients, rounds, partition, the bytes exchanged, and the privacy components with ε where one applies."""
    cfg = model.cfg
    fed = cfg.federation
    clients = int((record.get("clients") or {}).get("count") or fed.num_clients)
    rows = [("clients", f"{clients:,}"), ("clients per round", _per_round(records, fed.clients_per_round, clients)),
            ("rounds", f"{summary['rounds']:,}"), ("partition", _partition(cfg)),
            ("runtime", f"`{summary.get('runtime', cfg.runtime.name)}`"),
            ("bytes up, total", _bytes(summary["bytes_up_total"])),
            ("bytes down, total", _bytes(summary["bytes_down_total"])),
            ("bytes up per client-round", _bytes(summary["bytes_up_per_client_round"])),
            ("bytes down per client-round", _bytes(summary["bytes_down_per_client_round"])),
            ("secure aggregation", "off" if fed.secure_aggregation is None else "SecAgg+ (" + ", ".join(
                f"{k}: {v}" for k, v in fed.secure_aggregation.model_dump().items() if k != "protocol") + ")"),
            ("client transforms (local DP, clipping, ...)",
             "; ".join(_settings(t) for t in cfg.method.transforms) or "none"),
            ("server wrappers (central DP, robust filters, ...)",
             "; ".join(_settings(w) for w in cfg.method.wrappers) or "none")]
    if (eps := _epsilon(records)) is not None:
        rows.append(("privacy", eps))
    return ["## Federation", "", *_table(rows, ("", "")),
            "Bytes are counted from the serialised messages, per client and direction (`summary.json`); a "
            "client-round is one selected client in one round.", ""]


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"


def results_section(model: TrainedModel, summary: dict[str, Any]) -> list[str]:
    """Every final and best number of ``summary.json``, each standard suite's scores, and the training curve."""
    rows = [(f"`{k}`", _number(v)) for k, v in summary.items()
            if k.startswith(("final_", "best_", "initial_", "accuracy_at_")) and isinstance(v, (int, float))
            and not isinstance(v, bool)]
    rows += [(f"`final_generation.{k}`", _number(v)) for k, v in (summary.get("final_generation") or {}).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    lines = ["## Results", "", f"On the test set, as `summary.json` records them; the adapter here is "
             f"{model.describe(with_warning=False)}.", "", *_table(rows, ("metric", "value"))]
    suites = summary.get("suites") or {}
    if suites:
        lines += ["Standard evaluation suites (`evaluation.suites`), of the final global adapter:", "",
                  "| suite | score | value |", "|---|---|---|",
                  *(f"| `{name}` | {k} | {_number(v)} |" for name, scores in suites.items()
                    for k, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)), ""]
    return lines + [f"![loss and accuracy per round]({CURVE_FILE})", ""]


def usage_section(model: TrainedModel, base_model: str | None, base: str, adapter_ref: str) -> list[str]:
    """How to load it: a ``PeftModel.from_pretrained`` snippet, and what ``fedpeft_task.json`` adds."""
    backbone = model.objective.backbone
    cls = AUTO_CLASS[backbone.family]
    load = base_model or base
    code = ["```python", "from peft import PeftModel", f"from transformers import {cls}, AutoTokenizer", "",
            f"base = {cls}.from_pretrained({load!r})", f"tokenizer = AutoTokenizer.from_pretrained({load!r})",
            f"model = PeftModel.from_pretrained(base, {adapter_ref!r})"]
    if model.objective.generates:
        code += ["inputs = tokenizer.apply_chat_template([{'role': 'user', 'content': 'Hello'}], "
                 "add_generation_prompt=True, return_tensors='pt', return_dict=True)"
                 if model.objective.format.chat else "inputs = tokenizer('Hello', return_tensors='pt')",
                 "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=64)[0]))"]
    code += ["```", ""]
    note = ("`fedpeft_task.json` holds what scoring classes as the run did needs: the classes, label words and "
            "descriptions, templates, the readout and its settings" + (", and the linear head is "
                                                                        "`task_head.safetensors`"
                                                                        if model.objective.readout == "linear"
                                                                        else "")
            + ". `config.yaml` is the run's resolved configuration.") if not model.objective.generates else (
        "`fedpeft_task.json` holds the prompt format the run trained with (chat template or prompt template, the "
        "response length, the end token). `config.yaml` is the run's resolved configuration.")
    return ["## Use it", "", *code, note, ""]


def card_text(model: TrainedModel, base_model: str | None, license: str | None, adapter_ref: str,
              base: str) -> str:
    """The whole ``README.md``: YAML metadata, then the body (see the module doc)."""
    run = RunDir(model.run_dir)
    summary = read_summary(run)
    records = run.read_metrics()
    record = run.read_record() or {}
    data = metadata(model, summary, base_model, license)
    name = model.cfg.name or run.root.name
    intro = [f"# {name}", "", f"A `{adapter_name(model, summary)}` adapter of `{base_model or model.cfg.model.name}`"
             f", trained by federated learning with fedpeft: {model.describe(with_warning=False)}."]
    if model.warning:
        intro += ["", f"Warning: {model.warning}."]
    body = [*intro, "", *method_section(model, summary), *data_section(model, record),
            *federation_section(model, summary, records, record), *results_section(model, summary),
            *usage_section(model, base_model, base, adapter_ref)]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body)


def write_card(model: TrainedModel, out: Path, base_model: str | None, license: str | None, adapter_ref: str,
               base: str) -> Path:
    """Write ``out/README.md`` through ``ModelCard`` (which parses the metadata it is given)."""
    from huggingface_hub import ModelCard

    path = out / CARD_FILE
    ModelCard(card_text(model, base_model, license, adapter_ref, base)).save(path)
    return path
