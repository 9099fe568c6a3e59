"""The FedEx-LoRA authors' GLUE script (``CERT-Lab/fedex-lora`` @ ``AUTHORS_COMMIT``, ``fed_train_glue.py``) run
offline on a local encoder and the GLUE files of ``../shared/data``, its files unchanged: this launcher makes the
substitutions below at import time, then runs the script as ``__main__``.

The substitutions, each listed in ``benchmarks/results/exact_lora.md``:

1. data loading: ``data_utils.load_and_preprocess_data`` reads train.tsv and dev.tsv through fedpeft's task loaders
   (the same examples fedpeft trains on) and tokenizes them as the original does (the model's own tokenizer in
   place of ``RobertaTokenizer("roberta-base")``: the pair as a tokenizer pair, truncated and padded to 128
   tokens); the script evaluates on the "validation" split, GLUE's dev.tsv, as fedpeft's tasks do;
2. the model path: ``RobertaForSequenceClassification`` → ``AutoModelForSequenceClassification`` (MiniLM is a BERT;
   RoBERTa is not available offline);
3. imports the GLUE script never calls, absent or renamed in this environment: ``transformers.AdamW`` (removed in
   transformers 4.46; the script trains with ``torch.optim.AdamW``), ``datasets``, ``opacus``,
   ``pycocoevalcap`` (stubs that fail if called);
4. ``wandb`` logs nowhere (``WANDB_MODE=disabled``);
5. a defect fixed: the script passes the client models to the aggregation rules, which index state dicts
   (``TypeError: 'PeftModelForSequenceClassification' object is not subscriptable`` as published); the rules get each
   client's ``state_dict()`` (see ``_on_state_dicts``).

Usage: ``python -m benchmarks.exact_lora_authors CHECKOUT [their options...]`` (a checkout of the pinned commit).
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from pathlib import Path

AUTHORS_REPO = "CERT-Lab/fedex-lora"
AUTHORS_COMMIT = "2fa2e4a243f93c829e2b601e459e45aa748e4149"
TASKS = {"mrpc": "mrpc", "rte": "rte", "cola": "cola"}  # their --task -> fedpeft's task


def _stub(name: str) -> None:
    """A module whose every attribute fails when used (the GLUE script imports but never calls these)."""
    def fail(*_a, **_k):
        raise RuntimeError(f"{name} is not available in this offline run")

    def attribute(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return fail

    mod = types.ModuleType(name)
    mod.__getattr__ = attribute  # type: ignore[method-assign]
    sys.modules[name] = mod


class Rows(list):
    """The rows of a split: iterable as dicts of tensors (their DataLoaders) and indexable by column (their
    ``train_data["labels"]``), as a ``datasets.Dataset`` in torch format is."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return [int(r[key]) for r in self]
        return super().__getitem__(key)


def load_split(task: str, model: str, max_length: int = 128) -> tuple[Rows, Rows, Rows]:
    """train, validation (dev.tsv) and an empty test split, tokenized as their ``load_and_preprocess_data`` does."""
    import torch
    from transformers import AutoTokenizer

    from fedpeft.config import TaskConfig
    from fedpeft.data.tasks import TASKS as REGISTRY

    data = REGISTRY.get(TASKS[task])(TaskConfig(name=TASKS[task]), 0)
    cap = int(os.environ.get("FEDEX_SMOKE_EXAMPLES", 0))  # a smoke test's first N of each split (no table row)
    if cap:
        data.train, data.test = data.train[:cap], data.test[:cap]
    tok = AutoTokenizer.from_pretrained(model)

    def rows(examples) -> Rows:
        out = Rows()
        for ex in examples:
            args = (ex.text_a, ex.text_b) if ex.text_b is not None else (ex.text_a,)
            enc = tok(*args, truncation=True, padding="max_length", max_length=max_length)
            out.append({k: torch.tensor(v) for k, v in enc.items()} | {"labels": torch.tensor(ex.label)})
        return out

    return rows(data.train), rows(data.test), Rows()


def _on_state_dicts(rule):
    """(5) ``fed_train_glue.py`` hands the aggregation rules the client models, which ``fed_agg.py`` indexes as state
    dicts (a TypeError as published): they get each client's ``state_dict()``, what ``train_client`` returns and the
    script collects in ``client_model_state_dicts``."""
    def wrapped(global_model, client_models, *rest):
        return rule(global_model, [c.state_dict() if hasattr(c, "state_dict") else c for c in client_models], *rest)

    return wrapped


def main(argv: list[str]) -> None:
    checkout, their = Path(argv[0]).resolve(), argv[1:]
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch
    from transformers import GPT2LMHeadModel, RobertaForSequenceClassification, Trainer  # noqa: F401 (before the stubs)

    transformers = sys.modules["transformers"]  # (importing a model class replaces the lazy module)
    transformers.AdamW = torch.optim.AdamW  # (3) removed from transformers; imported, never used
    for name in ("datasets", "opacus", "opacus.validators", "opacus.validators.module_validator", "pycocoevalcap",
                 "pycocoevalcap.cider", "pycocoevalcap.cider.cider"):
        _stub(name)
    sys.path.insert(0, str(checkout))
    import importlib

    model = their[their.index("--model") + 1]
    substitutes = {"load_and_preprocess_data": lambda task: load_split(task, model),  # (1)
                   "RobertaForSequenceClassification": transformers.AutoModelForSequenceClassification}  # (2)
    fed_agg = importlib.import_module("fed_agg")
    for rule in ("aggregate_models_normal", "aggregate_models_ours", "aggregate_models_ffa"):  # (5)
        substitutes[rule] = _on_state_dicts(getattr(fed_agg, rule))
    for name in ("data_utils", "models", "train_eval", "fed_agg"):  # each star-imports the others' names
        mod = importlib.import_module(name)
        for attr, value in substitutes.items():
            if hasattr(mod, attr):
                setattr(mod, attr, value)
    sys.argv = [str(checkout / "fed_train_glue.py"), *their]
    runpy.run_path(str(checkout / "fed_train_glue.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
