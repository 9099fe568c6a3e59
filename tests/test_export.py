"""``fedpeft export --format peft``: a soft prompt placed before the input loads as PEFT prompt tuning, deep
prompts as PEFT prefix tuning (also with grouped-query attention), with the same hidden states; what PEFT cannot
express is refused with the field named. (LoRA: tests/test_headprune.py.)"""

from __future__ import annotations

import pytest
import torch

from fedpeft.experiment import build_experiment
from fedpeft.export import export_peft
from fedpeft.methods.composed import ServerState
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


def _plain_copy(backbone):
    """The shared frozen weights as a plain transformers model (what a PEFT user starts from)."""
    from transformers import AutoConfig

    from fedpeft.backbones.loading import _auto_class

    state = {k.replace(".base_layer.", "."): v for k, v in backbone.model.state_dict().items() if ".lora_" not in k}
    config = AutoConfig.for_model(**backbone.model.config.to_dict())
    base = _auto_class(backbone.family).from_config(config, attn_implementation="eager")
    base.load_state_dict(state, strict=True)
    return base.eval()


def test_soft_prompt_exports_as_peft_prompt_tuning(tiny_cfg, tmp_path):
    from peft import PeftModel

    cfg = tiny_cfg(method__adapter__position="before_all", federation__rounds=1)
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    out, _ = export_peft(tmp_path / "run", tmp_path / "peft")
    model = PeftModel.from_pretrained(_plain_copy(exp.backbone), out)
    glob = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    batch = exp.classifier.batch(exp.test_encoded, [0, 1, 2])
    with torch.no_grad():
        ours = exp.classifier.hidden_states(glob, batch)[-1]
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_deep_prompt_exports_as_peft_prefix_tuning(tiny_cfg, tmp_path, model):
    from peft import PeftModel

    cfg = tiny_cfg(method__name="fedavg-prefix", method__adapter__num_tokens=3, model__name=model,
                   federation__rounds=1)
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    out, _ = export_peft(tmp_path / "run", tmp_path / "peft")
    peft_model = PeftModel.from_pretrained(_plain_copy(exp.backbone), out)
    glob = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    batch = exp.classifier.batch(exp.test_encoded, [0, 1, 2])
    with torch.no_grad():
        ours = exp.classifier.hidden_states(glob, batch)[-1]
        theirs = peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True).hidden_states[-1]
    mask = batch["attention_mask"].bool()
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
