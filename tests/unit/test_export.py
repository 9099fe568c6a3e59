"""``fedpeft export --format peft``: a soft prompt placed before the input loads as PEFT prompt tuning, deep
prompts as PEFT prefix tuning (also with grouped-query attention), with the same hidden states; what PEFT cannot
express is refused with the field named. (LoRA: tests/methods/test_headprune.py.)"""

from __future__ import annotations

import pytest
from conftest import last_hidden_ours_and_peft, plain_copy
import torch

from fedpeft.experiment import build_experiment
from fedpeft.export import export_peft
from fedpeft.methods.state import ServerState
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


def _exported(cfg, tmp_path):
    """Train ``cfg`` for its rounds, export the global adapter: (experiment, global tensors, PEFT folder)."""
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    out, _ = export_peft(tmp_path / "run", tmp_path / "peft")
    return exp, ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob, out


def test_soft_prompt_exports_as_peft_prompt_tuning(tiny_cfg, tmp_path):
    exp, glob, out = _exported(tiny_cfg(method__adapter__position="before_all", federation__rounds=1), tmp_path)
    ours, theirs = last_hidden_ours_and_peft(exp, glob, out)
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_deep_prompt_exports_as_peft_prefix_tuning(tiny_cfg, tmp_path, model):
    exp, glob, out = _exported(tiny_cfg(method__name="fedavg-prefix", method__adapter__num_tokens=3,
                                        model__name=model, federation__rounds=1), tmp_path)
    ours, theirs = last_hidden_ours_and_peft(exp, glob, out)
    mask = exp.objective.batch(exp.test_encoded, [0, 1, 2])["attention_mask"].bool()
    assert torch.allclose(ours[mask], theirs[mask], atol=1e-5)


@pytest.mark.parametrize("extra, field", [
    ({}, "method.adapter.position"),  # after [CLS]: PEFT's prompt tuning always prepends
    ({"method__name": "fedavg-prefix", "method__adapter__num_tokens": 2, "method__adapter__shift_positions": False},
     "method.adapter.shift_positions"),
    ({"method__name": "fedavg-full", "method__adapter__num_tokens": None}, "method.adapter.name"),
])
def test_what_peft_cannot_express_is_refused(tiny_cfg, tmp_path, extra, field):
    cfg = tiny_cfg(federation__rounds=1, **extra)
    run_embedded(cfg, tmp_path / "run")
    with pytest.raises(ValueError, match=field):
        export_peft(tmp_path / "run", tmp_path / "peft")


REUSE = r'''
"""Use a fedpeft export with transformers and PEFT alone: the similarity readout of fedpeft_task.json."""
import json, sys
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import PeftModel
from transformers import AutoModel, AutoTokenizer

out, texts = Path(sys.argv[1]), json.loads(sys.argv[2])
meta = json.loads((out / "fedpeft_task.json").read_text())
base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
tok = AutoTokenizer.from_pretrained(base)
model = PeftModel.from_pretrained(AutoModel.from_pretrained(base), out).eval()


def pooled(batch):
    hidden, mask = model(**batch).last_hidden_state, batch["attention_mask"].unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


with torch.no_grad():
    with model.disable_adapter():  # the label anchors come from the frozen model
        anchors = pooled(tok(meta["task"]["label_descriptions"], padding=True, truncation=True, max_length=128,
                             return_tensors="pt"))
    x = tok(texts, padding=True, truncation=True, max_length=meta["max_length"], return_tensors="pt")
    probs = torch.softmax(meta["similarity_scale"] * pooled(x) @ anchors.T, dim=-1)
print(json.dumps({"classes": meta["task"]["class_names"], "probs": probs.tolist()}))
'''


def test_a_lora_export_is_reusable_as_is_from_another_folder(tmp_path):
    """Issue 35, defect 5: the export names a loadable base model (the absolute folder here), has normal file
    modes and the task beside it, and a fresh process elsewhere, with transformers and PEFT only, reproduces
    ``fedpeft predict``."""
    import json
    import os
    import subprocess
    import sys

    from typer.testing import CliRunner

    from fedpeft.backbones.loading import load_backbone
    from fedpeft.cli import app
    from fedpeft.predict import predict
    from fedpeft.resolve import load_config

    bb = load_backbone("tiny-bert")
    base = tmp_path / "my-base-model"  # a user's own checkpoint folder
    plain_copy(bb).save_pretrained(base)
    bb.tokenizer.save_pretrained(base)
    cfg = load_config(None, ["method.name=fedavg-lora", f"model.name={base}", "task.name=synthetic-sentiment",
                             "task.num_examples=96", "task.max_length=24", "federation.num_clients=3",
                             "federation.rounds=1", "method.trainer.max_steps=3", "method.trainer.lr=0.05",
                             "runtime.progress=false"])
    run_embedded(cfg, tmp_path / "run")
    res = CliRunner().invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "export")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "export"
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    umask = os.umask(0)
    os.umask(umask)
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f
    meta = json.loads((out / "fedpeft_task.json").read_text())
    assert meta["task"]["class_names"] == ["negative", "positive"] and meta["readout"] == "similarity"
    assert meta["round"] == 1 and meta["backbone"]["base_model_name_or_path"] == str(base)

    texts = ["a wonderful , moving film", "dull and far too long", "it was fine"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    got = subprocess.run([sys.executable, "-c", REUSE, str(out), json.dumps(texts)], cwd=elsewhere, env=env,
                         capture_output=True, text=True, check=True)
    theirs = json.loads(got.stdout.strip().splitlines()[-1])
    ours = predict(tmp_path / "run", texts)
    assert theirs["classes"] == ["negative", "positive"]
    assert torch.allclose(torch.tensor(theirs["probs"]),
                          torch.tensor([[r[f"p({c})"] for c in theirs["classes"]] for r in ours]), atol=1e-5)
    assert any(abs(p[0] - 0.5) > 1e-3 for p in theirs["probs"])  # a real classifier, not a constant


def test_an_adapter_without_a_peft_format_refuses_and_names_those_that_export():
    from fedpeft.adapters import ADAPTERS

    with pytest.raises(ValueError, match="method.adapter.name: 'full' has no PEFT format .adapters that export: "
                                         "deep_prompt, lora, lora_sb, soft_prompt"):
        ADAPTERS.get("full")(None).to_peft(None, {}, "CAUSAL_LM")
